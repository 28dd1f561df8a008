"""mkdocs hook: serve the examples' figures from examples/figures/, their one source.

Each `examples/figures/*.png` of the repository is added to the build as
`examples/figures/<name>.png` (relative to the site root), so `docs/examples.md` can show it
with `![...](examples/figures/<name>.png)` and `mkdocs build --strict` checks the link, while
no copy of the figures is kept under `docs/`.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "examples" / "figures"


def on_files(files, config):
    for png in sorted(FIGURES.glob("*.png")):
        path = png.relative_to(ROOT).as_posix()  # "examples/figures/<name>.png"
        if files.get_file_from_path(path) is None:
            files.append(File(path, src_dir=str(ROOT), dest_dir=config["site_dir"],
                              use_directory_urls=config["use_directory_urls"]))
    return files
