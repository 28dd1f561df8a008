"""tridiax.lineax.TDMA as a lineax solver, against dense solves (lineax is in the test extra)."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import tridiax


def _problem(batch=(), n=7, seed=0):
    rng = np.random.default_rng(seed)
    d = rng.uniform(-1, 1, batch + (n,)) + 3
    lo, up = rng.uniform(-1, 1, batch + (n - 1,)), rng.uniform(-1, 1, batch + (n - 1,))
    return d, lo, up, rng.standard_normal(batch + (n,))


def _solve(d, lo, up, b, **kwargs):
    op = lx.TridiagonalLinearOperator(d, lo, up)
    return lx.linear_solve(op, b, solver=tridiax.lineax.TDMA(), **kwargs).value


@pytest.mark.parametrize("n", [1, 2, 3, 50])
def test_linear_solve_matches_dense(n):
    d, lo, up, b = _problem(n=n)
    a = lx.TridiagonalLinearOperator(d, lo, up).as_matrix()
    np.testing.assert_allclose(_solve(d, lo, up, b), np.linalg.solve(a, b), rtol=1e-12)


def test_gradients_through_linear_solve():
    d, lo, up, b = _problem(seed=1)

    def dense(d, lo, up, b):
        return jnp.linalg.solve(lx.TridiagonalLinearOperator(d, lo, up).as_matrix(), b)

    loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))  # noqa: E731
    got = jax.grad(loss(_solve), argnums=(0, 1, 2, 3))(d, lo, up, b)
    want = jax.grad(loss(dense), argnums=(0, 1, 2, 3))(d, lo, up, b)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-13)


def test_vmap_runs_one_batched_kernel():
    d, lo, up, b = _problem(batch=(9,), seed=2)
    f = jax.jit(jax.vmap(_solve))
    x = f(d, lo, up, b)
    for k in range(9):
        a = lx.TridiagonalLinearOperator(d[k], lo[k], up[k]).as_matrix()
        np.testing.assert_allclose(x[k], np.linalg.solve(a, b[k]), rtol=1e-12)
    # One kernel call solves the whole batch: vmap adds a batch dimension to it.
    from tridiax._core import backend as _backend

    backend = _backend.default_backend(_backend.device_platform(jax.devices()[0]), d.dtype)
    target = {"native": "tridiax_thomas_cpu", "pallas_triton": "__gpu$xla.gpu.triton"}.get(backend, "while")
    hlo = f.lower(d, lo, up, b).as_text()
    assert hlo.count(target) == 1, (backend, target)


def test_non_tridiagonal_operator_is_refused():
    op = lx.MatrixLinearOperator(jnp.eye(4))
    with pytest.raises(ValueError, match="needs a tridiagonal operator"):
        lx.linear_solve(op, jnp.ones(4), solver=tridiax.lineax.TDMA())


def test_zero_pivot_is_reported():
    d, lo, up, b = _problem(seed=3)
    d[0] = 0.0
    lo[:] = up[:] = 0.0  # singular: the first equation reads 0 = b[0]
    sol = lx.linear_solve(lx.TridiagonalLinearOperator(d, lo, up), b, solver=tridiax.lineax.TDMA(),
                          throw=False)
    assert sol.result == lx.RESULTS.singular
    with pytest.raises(Exception, match="singular|Singular"):
        _solve(d, lo, up, b)


@pytest.mark.parametrize("pivoting", [False, True])
def test_tridiax_tdma_is_itself_a_lineax_solver(pivoting):
    # `lineax.linear_solve(op, b, solver=tridiax.TDMA())` used to fail with "'TDMA' object has
    # no attribute 'init'": the module solver now speaks lineax's solver interface too.
    d, lo, up, b = _problem(seed=4)
    op = lx.TridiagonalLinearOperator(d, lo, up)
    solver = tridiax.TDMA(pivoting=pivoting)
    x = lx.linear_solve(op, b, solver=solver).value
    np.testing.assert_allclose(x, np.linalg.solve(op.as_matrix(), b), rtol=1e-12)
    grads = jax.grad(lambda d: jnp.sum(lx.linear_solve(
        lx.TridiagonalLinearOperator(d, lo, up), b, solver=solver).value ** 2))(d)
    dense = jax.grad(lambda d: jnp.sum(jnp.linalg.solve(
        lx.TridiagonalLinearOperator(d, lo, up).as_matrix(), b) ** 2))(d)
    np.testing.assert_allclose(grads, dense, rtol=1e-10)
    with pytest.raises(ValueError, match="tridiax.TDMA needs a tridiagonal operator"):
        lx.linear_solve(lx.MatrixLinearOperator(jnp.eye(4)), jnp.ones(4), solver=solver)


def _tridiax_objects(n=7):
    """Each tridiax operator and factorization that a user may hand lineax, with the lineax
    solver they would pass, the right-hand side, and the words of the advice."""
    d, lo, up, b = _problem(n=n, seed=5)
    lower, upper = np.concatenate([[0.0], lo]), np.concatenate([up, [0.0]])
    tri = tridiax.Tridiagonal(lower, d, upper)
    banded = tridiax.Banded(np.stack([upper, d, lower]), (1, 1))
    blocks = [np.asarray(v)[:, None, None] * np.eye(2) for v in (lower, d, upper)]
    block = tridiax.BlockTridiagonal(*blocks)
    b2 = np.stack([b, b], axis=-1).reshape(-1)
    return [
        (tri, tridiax.TDMA(), b, "lineax.TridiagonalLinearOperator(diag, lower[1:], upper[:-1])"),
        (tri.factor(), tridiax.TDMA(), b, "`F.solve(b)`"),
        (banded, tridiax.lineax.Banded(1, 1), b, "solver=tridiax.lineax.Banded(l, u)"),
        (banded.factor(), tridiax.lineax.Banded(1, 1), b, "`F.solve(b)`"),
        (block, tridiax.lineax.BlockTDMA(), b2, "tridiax.lineax.BlockTridiagonalLinearOperator"),
        (block.factor(), tridiax.lineax.BlockTDMA(), b2, "`F.solve(b)`"),
    ]


@pytest.mark.parametrize("case", range(6), ids=["Tridiagonal", "TridiagonalFactorization",
                                                "Banded", "BandedFactorization",
                                                "BlockTridiagonal",
                                                "BlockTridiagonalFactorization"])
def test_a_tridiax_operator_given_to_lineax_says_what_to_pass(case):
    # It failed with "AttributeError: 'Tridiagonal' object has no attribute 'out_structure'".
    obj, solver, b, advice = _tridiax_objects()[case]
    name = type(obj).__name__
    with pytest.raises(AttributeError, match=rf"^tridiax\.{name} is not a lineax operator") as info:
        lx.linear_solve(obj, jnp.asarray(b), solver=solver)
    assert advice in str(info.value), str(info.value)
    assert not hasattr(obj, "in_structure")  # still absent for duck typing
    with pytest.raises(AttributeError, match=rf"'{name}' object has no attribute 'nothing'"):
        obj.nothing  # noqa: B018


def test_the_advice_for_tridiagonal_gives_the_same_solution():
    d, lo, up, b = _problem(n=9, seed=6)
    lower, upper = np.concatenate([[0.0], lo]), np.concatenate([up, [0.0]])
    a = tridiax.Tridiagonal(lower, d, upper)
    # What the error says to pass: lineax.TridiagonalLinearOperator(diag, lower[1:], upper[:-1]).
    op = lx.TridiagonalLinearOperator(a.diag, a.lower[1:], a.upper[:-1])
    x = lx.linear_solve(op, jnp.asarray(b), solver=tridiax.TDMA()).value
    dense = np.diag(d) + np.diag(lo, -1) + np.diag(up, 1)
    np.testing.assert_allclose(x, np.linalg.solve(dense, b), rtol=1e-12)
    np.testing.assert_allclose(a.solve(b), np.linalg.solve(dense, b), rtol=1e-12)
