"""Elementwise band algebra along an axis: shifts, the matrix-vector product, unbroadcasting.

All of it is pads, slices, selects and multiplies: XLA fuses it, and it never transposes.
"""

from __future__ import annotations

import functools
import operator

import jax.numpy as jnp
from jax import Array, lax


def shift(x: Array, k: int, axis: int) -> Array:
    """out[i] = x[i - k] along `axis`, zero where i - k is out of range (k = +1 or -1)."""
    config = [(0, 0, 0)] * x.ndim
    config[axis] = (k, -k, 0)
    return lax.pad(x, jnp.zeros((), x.dtype), config)


def _edge_mask(shape, axis: int, row: int) -> Array:
    n = shape[axis]
    return lax.broadcasted_iota(jnp.int32, [n if k == axis else 1 for k in range(len(shape))],
                                axis) == (row % n)


def matvec(lower, diag, upper, x, *, axis: int, transposed: bool = False) -> Array:
    """A @ x along `axis` for the tridiagonal A with these bands (or A^T when `transposed`).

    Row i of A reads lower[i]*x[i-1] + diag[i]*x[i] + upper[i]*x[i+1]; lower[0] and
    upper[-1] are ignored whatever they hold (also inf or NaN). Operands broadcast; a band
    given as None is zero (this is how the JVP skips symbolic-zero tangents).
    """
    terms = []
    if diag is not None:
        terms.append(diag * x)
    if transposed:
        # (A^T x)[i] = upper[i-1]*x[i-1] + diag[i]*x[i] + lower[i+1]*x[i+1]; the shifts drop
        # upper[-1] and lower[0].
        if upper is not None:
            terms.append(shift(upper * x, 1, axis))
        if lower is not None:
            terms.append(shift(lower * x, -1, axis))
    else:
        if lower is not None:
            shape = jnp.broadcast_shapes(jnp.shape(lower), x.shape)
            lower = jnp.where(_edge_mask(shape, axis, 0), 0, lower)
            terms.append(lower * shift(x, 1, axis))
        if upper is not None:
            shape = jnp.broadcast_shapes(jnp.shape(upper), x.shape)
            upper = jnp.where(_edge_mask(shape, axis, -1), 0, upper)
            terms.append(upper * shift(x, -1, axis))
    return functools.reduce(operator.add, terms)


def unbroadcast(x: Array, shape: tuple[int, ...]) -> Array:
    """Sum `x` over the dimensions along which an operand of `shape` was broadcast."""
    if x.shape == tuple(shape):
        return x
    dims = tuple(k for k, (s, t) in enumerate(zip(shape, x.shape, strict=True)) if s == 1 and t != 1)
    return jnp.sum(x, axis=dims, keepdims=True).reshape(shape)
