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

The scratch holds (kept + 1) x N row tiles, so the row tile narrows as N grows. Systems too
long for VMEM (`fits`) run the same steps in two kernels (`_streamed_solve`): the forward one
writes each step's kept row of U and y to float32 arrays in HBM, D rows down so that a grid
step writes whole chunks of them, and the back substitution reads them last chunk first,
carrying each chunk's first D rows to the chunk before it. XLA's loop runs only where not even
their chunks fit.
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


def _take(refs: list, count: int) -> list:
    """The first `count` refs, removed from `refs`."""
    taken = refs[:count]
    del refs[:count]
    return taken


def _forward(g, inputs, carry, store, over_steps, *, j, op, K, l, u, kind, transposed, stored, H,
             px, record=False):
    """The forward elimination of grid step j (traced): chunk j's bands and b staged, then the
    steps `over_steps(run)` gives (`run(first, count)`), each kept row of U and y given to
    `store(s, values)` (1/pivot, the kept superdiagonals, y; with `record`, a factorization's:
    1/pivot, the kept superdiagonals, the multipliers, the pivot row), the window carried
    between steps and grid steps in `carry`. `inputs`: the bands' blocks, b's (none: a
    factorization, whose right-hand side is zero), the bands' stages, b's, the SMEM halo (or
    None)."""
    ab_refs, b_refs, band_stages, b_stages, halo_ref = inputs
    lo, up = (u, l) if transposed else (l, u)
    width = lo + up + 1
    pivoting, hermitian = kind == "banded_pivoted", kind == "banded_hermitian"
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

    start = j * g.chunk  # the global row of the chunk's local row 0
    if op.kind == "rows":
        for n, stages in enumerate(band_stages):
            for ref, stage in zip(ab_refs, stages, strict=True):
                _tpu.stage_in(g, ref.at[n], stage, offset=H)
        bands = [_tpu.scratch_rows(g, stages, H + g.rows, H) for stages in band_stages]
    elif op.kind == "scalar":
        bands = [_tpu.joined([_HaloScalars(g, ref.at[n], halo_ref, n + part * K, H)
                              for part, ref in enumerate(ab_refs)]) for n in range(K)]
    else:
        bands = [_tpu.joined([_tpu.TileRef(ref.at[n]) for ref in ab_refs]) for n in range(K)]
    for ref, stage in zip(b_refs, b_stages, strict=True):
        _tpu.stage_in(g, ref, stage, offset=H)
    rhs_rows = _tpu.scratch_rows(g, b_stages, H + g.rows, H) if b_stages else None

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
        if rhs_rows is None:
            return zero
        return select(i < g.N, rhs_rows.load(local(i)), zero)

    def load_row(i, shift: int, length: int):
        """Row i at columns i - shift .. i - shift + length - 1."""
        return [entry(i, c - shift) if c - shift <= up else zero for c in range(length)]

    @pl.when(j == 0)
    def _():
        window = [load_row(r, r, row_length(r)) for r in range(lo)]
        carry.store(flatten(window, [rhs(r) for r in range(lo)]))

    def step(s, flat):
        window, values = unflatten(flat)
        window.append(load_row(s + lo, lo, row_length(lo)))
        values.append(rhs(s + lo))
        inverse, head, y, rest, rest_values, *factors = _window.eliminate(
            window, values, pivoting=pivoting, hermitian=hermitian, zero=zero, factors=record)
        kept = _window.kept_columns(l, u, kind, transposed)
        if record:
            multipliers, p = factors
            store(s, [inverse, *head[: kept - 1], *multipliers, p.astype(jnp.float32)])
        else:
            store(s, [inverse, *head[: kept - 1], y])
        return flatten(rest, rest_values)

    def run(first, count):
        flat = carry.load(sum(lengths) + lo)
        carry.store(_tpu.loop(count, lambda t, c: _splits(step(first + t, c), px), flat))

    over_steps(run)
    if H:
        for stage in [*(s for stages in band_stages for s in stages), *b_stages]:
            _keep_tail(g, stage, H)
        if halo_ref is not None:
            for band in bands:
                for part in (band.re, band.im) if isinstance(band, _tpu.SplitRows) else (band,):
                    part.keep_tail()


def _substitution(work, below):
    """x[i] = (y[i] - U[i, 1:] . x[i+1:]) / pivot from row i's kept values `work` (1/pivot, the
    kept superdiagonals, y) and `below` (x[i + 1 + c]): (x[i], the next `below`)."""
    inverse, *head, y = work
    if head:
        total = head[0] * below[0]
        for c in range(1, len(head)):
            total = total + head[c] * below[c]
        y = y - total
    x = y * inverse
    return x, (x, *below)[: len(head)]


def _stages(refs: list, *, op, K: int, parts, H: int):
    """The bands' stages, b's and the SMEM halo: the last of a kernel's refs."""
    pa, pb, _ = parts
    band_stages = [_take(refs, pa) for _ in range(K if op.kind == "rows" else 0)]
    b_stages = _take(refs, pb)
    halo_ref = _take(refs, 1)[0] if op.kind == "scalar" and H else None
    return band_stages, b_stages, halo_ref


def _kernel(*refs, g, op, K, l, u, kind, transposed, stored, parts, direct_out, H):
    """Refs: the stacked bands, b's block and x's (the parts of each: `parts` of ab, b and x),
    U's kept rows and y (the parts of each), the carry, the bands' and b's stages (each part's)
    and the SMEM halo of a band of scalars."""
    pa, pb, px = parts
    refs = list(refs)
    ab_refs, b_refs, x_refs = _take(refs, pa), _take(refs, pb), _take(refs, px)
    kept = _window.kept_columns(l, u, kind, transposed)
    u_refs = [_take(refs, px) for _ in range(kept)]
    y_refs, (carry_ref,) = _take(refs, px), _take(refs, 1)
    band_stages, b_stages, halo_ref = _stages(refs, op=op, K=K, parts=parts, H=H)
    lo, up = (u, l) if transposed else (l, u)
    C = g.chunks
    k = pl.program_id(2)
    zero = jnp.zeros(g.tile, jnp.float32)
    carry = _tpu.CarryTiles(carry_ref, px)

    @pl.when(k < C)
    def _():
        work = [_tpu.scratch_rows(g, refs_, g.total_rows) for refs_ in (*u_refs, y_refs)]

        def store(s, values):
            for rows, value in zip(work, values, strict=True):
                rows.store(s, value)

        _forward(g, (ab_refs, b_refs, band_stages, b_stages, halo_ref), carry, store,
                 lambda run: _over_steps(g, k, lo + up, run), j=k, op=op, K=K, l=l, u=u,
                 kind=kind, transposed=transposed, stored=stored, H=H, px=px)

    @pl.when(k >= C)
    def _():
        j = 2 * C - 1 - k
        offset = _tpu.aligned(j * g.rows)
        work = [_tpu.scratch_rows(g, refs_, g.total_rows, offset) for refs_ in (*u_refs, y_refs)]
        y_rows = work[-1]
        out = _tpu.block_rows(g, x_refs) if direct_out else y_rows

        @pl.when(k == C)
        def _():
            carry.store([zero] * (kept - 1))

        def run(count):
            def row(i, below):
                x, below = _substitution([rows.load(i) for rows in work], below)
                out.store(i, x)
                return below

            below = carry.load(kept - 1)
            carry.store(_tpu.loop(count, lambda i, c: _splits(row(i, c), px), below, reverse=True))

        _tpu.over_rows(g, j, run)
        if not direct_out:
            _tpu.stage_out_parts(g, y_rows, x_refs)


def _streamed_forward(*refs, g, op, K, l, u, kind, transposed, stored, parts, H, steps, staged_work):
    """The forward elimination of systems too long for VMEM: step s's kept row of U and y
    written at row s + D of float32 work arrays (D = lo + up, the lag of the steps behind the
    rows they read), so that grid step c (of `steps`) writes their chunk c. Refs: the stacked
    bands, b's block, the work blocks (the kept columns, then y; each in its parts), the
    carry, the bands' and b's stages, the SMEM halo, the work blocks' stages (`staged_work`)."""
    pa, pb, px = parts
    refs = list(refs)
    ab_refs, b_refs = _take(refs, pa), _take(refs, pb)
    kept = _window.kept_columns(l, u, kind, transposed)
    work_refs = [_take(refs, px) for _ in range(kept + 1)]
    (carry_ref,) = _take(refs, 1)
    band_stages, b_stages, halo_ref = _stages(refs, op=op, K=K, parts=parts, H=H)
    lo, up = (u, l) if transposed else (l, u)
    D = lo + up
    j = pl.program_id(2)
    if staged_work:
        sinks = [_tpu.scratch_rows(g, _take(refs, px)) for _ in work_refs]
    else:
        sinks = [_tpu.block_rows(g, parts_) for parts_ in work_refs]

    def store(s, values):
        for sink, value in zip(sinks, values, strict=True):
            sink.store(s + D - j * g.chunk, value)

    _forward(g, (ab_refs, b_refs, band_stages, b_stages, halo_ref), _tpu.CarryTiles(carry_ref, px),
             store, lambda run: _over_steps(g, j, D, run, steps), j=j, op=op, K=K, l=l, u=u,
             kind=kind, transposed=transposed, stored=stored, H=H, px=px)
    if staged_work:
        for sink, parts_ in zip(sinks, work_refs, strict=True):
            _tpu.stage_out_parts(g, sink, parts_)


def _streamed_backward(*refs, g, l, u, kind, transposed, px, steps, staged_work, staged_out):
    """The back substitution of systems too long for VMEM, last chunk of the work arrays first:
    grid step t reads their chunk w = steps - 1 - t, whose rows D.. hold the kept rows of x's
    chunk w (its rows 0 .. C - D - 1), and whose first D rows, the kept rows of chunk w - 1's
    last D rows, are carried to the next grid step. Refs: the work blocks (the kept columns,
    then y; each in its parts), x's blocks, the carry (the kept - 1 values of x below a row,
    then D rows of work values), the work blocks' stages (`staged_work`), x's stage
    (`staged_out`)."""
    refs = list(refs)
    kept = _window.kept_columns(l, u, kind, transposed)
    work_refs = [_take(refs, px) for _ in range(kept + 1)]
    x_refs = _take(refs, px)
    (carry_ref,) = _take(refs, 1)
    lo, up = (u, l) if transposed else (l, u)
    D, C = lo + up, g.chunk
    t = pl.program_id(2)
    w = steps - 1 - t
    if staged_work:
        work = []
        for parts_ in work_refs:
            stages = _take(refs, px)
            for ref, stage in zip(parts_, stages, strict=True):
                _tpu.stage_in(g, ref, stage)
            work.append(_tpu.scratch_rows(g, stages))
    else:
        work = [_tpu.block_rows(g, parts_) for parts_ in work_refs]
    out = _tpu.scratch_rows(g, _take(refs, px)) if staged_out else _tpu.block_rows(g, x_refs)
    carry = _tpu.CarryTiles(carry_ref, px)
    B, values = kept - 1, kept + 1

    @pl.when(t == 0)
    def _():
        carry.store([jnp.zeros(g.tile, jnp.float32)] * B)

    def run(count):
        below = carry.load(B)
        above = carry.load(B + D * values)[B:]
        inside = min(count, C - D)  # rows whose kept values lie in this chunk of the work
        for i in range(count - 1, inside - 1, -1):  # the others: in the next chunk's first D rows
            a = i + D - C
            x, below = _substitution(above[a * values:(a + 1) * values], below)
            out.store(i, x)

        def row(i, below):
            x, below = _substitution([rows.load(i + D) for rows in work], below)
            out.store(i, x)
            return below

        carry.store(_tpu.loop(inside, lambda i, c: _splits(row(i, c), px), _splits(below, px),
                              reverse=True))

    _tpu.over_rows(g, w, run)  # no rows of x at the work's extra last chunk (w == g.chunks)
    for a in range(D):
        for n, rows in enumerate(work):
            carry.set(B + a * values + n, rows.load(a))
    if staged_out:
        _tpu.stage_out_parts(g, out, x_refs)


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


def _over_steps(g: _tpu.Geometry, j, D: int, fn, steps: int | None = None) -> None:
    """Run `fn(first, count)` for the elimination steps of grid step j (traced): steps j*C - D ..
    (j+1)*C - D - 1 (the first from 0, the last, of `steps` (g.chunks) grid steps, to N - 1),
    `count` a Python int in each branch."""
    if g.chunks == 1:
        fn(0, g.N)
        return
    C, last = g.chunk, (steps or g.chunks) - 1

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


def _backward_carry_tiles(l: int, u: int, kept: int) -> int:
    """Row tiles of the streamed back substitution's carry: the kept - 1 values below a row,
    and the l + u rows of every work array that the lagging steps hold back."""
    return max(kept - 1 + (l + u) * (kept + 1), 1)


def _plan(P, N, Q, ab, b, out_dtype, *, l, u, kind, transposed, budget=None, streamed=False):
    """The geometry of a banded solve in `budget` bytes of VMEM (None: `_tpu.VMEM_BUDGET`).
    `ab` and `b` may be complex: each counts as its parts. `streamed`: the two kernels of a
    system too long for VMEM (the larger of their needs), in two chunks at least."""
    K = ab.shape[0]
    px, part = _tpu.split_dtype(out_dtype)
    pa, pb = (_tpu.split_dtype(v.dtype)[0] if px == 2 else 1 for v in (ab, b))
    ab_part, b_part = (_tpu.split_dtype(v.dtype)[1] for v in (ab, b))
    kept = _window.kept_columns(l, u, kind, transposed)
    carry = _carry_tiles(l, u, kind, transposed)

    def need(g):
        if g.chunks > 1 and l + u >= g.chunk or streamed and g.chunks == 1:
            return float("inf")  # the lag must stay within one chunk
        op = _band_operand(g, ab.shape[1:], ab_part)
        b_op = _tpu.Operand("rows", staged=True)
        stages = (K * pa if op.kind == "rows" else 0) + pb
        H = _halo(g, l, u)
        inputs = [(op, ab_part.itemsize)] * (K * pa) + [(b_op, b_part.itemsize)] * pb
        if not streamed:
            total = _tpu.vmem_need(g, inputs, stages=0, scratch_rows=px * (kept + 1) * g.total_rows,
                                   outputs=[part.itemsize] * px, carry_tiles=px * carry)
            return total + stages * (H + g.rows) * g.row_tile_bytes()
        work = (kept + 1) * px
        staged_work, staged_out = _tpu.staged(g, jnp.float32), _tpu.staged(g, part)
        forward = _tpu.vmem_need(g, inputs, stages=work * staged_work, scratch_rows=0,
                                 outputs=[4] * work, carry_tiles=px * carry)
        backward = _tpu.vmem_need(g, [(b_op, 4)] * work, stages=work * staged_work + px * staged_out,
                                  scratch_rows=0, outputs=[part.itemsize] * px,
                                  carry_tiles=px * _backward_carry_tiles(l, u, kept))
        return max(forward + stages * (H + g.rows) * g.row_tile_bytes(), backward)

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
    (`pltpu.InterpretParams`, or True) to run on CPU. Systems too long for VMEM (`fits`) run
    in two kernels whose kept rows of U and y go through HBM (`_streamed_solve`; XLA's loop
    where not even their chunks fit)."""
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
    streamed = g is None
    if streamed:
        g = _plan(P, N, Q, ab, b, out_dtype, l=l, u=u, kind=kind, transposed=transposed,
                  budget=budget.budget, streamed=True)
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
    stage = vmem(_tpu.rows_shape(g, H + g.rows), jnp.float32)
    stages = [stage] * ((K if op.kind == "rows" else 0) * len(ab_parts) + len(b_parts))
    if op.kind == "scalar" and H:
        stages.append(_tpu.pltpu.SMEM((K * len(ab_parts), H), jnp.float32))
    options = dict(g=g, l=l, u=u, kind=kind, transposed=transposed)
    call = functools.partial(_tpu.call, vmem_limit=budget.limit, interpret=interpret)
    parts = (len(ab_parts), len(b_parts), px)
    if streamed:
        x = _streamed_solve(call, inputs, ab_parts, b_parts, stages, op=op, K=K, H=H, stored=stored,
                            parts=parts, shape=shape, part=part, **options)
    else:
        scratch = [vmem(_tpu.rows_shape(g, g.total_rows), jnp.float32)] * ((kept + 1) * px)
        scratch.append(vmem((carry * px, *g.tile), jnp.float32))
        kernel = functools.partial(_kernel, op=op, K=K, stored=stored, parts=parts,
                                   direct_out=direct_out, H=H, **options)
        x = call(kernel, g, inputs, in_specs, [jax.ShapeDtypeStruct(shape, part)] * px,
                 [out_spec] * px, scratch + stages, steps=2 * C, name=f"tridiax_{kind}_tpu")
    x = jax.lax.complex(*x) if complex_ else x[0]
    return x.reshape(P, N, Q)


def _streamed_solve(call, inputs, ab_parts, b_parts, stages, *, g, op, K, H, l, u, kind, transposed,
                    stored, parts, shape, part):
    """The two kernels of a system too long for VMEM (`call`: `_tpu.call` with the VMEM limit):
    the forward elimination reads every input once and writes the kept rows of U and y to
    float32 work arrays, D = lo + up rows down (`_streamed_forward`; one more chunk where they
    spill past the last), the back substitution reads them last chunk first and writes x."""
    px = parts[2]
    lo, up = (u, l) if transposed else (l, u)
    D, C = lo + up, g.chunks
    steps = -(-(g.N + D) // g.chunk)  # chunks of the work arrays: C, or C + 1
    kept = _window.kept_columns(l, u, kind, transposed)
    rows, vmem = _tpu.Operand("rows"), _tpu.pltpu.VMEM
    staged_work, staged_out = _tpu.staged(g, jnp.float32), _tpu.staged(g, part)
    work_shape = (g.P, g.N + D) if g.layout == "transposed" else (g.P, g.N + D, g.Q)
    work = (kept + 1) * px
    stage = vmem(_tpu.stage_shape(g), jnp.float32)

    def chunk_in(k):
        return jnp.minimum(k, C - 1)

    def forward_chunk(k):
        return k

    def backward_chunk(k):
        return steps - 1 - k

    def x_chunk(k):
        return jnp.minimum(steps - 1 - k, C - 1)

    in_specs = ([_tpu.block_spec(g, op, chunk_in, stack=K)] * len(ab_parts)
                + [_tpu.block_spec(g, rows, chunk_in)] * len(b_parts))
    scratch = [vmem((_carry_tiles(l, u, kind, transposed) * px, *g.tile), jnp.float32), *stages]
    kernel = functools.partial(_streamed_forward, g=g, op=op, K=K, l=l, u=u, kind=kind,
                               transposed=transposed, stored=stored, parts=parts, H=H, steps=steps,
                               staged_work=staged_work)
    rows_of_work = call(kernel, g, inputs, in_specs, [jax.ShapeDtypeStruct(work_shape, jnp.float32)] * work,
                        [_tpu.block_spec(g, rows, forward_chunk)] * work,
                        scratch + [stage] * (work * staged_work), steps=steps,
                        name=f"tridiax_{kind}_forward_tpu")
    scratch = [vmem((_backward_carry_tiles(l, u, kept) * px, *g.tile), jnp.float32)]
    scratch += [stage] * (work * staged_work + px * staged_out)
    kernel = functools.partial(_streamed_backward, g=g, l=l, u=u, kind=kind, transposed=transposed,
                               px=px, steps=steps, staged_work=staged_work, staged_out=staged_out)
    return call(kernel, g, rows_of_work, [_tpu.block_spec(g, rows, backward_chunk)] * work,
                [jax.ShapeDtypeStruct(shape, part)] * px, [_tpu.block_spec(g, rows, x_chunk)] * px,
                scratch, steps=steps, name=f"tridiax_{kind}_backward_tpu")
