"""The block-tridiagonal matrix as an operator: A x along an axis, and `check=True`'s count of
the systems whose solve failed."""

from __future__ import annotations

import functools
import operator

import jax.numpy as jnp
from jax import Array

from .._core.along_axis import shift
from .._core.check import count_failed, uncounted


def matvec(lower: Array | None, diag: Array | None, upper: Array | None, x: Array, *,
           axis: int, transposed: bool = False) -> Array:
    """A @ x (or A^T @ x, the plain transpose) along `axis` for the block-tridiagonal A with
    blocks (..., k, k) (None: zero) and x (..., k, m), all of one rank; `axis` counts in the
    dimensions before the two block dimensions: (A x)[i] = lower[i] x[i-1] + diag[i] x[i] +
    upper[i] x[i+1]. lower[0] and upper[N-1] are never used (selected away: no NaN leaks, and
    their cotangent is zero)."""
    n = x.shape[axis]
    rows = jnp.arange(n).reshape([n if d == axis else 1 for d in range(x.ndim)])
    if n == 1:
        lower = upper = None
    if lower is not None:
        lower = jnp.where(rows > 0, lower, 0)
    if upper is not None:
        upper = jnp.where(rows < n - 1, upper, 0)
    terms = []
    if transposed:
        # (A^T x)[i] = upper[i-1]^T x[i-1] + diag[i]^T x[i] + lower[i+1]^T x[i+1]
        t = functools.partial(jnp.swapaxes, axis1=-1, axis2=-2)
        if diag is not None:
            terms.append(jnp.matmul(t(diag), x))
        if upper is not None:
            terms.append(shift(jnp.matmul(t(upper), x), 1, axis))
        if lower is not None:
            terms.append(shift(jnp.matmul(t(lower), x), -1, axis))
    else:
        if diag is not None:
            terms.append(jnp.matmul(diag, x))
        if lower is not None:
            terms.append(jnp.matmul(lower, shift(x, 1, axis)))
        if upper is not None:
            terms.append(jnp.matmul(upper, shift(x, -1, axis)))
    if not terms:
        return jnp.zeros_like(x)
    return functools.reduce(operator.add, terms)


def count_failures(x: Array, lower: Array, diag: Array, upper: Array, rhs: Array, *,
                         axis: int) -> Array:
    """`count_failures` for block-tridiagonal systems: blocks (..., k, k), x and rhs (..., k,
    m); the m columns of one system count together."""
    lower, diag, upper, rhs, x = uncounted(lower, diag, upper, rhs, x)
    residual = rhs - matvec(lower, diag, upper, x, axis=axis)
    n = x.shape[axis]
    rows = jnp.arange(n).reshape([n if d == axis else 1 for d in range(x.ndim)])
    row_sums = (jnp.abs(jnp.where(rows > 0, lower, 0)) + jnp.abs(diag)
                + jnp.abs(jnp.where(rows < n - 1, upper, 0))).sum(-1)  # (..., k)

    def largest(v, dims):  # max |v| over the block dimensions (NaN and inf stay)
        return jnp.max(jnp.abs(v), axis=dims)

    shape = x.shape[:-2]
    x_, r_, b_, a_ = (jnp.broadcast_to(v, shape) for v in (
        largest(x, (-2, -1)), largest(residual, (-2, -1)), largest(rhs, (-2, -1)),
        largest(row_sums, -1)))
    return count_failed(x_, b_, r_, a_, axis=axis)
