"""Independent references for checking tridiax: SciPy's banded LAPACK solver and residuals.

Everything here runs in NumPy on the host in float64 (complex128 for complex input), one
system at a time: slow, simple and independent of the kernels it checks.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

__all__ = ["reference_solve", "reference_solve_banded", "reference_solve_block_tridiagonal",
           "relative_residual"]


def _systems(arrays, axis: int):
    """Broadcast, move `axis` last and flatten the batch: (S, N) arrays and the full shape."""
    arrays = [np.asarray(a) for a in arrays]
    dtype = np.result_type(*arrays, np.float64)
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    if not shape:
        raise ValueError("inputs are 0-d; a tridiagonal system needs an axis to lie along.")
    axis = axis % len(shape)
    moved = [np.moveaxis(np.broadcast_to(a, shape).astype(dtype), axis, -1) for a in arrays]
    return [m.reshape(-1, shape[axis]) for m in moved], shape, axis


# Longest periodic system reference_solve assembles densely.
_DENSE_PERIODIC = 512


def _banded(lo, di, up):
    """scipy.linalg.solve_banded's (1, 1) layout of one system's bands."""
    ab = np.zeros((3, di.shape[0]), dtype=np.result_type(lo, di, up))
    ab[0, 1:] = up[:-1]
    ab[1] = di
    ab[2, :-1] = lo[1:]
    return ab


def _periodic_woodbury(lo, di, up, b):
    """One periodic system: A = T + U V^T with U = [e_0, e_{N-1}] and V^T the two corner rows
    (lower[0] at column N-1 of row 0, upper[N-1] at column 0 of row N-1)."""
    n = di.shape[0]
    rhs = np.zeros((n, 3), dtype=b.dtype)
    rhs[:, 0] = b
    rhs[0, 1] = 1.0
    rhs[n - 1, 2] = 1.0
    y = scipy.linalg.solve_banded((1, 1), _banded(lo, di, up), rhs)
    # V^T z for each column z of y: lower[0] * z[N-1] (row 0) and upper[N-1] * z[0] (row N-1).
    vt_y = np.stack([lo[0] * y[n - 1], up[n - 1] * y[0]])
    coupled = np.eye(2, dtype=b.dtype) + vt_y[:, 1:]
    weights = scipy.linalg.solve(coupled, vt_y[:, 0])
    return y[:, 0] - y[:, 1:] @ weights


def reference_solve(lower, diag, upper, rhs, *, axis: int = -1, periodic: bool = False) -> np.ndarray:
    """Solve every system with `scipy.linalg.solve_banded` (LAPACK gbsv, partial pivoting).

    Same conventions as `tridiax.solve_tridiagonal`: along `axis`, row i reads
    lower[i]*x[i-1] + diag[i]*x[i] + upper[i]*x[i+1] = rhs[i]; lower[0] and upper[-1] are
    ignored. Inputs broadcast.

    With `periodic=True`, the conventions of `tridiax.solve_periodic_tridiagonal`: lower[0]
    is the corner A[0, N-1] and upper[N-1] the corner A[N-1, 0]; N >= 3. Such a matrix is not
    banded: up to N = 512 each system is assembled densely and solved with `scipy.linalg.solve`
    (LAPACK gesv, partial pivoting); longer ones by the Woodbury identity, the two corners a
    rank-2 correction of the banded solve (three right-hand sides through solve_banded, then a
    2 x 2 solve), which needs the matrix without its corners to be nonsingular too.

    **Returns:** a NumPy array of the broadcast shape, in float64 (complex128 for complex input).
    """
    (lo, di, up, b), shape, axis = _systems((lower, diag, upper, rhs), axis)
    n = shape[axis]
    if periodic and n < 3:
        raise ValueError(f"a periodic system needs N >= 3, got N = {n}.")
    x = np.empty_like(b)
    rows = np.arange(n)
    for s in range(b.shape[0]):
        if periodic and n > _DENSE_PERIODIC:
            x[s] = _periodic_woodbury(lo[s], di[s], up[s], b[s])
            continue
        if periodic:
            a = np.zeros((n, n), dtype=b.dtype)
            a[rows, rows] = di[s]
            a[rows, (rows - 1) % n] = lo[s]
            a[rows, (rows + 1) % n] = up[s]
            x[s] = scipy.linalg.solve(a, b[s])
            continue
        x[s] = scipy.linalg.solve_banded((1, 1), _banded(lo[s], di[s], up[s]), b[s])
    moved = x.reshape(tuple(np.delete(shape, axis)) + (n,))
    return np.moveaxis(moved, -1, axis)


def relative_residual(lower, diag, upper, x, rhs, *, axis: int = -1) -> np.ndarray:
    r"""Normwise backward error of each system: $\|Ax - b\|_\infty / (\|A\|_\infty \|x\|_\infty + \|b\|_\infty)$.

    A value of a few machine epsilons means `x` solves a nearby system exactly. Computed in
    float64 in NumPy.

    **Returns:** a NumPy array of the broadcast shape without `axis` (one value per system).
    """
    (lo, di, up, xs, b), shape, axis = _systems((lower, diag, upper, x, rhs), axis)
    n = shape[axis]
    lo, up = lo.copy(), up.copy()
    lo[:, 0] = 0
    up[:, -1] = 0
    ax = di * xs
    ax[:, 1:] += lo[:, 1:] * xs[:, :-1]
    ax[:, :-1] += up[:, :-1] * xs[:, 1:]
    norm_a = np.max(np.abs(lo) + np.abs(di) + np.abs(up), axis=-1)
    inf = lambda v: np.max(np.abs(v), axis=-1)  # noqa: E731
    denom = norm_a * inf(xs) + inf(b)
    with np.errstate(invalid="ignore", divide="ignore"):
        res = inf(ax - b) / np.where(denom == 0, 1, denom)
    del n
    return res.reshape(tuple(np.delete(shape, axis)))


def reference_solve_banded(l_and_u, ab, b, *, axis: int = -1, hermitian: bool = False,
                           lower: bool = False) -> np.ndarray:
    """Solve every system with `scipy.linalg.solve_banded` (LAPACK gbsv, partial pivoting),
    or with `hermitian=True`, `scipy.linalg.solveh_banded` (LAPACK pbsv, banded Cholesky;
    `lower` as there, `l_and_u` ignored).

    Same conventions as `tridiax.solve_banded` / `tridiax.solveh_banded`: `ab` has the band
    index as its leading axis, ab[u + i - j, j] = A[i, j] along `axis`; an `ab` of shape
    (bands, N) is one matrix for every system; otherwise `ab[0]` broadcasts against `b`.
    A system scipy refuses (singular, or not positive definite) is NaN in the result.

    **Returns:** a NumPy array of the broadcast shape, in float64 (complex128 for complex input).
    """
    ab, b = np.asarray(ab), np.asarray(b)
    if ab.ndim < 2 or b.ndim < 1:
        raise ValueError("ab needs a band axis and a row axis; b needs a row axis.")
    axis = axis % b.ndim
    bands = ab.shape[0]
    band = ab.reshape(ab.shape[:2] + (1,) * (b.ndim - 1 - axis)) if ab.ndim == 2 else ab
    (b_s, *ab_s), shape, axis = _systems([b] + [band[k] for k in range(bands)], axis)
    x = np.empty_like(np.asarray(b_s, dtype=np.result_type(b_s, *ab_s)))
    n = shape[axis]
    offsets = np.arange(bands)[:, None] + np.arange(n)[None, :]  # k + j
    if hermitian:  # upper: i = j + k - u >= 0; lower: i = j + k < n
        inside = offsets >= bands - 1 if not lower else offsets < n
    else:  # i = j + k - u in [0, n)
        u = l_and_u[1]
        inside = (offsets - u >= 0) & (offsets - u < n)
    for s in range(x.shape[0]):
        # Entries outside the matrix are ignored (scipy's check_finite reads them anyway).
        matrix = np.where(inside, np.stack([a[s] for a in ab_s]), 0)
        try:
            if hermitian:
                x[s] = scipy.linalg.solveh_banded(matrix, b_s[s], lower=lower)
            else:
                x[s] = scipy.linalg.solve_banded(tuple(l_and_u), matrix, b_s[s])
        except np.linalg.LinAlgError:
            x[s] = np.nan
    moved = x.reshape(tuple(np.delete(shape, axis)) + (shape[axis],))
    return np.moveaxis(moved, -1, axis)


def reference_solve_block_tridiagonal(lower, diag, upper, rhs, *, axis: int = -1,
                                      method: str = "dense") -> np.ndarray:
    """Solve every block-tridiagonal system by assembling it: densely with `scipy.linalg.solve`
    (LAPACK gesv, partial pivoting across the whole matrix; `method="dense"`), or as a banded
    matrix with bandwidths (2k - 1, 2k - 1) with `scipy.linalg.solve_banded` (`method=
    "banded"`).

    Same conventions as `tridiax.solve_block_tridiagonal`: blocks (..., N, ..., k, k) with
    `axis` counted in the dimensions before the two block dimensions; block row i reads
    lower[i] x[i-1] + diag[i] x[i] + upper[i] x[i+1] = rhs[i], lower[0] and upper[N-1]
    ignored. `rhs` is read as (..., k) vectors when it has fewer dimensions than the blocks
    or its second-to-last size is not k, and as (..., k, m) matrices otherwise (tridiax's own
    rule differs only for shapes it would refuse or read by the blocks' rank). A singular
    system is NaN in the result.

    **Returns:** a NumPy array of the broadcast shape, in float64 (complex128 for complex input).
    """
    if method not in ("dense", "banded"):
        raise ValueError(f"method must be 'dense' or 'banded', got {method!r}")
    blocks = [np.asarray(v) for v in (lower, diag, upper)]
    b = np.asarray(rhs)
    k = blocks[1].shape[-1]
    rank = max(v.ndim for v in blocks)
    vectors = b.ndim < rank or b.ndim < 2 or b.shape[-2] != k
    if vectors:
        b = b[..., None]
    dtype = np.result_type(*blocks, b, np.float64)
    systems = np.broadcast_shapes(*(v.shape[:-2] for v in (*blocks, b)))
    axis = axis % len(systems)
    m = b.shape[-1]

    def flat(v, tail):  # (S, N, *tail): the systems flattened, the rows next
        v = np.broadcast_to(v, systems + tail).astype(dtype)
        v = np.moveaxis(v, axis, len(systems) - 1)
        return v.reshape((-1, systems[axis]) + tail)

    lo, di, up = (flat(v, (k, k)) for v in blocks)
    bs = flat(b, (k, m))
    n = systems[axis]
    x = np.empty_like(bs)
    for s in range(bs.shape[0]):
        a = np.zeros((n * k, n * k), dtype)
        for i in range(n):
            a[i * k:(i + 1) * k, i * k:(i + 1) * k] = di[s, i]
            if i > 0:
                a[i * k:(i + 1) * k, (i - 1) * k:i * k] = lo[s, i]
            if i < n - 1:
                a[i * k:(i + 1) * k, (i + 1) * k:(i + 2) * k] = up[s, i]
        rhs_s = bs[s].reshape(n * k, m)
        try:
            if method == "dense":
                solution = scipy.linalg.solve(a, rhs_s)
            else:
                w = 2 * k - 1
                ab = np.zeros((2 * w + 1, n * k), dtype)
                for d in range(-w, w + 1):  # ab[w + i - j, j] = A[i, j], d = i - j
                    j = np.arange(max(0, -d), min(n * k, n * k - d))
                    ab[w + d, j] = a[j + d, j]
                solution = scipy.linalg.solve_banded((w, w), ab, rhs_s)
        except (np.linalg.LinAlgError, ValueError):
            solution = np.full((n * k, m), np.nan, dtype)
        x[s] = solution.reshape(n, k, m)
    moved = x.reshape(tuple(np.delete(systems, axis)) + (n, k, m))
    out = np.moveaxis(moved, len(systems) - 1, axis)
    return out[..., 0] if vectors else out
