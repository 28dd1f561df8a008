"""Every x86-64 level of the native kernels that this machine runs, pinned with TRIDIAX_CPU_LEVEL
in a process of its own (level_worker.py), against independent references; and which build an
installed package loads.

Where tridiax is installed from a wheel (CI installs one, then runs these tests from outside the
source tree with no compiler on PATH), the levels are the wheel's libraries. In a source tree each
level is built on first use, which costs a build per level: those cases are marked `large` (run
them with `-m large`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tridiax._native import build as _native
from tridiax._native import compiler

WORKER = os.path.join(os.path.dirname(__file__), "level_worker.py")
EXPECT_INSTALLED = os.environ.get("TRIDIAX_EXPECT_INSTALLED") == "1"


def _cpu_runs() -> int:
    return _native.cpu_level(_native.library_path()) if _native.available() else 0


def _levels():
    runs = _cpu_runs()
    installed = _native.manifest()
    if installed is not None:
        return [level for level in sorted(installed.get("built", {})) if int(level[-1]) <= runs]
    return [pytest.param(level, marks=pytest.mark.large) for level in compiler.LEVELS
            if int(level[-1]) <= runs]


def _tolerance(name: str, sweep: float | None) -> float:
    """A case's allowed error: ten times the sequential sweep's in the same dtype where there is
    one (plus a few ulps), else a bound for the dtype."""
    eps = np.finfo(np.float32 if ("float32" in name or "complex64" in name) else np.float64).eps
    return 10 * sweep + 4 * eps if sweep is not None else 2e3 * eps


@pytest.mark.cpu_device
@pytest.mark.parametrize("level", _levels())
def test_each_level_this_cpu_runs_against_the_references(level, tmp_path):
    env = dict(os.environ, TRIDIAX_CPU_LEVEL=level, JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, WORKER, "1"], capture_output=True, text=True, timeout=900,
                            env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["level"] == level, report
    assert report["origin"] == ("installed" if _native.manifest() is not None else "built on first use")
    assert report["default_backend_native"]
    bad = [(name, err, sweep) for name, err, sweep in report["cases"] if not err <= _tolerance(name, sweep)]
    assert not bad, bad
    assert len(report["cases"]) > 100


@pytest.mark.cpu_device
def test_the_build_this_process_runs():
    # Installed: the best installed level this CPU runs, with no compiler needed (CI proves it with
    # none on PATH); a source tree: this CPU's own, built on first use.
    assert _native.available(), _native.unavailable_reason()
    choice, installed = _native.choice(), _native.manifest()
    if EXPECT_INSTALLED:
        assert installed is not None, f"tridiax was imported from a source tree: {_native.INSTALLED}"
        assert compiler.find_compiler() is None, "a compiler is reachable: the run proves nothing"
    if installed is None:
        assert (choice.origin, choice.level) == ("built on first use", compiler.NATIVE)
        return
    runs = _native.cpu_level(_native.INSTALLED / min(installed["built"].values()))
    best = max((level for level in installed["built"] if int(level[-1]) <= runs), key=lambda v: int(v[-1]))
    assert (choice.origin, choice.level) == ("installed", best)
    assert choice.path == _native.INSTALLED / installed["built"][best]
    assert set(installed["built"]) | set(installed["failed"]) == set(compiler.LEVELS)
