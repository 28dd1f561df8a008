"""Independent references for checking tridiax: SciPy's banded LAPACK solver, the sequential
Thomas sweep, and residuals.

Everything here runs in NumPy on the host: slow, simple and independent of the kernels it
checks. The SciPy references work in float64 (complex128 for complex input), one system at a
time; `sequential_solve` sweeps every system row after row in a precision of your choice (the
inputs' own, to measure what a solver loses against the plain sweep; a wider one, such as
`np.longdouble`, as the exact answer).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

__all__ = ["reference_solve", "reference_solve_banded", "reference_solve_block_tridiagonal",
           "relative_residual", "sequential_solve"]


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


def sequential_solve(lower, diag, upper, rhs, *, axis: int = -1, dtype=None,
                     periodic: bool = False, pivoting: bool = False) -> np.ndarray:
    r"""Solve every system by the plain sequential sweep, row after row, every operation
    rounded in `dtype`: the accuracy every tridiax solve is measured against.

    Same conventions as `tridiax.solve_tridiagonal` (`tridiax.solve_periodic_tridiagonal`
    with `periodic=True`). Without pivoting, the Thomas algorithm in its textbook form, which
    divides by each pivot (LAPACK's gtsv computes the same when it exchanges no rows):

        p[i] = diag[i] - lower[i] c[i-1],  c[i] = upper[i] / p[i],
        y[i] = (rhs[i] - lower[i] y[i-1]) / p[i],  x[i] = y[i] - c[i] x[i+1].

    With `pivoting=True`, Gaussian elimination with partial pivoting in LAPACK gtsv's order
    (the larger of |pending pivot| and |lower[i+1]| is the pivot; |Re| + |Im| for complex).
    Periodic systems by Sherman-Morrison, A = T' + u v^T, with the split of
    `tridiax.solve_periodic_tridiagonal` (gamma = -sign(d[0]) max(|d[0]|, |A[0, N-1]|,
    |A[0, 1]|)), T' eliminated by the same sweep for b and u.

    **Arguments:**

    - `lower`, `diag`, `upper`, `rhs`: broadcast together; the systems lie along `axis`.
    - `dtype`: the precision of every operation (default: the inputs' common dtype, at least
      float32). A wider dtype (`np.longdouble`, `np.clongdouble`) gives a reference for the
      error of float64 solves.
    - `periodic`, `pivoting`: as in tridiax.

    **Returns:** a NumPy array of the broadcast shape in `dtype`.
    """
    arrays = [np.asarray(a) for a in (lower, diag, upper, rhs)]
    if dtype is None:
        dtype = np.result_type(*arrays, np.float32)
    dtype = np.dtype(dtype)
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    if not shape:
        raise ValueError("inputs are 0-d; a tridiagonal system needs an axis to lie along.")
    axis = axis % len(shape)
    lo, di, up, b = (np.moveaxis(np.broadcast_to(a, shape), axis, -1).astype(dtype)
                     for a in arrays)
    n = shape[axis]
    if periodic and n < 3:
        raise ValueError(f"a periodic system needs N >= 3, got N = {n}.")
    sweep = _pivoted_sweep if pivoting else _thomas_sweep
    if not periodic:
        x = sweep(lo, di, up, [b])[0]
    else:
        x = _sherman_morrison(lo, di, up, b, sweep)
    return np.moveaxis(x, -1, axis)


def _thomas_sweep(lo, di, up, rhs_list):
    """The dividing Thomas sweep along the last axis for several right-hand sides."""
    n = di.shape[-1]
    c = np.empty(np.broadcast_shapes(lo.shape, di.shape, up.shape), di.dtype)
    ys = [np.empty(np.broadcast_shapes(c.shape, r.shape), di.dtype) for r in rhs_list]
    pivot = di[..., 0]
    c[..., 0] = up[..., 0] / pivot if n > 1 else 0
    for y, r in zip(ys, rhs_list):
        y[..., 0] = r[..., 0] / pivot
    for i in range(1, n):
        pivot = di[..., i] - lo[..., i] * c[..., i - 1]
        c[..., i] = up[..., i] / pivot if i < n - 1 else 0
        for y, r in zip(ys, rhs_list):
            y[..., i] = (r[..., i] - lo[..., i] * y[..., i - 1]) / pivot
    for y in ys:
        for i in range(n - 2, -1, -1):
            y[..., i] = y[..., i] - c[..., i] * y[..., i + 1]
    return ys


def _size(v):
    """LAPACK's pivot measure: |v|, |Re v| + |Im v| for complex v."""
    return np.abs(v.real) + np.abs(v.imag) if np.iscomplexobj(v) else np.abs(v)


def _pivoted_sweep(lo, di, up, rhs_list):
    """Gaussian elimination with partial pivoting in LAPACK gtsv's order, several right-hand
    sides, along the last axis."""
    n = di.shape[-1]
    shape = np.broadcast_shapes(lo.shape, di.shape, up.shape)
    zero = np.zeros(shape[:-1], di.dtype)
    pivots, u1, u2 = (np.empty(shape, di.dtype) for _ in range(3))
    ys = [np.empty(np.broadcast_shapes(shape, r.shape), di.dtype) for r in rhs_list]
    pa = np.broadcast_to(di[..., 0], shape[:-1]).copy()  # pending row: columns i, i+1 | rhs
    pc = np.broadcast_to(up[..., 0], shape[:-1]).copy() if n > 1 else zero
    pf = [np.broadcast_to(r[..., 0], y.shape[:-1]).copy() for r, y in zip(rhs_list, ys)]
    for i in range(n - 1):
        l, d = lo[..., i + 1], di[..., i + 1]
        u = up[..., i + 1] if i + 2 < n else zero
        swap = _size(l) > _size(pa)
        pivot = np.where(swap, l, pa)
        m = np.where(swap, pa, l) / pivot
        k1, k2 = np.where(swap, d, pc), np.where(swap, u, zero)
        o1, o2 = np.where(swap, pc, d), np.where(swap, zero, u)
        pivots[..., i], u1[..., i], u2[..., i] = pivot, k1, k2
        pa, pc = o1 - m * k1, o2 - m * k2
        for k, (r, y) in enumerate(zip(rhs_list, ys)):
            b = r[..., i + 1]
            y[..., i] = np.where(swap, b, pf[k])
            pf[k] = np.where(swap, pf[k], b) - m * y[..., i]
    for k, y in enumerate(ys):
        y[..., n - 1] = pf[k] / pa
        for i in range(n - 2, -1, -1):
            t = y[..., i] - u1[..., i] * y[..., i + 1]
            if i + 2 < n:
                t = t - u2[..., i] * y[..., i + 2]
            y[..., i] = t / pivots[..., i]
    return ys


def _sherman_morrison(lo, di, up, b, sweep):
    """Periodic systems: A = T' + u v^T, u = (gamma, 0, ..., beta), v = (1, 0, ...,
    alpha/gamma), T' the tridiagonal part with its ends changed."""
    n = di.shape[-1]
    alpha, beta, d0 = lo[..., 0], up[..., n - 1], di[..., 0]
    size = np.maximum(np.maximum(_size(d0), _size(alpha)), _size(up[..., 0]))
    mag = np.abs(d0)
    direction = np.where(mag > 0, d0 / np.where(mag > 0, mag, 1), 1)
    gamma = -(direction * size).astype(di.dtype)
    shape = np.broadcast_shapes(lo.shape, di.shape, up.shape)
    di = np.broadcast_to(di, shape).copy()
    di[..., 0] = d0 - gamma
    di[..., n - 1] = di[..., n - 1] - alpha * beta / gamma
    u = np.zeros(shape, di.dtype)
    u[..., 0], u[..., n - 1] = gamma, beta
    y, z = sweep(lo, di, up, [b, u])
    kappa = alpha / gamma
    f = (y[..., 0] + kappa * y[..., n - 1]) / (1 + z[..., 0] + kappa * z[..., n - 1])
    return y - f[..., None] * z


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
