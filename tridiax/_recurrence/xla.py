"""Elementwise recurrences h[t] = act(a[t]*h[t-1] + x[t]) as a plain XLA loop (CPU, TPU).

Same conventions as the Pallas kernel (`_recurrence/pallas_triton.py`); one `fori_loop` over the time
axis (never unrolled), each step reading one row of `a` and `x` and writing one row of h in
place (or carrying only the state when `final_only`).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .._core.dtypes import compute_dtype
from .._core.layout import broadcast_shape


def recurrence_pnq(a, x, h0, *, reverse: bool, shifted: bool, activation, final_only: bool,
                   out_dtype):
    """Run along axis 1 of (P|1, T|1, Q|1) operands (`h0` has T = 1).

    Steps go t = 0..T-1 (t = T-1..0 when `reverse`). The state is multiplied by a[t], or, when
    `shifted`, by a at the previous step's index (zero at the first step: the transpose of the
    unshifted recurrence). Returns (P, T, Q), or (P, 1, Q) with the last state when `final_only`.
    """
    cdt = compute_dtype(out_dtype)
    P, T, Q = broadcast_shape(a, x, h0)  # h0 has T = 1
    shape = (P, Q)
    act = activation or (lambda v: v)

    def row(v, t):
        if v.shape[1] == 1:
            t = 0
        return lax.dynamic_index_in_dim(v, t, 1, keepdims=False).astype(cdt)

    def time(k):
        return T - 1 - k if reverse else k

    def coefficient(k):
        if not shifted:
            return row(a, time(k))
        previous = jnp.clip(time(k) + (1 if reverse else -1), 0, T - 1)
        return jnp.where(k == 0, 0, row(a, previous))

    h_init = jnp.broadcast_to(row(h0, 0), shape)

    def step(k, h):
        return act(coefficient(k) * h + row(x, time(k)))

    if final_only:
        h = lax.fori_loop(0, T, lambda k, h: jnp.broadcast_to(step(k, h), shape), h_init)
        return h[:, None, :].astype(out_dtype)

    def body(k, carry):
        buf, h = carry
        h = jnp.broadcast_to(step(k, h), shape)
        return lax.dynamic_update_index_in_dim(buf, h.astype(out_dtype), time(k), 1), h

    buf = jnp.zeros((shape[0], T, shape[1]), out_dtype)
    out, _ = lax.fori_loop(0, T, body, (buf, h_init))
    return out
