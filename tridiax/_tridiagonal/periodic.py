"""Periodic (cyclic) systems by Sherman-Morrison: the split, and the pivoted periodic solve.

A cyclic matrix A (corners alpha = A[0, N-1] = lower[0], beta = A[N-1, 0] = upper[N-1]) is
written A = T' + u v^T with T' tridiagonal:

    u = (gamma, 0, ..., 0, beta),   v = (1, 0, ..., 0, alpha/gamma),
    d'[0] = d[0] - gamma,           d'[N-1] = d[N-1] - alpha*beta/gamma,

and x = y - (v.y)/(1 + v.z) z with y = T'^{-1} b and z = T'^{-1} u.

The split `gamma` is chosen per system so that T' is never worse than A (`split`):
gamma = -sign(d[0]) * s with s = max(|d[0]|, |alpha|, |A[0, 1]|) (sign(0) = 1). Then
|d'[0]| = |d[0]| + s >= |A[0, 1]|, so row 0 of T' is diagonally dominant even when d[0] is
zero or tiny, and |alpha*beta/gamma| <= |beta|, so row N-1 of T' stays dominant where row
N-1 of A is. For a diagonally dominant A this is gamma = -d[0], the textbook choice, which
breaks down on a zero or small d[0]. By the matrix determinant lemma, det T' =
det A (1 - v^T A^{-1} u): for a nonsingular A, T' is singular only on a set of measure zero,
which structured matrices can still land on for every split (a cyclic shift); `check=True`
reports those systems.

The unpivoted periodic kind runs both eliminations of T' in one kernel sweep (every backend
implements `split` itself: solve.cc, `xla.py`, `pallas_triton.py`). With pivoting,
`solve_pivoted` eliminates T' with partial pivoting for the two right-hand sides b and u at
once (one launch of the pivoted kernel, the bands shared by both) and combines them.
"""

from __future__ import annotations

import operator

import jax.numpy as jnp
import numpy as np
from jax import Array, lax

from .._core import along_axis as _along
from .._core.split_complex import SplitComplex, modulus


def is_periodic(kind: str) -> bool:
    """Whether a kernel kind (`_tridiagonal/primitive.py`) solves cyclic systems."""
    return kind in ("periodic", "periodic_pivoted")


def split(d0: Array, alpha: Array, u0: Array) -> Array:
    """gamma for each system from A[0, 0], A[0, N-1] and A[0, 1] (module docstring)."""
    size = jnp.maximum(jnp.maximum(jnp.abs(d0), jnp.abs(alpha)), jnp.abs(u0))
    magnitude = jnp.abs(d0)
    direction = jnp.where(magnitude > 0, d0 / jnp.where(magnitude > 0, magnitude, 1), 1)
    return -(direction * size).astype(d0.dtype)


def split_values(d0, alpha, u0, divide=operator.truediv):
    """`split` for the kernels' values, real or `SplitComplex`: -(d0/|d0|) * size (d0/|d0| = 1
    at 0), size = max(|d0|, |alpha|, |u0|); for real systems without its division."""
    size = jnp.maximum(jnp.maximum(modulus(d0), modulus(alpha)), modulus(u0))
    if not isinstance(d0, SplitComplex):
        return jnp.where(d0 < 0, size, -size)
    m = modulus(d0)
    nonzero = m > 0
    m = jnp.where(nonzero, m, 1)
    return SplitComplex(-jnp.where(nonzero, divide(d0.re, m), 1) * size,
                        -jnp.where(nonzero, divide(d0.im, m), 0) * size)


def sherman_morrison_factor(y0, yl, z0, zl, alpha, gamma, beta=None, *, transposed: bool = False):
    """f of x = y - f z, from the first and last rows of y = T'^{-1} b and z = T'^{-1} u:
    (v.y) / (1 + v.z), v = (1, 0, ..., 0, alpha/gamma). `transposed`: A^T solved with A's own
    split (the TPU kernel: z = T'^{-T} v), f = (u.y) / (1 + u.z), u = (gamma, 0, ..., 0, beta).
    Values of any kind the arithmetic takes: arrays, kernel tiles, `SplitComplex`."""
    if transposed:
        return (gamma * y0 + beta * yl) / (1 + gamma * z0 + beta * zl)
    kappa = alpha / gamma
    return (y0 + kappa * yl) / (1 + z0 + kappa * zl)


def _end(x: Array, axis: int, last: bool) -> Array:
    """The first or last row of `x` along `axis` (its only row when it is broadcast there)."""
    n = x.shape[axis]
    return lax.slice_in_dim(x, n - 1 if last else 0, n if last else 1, axis=axis)


def solve_pivoted(lower: Array, diag: Array, upper: Array, rhs: Array, *, axis: int,
                  transposed: bool, pivoted_solve) -> Array:
    """x with A x = rhs (A^T x = rhs when `transposed`) for cyclic A, eliminating T' with
    partial pivoting. Operands have one rank and broadcast; `pivoted_solve(l, d, u, b, axis=)`
    is a backend's pivoted kernel on such operands."""
    shape = np.broadcast_shapes(lower.shape, diag.shape, upper.shape, rhs.shape)
    n = shape[axis]
    if transposed:  # the bands of A^T, cyclic: lower_T[i] = upper[i-1], upper_T[i] = lower[i+1]
        lower, upper = (band if band.shape[axis] == 1 else _along.roll(band, k, axis)
                        for band, k in ((upper, 1), (lower, -1)))
    alpha, beta, d0, u0 = (_end(lower, axis, False), _end(upper, axis, True),
                           _end(diag, axis, False), _end(upper, axis, False))
    gamma = split(d0, alpha, u0)
    bands = np.broadcast_shapes(lower.shape, diag.shape, upper.shape)
    diag = jnp.broadcast_to(diag, bands[:axis] + (n,) + bands[axis + 1:])
    diag = _along.set_ends(diag, d0 - gamma, _end(diag, axis, True) - alpha * beta / gamma, axis)
    # Both right-hand sides in one launch: stacked on a new leading axis, the bands shared.
    row = lax.broadcasted_iota(jnp.int32, shape, axis)
    u = jnp.where(row == 0, gamma, jnp.where(row == n - 1, beta, 0)).astype(rhs.dtype)
    y, z = pivoted_solve(lower[None], diag[None], upper[None],
                         jnp.stack([jnp.broadcast_to(rhs, shape), u]), axis=axis + 1)
    f = sherman_morrison_factor(_end(y, axis, False), _end(y, axis, True), _end(z, axis, False),
                                _end(z, axis, True), alpha, gamma)
    return y - f * z
