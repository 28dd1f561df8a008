"""The code passes ruff with the project's configuration (pyproject.toml)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[2]


def test_ruff_clean():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "tridiax", "tests", "benchmarks", "examples"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
