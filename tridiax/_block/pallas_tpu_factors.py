"""Block-tridiagonal factorizations and factored solves as Pallas Mosaic TPU kernels over the
(P, N, Q) view.

The factors are `_xla_block.factor_pnq`'s, in its layout: `lu` (P, N, Q, k, k), each Schur
complement S[i] eliminated in getrf's layout (`elimination.getrf`), `pivots` (P, N, Q, k, 1)
int32 and `e` (P, N, Q, k, k), E[i] = S[i]^-1 U[i]. The kernels take and write every operand
as the solve kernel does (`pallas_tpu.py`: the "lanes" view, systems along lanes, each operand
in the arrangement a TPU stores it in, batch-first systems swapped onto lanes) and follow
`_xla_block` operation for operation:

- `factor_pnq`: one pass over the chunks. Row i eliminates S = D[i] - L[i] E[i-1]
  (`elimination.eliminate`) and applies it to U[i] (zero at the last row) for E[i], which the
  carry takes to row i + 1; S's factors (in getrf's layout) and E[i] are written at row i. No
  scratch but the carry, so its VMEM does not grow with N: chunks of 16 rows and more, of any
  count. (Where not even such a chunk of one row tile fits, XLA's loop runs.)
- `factored_solve_pnq`, A x = b: y[i] = S[i]^-1 (b[i] - L[i] y[i-1]) forward, reading lu,
  pivots, lower and b, into a VMEM scratch of the whole system; then x[i] = y[i] - E[i] x[i+1],
  last chunk first, reading e.
- `factored_solve_pnq`, A^T x = b (A^T = U^T L^T): z[i] = b[i] - E[i-1]^T z[i-1] forward,
  reading e and b; then x[i] = S[i]^-T (z[i] - L[i+1]^T x[i+1]), last chunk first, reading lu,
  pivots and lower (L[i+1] carried from the row after).

A factored solve is one pallas_call of 2C steps (C chunks forward, then back), so that each
input is read once (those of the backward pass wait at their last chunk) and x written once.
Systems whose scratch does not fit VMEM run the same sweeps in two kernels, y (z) written to
a float32 work array in HBM by the forward one and read by the backward one, last chunk first
(`_streamed_forward_kernel`, `_streamed_backward_kernel`); XLA's loops run where not even
their chunks fit (`_xla_block.factored_solve_pnq`).
Complex64 runs as float32 parts; the pivots are real.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .._core.dtypes import compute_dtype
from .._core.split_complex import select
from .._pallas import tpu as _tpu
from . import pallas_tpu as _kernels
from . import xla as _xla
from .elimination import apply, eliminate, getrf, product, solve_getrf, solve_getrf_transposed


@dataclasses.dataclass(frozen=True)
class _Input:
    """One operand of a call: its (p, n, q, r, c) view (batch-first systems swapped onto
    lanes), its real parts' count and its `Arrangement`."""

    view: jax.Array | jax.ShapeDtypeStruct
    r: int
    c: int
    parts: int
    how: _kernels.Arrangement

    @property
    def dtype(self):
        return jnp.float32 if self.parts == 2 else self.view.dtype


def _inputs(operands, swapped: bool, complex_: bool):
    """`_Input`s of (x, r, c) operands (the pivots, int32, stay one real part, and keep their
    column axis of size 1 as a user holds them)."""
    out = []
    for x, r, c in operands:
        pivots = x.dtype == jnp.int32
        how = _kernels.arrangement(x.shape, x.dtype, r, c, swapped=swapped, column_axis=pivots)
        parts = 1 if pivots or not complex_ else 2
        out.append(_Input(_kernels._swap(x) if swapped else x, r, c, parts, how))
    return out


def _input_bytes(g, inputs) -> int:
    return sum(x.parts * _kernels._operand_bytes(g, x.view.shape[:3], x.dtype, x.how, x.r, x.c)
               for x in inputs)


def _outputs_bytes(g, outputs) -> int:
    """Two buffers of each output block ((how, dtype, parts) each)."""
    return sum(2 * parts * _kernels._block_bytes(g, how, dtype) for how, dtype, parts in outputs)


def _passed(g, inputs):
    """The arrays to pass, their `Operand`s and the float32 stages staged ones take."""
    arrays, ops, staged = [], [], []
    for x in inputs:
        op = _tpu.operand(g, x.view.shape[:3], x.dtype)
        ops.append(op)
        parts = _tpu.parts_of(x.view, x.parts == 2)
        arrays += [_kernels._prepare(g, part, op, x.how) for part in parts]
        staged.append(op.kind == "rows" and _kernels._staged(x.how, x.dtype))
    return arrays, ops, staged


def _specs(g, inputs, ops, chunk_of):
    return [_kernels._spec(g, op, chunk_of, x.how, x.r * x.c)
            for x, op in zip(inputs, ops, strict=True) for _ in range(x.parts)]


def _stage_shapes(g, inputs, staged):
    lanes = g.s * _tpu.LANES
    return [_tpu.pltpu.VMEM((x.r * x.c, g.rows, lanes), jnp.float32)
            for x, stage in zip(inputs, staged, strict=True) if stage for _ in range(x.parts)]


def _entries(g, inputs, ops, staged, refs, stages):
    """The `_Entries` of every input (`refs`: their blocks, each part; `stages` consumed)."""
    out = []
    for x, op, stage in zip(inputs, ops, staged, strict=True):
        own = tuple(refs.pop(0) for _ in range(x.parts))
        stage_refs = tuple(stages.pop(0) for _ in range(x.parts)) if stage else None
        out.append(_kernels._Entries(g, op, own, x.r, x.c, x.how, stage_refs))
    return out


def _masked(condition, A):
    return [[select(condition, 0.0, v) for v in row] for row in A]


def _column(values):
    return [row[0] for row in values]


# ---------------------------------------------------------------------------------------------
# The factorization.


def _factor_kernel(*refs, g, inputs, ops, staged, outs, k, kind):
    """Refs: the blocks of lower, diag and upper (each part), those of lu, pivots and e, the
    carry (E[i-1]) and the stages of staged inputs."""
    refs = list(refs)
    n_in = sum(x.parts for x in inputs)
    in_refs = refs[:n_in]
    (lu_how, _, parts), (piv_how, _, _), (e_how, _, _) = outs
    lu_refs = refs[n_in:n_in + parts]
    piv_refs = refs[n_in + parts:n_in + parts + 1]
    e_refs = refs[n_in + parts + 1:n_in + 2 * parts + 1]
    carry_ref, *stages = refs[n_in + 2 * parts + 1:]
    lower, diag, upper = _entries(g, inputs, ops, staged, in_refs, stages)
    carry = _kernels._Carry(carry_ref, parts)
    write_lu = _kernels._entry_writer(lu_refs, lu_how, parts)
    write_pivots = _kernels._entry_writer(piv_refs, piv_how, 1)
    write_e = _kernels._entry_writer(e_refs, e_how, parts)
    j = pl.program_id(2)
    start = j * g.chunk
    for operand in (lower, diag, upper):
        if operand.stages is not None:
            operand.stage_in()

    @pl.when(j == 0)
    def _():
        carry.store([jnp.zeros(g.tile, jnp.float32)] * (k * k))

    def run(count):
        def row(i, values):
            e_prev = _kernels._unflatten(values, k, k)
            sub = _masked(start + i == 0, lower.load(i))
            fact = eliminate(_kernels._subtract(diag.load(i), product(sub, e_prev)),
                             pivoting=kind == "block_pivoted",
                             hermitian=kind == "block_hermitian")
            e = apply(fact, _masked(start + i == g.N - 1, upper.load(i)))
            lu, pivots = getrf(fact)
            write_lu(i, lu)
            write_pivots(i, [[p] for p in pivots])
            write_e(i, e)
            return tuple(_kernels._flat(e))

        carry.store(_tpu.loop(count, row, tuple(carry.load(k * k))))

    _tpu.over_rows(g, j, run)


def factor_pnq(lower, diag, upper, *, kind: str, out_dtype, interpret=None):
    """`_xla_block.factor_pnq` as a Pallas TPU kernel: the factors (lu, pivots, e) of the
    (P|1, N|1, Q|1, k, k) blocks' systems, as (P, N, Q, ...) arrays of `out_dtype`'s compute
    dtype (float32 for half precision; pivots int32). `interpret`: Pallas's interpret mode
    (`pltpu.InterpretParams`, or True)."""
    if kind not in _xla.KINDS:
        raise ValueError(f"kind must be one of {_xla.KINDS}, got {kind!r}")
    out_dtype = compute_dtype(out_dtype)  # the factors of half precision are float32, as XLA's
    _tpu.check_dtype(out_dtype)
    k = diag.shape[-1]
    P, N, Q = (max(x.shape[d] for x in (lower, diag, upper)) for d in range(3))
    if P * N * Q == 0:
        return _xla.factor_pnq(lower, diag, upper, kind=kind, out_dtype=out_dtype)
    parts, part_dtype = _tpu.split_dtype(out_dtype)
    swapped = Q == 1 and P > 1
    inputs = _inputs([(x, k, k) for x in (lower, diag, upper)], swapped, parts == 2)
    full = (P, N, Q)
    outs = [(_kernels.arrangement((*full, k, c), dtype, k, c, swapped=swapped,
                                  column_axis=True), part, n)
            for c, dtype, part, n in ((k, out_dtype, part_dtype, parts),
                                      (1, jnp.int32, jnp.int32, 1),
                                      (k, out_dtype, part_dtype, parts))]

    def need(g):
        return (_input_bytes(g, inputs) + _outputs_bytes(g, outs)
                + _tpu.carry_bytes(g, k * k * parts) + _tpu.MOSAIC_SCRATCH)

    # chunks down to 16 rows: nothing but the carry spans them (a pivots' block pads its column
    # axis of size 1 to 8 sublanes, so large blocks need short chunks)
    Pv, Qv = (Q, P) if swapped else (P, Q)
    g = _tpu.geometry(Pv, N, Qv, vmem_bytes=need, budget=_tpu.vmem().budget, layout="lanes",
                      chunk_sizes=_tpu.chunks_down_to(16))
    if g is None:  # not even one row tile of 16 rows fits
        return _xla.factor_pnq(lower, diag, upper, kind=kind, out_dtype=out_dtype)
    arrays, ops, staged = _passed(g, inputs)

    def chunk(s):
        return s

    rows = _tpu.Operand("rows")
    out_shapes, out_specs = [], []
    for how, part, n in outs:
        shape = jax.ShapeDtypeStruct((Pv, *how.sizes(N), Qv), part)
        out_shapes += [shape] * n
        out_specs += [_kernels._spec(g, rows, chunk, how, 0)] * n
    scratch = [_tpu.pltpu.VMEM((k * k * parts, *g.tile), jnp.float32),
               *_stage_shapes(g, inputs, staged)]
    kernel = functools.partial(_factor_kernel, g=g, inputs=inputs, ops=ops, staged=staged,
                               outs=outs, k=k, kind=kind)
    results = _tpu.call(kernel, g, arrays, _specs(g, inputs, ops, chunk), out_shapes, out_specs,
                        scratch, steps=g.chunks, name=f"tridiax_{kind}_factor_tpu",
                        vmem_limit=_tpu.vmem().limit, interpret=interpret)
    lu, pivots, e = (results[:parts], results[parts:parts + 1], results[parts + 1:])
    return tuple(_kernels.joined(values, how, N, swapped)
                 for values, (how, _, _) in zip((lu, pivots, e), outs, strict=True))


# ---------------------------------------------------------------------------------------------
# The factored solves.


def _carried(k: int, m: int, transposed: bool) -> int:
    """Row tiles a factored solve's sweeps carry from row to row: x (y, z) of the row before,
    and with `transposed` the block the next row needs too (E[i-1], or L[i+1] going back)."""
    return k * m + (k * k if transposed else 0)


def _sweep(g, carry, operands, j, row, *, carried: int, offset, reverse: bool):
    """`row(start, offset, i, values)` over chunk j's rows (`reverse`: last first), from a zero
    carry at the first chunk swept; `operands`' stages filled first; `offset`: the chunk's
    first row in the y (z) rows `row` stores and loads."""
    for operand in operands:
        if operand.stages is not None:
            operand.stage_in()

    @pl.when(j == (g.chunks - 1 if reverse else 0))
    def _():
        carry.store([jnp.zeros(g.tile, jnp.float32)] * carried)

    def run(count):
        carry.store(_tpu.loop(count, functools.partial(row, j * g.chunk, offset),
                              tuple(carry.load(carried)), reverse=reverse))

    _tpu.over_rows(g, j, run)


def _forward_row(forward_inputs, ys, *, k, m, transposed):
    """The forward sweep's row: y[i] = S[i]^-1 (b[i] - L[i] y[i-1]), or z[i] = b[i] -
    E[i-1]^T z[i-1] when `transposed`, stored in `ys`."""
    if transposed:
        e, b = forward_inputs

        def row(start, offset, i, values):
            z_prev = _kernels._unflatten(values[:k * m], k, m)
            e_prev = _kernels._unflatten(values[k * m:], k, k)
            coupling = _masked(start + i == 0, product(_kernels._transpose(e_prev), z_prev))
            z = _kernels._subtract(b.load(i), coupling)
            ys.store(offset + i, z)
            return (*_kernels._flat(z), *_kernels._flat(e.load(i)))
        return row

    lu, pivots, lower, b = forward_inputs

    def row(start, offset, i, values):
        sub = _masked(start + i == 0, lower.load(i))
        t = _kernels._subtract(b.load(i), product(sub, _kernels._unflatten(values, k, m)))
        y = solve_getrf(lu.load(i), _column(pivots.load(i)), t)
        ys.store(offset + i, y)
        return tuple(_kernels._flat(y))
    return row


def _backward_row(g, backward_inputs, ys, store_x, *, k, m, transposed):
    """The backward sweep's row: x[i] = y[i] - E[i] x[i+1], or x[i] = S[i]^-T (z[i] -
    L[i+1]^T x[i+1]) when `transposed` (L[i] carried to row i - 1), written by
    `store_x(offset, i, x)`."""
    if transposed:
        lu, pivots, lower = backward_inputs

        def row(start, offset, i, values):
            x_next = _kernels._unflatten(values[:k * m], k, m)
            l_next = _kernels._unflatten(values[k * m:], k, k)
            coupling = _masked(start + i == g.N - 1,
                               product(_kernels._transpose(l_next), x_next))
            w = _kernels._subtract(ys.load(offset + i), coupling)
            x = solve_getrf_transposed(lu.load(i), _column(pivots.load(i)), w)
            store_x(offset, i, x)
            return (*_kernels._flat(x), *_kernels._flat(lower.load(i)))
        return row

    (e,) = backward_inputs

    def row(start, offset, i, values):
        coupling = _masked(start + i == g.N - 1,
                           product(e.load(i), _kernels._unflatten(values, k, m)))
        x = _kernels._subtract(ys.load(offset + i), coupling)
        store_x(offset, i, x)
        return tuple(_kernels._flat(x))
    return row


def _solve_kernel(*refs, g, inputs, ops, staged, forward_count, out_how, k, m, parts,
                  transposed):
    """Refs: the blocks of the forward pass's inputs, then the backward pass's (each part; see
    `factored_solve_pnq`), x's blocks, the scratch of y (z when `transposed`; x staged in it
    where x is 16-bit with rows minor), the carry and the stages of staged inputs."""
    refs = list(refs)
    n_in = sum(x.parts for x in inputs)
    in_refs = refs[:n_in]
    x_refs = refs[n_in:n_in + parts]
    y_refs = refs[n_in + parts:n_in + 2 * parts]
    carry_ref, *stages = refs[n_in + 2 * parts:]
    entries = _entries(g, inputs, ops, staged, in_refs, stages)
    forward_inputs, backward_inputs = entries[:forward_count], entries[forward_count:]
    ys = _kernels._Scratch(g, y_refs, k, m)
    sweep = functools.partial(_sweep, g, _kernels._Carry(carry_ref, parts),
                              carried=_carried(k, m, transposed))
    C = g.chunks
    step = pl.program_id(2)

    @pl.when(step < C)
    def _():
        row = _forward_row(forward_inputs, ys, k=k, m=m, transposed=transposed)
        sweep(forward_inputs, step, row, offset=step * g.rows, reverse=False)

    @pl.when(step >= C)
    def _():
        in_place = out_how.rows_minor and x_refs[0].dtype.itemsize < 4  # x through y's scratch
        write_x = _kernels._entry_writer(x_refs, out_how, parts)

        def store_x(offset, i, x):
            if in_place:
                ys.store(offset + i, x)
            else:
                write_x(i, x)

        j = 2 * C - 1 - step
        row = _backward_row(g, backward_inputs, ys, store_x, k=k, m=m, transposed=transposed)
        sweep(backward_inputs, j, row, offset=j * g.rows, reverse=True)
        if in_place:
            for a in range(k):
                for b in range(m):
                    x_refs[0][out_how.index(None, a, b)] = ys.chunk(
                        a * m + b, j * g.rows).astype(x_refs[0].dtype)


def _streamed_forward_kernel(*refs, g, inputs, ops, staged, k, m, parts, transposed):
    """The forward sweep of systems too long for VMEM: y (z) written to float32 work blocks.
    Refs: the forward pass's inputs' blocks, y's work blocks, the carry, the stages of staged
    inputs (each part)."""
    refs = list(refs)
    n_in = sum(x.parts for x in inputs)
    in_refs = refs[:n_in]
    y_refs = refs[n_in:n_in + parts]
    carry_ref, *stages = refs[n_in + parts:]
    forward_inputs = _entries(g, inputs, ops, staged, in_refs, stages)
    ys = _kernels._WorkBlocks(g, y_refs, k, m)
    row = _forward_row(forward_inputs, ys, k=k, m=m, transposed=transposed)
    _sweep(g, _kernels._Carry(carry_ref, parts), forward_inputs, pl.program_id(2), row,
           carried=_carried(k, m, transposed), offset=0, reverse=False)


def _streamed_backward_kernel(*refs, g, inputs, ops, staged, out_how, k, m, parts,
                              transposed):
    """The backward sweep of systems too long for VMEM, last chunk first, from y's (z's) work
    blocks. Refs: those blocks, the backward pass's inputs' blocks, x's blocks, the carry, the
    stages of staged inputs (each part)."""
    refs = list(refs)
    y_refs = refs[:parts]
    n_in = sum(x.parts for x in inputs)
    in_refs = refs[parts:parts + n_in]
    x_refs = refs[parts + n_in:2 * parts + n_in]
    carry_ref, *stages = refs[2 * parts + n_in:]
    backward_inputs = _entries(g, inputs, ops, staged, in_refs, stages)
    ys = _kernels._WorkBlocks(g, y_refs, k, m)
    write_x = _kernels._entry_writer(x_refs, out_how, parts)
    row = _backward_row(g, backward_inputs, ys, lambda offset, i, x: write_x(i, x), k=k, m=m,
                        transposed=transposed)
    _sweep(g, _kernels._Carry(carry_ref, parts), backward_inputs,
           g.chunks - 1 - pl.program_id(2), row, carried=_carried(k, m, transposed), offset=0,
           reverse=True)


def factored_solve_pnq(lu, pivots, e, lower, b, *, transposed: bool, out_dtype,
                       interpret=None):
    """`_xla_block.factored_solve_pnq` as a Pallas TPU kernel: x with A x = b (A^T x = b when
    `transposed`) from `factor_pnq`'s factors and the operator's `lower` blocks, (P|1, N|1,
    Q|1, ...) broadcasting against b (P, N, Q, k, m). Returns x (P, N, Q, k, m) of
    `out_dtype`. `interpret`: as `factor_pnq`'s."""
    out_dtype = jnp.dtype(out_dtype)
    _tpu.check_dtype(out_dtype)
    P, N, Q, k, m = b.shape
    if b.size == 0:
        return jnp.zeros(b.shape, out_dtype)
    parts, part_dtype = _tpu.split_dtype(out_dtype)
    cdt = jnp.complex64 if parts == 2 else None
    if cdt is not None:  # real factors against a complex b: as complex parts
        lu, e, lower, b = (x.astype(cdt) for x in (lu, e, lower, b))
    swapped = Q == 1 and P > 1
    if transposed:
        order = [(e, k, k), (b, k, m), (lu, k, k), (pivots, k, 1), (lower, k, k)]
        forward_count = 2
    else:
        order = [(lu, k, k), (pivots, k, 1), (lower, k, k), (b, k, m), (e, k, k)]
        forward_count = 4
    inputs = _inputs(order, swapped, parts == 2)
    out_how = _kernels.arrangement(b.shape, out_dtype, k, m, swapped=swapped)
    carried = _carried(k, m, transposed)

    def need(g):
        return (_input_bytes(g, inputs) + _outputs_bytes(g, [(out_how, part_dtype, parts)])
                + parts * k * m * g.total_rows * g.row_tile_bytes()
                + _tpu.carry_bytes(g, carried * parts) + _tpu.MOSAIC_SCRATCH)

    work_how = _kernels.work_arrangement(k, m)

    def streamed_need(g):  # both kernels' buffers, y's (z's) work blocks in place of its scratch
        work = _kernels._block_bytes(g, work_how, jnp.float32)
        return (_input_bytes(g, inputs) + _outputs_bytes(g, [(out_how, part_dtype, parts)])
                + 4 * parts * work + 2 * _tpu.carry_bytes(g, carried * parts)
                + _tpu.MOSAIC_SCRATCH)

    Pv, Qv = (Q, P) if swapped else (P, Q)
    plan = functools.partial(_tpu.geometry, Pv, N, Qv, budget=_tpu.vmem().budget, layout="lanes",
                             chunk_sizes=_tpu.chunks_down_to(32))
    g, streamed = plan(vmem_bytes=need), False
    # Too long for VMEM: two kernels, y (z) through HBM; not for a 16-bit x with rows minor,
    # which the backward kernel would have to stage (a packed row cannot be stored at a
    # dynamic index): no public call asks for one (the factors are float32).
    if g is None and not (out_how.rows_minor and jnp.dtype(part_dtype).itemsize < 4):
        g, streamed = plan(vmem_bytes=streamed_need), True
    if g is None:
        return _xla.factored_solve_pnq(lu, pivots, e, lower, b, transposed=transposed,
                                       out_dtype=out_dtype)
    arrays, ops, staged = _passed(g, inputs)
    C = g.chunks
    name = "transposed_" if transposed else ""
    out_shape = jax.ShapeDtypeStruct((Pv, *out_how.sizes(N), Qv), part_dtype)
    call = functools.partial(_tpu.call, vmem_limit=_tpu.vmem().limit, interpret=interpret)
    carry = _tpu.pltpu.VMEM((carried * parts, *g.tile), jnp.float32)
    if streamed:
        n_forward = sum(x.parts for x in inputs[:forward_count])
        work_shape = jax.ShapeDtypeStruct((Pv, *work_how.sizes(N), Qv), jnp.float32)
        common = dict(g=g, k=k, m=m, parts=parts, transposed=transposed)

        def forward(s):
            return s

        def backward(s):
            return C - 1 - s

        f_in, f_ops, f_staged = inputs[:forward_count], ops[:forward_count], staged[:forward_count]
        b_in, b_ops, b_staged = inputs[forward_count:], ops[forward_count:], staged[forward_count:]
        y = call(functools.partial(_streamed_forward_kernel, inputs=f_in, ops=f_ops,
                                   staged=f_staged, **common),
                 g, arrays[:n_forward], _specs(g, f_in, f_ops, forward), [work_shape] * parts,
                 [work_how.spec(g, True, forward)] * parts,
                 [carry, *_stage_shapes(g, f_in, f_staged)], steps=C,
                 name=f"tridiax_block_factored_{name}forward_tpu")
        x = call(functools.partial(_streamed_backward_kernel, inputs=b_in, ops=b_ops,
                                   staged=b_staged, out_how=out_how, **common),
                 g, [*y, *arrays[n_forward:]],
                 [work_how.spec(g, True, backward)] * parts + _specs(g, b_in, b_ops, backward),
                 [out_shape] * parts,
                 [_kernels._spec(g, _tpu.Operand("rows"), backward, out_how, k * m)] * parts,
                 [carry, *_stage_shapes(g, b_in, b_staged)], steps=C,
                 name=f"tridiax_block_factored_{name}backward_tpu")
        return _kernels.joined(x, out_how, N, swapped)

    def chunk_forward(s):
        return jnp.minimum(s, C - 1)

    def chunk_backward(s):
        return jnp.clip(2 * C - 1 - s, 0, C - 1)

    in_specs = (_specs(g, inputs[:forward_count], ops[:forward_count], chunk_forward)
                + _specs(g, inputs[forward_count:], ops[forward_count:], chunk_backward))
    lanes = g.s * _tpu.LANES
    scratch = [_tpu.pltpu.VMEM((k * m * g.total_rows, lanes), jnp.float32)] * parts
    scratch += [carry, *_stage_shapes(g, inputs, staged)]
    kernel = functools.partial(_solve_kernel, g=g, inputs=inputs, ops=ops, staged=staged,
                               forward_count=forward_count, out_how=out_how, k=k, m=m,
                               parts=parts, transposed=transposed)
    x = call(kernel, g, arrays, in_specs, [out_shape] * parts,
             [_kernels._spec(g, _tpu.Operand("rows"), chunk_backward, out_how, k * m)] * parts,
             scratch, steps=2 * C, name=f"tridiax_block_factored_{name}solve_tpu")
    return _kernels.joined(x, out_how, N, swapped)
