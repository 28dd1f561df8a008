"""Banded solves as a Pallas Mosaic TPU kernel over the (P, N, Q) view.

The algorithm is `_xla_banded.solve_pnq`'s, step for step (its docstring has the window, the
band layout and the three kinds): step j loads row j + lo of the matrix solved into the
window's last row, optionally swaps the row of largest |W[r, 0]| to the top (first of equals, a
NaN first, as jnp.argmax), keeps row 0 as row j of U (1/pivot, then the kept superdiagonals)
and y[j], and eliminates column 0 from the other rows; the back substitution walks up keeping
the kept - 1 solution values below row j. The window's rows and columns are few and static:
Python lists of row tiles (unrolled), while the walk over the N rows is a `fori_loop`.

Systems are grouped into row tiles and rows into chunks as `_pallas/tpu.py` describes, and the
grid walks each group's chunks forward, then backward, in one pallas_call, like the
tridiagonal kernel: U's rows and y of the whole system stay in VMEM scratch, every input is
read once and x written once. `ab`'s blocks hold every band; the bands are read like the
tridiagonal kernel's operands, so bands shared by every system are read as SMEM scalars and
bands constant along N as one tile each.

Row j + lo reads `ab` at columns up to j + lo + up (scipy's layout stores A's column c in
ab[:, c]), D = lo + up rows past step j. So the steps lag the chunks: the grid step of chunk c
runs steps c*C - D ... (c+1)*C - D - 1 (the last one, all that remain), and the rows a step
reads before its chunk (the previous chunk's last D rows) are kept in a halo in front of each
band's float32 stage (SMEM scalars: a small SMEM halo), copied there at the end of every
chunk. Entries of `ab` outside the matrix are never used (a select drops them), in either
orientation.

The scratch holds (kept + 1) x N row tiles, so the row tile narrows as N grows, and systems too
long for VMEM run XLA's loop (`fits`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .._pallas import tpu as _tpu
from . import window as _window
from . import xla as _xla

# Halo rows are a multiple of this (whole tiles of the float32 stages).
_HALO_ROWS = 16


def _halo(g: _tpu.Geometry, l: int, u: int) -> int:
    """Rows of the previous chunk kept in front of each stage (none for one chunk)."""
    return 0 if g.chunks == 1 else -(-(l + u) // _HALO_ROWS) * _HALO_ROWS


def _band_operand(g: _tpu.Geometry, shape, dtype) -> _tpu.Operand:
    """How every band reaches the kernel (`_tpu.operand`), rows always through a stage (which
    holds the halo)."""
    op = _tpu.operand(g, shape, dtype)
    return _tpu.Operand("rows", staged=True, p_full=op.p_full) if op.kind == "rows" else op


def _prepare_bands(g: _tpu.Geometry, ab, op: _tpu.Operand):
    """`ab` as the kernel takes it: (K, ...), each band as `_tpu.prepare` passes an operand."""
    K, p, n, q = ab.shape
    if op.kind == "tile":
        return jnp.stack([_tpu.tiles_of(g, ab[k]) for k in range(K)])
    if op.kind == "scalar":
        return ab.reshape(K, p, n).astype(jnp.float32)
    if g.layout == "lanes":
        return ab
    ab = jnp.broadcast_to(ab, (K, g.P, n, g.Q))
    return ab.reshape(K, g.P, n) if g.layout == "transposed" else ab


class _HaloScalars:
    """A band shared by every system (SMEM scalars) whose rows before the chunk (down to -H)
    come from an SMEM halo."""

    def __init__(self, g, block, halo, band: int, H: int):
        self.g, self.block, self.halo, self.band, self.H = g, block, halo, band, H

    def load(self, i):
        inside = self.block[0, jnp.maximum(i, 0)]
        if not self.H:
            return jnp.full(self.g.tile, inside, jnp.float32)
        before = self.halo[self.band, jnp.clip(i + self.H, 0, self.H - 1)]
        return jnp.full(self.g.tile, jnp.where(i < 0, before, inside), jnp.float32)

    def keep_tail(self):
        for t in range(self.H):
            self.halo[self.band, t] = self.block[0, self.g.chunk - self.H + t]


def _keep_tail(g: _tpu.Geometry, stage, H: int) -> None:
    """Copy a stage's last H rows (the chunk's) to its halo, for the next chunk."""
    C, total = g.rows, H + g.rows
    if g.layout == "sublanes":
        for p in range(g.s):
            stage[p * total:p * total + H, :] = stage[p * total + C:(p + 1) * total, :]
    else:
        stage[0:H, :] = stage[C:C + H, :]


def _kernel(ab_ref, b_ref, x_ref, *refs, g, op, K, l, u, kind, transposed, direct_out, H):
    band_refs = [ab_ref.at[n] for n in range(K)]
    lo, up = (u, l) if transposed else (l, u)
    width = lo + up + 1
    D = lo + up
    pivoting, hermitian = kind == "banded_pivoted", kind == "banded_hermitian"
    kept = _window.kept_columns(l, u, kind, transposed)
    u_refs, (y_ref, carry_ref, *refs) = refs[:kept], refs[kept:]
    staged_bands = K if op.kind == "rows" else 0
    band_stages, (b_stage, *refs) = refs[:staged_bands], refs[staged_bands:]
    halo_ref = refs[0] if op.kind == "scalar" and H else None
    C = g.chunks
    k = pl.program_id(2)
    zero = jnp.zeros(g.tile, jnp.float32)

    def row_length(r: int) -> int:
        # Columns of window row r that can be nonzero: all of them once rows are interchanged;
        # without pivoting, row r reaches column r + up only (its band ends there).
        return width if pivoting else r + up + 1

    # The forward carry: window rows 0..lo-1 (their lengths), then their right-hand sides.
    lengths = [row_length(r) for r in range(lo)]

    def unflatten(flat):
        window, at = [], 0
        for n in lengths:
            window.append(list(flat[at:at + n]))
            at += n
        return window, list(flat[at:])

    def flatten(window, values):
        return tuple(v for row in window for v in row) + tuple(values)

    @pl.when(k < C)
    def _():
        j = k
        start = j * g.chunk  # the global row of the chunk's local row 0
        if op.kind == "rows":
            for ref, stage in zip(band_refs, band_stages, strict=True):
                _tpu.stage_in(g, ref, stage, offset=H)
            bands = [_tpu.RowRef(g, stage, H + g.rows, H) for stage in band_stages]
        elif op.kind == "scalar":
            bands = [_HaloScalars(g, ref, halo_ref, n, H) for n, ref in enumerate(band_refs)]
        else:
            bands = [_tpu.TileRef(ref) for ref in band_refs]
        _tpu.stage_in(g, b_ref, b_stage, offset=H)
        rhs_rows = _tpu.RowRef(g, b_stage, H + g.rows, H)
        u_rows = [_tpu.RowRef(g, ref, g.total_rows) for ref in u_refs]
        y_rows = _tpu.RowRef(g, y_ref, g.total_rows)

        def local(i):  # a global row as a row of the chunk's stages, kept inside them
            return jnp.clip(i - start, -H, g.rows - 1)

        def entry(i, d: int):
            """A[i, i + d] of the matrix solved, 0 outside it (i >= 0)."""
            band, column = (u + d, i) if transposed else (u - d, i + d)
            valid = (i < g.N) & (i + d >= 0) & (i + d < g.N)
            return jnp.where(valid, bands[band].load(local(column)), 0.0)

        def rhs(i):
            return jnp.where(i < g.N, rhs_rows.load(local(i)), 0.0)

        def load_row(i, shift: int, length: int):
            """Row i at columns i - shift .. i - shift + length - 1."""
            return [entry(i, c - shift) if c - shift <= up else zero for c in range(length)]

        @pl.when(k == 0)
        def _():
            window = [load_row(r, r, row_length(r)) for r in range(lo)]
            for n, value in enumerate(flatten(window, [rhs(r) for r in range(lo)])):
                carry_ref[n] = value

        def step(s, flat):
            window, values = unflatten(flat)
            window.append(load_row(s + lo, lo, row_length(lo)))
            values.append(rhs(s + lo))
            inverse, head, y, rest, rest_values = _window.eliminate(
                window, values, pivoting=pivoting, hermitian=hermitian, zero=zero)
            for rows, value in zip(u_rows, [inverse, *head[: kept - 1]], strict=True):
                rows.store(s, value)
            y_rows.store(s, y)
            return flatten(rest, rest_values)

        def run(first, count):
            flat = tuple(carry_ref[n] for n in range(sum(lengths) + lo))
            flat = _tpu.loop(count, lambda t, c: step(first + t, c), flat)
            for n, value in enumerate(flat):
                carry_ref[n] = value

        _over_steps(g, j, D, run)
        if H:
            for stage in [*band_stages, b_stage]:
                _keep_tail(g, stage, H)
            if halo_ref is not None:
                for band in bands:
                    band.keep_tail()

    @pl.when(k >= C)
    def _():
        j = 2 * C - 1 - k
        offset = _tpu.aligned(j * g.rows)
        u_rows = [_tpu.RowRef(g, ref, g.total_rows, offset) for ref in u_refs]
        y_rows = _tpu.RowRef(g, y_ref, g.total_rows, offset)
        out = _tpu.RowRef(g, x_ref.at[0], g.rows) if direct_out else y_rows

        @pl.when(k == C)
        def _():
            for n in range(kept - 1):
                carry_ref[n] = zero

        def run(count):
            def row(i, below):  # below[c] = x[i + 1 + c]
                y = y_rows.load(i)
                if kept > 1:
                    total = u_rows[1].load(i) * below[0]
                    for c in range(2, kept):
                        total = total + u_rows[c].load(i) * below[c - 1]
                    y = y - total
                x = y * u_rows[0].load(i)
                out.store(i, x)
                return (x, *below)[: kept - 1]

            below = tuple(carry_ref[n] for n in range(kept - 1))
            below = _tpu.loop(count, row, below, reverse=True)
            for n, value in enumerate(below):
                carry_ref[n] = value

        _tpu.over_rows(g, j, run)
        if not direct_out:
            _tpu.stage_out(g, y_rows, x_ref)


def _over_steps(g: _tpu.Geometry, j, D: int, fn) -> None:
    """Run `fn(first, count)` for the elimination steps of chunk j (traced): steps j*C - D ..
    (j+1)*C - D - 1 (the first chunk from 0, the last to N - 1), `count` a Python int in each
    branch."""
    if g.chunks == 1:
        fn(0, g.N)
        return
    C, last = g.chunk, g.chunks - 1

    @pl.when(j == 0)
    def _():
        fn(0, C - D)

    if last > 1:
        @pl.when(jnp.logical_and(j > 0, j < last))
        def _():
            fn(j * C - D, C)

    @pl.when(j == last)
    def _():
        fn(last * C - D, g.N - last * C + D)


def _carry_tiles(l: int, u: int, kind: str, transposed: bool) -> int:
    """Row tiles of the carry scratch: the forward steps' window, or the back substitution's
    kept - 1 values below a row."""
    return max(_window.window_tiles(l, u, kind, transposed),
               _window.kept_columns(l, u, kind, transposed) - 1, 1)


def _plan(P, N, Q, ab, b, out_dtype, *, l, u, kind, transposed, budget=None):
    """The geometry of a banded solve in `budget` bytes of VMEM (None: `_tpu.VMEM_BUDGET`)."""
    K = l + u + 1
    kept = _window.kept_columns(l, u, kind, transposed)
    carry = _carry_tiles(l, u, kind, transposed)

    def need(g):
        if g.chunks > 1 and l + u >= g.chunk:
            return float("inf")  # the lag must stay within one chunk
        op = _band_operand(g, ab.shape[1:], ab.dtype)
        b_op = _tpu.Operand("rows", staged=True)
        stages = (K if op.kind == "rows" else 0) + 1
        H = _halo(g, l, u)
        total = _tpu.vmem_need(g, [(op, ab.dtype.itemsize)] * K + [(b_op, b.dtype.itemsize)],
                               stages=0, scratch_rows=(kept + 1) * g.total_rows + carry,
                               outputs=[jnp.dtype(out_dtype).itemsize])
        return total + stages * (H + g.rows) * g.row_tile_bytes()

    return _tpu.geometry(P, N, Q, vmem_bytes=need, budget=budget)


def fits(ab_shape, P: int, N: int, Q: int, dtype, *, l: int, u: int, kind: str,
         transposed: bool = False, budget=None) -> bool:
    """Whether a banded solve fits `budget` bytes of VMEM (None: `_tpu.VMEM_BUDGET`)."""
    ab = jax.ShapeDtypeStruct(ab_shape, dtype)
    b = jax.ShapeDtypeStruct((P, N, Q), dtype)
    return _plan(P, N, Q, ab, b, dtype, l=l, u=u, kind=kind, transposed=transposed,
                 budget=budget) is not None


def solve_pnq(ab, b, *, l: int, u: int, kind: str, transposed: bool, out_dtype, interpret=None):
    """Solve A x = b (A^T x = b when `transposed`) for every system along axis 1, with the
    semantics of `_xla_banded.solve_pnq`: `ab` (l + u + 1, P|1, N|1, Q|1) bands in scipy's
    layout along axis 2, `b` (P, N, Q). Returns x, (P, N, Q) of `out_dtype`. `interpret`:
    Pallas's interpret mode (`pltpu.InterpretParams`, or True) to run on CPU. Systems too
    long for VMEM (`fits`) are solved by XLA's loop."""
    _xla.check_operands(ab, b, l=l, u=u, kind=kind)
    K = l + u + 1
    P, N, Q = b.shape
    out_dtype = jnp.dtype(out_dtype)
    _tpu.require_real(out_dtype, "banded")
    if P * N * Q == 0:
        return jnp.zeros((P, N, Q), out_dtype)
    budget = _tpu.vmem()
    g = _plan(P, N, Q, ab, b, out_dtype, l=l, u=u, kind=kind, transposed=transposed,
              budget=budget.budget)
    if g is None:
        return _xla.solve_pnq(ab, b, l=l, u=u, kind=kind, transposed=transposed,
                              out_dtype=out_dtype)
    op = _band_operand(g, ab.shape[1:], ab.dtype)
    H = _halo(g, l, u)
    b_op = _tpu.Operand("rows", staged=True)
    b_in, _ = _tpu.prepare(g, b)
    direct_out = not _tpu.staged(g, out_dtype)
    kept = _window.kept_columns(l, u, kind, transposed)
    C = g.chunks

    def chunk_in(k):
        return jnp.minimum(k, C - 1)

    def chunk_out(k):
        return jnp.clip(2 * C - 1 - k, 0, C - 1)

    inputs = [_prepare_bands(g, ab, op), b_in]
    in_specs = [_tpu.block_spec(g, op, chunk_in, stack=K), _tpu.block_spec(g, b_op, chunk_in)]
    shape = (P, N) if g.layout == "transposed" else (P, N, Q)
    out_spec = _tpu.block_spec(g, _tpu.Operand("rows"), chunk_out)
    vmem = _tpu.pltpu.VMEM
    carry = _carry_tiles(l, u, kind, transposed)
    scratch = [vmem(_tpu.rows_shape(g, g.total_rows), jnp.float32)] * (kept + 1)
    scratch.append(vmem((carry, *g.tile), jnp.float32))
    stage = vmem(_tpu.rows_shape(g, H + g.rows), jnp.float32)
    scratch += [stage] * ((K if op.kind == "rows" else 0) + 1)
    if op.kind == "scalar" and H:
        scratch.append(_tpu.pltpu.SMEM((K, H), jnp.float32))
    kernel = functools.partial(_kernel, g=g, op=op, K=K, l=l, u=u, kind=kind,
                               transposed=transposed, direct_out=direct_out, H=H)
    (x,) = _tpu.call(kernel, g, inputs, in_specs, [jax.ShapeDtypeStruct(shape, out_dtype)],
                     [out_spec], scratch, steps=2 * C, name=f"tridiax_{kind}_tpu",
                     vmem_limit=budget.limit, interpret=interpret)
    return x.reshape(P, N, Q)
