"""The Thomas algorithm as a plain XLA program: the formulation run on CPU.

Same algorithm and the same band conventions as the Pallas kernel (`_tridiagonal/pallas_triton.py`), written
as two `fori_loop`s (never unrolled, so compile time does not grow with N) that read one row of
every operand per step and write rows of the eliminated coefficients in place.

Why this form: Pallas interpret mode with a grid carries every input through a while loop,
and `lax.scan` with stacked outputs copies what writing rows in place does not. For systems
along the last axis (Q small) rows are strided; there the systems are solved in chunks of a
few thousand, each chunk swapped into row-major order while it sits in cache, so every step
reads contiguous memory.
"""

from __future__ import annotations

import operator

import jax.numpy as jnp
from jax import Array, lax

from .._core.dtypes import compute_dtype
from .._core.layout import broadcast_shape
from .._core.split_complex import magnitude, select, zeros_like
from .periodic import sherman_morrison_factor, split


def _row(x: Array, i, axis: int, dtype) -> Array:
    """Row `i` of `x` along `axis`; an operand broadcast along the axis has only row 0."""
    if x.shape[axis] == 1:
        i = 0
    return lax.dynamic_index_in_dim(x, i, axis, keepdims=False).astype(dtype)


def sweep(l, d, u, b, *, axis: int, transposed: bool, out_dtype, kind: str = "thomas") -> Array:
    """Solve the systems lying along `axis` of the broadcast operands (kinds: `_pallas_thomas`).

    Row i reads sub[i]*x[i-1] + d[i]*x[i] + sup[i]*x[i+1] = b[i] with sub = l, sup = u, or,
    when `transposed`, the transposed matrix: sub[i] = u[i-1], sup[i] = l[i+1].
    """
    cdt = compute_dtype(out_dtype)
    full = broadcast_shape(l, d, u, b)
    n = full[axis]

    def row(x, i):
        return _row(x, i, axis, cdt)

    def sub(i):
        return row(u, i - 1) if transposed else row(l, i)

    def sup(i):
        return row(l, jnp.minimum(i + 1, n - 1)) if transposed else row(u, i)

    def put(buf, value, i):
        return lax.dynamic_update_index_in_dim(buf, value, i, axis)

    row_shape = full[:axis] + full[axis + 1 :]
    zeros = jnp.zeros(full, cdt)

    if kind == "pivoted":
        return _pivoted(row, sub, d, sup, b, put, n, zeros, row_shape).astype(out_dtype)

    if kind == "factored":
        # A = L D V: y[i] = b[i] - l[i]*y[i-1], x[i] = m[i]*y[i] - c'[i]*x[i+1].
        ybuf = put(zeros, jnp.broadcast_to(row(b, 0), row_shape), 0)
        ybuf = lax.fori_loop(
            1, n, lambda i, y: put(y, row(b, i) - sub(i) * row(y, i - 1), i), ybuf)
        ybuf = put(ybuf, row(d, n - 1) * row(ybuf, n - 1), n - 1)

        def back(k, y):
            i = n - 2 - k
            return put(y, row(d, i) * row(y, i) - sup(i) * row(y, i + 1), i)

        return lax.fori_loop(0, n - 1, back, ybuf).astype(out_dtype)

    periodic = kind == "periodic"
    # The dividing sweep (`verify.sequential_solve`'s order): p[i] = d[i] - a[i]*c'[i-1],
    # c'[i] = u[i] / p[i], y'[i] = (b[i] - a[i]*y'[i-1]) / p[i]; no reciprocal of the pivot.
    p0 = row(d, 0)
    if periodic:
        # Sherman-Morrison (`_tridiagonal/periodic.py`), corners alpha = A[0, N-1], beta = A[N-1, 0]:
        # z' = T'^{-1}(gamma, 0, ..., 0, beta) rides along the same sweep.
        lo0, upn = row(l, 0), row(u, n - 1)
        alpha, beta = (upn, lo0) if transposed else (lo0, upn)
        gamma = split(p0, alpha, sup(0))
        corr = -alpha * beta / gamma
        p0 = p0 - gamma
    cbuf = put(zeros, jnp.broadcast_to(sup(0) / p0, row_shape), 0)
    ybuf = put(zeros, jnp.broadcast_to(row(b, 0) / p0, row_shape), 0)
    if n == 1:
        return ybuf.astype(out_dtype)
    bufs = (cbuf, ybuf)
    if periodic:
        bufs += (put(zeros, jnp.broadcast_to(gamma / p0, row_shape), 0),)

    # Forward elimination. The previous row's c' and y' (and z') ride in the carry, so that
    # each buffer's in-place update reads nothing of the buffer it writes: read back from the
    # buffers, the pivot shared by the updates (division keeps XLA from duplicating it into
    # each) made XLA copy a whole buffer every row.
    def forward(i, state):
        prev, bufs = state
        a, diag = sub(i), row(d, i)
        if periodic:
            last = (i == n - 1).astype(cdt)
            diag = diag + last * corr  # d'[N-1] = d[N-1] - alpha*beta/gamma
        p = diag - a * prev[0]
        rows = [sup(i) / p, (row(b, i) - a * prev[1]) / p]
        if periodic:
            rows.append((last * beta - a * prev[2]) / p)
        rows = [jnp.broadcast_to(r, row_shape) for r in rows]
        return tuple(rows), tuple(put(buf, r, i) for buf, r in zip(bufs, rows, strict=True))

    first = tuple(row(buf, 0) for buf in bufs)
    cbuf, *vecs = lax.fori_loop(1, n, forward, (first, bufs))[1]

    # Back substitution, in place in the y (and z) buffers.
    def backward(k, vecs):
        i = n - 2 - k
        c = row(cbuf, i)
        return [put(v, row(v, i) - c * row(v, i + 1), i) for v in vecs]

    vecs = lax.fori_loop(0, n - 1, backward, vecs)
    if not periodic:
        return vecs[0].astype(out_dtype)
    y, z = vecs
    y0, yl = lax.slice_in_dim(y, 0, 1, axis=axis), lax.slice_in_dim(y, n - 1, n, axis=axis)
    z0, zl = lax.slice_in_dim(z, 0, 1, axis=axis), lax.slice_in_dim(z, n - 1, n, axis=axis)
    f = sherman_morrison_factor(y0, yl, z0, zl, jnp.expand_dims(alpha, axis),
                                jnp.expand_dims(gamma, axis))
    return (y - f * z).astype(out_dtype)


def pivot_step(pending, l, d, un, b, divide=operator.truediv):
    """One step of elimination with partial pivoting, in LAPACK gtsv's order
    (`verify.sequential_solve(..., pivoting=True)`).

    `pending` = (a, c, f, ...): the pending row's entries in columns i, i+1 and its right-hand
    sides; (l, d, un | b): row i+1 of A (un = 0 past the matrix), `b` one right-hand side or a
    tuple of as many as `pending` holds. The multiplier is a quotient, m = (swap ? a : l) /
    pivot. Returns U's row i as (pivot, U1, U2, y, ...) (back substitution divides by the
    pivot) and the next pending row. `divide(x, y)`: the division to use (a kernel's own,
    `_pallas_tiles.TileRows.divide`)."""
    a, c, *f = pending
    b = b if isinstance(b, tuple) else (b,)
    swap = magnitude(l) > magnitude(a)
    pivot = select(swap, l, a)
    m = divide(select(swap, a, l), pivot)
    zero = zeros_like(un)
    kept = (select(swap, d, c), select(swap, un, zero),
            *(select(swap, bk, fk) for bk, fk in zip(b, f, strict=True)))
    other = (select(swap, c, d), select(swap, zero, un),
             *(select(swap, fk, bk) for bk, fk in zip(b, f, strict=True)))
    return (pivot, *kept), tuple(o - m * k for o, k in zip(other, kept, strict=True))


def _pivoted(row, sub, d, sup, b, put, n, zeros, row_shape):
    """Gaussian elimination with partial pivoting along the axis (kind "pivoted")."""

    def full(x):
        return jnp.broadcast_to(x, row_shape)

    zero = jnp.zeros(row_shape, zeros.dtype)
    pending = tuple(full(v) for v in (row(d, 0), sup(0) if n > 1 else zero, row(b, 0)))

    def forward(i, state):
        pending, stores = state
        un = jnp.where(i + 2 < n, sup(i + 1), 0)  # sup(N-1) lies outside the matrix
        kept, pending = pivot_step(pending, sub(i + 1), row(d, i + 1), un, row(b, i + 1))
        return tuple(full(v) for v in pending), tuple(
            put(buf, full(v), i) for buf, v in zip(stores, kept, strict=True))

    pending, (pivot, u1, u2, y) = lax.fori_loop(0, n - 1, forward, (pending, (zeros,) * 4))
    a, _, f = pending
    x_last = f / a

    def backward(k, state):
        i = n - 2 - k
        x1, x2, y = state
        x = (row(y, i) - row(u1, i) * x1 - row(u2, i) * x2) / row(pivot, i)
        return x, x1, put(y, x, i)

    return lax.fori_loop(0, n - 1, backward, (x_last, zero, put(y, x_last, n - 1)))[2]


def factor_sweep(l, d, u, *, axis: int, out_dtype) -> tuple[Array, Array, Array]:
    """The stored factors A = L D V of the systems along `axis`: (l, m, c') with pivots
    p[i] = d[i] - lower[i]*c'[i-1] (p[0] = d[0]), c'[i] = upper[i] / p[i] (V's
    super-diagonal, c'[N-1] = 0: the dividing sweep's quotients), m[i] = 1/p[i] and
    l[i] = lower[i] / p[i-1] (L's sub-diagonal, l[0] = 0): the Thomas forward elimination
    without a right-hand side. Returns three arrays of the broadcast shape."""
    cdt = compute_dtype(out_dtype)
    full = broadcast_shape(l, d, u)
    n = full[axis]
    row_shape = full[:axis] + full[axis + 1 :]

    def row(x, i):
        return _row(x, i, axis, cdt)

    def put(buf, value, i):
        return lax.dynamic_update_index_in_dim(buf, jnp.broadcast_to(value, row_shape), i, axis)

    zeros = jnp.zeros(full, cdt)
    p0 = jnp.broadcast_to(row(d, 0), row_shape)
    c0 = row(u, 0) / p0 if n > 1 else jnp.zeros(row_shape, cdt)
    bufs = (zeros, put(zeros, 1 / p0, 0), put(zeros, c0, 0))

    # The previous pivot and c' ride in the carry: no buffer's in-place update reads the
    # buffer it writes (read back, XLA copied a whole buffer every row).
    def forward(i, state):
        (p_prev, c_prev), (lbuf, mbuf, cbuf) = state
        a = row(l, i)
        p = jnp.broadcast_to(row(d, i) - a * c_prev, row_shape)
        c = jnp.where(i < n - 1, row(u, i) / p, jnp.zeros((), cdt))
        return (p, c), (put(lbuf, a / p_prev, i), put(mbuf, 1 / p, i), put(cbuf, c, i))

    _, factors = lax.fori_loop(1, n, forward, ((p0, jnp.broadcast_to(c0, row_shape)), bufs))
    return tuple(x.astype(out_dtype) for x in factors)


# Below this many values per row group (Q), rows along axis 1 of (P, N, Q) are strided
# gathers; chunks of systems are swapped into row-major order in cache instead.
_STRIDED_ROW_LIMIT = 16
# Values per chunk row for the chunked path: a chunk of 100 rows then fits in L2.
_CHUNK_VALUES = 2048


def _by_chunks(fn, operands, n_outputs: int, dtype):
    """Run `fn(*operands, axis) -> n_outputs arrays of dtype` over (P|1, N|1, Q|1) operands.

    For Q >= _STRIDED_ROW_LIMIT rows are contiguous and `fn` runs along axis 1 directly.
    Otherwise chunks of systems are swapped into row-major order in cache.
    """
    P, N, Q = broadcast_shape(*operands)
    if Q >= _STRIDED_ROW_LIMIT or P == 1:
        return fn(*operands, axis=1)

    width = max(1, min(P, _CHUNK_VALUES // Q))
    n_chunks = -(-P // width)

    def chunk(x, start):
        if x.shape[0] == 1:
            return jnp.swapaxes(x, 0, 1)
        return jnp.swapaxes(lax.dynamic_slice_in_dim(x, start, width, 0), 0, 1)

    def body(k, outs):
        # The last chunk overlaps the one before when P % width != 0; it recomputes and
        # rewrites identical values, which keeps every slice in bounds.
        start = jnp.minimum(k * width, P - width)
        results = fn(*(chunk(v, start) for v in operands), axis=0)
        return tuple(lax.dynamic_update_slice_in_dim(out, jnp.swapaxes(x, 0, 1), start, 0)
                     for out, x in zip(outs, results, strict=True))

    init = tuple(jnp.zeros((P, N, Q), dtype) for _ in range(n_outputs))
    return lax.fori_loop(0, n_chunks, body, init)


def solve_pnq(l, d, u, b, *, transposed: bool, out_dtype, kind: str = "thomas") -> Array:
    """Solve along axis 1 of (P|1, N|1, Q|1) operands; returns (P, N, Q)."""

    def solve(*operands, axis):
        x = sweep(*operands, axis=axis, transposed=transposed, out_dtype=out_dtype, kind=kind)
        return (x,)

    return _by_chunks(solve, (l, d, u, b), 1, out_dtype)[0]


def factor_pnq(l, d, u, *, out_dtype) -> tuple[Array, Array, Array]:
    """`factor_sweep` along axis 1 of (P|1, N|1, Q|1) bands; three (P, N, Q) arrays."""

    def factor(*bands, axis):
        return factor_sweep(*bands, axis=axis, out_dtype=out_dtype)

    return _by_chunks(factor, (l, d, u), 3, out_dtype)
