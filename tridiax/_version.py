"""tridiax's version: from the installed package's metadata, else from a source tree.

A source tree on sys.path (PYTHONPATH, a vendored copy) has no installed metadata; its version
is read from the pyproject.toml beside the package ("0.1.0+source"), or is "0+unknown" where
there is none.
"""

import importlib.metadata
import pathlib
import tomllib


def version() -> str:
    try:
        return importlib.metadata.version("tridiax")
    except importlib.metadata.PackageNotFoundError:
        pass
    pyproject = pathlib.Path(__file__).parent.parent / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
        if project.get("name") == "tridiax" and "version" in project:
            return f"{project['version']}+source"
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        pass
    return "0+unknown"
