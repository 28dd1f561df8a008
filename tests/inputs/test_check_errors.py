"""check=True raises a short, specific error: eagerly, under jax.jit and equinox.filter_jit.

Each case runs in a fresh interpreter and reads what the user would see on stderr: the
count and the advice once, no internal-error wrappers when called eagerly, and a bounded
traceback (eagerly it was 112 lines: the message three times inside JaxRuntimeError
"INTERNAL: CpuCallback error", under Equinox's banner about filter_jit).
"""

import subprocess
import sys
import textwrap

import numpy as np
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


# --- check=True under jax.vmap: the message counts the systems of the whole vmapped batch ---


def _tridiagonal_batch(instances=4, systems=1, n=6):
    """`instances` x `systems` diagonally dominant systems of n rows; those of instance 0 and
    instance 2 have a zero first pivot (the Thomas sweep gives a non-finite x)."""
    import jax.numpy as jnp

    ones = jnp.ones((instances, systems, n))
    diag = jnp.full((instances, systems, n), 4.0).at[jnp.array([0, 2]), :, 0].set(0.0)
    return ones, diag, ones, ones


def _check_vmap_wraps():
    import equinox as eqx
    import jax

    import tridiax

    def solve(*a):
        return tridiax.solve_tridiagonal(*a, check=True)

    return {
        "vmap": lambda *a: jax.vmap(solve)(*a),
        "jax.jit(vmap)": jax.jit(jax.vmap(solve)),
        "equinox.filter_jit(vmap)": eqx.filter_jit(jax.vmap(solve)),
        "vmap(jax.jit)": jax.vmap(jax.jit(solve)),
        "vmap(vmap)": lambda *a: jax.vmap(jax.vmap(solve))(
            *(v.reshape((2, 2) + v.shape[1:]) for v in a)),
    }


@pytest.mark.parametrize("wrap", list(_check_vmap_wraps()))
@pytest.mark.parametrize("systems", [1, 3])
def test_check_under_vmap_counts_the_whole_batch(wrap, systems):
    import jax

    args = _tridiagonal_batch(systems=systems)
    f = _check_vmap_wraps()[wrap]
    failed, total = 2 * systems, 4 * systems
    with pytest.raises(Exception, match=rf"tridiax: {failed} of {total} tridiagonal systems "
                                        r"failed.*Pass pivoting=True"):
        jax.block_until_ready(f(*args))
    good = [a.at[:, :, 0].set(4.0) if k == 1 else a for k, a in enumerate(args)]
    x = jax.block_until_ready(f(*good))  # no error, and the same answer as without the check
    import tridiax

    expected = tridiax.solve_tridiagonal(*good)
    np.testing.assert_allclose(np.asarray(x).reshape(expected.shape), expected, rtol=1e-12)


def test_check_under_vmap_of_grad_and_jacrev():
    import jax
    import jax.numpy as jnp

    import tridiax

    lower, diag, upper, rhs = _tridiagonal_batch(systems=3)
    loss = lambda d, b: jnp.sum(tridiax.solve_tridiagonal(lower[0], d, upper[0], b,  # noqa: E731
                                                          check=True))
    with pytest.raises(Exception, match=r"tridiax: 6 of 12 tridiagonal systems failed"):
        jax.block_until_ready(jax.jit(jax.vmap(jax.grad(loss)))(diag, rhs))
    # jax.jacrev maps over the cotangents of one solve of 3 systems: still 3 systems.
    solve = lambda b: tridiax.solve_tridiagonal(lower[0], diag[0], upper[0], b,  # noqa: E731
                                                check=True)
    with pytest.raises(Exception, match=r"tridiax: 3 of 3 tridiagonal systems failed"):
        jax.block_until_ready(jax.jit(jax.jacrev(solve))(rhs[0]))


def test_check_under_vmap_banded_and_block():
    import jax
    import jax.numpy as jnp

    import tridiax

    n = 6
    # Banded, scipy's layout with (l, u) = (1, 2): 4 instances, a zero first pivot in 0 and 2.
    ab = jnp.ones((4, 4, n)).at[:, 2].set(5.0).at[jnp.array([0, 2]), 2, 0].set(0.0)
    b = jnp.ones((4, n))
    banded = jax.vmap(lambda ab, b: tridiax.solve_banded((1, 2), ab, b, pivoting=False,
                                                         check=True))
    with pytest.raises(Exception, match=r"tridiax: 2 of 4 banded systems failed"):
        jax.block_until_ready(banded(ab, b))
    # Block-tridiagonal, 2 x 2 blocks: 4 instances of 3 systems, a zero first block in 0 and 2.
    eye = jnp.eye(2)
    diag = jnp.broadcast_to(4 * eye, (4, 3, n, 2, 2)).at[jnp.array([0, 2]), :, 0].set(0.0)
    off = jnp.broadcast_to(eye, (4, 3, n, 2, 2))
    rhs = jnp.ones((4, 3, n, 2))
    block = jax.jit(jax.vmap(lambda *a: tridiax.solve_block_tridiagonal(*a, pivoting=False,
                                                                        check=True)))
    with pytest.raises(Exception, match=r"tridiax: 6 of 12 block-tridiagonal systems failed"):
        jax.block_until_ready(block(off, diag, off, rhs))
