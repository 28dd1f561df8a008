"""An install whose build of the C++ kernels fails: the wheel is still built and installs, carries
no library and a manifest that says why, and the installed tridiax solves with the XLA
formulation, saying so in `python -m tridiax --info` (and not building on first use)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from tridiax._native import compiler

ROOT = pathlib.Path(__file__).parents[2]

SOLVE = """
import json, sys, warnings
sys.path.insert(0, {site!r})
import numpy as np, tridiax
from tridiax._native import build
assert tridiax.__file__.startswith({site!r}), tridiax.__file__
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    x = tridiax.solve_tridiagonal(np.ones(6), np.arange(3.0, 9.0), np.ones(6), np.arange(6.0))
print(json.dumps([build.unavailable_reason(), np.asarray(x).tolist(),
                  [str(w.message) for w in caught]]))
"""


@pytest.mark.skipif(not compiler.is_x86_64(), reason="the install builds x86-64 levels only")
def test_an_install_whose_build_fails_still_installs_and_runs(tmp_path):
    # CXX=false: a compiler that fails every compilation (no kernels can be built).
    env = dict(os.environ, CXX="false", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("TRIDIAX_BUILD_LEVELS", None)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
                            "-w", str(tmp_path / "dist"), str(ROOT)],
                           capture_output=True, text=True, env=env, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    # The build says so (pip shows it with -v).
    assert "no native kernels in this install" in built.stdout + built.stderr
    wheel = next((tmp_path / "dist").glob("tridiax-*.whl"))
    assert wheel.name.endswith("-py3-none-linux_x86_64.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        manifest = json.loads(archive.read("tridiax/_native/lib/manifest.json"))
    assert not [name for name in names if name.endswith(".so")]
    assert manifest["built"] == {} and set(manifest["failed"]) == set(compiler.LEVELS)
    assert all("false failed" in error for error in manifest["failed"].values()), manifest

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, env=env, timeout=300)
    # A real compiler on PATH changes nothing: the failed install is not rebuilt on first use.
    run_env = dict(os.environ, JAX_PLATFORMS="cpu", TRIDIAX_CACHE_DIR=str(tmp_path / "cache"))
    run_env.pop("TRIDIAX_NATIVE", None)
    result = subprocess.run([sys.executable, "-c", SOLVE.format(site=str(site))], capture_output=True,
                            text=True, env=run_env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    reason, x, warned = json.loads(result.stdout.splitlines()[-1])
    assert reason.startswith("the install compiled no kernels (x86-64-v2: ") and "TRIDIAX_NATIVE=build" in reason
    assert len(warned) == 1 and "the native CPU kernel is unavailable" in warned[0]
    dense = np.diag(np.arange(3.0, 9.0)) + np.diag(np.ones(5), 1) + np.diag(np.ones(5), -1)
    np.testing.assert_allclose(x, np.linalg.solve(dense, np.arange(6.0)), rtol=1e-6)
    assert not (tmp_path / "cache").exists()
    info = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(site)!r}); "
                           "import runpy; runpy.run_module('tridiax', run_name='__main__')", "--info"],
                          capture_output=True, text=True, env=run_env, cwd=tmp_path, timeout=300)
    assert info.returncode == 0, info.stderr
    assert "native CPU kernel: NOT AVAILABLE" in info.stdout
    assert "installed: no level compiled at install" in info.stdout
    assert "not installed: x86-64-v4: " in info.stdout
