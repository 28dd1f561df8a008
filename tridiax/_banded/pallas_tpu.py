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

A Hermitian matrix may come as the u + 1 bands of one triangle (`stored`, solveh_banded's
layout): an entry of the other triangle is read as the conjugate of its mirror image, in the
column of its row rather than its own, and the diagonal as its real part, so XLA never forms
the mirrored bands.

Complex64 runs as float32 real and imaginary parts (`_pallas/tpu.py`, `parts_of`): every band,
b, U's rows, y and x in two planes each, the window's tiles `SplitComplex` (`window.py` takes
them), the carried window stored part after part.

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

from .._core.split_complex import SplitComplex, as_split, select
from .._pallas import tpu as _tpu
from . import algebra
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
    come from an SMEM halo (row `band` of `halo`)."""

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


def _kernel(*refs, g, op, K, l, u, kind, transposed, stored, parts, direct_out, H):
    """Refs: the stacked bands, b's block and x's (the parts of each: `parts` of ab, b and x),
    U's kept rows and y (the parts of each), the carry, the bands' and b's stages (each part's)
    and the SMEM halo of a band of scalars."""
    pa, pb, px = parts
    refs = list(refs)

    def take(count):
        taken = refs[:count]
        del refs[:count]
        return taken

    ab_refs, b_refs, x_refs = take(pa), take(pb), take(px)
    u_refs = [take(px) for _ in range(_window.kept_columns(l, u, kind, transposed))]
    y_refs, (carry_ref,) = take(px), take(1)
    band_stages = [take(pa) for _ in range(K if op.kind == "rows" else 0)]
    b_stages = take(pb)
    halo_ref = refs[0] if op.kind == "scalar" and H else None
    lo, up = (u, l) if transposed else (l, u)
    width = lo + up + 1
    D = lo + up
    pivoting, hermitian = kind == "banded_pivoted", kind == "banded_hermitian"
    kept = len(u_refs)
    C = g.chunks
    k = pl.program_id(2)
    zero = jnp.zeros(g.tile, jnp.float32)
    carry = _tpu.CarryTiles(carry_ref, px)

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
            for n, stages in enumerate(band_stages):
                for ref, stage in zip(ab_refs, stages, strict=True):
                    _tpu.stage_in(g, ref.at[n], stage, offset=H)
            bands = [_tpu.joined([_tpu.RowRef(g, stage, H + g.rows, H) for stage in stages])
                     for stages in band_stages]
        elif op.kind == "scalar":
            bands = [_tpu.joined([_HaloScalars(g, ref.at[n], halo_ref, n + part * K, H)
                                  for part, ref in enumerate(ab_refs)]) for n in range(K)]
        else:
            bands = [_tpu.joined([_tpu.TileRef(ref.at[n]) for ref in ab_refs]) for n in range(K)]
        for ref, stage in zip(b_refs, b_stages, strict=True):
            _tpu.stage_in(g, ref, stage, offset=H)
        rhs_rows = _tpu.joined([_tpu.RowRef(g, stage, H + g.rows, H) for stage in b_stages])
        u_rows = [_rows(g, refs_, g.total_rows) for refs_ in u_refs]
        y_rows = _rows(g, y_refs, g.total_rows)

        def local(i):  # a global row as a row of the chunk's stages, kept inside them
            return jnp.clip(i - start, -H, g.rows - 1)

        def entry(i, d: int):
            """A[i, i + d] of the matrix solved, 0 outside it (i >= 0)."""
            band, column, mirrored = _band_and_column(i, d, u, transposed, stored)
            value = bands[band].load(local(column))
            if isinstance(value, SplitComplex) and stored is not None:
                if mirrored:  # the Hermitian mirror image: its conjugate
                    value = SplitComplex(value.re, -value.im)
                elif d == 0:  # a Hermitian matrix's diagonal is real (its imaginary part unread)
                    value = value.re
            valid = (i < g.N) & (i + d >= 0) & (i + d < g.N)
            return select(valid, value, zero)

        def rhs(i):
            return select(i < g.N, rhs_rows.load(local(i)), zero)

        def load_row(i, shift: int, length: int):
            """Row i at columns i - shift .. i - shift + length - 1."""
            return [entry(i, c - shift) if c - shift <= up else zero for c in range(length)]

        @pl.when(k == 0)
        def _():
            window = [load_row(r, r, row_length(r)) for r in range(lo)]
            carry.store(flatten(window, [rhs(r) for r in range(lo)]))

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
            flat = carry.load(sum(lengths) + lo)
            carry.store(_tpu.loop(count, lambda t, c: _splits(step(first + t, c), px), flat))

        _over_steps(g, j, D, run)
        if H:
            for stage in [*(s for stages in band_stages for s in stages), *b_stages]:
                _keep_tail(g, stage, H)
            if halo_ref is not None:
                for band in bands:
                    for part in (band.re, band.im) if isinstance(band, _tpu.SplitRows) else (band,):
                        part.keep_tail()

    @pl.when(k >= C)
    def _():
        j = 2 * C - 1 - k
        offset = _tpu.aligned(j * g.rows)
        u_rows = [_rows(g, refs_, g.total_rows, offset) for refs_ in u_refs]
        y_rows = _rows(g, y_refs, g.total_rows, offset)
        out = _tpu.joined([_tpu.RowRef(g, ref.at[0], g.rows) for ref in x_refs]) if direct_out else y_rows

        @pl.when(k == C)
        def _():
            carry.store([zero] * (kept - 1))

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

            below = carry.load(kept - 1)
            carry.store(_tpu.loop(count, lambda i, c: _splits(row(i, c), px), below, reverse=True))

        _tpu.over_rows(g, j, run)
        if not direct_out:
            _tpu.stage_out_parts(g, y_rows, x_refs)


def _rows(g: _tpu.Geometry, refs, rows: int, offset=0):
    """A scratch's rows, joined over its parts."""
    return _tpu.joined([_tpu.RowRef(g, ref, rows, offset) for ref in refs])


def _splits(carry, parts: int):
    """A loop's carried tiles, each a `SplitComplex` in a complex solve (the loop's carry must
    keep one structure, so real tiles are promoted)."""
    return carry if parts == 1 else tuple(as_split(v) for v in carry)


def _band_and_column(i, d: int, u: int, transposed: bool, stored):
    """Where M[i, i + d] lies in `ab` (M = A, or A^T when `transposed`): its band and column,
    and whether that is the mirror image (A[row, col] = conj(A[col, row])) in the stored
    triangle of a Hermitian `stored` matrix."""
    row, col, offset = (i + d, i, -d) if transposed else (i, i + d, d)  # A[row, col], col - row
    if stored == "upper" and offset < 0:  # mirrored into the upper triangle
        return u + offset, row, True
    if stored == "lower":  # ab[r - c, c] = A[r, c] for r >= c
        return (-offset, col, False) if offset <= 0 else (offset, row, True)
    return u - offset, col, False


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
    """The geometry of a banded solve in `budget` bytes of VMEM (None: `_tpu.VMEM_BUDGET`).
    `ab` and `b` may be complex: each counts as its parts."""
    K = ab.shape[0]
    px, part = _tpu.split_dtype(out_dtype)
    pa, pb = (_tpu.split_dtype(v.dtype)[0] if px == 2 else 1 for v in (ab, b))
    ab_part, b_part = (_tpu.split_dtype(v.dtype)[1] for v in (ab, b))
    kept = _window.kept_columns(l, u, kind, transposed)
    carry = _carry_tiles(l, u, kind, transposed)

    def need(g):
        if g.chunks > 1 and l + u >= g.chunk:
            return float("inf")  # the lag must stay within one chunk
        op = _band_operand(g, ab.shape[1:], ab_part)
        b_op = _tpu.Operand("rows", staged=True)
        stages = (K * pa if op.kind == "rows" else 0) + pb
        H = _halo(g, l, u)
        total = _tpu.vmem_need(g, [(op, ab_part.itemsize)] * (K * pa) + [(b_op, b_part.itemsize)] * pb,
                               stages=0, scratch_rows=px * ((kept + 1) * g.total_rows + carry),
                               outputs=[part.itemsize] * px)
        return total + stages * (H + g.rows) * g.row_tile_bytes()

    return _tpu.geometry(P, N, Q, vmem_bytes=need, budget=budget)


def fits(ab_shape, P: int, N: int, Q: int, dtype, *, l: int, u: int, kind: str,
         transposed: bool = False, budget=None) -> bool:
    """Whether a banded solve fits `budget` bytes of VMEM (None: `_tpu.VMEM_BUDGET`)."""
    ab = jax.ShapeDtypeStruct(ab_shape, dtype)
    b = jax.ShapeDtypeStruct((P, N, Q), dtype)
    return _plan(P, N, Q, ab, b, dtype, l=l, u=u, kind=kind, transposed=transposed,
                 budget=budget) is not None


def solve_pnq(ab, b, *, l: int, u: int, kind: str, transposed: bool, out_dtype, stored=None,
              interpret=None):
    """Solve A x = b (A^T x = b when `transposed`) for every system along axis 1, with the
    semantics of `_xla_banded.solve_pnq`: `ab` (l + u + 1, P|1, N|1, Q|1) bands in scipy's
    layout along axis 2 (or, `stored` "upper"/"lower", the u + 1 bands of one triangle of a
    Hermitian matrix in solveh_banded's layout, l = u), `b` (P, N, Q). Returns x, (P, N, Q) of
    `out_dtype`; complex64 runs as float32 parts. `interpret`: Pallas's interpret mode
    (`pltpu.InterpretParams`, or True) to run on CPU. Systems too long for VMEM (`fits`) are
    solved by XLA's loop."""
    _xla.check_operands(ab, b, l=l, u=u, kind=kind, stored=stored)
    K = ab.shape[0]
    P, N, Q = b.shape
    out_dtype = jnp.dtype(out_dtype)
    _tpu.check_dtype(out_dtype)
    if P * N * Q == 0:
        return jnp.zeros((P, N, Q), out_dtype)
    budget = _tpu.vmem()
    g = _plan(P, N, Q, ab, b, out_dtype, l=l, u=u, kind=kind, transposed=transposed,
              budget=budget.budget)
    if g is None:
        if stored is not None:
            ab = algebra.hermitian_bands(ab, lower=stored == "lower", axis=2, n=N)
        return _xla.solve_pnq(ab, b, l=l, u=u, kind=kind, transposed=transposed,
                              out_dtype=out_dtype)
    px, part = _tpu.split_dtype(out_dtype)
    complex_ = px == 2
    ab_parts = _tpu.parts_of(ab, complex_ and jnp.iscomplexobj(ab))
    b_parts = _tpu.parts_of(b, complex_)
    op = _band_operand(g, ab.shape[1:], ab_parts[0].dtype)
    H = _halo(g, l, u)
    b_op = _tpu.Operand("rows", staged=True)
    direct_out = not _tpu.staged(g, part)
    kept = _window.kept_columns(l, u, kind, transposed)
    C = g.chunks

    def chunk_in(k):
        return jnp.minimum(k, C - 1)

    def chunk_out(k):
        return jnp.clip(2 * C - 1 - k, 0, C - 1)

    inputs = [_prepare_bands(g, v, op) for v in ab_parts] + [_tpu.prepare(g, v)[0] for v in b_parts]
    in_specs = ([_tpu.block_spec(g, op, chunk_in, stack=K)] * len(ab_parts)
                + [_tpu.block_spec(g, b_op, chunk_in)] * len(b_parts))
    shape = (P, N) if g.layout == "transposed" else (P, N, Q)
    out_spec = _tpu.block_spec(g, _tpu.Operand("rows"), chunk_out)
    vmem = _tpu.pltpu.VMEM
    carry = _carry_tiles(l, u, kind, transposed)
    scratch = [vmem(_tpu.rows_shape(g, g.total_rows), jnp.float32)] * ((kept + 1) * px)
    scratch.append(vmem((carry * px, *g.tile), jnp.float32))
    stage = vmem(_tpu.rows_shape(g, H + g.rows), jnp.float32)
    scratch += [stage] * ((K if op.kind == "rows" else 0) * len(ab_parts) + len(b_parts))
    if op.kind == "scalar" and H:
        scratch.append(_tpu.pltpu.SMEM((K * len(ab_parts), H), jnp.float32))
    kernel = functools.partial(_kernel, g=g, op=op, K=K, l=l, u=u, kind=kind, transposed=transposed,
                               stored=stored, parts=(len(ab_parts), len(b_parts), px),
                               direct_out=direct_out, H=H)
    x = _tpu.call(kernel, g, inputs, in_specs, [jax.ShapeDtypeStruct(shape, part)] * px,
                  [out_spec] * px, scratch, steps=2 * C, name=f"tridiax_{kind}_tpu",
                  vmem_limit=budget.limit, interpret=interpret)
    x = jax.lax.complex(*x) if complex_ else x[0]
    return x.reshape(P, N, Q)
