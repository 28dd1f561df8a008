"""Elementwise operations along an axis, for every family: shifts, rolls, the ends of a
system, broadcasting along and unbroadcasting, and the batching rules' alignment.

All of it is pads, slices, selects and multiplies: XLA fuses it, and it never transposes.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import Array, lax


def shift(x: Array, k: int, axis: int) -> Array:
    """out[i] = x[i - k] along `axis`, zero where i - k is out of range (|k| < x.shape[axis])."""
    config = [(0, 0, 0)] * x.ndim
    config[axis] = (k, -k, 0)
    return lax.pad(x, jnp.zeros((), x.dtype), config)


def broadcast_along(x: Array, axis: int, n: int) -> Array:
    """`x` (size 1 along `axis`) repeated n times along `axis`, as a batched outer product.

    Same values as jnp.broadcast_to, but its transpose is a batched matrix-vector product
    with ones instead of a reduce_sum over `axis`, which XLA:CPU runs as a strided loop when
    `axis` is not the last.
    That transpose is what reverse mode runs for a coefficient shared along the axis.
    """
    shape = jnp.shape(x)
    if shape[axis] == n:
        return x
    P, Q = math.prod(shape[:axis]), math.prod(shape[axis + 1 :])
    ones = jnp.ones((P, n), x.dtype)
    out = lax.dot_general(ones, jnp.reshape(x, (P, Q)), (((), ()), ((0,), (0,))))  # (P, n, Q)
    return out.reshape(shape[:axis] + (n,) + shape[axis + 1 :])


def sum_along(x: Array, axis: int) -> Array:
    """The sum of `x` over `axis`, kept as a dimension of size 1: as the transpose of
    `broadcast_along`, a batched matrix-vector product with ones (XLA:CPU runs a reduce_sum
    over an axis other than the last as a strided loop)."""
    shape = jnp.shape(x)
    # The dimensions before `axis` as batch dimensions, not merged into one: a reshape would
    # make a sharded array gather.
    ones = jnp.ones(shape[: axis + 1], x.dtype)
    batch = tuple(range(axis))
    out = lax.dot_general(ones, x, (((axis,), (axis,)), (batch, batch)),
                          precision=lax.Precision.HIGHEST)  # shape without `axis`
    return jnp.expand_dims(out, axis)


def roll(x: Array, k: int, axis: int) -> Array:
    """out[i] = x[(i - k) mod n] along `axis` (k = +1 or -1): two slices and a concatenate."""
    n = x.shape[axis]
    if k == 1:
        parts = (lax.slice_in_dim(x, n - 1, n, axis=axis), lax.slice_in_dim(x, 0, n - 1, axis=axis))
    else:
        parts = (lax.slice_in_dim(x, 1, n, axis=axis), lax.slice_in_dim(x, 0, 1, axis=axis))
    return lax.concatenate(parts, axis)


def set_ends(x: Array, first: Array, last: Array, axis: int) -> Array:
    """x (N >= 2 rows along `axis`) with its first and last rows replaced by `first` and
    `last` (size 1 along `axis`, broadcasting against a row): no select, vmap-friendly."""
    n = x.shape[axis]
    middle = lax.slice_in_dim(x, 1, n - 1, axis=axis)
    shape = middle.shape[:axis] + (1,) + middle.shape[axis + 1:]
    return lax.concatenate([jnp.broadcast_to(first, shape), middle,
                            jnp.broadcast_to(last, shape)], axis)


def unbroadcast(x: Array, shape: tuple[int, ...]) -> Array:
    """Sum `x` over the dimensions along which an operand of `shape` was broadcast."""
    if x.shape == tuple(shape):
        return x
    dims = tuple(k for k, (s, t) in enumerate(zip(shape, x.shape, strict=True)) if s == 1 and t != 1)
    return jnp.sum(x, axis=dims, keepdims=True).reshape(shape)


def align_batch(operands, dims, axis: int, *, preferred: int):
    """Batching-rule helper: make a vmapped dimension one more batch dimension of the op.

    Operands batched at the same position need no data movement, unbatched ones get a size-1
    dimension (a free reshape) and broadcast. Only operands batched at a different position
    than most (ties: `operands[preferred]`) are moved. Returns the operands, the batch position
    and the shifted `axis`.
    """
    batched = [d for d in dims if d is not None]
    bdim = max(batched, key=lambda d: (batched.count(d), d == dims[preferred]))
    moved = []
    for x, d in zip(operands, dims, strict=True):
        if d is None:
            x = jnp.expand_dims(x, bdim)
        elif d != bdim:
            x = jnp.moveaxis(x, d, bdim)
        moved.append(x)
    return moved, bdim, axis + 1 if bdim <= axis else axis


