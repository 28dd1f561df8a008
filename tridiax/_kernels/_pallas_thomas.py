"""The Thomas algorithm as one Pallas kernel over the (P, N, Q) view (tiles: `_pallas_tiles.py`).

Each program walks the N rows of its tile of systems: the forward elimination stores the
eliminated super-diagonal c' and right-hand side y' one row at a time, then the back
substitution reads them back in reverse and writes x. Triton has no scratch memory, so c'
(and y' for half precision, which is eliminated in float32) are extra outputs that the
launcher drops.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from .._dtypes import compute_dtype
from .._layout import broadcast_shape
from ._pallas_tiles import TileRows, launch


def _thomas_kernel(l_ref, d_ref, u_ref, b_ref, x_ref, c_ref, *scratch, n, transposed, tiles, P, Q):
    y_ref = scratch[0] if scratch else x_ref
    rows = TileRows(P, Q, tiles, c_ref.dtype)
    load, store = rows.load, rows.store

    def sub(i):
        return load(u_ref, i - 1) if transposed else load(l_ref, i)

    def sup(i):
        return load(l_ref, jnp.minimum(i + 1, n - 1)) if transposed else load(u_ref, i)

    r0 = 1 / load(d_ref, 0)
    c0 = sup(0) * r0
    y0 = load(b_ref, 0) * r0
    store(c_ref, 0, c0)
    store(y_ref, 0, y0)

    def forward(i, carry):
        c_prev, y_prev = carry
        a = sub(i)
        r = 1 / (load(d_ref, i) - a * c_prev)
        c = sup(i) * r
        y = (load(b_ref, i) - a * y_prev) * r
        store(c_ref, i, c)
        store(y_ref, i, y)
        return rows.full(c), rows.full(y)

    _, x_last = lax.fori_loop(1, n, forward, (rows.full(c0), rows.full(y0)))
    if scratch:
        store(x_ref, n - 1, x_last)

    def backward(k, x_next):
        i = n - 2 - k
        x = load(y_ref, i) - load(c_ref, i) * x_next
        store(x_ref, i, x)
        return x

    lax.fori_loop(0, n - 1, backward, x_last)


def solve_pnq(l, d, u, b, *, transposed: bool, out_dtype, interpret: bool = False, tiles=None,
              compiler_params=None):
    """Solve along axis 1 of (P|1, N|1, Q|1) operands with the Pallas kernel; returns (P, N, Q)."""
    N = broadcast_shape(l, d, u, b)[1]
    cdt = compute_dtype(out_dtype)
    outs = [(N, out_dtype), (N, cdt)]
    if jnp.dtype(cdt) != jnp.dtype(out_dtype):
        outs.append((N, cdt))
    kernel = functools.partial(_thomas_kernel, n=N, transposed=transposed)
    return launch(kernel, (l, d, u, b), outs, name="tridiax_thomas", interpret=interpret,
                  tiles=tiles, compiler_params=compiler_params)[0]
