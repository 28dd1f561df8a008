"""check=True raises a short, specific error: eagerly, under jax.jit and equinox.filter_jit.

Each case runs in a fresh interpreter and reads what the user would see on stderr: the
count and the advice once, no internal-error wrappers when called eagerly, and a bounded
traceback (eagerly it was 112 lines: the message three times inside JaxRuntimeError
"INTERNAL: CpuCallback error", under Equinox's banner about filter_jit).
"""

import subprocess
import sys
import textwrap

import pytest

SCRIPT = """
import jax, jax.numpy as jnp, equinox as eqx, tridiax
n = 5
upper = rhs = jnp.ones((3, n))
# Row 1 of system 1 is (0, 0, 1, 0, 0): a zero pivot without row interchanges, plain or cyclic.
lower = jnp.ones((3, n)).at[1, 1].set(0.0)
diag = jnp.full((3, n), 4.0).at[1, 1].set(0.0)
solve = lambda *a: tridiax.{function}(*a, check=True)
jax.block_until_ready({call})
"""
CALLS = {
    "eager": "solve(lower, diag, upper, rhs)",
    "jax.jit": "jax.jit(solve)(lower, diag, upper, rhs)",
    "equinox.filter_jit": "eqx.filter_jit(solve)(lower, diag, upper, rhs)",
    "grad": "jax.grad(lambda d: jnp.sum(solve(lower, d, upper, rhs)))(diag)",
}
# The longest stderr allowed (lines; measured: 12, 15, 41, 36). Eagerly and under an eager
# grad: the user's lines, tridiax's entry and the error. Under jit the error happens at run
# time, so it comes through JAX's callback machinery (equinox.filter_jit unwraps it).
LIMITS = {"eager": 14, "grad": 18, "jax.jit": 45, "equinox.filter_jit": 40}


def stderr_of(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode != 0, "no error was raised"
    return result.stderr


@pytest.mark.parametrize("mode", list(CALLS))
@pytest.mark.parametrize("function", ["solve_tridiagonal", "solve_periodic_tridiagonal"])
def test_breakdown_error_is_short_and_specific(mode, function):
    err = stderr_of(SCRIPT.format(function=function, call=CALLS[mode]))
    kind = "periodic tridiagonal" if "periodic" in function else "tridiagonal"
    message = f"tridiax: 1 of 3 {kind} systems failed"
    assert message in err, err
    assert "Pass pivoting=True" in err, err
    lines = err.strip().splitlines()
    assert len(lines) <= LIMITS[mode], f"{len(lines)} lines:\n{err}"
    if mode in ("eager", "grad"):
        assert [line for line in lines if line.startswith("tridiax.BreakdownError: ")] == [
            next(line for line in lines if message in line)], err
        assert err.count(message) == 1, err
        for noise in ("JaxRuntimeError", "INTERNAL", "CpuCallback", "filter_jit"):
            assert noise not in err, err
    if mode == "equinox.filter_jit":
        assert "INTERNAL" not in err and "CpuCallback" not in err, err


def test_eager_error_is_catchable_and_counts():
    import jax.numpy as jnp

    import tridiax

    diag = jnp.full((4, 6), 4.0).at[0, 0].set(0.0).at[2, 0].set(0.0)
    ones = jnp.ones((4, 6))
    with pytest.raises(tridiax.BreakdownError, match=r"^tridiax: 2 of 4 tridiagonal systems"):
        tridiax.solve_tridiagonal(ones, diag, ones, ones, check=True)
    with pytest.raises(tridiax.BreakdownError, match=r"pivoted, so those matrices are singular"):
        tridiax.solve_tridiagonal(ones, jnp.zeros((4, 6)), ones * 0, ones, check=True,
                                  pivoting=True)
    tridiax.solve_tridiagonal(ones, diag.at[:, 0].set(4.0), ones, ones, check=True)  # no error
