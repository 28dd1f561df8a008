"""Sharded inputs on 8 host CPU devices: the checks in sharding_cases.py, in a subprocess.

XLA's device count is fixed when JAX starts, and this process already runs on one device, so
the cases run in a fresh interpreter with XLA_FLAGS=--xla_force_host_platform_device_count=8.
"""

import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from tridiax._long_systems.partition_method import solve_small


def test_sharded_cases_on_8_host_devices(request):
    """The cases of this run's tier (its -m: CI's runs the first case of each function,
    tests/conftest.py; the whole suite every case)."""
    here = pathlib.Path(__file__).parent
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    tier = request.config.getoption("markexpr")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         *(["-m", tier] if tier else []), str(here / "sharding_cases.py")],
        capture_output=True, text=True, env=env, cwd=here)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "failed" not in result.stdout


@pytest.mark.parametrize("n", [1, 2, 3, 8, 16])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
def test_reduced_system_solve_matches_numpy(n, dtype):
    # The partition method's small dense solve (no LAPACK): batches, a matrix that needs row
    # interchanges (a permutation with a zero leading entry), a tiny pivot beside a large one.
    rng = np.random.default_rng(n)
    a = rng.standard_normal((4, 3, n, n)) + 3 * np.eye(n)
    b = rng.standard_normal((4, 3, n))
    if np.issubdtype(dtype, np.complexfloating):
        a, b = a + 1j * rng.standard_normal(a.shape), b + 1j * rng.standard_normal(b.shape)
    a[0, 0] = np.eye(n)[::-1]
    if n > 1:
        a[0, 1] = np.eye(n)
        a[0, 1, 0, 0], a[0, 1, 1, 0] = 1e-12, 1.0
    a, b = a.astype(dtype), b.astype(dtype)
    with jax.enable_x64(dtype != np.float32):
        x = np.asarray(jax.jit(solve_small)(a, b))
    ref = np.linalg.solve(a.astype(np.complex128), b.astype(np.complex128)[..., None])[..., 0]
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert np.max(np.abs(x - ref)) <= tol * np.max(np.abs(ref))
