"""Banded Gaussian elimination as a plain XLA program: the formulation every platform can run.

One algorithm for every backend (the native and Pallas kernels follow it step for step):
the elimination walks down the system with a window of the rows it has not finished,

    W[r, c] = row (j + r) of the matrix, column (j + c),   r = 0..lo,  c = 0..lo + up,

(lo, up: the lower and upper bandwidths of the matrix solved, swapped when `transposed`).
Step j optionally swaps row 0 with the row of largest |W[r, 0]| (|Re| + |Im| for complex,
first of equals: LAPACK's gbtrf), keeps row 0 as row j of U (with 1/pivot in place of the
pivot), subtracts multiples of it from rows 1..lo, shifts the window up and left, and loads
row j + lo + 1 into its last row. Row interchanges can fill in lo more superdiagonals, which is
why rows have lo + up + 1 columns; without pivoting, U keeps up + 1 of them. The back
substitution then walks up with a window of the lo + up solution values below row j.

A row of the matrix is read straight from scipy's layout, ab[u + i - j, j] = A[i, j]: row i
of A is ab[u - d, i + d] for d = -l..u, and row i of A^T (column i of A) is ab[u + d, i] for
d = -u..l. Entries of `ab` outside the matrix are never used, whatever they hold.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array, lax

from .._core.dtypes import compute_dtype
from .._core.split_complex import magnitude

KINDS = ("banded", "banded_pivoted", "banded_hermitian")


def check_operands(ab, b, *, l: int, u: int, kind: str, stored=None) -> None:
    """ValueError for a kind, or `ab` and `b` shapes, that the (P, N, Q) kernels do not take
    (`stored`: "upper"/"lower" for the u + 1 bands of one triangle of a Hermitian matrix)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if stored not in (None, "upper", "lower"):
        raise ValueError(f"stored must be None, 'upper' or 'lower', got {stored!r}")
    if stored is not None and (kind != "banded_hermitian" or l != u):
        raise ValueError(f"a stored triangle is a Hermitian matrix (kind 'banded_hermitian', "
                         f"l = u), got kind {kind!r}, l={l}, u={u}")
    K = u + 1 if stored else l + u + 1
    if ab.ndim != 4 or ab.shape[0] != K:
        raise ValueError(f"ab must be ({K}, P|1, N|1, Q|1) for l={l}, u={u}, got {ab.shape}")
    for size, full_size in zip(ab.shape[1:], b.shape, strict=True):
        if size not in (1, full_size):
            raise ValueError(f"ab {ab.shape} does not broadcast against b {b.shape}")


def solve_pnq(ab: Array, b: Array, *, l: int, u: int, kind: str, transposed: bool,
              out_dtype) -> Array:
    """Solve A x = b (A^T x = b when `transposed`) for every system along axis 1.

    `ab`: (l + u + 1, P|1, N|1, Q|1) bands in scipy's layout along axis 2; `b`: (P, N, Q).
    `kind`: "banded" (no pivoting), "banded_pivoted" (partial pivoting) or "banded_hermitian"
    (no pivoting, and a pivot whose real part is not positive, i.e. a matrix that is not
    positive definite, makes that system NaN). Returns x, (P, N, Q) of `out_dtype`.
    """
    cdt = compute_dtype(out_dtype)
    ubuf, ybuf, _, _ = _eliminate(ab.astype(cdt), b.astype(cdt), l=l, u=u, kind=kind,
                                  transposed=transposed, record=False)
    return _back_substitute(ubuf, ybuf).astype(out_dtype)


def factor_pnq(ab: Array, *, l: int, u: int, kind: str, shape: tuple[int, int, int],
               out_dtype) -> tuple[Array, Array, Array]:
    """The factors of every (P, N, Q) system's A (as LAPACK's gbtrf, pivots interleaved):
    `u_rows` (kept, P, N, Q): row j of U with 1/pivot first; `multipliers` (l, P, N, Q): the
    multiples of row j subtracted from rows j + 1..j + l; `pivots` (P, N, Q) int32: the row
    j + pivots[j] swapped with row j before step j (zeros without pivoting)."""
    cdt = compute_dtype(out_dtype)
    ubuf, _, mbuf, pbuf = _eliminate(ab.astype(cdt), jnp.zeros(shape, cdt), l=l, u=u, kind=kind,
                                     transposed=False, record=True)
    return ubuf, mbuf, pbuf


def factored_solve_pnq(u_rows: Array, multipliers: Array, pivots: Array, b: Array, *,
                       transposed: bool, out_dtype) -> Array:
    """Solve A x = b (or A^T x = b) with `factor_pnq`'s factors; b: (P, N, Q)."""
    cdt = compute_dtype(out_dtype)
    b = b.astype(cdt)
    lo = multipliers.shape[0]
    P, N, Q = b.shape
    if not transposed:
        v = jnp.concatenate([b, jnp.zeros((P, lo, Q), cdt)], axis=1)

        def forward(j, v):
            rows = lax.dynamic_slice_in_dim(v, j, lo + 1, axis=1)  # (P, lo + 1, Q)
            rows = _swap(rows, lax.dynamic_index_in_dim(pivots, j, 1, keepdims=False), axis=1)
            m = lax.dynamic_index_in_dim(multipliers, j, 2, keepdims=False)  # (lo, P, Q)
            head = rows[:, 0]
            rows = rows.at[:, 1:].add(-jnp.moveaxis(m, 0, 1) * head[:, None])
            return lax.dynamic_update_slice_in_dim(v, rows, j, axis=1)

        y = lax.fori_loop(0, N, forward, v)[:, :N]
        return _back_substitute(u_rows, y).astype(out_dtype)
    kept = u_rows.shape[0]
    # U^T z = b, forward: z[j] = (b[j] - sum_c U[j - c, c] z[j - c]) / U[j, 0].
    upad = jnp.pad(u_rows.astype(cdt), [(0, 0), (0, 0), (kept - 1, 0), (0, 0)])
    zpad = jnp.zeros((P, N + kept - 1, Q), cdt)

    def lower_solve(j, z):
        total = lax.dynamic_index_in_dim(b, j, 1, keepdims=False)
        for c in range(1, kept):
            coefficient = lax.dynamic_index_in_dim(upad[c], j + kept - 1 - c, 1, keepdims=False)
            total = total - coefficient * lax.dynamic_index_in_dim(z, j + kept - 1 - c, 1,
                                                                   keepdims=False)
        inverse = lax.dynamic_index_in_dim(upad[0], j + kept - 1, 1, keepdims=False)
        return lax.dynamic_update_index_in_dim(z, total * inverse, j + kept - 1, 1)

    z = lax.fori_loop(0, N, lower_solve, zpad)[:, kept - 1:]
    v = jnp.concatenate([z, jnp.zeros((P, lo, Q), cdt)], axis=1)

    def backward(k, v):  # the transposed row operations, last first
        j = N - 1 - k
        rows = lax.dynamic_slice_in_dim(v, j, lo + 1, axis=1)
        m = lax.dynamic_index_in_dim(multipliers, j, 2, keepdims=False)
        head = rows[:, 0] - jnp.sum(jnp.moveaxis(m, 0, 1) * rows[:, 1:], axis=1)
        rows = _swap(rows.at[:, 0].set(head),
                     lax.dynamic_index_in_dim(pivots, j, 1, keepdims=False), axis=1)
        return lax.dynamic_update_slice_in_dim(v, rows, j, axis=1)

    return lax.fori_loop(0, N, backward, v)[:, :N].astype(out_dtype)


def _swap(rows: Array, p: Array, *, axis: int) -> Array:
    """`rows` with entry 0 and entry p (per lane) exchanged along `axis` (selects only)."""
    index = jnp.expand_dims(p, axis)
    chosen = jnp.take_along_axis(rows, index, axis=axis)
    first = lax.index_in_dim(rows, 0, axis)
    positions = lax.broadcasted_iota(jnp.int32, rows.shape, axis)
    out = jnp.where(positions == index, first, rows)
    return jnp.where(positions == 0, chosen, out)


def _eliminate(ab, b, *, l, u, kind, transposed, record):
    """The forward elimination (module docstring): U rows and the eliminated right-hand side,
    and with `record`, the multipliers and pivots."""
    cdt = b.dtype
    P, N, Q = b.shape
    lo, up = (u, l) if transposed else (l, u)
    R, width = lo + 1, lo + up + 1
    pivoting, hermitian = kind == "banded_pivoted", kind == "banded_hermitian"
    kept = width if pivoting else up + 1  # columns of U that can be nonzero

    def entry(i, d: int) -> Array:
        """A[i, i + d] of the matrix solved (zero outside it), shape (P, Q)."""
        k, col = (u + d, i) if transposed else (u - d, i + d)
        valid = (i >= 0) & (i < N) & (i + d >= 0) & (i + d < N)  # both ends of A[i, i + d]
        band = ab[k]
        index = 0 if band.shape[1] == 1 else jnp.clip(col, 0, N - 1)
        value = lax.dynamic_index_in_dim(band, index, 1, keepdims=False)
        return jnp.where(valid, jnp.broadcast_to(value, (P, Q)), 0)

    def rhs(i) -> Array:
        value = lax.dynamic_index_in_dim(b, jnp.clip(i, 0, N - 1), 1, keepdims=False)
        return jnp.where(i < N, value, 0)

    def load(i, shift: int = lo) -> Array:
        """Row i at columns i - shift .. i - shift + width - 1, as a (width, P, Q) window row."""
        zero = jnp.zeros((P, Q), cdt)
        return jnp.stack([entry(i, c - shift) if -lo <= c - shift <= up else zero
                          for c in range(width)])

    window = jnp.stack([load(r, shift=r) for r in range(R)])  # (R, width, P, Q)
    values = jnp.stack([rhs(r) for r in range(R)])  # (R, P, Q)

    def forward(j, state):
        window, values, ubuf, ybuf, mbuf, pbuf = state
        if pivoting and R > 1:
            p = jnp.argmax(magnitude(window[:, 0]), axis=0).astype(jnp.int32)  # first of equals
            window = _swap(window, p[None], axis=0)
            values = _swap(values, p, axis=0)
            if record:
                pbuf = lax.dynamic_update_index_in_dim(pbuf, p, j, 1)
        pivot = window[0, 0]
        if hermitian:
            pivot = jnp.where(pivot.real > 0, pivot, jnp.nan)
        inverse = 1 / pivot
        head = window[0, 1:]
        multipliers = window[1:, 0] * inverse  # (R - 1, P, Q)
        rest = window[1:, 1:] - multipliers[:, None] * head[None]
        rest_values = values[1:] - multipliers * values[0]
        urow = jnp.concatenate([inverse[None], head[: kept - 1]])
        ubuf = lax.dynamic_update_index_in_dim(ubuf, urow, j, 2)
        ybuf = lax.dynamic_update_index_in_dim(ybuf, values[0], j, 1)
        if record:
            mbuf = lax.dynamic_update_index_in_dim(mbuf, multipliers, j, 2)
        incoming = j + lo + 1
        rest = jnp.concatenate([rest, jnp.zeros((R - 1, 1, P, Q), cdt)], axis=1)
        window = jnp.concatenate([rest, load(incoming)[None]])
        values = jnp.concatenate([rest_values, rhs(incoming)[None]])
        return window, values, ubuf, ybuf, mbuf, pbuf

    state = (window, values, jnp.zeros((kept, P, N, Q), cdt), jnp.zeros((P, N, Q), cdt),
             jnp.zeros((lo if record else 0, P, N, Q), cdt),
             jnp.zeros((P, N, Q) if record else (0,), jnp.int32))
    _, _, ubuf, ybuf, mbuf, pbuf = lax.fori_loop(0, N, forward, state)
    return ubuf, ybuf, mbuf, pbuf


def _back_substitute(ubuf: Array, ybuf: Array) -> Array:
    """x[j] = (y[j] - sum_c U[j, c] x[j + c]) / U[j, 0], last row first (1/pivot stored)."""
    kept = ubuf.shape[0]
    P, N, Q = ybuf.shape

    def backward(k, state):
        below, xbuf = state  # below[c] = x[j + 1 + c]
        j = N - 1 - k
        urow = lax.dynamic_index_in_dim(ubuf, j, 2, keepdims=False)  # (kept, P, Q)
        y = lax.dynamic_index_in_dim(ybuf, j, 1, keepdims=False)
        x = (y - jnp.sum(urow[1:] * below, axis=0)) * urow[0]
        below = jnp.concatenate([x[None], below])[: kept - 1]
        return below, lax.dynamic_update_index_in_dim(xbuf, x, j, 1)

    below = jnp.zeros((kept - 1, P, Q), ybuf.dtype)
    return lax.fori_loop(0, N, backward, (below, jnp.zeros_like(ybuf)))[1]
