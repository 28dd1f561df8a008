"""The native block-tridiagonal kernel (block.cc through `_native.block_pnq`) against dense
float64/complex128 NumPy solves of the assembled matrices, block residuals for many systems,
and the XLA formulation it follows step for step (`_xla_block.solve_pnq`).

Every lower[0] and upper[N-1] here holds NaN (they lie outside the matrix and must never be
read); the references get the clean blocks.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import wide

import tridiax
from tridiax._block import xla as _xla_block
from tridiax._core.planner import cpu_cache_bytes
from tridiax._native import build as _native_build
from tridiax._native import ffi as _native

pytestmark = [
    pytest.mark.cpu_device,
    pytest.mark.skipif(not _native_build.available(), reason="the native CPU kernel is unavailable"),
]

KINDS = ("block", "block_pivoted", "block_hermitian")
# Error allowed against a float64 solve of the same (rounded) inputs, relative to max |x|.
TOL = {
    np.dtype(np.float16): 4e-3,
    np.dtype(jnp.bfloat16): 2e-2,
    np.dtype(np.float32): 1e-5,
    np.dtype(np.complex64): 1e-5,
    np.dtype(np.float64): 1e-13,
    np.dtype(np.complex128): 1e-13,
}
# The cache a tile fits in, as the planner gives it to the kernel (`_core/backend.py`).
CACHE = cpu_cache_bytes()


# ---------------------------------------------------------------------------------------------
# Matrices.


def _draw(rng, shape, complex_):
    x = rng.uniform(-1, 1, shape)
    return x + 1j * rng.uniform(-1, 1, shape) if complex_ else x


def problem(kind, shape, k, m=1, shapes=None, dtype=np.float64, seed=0):
    """lower, diag, upper of `shapes` (default (P, N, Q) each) + (k, k) and b (P, N, Q, k, m)
    of `dtype`, lower[:, 0] and upper[:, N-1] NaN; and the clean blocks in float64/complex128
    (rounded from `dtype`). Every system is strictly diagonally dominant by rows ("block");
    with its blocks' rows reversed, so that each diagonal block needs row interchanges
    ("block_pivoted", k > 1); or Hermitian positive definite ("block_hermitian":
    upper[i] = lower[i+1]^H, so lower and upper share a shape)."""
    P, N, Q = shape
    sl, sd, su = shapes or (shape,) * 3
    rng = np.random.default_rng(seed)
    complex_ = np.issubdtype(np.dtype(dtype), np.complexfloating)
    big = (4 * k + 1) * np.eye(k)  # beats the rest of a row: at most 3k - 1 entries below 1.5
    lower = _draw(rng, (*sl, k, k), complex_)
    diag = _draw(rng, (*sd, k, k), complex_)
    if kind == "block_hermitian":
        assert sl == su, "Hermitian systems take lower and upper of one shape"
        upper = np.conj(np.swapaxes(lower, -1, -2))
        if sl[1] == N:  # upper[i] = lower[i+1]^H
            upper = np.concatenate([upper[:, 1:], upper[:, :1]], axis=1)
        diag = (diag + np.conj(np.swapaxes(diag, -1, -2))) / 2 + big
    else:
        upper = _draw(rng, (*su, k, k), complex_)
        diag = diag + big
        if kind == "block_pivoted":
            lower, diag, upper = (x[..., ::-1, :] for x in (lower, diag, upper))
    blocks = [x.astype(dtype) for x in (lower, diag, upper)]
    clean = [x.astype(wide(dtype)) for x in blocks]  # the rounded matrix is the one solved
    if sl[1] == N:
        blocks[0][:, 0] = np.nan
    if su[1] == N:
        blocks[2][:, N - 1] = np.nan
    b = _draw(rng, (P, N, Q, k, m), complex_).astype(dtype)
    return (*blocks, b), clean


def dense(lower, diag, upper):
    """The (N k, N k) matrix of one system's blocks, each (N, k, k)."""
    N, k = diag.shape[0], diag.shape[1]
    A = np.zeros((N * k, N * k), diag.dtype)
    for i in range(N):
        A[i * k:(i + 1) * k, i * k:(i + 1) * k] = diag[i]
        if i > 0:
            A[i * k:(i + 1) * k, (i - 1) * k:i * k] = lower[i]
        if i < N - 1:
            A[i * k:(i + 1) * k, (i + 1) * k:(i + 2) * k] = upper[i]
    return A


def systems(clean, b_shape):
    """The blocks broadcast to (P, N, Q, k, k) each."""
    return [np.broadcast_to(x, (*b_shape[:3], *x.shape[3:])) for x in clean]


def reference(clean, b, transposed):
    """Every system solved densely in float64/complex128."""
    P, N, Q, k, m = b.shape
    lower, diag, upper = systems(clean, b.shape)
    b = b.astype(wide(b.dtype))
    x = np.zeros_like(b)
    for p in range(P):
        for q in range(Q):
            A = dense(lower[p, :, q], diag[p, :, q], upper[p, :, q])
            rhs = b[p, :, q].reshape(N * k, m)
            x[p, :, q] = np.linalg.solve(A.T if transposed else A, rhs).reshape(N, k, m)
    return x


def residual(clean, b, x, transposed):
    """max |A x - b| (A^T x - b) over every system, blocks multiplied in float64/complex128."""
    lower, diag, upper = systems(clean, b.shape)
    if transposed:
        t = lambda a: np.swapaxes(a, -1, -2)  # noqa: E731
        lower, diag, upper = (np.concatenate([np.zeros_like(upper[:, :1]), t(upper[:, :-1])], 1),
                              t(diag), np.concatenate([t(lower[:, 1:]), np.zeros_like(lower[:, :1])], 1))
    x = x.astype(wide(b.dtype))
    r = diag @ x - b
    r[:, 1:] += lower[:, 1:] @ x[:, :-1]
    r[:, :-1] += upper[:, :-1] @ x[:, 1:]
    return float(np.max(np.abs(r)))


def native(operands, kind, transposed, dtype=None):
    *blocks, b = operands
    out = _native.block_pnq(*map(jnp.asarray, blocks), jnp.asarray(b), kind=kind,
                            transposed=transposed, out_dtype=dtype or b.dtype, cache=CACHE)
    return np.array(out)


def xla(operands, kind, transposed, dtype=None):
    *blocks, b = operands
    out = _xla_block.solve_pnq(*map(jnp.asarray, blocks), jnp.asarray(b), kind=kind,
                               transposed=transposed, out_dtype=dtype or b.dtype)
    return np.asarray(out)


def assert_close(got, want, tol):
    got = np.asarray(got).astype(want.dtype)
    assert np.all(np.isfinite(got)), "non-finite entries"
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    err = float(np.max(np.abs(got - want))) / scale if want.size else 0.0
    assert err <= tol, f"error {err:.3g} > {tol:.3g}"


# ---------------------------------------------------------------------------------------------
# Every block size, length, kind and direction, float64: k 1-4 unrolled at compile time, 8 and
# 16 at run time; lanes along Q (vectors of 8 with a ragged last one) and along P.

SIZES = [(1, 1), (2, 3), (3, 1), (7, 3), (33, 1)]  # (N, m)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", [1, 2, 3, 4, 8, 16])
def test_every_size_against_dense_solves(k, kind, transposed):
    lanes = 11 if k <= 4 else 5  # dense solves of 16 x 33 rows take a while
    for N, m in SIZES:
        for shape in [(2, N, lanes), (lanes, N, 1)]:
            operands, clean = problem(kind, shape, k, m, seed=N + k)
            got = native(operands, kind, transposed)
            assert got.shape == (*shape, k, m)
            assert_close(got, reference(clean, operands[-1], transposed), TOL[np.dtype(np.float64)])


def test_the_checks_can_fail():
    """A wrong solution fails `assert_close` and `residual`; the pivoted matrices need row
    interchanges; the NaN blocks are where they should be."""
    operands, clean = problem("block_pivoted", (2, 7, 3), 3, 2, seed=1)
    want = reference(clean, operands[-1], False)
    with pytest.raises(AssertionError):
        assert_close(want * (1 + 1e-11), want, 1e-13)
    assert residual(clean, operands[-1], want, False) < 1e-13
    assert residual(clean, operands[-1], want * (1 + 1e-7), False) > 1e-9
    diag = clean[1]
    assert np.all(np.abs(diag[..., 0, 0]) < np.abs(diag[..., 2, 0]))  # row 2 must come first
    assert np.isnan(operands[0][:, 0]).all() and np.isnan(operands[2][:, -1]).all()
    assert not np.isnan(operands[0][:, 1:]).any() and not np.isnan(operands[2][:, :-1]).any()


# ---------------------------------------------------------------------------------------------
# The XLA formulation: the same algorithm, so the same numbers to rounding. (Few cases: each
# compiles the formulation anew.)


@pytest.mark.parametrize("kind", KINDS)
def test_matches_the_xla_formulation(kind):
    for k, m, shape, transposed, dtype in [(2, 1, (2, 9, 19), False, np.float32),
                                           (3, 2, (19, 9, 1), True, np.float64)]:
        operands, _ = problem(kind, shape, k, m, dtype=dtype, seed=k)
        got = native(operands, kind, transposed)
        want = xla(operands, kind, transposed)
        tol = 1e-14 if dtype == np.float64 else 1e-6
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.max(np.abs(want)))


def test_pivot_ties_take_the_first_row():
    """Equal magnitudes (first of equals, as LAPACK's getrf and jnp.argmax; |Re| + |Im| for
    complex, which ranks 3 + 4j above 5): the kernel picks the rows the XLA formulation picks.
    Any choice solves the system to rounding, so the real check is bit for bit, in vector lanes
    (16 systems): both run the same operations in the same order, and the other row's
    elimination rounds differently. Complex systems (one lane at a time, std::complex
    arithmetic) agree to rounding."""
    k, N, Q = 3, 4, 16
    for complex_ in (False, True):
        dtype = np.complex128 if complex_ else np.float64
        block = (np.array([[1.0, 2, 0], [-1, 1, 2], [1, -1, 3]]) if not complex_ else
                 np.array([[5.0, 1, 0], [3 + 4j, 2, 1], [5, 1, 4]]))
        diag = np.broadcast_to(block.astype(dtype), (1, N, 1, k, k))
        off = np.broadcast_to((0.1 * np.eye(k)).astype(dtype), (1, N, 1, k, k))
        b = (np.arange(1.0, N * k * Q + 1) / 7).astype(dtype).reshape(N, k, Q, 1)
        b = np.ascontiguousarray(b.transpose(0, 2, 1, 3))[None]
        operands = (off, diag, off, b)
        A = dense(off[0, :, 0], diag[0, :, 0], off[0, :, 0])
        for transposed in (False, True):
            got = native(operands, "block_pivoted", transposed)
            want = xla(operands, "block_pivoted", transposed)
            if complex_:
                np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-14)
            else:
                np.testing.assert_array_equal(got, want)
            rhs = b[0].transpose(0, 2, 1, 3).reshape(N * k, Q)
            solve = np.linalg.solve(A.T if transposed else A, rhs)
            np.testing.assert_allclose(got[0].transpose(0, 2, 1, 3).reshape(N * k, Q), solve,
                                       rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# Layouts and broadcast blocks (a size-1 dimension read in place), float32: the vector lanes
# (16 float32 with AVX-512) with ragged tiles, through 8x8 transposes (k*k a multiple of 8
# along Q, every k along P) or value by value, and the scalar path for a handful of lanes.

LAYOUTS = [(1, 9, 37), (2, 33, 21), (37, 9, 1), (40, 7, 3), (1, 9, 5), (17, 2, 1), (3, 1, 20)]


def _block_shapes(shape):
    P, N, Q = shape
    full = (P, N, Q)
    return [(full, full, full), ((1, N, Q), (P, 1, Q), (P, N, 1)), ((P, 1, 1), full, (1, 1, Q)),
            ((1, 1, 1), (1, 1, 1), (1, 1, 1))]


@pytest.mark.parametrize("shape", LAYOUTS, ids=str)
@pytest.mark.parametrize("k, dtype", [(2, np.float32), (3, np.float32), (4, np.float32),
                                      (8, np.float32), (1, np.float64), (2, np.float64)])
def test_layouts_and_broadcast_blocks(k, dtype, shape):
    # float64: 8 lanes a vector, blocks of 1 and 4 values (and b's 2 and 4) through the permutes.
    m = 1 if k % 2 else 2
    for i, shapes in enumerate(_block_shapes(shape)):
        kind = KINDS[i % 3]
        if kind == "block_hermitian":
            shapes = (shapes[0], shapes[1], shapes[0])
        operands, clean = problem(kind, shape, k, m, shapes, dtype=dtype, seed=i)
        for transposed in (False, True):
            got = native(operands, kind, transposed)
            assert got.shape == (*shape, k, m) and got.dtype == dtype
            assert_close(got, reference(clean, operands[-1], transposed), TOL[np.dtype(dtype)])


def test_many_systems_on_every_core():
    """The benchmark's shapes scaled down (many tiles shared out over the threads), checked
    by their block residuals."""
    for k in (2, 4):
        for shape in [(1, 100, 1001), (1001, 100, 1)]:
            for kind in ("block", "block_pivoted"):
                for transposed in (False, True):
                    operands, clean = problem(kind, shape, k, dtype=np.float32, seed=k)
                    got = native(operands, kind, transposed)
                    assert np.isfinite(got).all()
                    assert residual(clean, operands[-1], got, transposed) < 1e-5 * (4 * k + 1)


# ---------------------------------------------------------------------------------------------
# dtypes: half precision solved in float32 and rounded once; complex one lane at a time.

DTYPES = [np.float16, jnp.bfloat16, np.float32, np.float64, np.complex64, np.complex128]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(3, 7, 19), (21, 7, 1)], ids=str)
@pytest.mark.parametrize("k", [2, 3])
def test_dtypes(k, shape, dtype):
    dtype = np.dtype(dtype)
    for i, kind in enumerate(KINDS):
        operands, clean = problem(kind, shape, k, 1 + i % 2, dtype=dtype, seed=11 + i)
        for transposed in (False, True):
            got = native(operands, kind, transposed)
            assert got.dtype == dtype
            want = reference(clean, operands[-1], transposed)
            assert_close(got.astype(wide(dtype)), want, TOL[dtype])


def test_complex_transpose_is_not_conjugated():
    """A^T x = b, not A^H x = b: a complex non-Hermitian system gives different answers."""
    operands, clean = problem("block", (2, 5, 3), 2, seed=3, dtype=np.complex128)
    got = native(operands, "block", True)
    assert_close(got, reference(clean, operands[-1], True), 1e-13)
    conj = reference([np.conj(x) for x in clean], operands[-1], True)
    assert np.max(np.abs(got - conj)) > 1e-3


# ---------------------------------------------------------------------------------------------
# Semantics: the blocks outside the matrix, pivoting, breakdowns.


@pytest.mark.parametrize("k", [1, 2, 4, 5])
def test_blocks_outside_the_matrix_are_never_read(k):
    """Whatever lower[0] and upper[N-1] hold (NaN, inf, huge), the solution is the same."""
    for shape in [(2, 9, 19), (19, 9, 1), (3, 1, 5)]:
        operands, _ = problem("block", shape, k, 2, seed=k)
        lower, diag, upper, b = operands
        zero = [np.nan_to_num(x, nan=0.0) for x in (lower, upper)]
        for transposed in (False, True):
            want = native((zero[0], diag, zero[1], b), "block", transposed)
            assert np.isfinite(want).all()
            for fill in (np.nan, np.inf, -1e300):
                filled = [np.where(np.isnan(x), fill, x) for x in (lower, upper)]
                got = native((filled[0], diag, filled[1], b), "block", transposed)
                np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("shape", [(2, 17, 19), (19, 17, 1)], ids=str)
def test_small_pivots_need_pivoting(shape, transposed):
    """Diagonal blocks whose diagonal entries are tiny (1e-13) next to the others: partial
    pivoting solves them to rounding, the unpivoted elimination does not."""
    operands, clean = problem("block_pivoted", shape, 2, seed=5)
    lower, diag, upper, b = operands
    diag = diag.copy()
    diag[..., 0, 0] *= 1e-13
    diag[..., 1, 1] *= 1e-13
    clean[1] = diag
    operands = (lower, diag, upper, b)
    want = reference(clean, b, transposed)
    assert_close(native(operands, "block_pivoted", transposed), want, 1e-12)
    plain = native(operands, "block", transposed)
    err = np.max(np.abs(plain - want), initial=0.0, where=np.isfinite(plain)) / np.max(np.abs(want))
    assert not np.isfinite(plain).all() or err > 1e-6


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(3, 9, 19), (21, 9, 1), (2, 9, 3)], ids=str)
@pytest.mark.parametrize("k", [2, 3, 5])
def test_a_singular_block_spoils_its_own_system_alone(k, shape, kind):
    """S = 0 at row 0, or halfway (diag and the blocks coupling it to the row above zero)."""
    P, N, Q = shape
    operands, clean = problem(kind, shape, k, seed=13)
    p, q = P // 2, Q // 2
    others = np.ones((P, Q), bool)
    others[p, q] = False
    for row in (0, N // 2):
        lower, diag, upper = (x.copy() for x in operands[:3])
        diag[p, row, q] = 0
        if row:
            lower[p, row, q] = upper[p, row - 1, q] = 0
        for transposed in (False, True):
            got = native((lower, diag, upper, operands[3]), kind, transposed)
            bad = ~np.isfinite(got)
            assert bad[p, :, q].any()
            got, want = (x.transpose(0, 2, 1, 3, 4)[others]
                         for x in (got, reference(clean, operands[3], transposed)))
            assert_close(got, want, TOL[np.dtype(np.float64)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(3, 9, 19), (21, 9, 1)], ids=str)
@pytest.mark.parametrize("k", [1, 2, 4, 5])
def test_hermitian_indefinite_system_is_all_nan_alone(k, shape, dtype):
    P, N, Q = shape
    operands, clean = problem("block_hermitian", shape, k, dtype=dtype, seed=17)
    p, q = 1, Q // 2
    for row in (0, N // 2):  # a Schur complement with a negative eigenvalue, first or halfway
        diag = operands[1].copy()
        diag[p, row, q, k - 1, k - 1] = -diag[p, row, q, k - 1, k - 1]
        for transposed in (False, True):
            got = native((operands[0], diag, operands[2], operands[3]), "block_hermitian",
                         transposed)
            nan = np.isnan(got)
            assert nan[p, :, q].all() and nan.sum() == nan[p, :, q].size
            want = reference(clean, operands[-1], transposed)
            got[p, :, q] = want[p, :, q]
            assert_close(got, want, 10 * TOL[np.dtype(dtype)])


# ---------------------------------------------------------------------------------------------
# Calls.


def test_under_jit_and_zero_sizes():
    operands, clean = problem("block", (3, 7, 5), 2, 2, seed=23)
    f = jax.jit(lambda *ops: _native.block_pnq(*ops, kind="block", transposed=False,
                                               out_dtype=jnp.float64, cache=CACHE))
    assert_close(f(*operands), reference(clean, operands[-1], False), 1e-13)
    for shape in [(0, 7, 5), (3, 0, 5), (3, 7, 0)]:
        for k, m in [(2, 1), (0, 1), (2, 0)]:
            blocks = np.zeros((*shape, k, k))
            out = native((blocks, blocks, blocks, np.zeros((*shape, k, m))), "block", False)
            assert out.shape == (*shape, k, m)


def test_bad_arguments():
    (lower, diag, upper, b), _ = problem("block", (3, 7, 5), 2, 2)
    with pytest.raises(ValueError, match="kind"):
        native((lower, diag, upper, b), "banded", False)
    with pytest.raises(ValueError, match="diag"):
        native((lower, diag[..., :1, :], upper, b), "block", False)
    with pytest.raises(ValueError, match="upper"):
        native((lower, diag, upper[:, :3], b), "block", False)
    with pytest.raises(ValueError, match="b of shape"):
        native((lower, diag, upper, b[..., 0]), "block", False)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("shared", [False, True])
def test_public_solve_moves_no_data_around_the_kernel(axis, shared):
    # The blocks are viewed as (P, N, Q, k, k) by one reshape: the compiled program is the
    # kernel and bitcasts, with no transpose or copy of an operand (a view vmapped over the
    # block dimensions once cost two copies of each, 1.8x the kernel's time).
    systems = (5, 6, 7)
    n = systems[axis]
    block_shape = tuple(s if i == axis % 3 else 1 for i, s in enumerate(systems)) if shared else systems
    specs = [jax.ShapeDtypeStruct(block_shape + (2, 2), np.float32)] * 3 + [
        jax.ShapeDtypeStruct(systems + (2,), np.float32)]
    assert n > 1
    hlo = jax.jit(lambda *a: tridiax.solve_block_tridiagonal(*a, axis=axis)).trace(
        *specs).lower().compile().as_text()
    ops = re.findall(r"= \S+ (\w[\w-]*)\(", hlo)
    assert "custom-call" in ops, hlo
    assert not {"transpose", "copy", "fusion", "broadcast"} & set(ops), hlo
