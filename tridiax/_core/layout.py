"""The (P, N, Q) view every kernel works on.

An array of any rank whose systems lie along `axis` is, in row-major order, a 3-D array
(P, N, Q): P = prod(shape[:axis]) groups of N rows, each row holding Q contiguous values.
The reshape is free (a bitcast in XLA), so kernels address the solve axis directly; the one
transpose is `to_columns`, for the GPU kernels, whose row reads are coalesced only along Q.

An operand that broadcasts against the full shape keeps size 1 in each of the three
groups it does not vary over, so a matrix shared by all columns is never copied. Only an
operand that is broadcast in part of a group (e.g. varying over the first of two leading
dimensions but not the second) is materialised over that group.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import Array, lax


def broadcast_shape(*arrays) -> tuple[int, ...]:
    """The shape the operands broadcast to (they are known to be compatible)."""
    return tuple(np.broadcast_shapes(*(x.shape for x in arrays)))


def _group_size(dims: tuple[int, ...], full: tuple[int, ...]) -> int | None:
    """Size of a group in an operand: its full size, 1 if broadcast, None if mixed."""
    if dims == full:
        return math.prod(full)
    if all(d == 1 for d in dims):
        return 1
    return None


def to_pnq(x: Array, axis: int, full_shape: tuple[int, ...], *, trailing: int = 0) -> Array:
    """View `x` as (P|1, N|1, Q|1), followed by its last `trailing` dimensions as they are (the
    two dimensions of a block): its other dimensions have the rank of `full_shape` and broadcast
    against it. One reshape, whatever `trailing` is (vmapping the view over trailing
    dimensions instead makes XLA transpose the operand there and back)."""
    axis = axis % len(full_shape)
    tail = x.shape[x.ndim - trailing:]
    dims = x.shape[: x.ndim - trailing]
    lead, trail = dims[:axis], dims[axis + 1 :]
    full_lead, full_trail = full_shape[:axis], full_shape[axis + 1 :]
    p = _group_size(lead, full_lead)
    q = _group_size(trail, full_trail)
    if p is None or q is None:
        lead = full_lead if p is None else lead
        trail = full_trail if q is None else trail
        x = jnp.broadcast_to(x, lead + (dims[axis],) + trail + tail)
        p = math.prod(lead) if p is None else p
        q = math.prod(trail) if q is None else q
    return x.reshape(p, dims[axis], q, *tail)


def to_columns(views, P: int, Q: int):
    """(P|1, N|1, Q|1, *block) views as (1, N|1, P*Q|1, *block): every system a column, system
    (p, q) at column p*Q + q, by one XLA transpose per operand (an operand broadcast along both
    P and Q stays as it is; one broadcast along only one of them is materialised). Returns the
    views and `back`, which puts a (1, M, P*Q, *block) result back as (P, M, Q, *block)."""
    moved = []
    for v in views:
        p, n, q, *block = v.shape
        if p == 1 and q == 1:
            moved.append(v)
            continue
        v = jnp.broadcast_to(v, (P, n, Q, *block))
        moved.append(jnp.swapaxes(v, 0, 1).reshape(1, n, P * Q, *block))

    def back(x: Array) -> Array:
        return jnp.swapaxes(x.reshape(x.shape[1], P, Q, *x.shape[3:]), 0, 1)

    return moved, back


def columns_if(move: bool, views, P: int, Q: int):
    """`to_columns` where `move` (the planner's `gpu_columns`), else the views as they are:
    returns the views, their P and Q, and `back` for a result (the identity when unmoved)."""
    if not move:
        return views, P, Q, lambda x: x
    views, back = to_columns(views, P, Q)
    return views, 1, P * Q, back


def rows_at(v: Array, index) -> Array:
    """Rows `index` (C static row numbers, in range) of (p, n, q) along axis 1: (p, C, q); an
    operand broadcast along N gives its one row for every chunk."""
    index = np.asarray(index)
    p, n, q = v.shape
    if n == 1:
        return jnp.broadcast_to(v, (p, len(index), q))
    head, last = index[:-1], int(index[-1])
    steps = np.diff(head)
    if len(head) and (len(head) == 1 or (np.all(steps == steps[0]) and steps[0] > 0)):
        step = int(steps[0]) if len(head) > 1 else 1
        body = lax.slice_in_dim(v, int(head[0]), int(head[-1]) + 1, stride=step, axis=1)
        return lax.concatenate([body, lax.slice_in_dim(v, last, last + 1, axis=1)], 1)
    return jnp.take(v, index, axis=1)
