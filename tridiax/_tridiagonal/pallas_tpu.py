"""The tridiagonal (Thomas) solve as a Pallas Mosaic TPU kernel over the (P, N, Q) view.

Row i reads sub[i]*x[i-1] + d[i]*x[i] + sup[i]*x[i+1] = b[i], with sub = l, sup = u, or, when
`transposed` (the solve that gradients run), sub[i] = u[i-1], sup[i] = l[i+1]: the same
conventions and the same divisions as `verify.sequential_solve` and the other backends
(p[i] = d[i] - sub[i]*c'[i-1], c'[i] = sup[i] / p[i], y'[i] = (b[i] - sub[i]*y'[i-1]) / p[i],
x[i] = y'[i] - c'[i]*x[i+1]), computed in float32.

Systems are grouped into row tiles and rows into chunks as `_pallas/tpu.py` describes. The grid
walks each group's chunks twice, in one pallas_call: steps 0..C-1 eliminate chunk k forward,
keeping c' and y' of every row in VMEM scratch (the whole system: c' and y' are what the
backward sweep reads); steps C..2C-1 substitute back from the last chunk to the first and
write x. The inputs' blocks stay on their last chunk during the backward steps and the output's
on its last chunk during the forward ones, so Pallas reads every input once and writes x once.

The forward sweep forms c'[i-1] at row i (from u[i-1], or l[i] when transposed), so that no
row reads ahead into the next chunk: c'[i-1] = sup[i-1] / p[i-1] is the quotient of the same
two values, rounded the same way. Row 0 ignores l[0] (u[N-1] is never read): they may hold
anything, inf and NaN too.

The scratch holds 2 * N row tiles, so the row tile narrows (fewer sublanes) as N grows
(`_tpu.geometry`; float32 in v5e's and v6e's 48 MiB budget: 8 sublanes up to about 5400 rows,
then 4, 2 and 1, up to about 48000 rows; in the 12 MiB a chip not known gets, 8 sublanes up
to about 760 rows, 1 up to 11500); longer systems run XLA's loop.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .._core.layout import broadcast_shape
from .._pallas import tpu as _tpu


def _kernel(l_ref, d_ref, u_ref, b_ref, x_ref, cs_ref, ys_ref, carry_ref, *stages, g, ops,
            transposed, direct_out):
    """cs_ref[n] holds c'[n-1] (zero at row 0), ys_ref[n] y'[n], then x[n]; carry_ref the
    forward sweep's (p, y', u) of the previous row, then the backward sweep's (x, c') of the
    next one."""
    C = g.chunks
    k = pl.program_id(2)
    stages = list(stages)

    @pl.when(k < C)
    def _():
        j = k
        readers = []
        for op, ref in zip(ops, (l_ref, d_ref, u_ref, b_ref), strict=True):
            stage = stages.pop(0) if op.kind == "rows" and op.staged else None
            if stage is not None:
                _tpu.stage_in(g, ref, stage)
            readers.append(_tpu.reader(g, op, ref, stage))
        lo, di, up, rhs = readers
        offset = _tpu.aligned(j * g.rows)
        cs = _tpu.RowRef(g, cs_ref, g.total_rows, offset)
        ys = _tpu.RowRef(g, ys_ref, g.total_rows, offset)

        @pl.when(k == 0)
        def _():
            carry_ref[0] = jnp.ones(g.tile, jnp.float32)
            carry_ref[1] = jnp.zeros(g.tile, jnp.float32)
            carry_ref[2] = jnp.zeros(g.tile, jnp.float32)

        def run(count):
            def row(i, carry):
                p_prev, y_prev, u_prev = carry
                first = j * g.chunk + i == 0
                l_i = lo.load(i)
                numerator, a = (l_i, u_prev) if transposed else (u_prev, l_i)
                c_prev = jnp.where(first, 0.0, numerator / p_prev)  # c'[i-1]
                a = jnp.where(first, 0.0, a)
                p = di.load(i) - a * c_prev
                y = (rhs.load(i) - a * y_prev) / p
                cs.store(i, c_prev)
                ys.store(i, y)
                return p, y, up.load(i)

            carry = _tpu.loop(count, row, (carry_ref[0], carry_ref[1], carry_ref[2]))
            for n, value in enumerate(carry):
                carry_ref[n] = value

        _tpu.over_rows(g, j, run)

    @pl.when(k >= C)
    def _():
        j = 2 * C - 1 - k
        offset = _tpu.aligned(j * g.rows)
        cs = _tpu.RowRef(g, cs_ref, g.total_rows, offset)
        ys = _tpu.RowRef(g, ys_ref, g.total_rows, offset)
        out = _tpu.RowRef(g, x_ref.at[0], g.rows) if direct_out else ys

        @pl.when(k == C)
        def _():
            carry_ref[0] = jnp.zeros(g.tile, jnp.float32)
            carry_ref[1] = jnp.zeros(g.tile, jnp.float32)

        def run(count):
            def row(i, carry):
                x_next, c_next = carry
                x = ys.load(i) - c_next * x_next
                out.store(i, x)
                return x, cs.load(i)

            carry = _tpu.loop(count, row, (carry_ref[0], carry_ref[1]), reverse=True)
            carry_ref[0], carry_ref[1] = carry

        _tpu.over_rows(g, j, run)
        if not direct_out:
            _tpu.stage_out(g, ys, x_ref)


def _plan(P, N, Q, operands, out_dtype, budget=None):
    """The geometry of a solve in `budget` bytes of VMEM (None: `_tpu.VMEM_BUDGET`)."""

    def need(g):
        ops = [_tpu.operand(g, v.shape, v.dtype) for v in operands]
        staged = sum(op.kind == "rows" and op.staged for op in ops)
        return _tpu.vmem_need(g, [(op, v.dtype.itemsize) for op, v in zip(ops, operands)],
                              stages=staged, scratch_rows=2 * g.total_rows + 3,
                              outputs=[jnp.dtype(out_dtype).itemsize])

    return _tpu.geometry(P, N, Q, vmem_bytes=need, budget=budget)


def fits(P: int, N: int, Q: int, dtype, budget=None) -> bool:
    """Whether a solve of (P, N, Q) systems fits `budget` bytes of VMEM (all its operands
    full; None: `_tpu.VMEM_BUDGET`)."""
    operands = [jax.ShapeDtypeStruct((P, N, Q), dtype)] * 4
    return _plan(P, N, Q, operands, dtype, budget) is not None


def solve_pnq(l, d, u, b, *, transposed: bool, out_dtype, interpret=None):
    """Solve along axis 1 of (P|1, N|1, Q|1) operands; returns (P, N, Q) of `out_dtype`.
    `interpret`: Pallas's interpret mode (`pltpu.InterpretParams`, or True) to run on CPU.
    Systems too long for VMEM
    (`fits`) are solved by XLA's loop."""
    P, N, Q = broadcast_shape(l, d, u, b)
    out_dtype = jnp.dtype(out_dtype)
    budget = _tpu.vmem()
    g = _plan(P, N, Q, (l, d, u, b), out_dtype, budget.budget)
    if g is None:
        from . import xla as _xla

        return _xla.solve_pnq(l, d, u, b, transposed=transposed, out_dtype=out_dtype)
    prepared = [_tpu.prepare(g, v) for v in (l, d, u, b)]
    ops = [op for _, op in prepared]
    direct_out = not _tpu.staged(g, out_dtype)

    def chunk_in(k):
        return jnp.minimum(k, g.chunks - 1)

    def chunk_out(k):
        return jnp.clip(2 * g.chunks - 1 - k, 0, g.chunks - 1)

    inputs = [v for v, _ in prepared]
    in_specs = [_tpu.block_spec(g, op, chunk_in) for op in ops]
    shape = (P, N) if g.layout == "transposed" else (P, N, Q)
    out_spec = _tpu.block_spec(g, _tpu.Operand("rows"), chunk_out)
    vmem = _tpu.pltpu.VMEM
    scratch = [vmem(_tpu.rows_shape(g, g.total_rows), jnp.float32)] * 2
    scratch.append(vmem((3, *g.tile), jnp.float32))
    scratch += [vmem(_tpu.stage_shape(g), jnp.float32)
                for op in ops if op.kind == "rows" and op.staged]
    kernel = functools.partial(_kernel, g=g, ops=ops, transposed=transposed,
                               direct_out=direct_out)
    (x,) = _tpu.call(kernel, g, inputs, in_specs, [jax.ShapeDtypeStruct(shape, out_dtype)],
                     [out_spec], scratch, steps=2 * g.chunks, name="tridiax_thomas_tpu",
                     vmem_limit=budget.limit, interpret=interpret)
    return x.reshape(P, N, Q)
