"""The native CPU kernel's first build says so, once, with where it is cached."""

import os
import subprocess
import sys

import pytest

CODE = ("import jax.numpy as jnp, tridiax; "
        "print(tridiax.solve_tridiagonal(jnp.ones(4), 4 * jnp.ones(4), jnp.ones(4), jnp.ones(4)))")


def run(cache, code=CODE):
    env = dict(os.environ, TRIDIAX_CACHE_DIR=str(cache), TRIDIAX_NATIVE="1")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="the cache path printed is a Linux path")
def test_first_build_logs_one_line_with_the_cache_path(tmp_path):
    err = run(tmp_path)
    notices = [line for line in err.splitlines() if "building the native CPU kernel" in line]
    assert len(notices) == 1, err
    built = list(tmp_path.glob("cpu_kernels-*.so"))
    assert len(built) == 1 and str(built[0]) in notices[0], err
    assert "setLevel(logging.ERROR)" in notices[0]
    assert "building" not in run(tmp_path)  # cached: silent
    # Silenced the way the notice says (a fresh cache, so it builds again).
    fresh = tmp_path / "fresh"
    quiet = "import logging; logging.getLogger('tridiax').setLevel(logging.ERROR); " + CODE
    assert "building" not in run(fresh, quiet)
    assert list(fresh.glob("cpu_kernels-*.so"))
