"""Elementwise recurrences h[t] = act(a[t]*h[t-1] + x[t]) as one Pallas kernel.

Same tiles as the Thomas kernel (`_pallas/tiles.py`): a program owns a (bp, bq) tile of
feature columns of the (P, T, Q) view and walks the T steps, keeping the state in registers
and writing each row of h (or only the last state when `final_only`).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from .._core.dtypes import compute_dtype
from .._core.layout import broadcast_shape
from .._core.split_complex import select
from .._pallas import row_tiles as _pallas_rows
from .._pallas.tiles import TileRows, launch


def _recurrence_kernel(a_ref, x_ref, h0_ref, h_ref, *, T, reverse, shifted, activation,
                       final_only, tiles, P, Q, rows_class=TileRows):
    rows = rows_class(P, Q, tiles, compute_dtype(h_ref.dtype))
    act = activation or (lambda v: v)

    def time(k):
        return T - 1 - k if reverse else k

    def step(k, h):
        t = time(k)
        if shifted:
            coefficient = rows.load(a_ref, jnp.clip(t + (1 if reverse else -1), 0, T - 1))
            coefficient = select(k == 0, 0, coefficient)
        else:
            coefficient = rows.load(a_ref, t)
        h = rows.full(act(coefficient * h + rows.load(x_ref, t)))
        if not final_only:
            rows.store(h_ref, t, h)
        return h

    h = lax.fori_loop(0, T, step, rows.full(rows.load(h0_ref, 0)))
    if final_only:
        rows.store(h_ref, 0, h)


def recurrence_pnq(a, x, h0, *, reverse: bool, shifted: bool, activation, final_only: bool,
                   out_dtype, interpret: bool = False, tiles=None, compiler_params=None):
    """Run along axis 1 of (P|1, T|1, Q|1) operands; see `_xla_recurrence.recurrence_pnq`.
    Real sequences of contiguous steps (Q = 1), or of 64 features and more, with no tile given,
    go by tiles of steps (`_pallas/row_tiles.py`)."""
    P, T, Q = broadcast_shape(a, x, h0)  # h0 has T = 1
    if tiles is None and _pallas_rows.recurrence_applies(P, T, Q, compute_dtype(out_dtype)):
        return _pallas_rows.recurrence_pnq(a, x, h0, reverse=reverse, shifted=shifted,
                                           activation=activation, final_only=final_only,
                                           out_dtype=out_dtype, interpret=interpret,
                                           compiler_params=compiler_params,
                                           rows=_pallas_rows.INTERPRET_ROWS if interpret else None)
    kernel = functools.partial(_recurrence_kernel, T=T, reverse=reverse, shifted=shifted,
                               activation=activation, final_only=final_only)
    rows = 1 if final_only else T
    return launch(kernel, (a, x, h0), [(rows, out_dtype)], name="tridiax_recurrence",
                  interpret=interpret, tiles=tiles, compiler_params=compiler_params)[0]
