"""The tridiagonal matrix as an operator: A x along an axis, and `check=True`'s count of the
systems whose solve failed."""

from __future__ import annotations

import functools
import operator

import jax.numpy as jnp
from jax import Array

from .._core.along_axis import broadcast_along, roll, shift
from .._core.check import count_failed, uncounted


def matvec(lower, diag, upper, x, *, axis: int, transposed: bool = False,
           periodic: bool = False) -> Array:
    """A @ x along `axis` for the tridiagonal A with these bands (or A^T when `transposed`).

    Row i of A reads lower[i]*x[i-1] + diag[i]*x[i] + upper[i]*x[i+1]; lower[0] and
    upper[-1] are never multiplied, so they are ignored whatever they hold (inf and NaN too).
    When `periodic`, indices wrap around: lower[0] multiplies x[N-1] and upper[N-1] x[0].
    Operands broadcast; a band given as None is zero (the JVP skips symbolic-zero tangents).
    Only pads, slices and multiplies: no select, whose batching rule would move a vmapped
    dimension.
    """
    n = x.shape[axis]
    terms = []
    if diag is not None:
        terms.append(diag * x)
    if periodic:
        for band, k in ((lower, 1), (upper, -1)):
            if band is not None:
                band = broadcast_along(band, axis, n)
                # A: band[i]*x[i-k];  A^T: band[i+k]*x[i+k] = roll(band*x, -k)[i].
                terms.append(roll(band * x, -k, axis) if transposed else band * roll(x, k, axis))
        return functools.reduce(operator.add, terms)
    if lower is not None:
        lower = broadcast_along(lower, axis, n)
        # A: lower[i]*x[i-1] = shift(lower[j+1]*x[j], +1)[i];  A^T: lower[i+1]*x[i+1].
        terms.append(shift(lower * x, -1, axis) if transposed
                     else shift(shift(lower, -1, axis) * x, 1, axis))
    if upper is not None:
        upper = broadcast_along(upper, axis, n)
        # A: upper[i]*x[i+1] = shift(upper[j-1]*x[j], -1)[i];  A^T: upper[i-1]*x[i-1].
        terms.append(shift(upper * x, 1, axis) if transposed
                     else shift(shift(upper, 1, axis) * x, -1, axis))
    return functools.reduce(operator.add, terms)


def count_failures(x: Array, lower: Array, diag: Array, upper: Array, rhs: Array, *, axis: int,
                   periodic: bool) -> Array:
    """The number of systems whose solution `x` failed (see module), as an int32 scalar."""
    shape = x.shape
    n = shape[axis]
    lower, diag, upper, rhs, x = uncounted(lower, diag, upper, rhs, x)
    residual = rhs - matvec(lower, diag, upper, x, axis=axis, periodic=periodic)
    # ||A||_inf: lower[0] and upper[N-1] are outside a non-periodic matrix, whatever they hold.
    row = jnp.arange(n).reshape([n if k == axis else 1 for k in range(len(shape))])
    lower, upper = jnp.abs(lower), jnp.abs(upper)
    if not periodic:
        lower, upper = jnp.where(row > 0, lower, 0), jnp.where(row < n - 1, upper, 0)
    return count_failed(x, rhs, residual, lower + jnp.abs(diag) + upper, axis=axis)
