"""Elementwise recurrences h[t] = act(a[t]*h[t-1] + x[t]) as a Pallas Mosaic TPU kernel.

Same conventions as `_recurrence/xla.py` (`reverse`, `shifted`, `final_only`). The (P, T, Q)
view is cut into groups of systems and chunks of steps as `_pallas/tpu.py` describes: a grid
step owns one chunk of one group, walks its steps in a fori_loop on row tiles of s x 128
float32 values (the state stays in registers), and writes each row of h into the output block
(or a float32 stage converted and written at the end of the chunk); the state crosses chunks
in a VMEM scratch, so every input is read once from HBM and h written once. `reverse` walks
the chunks from the last one and each chunk from its last step.

`shifted` multiplies the state by a at the previous step's index (zero at the first step):
the previous step's row of a rides along with the state, across chunks too.

Activations: None (the linear recurrence), `jax.nn.relu` and `jnp.tanh` (IndRNN), applied
in float32 in the kernel (`ACTIVATIONS`; others run XLA's loop).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .._core.layout import broadcast_shape
from .._pallas import tpu as _tpu


def _relu(v):
    return jnp.maximum(v, 0)


# The activations the kernel applies (by identity: a user's function is not traced into it).
ACTIVATIONS = {None: None, jax.nn.relu: _relu, jnp.tanh: jnp.tanh}


def supports(activation) -> bool:
    """Whether the TPU kernel runs this activation."""
    try:
        return activation in ACTIVATIONS
    except TypeError:  # unhashable
        return False


def _kernel(a_ref, x_ref, h0_ref, h_ref, *scratch, g, ops, reverse, shifted, act, final_only,
            staged_out):
    state, previous, *stages = scratch
    out_stage = stages.pop() if staged_out else None
    k = pl.program_id(2)
    j = g.chunks - 1 - k if reverse else k

    @pl.when(k == 0)
    def _():
        state[...] = h0_ref[...]
        previous[...] = jnp.zeros(g.tile, jnp.float32)

    readers = []
    for op, ref in zip(ops, (a_ref, x_ref), strict=True):
        stage = stages.pop(0) if op.kind == "rows" and op.staged else None
        if stage is not None:
            _tpu.stage_in(g, ref, stage)
        readers.append(_tpu.reader(g, op, ref, stage))
    a, x = readers
    if final_only:
        sink = None
    elif staged_out:
        sink = _tpu.RowRef(g, out_stage, g.rows)
    else:
        sink = _tpu.RowRef(g, h_ref.at[0], g.rows)

    def run(count):
        def step(i, carry):
            h, a_before = carry
            a_now = a.load(i)
            h = act((a_before if shifted else a_now) * h + x.load(i))
            if sink is not None:
                sink.store(i, h)
            return h, a_now

        h, a_last = _tpu.loop(count, step, (state[...], previous[...]), reverse=reverse)
        state[...] = h
        previous[...] = a_last

    _tpu.over_rows(g, j, run)
    if staged_out:
        _tpu.stage_out(g, sink, h_ref)
    if final_only:
        @pl.when(k == g.chunks - 1)
        def _():
            h_ref[...] = state[...]


def _plan(P, T, Q, operands, out_dtype, final_only, budget=None):
    """The geometry of a recurrence (its VMEM need: no scratch but the state, so the widest
    row tile always fits)."""

    def need(g):
        ops = [_tpu.operand(g, v.shape, v.dtype) for v in operands]
        staged = sum(op.kind == "rows" and op.staged for op in ops)
        staged += not final_only and _tpu.staged(g, out_dtype)
        tiles = [(_tpu.Operand("tile"), 4)]  # h0
        return _tpu.vmem_need(g, [(op, v.dtype.itemsize) for op, v in zip(ops, operands)] + tiles,
                              stages=staged, scratch_rows=2,
                              outputs=[] if final_only else [out_dtype.itemsize])

    return _tpu.geometry(P, T, Q, vmem_bytes=need, budget=budget)


def recurrence_pnq(a, x, h0, *, reverse: bool, shifted: bool, activation, final_only: bool,
                   out_dtype, interpret=None):
    """Run along axis 1 of (P|1, T|1, Q|1) operands (`h0`: (P|1, 1, Q|1)); see
    `_xla_recurrence.recurrence_pnq`. Returns (P, T, Q), or (P, 1, Q) when `final_only`.
    `interpret`: Pallas's interpret mode (`pltpu.InterpretParams`, or True) to run on CPU."""
    P, T, Q = broadcast_shape(a, x, h0)
    out_dtype = jnp.dtype(out_dtype)
    budget = _tpu.vmem()
    g = _plan(P, T, Q, (a, x), out_dtype, final_only, budget.budget)
    prepared = [_tpu.prepare(g, v) for v in (a, x)]
    ops = [op for _, op in prepared]
    staged_out = not final_only and _tpu.staged(g, out_dtype)

    def chunk_of(k):
        return g.chunks - 1 - k if reverse else k

    tile = _tpu.Operand("tile")
    inputs = [v for v, _ in prepared] + [_tpu.tiles_of(g, h0)]
    in_specs = [_tpu.block_spec(g, op, chunk_of) for op in ops] + [
        _tpu.block_spec(g, tile, chunk_of)]
    if final_only:
        out_shape = jax.ShapeDtypeStruct((*g.groups, *g.tile), jnp.float32)
        out_spec = _tpu.block_spec(g, tile, chunk_of)
    else:
        shape = (P, T) if g.layout == "transposed" else (P, T, Q)
        out_shape = jax.ShapeDtypeStruct(shape, out_dtype)
        out_spec = _tpu.block_spec(g, _tpu.Operand("rows"), chunk_of)
    vmem = _tpu.pltpu.VMEM
    stage = vmem(_tpu.stage_shape(g), jnp.float32)
    scratch = [vmem(g.tile, jnp.float32)] * 2  # the state, and the previous step's a
    scratch += [stage for op in ops if op.kind == "rows" and op.staged]
    scratch += [stage] * staged_out
    kernel = functools.partial(_kernel, g=g, ops=ops, reverse=reverse, shifted=shifted,
                               act=ACTIVATIONS[activation] or (lambda v: v),
                               final_only=final_only, staged_out=staged_out)
    (h,) = _tpu.call(kernel, g, inputs, in_specs, [out_shape], [out_spec], scratch,
                     steps=g.chunks, name="tridiax_recurrence_tpu", vmem_limit=budget.limit,
                     interpret=interpret)
    if final_only:
        return _tpu.from_tiles(g, h).astype(out_dtype)
    return h.reshape(P, T, Q)
