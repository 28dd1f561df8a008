"""The partition method's two sweeps (`_long_systems/chunked.py`) as Mosaic TPU kernels.

Composed around whole-system solves (`_long_systems/composed_chunks.py`), the first sweep
solves every chunk for four right-hand sides and writes every row of each, which the second
reads back only at the chunks' ends. Here both sweeps run over the same chunk view,
(P, N, Q) -> (P*C, m, Q) with m dividing N (a reshape that moves nothing: a TPU tiles the last
two dimensions), and each reads the bands and b once:

- `chunk_ends_pnq`: one forward elimination of every chunk's interior (rows 0..n-1, n = m-1;
  the last row is the separator) for y' = b, v' = e_1 and yr' = r (the rows' sums, formed in
  the kernel from the bands and row 0's coupling, `_first_coupling`), writing only eight row
  tiles per chunk: at the last interior row, y' and v' and yr' are the solutions themselves
  (x[n-1] = y'[n-1] once the separator's coupling omega is left out) and T^{-1} e_n is
  1 / p[n-1]; at row 0 the solutions are sums over the rows, x[0] = sum_k w[k] y'[k] with
  w[0] = 1, w[k] = -c'[k-1] w[k-1], compensated as the streamed periodic solve sums them
  (`pallas_tpu._first_row_sums`), and T^{-1} e_n's is w[n-1] / p[n-1]. yr' runs one row
  behind: its right-hand side at row k needs sup[k], which a transposed solve reads at row
  k+1 (l[k+1]). It also writes the band values the reduced system takes from each chunk's end
  rows (`_BAND_ENDS`), which XLA would otherwise slice from the bands: one system's (C, m)
  view is tiled with its chunks along lanes, and a column slice of it reads every tile.
- `chunk_solve_pnq`: the "thomas" solve kernel over the chunk view with each chunk's ends known
  (`pallas_tpu.solve_pnq(separators=...)`): row 0's coupling to the previous separator moves
  to its right-hand side and the separator row becomes an identity row holding the separator,
  so x is written once, separators included, and no band or b is copied.

Row 0's coupling to the previous separator is its own l[0], read by both kernels, except in
a transposed solve: there it is the previous chunk's u at its separator row, sliced from the
chunk view (`_first_coupling`; one system's as the 2D (C, m) array, where strided slices of
its (1, N, 1) rows would make XLA lay the arrays out again).

Memory traffic: the four inputs read twice and x written once, 9 passes over an array
against the floor's 5 (the composed sweeps: 30 on a TPU); a transposed solve of one system
reads u once more for its slice. Both fall back to the composed sweeps where they do not
apply: pivoted solves (their chunks pivot, `solve_any` checks the answer), a padded last
chunk (m not dividing N) and chunks too long for one launch of the solve kernel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .._core.layout import broadcast_shape
from .._core.split_complex import magnitude, select
from .._long_systems import composed_chunks as _composed
from .._pallas import tpu as _tpu
from . import pallas_tpu as _thomas

# The ends each chunk writes, in this order (`_ends_kernel`).
_ENDS = ("y_first", "y_last", "v_first", "v_last", "w_first", "w_last", "yr_first", "yr_last")
# Then the band values the reduced system takes from each chunk's end rows: (band: 0..3 for
# l, d, u, b; row: 0, or counted from the end), in this order.
_BAND_ENDS = ((0, 0), (2, -2), (0, -1), (1, -1), (2, -1), (3, -1))
# The forward sweep's carry: p, y', v' of the row before, u[i-1], sub[i-1], sub[i-1] + d[i-1]
# (its sum's start), yr' two rows before, w of the row before; then three compensated sums.
_STATE = 8
_CARRIED = _STATE + 6


def _ends_row(transposed, bands, state, *, first, interior):
    """One row of the ends sweep (`first`: row 0; `interior`: not the separator row, which
    only finishes yr' of the row above it). Returns the next state. `bands`: this row's l, d,
    u, b and the chunk's alpha: row 0's coupling to the previous separator where
    `transposed`, else whether row 0 couples to one (nonzero: its own l[0] does)."""
    l_i, d_i, u_i, b_i, alpha = bands
    if not transposed:
        alpha = select(magnitude(alpha) != 0, l_i, 0.0)
    p, y, v, u_prev, a_prev, sd_prev, yr, w = state[:_STATE]
    sum_y, error_y, sum_v, error_v, sum_r, error_r = state[_STATE:]
    sup_prev = l_i if transposed else u_prev  # sup[i-1]: omega at the separator row
    # yr'[i-1]: row i-1's sum is complete with sup[i-1]
    yr_prev = (sd_prev + sup_prev - a_prev * yr) / p
    sub = select(first, 0.0, u_prev if transposed else l_i)
    c_prev = select(first, 0.0, sup_prev / p)
    p_i = d_i - sub * c_prev
    y_i = (b_i - sub * y) / p_i
    v_i = (select(first, 1.0, 0.0) - sub * v) / p_i
    w_i = select(first, 1.0, -c_prev * w)
    sums_r = _thomas._compensated_add(sum_r, error_r, w * yr_prev)
    sums_y = _thomas._compensated_add(sum_y, error_y, w_i * y_i)
    sums_v = _thomas._compensated_add(sum_v, error_v, w_i * v_i)
    kept = (p, y, v, w, sum_y, error_y, sum_v, error_v)
    new = (p_i, y_i, v_i, w_i, *sums_y, *sums_v)
    p, y, v, w, sum_y, error_y, sum_v, error_v = (
        select(interior, n, o) for n, o in zip(new, kept, strict=True))
    sum_r, error_r = (select(first, o, n) for n, o in zip(sums_r, (sum_r, error_r), strict=True))
    sd_i = select(first, alpha, sub) + d_i
    return (p, y, v, u_i, sub, sd_i, select(first, 0.0, yr_prev), w,
            sum_y, error_y, sum_v, error_v, sum_r, error_r)


def _ends(state):
    """The chunk's ends (`_ENDS`) from the state after its separator row."""
    p, y, v, _, _, _, yr, w = state[:_STATE]
    sum_y, error_y, sum_v, error_v, sum_r, error_r = state[_STATE:]
    return (sum_y + error_y, y, sum_v + error_v, v, w / p, 1.0 / p, sum_r + error_r, yr)


def _ends_kernel(*refs, g, ops, transposed, parts):
    """Refs: the operands' blocks (l, d, u, b and alpha's tile), the ends' block (a row tile
    each of `_ENDS`, then of `_BAND_ENDS`), the carry, the stages of staged operands; each in
    its `parts`."""
    band_refs, (ends_ref, carry_ref, *stages) = refs[:5 * parts], refs[5 * parts:]
    j = pl.program_id(2)
    io, carry = _thomas._Parts(g, parts), _tpu.CarryTiles(carry_ref, parts)
    readers = io.readers(ops, band_refs, stages)

    @pl.when(j == 0)
    def _():
        zero = jnp.zeros(g.tile, jnp.float32)
        carry.store([zero + 1.0] + [zero] * (_CARRIED - 1))

    def run(count):
        def row(i, state):
            r = j * g.chunk + i
            bands = [reader.load(i) for reader in readers]
            return _ends_row(transposed, bands, state, first=r == 0, interior=r < g.N - 1)

        carry.store(_tpu.loop(count, row, carry.load(_CARRIED)))

    _tpu.over_rows(g, j, run)
    ends = _tpu.CarryTiles(ends_ref, parts)

    @pl.when(j == g.chunks - 1)
    def _():
        ends.store(_ends(carry.load(_CARRIED)))

    for n, (band, row) in enumerate(_BAND_ENDS):
        row %= g.N

        @pl.when(j == row // g.chunk)
        def _():
            ends.set(len(_ENDS) + n, readers[band].load(row % g.chunk))


def _chunk_shape(l, d, u, b, chunk):
    """(P, N, Q, C, m) of a chunked solve, or None where the kernels do not apply."""
    P, N, Q = broadcast_shape(l, d, u, b)
    m = int(chunk)
    if N % m:
        return None
    return P, N, Q, N // m, m


def _views(operands, P, N, C, m):
    return [_composed.chunk_view(v, P, N, C, m) for v in operands]


def _last_row_of_chunks(view, C: int):
    """The last row of every chunk of a chunk view (P*C|1, m|1, q): (P|1, C, q). Sliced from
    the view (one system's as the 2D (C, m) array the kernels read): a strided slice of the
    (P, N, Q) rows would make XLA lay a (1, N, 1) array out again, row by row."""
    n, m, q = view.shape
    values = view.reshape(n, m)[:, m - 1, None] if q == 1 else view[:, m - 1]
    if n == 1:
        return jnp.broadcast_to(values[None], (1, C, q))
    return values.reshape(n // C, C, q)


def _first_coupling(views, *, C: int, transposed: bool, periodic: bool):
    """The kernels' alpha operand, (P|1, C, Q|1): a transposed solve's row 0 couples to the
    previous separator through the previous chunk's u at its separator row, which the chunk's
    kernels do not read, so that coupling is sliced from the chunk view; otherwise row 0's
    own l[0] is the coupling, and alpha says only whether there is one (every chunk but the
    first, unless periodic)."""
    if transposed:
        return _composed.previous_chunk(_last_row_of_chunks(views[2], C), periodic)
    return _composed.first_chunk_zero(jnp.ones((1, C, 1), jnp.float32), periodic)


def _ends_of_chunks(band_ends, *, transposed: bool, periodic: bool):
    """What the reduced system takes from the chunks' end rows (`_BAND_ENDS`, each (P, C,
    Q)): the couplings alpha (row 0 to the previous separator), beta (the previous separator
    to row 0; both zero for chunk 0 unless periodic, where the previous is the last) and omega
    (the last interior row to the separator), and the separator rows' (sub, d, b)."""
    l_first, u_before_last, l_last, d_last, u_last, b_last = band_ends
    separator_upper = _composed.previous_chunk(u_last, periodic)
    first_lower = _composed.first_chunk_zero(l_first, periodic)
    alpha, beta = ((separator_upper, first_lower) if transposed
                   else (first_lower, separator_upper))
    omega = l_last if transposed else u_before_last
    sub = u_before_last if transposed else l_last
    return alpha, beta, omega, (sub, d_last, b_last)


def _end_values(l, d, u, b, alpha, *, transposed, out_dtype, interpret):
    """The ends (`_ENDS`, then `_BAND_ENDS`) of every chunk of the chunk view's systems
    (P*C|1, m, Q|1) in out_dtype, each (P*C, 1, Q); `alpha`: `_first_coupling`'s."""
    P, N, Q = broadcast_shape(l, d, u, b, alpha)
    parts, _ = _tpu.split_dtype(out_dtype)
    complex_ = parts == 2
    operands = [part for v in (l, d, u, b, alpha) for part in _tpu.parts_of(v, complex_)]
    tile = _tpu.Operand("tile")
    count = (len(_ENDS) + len(_BAND_ENDS)) * parts

    def need(g):
        ops = [_tpu.operand(g, v.shape, v.dtype) for v in operands]
        return _tpu.vmem_need(
            g, [(op, v.dtype.itemsize) for op, v in zip(ops, operands, strict=True)]
            + [(tile, 4)] * count,
            stages=sum(op.kind == "rows" and op.staged for op in ops), scratch_rows=0,
            outputs=[], carry_tiles=_CARRIED * parts)

    budget = _tpu.vmem()
    g = _tpu.geometry(P, N, Q, vmem_bytes=need, budget=budget.budget)
    if g is None:
        return None
    prepared = [_tpu.prepare(g, v) for v in operands]
    ops = [op for _, op in prepared[::parts]]

    def chunk_of(k):
        return k

    vmem = _tpu.pltpu.VMEM
    scratch = [vmem((_CARRIED * parts, *g.tile), jnp.float32)]
    scratch += [vmem(_tpu.stage_shape(g), jnp.float32)
                for _, op in prepared if op.kind == "rows" and op.staged]
    kernel = functools.partial(_ends_kernel, g=g, ops=ops, transposed=transposed, parts=parts)
    (ends,) = _tpu.call(
        kernel, g, [v for v, _ in prepared],
        [_tpu.block_spec(g, op, chunk_of) for _, op in prepared],
        [jax.ShapeDtypeStruct((*g.groups, count, *g.tile), jnp.float32)],
        [pl.BlockSpec((None, None, count, *g.tile), lambda a, b_, k: (a, b_, 0, 0, 0))],
        scratch, steps=g.chunks, name="tridiax_chunk_ends_tpu", vmem_limit=budget.limit,
        interpret=interpret)
    values = [_tpu.from_tiles(g, ends[:, :, n]) for n in range(count)]
    if complex_:
        values = [lax.complex(re, im) for re, im in zip(values[::2], values[1::2], strict=True)]
    return [v.astype(out_dtype) for v in values]


def chunk_ends_pnq(l, d, u, b, *, transposed: bool, periodic: bool, chunk: int, tiling=None,
                   pivoting: bool = False, interpret=None, composed):
    """The partition method's first sweep over (P|1, N|1, Q|1) operands: the ten (P, C, Q)
    arrays of `_native.chunk_ends_pnq`, in b's dtype (the compute dtype). `composed`: the
    composed sweep, which runs where these kernels do not apply (module docstring)."""
    shape = None if pivoting else _chunk_shape(l, d, u, b, chunk)
    ends = None
    dtype = b.dtype
    if shape is not None:
        P, N, Q, C, m = shape
        views = _views((l, d, u, b), P, N, C, m)
        coupling = _first_coupling(views, C=C, transposed=transposed, periodic=periodic)
        ends = _end_values(*views, _composed.per_chunk_view(coupling, P), transposed=transposed,
                           out_dtype=dtype, interpret=interpret)
    if ends is None:
        return composed(l, d, u, b, transposed=transposed, periodic=periodic, chunk=chunk,
                        tiling=tiling, pivoting=pivoting)
    ends = [v.reshape(P, C, Q) for v in ends]
    y, v1, wn, yr = ((ends[n], ends[n + 1]) for n in range(0, len(_ENDS), 2))
    alpha, beta, omega, separator = _ends_of_chunks(ends[len(_ENDS):], transposed=transposed,
                                                    periodic=periodic)
    return _composed.reduced_rows(y, v1, wn, yr, separator=separator, alpha=alpha, beta=beta,
                                  omega=omega, shape=(P, C, Q), dtype=dtype)


def chunk_solve_pnq(l, d, u, b, separators, *, transposed: bool, periodic: bool, chunk: int,
                    tiling=None, pivoting: bool = False, interpret=None, composed):
    """The partition method's last sweep: x (P, N, Q) in b's dtype, every chunk's interior
    solved with its separators (P|1, C, Q|1) known, as `_native.chunk_solve_pnq`; `composed`
    where these kernels do not apply."""
    shape = None if pivoting else _chunk_shape(l, d, u, b, chunk)
    x = None
    if shape is not None:
        P, N, Q, C, m = shape
        dtype = b.dtype
        left, right = _composed.separators_around(separators, P=P, C=C, periodic=periodic,
                                                  dtype=dtype)
        views = _views((l, d, u, b), P, N, C, m)
        if transposed:  # row 0's coupling, which the kernel cannot read (`solve_pnq`)
            left = left * _first_coupling(views, C=C, transposed=True,
                                          periodic=periodic).astype(dtype)
        x = _thomas.solve_pnq(*views, transposed=transposed, out_dtype=dtype, interpret=interpret,
                              separators=[_composed.per_chunk_view(v, P) for v in (left, right)])
    if x is None:
        return composed(l, d, u, b, separators, transposed=transposed, periodic=periodic,
                        chunk=chunk, tiling=tiling, pivoting=pivoting)
    return x.reshape(P, N, Q)
