"""mkdocs hook: serve the figures of examples/figures/ and benchmarks/data/, their one source.

Each `examples/figures/*.png` and `benchmarks/data/*.png` of the repository is added to the
build at the same path (relative to the site root), so the Examples and Performance pages can
show it and `mkdocs build --strict` checks the link, while no copy is kept under `docs/`.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
FIGURES = (ROOT / "examples" / "figures", ROOT / "benchmarks" / "data")


def on_files(files, config):
    for png in sorted(p for folder in FIGURES for p in folder.glob("*.png")):
        path = png.relative_to(ROOT).as_posix()  # "examples/figures/<name>.png"
        if files.get_file_from_path(path) is None:
            files.append(File(path, src_dir=str(ROOT), dest_dir=config["site_dir"],
                              use_directory_urls=config["use_directory_urls"]))
    return files
