"""Banded factorizations and factored solves as Pallas Mosaic TPU kernels over the (P, N, Q) view.

The factors are `_xla_banded.factor_pnq`'s, in its layout (LAPACK's gbtrf, pivots interleaved):
`u_rows` (kept, P, N, Q), row j of U with 1/pivot first; `multipliers` (lo, P, N, Q), the
multiples of row j subtracted from rows j + 1..j + lo; `pivots` (P, N, Q) int32, the row
j + pivots[j] swapped with row j before step j. Each kernel keeps solution-sized scratches of
every system in VMEM (`pallas_tpu.py`'s grouping into row tiles and chunks: the factorization
one per row of factors it records, a factored solve one for the solution) and walks the grid
in phases, each a pass over the chunks, so that every input is read once and every output
written once:

- `factor_pnq`: the solve kernel's forward elimination (`pallas_tpu._forward`, steps lagging
  the chunks by lo + up rows, a halo of the previous chunk's rows) with a zero right-hand side,
  recording each step's factors in VMEM; then a pass writing them out chunk by chunk.
- `factored_solve_pnq` (A x = b): b copied into VMEM, then the row operations of L (the
  swaps and multiples, gbtrs's forward pass) in place, each reading b's row j + lo from
  VMEM; then the back substitution with U's rows, last chunk first, writing x.
- `factored_solve_pnq` (A^T x = b): U^T z = b forward (each solved value pushed into the
  sums of the rows below it), then the transposed row operations of L, last row first, in
  place (row j + lo is final after step j); then a pass writing x out.

Complex64 runs as float32 parts (`_pallas/tpu.py`, `parts_of`); the pivots are real. Systems
too long for their VMEM scratch run XLA's loops (`_xla_banded`): there are no streamed
factorization kernels (`_factor_plan` and `_solve_plan` return None for them).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .._core.split_complex import select
from .._pallas import tpu as _tpu
from . import pallas_tpu as _solve_kernels
from . import window as _window
from . import xla as _xla

_rows_op = _tpu.Operand("rows")


def _stack_readers(g, op, refs, count: int, stages: list):
    """Row readers of a stack's `count` operands (`refs`: its parts' blocks), each joined over
    its parts; staged rows fill the next of `stages` (consumed)."""
    groups = [[ref.at[n] for ref in refs] for n in range(count)]
    return _tpu.part_readers(g, [op] * count, groups, stages)


def _stages_of(op, count: int) -> int:
    """Float32 stages the operands of a stack of `count` take (per part)."""
    return count if op.kind == "rows" and op.staged else 0


def _prepare(g, stack, complex_: bool):
    """A (c, P|1, N, Q|1) stack as the kernel takes it: its parts, their `Operand`."""
    parts = _tpu.parts_of(stack, complex_ and jnp.iscomplexobj(stack))
    op = _tpu.operand(g, stack.shape[1:], parts[0].dtype)
    return [_solve_kernels._prepare_bands(g, v, op) for v in parts], op


# ---------------------------------------------------------------------------------------------
# The factorization.


def _factor_kernel(*refs, g, op, K, l, u, kind, parts, H):
    """Refs: the stacked bands (each part); the outputs: U's kept columns and the multipliers
    (stacks, each part), the pivots (with pivoting); a VMEM scratch (every chunk) for each of
    their columns (each part) and for the pivots; the carry, the bands' stages and the SMEM
    halo."""
    pa, px = parts
    pivoting = kind == "banded_pivoted"
    kept = _window.kept_columns(l, u, kind, False)
    take = functools.partial(_solve_kernels._take, refs := list(refs))
    ab_refs = take(pa)
    out_stacks = [take(px)] + ([take(px)] if l else [])
    counts = [kept] + [l] * bool(l)
    p_out = take(1) if pivoting else []
    scratch = [take(px) for _ in range(kept + l)] + [take(1) for _ in p_out]
    (carry_ref,) = take(1)
    band_stages, _, halo_ref = _solve_kernels._stages(refs, op=op, K=K, parts=(pa, 0, px), H=H)
    C = g.chunks
    k = pl.program_id(2)

    @pl.when(k < C)
    def _():
        work = [_tpu.scratch_rows(g, r, g.total_rows) for r in scratch]

        def store(s, values):  # without pivoting, the pivot row (zero) is not kept
            for rows, value in zip(work, values[:len(work)], strict=True):
                rows.store(s, value)

        _solve_kernels._forward(
            g, (ab_refs, [], band_stages, [], halo_ref), _tpu.CarryTiles(carry_ref, px), store,
            lambda run: _solve_kernels._over_steps(g, k, l + u, run), j=k, op=op, K=K, l=l,
            u=u, kind=kind, transposed=False, stored=None, H=H, px=px, record=True)

    @pl.when(k >= C)
    def _():
        offset = _tpu.aligned((k - C) * g.rows)
        blocks = [[ref.at[n] for ref in stack] for stack, count in zip(out_stacks, counts, strict=True)
                  for n in range(count)]
        blocks += [p_out] if pivoting else []
        for refs_, out in zip(scratch, blocks, strict=True):
            _tpu.stage_out_parts(g, _tpu.scratch_rows(g, refs_, g.total_rows, offset), out)


def _factor_plan(P, N, Q, ab, out_dtype, *, l, u, kind, budget=None):
    K = ab.shape[0]
    px, part = _tpu.split_dtype(out_dtype)
    pa = _tpu.split_dtype(ab.dtype)[0] if px == 2 else 1
    ab_part = _tpu.split_dtype(ab.dtype)[1]
    kept = _window.kept_columns(l, u, kind, False)
    arrays = (kept + l) * px + (kind == "banded_pivoted")
    carry = _solve_kernels._carry_tiles(l, u, kind, False)

    def need(g):
        if g.chunks > 1 and l + u >= g.chunk:
            return float("inf")  # the lag must stay within one chunk
        op = _solve_kernels._band_operand(g, ab.shape[1:], ab_part)
        stages = K * pa if op.kind == "rows" else 0
        total = _tpu.vmem_need(g, [(op, ab_part.itemsize)] * (K * pa), stages=0,
                               scratch_rows=arrays * g.total_rows, outputs=[4] * arrays,
                               carry_tiles=px * carry)
        return total + stages * (_solve_kernels._halo(g, l, u) + g.rows) * g.row_tile_bytes()

    return _tpu.geometry(P, N, Q, vmem_bytes=need, budget=budget)


def factor_pnq(ab, *, l: int, u: int, kind: str, shape: tuple[int, int, int], out_dtype,
               interpret=None):
    """`_xla_banded.factor_pnq`'s factors of every system's A: `ab` (l + u + 1, P|1, N, Q|1)
    bands in scipy's layout, `shape` (P, N, Q) the systems' (the factors' shape; the bands
    broadcast against it), kind "banded" or "banded_pivoted". Returns (u_rows (kept, P, N, Q),
    multipliers (l, P, N, Q), both of `out_dtype`, pivots (P, N, Q) int32). XLA's loop where
    the factors do not fit VMEM (`_factor_plan`).

    The factorization primitive passes an operator's own bands (`shape` is theirs): bands
    broadcast against a larger `shape` are materialised first, so that the kernel reads every
    operand as rows (the solve kernels' SMEM scalars and tiles are for shared factors)."""
    P, N, Q = shape
    ab = jnp.broadcast_to(ab, (ab.shape[0], P, N, Q))
    out_dtype = jnp.dtype(out_dtype)
    _tpu.check_dtype(out_dtype)
    K = ab.shape[0]
    kept = _window.kept_columns(l, u, kind, False)
    pivoting = kind == "banded_pivoted"
    budget = _tpu.vmem()
    g = None if P * N * Q == 0 else _factor_plan(P, N, Q, ab, out_dtype, l=l, u=u, kind=kind,
                                                  budget=budget.budget)
    if g is None:
        return _xla.factor_pnq(ab, l=l, u=u, kind=kind, shape=shape, out_dtype=out_dtype)
    px, part = _tpu.split_dtype(out_dtype)
    complex_ = px == 2
    ab_parts = _tpu.parts_of(ab, complex_ and jnp.iscomplexobj(ab))
    op = _solve_kernels._band_operand(g, ab.shape[1:], ab_parts[0].dtype)
    H = _solve_kernels._halo(g, l, u)
    C = g.chunks
    layout_shape = (P, N) if g.layout == "transposed" else (P, N, Q)
    counts = [kept] + [l] * bool(l)
    out_shapes = [jax.ShapeDtypeStruct((c, *layout_shape), part) for c in counts for _ in range(px)]
    out_shapes += [jax.ShapeDtypeStruct(layout_shape, jnp.int32)] * pivoting

    def chunk_out(k):
        return jnp.maximum(k - C, 0)

    out_specs = [_tpu.block_spec(g, _rows_op, chunk_out, stack=c) for c in counts for _ in range(px)]
    out_specs += [_tpu.block_spec(g, _rows_op, chunk_out)] * pivoting
    vmem = _tpu.pltpu.VMEM
    scratch = [vmem(_tpu.rows_shape(g, g.total_rows), jnp.float32)] * ((kept + l) * px + pivoting)
    scratch.append(vmem((_solve_kernels._carry_tiles(l, u, kind, False) * px, *g.tile), jnp.float32))
    if op.kind == "rows":
        scratch += [vmem(_tpu.rows_shape(g, H + g.rows), jnp.float32)] * (K * len(ab_parts))
    kernel = functools.partial(_factor_kernel, g=g, op=op, K=K, l=l, u=u, kind=kind,
                               parts=(len(ab_parts), px), H=H)
    outs = list(_tpu.call(
        kernel, g, [_solve_kernels._prepare_bands(g, v, op) for v in ab_parts],
        [_tpu.block_spec(g, op, lambda k: jnp.minimum(k, C - 1), stack=K)] * len(ab_parts),
        out_shapes, out_specs, scratch, steps=2 * C, name=f"tridiax_{kind}_factor_tpu",
        vmem_limit=budget.limit, interpret=interpret))
    stacks = []
    for count in counts:
        values, outs = outs[:px], outs[px:]
        value = jax.lax.complex(*values) if complex_ else values[0]
        stacks.append(value.reshape(count, P, N, Q))
    multipliers = stacks[1] if l else jnp.zeros((0, P, N, Q), out_dtype)
    pivots = outs[0].reshape(P, N, Q) if pivoting else jnp.zeros((P, N, Q), jnp.int32)
    return stacks[0], multipliers, pivots


# ---------------------------------------------------------------------------------------------
# The factored solves.


def _swapped(rows: list, p) -> list:
    """`rows` (tiles of rows j .. j + lo) with row 0 and row p exchanged in each lane (p: a
    tile of the pivots, 0 .. lo)."""
    rows, top = list(rows), rows[0]
    for r in range(1, len(rows)):
        chosen = p == r
        top, rows[r] = select(chosen, rows[r], top), select(chosen, rows[0], rows[r])
    return [top, *rows[1:]]


class _FactoredRefs:
    """A factored solve's refs, in `factored_solve_pnq`'s order: the blocks of U's kept columns,
    the multipliers, the pivots, b and x (each in its parts: `parts`), the VMEM scratch of the
    solution (every chunk), the carry, the stages of the three stacks, b's stages (the rest)."""

    def __init__(self, refs, g, ops, kept: int, lo: int, parts):
        pf, pm, pp, pb, px = parts
        take = functools.partial(_solve_kernels._take, refs := list(refs))
        self.u, self.m, self.p, self.b, self.x, self.work = (take(n) for n in (pf, pm, pp, pb, px, px))
        self.carry = _tpu.CarryTiles(take(1)[0], px)
        self.stages = [take(_stages_of(op, count) * n)
                       for op, count, n in zip(ops, (kept, lo, 1), (pf, pm, pp), strict=True)]
        self.b_stages = refs
        self.g, self.ops, self.kept, self.lo, self.px = g, ops, kept, lo, px
        self.step = pl.program_id(2)
        self.zero = jnp.zeros(g.tile, jnp.float32)

    def solution(self, offset=0):
        """The solution scratch's rows from `offset`."""
        return _tpu.scratch_rows(self.g, self.work, self.g.total_rows, offset)

    def columns_of_u(self) -> list:
        """Row readers of U's kept columns (this chunk's)."""
        return _stack_readers(self.g, self.ops[0], self.u, self.kept, list(self.stages[0]))

    def row_operations(self):
        """Row readers of the multipliers (a list) and of the pivots (this chunk's)."""
        multipliers = _stack_readers(self.g, self.ops[1], self.m, self.lo, list(self.stages[1]))
        return multipliers, _stack_readers(self.g, self.ops[2], self.p, 1, list(self.stages[2]))[0]


def _solve_kernel(*refs, g, ops, kept, lo, parts, direct_out):
    """A x = b from the factors, in three passes over the chunks (module docstring); refs as
    `_FactoredRefs` reads them, the solution's scratch holding y."""
    r = _FactoredRefs(refs, g, ops, kept, lo, parts)
    C, k, px, carry, zero = g.chunks, r.step, r.px, r.carry, r.zero
    y = r.solution()

    @pl.when(k < C)
    def _():  # b, chunk k, into y's scratch
        for ref, scratch in zip(r.b, r.work, strict=True):
            _tpu.stage_in(g, ref, scratch, offset=_tpu.aligned(k * g.rows), rows=g.total_rows)

    if lo:
        @pl.when(jnp.logical_and(k >= C, k < 2 * C))
        def _():  # L's row operations on chunk j's rows, in place
            j = k - C
            multipliers, pivot = r.row_operations()

            @pl.when(j == 0)
            def _():
                carry.store([select(n < g.N, y.load(min(n, g.N - 1)), zero) for n in range(lo)])

            def step(i, window):
                s = j * g.chunk + i
                incoming = y.load(jnp.minimum(s + lo, g.N - 1))
                window = [*window, select(s + lo < g.N, incoming, zero)]
                window = _swapped(window, pivot.load(i))  # pivots of 0 without pivoting
                head = window[0]
                y.store(s, head)
                return _solve_kernels._splits(
                    tuple(window[n] - multipliers[n - 1].load(i) * head for n in range(1, lo + 1)), px)

            def run(count):
                carry.store(_tpu.loop(count, step, _solve_kernels._splits(carry.load(lo), px)))

            _tpu.over_rows(g, j, run)

    @pl.when(k >= 2 * C)
    def _():  # the back substitution, chunk w, last first
        w = 3 * C - 1 - k
        y_rows = r.solution(_tpu.aligned(w * g.rows))
        work = [*r.columns_of_u(), y_rows]
        out = _tpu.block_rows(g, r.x) if direct_out else y_rows

        @pl.when(k == 2 * C)
        def _():
            carry.store([zero] * (kept - 1))

        def run(count):
            def row(i, below):
                x, below = _solve_kernels._substitution([rows.load(i) for rows in work], below)
                out.store(i, x)
                return below

            carry.store(_tpu.loop(count, lambda i, c: _solve_kernels._splits(row(i, c), px),
                                  carry.load(kept - 1), reverse=True))

        _tpu.over_rows(g, w, run)
        if not direct_out:
            _tpu.stage_out_parts(g, y_rows, r.x)


def _transposed_solve_kernel(*refs, g, ops, kept, lo, parts, direct_out):
    """A^T x = b from the factors, in three passes over the chunks (module docstring); refs as
    `_FactoredRefs` reads them, the solution's scratch holding z, then x."""
    del direct_out
    r = _FactoredRefs(refs, g, ops, kept, lo, parts)
    C, k, px, carry, zero = g.chunks, r.step, r.px, r.carry, r.zero
    z = r.solution()

    @pl.when(k < C)
    def _():  # U^T z = b, chunk k: z[i] = (b[i] - sums[0]) / pivot, sums of the rows below
        U = r.columns_of_u()
        (b,) = _tpu.part_readers(g, [_tpu.Operand("rows", staged=bool(r.b_stages))], [r.b],
                                 list(r.b_stages))

        @pl.when(k == 0)
        def _():
            carry.store([zero] * (kept - 1))

        def row(i, sums):
            value = b.load(i) - sums[0] if sums else b.load(i)
            value = value * U[0].load(i)
            z.store(k * g.chunk + i, value)
            pushed = [U[c].load(i) * value for c in range(1, kept)]
            sums = [*sums[1:], zero][:kept - 1]
            return _solve_kernels._splits(tuple(s + v for s, v in zip(sums, pushed, strict=True)), px)

        def run(count):
            carry.store(_tpu.loop(count, row, _solve_kernels._splits(carry.load(kept - 1), px)))

        _tpu.over_rows(g, k, run)

    if lo:
        @pl.when(jnp.logical_and(k >= C, k < 2 * C))
        def _():  # L's row operations transposed, chunk w, last row first
            w = 2 * C - 1 - k
            multipliers, pivot = r.row_operations()

            @pl.when(k == C)
            def _():
                carry.store([zero] * lo)

            def step(i, below):  # below: rows s + 1 .. s + lo as the steps after s left them
                s = w * g.chunk + i
                rows = [z.load(s), *below]
                total = rows[0]
                for n in range(1, lo + 1):
                    total = total - multipliers[n - 1].load(i) * rows[n]
                rows = _swapped([total, *rows[1:]], pivot.load(i))
                # Row s + lo is final: no later step (a lower row) reaches it. Past the end, the
                # store lands on row N - 1, which its own final store overwrites later.
                z.store(jnp.minimum(s + lo, g.N - 1), rows[lo])
                return _solve_kernels._splits(tuple(rows[:lo]), px)

            def run(count):
                carry.store(_tpu.loop(count, step, _solve_kernels._splits(carry.load(lo), px),
                                      reverse=True))

            _tpu.over_rows(g, w, run)

            @pl.when(w == 0)
            def _():
                for n, value in enumerate(carry.load(lo)[:min(lo, g.N)]):
                    z.store(n, value)

    @pl.when(k >= 2 * C)
    def _():
        _tpu.stage_out_parts(g, r.solution(_tpu.aligned((k - 2 * C) * g.rows)), r.x)


def _solve_plan(P, N, Q, factors, b, out_dtype, *, budget=None):
    """The geometry of a factored solve; `factors`: the stacks of U's columns, the multipliers
    and the pivots (their shapes and dtypes)."""
    px, part = _tpu.split_dtype(out_dtype)
    pb = _tpu.split_dtype(b.dtype)[0] if px == 2 else 1
    kept, lo = factors[0].shape[0], factors[1].shape[0]
    carry = max(kept - 1, lo, 1)

    def need(g):
        inputs, stages = [], 0
        for stack in factors:
            pf = _tpu.split_dtype(stack.dtype)[0] if px == 2 else 1
            item = _tpu.split_dtype(stack.dtype)[1]
            op = _tpu.operand(g, stack.shape[1:], item)
            inputs += [(op, item.itemsize)] * (stack.shape[0] * pf)
            stages += _stages_of(op, stack.shape[0]) * pf
        b_item = _tpu.split_dtype(b.dtype)[1]
        inputs += [(_tpu.Operand("rows", staged=True), b_item.itemsize)] * pb
        stages += pb * _tpu.staged(g, b_item)
        return _tpu.vmem_need(g, inputs, stages=stages, scratch_rows=px * g.total_rows,
                              outputs=[part.itemsize] * px, carry_tiles=px * carry)

    return _tpu.geometry(P, N, Q, vmem_bytes=need, budget=budget)


def factored_solve_pnq(u_rows, multipliers, pivots, b, *, transposed: bool, out_dtype,
                       interpret=None):
    """`_xla_banded.factored_solve_pnq`: A x = b (A^T x = b when `transposed`) from the factors
    (`factor_pnq`'s, each (c, P|1, N, Q|1) against b's (P, N, Q); pivots int32 (P|1, N, Q|1)).
    Returns x, (P, N, Q) of `out_dtype`. XLA's loops where y does not fit VMEM."""
    P, N, Q = b.shape
    out_dtype = jnp.dtype(out_dtype)
    _tpu.check_dtype(out_dtype)
    kept, lo = u_rows.shape[0], multipliers.shape[0]
    pivots = pivots[None]
    budget = _tpu.vmem()
    g = None if P * N * Q == 0 else _solve_plan(P, N, Q, (u_rows, multipliers, pivots), b, out_dtype,
                                                 budget=budget.budget)
    if g is None:
        return _xla.factored_solve_pnq(u_rows, multipliers, pivots[0], b, transposed=transposed,
                                       out_dtype=out_dtype)
    px, part = _tpu.split_dtype(out_dtype)
    complex_ = px == 2
    (u_parts, u_op), (m_parts, m_op), (p_parts, p_op) = (
        _prepare(g, stack, complex_) for stack in (u_rows, multipliers, pivots))
    if not lo:  # L = I: no row operations, nothing of them read
        m_parts = p_parts = []
    b_parts = [_tpu.prepare(g, v)[0] for v in _tpu.parts_of(b, complex_)]
    C = g.chunks
    phase = {  # the chunk each operand's block holds at grid step k (see the kernels)
        False: (lambda k: jnp.clip(3 * C - 1 - k, 0, C - 1), lambda k: jnp.clip(k - C, 0, C - 1),
                lambda k: jnp.minimum(k, C - 1), lambda k: jnp.clip(3 * C - 1 - k, 0, C - 1)),
        True: (lambda k: jnp.minimum(k, C - 1), lambda k: jnp.clip(2 * C - 1 - k, 0, C - 1),
               lambda k: jnp.minimum(k, C - 1), lambda k: jnp.clip(k - 2 * C, 0, C - 1)),
    }[transposed]
    u_chunk, m_chunk, b_chunk, x_chunk = phase
    in_specs = ([_tpu.block_spec(g, u_op, u_chunk, stack=kept)] * len(u_parts)
                + [_tpu.block_spec(g, m_op, m_chunk, stack=lo)] * len(m_parts)
                + [_tpu.block_spec(g, p_op, m_chunk, stack=1)] * len(p_parts)
                + [_tpu.block_spec(g, _rows_op, b_chunk)] * len(b_parts))
    layout_shape = (P, N) if g.layout == "transposed" else (P, N, Q)
    vmem = _tpu.pltpu.VMEM
    stage = vmem(_tpu.stage_shape(g), jnp.float32)
    scratch = [vmem(_tpu.rows_shape(g, g.total_rows), jnp.float32)] * px
    scratch.append(vmem((max(kept - 1, lo, 1) * px, *g.tile), jnp.float32))
    scratch += [stage] * (_stages_of(u_op, kept) * len(u_parts) + _stages_of(m_op, lo) * len(m_parts)
                          + _stages_of(p_op, 1) * len(p_parts))
    if transposed and _tpu.staged(g, b_parts[0].dtype):
        scratch += [stage] * len(b_parts)
    kernel = functools.partial(_transposed_solve_kernel if transposed else _solve_kernel, g=g,
                               ops=(u_op, m_op, p_op), kept=kept, lo=lo,
                               parts=(len(u_parts), len(m_parts), len(p_parts), len(b_parts), px),
                               direct_out=not _tpu.staged(g, part))
    x = _tpu.call(kernel, g, [*u_parts, *m_parts, *p_parts, *b_parts], in_specs,
                  [jax.ShapeDtypeStruct(layout_shape, part)] * px,
                  [_tpu.block_spec(g, _rows_op, x_chunk)] * px, scratch, steps=3 * C,
                  name="tridiax_banded_factored_solve_tpu", vmem_limit=budget.limit,
                  interpret=interpret)
    x = jax.lax.complex(*x) if complex_ else x[0]
    return x.reshape(P, N, Q)
