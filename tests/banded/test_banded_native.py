"""The native banded kernel (banded.cc through `_native.banded_pnq`) against the XLA
formulation it follows step for step (`_xla_banded.solve_pnq`), scipy.linalg.solve_banded and
dense NumPy solves (transposed systems).

Every ab here holds NaN in the entries outside the matrix (scipy's unused corners), which the
kernel must never read; the independent references get the clean matrices.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from helpers import compile_unoptimized, wide

from tridiax._banded import xla as _xla_banded
from tridiax._native import build as _native_build
from tridiax._native import ffi as _native

pytestmark = [
    pytest.mark.cpu_device,
    pytest.mark.skipif(not _native_build.available(), reason="the native CPU kernel is unavailable"),
]

BANDS = [(0, 0), (1, 1), (2, 2), (3, 1), (0, 3), (2, 0), (8, 8)]
SIZES = [1, 2, 3, 7, 33, 100]
KINDS = ("banded", "banded_pivoted", "banded_hermitian")
# Error allowed against a float64 solve of the same (rounded) inputs, relative to max |x|.
TOL = {
    np.dtype(np.float16): 2e-3,
    np.dtype(jnp.bfloat16): 1e-2,
    np.dtype(np.float32): 5e-5,
    np.dtype(np.complex64): 5e-5,
    np.dtype(np.float64): 1e-12,
    np.dtype(np.complex128): 1e-12,
}


# ---------------------------------------------------------------------------------------------
# Matrices.


def dense(ab, l, u):
    """The matrix of one system's bands, ab (l + u + 1, n) in scipy's layout."""
    n = ab.shape[1]
    i, j = np.indices((n, n))
    k = u + i - j
    inside = (k >= 0) & (k <= l + u)
    A = np.zeros((n, n), ab.dtype)
    A[inside] = ab[k[inside], j[inside]]
    return A


def bands(A, l, u):
    """scipy's layout of a band matrix: ab[u + i - j, j] = A[i, j], NaN outside the matrix."""
    n = A.shape[0]
    k, j = np.indices((l + u + 1, n))
    i = k + j - u
    inside = (i >= 0) & (i < n)
    ab = np.full((l + u + 1, n), np.nan, A.dtype)
    ab[inside] = A[i[inside], j[inside]]
    return ab


def _draw(rng, shape, complex_):
    x = rng.standard_normal(shape)
    return x + 1j * rng.standard_normal(shape) if complex_ else x


def _mask(n, lo, up):
    i, j = np.indices((n, n))
    return (j - i <= up) & (i - j <= lo)


def system(rng, n, l, u, kind, complex_):
    """One n x n band matrix (l, u) for `kind`, in float64/complex128: diagonally dominant
    ("banded"), Hermitian positive definite ("banded_hermitian", l == u), or a dominant matrix
    of bandwidths (l - 1, u - 1) with pairs of rows swapped, so that partial pivoting has rows
    to interchange ("banded_pivoted", where l, u >= 1; a dominant one otherwise)."""
    if kind == "banded_hermitian":
        A = _draw(rng, (n, n), complex_) * _mask(n, l, u)
        A = (A + A.conj().T) / 2
        np.fill_diagonal(A, 1 + np.abs(A).sum(axis=1) - np.abs(np.diag(A)).real)
        return A
    swap = kind == "banded_pivoted" and l >= 1 and u >= 1
    lo, up = (l - 1, u - 1) if swap else (l, u)
    A = _draw(rng, (n, n), complex_) * _mask(n, lo, up)
    phase = _draw(rng, n, complex_)
    phase /= np.abs(phase)
    np.fill_diagonal(A, (1 + np.abs(A).sum(axis=1)) * phase)
    if swap:
        for k in range(0, n - 1, 2):
            if rng.random() < 0.7:
                A[[k, k + 1]] = A[[k + 1, k]]
    return A


def constant_system(rng, l, u, kind, complex_):
    """The bands of a matrix constant along its diagonals, (l + u + 1,): dominant, or Hermitian
    positive definite."""
    ab = _draw(rng, l + u + 1, complex_)
    if kind == "banded_hermitian":
        ab[u + 1:] = ab[:u][::-1].conj()
        ab[u] = 1 + 2 * np.abs(ab[:u]).sum()
    else:
        ab[u] = (1 + np.abs(np.delete(ab, u)).sum()) * (ab[u] / np.abs(ab[u]))
    return ab


def problem(l, u, kind, shape, ab_shape=None, dtype=np.float64, seed=0):
    """ab (l + u + 1, Pa, Na, Qa) of `dtype` with NaN corners, b (P, N, Q) of `dtype`, and the
    clean bands in float64/complex128 (rounded from `dtype`)."""
    P, N, Q = shape
    Pa, Na, Qa = ab_shape or shape
    rng = np.random.default_rng(seed)
    complex_ = np.issubdtype(np.dtype(dtype), np.complexfloating)
    clean = np.zeros((l + u + 1, Pa, Na, Qa), wide(dtype))
    for p in range(Pa):
        for q in range(Qa):
            if Na == 1:
                clean[:, p, 0, q] = constant_system(rng, l, u, kind, complex_)
            else:
                clean[:, p, :, q] = np.nan_to_num(bands(system(rng, N, l, u, kind, complex_), l, u))
    ab = clean.astype(dtype)
    clean = ab.astype(wide(dtype))  # the rounded matrix is the one solved
    if Na == N:  # the unused corners: ab[k, j] holds row k + j - u, outside the matrix
        k, j = np.indices((l + u + 1, N))
        outside = (k + j - u < 0) | (k + j - u >= N)
        ab[k[outside], :, j[outside], :] = np.nan
    b = _draw(rng, (P, N, Q), complex_).astype(dtype)
    return ab, b, clean


def system_bands(clean, p, q, N):
    """The (l + u + 1, N) bands of system (p, q), broadcast from ab's shape."""
    _, Pa, Na, Qa = clean.shape
    one = clean[:, 0 if Pa == 1 else p, :, 0 if Qa == 1 else q]
    return np.broadcast_to(one, (clean.shape[0], N)) if Na == 1 else one


def reference(clean, b, l, u, transposed):
    """Every system solved in float64/complex128 by scipy (A x = b) or NumPy (A^T x = b)."""
    P, N, Q = b.shape
    b = b.astype(wide(b.dtype))
    x = np.zeros_like(b)
    for p in range(P):
        for q in range(Q):
            ab = np.array(system_bands(clean, p, q, N))
            if transposed:
                x[p, :, q] = np.linalg.solve(dense(ab, l, u).T, b[p, :, q])
            else:
                x[p, :, q] = scipy.linalg.solve_banded((l, u), ab, b[p, :, q])
    return x


def native(ab, b, l, u, kind, transposed, dtype=None):
    out = _native.banded_pnq(jnp.asarray(ab), jnp.asarray(b), l=l, u=u, kind=kind,
                             transposed=transposed, out_dtype=dtype or b.dtype)
    return np.array(out)


@functools.cache
def _xla_solver(l, u, kind, transposed, dtype, shapes):
    """The XLA formulation compiled once per options and shapes, unoptimized (eagerly, its
    loops compile at every call; optimized, a wide band takes seconds)."""
    fn = functools.partial(_xla_banded.solve_pnq, l=l, u=u, kind=kind, transposed=transposed,
                           out_dtype=dtype)
    return compile_unoptimized(fn, *(jax.ShapeDtypeStruct(*spec) for spec in shapes))


def xla(ab, b, l, u, kind, transposed, dtype=None):
    args = (jnp.asarray(ab), jnp.asarray(b))
    shapes = tuple((a.shape, a.dtype) for a in args)
    solver = _xla_solver(l, u, kind, transposed, np.dtype(dtype or b.dtype), shapes)
    return np.asarray(solver(*args))


def assert_close(got, want, tol):
    got = np.asarray(got).astype(want.dtype)
    assert np.all(np.isfinite(got)), "non-finite entries"
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    err = float(np.max(np.abs(got - want))) / scale if want.size else 0.0
    assert err <= tol, f"error {err:.3g} > {tol:.3g}"


def kinds_for(l, u):
    return [k for k in KINDS if k != "banded_hermitian" or l == u]


# Every (l, u, kind) with a matrix of that kind: Hermitian matrices have l == u.
BAND_KINDS = [(l, u, k) for l, u in BANDS for k in kinds_for(l, u)]


# ---------------------------------------------------------------------------------------------
# Every bandwidth, size, kind and direction, float64.


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("l, u, kind", BAND_KINDS)
def test_every_size_against_scipy_and_numpy(l, u, kind, transposed):
    for N in SIZES:
        for shape in [(2, N, 19), (19, N, 1)]:
            ab, b, clean = problem(l, u, kind, shape, seed=N)
            got = native(ab, b, l, u, kind, transposed)
            assert_close(got, reference(clean, b, l, u, transposed), 1e-12)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("l, u, kind", BAND_KINDS)
def test_matches_the_xla_formulation(l, u, kind, transposed):
    for N in (2, 7, 33):
        ab, b, _ = problem(l, u, kind, (3, N, 11), seed=N + 1)
        got = native(ab, b, l, u, kind, transposed)
        want = xla(ab, b, l, u, kind, transposed)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13 * np.max(np.abs(want)))


def test_the_checks_can_fail():
    """A wrong solution fails `assert_close`; the pivoted test matrices need interchanges; a
    matrix with zeros on its diagonal breaks the unpivoted kinds down, not the pivoted one."""
    ab, b, clean = problem(2, 2, "banded_pivoted", (2, 33, 19), seed=3)
    want = reference(clean, b, 2, 2, False)
    with pytest.raises(AssertionError):
        assert_close(want * (1 + 1e-9), want, 1e-12)
    A = dense(clean[:, 0, :, 0], 2, 2)
    assert np.sum(np.abs(np.diag(A, -1)) > np.abs(np.diag(A))[:-1]) >= 5  # rows to interchange
    N = 8  # the path graph's adjacency matrix: nonsingular for even N, zero diagonal
    A = np.eye(N, k=1) + np.eye(N, k=-1)
    ab, b = bands(A, 1, 1)[:, None, :, None], np.ones((1, N, 1))
    for transposed in (False, True):
        assert not np.isfinite(native(ab, b, 1, 1, "banded", transposed)).all()
        got = native(ab, b, 1, 1, "banded_pivoted", transposed)
        np.testing.assert_allclose(got[0, :, 0], np.linalg.solve(A, b[0, :, 0]), atol=1e-14)


# ---------------------------------------------------------------------------------------------
# Layouts: contiguous lanes (Q > 1) and batch-first systems (Q == 1), sizes that are not whole
# vectors, few lanes, and ab broadcast along P, N or Q (read in place, never copied).

LAYOUTS = [(1, 100, 37), (2, 33, 21), (3, 7, 50), (37, 33, 1), (5, 100, 1), (40, 7, 3),
           (1, 9, 5), (1, 33, 1), (1, 7, 2), (2, 1, 17), (17, 2, 1)]


def _ab_shapes(shape):
    P, N, Q = shape
    return sorted({(P, N, Q), (1, N, Q), (P, N, 1), (P, 1, Q), (1, N, 1), (1, 1, 1)})


@pytest.mark.parametrize("shape", LAYOUTS, ids=str)
@pytest.mark.parametrize("l, u", [(1, 1), (2, 2), (3, 1), (8, 8)])
def test_layouts_and_broadcast_bands(l, u, shape, dtype=np.float32):
    for kind in kinds_for(l, u):
        for transposed in (False, True):
            for seed, ab_shape in enumerate(_ab_shapes(shape)):
                ab, b, clean = problem(l, u, kind, shape, ab_shape, dtype=dtype, seed=seed)
                got = native(ab, b, l, u, kind, transposed)
                assert got.shape == shape and got.dtype == np.dtype(dtype)
                assert_close(got, reference(clean, b, l, u, transposed), 10 * TOL[np.dtype(dtype)])


@pytest.mark.parametrize("shape", [(2, 33, 21), (37, 33, 1), (40, 7, 3)], ids=str)
@pytest.mark.parametrize("l, u", [(2, 2), (3, 1)])
def test_broadcast_bands_match_the_xla_formulation(l, u, shape):
    P, N, Q = shape
    for kind in kinds_for(l, u):
        for ab_shape in [(1, N, Q), (P, N, 1), (P, 1, Q)]:
            ab, b, _ = problem(l, u, kind, shape, ab_shape, dtype=np.float32, seed=5)
            got = native(ab, b, l, u, kind, True)
            want = xla(ab, b, l, u, kind, True)
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.max(np.abs(want)))


def test_many_systems_on_every_core():
    """The benchmark's shapes scaled down: pentadiagonal float32 systems along axis 0 of (N, B)
    and batch first, many tiles shared out over the threads."""
    for shape in [(1, 100, 1001), (1001, 100, 1)]:
        for kind in ("banded", "banded_pivoted"):
            ab, b, _ = problem(2, 2, kind, shape, (1, 100, shape[2]) if shape[2] > 1 else None,
                               dtype=np.float32, seed=7)
            got = native(ab, b, 2, 2, kind, False)
            want = xla(ab, b, 2, 2, kind, False)
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.max(np.abs(want)))


# ---------------------------------------------------------------------------------------------
# dtypes.

DTYPES = [np.float16, jnp.bfloat16, np.float32, np.float64, np.complex64, np.complex128]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(3, 33, 19), (21, 33, 1)], ids=str)
@pytest.mark.parametrize("l, u", [(1, 1), (2, 2), (3, 1), (8, 8)])
def test_dtypes(l, u, shape, dtype):
    dtype = np.dtype(dtype)
    for kind in kinds_for(l, u):
        for transposed in (False, True):
            ab, b, clean = problem(l, u, kind, shape, dtype=dtype, seed=11)
            got = native(ab, b, l, u, kind, transposed)
            assert got.dtype == dtype
            want = reference(clean, b, l, u, transposed)
            assert_close(got.astype(wide(dtype)), want, TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float16, np.complex64, np.complex128], ids=lambda d: np.dtype(d).name)
def test_dtypes_match_the_xla_formulation(dtype):
    for kind in KINDS:
        ab, b, _ = problem(2, 2, kind, (2, 33, 7), dtype=dtype, seed=13)
        got = native(ab, b, 2, 2, kind, False)
        want = xla(ab, b, 2, 2, kind, False)
        tol = 1e-3 if dtype == np.float16 else 2e-5 if dtype == np.complex64 else 1e-13
        np.testing.assert_allclose(got.astype(np.complex128), want.astype(np.complex128),
                                   rtol=tol, atol=tol * np.max(np.abs(want.astype(np.complex128))))


# ---------------------------------------------------------------------------------------------
# Semantics: breakdowns of the Hermitian kind, the pivot choice, the unused corners.


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(3, 33, 19), (21, 33, 1)], ids=str)
@pytest.mark.parametrize("l", [0, 1, 2, 8])
def test_hermitian_indefinite_system_is_all_nan_alone(l, shape, dtype):
    P, N, Q = shape
    ab, b, clean = problem(l, l, "banded_hermitian", shape, dtype=dtype, seed=17)
    p, q = 1, Q // 2
    for row in (0, N // 2):  # the first pivot, or one halfway, not positive
        bad = ab.copy()
        bad[l, p, row, q] = -bad[l, p, row, q]
        for transposed in (False, True):
            got = native(bad, b, l, l, "banded_hermitian", transposed)
            nan = np.isnan(got)
            if l == 0:  # a diagonal matrix: that row alone
                assert nan[p, row, q] and nan.sum() == 1
            else:
                assert nan[p, :, q].all() and nan.sum() == N
            want = reference(clean, b, l, l, transposed)
            got[p, :, q] = want[p, :, q]
            assert_close(got, want, 10 * TOL[np.dtype(dtype)])
            want = xla(bad, b, l, l, "banded_hermitian", transposed)
            np.testing.assert_array_equal(nan, np.isnan(want))


@pytest.mark.parametrize("l, u", BANDS)
def test_corners_are_never_read(l, u):
    """Whatever the unused corners of ab hold (NaN, inf, huge), the solution is the same."""
    for kind in kinds_for(l, u):
        for shape in [(2, 9, 19), (19, 9, 1)]:
            ab, b, _ = problem(l, u, kind, shape, seed=19)
            corners = np.isnan(ab)
            zero = native(np.where(corners, 0, ab), b, l, u, kind, False)
            for fill in (np.nan, np.inf, -1e300):
                for transposed in (False, True):
                    got = native(np.where(corners, fill, ab), b, l, u, kind, transposed)
                    want = native(np.where(corners, 0, ab), b, l, u, kind, transposed)
                    np.testing.assert_array_equal(got, want)
            assert np.isfinite(zero).all()


def test_pivot_ties_take_the_first_row():
    """Equal magnitudes (first of equals, as LAPACK's gbtrf and jnp.argmax): the kernel picks
    the same rows as the XLA formulation and as LAPACK (whose |Re| + |Im| ranks 3 + 4j above 5)."""
    N = 6
    for complex_ in (False, True):
        A = np.zeros((N, N), np.complex128 if complex_ else np.float64)
        for i in range(N):
            A[i, i] = 1.0
            if i + 1 < N:
                A[i + 1, i] = -1.0 if not complex_ else 3 + 4j  # ties |1| with -1; 7 > 5
                A[i, i + 1] = 2.0
            if i + 2 < N:
                A[i + 2, i] = 1.0 if not complex_ else 5.0
        if complex_:
            np.fill_diagonal(A, 5.0)
        ab = bands(A, 2, 1)[:, None, :, None]
        b = np.arange(1.0, N + 1).astype(A.dtype)[None, :, None]
        for transposed in (False, True):
            got = native(ab, b, 2, 1, "banded_pivoted", transposed)
            want = xla(ab, b, 2, 1, "banded_pivoted", transposed)
            np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-14)
            solve = np.linalg.solve(A.T if transposed else A, b[0, :, 0])
            np.testing.assert_allclose(got[0, :, 0], solve, rtol=1e-12)


def test_under_jit_and_zero_sizes():
    ab, b, clean = problem(2, 2, "banded", (3, 7, 5), seed=23)
    f = jax.jit(lambda ab, b: _native.banded_pnq(ab, b, l=2, u=2, kind="banded", transposed=False,
                                                 out_dtype=jnp.float64))
    assert_close(f(ab, b), reference(clean, b, 2, 2, False), 1e-12)
    for shape in [(0, 7, 5), (3, 0, 5), (3, 7, 0)]:
        ab0 = np.zeros((5, *shape))
        assert native(ab0, np.zeros(shape), 2, 2, "banded", False).shape == shape


def test_bad_arguments():
    ab, b, _ = problem(2, 2, "banded", (3, 7, 5))
    with pytest.raises(ValueError, match="kind"):
        native(ab, b, 2, 2, "tridiagonal", False)
    with pytest.raises(ValueError, match="bands"):
        native(ab, b, 1, 2, "banded", False)
    with pytest.raises(ValueError, match="bands"):
        native(ab[:, :, :3], b, 2, 2, "banded", False)
