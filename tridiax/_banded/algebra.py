"""The banded matrix in scipy's layout as an operator: which entries of `ab` lie inside the
matrix, A x along an axis, the absolute row sums, `check=True`'s count of failed systems, and
all the bands of a Hermitian matrix stored as one triangle (solveh_banded's layout)."""

from __future__ import annotations

import functools
import operator

import jax.numpy as jnp
import numpy as np
from jax import Array

from .._core.along_axis import broadcast_along, shift
from .._core.check import count_failed, uncounted


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


def matvec(ab: Array, x: Array, *, l: int, u: int, axis: int,
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


def hermitian_matvec(ab: Array, x: Array, *, lower: bool, axis: int,
                     transposed: bool = False) -> Array:
    """A @ x (or A^T @ x) along `axis` for the Hermitian A whose upper (or lower) triangle `ab`
    holds in solveh_banded's layout ((u + 1, ...), broadcasting against `x`), read from the
    stored bands: each gives its own entries and, conjugated, their mirror images.

    `hermitian_bands` followed by `matvec` gives the same values, but its transpose (reverse
    mode's cotangent of `ab`) would form all 2u + 1 bands' cotangents and fold them back; here
    each stored band's cotangent is one product, as `matvec`'s are. Entries of `ab` outside the
    matrix are never used; the diagonal's imaginary part is ignored."""
    n, u = x.shape[axis], ab.shape[0] - 1
    triangle = (u, 0) if lower else (0, u)  # the stored bands' (l, u) in scipy's layout
    offsets = band_offsets(*triangle)  # s = i - j of the stored A[i, j]
    ab = jnp.where(inside_band(n, *triangle, axis, x.ndim), ab, 0)
    rows = [r.reshape(r.shape[1:]) for r in jnp.split(ab, u + 1, axis=0)]
    terms = []
    for k, s in enumerate(offsets):
        if abs(s) >= n:
            continue
        band = broadcast_along(rows[k], axis, n)
        if s == 0:
            terms.append((band.real.astype(band.dtype) if jnp.iscomplexobj(band) else band) * x)
            continue
        # band[j] = A[j + s, j], its mirror A[j, j + s] = conj(band[j]); A^T = conj(A).
        entry, mirror = (jnp.conj(band), band) if transposed else (band, jnp.conj(band))
        terms.append(shift(entry * x, s, axis))
        terms.append(mirror * shift(x, -s, axis))
    return functools.reduce(operator.add, terms)


def row_sums(ab: Array, shape, *, l: int, u: int, axis: int) -> Array:
    """sum_j |A[i, j]| for every row i, broadcast to `shape` (the inf-norm's row sums)."""
    n = shape[axis]
    ab = jnp.abs(jnp.where(inside_band(n, l, u, axis, len(shape)), ab, 0))
    terms = [shift(jnp.broadcast_to(ab[k], shape), s, axis)
             for k, s in enumerate(band_offsets(l, u)) if abs(s) < n]
    return functools.reduce(operator.add, terms)


def count_failures(x: Array, ab: Array, rhs: Array, *, l: int, u: int, axis: int) -> Array:
    """`count_failures` for the banded matrix of scipy's layout `ab` (`matvec`)."""
    ab, rhs, x = uncounted(ab, rhs, x)
    residual = rhs - matvec(ab, x, l=l, u=u, axis=axis)
    return count_failed(x, rhs, residual, row_sums(ab, x.shape, l=l, u=u, axis=axis),
                  axis=axis)


def hermitian_bands(ab: Array, *, lower: bool, axis: int, n: int) -> Array:
    """The (2u + 1)-band general layout of the Hermitian matrix whose upper (or lower)
    triangle `ab` holds in scipy's solveh_banded layout ((u + 1, ...), rows along `axis`)."""
    u = ab.shape[0] - 1
    rows = [broadcast_along(ab[k], axis - 1, n) for k in range(u + 1)]
    diagonal = rows[0 if lower else u]
    if jnp.iscomplexobj(diagonal):
        diagonal = diagonal.real.astype(ab.dtype)
    # Offset s = i - j of A[i, j]; the stored triangle holds s <= 0 (upper) or s >= 0 (lower).
    full = []
    for s in range(-u, u + 1):
        if s == 0:
            full.append(diagonal)
        elif (s < 0) != lower:  # stored: upper ab[u + s, j], lower ab[s, j]
            full.append(rows[s] if lower else rows[u + s])
        else:  # the conjugate of the stored A[j, i] = A[j, j - s], |s| away along the axis
            t = abs(s)
            stored = rows[t] if lower else rows[u - t]
            shifted = shift(stored, -t if not lower else t, axis - 1) if t < n else \
                jnp.zeros_like(stored)
            full.append(jnp.conj(shifted))
    return jnp.stack(full)
