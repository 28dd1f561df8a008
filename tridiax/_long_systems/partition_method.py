"""Tridiagonal systems whose rows are split across devices: the partition method.

Runs per device, inside the `custom_partitioning` of `_core/sharding.py`, when the inputs split the
solve axis into P blocks of m >= 2 rows over the mesh axes `names` (device k holds rows
k*m .. k*m + m - 1 of every system).

1. Device k's block holds interior rows 0..n-1 (n = m - 1) and its last row n, the
   separator R_k. The interior T_k is solved for four right-hand sides at once:
   y = T_k^{-1} b, v = T_k^{-1} (alpha e_1), w = T_k^{-1} (omega e_n) and yr = T_k^{-1} r,
   where alpha = lower of row 0 (the coefficient of the previous block's separator R_{k-1}),
   omega = upper of row n-1 (the coefficient of R_k) and r the interior rows' sums. Then the
   interior is x = y - v R_{k-1} - w R_k.
2. Substituted into the separator rows, that leaves a P x P tridiagonal system in the
   separators (cyclic when periodic), the reduced system of the single-device partition
   method (`_long_systems/chunked.py`), its diagonal formed, where that cancels less, from the rows' sums
   (1 + v + w = yr) rather than from the spikes' ends, each device choosing the form for
   its side of a row. Each device contributes 7 numbers per system to one all-gather
   (communication per system: 7P values, whatever N), and
   every device solves the small system (dense, with partial pivoting) for every system it
   holds.
3. Each device forms its interior rows; its separator row is R_k.

A periodic system wraps around (R_{-1} = R_{P-1}, L_P = L_0); a plain one has no coupling
out of the first and last blocks. A transposed solve (reverse mode) first builds the
transposed bands explicitly: their first and last rows come from the neighbouring blocks, by
one collective permute of one row each way.

Numerics: each block T_k is eliminated on its own (with pivoting when asked), so the method
needs every T_k to be nonsingular; that holds for diagonally dominant and symmetric positive
definite matrices, whose principal submatrices inherit the property.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import Array, lax

from .._core.dtypes import compute_dtype
from .._core.layout import broadcast_shape
from .._core.split_complex import magnitude
from .._tridiagonal.periodic import is_periodic
from .chunked import SUMS_MARGIN


def _rows(x: Array, start: int, stop: int, axis: int) -> Array:
    return lax.slice_in_dim(x, start, stop, axis=axis)


def _from_neighbour(row: Array, names, devices: int, step: int) -> Array:
    """`row` of the device `step` places before this one (cyclically)."""
    return lax.ppermute(row, names, [(k, (k + step) % devices) for k in range(devices)])


def _transposed_bands(lower, upper, names, devices, axis):
    """Bands of A^T on this block: lower_T[i] = upper[i-1], upper_T[i] = lower[i+1], the rows
    across the block's edges taken from the neighbours."""
    if upper.shape[axis] == 1 and lower.shape[axis] == 1:
        return upper, lower  # constant along the axis
    m = max(lower.shape[axis], upper.shape[axis])
    if upper.shape[axis] == 1:
        upper = jnp.broadcast_to(upper, lower.shape)
    if lower.shape[axis] == 1:
        lower = jnp.broadcast_to(lower, upper.shape)
    before = _from_neighbour(_rows(upper, m - 1, m, axis), names, devices, 1)
    after = _from_neighbour(_rows(lower, 0, 1, axis), names, devices, -1)
    lower_t = lax.concatenate([before, _rows(upper, 0, m - 1, axis)], axis)
    upper_t = lax.concatenate([_rows(lower, 1, m, axis), after], axis)
    return lower_t, upper_t


def solve_split(lower, diag, upper, rhs, *, names, devices: int, axis: int, kind: str,
                transposed: bool, local_solve) -> Array:
    """This device's rows of x (see the module docstring). `local_solve(lower, diag, upper,
    rhs, axis=, kind=)` solves the block's own systems with the single-device kernel."""
    out_dtype = rhs.dtype
    cdt = compute_dtype(out_dtype)
    lower, diag, upper, rhs = (x.astype(cdt) for x in (lower, diag, upper, rhs))
    periodic = is_periodic(kind)
    if transposed:
        lower, upper = _transposed_bands(lower, upper, names, devices, axis)
    shape = broadcast_shape(lower, diag, upper, rhs)
    m = shape[axis]
    n = m - 1  # interior rows 0..n-1; row n is the block's separator
    k = lax.axis_index(names)
    row_shape = shape[:axis] + (1,) + shape[axis + 1:]

    def row(x, i):
        return jnp.broadcast_to(_rows(x, i, i + 1, axis) if x.shape[axis] > 1 else x, row_shape)

    def interior(x):
        return _rows(x, 0, n, axis) if x.shape[axis] > 1 else x

    # alpha: row 0's coupling to the previous block's separator; omega: row n-1's coupling to
    # this block's separator; beta: the separator's coupling to the next block's row 0.
    alpha, omega, beta = row(lower, 0), row(upper, n - 1), row(upper, n)
    if not periodic:  # nothing couples out of the first and last blocks
        alpha = jnp.where(k == 0, 0, alpha)
        beta = jnp.where(k == devices - 1, 0, beta)
    inner = shape[:axis] + (n,) + shape[axis + 1:]
    index = lax.broadcasted_iota(jnp.int32, inner, axis)
    lo, di, up = interior(lower), interior(diag), interior(upper)
    # The interior rows' sums, their couplings included: T (1 + v + w) = r.
    sums = (jnp.where(index == 0, alpha, lo) + di) + up
    stacked = jnp.stack([jnp.broadcast_to(interior(rhs), inner), jnp.where(index == 0, alpha, 0),
                         jnp.where(index == n - 1, omega, 0), jnp.broadcast_to(sums, inner)])
    y, v, w, yr = local_solve(lo[None], di[None], up[None], stacked, axis=axis + 1,
                              kind="pivoted" if kind.endswith("pivoted") else "thomas")

    def first(s):
        return jnp.squeeze(_rows(s, 0, 1, axis), axis)

    def last(s):
        return jnp.squeeze(_rows(s, n - 1, n, axis), axis)

    sub_s, d_s, b_s = (jnp.squeeze(row(x, n), axis) for x in (lower, diag, rhs))

    def by_score(spikes_sum, by_sums, spike, direct):
        # `_long_systems/chunked.py`'s choice, made for each side of a separator row on the block that
        # holds it: the form from the row's sum where its spikes (yr) are SUMS_MARGIN times
        # smaller than the direct form's, so that a block sends one value per side, not both.
        return jnp.where(SUMS_MARGIN * magnitude(spikes_sum) < magnitude(spike), by_sums, direct)

    # This block's separator row: its lower entry (R_{k-1}'s coefficient), the part of its
    # diagonal this block gives, and its right-hand side.
    lower_r = -sub_s * last(v)
    diag_own = by_score(sub_s * last(yr), ((sub_s + d_s) - sub_s * last(yr)) - lower_r,
                        sub_s * last(w), d_s - sub_s * last(w))
    rhs_own = b_s - sub_s * last(y)
    # What this block's first interior row gives the previous separator's row, before the
    # factor beta that the previous block holds: towards its diagonal -v_first directly, or
    # (1 - yr_first) - (-w_first) from the row's sum less its upper entry; -w_first its upper
    # entry; -y_first its right-hand side.
    towards_diag = by_score(first(yr), (1 - first(yr)) + first(w), first(v), -first(v))
    gathered = lax.all_gather(jnp.stack([lower_r, diag_own, rhs_own, towards_diag, first(w),
                                         first(y), jnp.squeeze(beta, axis)]),
                              names)  # (P, 7, *batch)
    lower_r, diag_own, rhs_own, towards_diag, w_first, y_first, betas = (
        jnp.moveaxis(gathered[:, j], 0, -1) for j in range(7))  # each (*batch, P)

    # The reduced system in the separators R_0..R_{P-1} (one per block), as `_long_systems/chunked.py`
    # forms it: row j takes the rest from block j+1 (cyclically; the last block's beta is
    # zero unless periodic), times beta_j.
    def following(v):
        return jnp.roll(v, -1, axis=-1)

    diag_r = diag_own + betas * following(towards_diag)
    upper_r = -betas * following(w_first)
    rhs_r = rhs_own - betas * following(y_first)
    P = devices
    j = np.arange(P)
    batch = diag_r.shape[:-1]
    reduced = jnp.zeros(batch + (P, P), cdt)
    reduced = reduced.at[..., j, j].add(diag_r)
    reduced = reduced.at[..., j, (j - 1) % P].add(lower_r)
    reduced = reduced.at[..., j, (j + 1) % P].add(upper_r)
    separators = solve_small(reduced, rhs_r)  # (*batch, P)

    r_before = lax.dynamic_index_in_dim(separators, (k - 1) % P, axis=-1, keepdims=True)
    r_own = lax.dynamic_index_in_dim(separators, k, axis=-1, keepdims=True)
    r_before, r_own = (jnp.moveaxis(r, -1, axis) for r in (r_before, r_own))
    x = y - v * r_before - w * r_own
    return lax.concatenate([x, r_own.astype(cdt)], axis).astype(out_dtype)


def solve_small(a: Array, b: Array) -> Array:
    """x with a x = b for a batch of small dense systems, a (..., n, n) and b (..., n), by
    Gaussian elimination with partial pivoting in plain XLA operations (a loop over the n
    columns, vectorised over the batch).

    Not `jnp.linalg.solve`: XLA:CPU runs a batched LAPACK getrf on its intra-op thread pool,
    and when every thread of that pool is taken by a device waiting in a collective (several
    devices per process, two cores), the getrf's work never runs and the program hangs."""
    n = a.shape[-1]
    ab = jnp.concatenate([a, b[..., None]], axis=-1)  # (..., n, n + 1)
    rows = jnp.arange(n)

    def eliminate(c, ab):
        column = lax.dynamic_index_in_dim(ab, c, axis=-1, keepdims=False)  # (..., n)
        p = jnp.argmax(jnp.where(rows >= c, magnitude(column), -1), axis=-1)  # first of equals
        row_c = lax.dynamic_index_in_dim(ab, c, axis=-2, keepdims=True)
        row_p = jnp.take_along_axis(ab, p[..., None, None], axis=-2)
        is_c, is_p = (rows == c)[:, None], rows[:, None] == p[..., None, None]
        ab = jnp.where(is_c, row_p, jnp.where(is_p, row_c, ab))  # rows c and p trade places
        column = lax.dynamic_index_in_dim(ab, c, axis=-1, keepdims=False)
        factor = jnp.where(rows > c, column / lax.dynamic_index_in_dim(column, c, -1), 0)
        return ab - factor[..., None] * row_p

    ab = lax.fori_loop(0, n, eliminate, ab)

    def substitute(i, x):
        c = n - 1 - i
        row = lax.dynamic_index_in_dim(ab, c, axis=-2, keepdims=False)  # (..., n + 1)
        known = jnp.sum(jnp.where(rows > c, row[..., :n] * x, 0), axis=-1)
        value = (row[..., n] - known) / lax.dynamic_index_in_dim(row, c, -1, keepdims=False)
        return jnp.where(rows == c, value[..., None], x)

    return lax.fori_loop(0, n, substitute, jnp.zeros(ab.shape[:-1], ab.dtype))


def recurrence_split(a, x, h0, *states, names, devices: int, axis: int, reverse: bool,
                     shifted: bool, final_only: bool, local_recurrence):
    """This device's part of the linear recurrence h[t] = c[t] h[t-1] + x[t] when its time axis
    is split into blocks over `names` (block k: steps k*m .. k*m + m - 1).

    Each block runs from a zero state to its local final state s_k, and D_k is the product of
    its coefficients; one all-gather of (D_k, s_k) (2 values per sequence and block) lets every
    device fold the blocks before its own, h_in = D_j h_in + s_j, then run its block once more
    from h_in. `local_recurrence(c, x, h0, *states, final_only=, sums=)` is the single-device
    kernel (linear, not shifted). With `shifted` (c[t] = a at the previous step, zero at the
    very first step), the coefficient of a block's first step is the neighbouring block's edge
    value. With `states` (this device's block of them), returns (h, the sum over every step of
    the state entering it times its states): each block's sum from its entering state h_in,
    added up over `names` (one value per sequence and block).
    """
    out_dtype = x.dtype
    cdt = compute_dtype(out_dtype)
    a, x, h0 = (v.astype(cdt) for v in (a, x, h0))
    shape = broadcast_shape(a, x, h0)
    m = shape[axis]
    k = lax.axis_index(names)
    first_block = devices - 1 if reverse else 0
    c = jnp.broadcast_to(a, shape)
    if shifted:  # c[t] = a[t -+ 1]: one row from the neighbour before in scan order
        step = -1 if reverse else 1
        edge = _rows(c, 0, 1, axis) if reverse else _rows(c, m - 1, m, axis)
        edge = _from_neighbour(edge, names, devices, step)
        inner = _rows(c, 1, m, axis) if reverse else _rows(c, 0, m - 1, axis)
        edge = jnp.where(k == first_block, 0, edge)  # the very first step has no predecessor
        c = lax.concatenate([inner, edge] if reverse else [edge, inner], axis)
    state_shape = shape[:axis] + (1,) + shape[axis + 1:]
    local_final = local_recurrence(c, x, jnp.zeros(state_shape, cdt), final_only=True)
    decay = jnp.prod(c, axis=axis, keepdims=True)
    gathered = lax.all_gather(jnp.stack([decay, local_final]), names)  # (P, 2, *state)
    h = jnp.broadcast_to(h0, state_shape)
    before = []  # the state entering each block, in block order
    for j in range(devices):  # over devices (static, small), never over time
        block = devices - 1 - j if reverse else j
        before.append((block, h))
        h = gathered[block, 0] * h + gathered[block, 1]
    if final_only:
        return h.astype(out_dtype)
    entering = jnp.stack([state for _, state in sorted(before, key=lambda item: item[0])])
    h_in = lax.dynamic_index_in_dim(entering, k, axis=0, keepdims=False)
    if not states:
        return local_recurrence(c, x, h_in, final_only=False).astype(out_dtype)
    h, total = local_recurrence(c, x, h_in, *states, final_only=False, sums=True)
    return h.astype(out_dtype), lax.psum(total, names).astype(out_dtype)
