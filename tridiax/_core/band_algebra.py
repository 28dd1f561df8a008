"""Elementwise band algebra along an axis: shifts, the matrix-vector product, unbroadcasting.

All of it is pads, slices, selects and multiplies: XLA fuses it, and it never transposes.
"""

from __future__ import annotations

import functools
import math
import operator

import jax.numpy as jnp
import numpy as np
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


def band_offsets(l: int, u: int) -> range:
    """For each row k of scipy's banded layout, ab[k, j] = A[j + (k - u), j]: the row offsets
    k - u, k = 0..l + u."""
    return range(-u, l + 1)


def inside_band(n: int, l: int, u: int, axis: int, ndim: int) -> Array:
    """(l + u + 1, ...) booleans, n along `axis` + 1: whether ab[k, j] is an entry of the
    N x N matrix (0 <= j + k - u < n); scipy ignores the others, and so does tridiax."""
    j = np.arange(n)
    mask = np.stack([(j + s >= 0) & (j + s < n) for s in band_offsets(l, u)])
    return mask.reshape((l + u + 1,) + tuple(n if k == axis else 1 for k in range(ndim)))


def banded_matvec(ab: Array, x: Array, *, l: int, u: int, axis: int,
                  transposed: bool = False) -> Array:
    """A @ x (or A^T @ x) along `axis` for the banded A of scipy's layout ab[u + i - j, j] =
    A[i, j]; `ab` is (l + u + 1, ...) with its other dimensions broadcasting against `x`.

    Entries of `ab` outside the matrix are never used (selected away, so inf and NaN there do
    not leak, and their cotangent is zero)."""
    n = x.shape[axis]
    ab = jnp.where(inside_band(n, l, u, axis, x.ndim), ab, 0)
    # Split, not indexed: the transpose of a split is one concatenate, where that of ab[k]
    # pads each band's cotangent to the whole stack and adds them (K passes over K bands).
    rows = [r.reshape(r.shape[1:]) for r in jnp.split(ab, ab.shape[0], axis=0)]
    terms = []
    for k, s in enumerate(band_offsets(l, u)):
        if abs(s) >= n:  # a diagonal that lies outside an n x n matrix
            continue
        band = broadcast_along(rows[k], axis, n)
        # A: (A x)[i] = sum_k ab[k, i - s] x[i - s];  A^T: (A^T x)[j] = sum_k ab[k, j] x[j + s].
        terms.append(shift(band * x, s, axis) if not transposed else band * shift(x, -s, axis))
    return functools.reduce(operator.add, terms)


def banded_row_sums(ab: Array, shape, *, l: int, u: int, axis: int) -> Array:
    """sum_j |A[i, j]| for every row i, broadcast to `shape` (the inf-norm's row sums)."""
    n = shape[axis]
    ab = jnp.abs(jnp.where(inside_band(n, l, u, axis, len(shape)), ab, 0))
    terms = [shift(jnp.broadcast_to(ab[k], shape), s, axis)
             for k, s in enumerate(band_offsets(l, u)) if abs(s) < n]
    return functools.reduce(operator.add, terms)


def block_matvec(lower: Array | None, diag: Array | None, upper: Array | None, x: Array, *,
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
