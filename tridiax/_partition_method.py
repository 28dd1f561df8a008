"""Tridiagonal systems whose rows are split across devices: the partition method.

Runs per device, inside the `custom_partitioning` of `_sharding.py`, when the inputs split the
solve axis into P blocks of m >= 2 rows over the mesh axes `names` (device k holds rows
k*m .. k*m + m - 1 of every system).

1. Device k's block T_k (its rows without the two couplings out of the block) is solved for
   three right-hand sides at once: y = T_k^{-1} b, v = T_k^{-1} (c_first e_1) and
   w = T_k^{-1} (c_last e_m), where c_first = lower of the block's first row (the coefficient
   of the previous block's last unknown) and c_last = upper of its last row (the coefficient
   of the next block's first unknown). Then x_k = y - v R_{k-1} - w L_{k+1}, with L_j and
   R_j the first and last unknowns of block j.
2. The first and last rows of that identity give 2P equations in the 2P boundary unknowns:
       L_k + v_first R_{k-1} + w_first L_{k+1} = y_first
       R_k + v_last  R_{k-1} + w_last  L_{k+1} = y_last
   Each device contributes its 6 numbers per system to one all-gather (communication per
   system: 6P values, whatever N), and every device solves the small 2P x 2P system (dense,
   with partial pivoting) for every system it holds.
3. Each device forms its x_k.

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

from ._dtypes import compute_dtype
from ._kernels._xla_banded import magnitude
from ._layout import broadcast_shape
from ._periodic import is_periodic


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
    k = lax.axis_index(names)

    def row(x, i):
        return jnp.broadcast_to(_rows(x, i, i + 1, axis) if x.shape[axis] > 1 else x,
                                shape[:axis] + (1,) + shape[axis + 1:])

    c_first, c_last = row(lower, 0), row(upper, m - 1)
    if not periodic:  # nothing couples out of the first and last blocks
        c_first = jnp.where(k == 0, 0, c_first)
        c_last = jnp.where(k == devices - 1, 0, c_last)
    index = lax.broadcasted_iota(jnp.int32, shape, axis)
    stacked = jnp.stack([jnp.broadcast_to(rhs, shape), jnp.where(index == 0, c_first, 0),
                         jnp.where(index == m - 1, c_last, 0)])
    y, v, w = local_solve(lower[None], diag[None], upper[None], stacked, axis=axis + 1,
                          kind="pivoted" if kind.endswith("pivoted") else "thomas")

    # The 6 boundary numbers of every system, from every block: (P, 6, *batch).
    ends = [jnp.squeeze(row(s, i), axis) for s in (y, v, w) for i in (0, m - 1)]
    gathered = lax.all_gather(jnp.stack(ends), names)
    y_first, y_last, v_first, v_last, w_first, w_last = (
        jnp.moveaxis(gathered[:, j], 0, -1) for j in range(6))  # each (*batch, P)

    # Unknowns (L_0, R_0, L_1, R_1, ...): row 2j is block j's first row, 2j + 1 its last.
    P = devices
    blocks = np.arange(P)
    previous_r, next_l = 2 * ((blocks - 1) % P) + 1, 2 * ((blocks + 1) % P)
    rows = np.concatenate([2 * blocks, 2 * blocks, 2 * blocks + 1, 2 * blocks + 1])
    cols = np.concatenate([previous_r, next_l, previous_r, next_l])
    values = jnp.concatenate([v_first, w_first, v_last, w_last], axis=-1)
    batch = values.shape[:-1]
    reduced = jnp.broadcast_to(jnp.eye(2 * P, dtype=cdt), batch + (2 * P, 2 * P))
    reduced = reduced.at[..., rows, cols].add(values)
    ends_rhs = jnp.stack([y_first, y_last], axis=-1).reshape(batch + (2 * P,))
    z = solve_small(reduced, ends_rhs)

    r_before = lax.dynamic_index_in_dim(z, 2 * ((k - 1) % P) + 1, axis=-1, keepdims=False)
    l_after = lax.dynamic_index_in_dim(z, 2 * ((k + 1) % P), axis=-1, keepdims=False)
    x = y - v * jnp.expand_dims(r_before, axis) - w * jnp.expand_dims(l_after, axis)
    return x.astype(out_dtype)


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


def recurrence_split(a, x, h0, *, names, devices: int, axis: int, reverse: bool, shifted: bool,
                     final_only: bool, local_recurrence) -> Array:
    """This device's part of the linear recurrence h[t] = c[t] h[t-1] + x[t] when its time axis
    is split into blocks over `names` (block k: steps k*m .. k*m + m - 1).

    Each block runs from a zero state to its local final state s_k, and D_k is the product of
    its coefficients; one all-gather of (D_k, s_k) (2 values per sequence and block) lets every
    device fold the blocks before its own, h_in = D_j h_in + s_j, then run its block once more
    from h_in. `local_recurrence(c, x, h0, final_only=)` is the single-device kernel (linear,
    not shifted). With `shifted` (c[t] = a at the previous step, zero at the very first step),
    the coefficient of a block's first step is the neighbouring block's edge value.
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
    return local_recurrence(c, x, h_in, final_only=False).astype(out_dtype)
