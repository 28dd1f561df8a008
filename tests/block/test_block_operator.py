"""BlockTridiagonal, its factorization and the lineax interop against dense NumPy matrices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_block import random_blocks

import tridiax

lx = pytest.importorskip("lineax")
import tridiax.lineax as tlx  # noqa: E402  (needs lineax)


def dense_numpy(lower, diag, upper):
    """(..., N k, N k) from (..., N, k, k) blocks (NumPy loops, lower[0]/upper[N-1] dropped)."""
    n, k = diag.shape[-3], diag.shape[-1]
    shape = np.broadcast_shapes(lower.shape, diag.shape, upper.shape)[:-3]
    out = np.zeros(shape + (n * k, n * k), np.result_type(lower, diag, upper))
    for i in range(n):
        for j, blocks in ((i - 1, lower), (i, diag), (i + 1, upper)):
            if 0 <= j < n:
                out[..., i * k:(i + 1) * k, j * k:(j + 1) * k] = blocks[..., i, :, :]
    return out


@pytest.fixture
def problem():
    lower, diag, upper, rhs = random_blocks((3, 6), 3, seed=21)
    return lower, diag, upper, rhs


def test_mv_transpose_and_dense(problem):
    lower, diag, upper, rhs = problem
    a = tridiax.BlockTridiagonal(lower, diag, upper)
    matrix = dense_numpy(lower, diag, upper)
    np.testing.assert_allclose(a.as_matrix(), matrix)
    np.testing.assert_allclose(a.T.as_matrix(), np.swapaxes(matrix, -1, -2))
    flat = rhs.reshape(3, -1)
    np.testing.assert_allclose(np.asarray(a.mv(rhs)).reshape(3, -1),
                               np.einsum("bij,bj->bi", matrix, flat), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(a.T.mv(rhs)).reshape(3, -1),
                               np.einsum("bji,bj->bi", matrix, flat), rtol=1e-12)
    np.testing.assert_allclose((2 * a).as_matrix(), 2 * matrix)
    np.testing.assert_allclose((-a).as_matrix(), -matrix)


@pytest.mark.parametrize("pivoting", [True, False])
def test_factor_solves_like_the_solve(problem, pivoting):
    lower, diag, upper, rhs = problem
    a = tridiax.BlockTridiagonal(lower, diag, upper)
    lu = a.factor(pivoting=pivoting)
    matrix = dense_numpy(lower, diag, upper)
    x = lu.solve(rhs)
    expected = np.linalg.solve(matrix, rhs.reshape(3, -1, 1))[..., 0].reshape(rhs.shape)
    np.testing.assert_allclose(x, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a.solve(rhs, pivoting=pivoting), expected, rtol=1e-10,
                               atol=1e-12)
    xt = lu.T.solve(rhs)
    expected_t = np.linalg.solve(np.swapaxes(matrix, -1, -2), rhs.reshape(3, -1, 1))[..., 0]
    np.testing.assert_allclose(np.asarray(xt).reshape(3, -1), expected_t, rtol=1e-10,
                               atol=1e-12)
    # More right-hand sides: extra leading dimensions, and m columns.
    many = np.random.default_rng(1).uniform(-1, 1, (4, 3, 6, 3))
    np.testing.assert_allclose(lu.solve(many), a.solve(many), rtol=1e-10, atol=1e-12)
    columns = np.random.default_rng(2).uniform(-1, 1, (3, 6, 3, 2))
    np.testing.assert_allclose(lu.solve(columns), a.solve(columns), rtol=1e-10, atol=1e-12)


def test_shared_blocks_and_axis_zero():
    lower, diag, upper, rhs = random_blocks((6,), 2, seed=4)
    many = np.random.default_rng(5).uniform(-1, 1, (5, 6, 2))
    a = tridiax.BlockTridiagonal(lower, diag, upper)
    np.testing.assert_allclose(a.factor().solve(many), a.solve(many), rtol=1e-10, atol=1e-12)
    moved = [np.moveaxis(v, 0, 1) for v in random_blocks((3, 6), 2, seed=6)]
    a0 = tridiax.BlockTridiagonal(*moved[:3], axis=0)
    expected = tridiax.solve_block_tridiagonal(*moved, axis=0)
    np.testing.assert_allclose(a0.factor(pivoting=False).solve(moved[3]), expected, rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(a0.solve(moved[3]), expected, rtol=1e-12)


def test_factorization_gradients_match_the_solve(problem):
    lower, diag, upper, rhs = problem

    def via_factor(lo, d, up, r):
        return jnp.sum(jnp.cos(tridiax.BlockTridiagonal(lo, d, up).factor().solve(r)))

    def via_solve(lo, d, up, r):
        return jnp.sum(jnp.cos(tridiax.solve_block_tridiagonal(lo, d, up, r)))

    for got, want in zip(jax.grad(via_factor, (0, 1, 2, 3))(lower, diag, upper, rhs),
                         jax.grad(via_solve, (0, 1, 2, 3))(lower, diag, upper, rhs),
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_operator_under_jit_and_vmap(problem):
    lower, diag, upper, rhs = problem
    a = tridiax.BlockTridiagonal(lower, diag, upper)
    expected = a.solve(rhs)
    np.testing.assert_allclose(jax.jit(lambda a, r: a.factor().solve(r))(a, rhs), expected,
                               rtol=1e-10)
    np.testing.assert_allclose(jax.vmap(lambda a, r: a.solve(r))(a, rhs), expected, rtol=1e-12)


def test_operator_errors():
    ones = np.ones((4, 2, 2))
    with pytest.raises(ValueError, match="square blocks"):
        tridiax.BlockTridiagonal(ones, np.ones((4, 2, 3)), ones)
    with pytest.raises(ValueError, match="out of range"):
        tridiax.BlockTridiagonal(ones, ones, ones, axis=1)
    with pytest.raises(ValueError, match="does not fit"):
        tridiax.BlockTridiagonal(ones, ones, ones).solve(np.ones((4, 3)))


def test_lineax_operator_and_solver():
    lower, diag, upper, rhs = random_blocks((7,), 3, seed=8)
    op = tlx.BlockTridiagonalLinearOperator(lower, diag, upper)
    matrix = dense_numpy(lower, diag, upper)
    b = rhs.reshape(-1)
    np.testing.assert_allclose(op.as_matrix(), matrix)
    np.testing.assert_allclose(op.mv(b), matrix @ b, rtol=1e-12)
    np.testing.assert_allclose(op.transpose().as_matrix(), matrix.T)
    x = lx.linear_solve(op, b, solver=tlx.BlockTDMA()).value
    np.testing.assert_allclose(x, np.linalg.solve(matrix, b), rtol=1e-10)
    # Any operator whose matrix is block tridiagonal, with k given: a matrix and a Jacobian.
    for other in (lx.MatrixLinearOperator(jnp.asarray(matrix)),
                  lx.JacobianLinearOperator(lambda y, args: jnp.asarray(matrix) @ y,
                                            jnp.zeros(21))):
        got = lx.linear_solve(other, b, solver=tlx.BlockTDMA(k=3)).value
        np.testing.assert_allclose(got, x, rtol=1e-10)
    with pytest.raises(ValueError, match="give the block size"):
        lx.linear_solve(lx.MatrixLinearOperator(jnp.asarray(matrix)), b, solver=tlx.BlockTDMA())
    with pytest.raises(ValueError, match="positive integer"):
        tlx.BlockTDMA(k=0)


def test_lineax_gradients_and_vmap():
    lower, diag, upper, rhs = random_blocks((5,), 2, seed=9)
    b = rhs.reshape(-1)

    def through_lineax(d):
        op = tlx.BlockTridiagonalLinearOperator(lower, d, upper)
        return jnp.sum(lx.linear_solve(op, b, solver=tlx.BlockTDMA()).value ** 2)

    def direct(d):
        return jnp.sum(tridiax.solve_block_tridiagonal(lower, d, upper, rhs) ** 2)

    np.testing.assert_allclose(jax.grad(through_lineax)(diag), jax.grad(direct)(diag),
                               rtol=1e-9)
    stacked = np.stack([diag, diag + 0.5 * np.eye(2)])
    out = jax.vmap(lambda d: lx.linear_solve(tlx.BlockTridiagonalLinearOperator(lower, d, upper),
                                             b, solver=tlx.BlockTDMA()).value)(stacked)
    for j in range(2):
        np.testing.assert_allclose(out[j], np.linalg.solve(dense_numpy(lower, stacked[j], upper),
                                                           b), rtol=1e-10)
