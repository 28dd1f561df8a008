"""The chunk sweeps of `_long_systems/chunked.py` composed from a backend's plain whole-system kernels.

The native C++ backend has dedicated kernels for the partition method (`chunk_ends_pnq`,
`chunk_solve_pnq`, `recurrence_ends_pnq`, `recurrence_pnq(..., chunk=m)`, semantics in
`chunks.cc` near `enum Mode`, `recurrence.cc` near `enum RecurrenceMode`). Backends without them ("xla",
the Pallas kernels) get the same four functions here, with the same signatures and the same
results (to rounding), built from their plain `solve` and `recurrence` over (P|1, N|1, Q|1)
operands: every chunk of m rows of every system becomes one system of a batch by a reshape,
(P, N, Q) -> (P, C, m, Q) -> (P*C, m, Q), so a Pallas launch gets P*C*Q lanes instead of P*Q.

**Chunk view.** Chunk c holds rows [c*m, min((c+1)*m, N)); the last may be short (L rows,
2 <= L <= m for solves). The reshape is free (a bitcast) when m divides N; otherwise every
operand that varies along N is copied once, padded to C*m rows (the planner can avoid this by
choosing an m that divides N). An operand broadcast along N stays broadcast (one value per
chunk); one broadcast along P but not N is copied per system (the chunk axis is merged with P).

**Solves.** Chunk c's interior rows 0..n-1 (n = len - 1) form T, its last row is the separator
s_c. The kernels run the chunk view with one coupling removed: omega, the entry of the last
interior row in the separator's column (upper[n-1], or lower[n] transposed), is zeroed in a
copy of that band (`_band_views`). The interior then no longer sees the separator, so the
kernel's x over the interior rows is exactly T^{-1} r, whatever the separator row holds (its
own output is ignored or overwritten); row 0's coupling to the previous separator and the
separator's coupling to the next chunk lie outside the chunk matrix, and no kernel reads them.
Padding rows follow the separator and cannot reach the interior either. `transposed` is
passed to the kernel, which reads the chunk view's transposed bands itself (sub[i] =
upper[i-1], sup[i] = lower[i+1] within the chunk), so no shifted band copies are made.

- `chunk_ends_pnq`: y = T^{-1} b, T^{-1} e_1, T^{-1} e_n (scaled by alpha and omega
  afterwards) and yr = T^{-1} r (r: the rows' sums, formed by XLA) from the kernel's first and
  last interior rows, and the ten (P, C, Q) arrays of the reduced system from them and the
  separator rows' band values (`_long_systems/chunked.py` says why both forms of its diagonal). When the
  three bands are broadcast along P or Q of the chunk view (a matrix shared by systems), the
  four right-hand sides are stacked along that axis:
  ONE kernel call, one read of the bands, at the cost of a copy of b into the stack.
  Otherwise FOUR calls, one per right-hand side: the kernels broadcast an operand only along
  an axis of size 1, so stacking would need four copies of every band (more traffic than
  three more sweeps, whose spike right-hand sides (1, m, 1) cost nothing to read).
- `chunk_solve_pnq`: ONE kernel call on b with its end rows adjusted (b[0] -= alpha x[s_{c-1}],
  b[n-1] -= omega x[s_c], the native kernel's arithmetic), then the separators written into
  the separator rows of x in place.

Memory traffic, in passes over one (P, N, Q) array, bands and b full, m dividing N: the
omega-zeroed band copy 2 (shared by both sweeps when they run in one jit, by CSE); the Pallas
thomas kernel reads 3 bands and b, writes and re-reads c' and y' and writes x: 9 passes per
call, 8 for a spike (its right-hand side (1, m, 1) costs nothing to read). Ends: 9 + 2 * 8 + 4
(the row sums) + 9 = 38 (four calls); stacked (bands broadcast, so small): 3 (b and r copied
into the stack) + 6. Fix-up: 2 (b adjusted) + 9. In all about 51 passes against the native
partition method's 9 (and the floor's 5): the price of reusing whole-system kernels, which
write every row of every sweep.
A short last chunk adds a padding copy of each operand per sweep and a copy of x.

**Recurrences.** `recurrence_ends_pnq`: the final states from zero, one kernel call with
`final_only` over the chunk view (padding steps placed *before* the real ones in scan order,
with x = 0, so the state stays zero through them; a chunk's first coefficient multiplies the
zero state, so `shifted` needs nothing more); the decays, products of each chunk's
coefficients, by an XLA reduction over the reshaped `a` (one read of `a`, no kernel). The
chunked run `recurrence_pnq(..., chunk=m)`: one kernel call over the chunk view with one
entering state per chunk (padding steps *after* the real ones in scan order, their outputs
dropped). With `shifted`, a chunk's first step takes its coefficient from the neighbouring
chunk, which the plain kernel cannot see: that term, c_first * h0, is added to the first
step's x in a copy of x (or, for an `a` broadcast along T, the coefficient is `a` itself at
every step but the very first, and the unshifted kernel runs with that chunk's state zeroed).
Traffic: ends 2 + 1 passes (kernel: a, x; reduction: a), run 3 (+ 2 with `shifted`).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import Array, lax

from .._core.dtypes import compute_dtype
from .._core.layout import broadcast_shape, rows_at
from .._core.split_complex import magnitude
from .chunked import SUMS_MARGIN

# ---------------------------------------------------------------------------------------------
# The chunk view.


def _count(N: int, m: int) -> tuple[int, int]:
    """(C, L): chunks of m rows over N rows and the length of the last."""
    C = -(-N // m)
    return C, N - (C - 1) * m


def _pad(v: Array, N: int, C: int, m: int, at: str, fill) -> Array:
    """(p, N, q) padded to C*m rows with `fill`: after the last row (`at="end"`) or in front of
    the last chunk's rows (`at="front"`)."""
    extra = C * m - N
    if not extra:
        return v
    p, _, q = v.shape
    block = jnp.full((p, extra, q), fill, v.dtype)
    if at == "end":
        return lax.concatenate([v, block], 1)
    cut = (C - 1) * m
    return lax.concatenate([lax.slice_in_dim(v, 0, cut, axis=1), block,
                            lax.slice_in_dim(v, cut, N, axis=1)], 1)


def _unpad(v: Array, N: int, C: int, m: int, at: str) -> Array:
    """The N real rows of (P, C*m, Q) padded as `_pad(..., at)`."""
    if C * m == N:
        return v
    if at == "end":
        return lax.slice_in_dim(v, 0, N, axis=1)
    cut = (C - 1) * m
    return lax.concatenate([lax.slice_in_dim(v, 0, cut, axis=1),
                            lax.slice_in_dim(v, C * m - (N - cut), C * m, axis=1)], 1)


def chunk_view(v: Array, P: int, N: int, C: int, m: int, *, at: str = "end", fill=0,
               rows: bool = False) -> Array:
    """(p, n, q) operand (p in {1, P}, n in {1, N}) as its chunk view (P*C|1, m|1, q).

    An operand broadcast along N keeps size 1 there (unless `rows`: then it is materialised, as
    padding must hold `fill`); one broadcast along P but not N is copied per system."""
    p, n, q = v.shape
    if n == 1 and not rows:
        if p == 1:
            return v
        return jnp.broadcast_to(v[:, None], (p, C, 1, q)).reshape(p * C, 1, q)
    v = _pad(jnp.broadcast_to(v, (p, N, q)), N, C, m, at, fill)
    if p == 1 and P > 1:
        v = jnp.broadcast_to(v, (P, C * m, q))
        p = P
    return v.reshape(p * C, m, q)


def per_chunk_view(v: Array, P: int) -> Array:
    """(p, C, q) values, one per chunk (p in {1, P}), as (P*C, 1, q) for the chunk view."""
    _, C, q = v.shape
    return jnp.broadcast_to(v, (P, C, q)).reshape(P * C, 1, q)


def _row_mask(P: int, C: int, m: int, row: int, last_row: int) -> Array:
    """Chunk-view mask of row `row` of every chunk (`last_row` of the last chunk): (1, m, 1),
    or (P*C, m, 1) when the last chunk differs."""
    r = lax.broadcasted_iota(np.int32, (1, m, 1), 1)
    if row == last_row:
        return r == row
    c = lax.broadcasted_iota(np.int32, (P * C, 1, 1), 0) % C
    return r == jnp.where(c == C - 1, last_row, row)


def _as_chunks(s: Array, C: int) -> Array:
    """Kernel output (P*C|1, m, q) as (P|1, C, m, q)."""
    if s.shape[0] == 1:
        return jnp.broadcast_to(s[:, None], (1, C) + s.shape[1:])
    return s.reshape(s.shape[0] // C, C, *s.shape[1:])


def _pick(s: Array, C: int, row: int, last_row: int) -> Array:
    """Row `row` of every chunk of a kernel output (P*C|1, m, q) (`last_row` of the last):
    (P|1, C, q). Taken by a strided slice of the rows laid end to end: a slice of the
    (P, C, m, q) view lets XLA lay the kernel's output out with the chunk axis inside the rows,
    a copy of all of it."""
    n, m, q = s.shape

    def rows(r):
        flat = s.reshape(n * m, q)
        return _as_chunks(lax.slice(flat, (r, 0), (n * m, q), (m, 1))[:, None], C)[:, :, 0]

    if row == last_row:
        return rows(row)
    return lax.concatenate([rows(row)[:, : C - 1], rows(last_row)[:, C - 1 :]], 1)


def first_chunk_zero(v: Array, keep: bool) -> Array:
    """(p, C, q) with chunk 0 set to zero (unless `keep`)."""
    if keep:
        return v
    c = lax.broadcasted_iota(np.int32, (1, v.shape[1], 1), 1)
    return jnp.where(c == 0, jnp.zeros((), v.dtype), v)


def previous_chunk(v: Array, periodic: bool) -> Array:
    """(p, C, q) values of the chunk before each: chunk 0 gets the last chunk's when
    `periodic` (its previous separator is row N-1), zero otherwise."""
    return first_chunk_zero(jnp.roll(v, 1, axis=1), periodic)


def separators_around(separators: Array, *, P: int, C: int, periodic: bool, dtype):
    """(left, right), each (P, C, q) in `dtype`: the separators before and after every chunk's
    interior (`previous_chunk` of its own), from the reduced system's (P|1, C, q) answer."""
    if separators.shape[1] != C:
        raise ValueError(f"expected {C} separators per system, got shape {separators.shape}")
    right = jnp.broadcast_to(separators.astype(dtype), (P, C, separators.shape[2]))
    return previous_chunk(right, periodic), right


# ---------------------------------------------------------------------------------------------
# Solves.


def _check_chunk(N: int, m: int) -> tuple[int, int]:
    C, L = _count(N, m)
    if m < 2 or L < 2:
        raise ValueError(f"every chunk needs >= 2 rows: chunk={m} does not fit N={N} "
                         "(see _planner.valid_chunk)")
    return C, L


def _band_views(l, d, u, *, P: int, N: int, C: int, m: int, L: int, transposed: bool,
                pivoting: bool = False):
    """Chunk views of the bands with omega, the coupling of each chunk's last interior row to
    its separator, zeroed: upper at interior row n-1 (lower at the separator row n when
    transposed). When padding, the padding rows are identity rows (lower 0, diag 1, upper 0,
    lower and diag materialised if broadcast along N) and upper[N-1], which lies outside the
    matrix or is a periodic corner that the reduced system carries, is zeroed: the padding
    then neither reaches the real rows nor produces infinities.

    `pivoting`: the separator rows become identity rows too. Unpivoted, the separator row only
    follows the interior (its value is discarded); with row interchanges it could be chosen as
    a pivot and carry its own (possibly zero) diagonal into the interior's answer."""
    padded = C * m != N
    lv = chunk_view(l, P, N, C, m, fill=0, rows=padded)
    dv = chunk_view(d, P, N, C, m, fill=1, rows=padded)
    if padded and u.shape[1] != 1:
        u = lax.concatenate([lax.slice_in_dim(u, 0, N - 1, axis=1),
                             jnp.zeros((u.shape[0], 1, u.shape[2]), u.dtype)], 1)
    uv = chunk_view(u, P, N, C, m, fill=0)
    zero = jnp.zeros((), u.dtype)
    separator = _row_mask(P, C, m, m - 1, L - 1)
    if pivoting:
        # Zero both couplings between row n-1 and the separator row n, whichever way the
        # bands are read, and give the separator row a unit diagonal.
        lv = jnp.where(separator, zero, lv)
        uv = jnp.where(_row_mask(P, C, m, m - 2, L - 2), zero, uv)
        dv = jnp.where(separator, jnp.ones((), dv.dtype), dv)
    elif transposed:
        lv = jnp.where(separator, zero, lv)
    else:
        uv = jnp.where(_row_mask(P, C, m, m - 2, L - 2), zero, uv)
    return lv, dv, uv


def _couplings(l, u, *, N: int, C: int, m: int, transposed: bool, periodic: bool):
    """Per chunk (p, C, q): alpha (row 0's coupling to the previous separator), beta (the
    previous separator's coupling to row 0), zero for chunk 0 unless periodic, and omega."""
    starts = np.arange(C) * m
    seps = np.minimum(starts + m, N) - 1
    first_lower = rows_at(l, starts)
    upper_before = rows_at(u, (starts - 1) % N)  # row N-1 (the corner) for chunk 0
    alpha, beta = (upper_before, first_lower) if transposed else (first_lower, upper_before)
    alpha, beta = (first_chunk_zero(v, periodic) for v in (alpha, beta))
    omega = rows_at(l, seps) if transposed else rows_at(u, seps - 1)
    return alpha, beta, omega, seps


def _row_sums(l, d, u, *, N: int, transposed: bool, periodic: bool) -> Array:
    """The row sums of A (of A^T when `transposed`) along axis 1 of (P|1, N|1, Q|1) bands,
    (P|1, N, Q|1): sub[i] + d[i] + sup[i], the corners included when `periodic`, lower[0] and
    upper[N-1] left out otherwise (they lie outside the matrix and may hold anything)."""
    def rows(v):
        return jnp.broadcast_to(v, (v.shape[0], N, v.shape[2]))

    l, d, u = rows(l), rows(d), rows(u)
    if transposed:  # sub[i] = upper[i-1], sup[i] = lower[i+1], cyclically
        sub = lax.concatenate([lax.slice_in_dim(u, N - 1, N, axis=1),
                               lax.slice_in_dim(u, 0, N - 1, axis=1)], 1)
        sup = lax.concatenate([lax.slice_in_dim(l, 1, N, axis=1),
                               lax.slice_in_dim(l, 0, 1, axis=1)], 1)
    else:
        sub, sup = l, u
    if not periodic:
        i = lax.broadcasted_iota(np.int32, (1, N, 1), 1)
        zero = jnp.zeros((), d.dtype)
        sub, sup = jnp.where(i == 0, zero, sub), jnp.where(i == N - 1, zero, sup)
    return (sub + d) + sup


def chunk_ends_pnq(solve, l, d, u, b, *, transposed: bool, periodic: bool, chunk: int, tiling,
                   pivoting: bool = False, stack: bool = True):
    """The partition method's first sweep over (P|1, N|1, Q|1) operands by the plain kernel
    `solve` (its pivoted kind with `pivoting`): the ten (P, C, Q) arrays of
    `_native.chunk_ends_pnq` (chunks.cc, `Mode`), in b's dtype (the compute dtype), the
    reduced rows' sums from a fourth right-hand side, the rows' sums r (`_long_systems/chunked.py`).
    `stack=False` always runs four sweeps (see `composed`)."""
    P, N, Q = broadcast_shape(l, d, u, b)
    m = int(chunk)
    C, L = _check_chunk(N, m)
    dtype = b.dtype
    l, d, u = (v.astype(dtype) for v in (l, d, u))
    alpha, beta, omega, seps = _couplings(l, u, N=N, C=C, m=m, transposed=transposed,
                                          periodic=periodic)
    separator = _separator_rows(l, d, u, b, seps, transposed=transposed)

    bands = _band_views(l, d, u, P=P, N=N, C=C, m=m, L=L, transposed=transposed,
                        pivoting=pivoting)
    bv = chunk_view(b, P, N, C, m, fill=0)
    rv = chunk_view(_row_sums(l, d, u, N=N, transposed=transposed, periodic=periodic), P, N, C,
                    m, fill=0)
    rows = lax.broadcasted_iota(np.int32, (1, m, 1), 1)
    e_first = (rows == 0).astype(dtype)
    e_last = _row_mask(P, C, m, m - 2, L - 2).astype(dtype)
    rhs = (bv, e_first, e_last, rv)
    full = broadcast_shape(*bands, *rhs)
    run = functools.partial(solve, transposed=transposed, out_dtype=dtype,
                            kind="pivoted" if pivoting else "thomas", tiling=tiling)
    stack = next((k for k in (2, 0) if all(v.shape[k] == 1 for v in bands + (e_last, rv))),
                 None) if stack else None
    if stack is None:
        # Four sweeps: see the module docstring (stacking would copy every band four times).
        y, v1, wn, yr = (run(*bands, r) for r in rhs)
    else:
        # One sweep: the bands broadcast along `stack`, where the right-hand sides are stacked.
        parts = [jnp.broadcast_to(r, full[:stack] + (r.shape[stack],) + full[stack + 1:])
                 for r in rhs]
        x = run(*bands, lax.concatenate(parts, stack))
        nb = parts[0].shape[stack]
        y, v1, wn, yr = (lax.slice_in_dim(x, lo, hi, axis=stack) for lo, hi in
                         ((0, nb), (nb, nb + 1), (nb + 1, nb + 2), (nb + 2, nb + 3)))
    ends = [(_pick(s, C, 0, 0), _pick(s, C, m - 2, L - 2)) for s in (y, v1, wn, yr)]
    return reduced_rows(*ends, separator=separator, alpha=alpha, beta=beta, omega=omega,
                        shape=(P, C, Q), dtype=dtype)


def _separator_rows(l, d, u, b, seps, *, transposed: bool):
    """(sub, d, b) of the separator rows `seps`, each (p, C, q): what the reduced system takes
    from them besides the chunks' ends."""
    sub_n = rows_at(u, seps - 1) if transposed else rows_at(l, seps)
    return sub_n, rows_at(d, seps), rows_at(b, seps)


def reduced_rows(y, v1, wn, yr, *, separator, alpha, beta, omega, shape, dtype):
    """The ten (P, C, Q) arrays of `_native.chunk_ends_pnq` (chunks.cc, `Mode`) from each chunk's
    interior solutions at its first and last interior rows, a (first, last) pair each: y =
    T^{-1} b, v1 = T^{-1} e_1, wn = T^{-1} e_n (unscaled by alpha and omega), yr = T^{-1} r
    (r: the rows' sums, `_long_systems/chunked.py`); `separator`: `_separator_rows`."""
    sub_n, d_n, b_n = separator
    (y_first, y_last), (yr_first, yr_last) = y, yr
    v_first, v_last = (alpha * v for v in v1)
    w_first, w_last = (omega * w for w in wn)
    one = jnp.ones((), dtype)
    mag, margin = magnitude, SUMS_MARGIN
    out = (-sub_n * v_last, d_n - sub_n * w_last, (sub_n + d_n) - sub_n * yr_last,
           b_n - sub_n * y_last, margin * mag(sub_n * yr_last) - mag(sub_n * w_last),
           -beta * v_first, beta * (one - yr_first), -beta * w_first, -beta * y_first,
           margin * mag(beta * yr_first) - mag(beta * v_first))
    return tuple(jnp.broadcast_to(v, shape).astype(dtype) for v in out)


def chunk_solve_pnq(solve, l, d, u, b, separators, *, transposed: bool, periodic: bool,
                    chunk: int, tiling, pivoting: bool = False):
    """The partition method's last sweep by the plain kernel `solve`: x (P, N, Q) in b's dtype,
    every chunk's interior solved with its separators (P|1, C, Q|1) known, as
    `_native.chunk_solve_pnq`."""
    P, N, Q = broadcast_shape(l, d, u, b)
    m = int(chunk)
    C, L = _check_chunk(N, m)
    dtype = b.dtype
    left, right = separators_around(separators, P=P, C=C, periodic=periodic, dtype=dtype)
    l, d, u = (v.astype(dtype) for v in (l, d, u))
    alpha, _, omega, _ = _couplings(l, u, N=N, C=C, m=m, transposed=transposed,
                                    periodic=periodic)

    bands = _band_views(l, d, u, P=P, N=N, C=C, m=m, L=L, transposed=transposed,
                        pivoting=pivoting)
    bv = chunk_view(b, P, N, C, m, fill=0, rows=True)
    zero = jnp.zeros((), dtype)
    first = lax.broadcasted_iota(np.int32, (1, m, 1), 1) == 0
    last = _row_mask(P, C, m, m - 2, L - 2)
    # The native kernel's end rows: b[0] - alpha x_left, then b[n-1] - omega x_right (both on
    # row 0 when n = 1); other rows unchanged (b - 0 - 0 == b).
    r = (bv - jnp.where(first, per_chunk_view(alpha * left, P), zero)
         - jnp.where(last, per_chunk_view(omega * right, P), zero))
    x = solve(*bands, r, transposed=transposed, out_dtype=dtype,
              kind="pivoted" if pivoting else "thomas", tiling=tiling)
    # The separator rows hold whatever the kernel made of them: overwritten (in place).
    x = jnp.broadcast_to(x, (P * C, m, Q)).reshape(P, C, m, Q)
    right = jnp.broadcast_to(right, (P, C, Q))
    x = lax.dynamic_update_slice(x, right[:, :, None], (0, 0, m - 1, 0))
    if L != m:
        x = lax.dynamic_update_slice(x, right[:, C - 1 :, None], (0, C - 1, L - 1, 0))
    return _unpad(x.reshape(P, C * m, Q), N, C, m, "end")


# ---------------------------------------------------------------------------------------------
# Recurrences.


def _first_coefficients(a: Array, *, T: int, C: int, m: int, reverse: bool) -> Array:
    """The shifted coefficient of each chunk's first step in scan order, (p, C, q): a at the
    previous chunk's last step (the next chunk's first when `reverse`), zero at the very first
    step of the sequence."""
    p, _, q = a.shape
    a = jnp.broadcast_to(a, (p, T, q))
    zero = jnp.zeros((p, 1, q), a.dtype)
    if C == 1:
        return zero
    if reverse:  # rows m, 2m, ..., (C-1)m
        return lax.concatenate([lax.slice_in_dim(a, m, (C - 1) * m + 1, stride=m, axis=1), zero], 1)
    return lax.concatenate([zero, lax.slice_in_dim(a, m - 1, (C - 1) * m, stride=m, axis=1)], 1)


def _decays(a: Array, *, T: int, C: int, m: int, L: int, reverse: bool, shifted: bool) -> Array:
    """The product of each chunk's coefficients, (p, C, q): an XLA reduction over the reshaped
    `a` (broadcast along T inside the fusion when `a` is)."""
    p, _, q = a.shape
    a = jnp.broadcast_to(a, (p, T, q))
    # Shifted, a chunk's coefficients are its own a but one end row, and one from its neighbour.
    lo = 1 if shifted and reverse else 0
    cut = 1 if shifted and not reverse else 0
    whole = C if L == m else C - 1
    parts = []
    if whole:
        body = lax.slice_in_dim(a, 0, whole * m, axis=1).reshape(p, whole, m, q)
        parts.append(jnp.prod(body[:, :, lo : m - cut], axis=2))
    if L != m:
        tail = lax.slice_in_dim(a, whole * m, T, axis=1)
        parts.append(jnp.prod(tail[:, lo : L - cut], axis=1, keepdims=True))
    decay = lax.concatenate(parts, 1)
    if shifted:
        decay = _first_coefficients(a, T=T, C=C, m=m, reverse=reverse) * decay
    return decay


def recurrence_ends_pnq(recurrence, a, x, *, reverse: bool, shifted: bool, chunk: int, tiling,
                        gate=None):
    """Each chunk of `chunk` steps of the (P|1, T|1, Q|1) recurrence run from a zero state, by
    the plain kernel `recurrence`: (decay, final), two (P, C, Q) arrays in x's dtype, as
    `_native.recurrence_ends_pnq`. `gate` is not supported (NotImplementedError)."""
    if gate is not None:
        raise NotImplementedError("the composed chunk sweeps run ungated recurrences only")
    dtype = x.dtype
    a = a.astype(dtype)
    P, T, Q = broadcast_shape(a, x)
    m = int(chunk)
    C, L = _count(T, m)
    # Padding steps before the real ones in scan order, with x = 0: the state stays zero.
    at = "end" if reverse else "front"
    av = chunk_view(a, P, T, C, m, at=at, fill=0)
    xv = chunk_view(x, P, T, C, m, at=at, fill=0, rows=C * m != T)
    final = recurrence(av, xv, jnp.zeros((1, 1, 1), dtype), reverse=reverse, shifted=shifted,
                       activation=None, final_only=True, out_dtype=dtype, tiling=tiling)
    final = _as_chunks(final, C)[:, :, 0]
    decay = _decays(a, T=T, C=C, m=m, L=L, reverse=reverse, shifted=shifted)
    return tuple(jnp.broadcast_to(v, (P, C, Q)).astype(dtype) for v in (decay, final))


def recurrence_pnq(recurrence, a, x, h0, *, reverse: bool, shifted: bool, activation,
                   final_only: bool, out_dtype, tiling, chunk: int = 0, gate=None, sums=None):
    """The plain kernel `recurrence` over (P|1, T|1, Q|1) operands, and with `chunk` > 0 the
    chunked run of `_native.recurrence_pnq`: h0 is (P|1, C, Q|1), the state entering each chunk
    of `chunk` steps in scan order; returns (P, T, Q) in `out_dtype`. `gate` and `sums` are
    passed to the plain kernel (`_recurrence/pallas_tpu.py`); with `chunk`, neither they nor
    `final_only` are supported (final states of chunks come from `recurrence_ends_pnq`)."""
    if not chunk:
        return recurrence(a, x, h0, reverse=reverse, shifted=shifted, activation=activation,
                          final_only=final_only, out_dtype=out_dtype, tiling=tiling, gate=gate,
                          sums=sums)
    if gate is not None or sums is not None:
        raise NotImplementedError("the composed chunk sweeps run ungated recurrences only, "
                                  "without sums")
    if final_only:
        raise NotImplementedError("a chunked run writes every state; final states of chunks "
                                  "come from recurrence_ends")
    cdt = compute_dtype(out_dtype)
    a, x, h0 = (v.astype(cdt) for v in (a, x, h0))
    P, T, Q = broadcast_shape(a, x, h0[:, :1])
    m = int(chunk)
    C, L = _count(T, m)
    if h0.shape[1] != C:
        raise ValueError(f"h0 needs one state per chunk: ({P}, {C}, {Q}), got {h0.shape}")
    # Padding steps after the real ones in scan order: their states are dropped.
    at = "front" if reverse else "end"
    h0 = jnp.broadcast_to(h0, (P, C, h0.shape[2]))
    xv = None
    kernel_shifted = shifted
    if shifted and a.shape[1] == 1:
        # Every coefficient is a but the very first step's (zero): unshifted, that chunk's
        # entering state zeroed.
        c = lax.broadcasted_iota(np.int32, (1, C, 1), 1)
        h0 = jnp.where(c == (C - 1 if reverse else 0), jnp.zeros((), cdt), h0)
        kernel_shifted = False
    elif shifted:
        # The plain kernel gives each chunk's first step a zero coefficient; the neighbour's
        # term c_first * h0 joins that step's x instead, and the entering state is unused.
        carry = _first_coefficients(a, T=T, C=C, m=m, reverse=reverse) * h0
        xv = chunk_view(x, P, T, C, m, at=at, fill=0, rows=True)
        first = lax.broadcasted_iota(np.int32, (1, m, 1), 1) == (m - 1 if reverse else 0)
        xv = xv + jnp.where(first, per_chunk_view(carry, P), jnp.zeros((), cdt))
        h0v = jnp.zeros((1, 1, 1), cdt)
    if xv is None:
        xv = chunk_view(x, P, T, C, m, at=at, fill=0)
        h0v = per_chunk_view(h0, P)
    av = chunk_view(a, P, T, C, m, at=at, fill=0)
    h = recurrence(av, xv, h0v, reverse=reverse, shifted=kernel_shifted, activation=activation,
                   final_only=False, out_dtype=out_dtype, tiling=tiling)
    h = jnp.broadcast_to(h, (P * C, m, Q)).reshape(P, C * m, Q)
    return _unpad(h, T, C, m, at)


# ---------------------------------------------------------------------------------------------


def composed(solve, recurrence, *, stack: bool = True) -> dict:
    """The chunk sweeps of a backend from its plain kernels `solve(l, d, u, b, *, transposed,
    out_dtype, kind, tiling)` and `recurrence(a, x, h0, *, reverse, shifted, activation,
    final_only, out_dtype, tiling)`: a dict with "chunk_ends", "chunk_solve",
    "recurrence_ends" and "recurrence" (chunk=0 defers to the plain kernel), callables with the
    signatures of their `_native` counterparts (`_backend.Kernels`).

    `stack=False`: never stack the three right-hand sides of the ends sweep. Triton (the jaxlib
    of jax 0.10.2, sm_90a) intermittently rejects the stacked launch inside a chunked module
    ("'arith.addi' op operand #0 must be signless ... integer-like" in a masked load of a
    (16, 4) tile against broadcast (16, 1) bands), never the three plain ones."""
    return {
        "chunk_ends": functools.partial(chunk_ends_pnq, solve, stack=stack),
        "chunk_solve": functools.partial(chunk_solve_pnq, solve),
        "recurrence_ends": functools.partial(recurrence_ends_pnq, recurrence),
        "recurrence": functools.partial(recurrence_pnq, recurrence),
    }
