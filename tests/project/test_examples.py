"""The examples run in their --quick mode and print the results they claim."""

import math
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"


def run_example(name: str, *args: str) -> str:
    result = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def number(pattern: str, text: str, group: int = 1) -> float:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not printed:\n{text}"
    return float(match.group(group))


def test_implicit_diffusion_example(tmp_path):
    out = run_example("implicit_diffusion.py", "--quick", "--out", str(tmp_path))
    assert number(r"max \|x - scipy\| = (\S+)", out) < 1e-12
    gradient = number(r"implicit differentiation (\S+),", out)
    assert gradient == pytest.approx(number(r"finite difference (\S+)", out), rel=1e-5)
    assert (tmp_path / "implicit_diffusion.png").stat().st_size > 10_000


def test_examples_readme_lists_every_script_and_what_it_takes():
    readme = (EXAMPLES / "README.md").read_text()
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))
    listed = sorted(set(re.findall(r"^\| \[(\w+\.py)\]", readme, re.MULTILINE)))
    assert listed == scripts
    words = {5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten", 11: "eleven",
             12: "twelve", 13: "thirteen", 14: "fourteen", 15: "fifteen"}
    assert f"all {words[len(scripts)]} together" in readme
    for script in scripts:  # the flags the README promises are there
        options = subprocess.run([sys.executable, str(EXAMPLES / script), "--help"],
                                 capture_output=True, text=True, check=True).stdout
        row = next(line for line in readme.splitlines() if line.startswith(f"| [{script}]"))
        for flag in re.findall(r"\[(--[a-z]+)", row) + ["--quick", "--out"]:
            assert flag in options, (script, flag)


def test_heat_1d_converges_at_second_order(tmp_path):
    out = run_example("heat_1d.py", "--quick", "--out", str(tmp_path))
    errors = [float(e) for e in re.findall(r"^\s*\d+\s+\S+\s+\d+\s+(\S+)", out, re.MULTILINE)]
    assert len(errors) == 3 and errors[0] > errors[1] > errors[2]
    assert abs(number(r"observed order of convergence: (\S+)", out) - 2) < 0.1
    assert (tmp_path / "heat_1d.png").stat().st_size > 10_000


def test_packed_ragged_batches_match_scipy_and_the_padded_layout(tmp_path):
    out = run_example("packed_ragged.py", "--quick", "--out", str(tmp_path))
    assert number(r"max \|x - scipy\| / \|x\| over the rods checked = (\S+)", out) < 1e-12
    assert number(r"max \|packed - padded\| / \|x\| = (\S+)", out) < 1e-12
    assert number(r"max \|ema - loop\| = (\S+)", out) < 1e-12
    assert number(r"\((\S+)x the rows", out) > 1.0  # the padding is real
    assert (tmp_path / "packed_ragged.png").stat().st_size > 10_000


def test_adi_2d_matches_the_sine_transform_reference(tmp_path):
    out = run_example("adi_2d.py", "--quick", "--out", str(tmp_path))
    assert number(r"max \|u - DST reference\| / max \|reference\| = (\S+)", out) < 1e-11
    for label in ("axis 0 then axis 1", "last axis + transposes", "tridiagonal_solve + transposes"):
        assert number(re.escape(label) + r"\s+(\S+) ms", out) > 0
    assert (tmp_path / "adi_2d.png").stat().st_size > 10_000


def test_cubic_spline_matches_scipy(tmp_path):
    out = run_example("cubic_spline.py", "--quick", "--out", str(tmp_path))
    for kind in ("natural", "periodic"):
        assert number(kind + r": .*values (\S+), first derivatives", out) < 1e-12
        assert number(kind + r": .*first derivatives (\S+);", out) < 1e-12
    assert number(r"largest difference from scipy.interpolate.CubicSpline: (\S+)", out) < 1e-12
    assert (tmp_path / "cubic_spline.png").stat().st_size > 10_000


def test_inverse_diffusivity_recovers_the_profile(tmp_path):
    out = run_example("inverse_diffusivity.py", "--quick", "--out", str(tmp_path))
    gradient = number(r"implicit differentiation (\S+),", out)
    assert gradient == pytest.approx(number(r"finite difference (\S+)", out), rel=1e-5)
    losses = [float(v) for v in re.findall(r"iteration\s+\d+\s+loss (\S+)", out)]
    assert len(losses) >= 10 and losses[-1] < 0.05 * losses[0]
    first, last = number(r"loss: (\S+) -> (\S+)", out), number(r"loss: (\S+) -> (\S+)", out, 2)
    assert last < 0.05 * first
    before = number(r"profile error .*: (\S+) \(initial guess\) -> (\S+)", out)
    after = number(r"profile error .*: (\S+) \(initial guess\) -> (\S+)", out, 2)
    assert after < 0.5 * before
    assert (tmp_path / "inverse_diffusivity.png").stat().st_size > 10_000


def test_indrnn_learns_the_adding_problem(tmp_path):
    out = run_example("indrnn_adding.py", "--quick", "--out", str(tmp_path))
    epochs = re.findall(r"^epoch\s+\d+\s+train MSE (\S+)\s+test MSE (\S+)", out, re.MULTILINE)
    assert len(epochs) == 10
    assert float(epochs[-1][1]) < 0.5 / 6 < float(epochs[0][1])  # from baseline-like to below half
    assert number(r"test MSE (\S+) -> (\S+)", out, 2) < 0.5 / 6
    assert (tmp_path / "indrnn_adding.png").stat().st_size > 10_000


def test_beam_pentadiagonal_converges_at_second_order(tmp_path):
    out = run_example("beam_pentadiagonal.py", "--quick", "--out", str(tmp_path))
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s*\d+\s+\d\.\d+e-\d+", line)]
    assert len(rows) == 3
    for beam in ("simply supported", "clamped"):
        assert abs(number(f"observed order of convergence, {beam}: (\\S+)", out) - 2) < 0.1
    first, last = [float(v) for v in rows[0][2:4]], [float(v) for v in rows[-1][2:5:2]]
    assert last[0] < first[0] / 10 and last[1] < first[1] / 10  # both beams' errors fall
    for row in rows:  # solve_banded against scipy, solveh_banded against solve_banded
        # Relative agreement to rounding, which grows like the condition number, about
        # 16 (n + 1)^4 / pi^4 (3e-13 to 8e-11 at n = 31..127, by CPU and LAPACK build).
        bound = np.finfo(np.float64).eps * 16 * (int(row[0]) + 1) ** 4 / np.pi**4
        assert float(row[-2]) < bound and float(row[-1]) < bound
    assert number(r"solveh_banded: \d+ beams of \d+ points in (\S+) ms", out) > 0
    assert (tmp_path / "beam_pentadiagonal.png").stat().st_size > 10_000


def test_diffrax_banded_matches_the_dense_newton_solve(tmp_path):
    pytest.importorskip("diffrax")
    pytest.importorskip("optimistix")
    out = run_example("diffrax_banded.py", "--quick", "--out", str(tmp_path))
    assert number(r"max \|u_banded - u_dense\| .* \(relative (\S+)\)", out) < 1e-10
    steps = re.findall(r"^\s+(banded|dense): (\d+) accepted steps", out, re.MULTILINE)
    assert len(steps) == 2 and steps[0][1] == steps[1][1] and int(steps[0][1]) > 5
    rows = re.findall(r"^\s*(\d+)\s+(\S+)\s+(\S+)\s+\S+x\s+(\S+)$", out, re.MULTILINE)
    assert [int(r[0]) for r in rows] == [64, 128, 256]
    for _, banded, dense, difference in rows:
        assert float(banded) > 0 and float(dense) > 0 and float(difference) < 1e-10
    assert float(rows[-1][2]) > 3 * float(rows[-1][1])  # dense LU at N = 256 is much slower
    assert number(r"slope .*: banded (\S+), dense", out) < 2
    assert (tmp_path / "diffrax_banded.png").stat().st_size > 10_000


def test_examples_run_without_matplotlib(tmp_path):
    """--out without matplotlib installed: the script says so and still prints its results."""
    script = (f"import runpy, sys; sys.modules['matplotlib'] = None; "
              f"sys.path.insert(0, {str(EXAMPLES)!r}); "
              f"sys.argv = ['heat_1d.py', '--quick', '--out', {str(tmp_path)!r}]; "
              f"runpy.run_path({str(EXAMPLES / 'heat_1d.py')!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "observed order of convergence" in result.stdout
    assert "matplotlib is not installed" in result.stdout
    assert not list(tmp_path.iterdir())


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


def test_sharded_solve_example_on_8_host_devices():
    out = run_example("sharded_solve.py", "--quick")
    assert "8 cpu devices" in out
    assert "1. batch axis x sharded" in out and "collectives: none" in out
    assert number(r"2\. solve axis z sharded.*= (\S+)", out) < 1e-13
    assert number(r"all-gather'\]; \d+ bytes per device per solve \((\S+)%", out) < 25
    assert number(r"3\. d loss / d diag .* from one device (\S+)", out) < 1e-12


def test_kalman_smoother_matches_the_kalman_filter_and_fits_the_noise(tmp_path):
    out = run_example("kalman_smoother.py", "--quick", "--out", str(tmp_path))
    assert number(r"max \|mean - Kalman/RTS mean\| = (\S+)", out) < 1e-8
    assert number(r"log-likelihood: .*relative difference (\S+)", out) < 1e-8
    for name in ("log q", "log r"):
        line = f"d loglik / d {name} .*: autodiff (\\S+), finite difference (\\S+)"
        assert number(line, out) == pytest.approx(number(line, out, 2), rel=1e-5)
    for name in ("q", "r"):  # the fit ends much nearer the true value than it started
        line = f"\\b{name}: (\\S+) -> (\\S+) \\(true (\\S+)\\)"
        start, end, true = (number(line, out, g) for g in (1, 2, 3))
        assert abs(math.log(end / true)) < 0.1 * abs(math.log(start / true))
    start, end = (number(r"loglik per observation: (\S+) -> (\S+)", out, g) for g in (1, 2))
    assert end > start
    logliks = [float(v) for v in re.findall(r"iteration\s+\d+\s+loglik per observation (\S+)", out)]
    assert len(logliks) >= 5 and logliks[-1] > logliks[0]
    assert number(r"smoothed means by the block solve (\S+) ms", out) > 0
    assert number(r"NumPy Kalman filter \+ RTS smoother .* (\S+) ms", out) > 0
    assert (tmp_path / "kalman_smoother.png").stat().st_size > 10_000


def test_reaction_diffusion_implicit_forms_turing_stripes(tmp_path):
    out = run_example("reaction_diffusion_implicit.py", "--quick", "--out", str(tmp_path))
    threshold = number(r"Turing threshold b_c = (\S+);", out)
    assert number(r"max \|increment - scipy.linalg.solve\| / max \|increment\| = (\S+)",
                  out) < 1e-12
    assert abs(number(r"observed order in dt: (\S+)", out) - 1) < 0.15
    rows = re.findall(r"^\s*(\d\.\d\d)\s+(\S+)\s+(\S+)\s+\S+\s+(\S+)\s+(\d+)", out, re.MULTILINE)
    assert len(rows) == 5
    for b, growth, initial, final, stripes in rows:
        if float(b) < threshold:  # the noise dies out
            assert float(growth) < 0 and float(final) < 1e-3 * float(initial) and stripes == "0"
        else:  # stripes grow from the noise and saturate
            assert float(growth) > 0 and float(final) > 0.5 and int(stripes) >= 5
    assert (tmp_path / "reaction_diffusion_implicit.png").stat().st_size > 10_000
