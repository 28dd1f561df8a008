"""The contract every banded solve kernel keeps, and the tests of it that each backend runs.

A kernel solves A x = b (A^T x = b when `transposed`, no conjugate) for every system along
axis 1 of b (P, N, Q), the matrices given by `ab` (l + u + 1, P|1, N|1, Q|1) in scipy's band
layout along axis 2, ab[u + i - j, j] = A[i, j] (a size-1 axis is broadcast). `kind`:
"banded" (no pivoting), "banded_pivoted" (partial pivoting; of equal magnitudes |Re| + |Im|
the first row, as LAPACK's gbtrf) or "banded_hermitian" (no pivoting; a pivot whose real part
is not positive makes its own system NaN, and no other). The entries of `ab` outside the
matrix are never read, whatever they hold. float16 and bfloat16 are solved in float32 and
rounded once.

`BandedKernelContract` holds the tests of that contract. Each backend's module subclasses it
with the hook `solve` and the cases it can afford (the class attributes that
`pytest_generate_tests` reads): the native C++ kernel (test_banded_native.py), the XLA
formulation (test_banded_xla.py), the Pallas kernel in interpret mode (test_banded_pallas.py)
and the Pallas TPU kernel in TPU interpret mode (test_banded_pallas_tpu.py, in float32).

Every problem comes from one generator (`problem`): well-conditioned matrices of each kind,
with NaN in the entries of `ab` outside the matrix. The references are scipy.linalg.solve_banded
(LAPACK gbsv) on the clean bands of A or A^T, and, for the kernels that follow it step for step,
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
from helpers import KernelContract, assert_within_condition, case_id, cases, compile_unoptimized, program_cache, wide

from tridiax._banded import xla as _xla_banded

KINDS = ("banded", "banded_pivoted", "banded_hermitian")
BANDS = [(0, 0), (1, 1), (2, 2), (3, 1), (0, 3), (2, 0), (8, 8)]
SIZES = [1, 2, 3, 7, 33, 100]
ALL_DTYPES = [np.float16, jnp.bfloat16, np.float32, np.float64, np.complex64, np.complex128]
# Contiguous lanes (Q > 1) and batch-first systems (Q == 1), sizes that are not whole vectors,
# few lanes, systems of one and two rows.
LAYOUT_SHAPES = [(1, 100, 37), (2, 33, 21), (3, 7, 50), (37, 33, 1), (5, 100, 1), (40, 7, 3),
                 (1, 9, 5), (1, 33, 1), (1, 7, 2), (2, 1, 17), (17, 2, 1)]
# Which of P, N, Q the bands vary along ("1" where they are broadcast).
EVERY_BROADCAST = ("PNQ", "1NQ", "PN1", "P1Q", "1N1", "111")
# Systems shorter than the band and a few rows longer, each length with its own kind and
# orientation: (n, kind, transposed).
SHORT = [(1, "banded_pivoted", True), (2, "banded", False), (3, "banded_hermitian", True),
         (7, "banded_pivoted", False)]

# Errors in units of eps * cond (`assert_close`).
FACTOR = 20


# ---------------------------------------------------------------------------------------------
# Matrices.


def dense(ab, l, u):
    """The (..., N, N) matrices of bands ab (l + u + 1, ..., N) in scipy's layout."""
    ab = np.moveaxis(np.asarray(ab), 0, -2)  # (..., K, N)
    n = ab.shape[-1]
    i, j = np.indices((n, n))
    k = u + i - j
    inside = (k >= 0) & (k <= l + u)
    a = np.zeros(ab.shape[:-2] + (n, n), ab.dtype)
    a[..., inside] = ab[..., k[inside], j[inside]]
    return a


def bands(A, l, u):
    """scipy's layout (l + u + 1, N) of one band matrix, NaN outside the matrix."""
    n = A.shape[0]
    k, j = np.indices((l + u + 1, n))
    i = k + j - u
    inside = (i >= 0) & (i < n)
    ab = np.full((l + u + 1, n), np.nan, A.dtype)
    ab[inside] = A[i[inside], j[inside]]
    return ab


def transposed_bands(ab, l, u):
    """The bands (l + u + 1, N, ...) of A^T (bandwidths (u, l)) from those of A, zero outside
    the matrix: abT[k, j] = A[j, j + k - l] = ab[l + u - k, j + k - l]."""
    K, n = ab.shape[0], ab.shape[1]
    out = np.zeros_like(ab)
    for k in range(K):
        s = k - l
        lo, hi = max(0, -s), min(n, n - s)
        if lo < hi:
            out[k, lo:hi] = ab[K - 1 - k, lo + s:hi + s]
    return out


def _draw(rng, shape, complex_):
    x = rng.standard_normal(shape)
    return x + 1j * rng.standard_normal(shape) if complex_ else x


def _mask(n, lo, up):
    i, j = np.indices((n, n))
    return (j - i <= up) & (i - j <= lo)


def system(rng, n, l, u, kind, complex_):
    """One n x n band matrix (l, u) of `kind` in float64/complex128.

    "banded": strictly diagonally dominant by rows, pivots of any phase. "banded_hermitian":
    Hermitian positive definite where l == u, else dominant with a positive real diagonal.
    "banded_pivoted" (l, u >= 1): a dominant matrix of bandwidths (l - s, u - s) whose rows
    k and k + s are exchanged for most k (s from 1 to min(l, u), drawn per matrix), so partial
    pivoting has rows to interchange, s rows down; a dominant one otherwise. Each is a row
    permutation of a dominant matrix: cond_inf(A) < 2 (1 + the off-diagonal row sums)."""
    if kind == "banded_hermitian" and l == u:
        A = _draw(rng, (n, n), complex_) * _mask(n, l, u)
        A = (A + A.conj().T) / 2
        np.fill_diagonal(A, 1 + np.abs(A).sum(axis=1) - np.abs(np.diag(A)).real)
        return A
    s = int(rng.integers(1, min(l, u) + 1)) if kind == "banded_pivoted" and min(l, u) else 0
    A = _draw(rng, (n, n), complex_) * _mask(n, l - s, u - s)
    phase = _draw(rng, n, complex_)
    phase = np.ones(n) if kind == "banded_hermitian" else phase / np.abs(phase)
    np.fill_diagonal(A, (1 + np.abs(A).sum(axis=1)) * phase)
    if s:
        for start in range(0, n, 2 * s):
            for k in range(start, min(start + s, n - s)):
                if rng.random() < 0.7:
                    A[[k, k + s]] = A[[k + s, k]]
    return A


def constant_system(rng, l, u, kind, complex_):
    """The bands (l + u + 1,) of a matrix constant along its diagonals: Hermitian positive
    definite ("banded_hermitian", l == u), else dominant (a positive real diagonal for
    "banded_hermitian")."""
    ab = _draw(rng, l + u + 1, complex_)
    if kind == "banded_hermitian" and l == u:
        ab[u + 1:] = ab[:u][::-1].conj()
        ab[u] = 1 + 2 * np.abs(ab[:u]).sum()
    else:
        phase = 1 if kind == "banded_hermitian" else ab[u] / np.abs(ab[u])
        ab[u] = (1 + np.abs(np.delete(ab, u)).sum()) * phase
    return ab


def ab_shape(broadcast, shape):
    """The shape of ab's (P, N, Q) axes for a pattern of EVERY_BROADCAST ("1NQ": broadcast along P)."""
    return tuple(1 if c == "1" else s for c, s in zip(broadcast, shape, strict=True))


def problem(l, u, kind, shape, ab_shape=None, dtype=np.float64, seed=0):
    """ab (l + u + 1, Pa, Na, Qa) of `dtype` with NaN outside the matrix, b (P, N, Q) of
    `dtype`, and the clean bands in float64/complex128 (rounded from `dtype`: the matrix
    solved), zero outside the matrix. Na == 1: a matrix constant along its diagonals."""
    P, N, Q = shape
    Pa, Na, Qa = ab_shape or shape
    rng = np.random.default_rng(seed)
    complex_ = np.issubdtype(np.dtype(dtype), np.complexfloating)
    clean = np.zeros((l + u + 1, Pa, Na, Qa), wide(dtype))
    for p in range(Pa):
        for q in range(Qa):
            if Na == 1:
                clean[:, p, 0, q] = constant_system(rng, l, u, kind, complex_)
            elif N:
                clean[:, p, :, q] = np.nan_to_num(bands(system(rng, N, l, u, kind, complex_), l, u))
    ab = clean.astype(dtype)
    clean = ab.astype(wide(dtype))
    if Na == N:  # ab[k, j] holds row k + j - u: outside the matrix for some k, j
        ab[outside(l, u, N)] = np.nan
    b = _draw(rng, (P, N, Q), complex_).astype(dtype)
    return ab, b, clean


def outside(l, u, n):
    """The index of the entries of ab (l + u + 1, P, n, Q) outside the matrix."""
    k, j = np.indices((l + u + 1, n))
    out = (k + j - u < 0) | (k + j - u >= n)
    return k[out], slice(None), j[out], slice(None)


# ---------------------------------------------------------------------------------------------
# References and the tolerance.


def _systems(clean, shape):
    """The clean bands of every system, (K, P, N, Q)."""
    return np.broadcast_to(clean, (clean.shape[0], *shape))


def reference(clean, b, l, u, transposed):
    """Every system solved in float64/complex128 by scipy.linalg.solve_banded, on the bands of
    A or of A^T."""
    P, N, Q = b.shape
    ab = _systems(clean, b.shape)
    if transposed:
        ab, (l, u) = transposed_bands(np.moveaxis(ab, 2, 1), l, u), (u, l)
        ab = np.moveaxis(ab, 1, 2)
    b = b.astype(wide(b.dtype))
    x = np.zeros(b.shape, np.result_type(ab, b))
    for p in range(P):
        for q in range(Q):
            x[p, :, q] = scipy.linalg.solve_banded((l, u), ab[:, p, :, q], b[p, :, q])
    return x


def condition(clean, l, u, shape, transposed=False):
    """cond_inf of every system's A (of A^T when `transposed`: cond_1(A)), (P, Q); once per
    matrix where the bands are broadcast. The inverse comes from scipy's banded solve (dense
    LAPACK calls on many small matrices run slowly next to XLA's threads)."""
    P, N, Q = shape
    K, Pa, _, Qa = clean.shape
    cond = np.ones((Pa, Qa))
    norm = 1 if transposed else np.inf
    for p in range(Pa if N else 0):
        for q in range(Qa):
            ab = np.broadcast_to(clean[:, p, :, q], (K, N))
            inverse = scipy.linalg.solve_banded((l, u), ab, np.eye(N))
            cond[p, q] = np.linalg.norm(dense(ab, l, u), norm) * np.linalg.norm(inverse, norm)
    return np.broadcast_to(cond, (P, Q))


def assert_close(got, want, dtype, cond):
    """In every system (P, :, Q): max |got - want| <= (eps + FACTOR eps_work cond) max |want|,
    eps of `dtype`, eps_work of the dtype solved in, cond (P, Q) of each system."""
    assert_within_condition(got, want, dtype, cond, axes=1, factor=FACTOR)


def check(got, clean, b, l, u, transposed, dtype=None):
    """`got` against scipy's solution of the clean matrices."""
    assert_close(got, reference(clean, b, l, u, transposed), dtype or b.dtype,
                 condition(clean, l, u, b.shape, transposed))


def compiled(solve_pnq, **fixed):
    """A kernel `solve_pnq(ab, b, *, l, u, kind, transposed, out_dtype, **fixed)` as the
    contract's `solve` hook: compiled once per shapes and options at XLA's optimization level 0
    (the kernels' loops compile in a fraction of the time), its answer a writable NumPy array.
    The hook passes any further (hashable) keyword options on to the kernel (a Pallas tile)."""

    @program_cache
    def program(specs, options):
        fn = functools.partial(solve_pnq, **fixed, **dict(options))
        return compile_unoptimized(fn, *(jax.ShapeDtypeStruct(*spec) for spec in specs))

    def solve(ab, b, *, l, u, kind, transposed, out_dtype=None, **extra):
        args = (jnp.asarray(ab), jnp.asarray(b))
        options = dict(l=l, u=u, kind=kind, transposed=transposed,
                       out_dtype=np.dtype(out_dtype or b.dtype), **extra)
        return np.array(program(tuple((a.shape, a.dtype) for a in args), tuple(options.items()))(*args))

    return solve


# The XLA formulation (`_xla_banded.solve_pnq`), the twin of the kernels that follow it.
xla_solve = compiled(_xla_banded.solve_pnq)


# ---------------------------------------------------------------------------------------------
# The contract.


class BandedKernelContract(KernelContract):
    """The tests every banded kernel passes. A subclass gives `solve` and may narrow the cases
    (a slow backend) or drop a test by setting it to None (the XLA formulation is not compared
    with itself)."""

    # Whether the backend follows the XLA formulation step for step (compared with it).
    TWIN = True
    # The dtype of the problems whose dtype a test does not choose, and whether the backend
    # solves complex systems (a backend without float64 or complex types narrows them).
    DTYPE = np.float64
    COMPLEX = True

    # (l, u, kind, n, transposed), in DTYPE, each n solved for batch(n) shapes of b.
    SYSTEMS = [(l, u, kind, n, t) for l, u in BANDS for kind in KINDS for n in SIZES
               for t in (False, True)]
    # The same, against the XLA formulation, for twin_batch(n).
    TWIN_SYSTEMS = [(l, u, kind, n, t) for l, u in BANDS for kind in KINDS for n in (2, 7, 33)
                    for t in (False, True)]
    # (l, u, kind, transposed, shape, dtype): b (P, N, Q) = shape, bands for each of
    # BROADCASTS (TWIN_BROADCASTS against the XLA formulation).
    LAYOUTS = [(l, u, kind, t, shape, np.float32) for l, u in [(1, 1), (2, 2), (3, 1), (8, 8)]
               for kind in KINDS for t in (False, True) for shape in LAYOUT_SHAPES]
    BROADCASTS = EVERY_BROADCAST
    TWIN_LAYOUTS = [(l, u, kind, True, shape, np.float32) for l, u in [(2, 2), (3, 1)]
                    for kind in KINDS for shape in [(2, 33, 21), (37, 33, 1), (40, 7, 3)]]
    TWIN_BROADCASTS = ("1NQ", "PN1", "P1Q")
    # (l, u, kind, transposed, shape, dtype).
    DTYPES = [(l, u, kind, t, shape, dtype) for l, u in [(1, 1), (2, 2), (3, 1), (8, 8)]
              for kind in KINDS for t in (False, True) for shape in [(3, 33, 19), (21, 33, 1)]
              for dtype in ALL_DTYPES]
    TWIN_DTYPES = [(2, 2, kind, False, (2, 33, 7), dtype) for kind in KINDS
                   for dtype in (np.float16, np.complex64, np.complex128)]
    # (l, transposed, shape, dtype): a Hermitian matrix made indefinite.
    INDEFINITE = [(l, t, shape, dtype) for l in (0, 1, 2, 8) for t in (False, True)
                  for shape in [(3, 33, 19), (21, 33, 1)]
                  for dtype in (np.float32, np.float64, np.complex128)]
    # b (P, N, Q) with no entries.
    ZERO_SIZES = [(0, 7, 5), (3, 0, 5), (3, 7, 0)]

    def solve(self, ab, b, *, l, u, kind, transposed, out_dtype=None) -> np.ndarray:
        """x (P, N, Q) of `out_dtype` (default b's), a writable NumPy array."""
        raise NotImplementedError

    def batch(self, n):
        """The shapes of b each SYSTEMS case solves."""
        return [(2, n, 19), (19, n, 1)]

    def twin_batch(self, n):
        """The shapes of b each TWIN_SYSTEMS case solves."""
        return [(3, n, 11)]

    def twin(self, ab, b, **options):
        return xla_solve(ab, b, **options)

    # --- the checks themselves ----------------------------------------------------------------

    def test_the_checks_can_fail(self):
        """This backend's answer passes; perturbed by 10^6 eps (2e-10 in float64), or the answer
        of A^T instead of A, it fails. The pivoted test matrices need interchanges; the corners
        hold NaN."""
        l, u, kind = 2, 2, "banded_pivoted"
        ab, b, clean = problem(l, u, kind, (2, 33, 19), dtype=self.DTYPE, seed=3)
        cond = condition(clean, l, u, b.shape)
        want = reference(clean, b, l, u, False)
        got = self.solve(ab, b, l=l, u=u, kind=kind, transposed=False)
        assert_close(got, want, b.dtype, cond)
        with pytest.raises(AssertionError):
            assert_close(got * (1 + 1e6 * np.finfo(self.DTYPE).eps), want, b.dtype, cond)
        with pytest.raises(AssertionError):
            assert_close(self.solve(ab, b, l=l, u=u, kind=kind, transposed=True), want, b.dtype,
                         cond)
        a = dense(clean[:, 0, :, 0], l, u)
        below = np.max(np.abs(np.tril(a, -1)), axis=0)[:-1]
        assert np.sum(below > np.abs(np.diag(a))[:-1]) >= 5  # columns whose pivot is below
        assert np.isnan(ab[outside(l, u, 33)]).all() and not np.isnan(clean).any()

    @cases("l, u, kind, n, transposed", "SYSTEMS")
    def test_every_system_against_scipy(self, l, u, kind, n, transposed):
        """Against scipy; whatever the entries outside the matrix hold (NaN from the generator,
        zero, inf, huge), the answer is the same to the bit."""
        for shape in self.batch(n):
            ab, b, clean = problem(l, u, kind, shape, dtype=self.DTYPE, seed=n)
            options = dict(l=l, u=u, kind=kind, transposed=transposed)
            got = self.solve(ab, b, **options)
            assert got.dtype == b.dtype
            check(got, clean, b, l, u, transposed)
            corners = np.isnan(ab)
            for fill in ((0.0, np.inf, -np.finfo(ab.dtype).max) if corners.any() else ()):
                np.testing.assert_array_equal(self.solve(np.where(corners, fill, ab), b, **options),
                                              got, err_msg=f"corners {fill}")

    @cases("l, u, kind, n, transposed", "TWIN_SYSTEMS")
    def test_matches_the_xla_formulation(self, l, u, kind, n, transposed):
        for shape in self.twin_batch(n):
            ab, b, clean = problem(l, u, kind, shape, dtype=self.DTYPE, seed=n + 1)
            options = dict(l=l, u=u, kind=kind, transposed=transposed)
            assert_close(self.solve(ab, b, **options), self.twin(ab, b, **options), b.dtype,
                         condition(clean, l, u, b.shape, transposed))

    @cases("l, u, kind, transposed, shape, dtype", "LAYOUTS")
    def test_layouts_and_broadcast_bands(self, l, u, kind, transposed, shape, dtype):
        """Bands broadcast along P, N and/or Q are read in place; the references see them
        materialised."""
        for seed, broadcast in enumerate(self.BROADCASTS):
            ab, b, clean = problem(l, u, kind, shape, ab_shape(broadcast, shape), dtype=dtype,
                                   seed=seed)
            got = self.solve(ab, b, l=l, u=u, kind=kind, transposed=transposed)
            assert got.shape == shape and got.dtype == np.dtype(dtype)
            check(got, clean, b, l, u, transposed)

    @cases("l, u, kind, transposed, shape, dtype", "TWIN_LAYOUTS")
    def test_broadcast_bands_match_the_xla_formulation(self, l, u, kind, transposed, shape, dtype):
        for broadcast in self.TWIN_BROADCASTS:
            ab, b, clean = problem(l, u, kind, shape, ab_shape(broadcast, shape), dtype=dtype,
                                   seed=5)
            options = dict(l=l, u=u, kind=kind, transposed=transposed)
            assert_close(self.solve(ab, b, **options), self.twin(ab, b, **options), dtype,
                         condition(clean, l, u, shape, transposed))

    @cases("l, u, kind, transposed, shape, dtype", "DTYPES")
    def test_dtypes(self, l, u, kind, transposed, shape, dtype):
        ab, b, clean = problem(l, u, kind, shape, dtype=dtype, seed=11)
        got = self.solve(ab, b, l=l, u=u, kind=kind, transposed=transposed)
        assert got.dtype == np.dtype(dtype)
        check(got, clean, b, l, u, transposed)

    @cases("l, u, kind, transposed, shape, dtype", "TWIN_DTYPES")
    def test_dtypes_match_the_xla_formulation(self, l, u, kind, transposed, shape, dtype):
        ab, b, clean = problem(l, u, kind, shape, dtype=dtype, seed=13)
        options = dict(l=l, u=u, kind=kind, transposed=transposed)
        assert_close(self.solve(ab, b, **options), self.twin(ab, b, **options), dtype,
                     condition(clean, l, u, shape, transposed))

    @pytest.mark.parametrize("out_dtype", [jnp.bfloat16, np.float16], ids=case_id)
    def test_half_precision_output(self, out_dtype):
        """float32 operands, a half-precision x: solved in float32, rounded once."""
        l, u, kind = 2, 2, "banded_pivoted"
        ab, b, clean = problem(l, u, kind, (2, 33, 19), dtype=np.float32, seed=9)
        options = dict(l=l, u=u, kind=kind, transposed=False, out_dtype=out_dtype)
        got = self.solve(ab, b, **options)
        assert got.dtype == np.dtype(out_dtype)
        cond = condition(clean, l, u, b.shape)
        assert_close(got, reference(clean, b, l, u, False), out_dtype, cond)
        if self.TWIN:
            assert_close(got, self.twin(ab, b, **options).astype(np.float32), out_dtype, cond)

    def test_real_bands_with_complex_rhs(self):
        l, u, kind = 1, 2, "banded_pivoted"
        ab, _, clean = problem(l, u, kind, (2, 7, 19), seed=6)
        _, b, _ = problem(l, u, kind, (2, 7, 19), dtype=np.complex128, seed=8)
        got = self.solve(ab, b, l=l, u=u, kind=kind, transposed=True)
        assert got.dtype == np.complex128
        check(got, clean, b, l, u, True)

    @cases("l, transposed, shape, dtype", "INDEFINITE")
    def test_hermitian_indefinite_system_is_all_nan_alone(self, l, transposed, shape, dtype):
        """A pivot that is not positive, first or halfway: that system is NaN (one row of a
        diagonal matrix), every other one right; solved with pivoting the same matrix has no
        NaN."""
        P, N, Q = shape
        ab, b, clean = problem(l, l, "banded_hermitian", shape, dtype=dtype, seed=17)
        p, q = 1, Q // 2
        options = dict(l=l, u=l, kind="banded_hermitian", transposed=transposed)
        want = reference(clean, b, l, l, transposed)
        cond = condition(clean, l, l, shape, transposed)
        for row in (0, N // 2):
            bad = ab.copy()
            bad[l, p, row, q] = -bad[l, p, row, q]
            got = self.solve(bad, b, **options)
            nan = np.isnan(got)
            if l == 0:
                assert nan[p, row, q] and nan.sum() == 1
            else:
                assert nan[p, :, q].all() and nan.sum() == N
            got[p, :, q] = want[p, :, q]
            assert_close(got, want, dtype, cond)
        assert np.isfinite(self.solve(bad, b, **{**options, "kind": "banded_pivoted"})).all()

    def test_zero_diagonal_needs_pivoting(self):
        """The path graph's adjacency matrix (nonsingular for even N, zero diagonal): the
        unpivoted kinds break down, the pivoted one solves it."""
        N = 8
        A = np.eye(N, k=1) + np.eye(N, k=-1)
        ab, b = bands(A, 1, 1)[:, None, :, None].astype(self.DTYPE), np.ones((1, N, 1), self.DTYPE)
        for transposed in (False, True):
            options = dict(l=1, u=1, transposed=transposed)
            for kind in ("banded", "banded_hermitian"):
                assert not np.isfinite(self.solve(ab, b, kind=kind, **options)).all()
            got = self.solve(ab, b, kind="banded_pivoted", **options)
            np.testing.assert_allclose(got[0, :, 0], np.linalg.solve(A, b[0, :, 0]),
                                       atol=100 * np.finfo(self.DTYPE).eps)

    def test_pivot_ties_take_the_first_row(self):
        """Equal magnitudes, first of equals (as LAPACK's gbtrf and jnp.argmax; for complex
        |Re| + |Im|, which ranks 3 + 4j above 5): the rows the XLA formulation picks."""
        N = 6
        eps = np.finfo(self.DTYPE).eps
        for complex_ in (False, True) if self.COMPLEX else (False,):
            A = np.zeros((N, N), np.complex128 if complex_ else self.DTYPE)
            for i in range(N):
                A[i, i] = 5.0 if complex_ else 1.0
                if i + 1 < N:
                    A[i + 1, i] = 3 + 4j if complex_ else -1.0  # ties |1| with -1; 7 > 5
                    A[i, i + 1] = 2.0
                if i + 2 < N:
                    A[i + 2, i] = 5.0 if complex_ else 1.0
            ab = bands(A, 2, 1)[:, None, :, None]
            b = np.arange(1.0, N + 1).astype(A.dtype)[None, :, None]
            for transposed in (False, True):
                options = dict(l=2, u=1, kind="banded_pivoted", transposed=transposed)
                got = self.solve(ab, b, **options)
                if self.TWIN:
                    np.testing.assert_allclose(got, self.twin(ab, b, **options), rtol=100 * eps,
                                               atol=100 * eps)
                solve = np.linalg.solve(A.T if transposed else A, b[0, :, 0])
                np.testing.assert_allclose(got[0, :, 0], solve, rtol=1e4 * eps)

    def test_nan_in_the_pivot_column_spoils_its_system_alone(self):
        """Column 0 holds 1, -1, 1j (a tie: the first row is the pivot); one system has a NaN
        there, which is chosen as the pivot (as jnp.argmax would) and makes that system NaN,
        and that system only."""
        l, u, N, Q = 2, 1, 7, 4
        ab, b, _ = problem(l, u, "banded_pivoted", (1, N, Q), dtype=np.complex128, seed=5)
        a = dense(np.nan_to_num(ab[:, 0]).transpose(0, 2, 1), l, u)  # (Q, N, N)
        a[:, :3, 0] = [1, -1, 1j]
        a[3, 1, 0] = np.nan
        ab = np.stack([bands(m, l, u) for m in a], axis=-1)[:, None]
        options = dict(l=l, u=u, kind="banded_pivoted", transposed=False)
        got = self.solve(ab, b, **options)
        assert np.isnan(got[0, :, 3]).all() and np.isfinite(got[..., :3]).all()
        if self.TWIN:
            np.testing.assert_array_equal(np.isnan(got), np.isnan(self.twin(ab, b, **options)))
        clean = np.nan_to_num(ab[..., :3])
        check(got[..., :3], clean, b[..., :3], l, u, False)

    @cases("shape", "ZERO_SIZES")
    def test_zero_sizes(self, shape):
        got = self.solve(np.zeros((5, *shape), self.DTYPE), np.zeros(shape, self.DTYPE), l=2, u=2,
                         kind="banded", transposed=False)
        assert got.shape == shape and got.dtype == self.DTYPE
