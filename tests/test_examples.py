"""The examples run (small sizes) and pass the checks they assert."""

import pathlib
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).parent.parent / "examples"


def test_implicit_diffusion_example():
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "implicit_diffusion.py"), "--rods", "64", "--steps", "5"],
        check=True, capture_output=True, text=True,
    ).stdout
    assert "implicit differentiation" in out and "finite difference" in out


def test_python_dash_m_tridiax():
    result = subprocess.run([sys.executable, "-m", "tridiax", "--batch", "3000", "--n", "33"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(ok)" in result.stdout and "backend:" in result.stdout


def test_readme_code_blocks_run():
    readme = (EXAMPLES.parent / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:]]
    assert len(blocks) >= 2
    for block in blocks:
        subprocess.run([sys.executable, "-c", block], check=True, capture_output=True, text=True)
