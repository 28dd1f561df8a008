"""solve_banded, solveh_banded and the Banded operator against SciPy and dense solves."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from helpers import assert_close, backends

import tridiax
from tridiax._banded import api as _banded
from tridiax.verify import reference_solve_banded

PAIRS = [(0, 0), (1, 1), (2, 2), (3, 1), (1, 3), (0, 2), (2, 0), (4, 4)]
DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


def random_ab(l, u, band_shape, dtype, *, seed=0, dominant=False, corners=np.nan):
    """scipy-layout bands (l + u + 1, *band_shape) along axis -1 of a band, NaN outside the
    matrix (scipy ignores those entries; so must tridiax)."""
    rng = np.random.default_rng(seed)
    shape = (l + u + 1,) + tuple(band_shape)
    ab = rng.uniform(-1, 1, shape)
    if np.issubdtype(dtype, np.complexfloating):
        ab = ab + 1j * rng.uniform(-1, 1, shape)
    if dominant:
        ab[u] = ab[u] + (l + u + 1) * np.where(np.real(ab[u]) >= 0, 1, -1)
    n = band_shape[-1]
    for k in range(l + u + 1):
        for j in range(n):
            if not 0 <= j + k - u < n:
                ab[k, ..., j] = corners
    return ab.astype(dtype)


def dense_of(ab, l, u):
    """(..., N, N) matrices from bands along the last axis of each band (NumPy)."""
    ab = np.asarray(ab)
    n = ab.shape[-1]
    out = np.zeros(ab.shape[1:-1] + (n, n), ab.dtype)
    for k in range(l + u + 1):
        for j in range(n):
            i = j + k - u
            if 0 <= i < n:
                out[..., i, j] = ab[k, ..., j]
    return out


def test_one_matrix_like_scipy():
    ab = random_ab(2, 1, (9,), np.float64, corners=0)
    b = np.random.default_rng(1).standard_normal((9, 4))
    x = tridiax.solve_banded((2, 1), ab, b, axis=0)
    np.testing.assert_allclose(x, scipy.linalg.solve_banded((2, 1), ab, b), rtol=1e-12)
    x1 = tridiax.solve_banded((2, 1), ab, b[:, 0])
    np.testing.assert_allclose(x1, scipy.linalg.solve_banded((2, 1), ab, b[:, 0]), rtol=1e-12)


@pytest.mark.parametrize("l, u", PAIRS)
@pytest.mark.parametrize("n", [1, 2, 3, 7, 33])
@pytest.mark.parametrize("pivoting", [True, False])
def test_matches_scipy_every_bandwidth(l, u, n, pivoting):
    ab = random_ab(l, u, (3, n), np.float64, seed=n, dominant=not pivoting)
    b = np.random.default_rng(n + 7).standard_normal((3, n))
    x = tridiax.solve_banded((l, u), ab, b, pivoting=pivoting)
    expected = reference_solve_banded((l, u), ab, b)
    assert_close(x, expected, np.float64, factor=100)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pivoting", [True, False])
def test_dtypes_and_backends(dtype, pivoting):
    l, u, n = 2, 3, 21
    wide = np.complex128 if np.issubdtype(dtype, np.complexfloating) else np.float64
    ab = np.moveaxis(random_ab(l, u, (5, n), wide, seed=3, dominant=not pivoting), -1, 1)
    b = np.random.default_rng(4).standard_normal((n, 5)).astype(dtype)
    expected = reference_solve_banded((l, u), ab, b, axis=0)
    for backend in backends(dtype, op="banded"):
        x = _banded.solve((l, u), ab.astype(dtype), b, axis=0, pivoting=pivoting,
                          backend=backend)
        assert x.dtype == dtype
        assert_close(x, expected, dtype, factor=50)


@pytest.mark.parametrize("shapes, axis", [
    (((7,), (7,)), -1),
    (((4, 7), (4, 7)), 1),
    (((7, 1), (7, 5)), 0),  # one matrix shared by the 5 columns
    (((7, 5), (7, 1)), 0),  # five matrices, one right-hand side
    (((2, 7, 3), (2, 7, 3)), 1),
    (((1, 7, 3), (2, 7, 1)), -2),
    (((7,), (2, 3, 7)), -1),
    (((1,), (3, 7)), -1),  # bands constant along the systems
])
def test_broadcasting_and_axes(shapes, axis):
    band_shape, b_shape = shapes
    l, u = 1, 2
    rng = np.random.default_rng(5)
    ab = rng.standard_normal((l + u + 1,) + band_shape)
    ab[u] += 5
    b = rng.standard_normal(b_shape)
    x = tridiax.solve_banded((l, u), ab, b, axis=axis)
    expected = reference_solve_banded((l, u), ab, b, axis=axis)
    assert x.shape == expected.shape
    np.testing.assert_allclose(x, expected, rtol=1e-11, atol=1e-12)


def test_scipy_two_d_ab_lies_along_axis():
    ab = random_ab(1, 2, (6,), np.float64, corners=0)
    b = np.random.default_rng(0).standard_normal((6, 4))
    np.testing.assert_allclose(tridiax.solve_banded((1, 2), ab, b, axis=0),
                               scipy.linalg.solve_banded((1, 2), ab, b), rtol=1e-12)
    with pytest.raises(ValueError, match="axis"):
        tridiax.solve_banded((1, 2), ab, b)  # 6 rows along axis 0, not the last axis


def test_tridiagonal_case_agrees_with_solve_tridiagonal():
    rng = np.random.default_rng(2)
    lower, diag, upper, b = (rng.standard_normal((4, 12)) for _ in range(4))
    ab = np.stack([np.roll(upper, 1, -1), diag, np.roll(lower, -1, -1)])
    x = tridiax.solve_banded((1, 1), ab, b)
    y = tridiax.solve_tridiagonal(lower, diag, upper, b, pivoting=True)
    np.testing.assert_allclose(x, y, rtol=1e-10)


def test_pivoting_needed():
    n = 10  # zero diagonal: eliminating in order divides by zero, pivoting does not
    rng = np.random.default_rng(3)
    ab = rng.standard_normal((5, n))
    ab[2] = 0.0
    b = rng.standard_normal(n)
    expected = scipy.linalg.solve_banded((2, 2), ab, b)
    np.testing.assert_allclose(tridiax.solve_banded((2, 2), ab, b), expected, rtol=1e-9)
    assert not np.all(np.isfinite(tridiax.solve_banded((2, 2), ab, b, pivoting=False)))


def test_singular_system_is_non_finite_alone_and_counted():
    ab = random_ab(2, 1, (3, 8), np.float64, dominant=True, corners=0)
    ab[:, 1] = 0.0  # system 1 is the zero matrix
    b = np.ones((3, 8))
    x = np.asarray(tridiax.solve_banded((2, 1), ab, b))
    assert not np.all(np.isfinite(x[1]))
    np.testing.assert_allclose(x[[0, 2]], reference_solve_banded((2, 1), ab, b)[[0, 2]],
                               rtol=1e-12)
    with pytest.raises(tridiax.BreakdownError, match="1 of 3 banded systems"):
        tridiax.solve_banded((2, 1), ab, b, check=True)
    good = np.delete(ab, 1, axis=1)
    tridiax.solve_banded((2, 1), good, b[:2], check=True)  # no error


def test_check_under_jit():
    ab = np.zeros((3, 2, 5))
    # Awaited: on a GPU the call runs asynchronously and raises when its result is read.
    with pytest.raises(Exception, match="2 of 2 banded systems"):
        jax.block_until_ready(
            jax.jit(lambda a: tridiax.solve_banded((1, 1), a, jnp.ones((2, 5)), check=True))(ab))


@pytest.mark.parametrize("l, u", [(1, 1), (2, 2), (3, 1), (0, 2), (2, 0)])
@pytest.mark.parametrize("transposed_axis", [False, True])
def test_gradients_match_dense(l, u, transposed_axis):
    n = 7
    ab = jnp.asarray(random_ab(l, u, (2, n), np.float64, seed=l + 3 * u, dominant=True))
    b = jnp.asarray(np.random.default_rng(9).standard_normal((2, n)))
    axis = -1
    if transposed_axis:  # systems along axis 0
        ab, b, axis = jnp.moveaxis(ab, -1, 1), b.T, 0
    weights = jnp.asarray(np.random.default_rng(1).standard_normal(b.shape))

    def ours(ab, b):
        return jnp.sum(weights * jnp.sin(tridiax.solve_banded((l, u), ab, b, axis=axis)))

    def dense(ab, b):
        moved = jnp.moveaxis(ab, 1, -1) if transposed_axis else ab
        a = jnp.asarray(dense_of_jnp(moved, l, u))
        rhs = b.T if transposed_axis else b
        x = jnp.linalg.solve(a, rhs[..., None])[..., 0]
        return jnp.sum(weights * jnp.sin(x.T if transposed_axis else x))

    g, h = jax.grad(ours, (0, 1))(ab, b), jax.grad(dense, (0, 1))(ab, b)
    for got, want in zip(g, h, strict=True):
        assert np.all(np.isfinite(got))  # NaN corners get a zero cotangent
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)
    tangent = (ab * 0.3, b * 0.1)
    _, t1 = jax.jvp(ours, (ab, b), tangent)
    _, t2 = jax.jvp(dense, (ab, b), tangent)
    np.testing.assert_allclose(t1, t2, rtol=1e-9)
    hv = jax.hessian(lambda b: ours(ab, b))(b)
    hd = jax.hessian(lambda b: dense(ab, b))(b)
    np.testing.assert_allclose(hv, hd, rtol=1e-8, atol=1e-10)


def dense_of_jnp(ab, l, u):
    """dense_of, differentiable, with entries outside the matrix never read."""
    n = ab.shape[-1]
    out = jnp.zeros(ab.shape[1:-1] + (n, n), ab.dtype)
    for k in range(l + u + 1):
        s = k - u
        for j in range(max(0, -s), min(n, n - s)):
            out = out.at[..., j + s, j].set(ab[k, ..., j])
    return out


@pytest.mark.parametrize("in_axes", [(0, 0), (None, 0), (1, None), (2, 1)])
def test_vmap(in_axes):
    l, u, n = 2, 1, 6
    rng = np.random.default_rng(0)
    ab = rng.standard_normal((l + u + 1, 3, n, 3))
    ab[u] += 6
    b = rng.standard_normal((3, n, 3))

    def one(a, bb):
        return tridiax.solve_banded((l, u), a, bb, axis=0)

    a_axis, b_axis = in_axes
    # Unmapped operands: take index 0 of the same structure.
    a_in = ab if a_axis is not None else ab[:, 0]
    if a_axis == 0:
        a_in = np.moveaxis(ab, 1, 0)
    elif a_axis == 2:
        a_in = np.moveaxis(ab, 1, 2)
    b_in = b if b_axis is not None else b[0]
    if b_axis == 1:
        b_in = np.moveaxis(b, 0, 1)
    out = jax.vmap(one, in_axes=in_axes)(a_in, b_in)
    for k in range(3):
        a_k = ab[:, k if a_axis is not None else 0]
        b_k = b[k if b_axis is not None else 0]
        np.testing.assert_allclose(out[k], reference_solve_banded((l, u), a_k, b_k, axis=0)
                                   if a_k.ndim > 2 else
                                   reference_solve_banded((l, u), a_k[..., None], b_k, axis=0),
                                   rtol=1e-11)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128, np.float32])
@pytest.mark.parametrize("lower", [False, True])
@pytest.mark.parametrize("u, n", [(0, 4), (1, 7), (2, 9), (3, 2)])
def test_solveh_banded_matches_scipy(dtype, lower, u, n):
    rng = np.random.default_rng(u + n)
    m = rng.standard_normal((n, n))
    if np.issubdtype(dtype, np.complexfloating):
        m = m + 1j * rng.standard_normal((n, n))
    a = m @ m.conj().T + n * np.eye(n)
    a[np.abs(np.subtract.outer(np.arange(n), np.arange(n))) > u] = 0
    a = a + 2 * n * np.eye(n)  # still positive definite after truncating the band
    ab = np.zeros((u + 1, n), a.dtype)
    for i, j in itertools.product(range(n), range(n)):
        if lower and 0 <= i - j <= u:
            ab[i - j, j] = a[i, j]
        if not lower and 0 <= j - i <= u:
            ab[u + i - j, j] = a[i, j]
    b = rng.standard_normal((n, 2)).astype(dtype)
    x = tridiax.solveh_banded(ab.astype(dtype), b, lower=lower, axis=0)
    expected = scipy.linalg.solveh_banded(ab, b.astype(np.complex128), lower=lower)
    assert_close(x, expected, dtype, factor=100)
    np.testing.assert_allclose(
        reference_solve_banded(None, ab, b, axis=0, hermitian=True, lower=lower), expected,
        rtol=1e-12)


def test_solveh_not_positive_definite():
    n = 6
    ab = np.stack([np.full(n, -1.0), np.full(n, 1.0)])  # upper form, diagonal 1, off -1: indefinite
    ab = np.stack([ab, np.stack([np.zeros(n), np.full(n, 3.0)])], axis=1)  # system 1 is 3 I
    b = np.ones((2, n))
    x = np.asarray(tridiax.solveh_banded(ab, b))
    assert np.all(np.isnan(x[0]))
    np.testing.assert_allclose(x[1], 1 / 3)
    with pytest.raises(tridiax.BreakdownError, match="not Hermitian positive definite"):
        tridiax.solveh_banded(ab, b, check=True)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("lower", [False, True])
@pytest.mark.parametrize("n, u", [(6, 2), (2, 3), (1, 1)])
def test_solveh_gradient_counts_both_triangles(dtype, lower, n, u):
    """The stored triangle's gradient (and JVP) against a dense solve of the matrix it stands
    for: its mirror image conjugated, the diagonal's imaginary part ignored, the entries
    outside the matrix unused."""
    rng = np.random.default_rng(n + u)
    ab = rng.uniform(-1, 1, (u + 1, n)).astype(dtype)
    if np.issubdtype(dtype, np.complexfloating):
        ab = ab + 1j * rng.uniform(-1, 1, (u + 1, n))
    ab[0 if lower else u] += 6
    b = rng.standard_normal(n).astype(dtype)

    def dense(ab):
        a = jnp.zeros((n, n), dtype)
        for k in range(u + 1):
            s = k if lower else u - k  # ab[k, j] = A[j + s, j] (lower), A[j - s, j] (upper)
            for j in range(n):
                i = j + s if lower else j - s
                if not 0 <= i < n:
                    continue
                value = ab[k, j].real.astype(dtype) if s == 0 else ab[k, j]
                a = a.at[i, j].set(value)
                if s:
                    a = a.at[j, i].set(jnp.conj(value))
        return a

    def loss(solve):
        return lambda ab: jnp.sum(jnp.abs(jnp.cos(solve(ab))) ** 2)

    solveh = lambda ab: tridiax.solveh_banded(ab, b, lower=lower)  # noqa: E731
    dense_solve = lambda ab: jnp.linalg.solve(dense(ab), b)  # noqa: E731
    np.testing.assert_allclose(jax.grad(loss(solveh))(ab), jax.grad(loss(dense_solve))(ab),
                               rtol=1e-9, atol=1e-12)
    tangent = rng.standard_normal(ab.shape).astype(dtype) * (1 + 1j if ab.dtype.kind == "c" else 1)
    np.testing.assert_allclose(jax.jvp(solveh, (ab,), (tangent,))[1],
                               jax.jvp(dense_solve, (ab,), (tangent,))[1], rtol=1e-9, atol=1e-12)


def test_errors():
    ab, b = np.ones((3, 5)), np.ones(5)
    with pytest.raises(ValueError, match=r"l \+ u \+ 1 = 4"):
        tridiax.solve_banded((2, 1), ab, b)
    with pytest.raises(TypeError, match="pair"):
        tridiax.solve_banded(2, ab, b)
    with pytest.raises(ValueError, match="non-negative"):
        tridiax.solve_banded((-1, 3), ab, b)
    with pytest.raises(ValueError, match="band index"):
        tridiax.solve_banded((1, 1), np.ones(3), b)
    with pytest.raises(TypeError, match="dtype int"):
        tridiax.solve_banded((1, 1), np.ones((3, 5), np.int32), b)
    with pytest.raises(ValueError, match="broadcast"):
        tridiax.solve_banded((1, 1), np.ones((3, 4, 5)), np.ones((3, 5)))


@pytest.mark.parametrize("band_shape, axis, rhs_shape", [
    ((8,), -1, (8,)), ((8, 1), 0, (8, 3)), ((2, 8), 1, (2, 8)), ((8,), -1, (4, 8))])
def test_operator(band_shape, axis, rhs_shape):
    l, u = 1, 2
    n = band_shape[axis]
    moved = random_ab(l, u, tuple(np.delete(band_shape, axis % len(band_shape))) + (n,),
                      np.float64, seed=2, dominant=True, corners=0)
    ab = np.moveaxis(moved, -1, (axis % len(band_shape)) + 1)
    op = tridiax.Banded(ab, (l, u), axis=axis)
    dense = dense_of(moved, l, u)  # batch + (N, N)
    np.testing.assert_allclose(op.as_matrix(), dense)
    np.testing.assert_allclose(op.T.as_matrix(), np.swapaxes(dense, -1, -2))
    rhs = np.random.default_rng(3).standard_normal(rhs_shape)
    rhs_axis = axis - len(band_shape) if axis >= 0 else axis
    x_moved = np.moveaxis(rhs, rhs_axis, -1)
    want_mv = np.moveaxis(np.einsum("...ij,...j->...i", _batched(dense, x_moved), x_moved),
                          -1, rhs_axis)
    np.testing.assert_allclose(op.mv(rhs), want_mv, rtol=1e-12)
    want = np.moveaxis(np.linalg.solve(_batched(dense, x_moved), x_moved[..., None])[..., 0],
                       -1, rhs_axis)
    np.testing.assert_allclose(op.solve(rhs), want, rtol=1e-11)
    lu = op.factor()
    np.testing.assert_allclose(lu.solve(rhs), want, rtol=1e-11)
    want_t = np.moveaxis(np.linalg.solve(np.swapaxes(_batched(dense, x_moved), -1, -2),
                                         x_moved[..., None])[..., 0], -1, rhs_axis)
    np.testing.assert_allclose(lu.T.solve(rhs), want_t, rtol=1e-11)
    np.testing.assert_allclose(op.T.solve(rhs), want_t, rtol=1e-11)
    shifted = op.shift_diagonal(2.0).scale(0.5)
    np.testing.assert_allclose(shifted.as_matrix(), 0.5 * (dense + 2 * np.eye(n)), rtol=1e-12)


def _batched(dense, x_moved):
    """`dense` (batch + (N, N)) broadcast against the moved right-hand side's batch."""
    return np.broadcast_to(dense, np.broadcast_shapes(dense.shape[:-2], x_moved.shape[:-1])
                           + dense.shape[-2:])


def test_factorization_gradients_and_jit():
    l, u, n = 2, 2, 9
    ab = jnp.asarray(random_ab(l, u, (n,), np.float64, dominant=True, corners=0))
    b = jnp.asarray(np.random.default_rng(0).standard_normal(n))

    def via_factor(ab, b):
        return jnp.sum(jnp.tanh(tridiax.Banded(ab, (l, u)).factor().solve(b)))

    def via_solve(ab, b):
        return jnp.sum(jnp.tanh(tridiax.solve_banded((l, u), ab, b)))

    for got, want in zip(jax.jit(jax.grad(via_factor, (0, 1)))(ab, b),
                         jax.grad(via_solve, (0, 1))(ab, b), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    pivoting = tridiax.Banded(ab.at[u].set(0.0), (l, u)).factor()
    np.testing.assert_allclose(
        pivoting.solve(b), scipy.linalg.solve_banded((l, u), np.asarray(ab.at[u].set(0.0)), b),
        rtol=1e-9)


@pytest.mark.parametrize("l, u", [(1, 1), (2, 1), (0, 3), (3, 0)])
@pytest.mark.parametrize("pivoting", [True, False])
def test_transposed_solve_every_backend_ignores_corners(l, u, pivoting):
    n = 9  # b_bar = A^{-T} x_bar: the kernels' transposed reading, with NaN outside the matrix
    ab = random_ab(l, u, (2, n), np.float64, seed=4, dominant=True)
    g = np.random.default_rng(5).standard_normal((2, n))
    a = dense_of(np.nan_to_num(ab), l, u)
    expected = np.linalg.solve(np.swapaxes(a, -1, -2), g[..., None])[..., 0]
    for backend in backends(np.float64, op="banded"):
        def f(b, backend=backend):
            return _banded.solve((l, u), ab, b, pivoting=pivoting, backend=backend)

        _, vjp = jax.vjp(f, jnp.zeros((2, n)))
        np.testing.assert_allclose(vjp(jnp.asarray(g))[0], expected, rtol=1e-11,
                                   err_msg=backend)
