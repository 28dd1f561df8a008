"""The contract every block-tridiagonal solve kernel keeps, and the tests of it that each
backend runs.

A kernel solves A x = b (A^T x = b when `transposed`, the plain transpose, also for complex)
for every system along axis 1 of b (P, N, Q, k, m), block row i reading
lower[i] x[i-1] + diag[i] x[i] + upper[i] x[i+1], the blocks (P|1, N|1, Q|1, k, k) (a size-1
axis is broadcast). `kind`: "block" (no row interchanges), "block_pivoted" (partial pivoting
inside each diagonal block; of equal magnitudes |Re| + |Im| the first row, as LAPACK's getrf)
or "block_hermitian" (no interchanges; a Schur complement that is not positive definite makes
its own system NaN, and no other; it is bound with upper[i] = lower[i+1]^H, as
`solveh_block_tridiagonal` forms it, which a kernel may read from lower instead). A singular
block spoils its own system alone. lower[0] and
upper[N-1] lie outside the matrix and are never read, whatever they hold. float16 and bfloat16
are solved in float32 and rounded once.

`BlockKernelContract` holds the tests of that contract. Each backend's module subclasses it
with the hook `solve` and the cases it can afford (the class attributes that
`pytest_generate_tests` reads): the native C++ kernel (test_block_native.py), the XLA
formulation (test_block_xla.py) and the Pallas kernel in interpret mode (test_block_pallas.py).

Every problem comes from one generator (`problem`): block diagonally dominant matrices of each
kind, with NaN in lower[0] and upper[N-1]. The references are LAPACK solves of the assembled
matrices (scipy.linalg.solve_banded: the band of an assembled matrix is 4k - 1 wide) and block
residuals, and, for the kernels that follow it step for step,
the XLA formulation (`xla_solve`). One tolerance (`assert_close`): in every system, the error
relative to that system's largest |x| is at most the output dtype's eps (the final rounding)
plus FACTOR eps of the dtype solved in times the condition number of the matrix solved in the
max norm (the forward error of a backward stable solve).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import scipy.linalg.lapack
from helpers import KernelContract, assert_within_condition, cases, compile_unoptimized, program_cache, wide

from tridiax._block import xla as _xla_block

KINDS = ("block", "block_pivoted", "block_hermitian")
# k 1-4 unrolled at compile time by the native kernel, 5, 8 and 16 at run time.
BLOCK_SIZES = [1, 2, 3, 4, 5, 8, 16]
SIZES = [(1, 1), (2, 3), (3, 1), (7, 3), (33, 1)]  # (N, m)
ALL_DTYPES = [np.float16, jnp.bfloat16, np.float32, np.float64, np.complex64, np.complex128]
# Vector lanes along Q with a ragged last vector, systems along P, a handful of lanes, one row.
LAYOUT_SHAPES = [(1, 9, 37), (2, 33, 21), (37, 9, 1), (40, 7, 3), (1, 9, 5), (17, 2, 1), (3, 1, 20)]
# Which of P, N, Q lower, diag and upper vary along ("1" where they are broadcast), and the kind
# solved with them (a Hermitian matrix has lower and upper of one shape).
EVERY_BROADCAST = [("block", ("PNQ", "PNQ", "PNQ")), ("block_pivoted", ("1NQ", "P1Q", "PN1")),
                   ("block_hermitian", ("P11", "PNQ", "P11")), ("block", ("111", "111", "111"))]

# Errors in units of eps * cond (`assert_close`).
FACTOR = 20


# ---------------------------------------------------------------------------------------------
# Matrices.


def _draw(rng, shape, complex_):
    x = rng.uniform(-1, 1, shape)
    return x + 1j * rng.uniform(-1, 1, shape) if complex_ else x


def block_shape(pattern, shape):
    """The (P, N, Q) axes of an operand for a pattern of EVERY_BROADCAST ("1NQ": broadcast
    along P)."""
    return tuple(1 if c == "1" else s for c, s in zip(pattern, shape, strict=True))


def problem(kind, shape, k, m=1, broadcast=None, dtype=np.float64, seed=0):
    """(lower, diag, upper, b) and the clean blocks [lower, diag, upper] in float64/complex128
    (rounded from `dtype`: the matrix solved). lower, diag, upper are (P|1, N|1, Q|1, k, k) of
    `dtype` as `broadcast` (three patterns, default "PNQ") gives them, with NaN in lower[:, 0]
    and upper[:, N-1] (where the operand is not broadcast along N); b is (P, N, Q, k, m).

    Every system is strictly block diagonally dominant by rows ("block"); with each block's
    rows reversed, so that the diagonal blocks need row interchanges ("block_pivoted", k > 1);
    or Hermitian positive definite ("block_hermitian": upper[i] = lower[i+1]^H)."""
    P, N, Q = shape
    sl, sd, su = (block_shape(c, shape) for c in (broadcast or ("PNQ",) * 3))
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
    clean = [x.astype(wide(dtype)) for x in blocks]
    if sl[1] == N > 0:
        blocks[0][:, 0] = np.nan
    if su[1] == N > 0:
        blocks[2][:, N - 1] = np.nan
    b = _draw(rng, (P, N, Q, k, m), complex_).astype(dtype)
    return (*blocks, b), clean


def dense(lower, diag, upper, N):
    """(P, Q, N k, N k) matrices of blocks (P|1, N|1, Q|1, k, k), lower[0] and upper[N-1]
    left out."""
    P, _, Q, k, _ = np.broadcast_shapes(lower.shape, diag.shape, upper.shape)
    a = np.zeros((P, Q, N * k, N * k), np.result_type(lower, diag, upper))

    def at(x, i):  # block i of every system, (P, Q, k, k)
        return np.broadcast_to(x[:, min(i, x.shape[1] - 1)], (P, Q, k, k))

    for i in range(N):
        rows = slice(i * k, (i + 1) * k)
        a[:, :, rows, rows] = at(diag, i)
        if i > 0:
            a[:, :, rows, (i - 1) * k:i * k] = at(lower, i)
        if i < N - 1:
            a[:, :, rows, (i + 1) * k:(i + 2) * k] = at(upper, i)
    return a


# ---------------------------------------------------------------------------------------------
# References and the tolerance.


def _banded_systems(clean, N, transposed):
    """The assembled matrices (of A^T when `transposed`) of every distinct system, (P|1, Q|1)
    of them, in scipy's band layout with both bandwidths 2k - 1: (P|1, Q|1, 4k - 1, N k)."""
    a = dense(*clean, N)
    if transposed:
        a = np.swapaxes(a, -1, -2)
    k = clean[1].shape[-1]
    w, n = 2 * k - 1, a.shape[-1]
    kk, j = np.indices((2 * w + 1, n))
    i = kk + j - w
    inside = (i >= 0) & (i < n)
    ab = np.zeros(a.shape[:2] + (2 * w + 1, n), a.dtype)
    ab[..., inside] = a[..., i[inside], j[inside]]
    return ab, w


def reference(clean, b, transposed):
    """Every system solved in float64/complex128 by scipy.linalg.solve_banded (LAPACK gbsv)
    on its assembled matrix, (P, N, Q, k, m). (Dense LAPACK calls on many small matrices run
    slowly next to XLA's threads; the band of an assembled matrix is 4k - 1 wide.)"""
    P, N, Q, k, m = b.shape
    b = b.astype(wide(b.dtype))
    x = np.zeros(b.shape, np.result_type(*clean, b))
    if not b.size:
        return x
    ab, w = _banded_systems(clean, N, transposed)
    for p in range(P):
        for q in range(Q):
            system = ab[min(p, ab.shape[0] - 1), min(q, ab.shape[1] - 1)]
            x[p, :, q] = scipy.linalg.solve_banded((w, w), system, b[p, :, q].reshape(N * k, m)
                                                   ).reshape(N, k, m)
    return x


def condition(clean, b_shape, transposed=False):
    """cond_inf of every system's A (of A^T when `transposed`: cond_1(A)), (P, Q), as LAPACK
    estimates it (gbcon, within a small factor of the true one); once per matrix where the
    blocks are broadcast."""
    P, N, Q, k, m = b_shape
    if not N * k or not P * Q:
        return np.ones((P, Q))
    ab, w = _banded_systems(clean, N, False)
    norm = "1" if transposed else "I"
    cond = np.ones(ab.shape[:2])
    for p in range(cond.shape[0]):
        for q in range(cond.shape[1]):
            gbtrf, gbcon = scipy.linalg.lapack.get_lapack_funcs(("gbtrf", "gbcon"), (ab[p, q],))
            lu, pivots, info = gbtrf(np.concatenate([np.zeros_like(ab[p, q, :w]), ab[p, q]]), w, w)
            assert info == 0, "a singular matrix"
            a_norm = np.linalg.norm(dense_band(ab[p, q], w), 1 if transposed else np.inf)
            rcond, info = gbcon(w, w, lu, pivots, a_norm, norm=norm)
            cond[p, q] = 1 / rcond
    return np.broadcast_to(cond, (P, Q))


def dense_band(ab, w):
    """The (n, n) matrix of bands ab (2w + 1, n) in scipy's layout."""
    n = ab.shape[1]
    i, j = np.indices((n, n))
    kk = w + i - j
    inside = (kk >= 0) & (kk <= 2 * w)
    a = np.zeros((n, n), ab.dtype)
    a[inside] = ab[kk[inside], j[inside]]
    return a


def residual(clean, b, x, transposed):
    """max |A x - b| (A^T x - b) over every system, blocks multiplied in float64/complex128."""
    lower, diag, upper = (np.broadcast_to(c, (*b.shape[:3], *c.shape[3:])) for c in clean)
    if transposed:
        t = lambda a: np.swapaxes(a, -1, -2)  # noqa: E731
        lower, diag, upper = (np.concatenate([np.zeros_like(upper[:, :1]), t(upper[:, :-1])], 1),
                              t(diag), np.concatenate([t(lower[:, 1:]), np.zeros_like(lower[:, :1])], 1))
    x = x.astype(wide(b.dtype))
    r = diag @ x - b
    r[:, 1:] += lower[:, 1:] @ x[:, :-1]
    r[:, :-1] += upper[:, :-1] @ x[:, 1:]
    return float(np.max(np.abs(r)))


def assert_close(got, want, dtype, cond):
    """In every system (P, :, Q): max |got - want| <= (eps + FACTOR eps_work cond) max |want|,
    eps of `dtype`, eps_work of the dtype solved in, cond (P, Q) of each system."""
    assert_within_condition(got, want, dtype, cond, axes=(1, 3, 4), factor=FACTOR)


def check(got, clean, b, transposed, dtype=None):
    """`got` against dense solves of the clean matrices."""
    assert_close(got, reference(clean, b, transposed), dtype or b.dtype,
                 condition(clean, b.shape, transposed))


@functools.cache
def compiled(solve_pnq, **fixed):
    """A kernel `solve_pnq(lower, diag, upper, b, *, kind, transposed, out_dtype, **fixed)` as
    the contract's `solve` hook: compiled once per shapes and options at XLA's optimization
    level 0 without its fusion emitters (a fraction of the compile time, which dominates these
    tests), its answer a writable NumPy array. Further (hashable) keyword options pass on to
    the kernel (a Pallas tile)."""

    @program_cache
    def program(specs, options):
        fn = functools.partial(solve_pnq, **fixed, **dict(options))
        return compile_unoptimized(fn, *(jax.ShapeDtypeStruct(*spec) for spec in specs),
                                   xla_cpu_use_fusion_emitters=False)

    def solve(lower, diag, upper, b, *, kind, transposed, out_dtype=None, **extra):
        args = tuple(jnp.asarray(x) for x in (lower, diag, upper, b))
        options = dict(kind=kind, transposed=transposed,
                       out_dtype=np.dtype(out_dtype or b.dtype), **extra)
        program_ = program(tuple((a.shape, a.dtype) for a in args), tuple(options.items()))
        return np.array(program_(*args))

    return solve


def _xla_program(specs, options, optimized):
    fn = functools.partial(_xla_block.solve_pnq, **dict(options))
    specs = [jax.ShapeDtypeStruct(*spec) for spec in specs]
    if optimized:
        return jax.jit(fn).lower(*specs).compile()
    return compile_unoptimized(fn, *specs, xla_cpu_use_fusion_emitters=False)


def xla_solve(lower, diag, upper, b, *, kind, transposed, out_dtype=None, optimized=False):
    """The XLA formulation (`_xla_block.solve_pnq`), compiled once per shapes and options at
    XLA's optimization level 0 without its fusion emitters (a fraction of the compile time),
    or, `optimized`, as XLA compiles it by default (operations fused, and rounded, as the
    native kernel rounds them)."""
    args = tuple(jnp.asarray(x) for x in (lower, diag, upper, b))
    options = dict(kind=kind, transposed=transposed, out_dtype=np.dtype(out_dtype or b.dtype))
    program = _xla_program(tuple((a.shape, a.dtype) for a in args), tuple(options.items()),
                           optimized)
    return np.array(program(*args))


# ---------------------------------------------------------------------------------------------
# The contract.


def _lanes(k):
    return 11 if k <= 4 else 5  # dense solves of 16 x 33 block rows take a while


class BlockKernelContract(KernelContract):
    """The tests every block-tridiagonal kernel passes. A subclass gives `solve` and may narrow
    the cases (a slow backend) or drop a test by setting it to None (the XLA formulation is not
    compared with itself)."""

    # Whether the backend follows the XLA formulation step for step (compared with it), and
    # runs its operations in the same order (real pivot ties compared bit for bit).
    TWIN = True
    BITWISE_TWIN = True
    # The dtype of the tests that name none, and the complex one of those that need one.
    DTYPE = np.float64
    COMPLEX = np.complex128

    # (k, n, m, dtype, kind, transposed), each solved for batch(k, n) shapes (P, N, Q) of b.
    SYSTEMS = [(k, n, m, np.float64, kind, t) for k in BLOCK_SIZES for n, m in SIZES
               for kind in KINDS for t in (False, True)]
    # The same, against the XLA formulation, for twin_batch(k, n).
    TWIN_SYSTEMS = [(2, 9, 1, np.float32, kind, False) for kind in KINDS] + [
        (3, 9, 2, np.float64, kind, True) for kind in KINDS]
    # (k, m, dtype, shape, kind, broadcast): b (*shape, k, m), the blocks as `broadcast` gives;
    # compared with the XLA formulation too where TWIN_LAYOUTS.
    TWIN_LAYOUTS = False
    LAYOUTS = [(k, 1 if k % 2 else 2, dtype, shape, kind, broadcast)
               for k, dtype in [(2, np.float32), (3, np.float32), (4, np.float32), (8, np.float32),
                                (1, np.float64), (2, np.float64)]
               for shape in LAYOUT_SHAPES for kind, broadcast in EVERY_BROADCAST]
    # (k, shape, dtype): every kind, both orientations.
    DTYPES = [(k, shape, dtype) for k in (2, 3) for shape in [(3, 7, 19), (21, 7, 1)]
              for dtype in ALL_DTYPES]
    # (k, shape, transposed): tiny and zero pivots.
    PIVOTING = [(2, shape, t) for shape in [(2, 17, 19), (19, 17, 1)] for t in (False, True)]
    # (k, shape, kind): a singular block.
    SINGULAR = [(k, shape, kind) for k in (2, 3, 5) for shape in [(3, 9, 19), (21, 9, 1), (2, 9, 3)]
                for kind in KINDS]
    # (k, shape, dtype): a Hermitian matrix made indefinite.
    INDEFINITE = [(k, shape, dtype) for k in (1, 2, 4, 5) for shape in [(3, 9, 19), (21, 9, 1)]
                  for dtype in (np.float32, np.float64, np.complex128)]
    # (shape, k, m): b (*shape, k, m) with no entries.
    ZERO_SIZES = [(shape, k, m) for shape in [(0, 7, 5), (3, 0, 5), (3, 7, 0)]
                  for k, m in [(2, 1), (0, 1), (2, 0)]]

    def solve(self, lower, diag, upper, b, *, kind, transposed, out_dtype=None) -> np.ndarray:
        """x (P, N, Q, k, m) of `out_dtype` (default b's), a writable NumPy array."""
        raise NotImplementedError

    def batch(self, k, n):
        """The shapes (P, N, Q) of b each SYSTEMS case solves."""
        return [(2, n, _lanes(k)), (_lanes(k), n, 1)]

    def twin_batch(self, k, n):
        """The shapes (P, N, Q) of b each TWIN_SYSTEMS case solves."""
        return [(2, n, 19), (19, n, 1)]

    def twin(self, *operands, **options):
        return xla_solve(*operands, **options)

    # --- the checks themselves ----------------------------------------------------------------

    def test_the_checks_can_fail(self):
        """This backend's answer passes; perturbed by 10^6 eps (2e-10 in float64), or the answer
        of A^T instead of A, it fails, and so does its residual. The pivoted matrices need row
        interchanges; the blocks outside the matrix hold NaN."""
        eps = np.finfo(self.DTYPE).eps
        operands, clean = problem("block_pivoted", (2, 7, 3), 3, 2, dtype=self.DTYPE, seed=1)
        b = operands[-1]
        want, cond = reference(clean, b, False), condition(clean, b.shape)
        got = self.solve(*operands, kind="block_pivoted", transposed=False)
        assert_close(got, want, b.dtype, cond)
        with pytest.raises(AssertionError):
            assert_close(got * (1 + 1e6 * eps), want, b.dtype, cond)
        with pytest.raises(AssertionError):
            assert_close(self.solve(*operands, kind="block_pivoted", transposed=True), want,
                         b.dtype, cond)
        assert residual(clean, b, got, False) < 500 * eps
        assert residual(clean, b, got * (1 + 10 * np.sqrt(eps)), False) > np.sqrt(eps) / 10
        diag = clean[1]
        assert np.all(np.abs(diag[..., 0, 0]) < np.abs(diag[..., 2, 0]))  # row 2 must come first
        assert np.isnan(operands[0][:, 0]).all() and np.isnan(operands[2][:, -1]).all()
        assert not np.isnan(operands[0][:, 1:]).any() and not np.isnan(operands[2][:, :-1]).any()

    @cases("k, n, m, dtype, kind, transposed", "SYSTEMS")
    def test_every_system_against_dense_solves(self, k, n, m, dtype, kind, transposed):
        """Against dense solves; whatever lower[0] and upper[N-1] hold (NaN from the generator,
        zero, inf, huge), the answer is the same to the bit."""
        for shape in self.batch(k, n):
            operands, clean = problem(kind, shape, k, m, dtype=dtype, seed=n + k)
            lower, diag, upper, b = operands
            options = dict(kind=kind, transposed=transposed)
            got = self.solve(*operands, **options)
            assert got.shape == (*shape, k, m) and got.dtype == np.dtype(dtype)
            check(got, clean, b, transposed)
            for fill in (0.0, np.inf, -float(jnp.finfo(dtype).max)):
                filled = [np.where(np.isnan(x), fill, x).astype(dtype) for x in (lower, upper)]
                np.testing.assert_array_equal(self.solve(filled[0], diag, filled[1], b, **options),
                                              got, err_msg=f"outside the matrix: {fill}")

    @cases("k, n, m, dtype, kind, transposed", "TWIN_SYSTEMS")
    def test_matches_the_xla_formulation(self, k, n, m, dtype, kind, transposed):
        for shape in self.twin_batch(k, n):
            operands, clean = problem(kind, shape, k, m, dtype=dtype, seed=k)
            options = dict(kind=kind, transposed=transposed)
            assert_close(self.solve(*operands, **options), self.twin(*operands, **options), dtype,
                         condition(clean, operands[-1].shape, transposed))

    @cases("k, m, dtype, shape, kind, broadcast", "LAYOUTS")
    def test_layouts_and_broadcast_blocks(self, k, m, dtype, shape, kind, broadcast):
        """Blocks broadcast along P, N and/or Q are read in place; the references see them
        materialised."""
        operands, clean = problem(kind, shape, k, m, broadcast, dtype=dtype, seed=k + m)
        for transposed in (False, True):
            got = self.solve(*operands, kind=kind, transposed=transposed)
            assert got.shape == (*shape, k, m) and got.dtype == np.dtype(dtype)
            check(got, clean, operands[-1], transposed)
            if self.TWIN_LAYOUTS:
                assert_close(got, self.twin(*operands, kind=kind, transposed=transposed), dtype,
                             condition(clean, operands[-1].shape, transposed))

    @cases("k, shape, dtype", "DTYPES")
    def test_dtypes(self, k, shape, dtype):
        for i, kind in enumerate(KINDS):
            operands, clean = problem(kind, shape, k, 1 + i % 2, dtype=dtype, seed=11 + i)
            for transposed in (False, True):
                got = self.solve(*operands, kind=kind, transposed=transposed)
                assert got.dtype == np.dtype(dtype)
                check(got, clean, operands[-1], transposed)

    def test_half_precision_output(self):
        """float32 blocks, a bfloat16 x: eliminated in float32, rounded once."""
        operands, clean = problem("block_pivoted", (2, 5, 5), 2, 2, dtype=np.float32, seed=7)
        options = dict(kind="block_pivoted", transposed=True, out_dtype=jnp.bfloat16)
        got = self.solve(*operands, **options)
        assert got.dtype == jnp.bfloat16
        cond = condition(clean, operands[-1].shape, True)
        assert_close(got, reference(clean, operands[-1], True), jnp.bfloat16, cond)
        if self.TWIN:
            assert_close(got, self.twin(*operands, **options).astype(np.float32), jnp.bfloat16,
                         cond)

    def test_real_blocks_with_complex_rhs(self):
        (lower, diag, upper, _), clean = problem("block", (2, 5, 5), 2, dtype=self.DTYPE, seed=8)
        b = problem("block", (2, 5, 5), 2, dtype=self.COMPLEX, seed=9)[0][3]
        got = self.solve(lower, diag, upper, b, kind="block", transposed=False)
        assert got.dtype == self.COMPLEX
        check(got, clean, b, False)

    def test_complex_transpose_is_not_conjugated(self):
        """A^T x = b, not A^H x = b: a complex non-Hermitian system gives different answers."""
        operands, clean = problem("block", (2, 5, 3), 2, seed=3, dtype=self.COMPLEX)
        got = self.solve(*operands, kind="block", transposed=True)
        check(got, clean, operands[-1], True)
        conj = reference([np.conj(x) for x in clean], operands[-1], True)
        assert np.max(np.abs(got - conj)) > 1e-3

    @cases("k, shape, transposed", "PIVOTING")
    def test_pivoting_is_needed_and_done(self, k, shape, transposed):
        """Diagonal blocks whose diagonal entries are tiny (1e-13) next to the others, or whose
        first pivot is zero: partial pivoting solves them to rounding, the elimination without
        interchanges does not."""
        operands, clean = problem("block_pivoted", shape, k, dtype=self.DTYPE, seed=5)
        lower, diag, upper, b = operands
        for zero in (False, True):
            diag = operands[1].copy()
            if zero:
                diag[..., 0, 0] = 0
            else:
                for i in range(k):  # the diagonal, not the dominant antidiagonal
                    if i != k - 1 - i:
                        diag[..., i, i] *= 1e-13
            clean = [clean[0], diag, clean[2]]
            operands_ = (lower, diag, upper, b)
            options = dict(transposed=transposed)
            check(self.solve(*operands_, kind="block_pivoted", **options), clean, b, transposed)
            want = reference(clean, b, transposed)
            plain = self.solve(*operands_, kind="block", **options)
            err = np.max(np.abs(plain - want), initial=0.0, where=np.isfinite(plain)) / np.max(np.abs(want))
            assert not np.isfinite(plain).all() or err > 1e-6

    @cases("k, shape, kind", "SINGULAR")
    def test_a_singular_block_spoils_its_own_system_alone(self, k, shape, kind):
        """S = 0 at row 0, or halfway (diag and the blocks coupling it to the row above zero),
        or a first diagonal block of rank one: inf or NaN in that system, every other one
        right."""
        P, N, Q = shape
        operands, clean = problem(kind, shape, k, dtype=self.DTYPE, seed=13)
        p, q = P // 2, Q // 2
        others = np.ones((P, Q), bool)
        others[p, q] = False
        for row in (0, N // 2, None):
            lower, diag, upper = (x.copy() for x in operands[:3])
            if row is None:  # a first block of rank one: its second pivot is zero
                diag[p, 0, q] = np.outer(np.ones(k), np.arange(1, k + 1))
            else:
                diag[p, row, q] = 0
                if row:
                    lower[p, row, q] = upper[p, row - 1, q] = 0
            for transposed in (False, True):
                got = self.solve(lower, diag, upper, operands[3], kind=kind, transposed=transposed)
                bad = ~np.isfinite(got)
                assert bad[p, :, q].any()
                want = reference(clean, operands[3], transposed)
                got, want = (x.transpose(0, 2, 1, 3, 4)[others] for x in (got, want))
                cond = condition(clean, operands[3].shape, transposed)[others]
                assert_close(got.transpose(1, 0, 2, 3)[None], want.transpose(1, 0, 2, 3)[None],
                             operands[3].dtype, cond[None])

    @cases("k, shape, dtype", "INDEFINITE")
    def test_hermitian_indefinite_system_is_all_nan_alone(self, k, shape, dtype):
        """A Schur complement with a negative eigenvalue, first or halfway: that system is NaN,
        every other one right; solved with pivoting the same matrix has no NaN."""
        P, N, Q = shape
        operands, clean = problem("block_hermitian", shape, k, dtype=dtype, seed=17)
        p, q = 1, Q // 2
        for row in (0, N // 2):
            diag = operands[1].copy()
            diag[p, row, q, k - 1, k - 1] = -diag[p, row, q, k - 1, k - 1]
            bad = (operands[0], diag, operands[2], operands[3])
            for transposed in (False, True):
                got = self.solve(*bad, kind="block_hermitian", transposed=transposed)
                nan = np.isnan(got)
                assert nan[p, :, q].all() and nan.sum() == nan[p, :, q].size
                want = reference(clean, operands[-1], transposed)
                got[p, :, q] = want[p, :, q]
                assert_close(got, want, dtype, condition(clean, operands[-1].shape, transposed))
        assert np.isfinite(self.solve(*bad, kind="block_pivoted", transposed=False)).all()

    def test_pivot_ties_take_the_first_row(self):
        """Equal magnitudes, first of equals (as LAPACK's getrf and jnp.argmax; for complex
        |Re| + |Im|, which ranks 3 + 4j above 5): the rows the XLA formulation picks. Any
        choice solves the system to rounding, so the real check is bit for bit, in vector lanes
        (16 systems), where both run the same operations in the same order and the other row's
        elimination rounds differently; complex systems agree to rounding."""
        k, N, Q = 3, 4, 16
        eps = np.finfo(self.DTYPE).eps
        for complex_ in (False, True):
            dtype = self.COMPLEX if complex_ else self.DTYPE
            block = (np.array([[1.0, 2, 0], [-1, 1, 2], [1, -1, 3]]) if not complex_ else
                     np.array([[5.0, 1, 0], [3 + 4j, 2, 1], [5, 1, 4]]))
            diag = np.broadcast_to(block.astype(dtype), (1, N, 1, k, k))
            off = np.broadcast_to((0.1 * np.eye(k)).astype(dtype), (1, N, 1, k, k))
            b = (np.arange(1.0, N * k * Q + 1) / 7).astype(dtype).reshape(N, k, Q, 1)
            b = np.ascontiguousarray(b.transpose(0, 2, 1, 3))[None]
            operands = (off, diag, off, b)
            A = dense(off, diag, off, N)[0, 0]
            for transposed in (False, True):
                options = dict(kind="block_pivoted", transposed=transposed)
                got = self.solve(*operands, **options)
                if self.TWIN and self.BITWISE_TWIN and not complex_:
                    np.testing.assert_array_equal(got, self.twin(*operands, **options, optimized=True))
                elif self.TWIN:
                    np.testing.assert_allclose(got, self.twin(*operands, **options),
                                               rtol=100 * eps, atol=100 * eps)
                rhs = b[0].transpose(0, 2, 1, 3).reshape(N * k, Q)
                solve = np.linalg.solve(A.T if transposed else A, rhs)
                np.testing.assert_allclose(got[0].transpose(0, 2, 1, 3).reshape(N * k, Q), solve,
                                           rtol=1e4 * eps)

    @cases("shape, k, m", "ZERO_SIZES")
    def test_zero_sizes(self, shape, k, m):
        blocks = np.zeros((*shape, k, k), self.DTYPE)
        got = self.solve(blocks, blocks, blocks, np.zeros((*shape, k, m), self.DTYPE),
                         kind="block", transposed=False)
        assert got.shape == (*shape, k, m)
