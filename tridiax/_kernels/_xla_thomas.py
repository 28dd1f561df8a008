"""The Thomas algorithm as a plain XLA program: the formulation run on CPU.

Same algorithm and the same band conventions as the Pallas kernel (`_pallas_thomas.py`), written
as two `fori_loop`s (never unrolled, so compile time does not grow with N) that read one row of
every operand per step and write rows of the eliminated coefficients in place.

Measured on the 2-core CPU machines (benchmarks/README.md): Pallas interpret mode with a grid
carries every input through a while loop and was 2-3x slower, and `lax.scan` with stacked
outputs was slower than writing rows in place. For systems along the last axis (Q small) rows
are strided; there the systems are solved in chunks of a few thousand, each chunk swapped into
row-major order while it sits in cache, which was 3-5x faster than strided rows.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array, lax

from .._dtypes import compute_dtype
from .._layout import broadcast_shape


def _row(x: Array, i, axis: int, dtype) -> Array:
    """Row `i` of `x` along `axis`; an operand broadcast along the axis has only row 0."""
    if x.shape[axis] == 1:
        i = 0
    return lax.dynamic_index_in_dim(x, i, axis, keepdims=False).astype(dtype)


def sweep(l, d, u, b, *, axis: int, transposed: bool, out_dtype) -> Array:
    """Solve the tridiagonal systems lying along `axis` of the broadcast operands.

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

    row_shape = full[:axis] + full[axis + 1 :]
    r0 = 1 / row(d, 0)
    c0 = jnp.broadcast_to(sup(0) * r0, row_shape)
    y0 = jnp.broadcast_to(row(b, 0) * r0, row_shape)
    if n == 1:
        return jnp.expand_dims(y0, axis).astype(out_dtype)

    def put(buf, value, i):
        return lax.dynamic_update_index_in_dim(buf, value, i, axis)

    zeros = jnp.zeros(full, cdt)
    cbuf, ybuf = put(zeros, c0, 0), put(zeros, y0, 0)

    # Forward elimination. The previous row is read back from the buffers rather than carried:
    # XLA then fuses each row's arithmetic into its in-place update (measured ~15% faster).
    def forward(i, bufs):
        cbuf, ybuf = bufs
        a = sub(i)
        r = 1 / (row(d, i) - a * row(cbuf, i - 1))
        cbuf = put(cbuf, sup(i) * r, i)
        ybuf = put(ybuf, (row(b, i) - a * row(ybuf, i - 1)) * r, i)
        return cbuf, ybuf

    cbuf, ybuf = lax.fori_loop(1, n, forward, (cbuf, ybuf))

    # Back substitution, in place in the y buffer.
    def backward(k, ybuf):
        i = n - 2 - k
        return put(ybuf, row(ybuf, i) - row(cbuf, i) * row(ybuf, i + 1), i)

    x = lax.fori_loop(0, n - 1, backward, ybuf)
    return x.astype(out_dtype)


# Below this many values per row group (Q), rows along axis 1 of (P, N, Q) are strided
# gathers; chunks of systems are swapped into row-major order in cache instead.
_STRIDED_ROW_LIMIT = 16
# Values per chunk row for the chunked path: a chunk of 100 rows then fits in L2.
_CHUNK_VALUES = 2048


def solve_pnq(l, d, u, b, *, transposed: bool, out_dtype) -> Array:
    """Solve along axis 1 of (P|1, N|1, Q|1) operands; returns (P, N, Q)."""
    P, N, Q = broadcast_shape(l, d, u, b)
    if Q >= _STRIDED_ROW_LIMIT or P == 1:
        return sweep(l, d, u, b, axis=1, transposed=transposed, out_dtype=out_dtype)

    width = max(1, min(P, _CHUNK_VALUES // Q))
    n_chunks = -(-P // width)

    def chunk(x, start):
        if x.shape[0] == 1:
            return jnp.swapaxes(x, 0, 1)
        return jnp.swapaxes(lax.dynamic_slice_in_dim(x, start, width, 0), 0, 1)

    def body(k, out):
        # The last chunk overlaps the one before when P % width != 0; it recomputes and
        # rewrites identical values, which keeps every slice in bounds.
        start = jnp.minimum(k * width, P - width)
        x = sweep(*(chunk(v, start) for v in (l, d, u, b)), axis=0, transposed=transposed,
                  out_dtype=out_dtype)
        return lax.dynamic_update_slice_in_dim(out, jnp.swapaxes(x, 0, 1), start, 0)

    return lax.fori_loop(0, n_chunks, body, jnp.zeros((P, N, Q), out_dtype))
