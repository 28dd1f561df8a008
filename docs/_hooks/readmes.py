"""mkdocs hook: the Examples, Performance and Architecture pages are examples/README.md,
benchmarks/README.md and tridiax/README.md, read at build time, so the site and the READMEs
cannot drift apart.

Rewritten on the way: links to a script (`[heat_1d.py](heat_1d.py)`) become its path in code
(the site does not serve the scripts), figures point at examples/figures/ (served by
figures.py), and each example's heading ("... (`heat_1d.py`)") gets the anchor `#heat_1d` that
the guides link to.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]


def _examples(text: str) -> str:
    text = re.sub(r"\[`?(\w+\.py)`?\]\(\1\)", r"`examples/\1`", text)
    # The table's command column goes on top of the "what it shows" cell: a narrow column of
    # its own broke each command mid-word.
    text = re.sub(r"^\| script \| command \| what it shows \|\n\|---\|---\|---\|$",
                  "| script | command, and what it shows |\n|---|---|", text, flags=re.M)
    text = re.sub(r"^\| (`examples/\w+\.py`) \| (`python [^`]+`) \| (.*) \|$", r"| \1 | \2<br>\3 |",
                  text, flags=re.M)
    text = text.replace("](figures/", "](examples/figures/")
    return re.sub(r"^(##+ .*\(`(\w+)\.py`\))[ \t]*$", r"\1 {#\2}", text, flags=re.M)


def _performance(text: str) -> str:
    text = text.replace("](data/", "](benchmarks/data/")
    return re.sub(r"\A# Benchmarks\b", "# Performance", text)


PAGES = {
    "examples.md": (ROOT / "examples" / "README.md", _examples),
    "performance.md": (ROOT / "benchmarks" / "README.md", _performance),
    "architecture.md": (ROOT / "tridiax" / "README.md", lambda text: text),
}


def on_files(files, config):
    for page, (source, rewrite) in PAGES.items():
        if files.get_file_from_path(page) is not None:
            raise ValueError(f"docs/{page} would hide {source.relative_to(ROOT)}: remove it")
        files.append(File.generated(config, page, content=rewrite(source.read_text())))
    return files
