"""Sharded inputs on 8 host CPU devices: the checks in sharding_cases.py, in a subprocess.

XLA's device count is fixed when JAX starts, and this process already runs on one device, so
the cases run in a fresh interpreter with XLA_FLAGS=--xla_force_host_platform_device_count=8.
"""

import os
import pathlib
import subprocess
import sys


def test_sharded_cases_on_8_host_devices():
    here = pathlib.Path(__file__).parent
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         str(here / "sharding_cases.py")], capture_output=True, text=True, env=env, cwd=here)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "failed" not in result.stdout
