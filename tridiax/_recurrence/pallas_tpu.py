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

A gate (`gate`: the states of a relu or tanh recurrence and its activation) runs the linear
recurrence h[t] = slope[t] * (a[t]*h[t-1] + x[t]) that such a recurrence's derivatives run,
with the slope (the activation's derivative, a function of its output) computed from the
states' rows in the sweep: neither the slope nor its products with a and x reach HBM.

`sums` (states, in real dtypes, without an activation) also returns the sum over the steps of
the state entering each step times that step's row of the states: the cotangent of a
coefficient constant in time, which the reversed recurrence of a transpose forms in the same
sweep (with a gate, from the rows it reads for the slope), where XLA would read the result and
the states again.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .._core.layout import broadcast_shape
from .._core.split_complex import SplitComplex, as_split, select
from .._pallas import tpu as _tpu

pltpu = _tpu.pltpu


# Runs of steps a chunk of a linear recurrence is cut into where its row tiles hold one sublane
# (`_segments`): one per sublane of a vector register.
SEGMENTS = _tpu.SUBLANES


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


def _map(f, v):
    """f of a real value, or of each part of a `SplitComplex` one."""
    return v.map(f) if isinstance(v, SplitComplex) else f(v)


def _segments(a, x, sink, h_start, a_start, *, count: int, reverse: bool, shifted: bool, tile, parts,
              gate=None, sums=None):
    """A linear recurrence over a chunk's `count` steps whose row tiles (`tile`: (1, w)) hold
    one sublane, as SEGMENTS runs of R = ceil(count / SEGMENTS) steps side by side, one per
    sublane, read by strided loads: first each run from a zero state (its end state and the
    product of the coefficients it applied), then the state entering each run from those, in
    scan order from `h_start`, then every run again from its entering state, writing each
    step's state to `sink` (None: final state only). The dependent steps are 2R + SEGMENTS
    instead of `count`; every state is the sequential recurrence's from the state entering its
    run. Steps past `count` (the last run's) leave the state as it is. `a_start`: the
    coefficient of the step before the chunk (`shifted`). `gate`: (the states' rows, the slope
    function), whose slope multiplies each step's coefficient and input. `sums`: rows whose
    products with the state entering each step are summed (in the last pass, over the runs).
    Returns the state after the last step in scan order, that step's a, and the (1, w) sum
    (None without `sums`)."""
    S = SEGMENTS
    R = -(-count // S)
    width = tile[-1]
    pa, px = parts
    ph = max(parts)
    sub = lax.broadcasted_iota(jnp.int32, (S, 1), 0)

    def wide(v):  # a row tile, the same in every run
        return _map(lambda p: jnp.broadcast_to(p, (S, width)), v)

    def run_of(v, s: int):
        return _map(lambda p: p[s:s + 1], v)

    # the coefficient of each run's first step when shifted: the step before it in scan order,
    # the last of the run before it (or the chunk's neighbour: `a_start`)
    if reverse:
        ahead = _map(lambda p: pltpu.roll(p, S - 1, 0), a.load_rows(0, S, R))
        a_first = select((sub + 1) * R >= count, wide(a_start), ahead)
    else:
        behind = _map(lambda p: pltpu.roll(p, 1, 0), a.load_rows(R - 1, S, R))
        a_first = select(sub == 0, wide(a_start), behind)

    def step(i, h, a_before):
        a_now, x_now = a.load_rows(i, S, R), x.load_rows(i, S, R)
        c = a_before if shifted else a_now
        if gate is not None:
            states, slope = gate
            gated = slope(states.load_rows(i, S, R))
            c, x_now = gated * c, gated * x_now
        if S * R != count:
            valid = sub * R + i < count
            c, x_now, a_now = select(valid, c, 1.0), select(valid, x_now, 0.0), select(valid, a_now, a_before)
        return c * h + x_now, a_now, c

    def split(values, *counts):
        return tuple(as_split(v) if n == 2 else v for v, n in zip(values, counts, strict=True))

    def alone(i, carry):
        h, a_before, product = carry
        h, a_now, c = step(i, h, a_before)
        return split((h, a_now, c * product), ph, pa, pa)

    zero = jnp.zeros((S, width), jnp.float32)
    ends, _, products = _tpu.loop(R, alone, split((zero, a_first, zero + 1), ph, pa, pa), reverse=reverse)
    entering, h = wide(h_start), run_of(wide(h_start), 0)
    for s in (range(S - 2, -1, -1) if reverse else range(1, S)):
        before = s + 1 if reverse else s - 1
        h = run_of(products, before) * h + run_of(ends, before)
        entering = select(sub == s, wide(h), entering)

    def again(i, carry):
        h, a_before, *total = carry
        if sums is not None:
            product = h * sums.load_rows(i, S, R)
            total = [total[0] + (select(sub * R + i < count, product, 0.0) if S * R != count
                                 else product)]
        h, a_now, _ = step(i, h, a_before)
        if sink is not None:
            sink.store_rows(i, h, R)
        return (*split((h, a_now), ph, pa), *total)

    total = [] if sums is None else [zero]
    h, _, *total = _tpu.loop(R, again, (*split((entering, a_first), ph, pa), *total),
                             reverse=reverse)
    total = jnp.sum(total[0], axis=0, keepdims=True) if total else None
    return run_of(h, 0 if reverse else S - 1), a.load(0 if reverse else count - 1), total


def _kernel(*refs, g, ops, parts, reverse, shifted, act, slope, sums, final_only, staged_out,
            segmented):
    """Refs: a's and x's blocks, the states' block (a gate's, with a `slope`, or the `sums`'
    rows), h0's tile, h's block (the parts of each: `parts` of a and x, h0 and h complex where
    either is), the sums' tile (with `sums`), then the state and the previous step's a (their
    parts), the stages of staged operands and of h."""
    pa, px = parts
    ph = max(parts)
    counts = (pa, px, int(slope is not None or sums), ph, ph, int(sums), ph, pa)
    groups, start = [], 0
    for count in counts:
        groups.append(refs[start:start + count])
        start += count
    a_refs, x_refs, states_refs, h0_refs, h_refs, sums_refs, state, previous = groups
    stages = list(refs[start:])
    out_stages = [stages.pop() for _ in range(ph)][::-1] if staged_out else None
    k = pl.program_id(2)
    j = g.chunks - 1 - k if reverse else k

    def get(refs_):
        """The value of whole-tile refs (one per part)."""
        values = [ref[...] for ref in refs_]
        return values[0] if len(values) == 1 else SplitComplex(*values)

    def put(refs_, value):
        if len(refs_) == 1:
            refs_[0][...] = value
        else:
            value = as_split(value)
            refs_[0][...], refs_[1][...] = value.re, value.im

    @pl.when(k == 0)
    def _():
        put(state, get(h0_refs))
        put(previous, jnp.zeros(g.tile, jnp.float32))
        if sums:  # its block stays in VMEM across the chunks, written back after the last
            put(sums_refs, jnp.zeros(g.tile, jnp.float32))

    a, x, *states = _tpu.part_readers(g, ops, (a_refs, x_refs, states_refs)[:len(ops)], stages)
    gate = (states[0], slope) if slope is not None else None
    if final_only:
        sink = None
    elif staged_out:
        sink = _tpu.scratch_rows(g, out_stages)
    else:
        sink = _tpu.block_rows(g, h_refs)

    def run(count):
        def step(i, carry):
            h, a_before, *total = carry
            a_now = a.load(i)
            row = states[0].load(i) if states else None
            if sums:
                total = [total[0] + h * row]
            h = act((a_before if shifted else a_now) * h + x.load(i))
            if gate is not None:
                h = slope(row) * h
            if sink is not None:
                sink.store(i, h)
            return (h, a_now, *total)

        carry = (get(state), get(previous)) + ((jnp.zeros(g.tile, jnp.float32),) if sums else ())
        h, a_last, *total = _tpu.loop(count, step, carry, reverse=reverse)
        put(state, h)
        put(previous, a_last)
        if sums:
            put(sums_refs, get(sums_refs) + total[0])

    def run_segments(count):
        h, a_last, total = _segments(a, x, sink, get(state), get(previous), count=count,
                                     reverse=reverse, shifted=shifted, tile=g.tile, parts=parts,
                                     gate=gate, sums=states[0] if sums else None)
        put(state, h)
        put(previous, a_last)
        if sums:
            put(sums_refs, get(sums_refs) + total)

    _tpu.over_rows(g, j, run_segments if segmented else run)
    if staged_out:
        _tpu.stage_out_parts(g, sink, h_refs)
    if final_only:
        @pl.when(k == g.chunks - 1)
        def _():
            put(h_refs, get(state))


def _plan(P, T, Q, operands, out_dtype, final_only, budget=None, *, linear=False, sums=False):
    """The geometry of a recurrence (its VMEM need: no scratch but the state, so the widest
    row tile always fits). `operands`: the real arrays passed for a and x (their parts), and
    the states (a gate's, or those of `sums`: one tile more, the sum's).
    `linear`: a row tile that would not fill a vector register (fewer than 1024 sequences in
    the "lanes" and "transposed" layouts) holds one sublane instead, its chunks run as eight
    runs side by side (`segmented`; Mosaic loads rows strided from a base of 128 lanes only)."""
    ph, out_part = _tpu.split_dtype(out_dtype)

    def need(g):
        ops = [_tpu.operand(g, v.shape, v.dtype) for v in operands]
        staged = sum(op.kind == "rows" and op.staged for op in ops)
        staged += ph * (not final_only and _tpu.staged(g, out_part))
        tiles = [(_tpu.Operand("tile"), 4)] * (ph + sums)  # h0, the sum
        return _tpu.vmem_need(g, [(op, v.dtype.itemsize) for op, v in zip(ops, operands)] + tiles,
                              stages=staged, scratch_rows=0, carry_tiles=2 * ph + sums,
                              outputs=[] if final_only else [out_part.itemsize] * ph)

    g = _tpu.geometry(P, T, Q, vmem_bytes=need, budget=budget)
    if linear and g is not None and 1 < g.s < _tpu.SUBLANES and g.layout != "sublanes":
        return _tpu.geometry(P, T, Q, vmem_bytes=need, budget=budget, sublanes=1)
    return g


def segmented(g, activation) -> bool:
    """Whether the kernel runs each chunk as SEGMENTS runs side by side (`_segments`): linear
    recurrences whose row tiles hold one sublane (`_plan`: fewer than 1024 sequences, 128 a
    group; or one system's row of Q < 128 in the "sublanes" layout), which would leave seven
    of a vector register's eight sublanes idle."""
    return activation is None and g.s == 1


def recurrence_pnq(a, x, h0, *, reverse: bool, shifted: bool, activation, final_only: bool,
                   out_dtype, interpret=None, gate=None, sums=None):
    """Run along axis 1 of (P|1, T|1, Q|1) operands (`h0`: (P|1, 1, Q|1)); see
    `_xla_recurrence.recurrence_pnq`. Returns (P, T, Q), or (P, 1, Q) when `final_only`.
    Complex64 runs as float32 parts (of a and x where each is complex; no activation).
    `gate`: (states, activation), (P|1, T|1, Q|1) states of a relu or tanh recurrence, for
    the linear recurrence h = slope(states) * (a h + x) (module docstring; real dtypes only).
    `sums`: (P|1, T|1, Q|1) states (a gate's own, where it has one): then returns (h, total)
    with total (P, 1, Q) float32, the sum over the steps of the state entering each step times
    that step's states (real linear recurrences only).
    `interpret`: Pallas's interpret mode (`pltpu.InterpretParams`, or True) to run on CPU."""
    from .primitive import _output_slope  # the slope from the activation's output

    if sums is not None and gate is not None and sums is not gate[0]:
        raise ValueError("the Pallas TPU recurrence sums its products with the gate's states only")
    states = () if gate is None else (gate[0],)
    states = (sums,) if sums is not None and not states else states
    P, T, Q = broadcast_shape(a, x, h0, *states)
    out_dtype = jnp.dtype(out_dtype)
    _tpu.check_dtype(out_dtype)
    ph, part_dtype = _tpu.split_dtype(out_dtype)
    complex_ = ph == 2
    if complex_ and activation is not None:
        raise ValueError("the Pallas TPU recurrence runs complex recurrences without an activation")
    slope = None
    if gate is not None:
        slope = _output_slope(gate[1])
        if slope is None or activation is not None or complex_ or any(map(jnp.iscomplexobj, states)):
            raise ValueError("the Pallas TPU recurrence gates real linear recurrences by the slope of "
                             f"relu or tanh, not {gate[1]!r} (activation {activation!r}, {out_dtype})")
    if sums is not None and (activation is not None or complex_ or jnp.iscomplexobj(sums)):
        raise ValueError("the Pallas TPU recurrence sums products with the states of real linear "
                         f"recurrences only (activation {activation!r}, {out_dtype})")
    a_parts, x_parts = (_tpu.parts_of(v, complex_ and jnp.iscomplexobj(v)) for v in (a, x))
    h0_parts = _tpu.parts_of(h0, complex_)
    budget = _tpu.vmem()
    g = _plan(P, T, Q, [*a_parts, *x_parts, *states], out_dtype, final_only, budget.budget,
              linear=activation is None, sums=sums is not None)
    prepared = [[_tpu.prepare(g, v) for v in parts] for parts in (a_parts, x_parts, states) if parts]
    ops = [pieces[0][1] for pieces in prepared]
    staged_out = not final_only and _tpu.staged(g, part_dtype)

    def chunk_of(k):
        return g.chunks - 1 - k if reverse else k

    tile = _tpu.Operand("tile")
    inputs = [v for pieces in prepared for v, _ in pieces] + [_tpu.tiles_of(g, v) for v in h0_parts]
    in_specs = [_tpu.block_spec(g, op, chunk_of) for op, pieces in zip(ops, prepared, strict=True)
                for _ in pieces] + [_tpu.block_spec(g, tile, chunk_of)] * ph
    tile_shape = jax.ShapeDtypeStruct((*g.groups, *g.tile), jnp.float32)
    if final_only:
        out_shape, out_spec = tile_shape, _tpu.block_spec(g, tile, chunk_of)
    else:
        shape = (P, T) if g.layout == "transposed" else (P, T, Q)
        out_shape = jax.ShapeDtypeStruct(shape, part_dtype)
        out_spec = _tpu.block_spec(g, _tpu.Operand("rows"), chunk_of)
    vmem = _tpu.pltpu.VMEM
    stage = vmem(_tpu.stage_shape(g), jnp.float32)
    # the state, and the previous step's a (each in its parts)
    scratch = [vmem(g.tile, jnp.float32)] * (ph + len(a_parts))
    scratch += [stage for op, pieces in zip(ops, prepared, strict=True) for _ in pieces
                if op.kind == "rows" and op.staged]
    scratch += [stage] * (ph * staged_out)
    kernel = functools.partial(_kernel, g=g, ops=ops, parts=(len(a_parts), len(x_parts)),
                               reverse=reverse, shifted=shifted,
                               act=ACTIVATIONS[activation] or (lambda v: v), slope=slope,
                               sums=sums is not None, final_only=final_only,
                               staged_out=staged_out, segmented=segmented(g, activation))
    totals = sums is not None
    h = _tpu.call(kernel, g, inputs, in_specs, [out_shape] * ph + [tile_shape] * totals,
                  [out_spec] * ph + [_tpu.block_spec(g, tile, chunk_of)] * totals, scratch,
                  steps=g.chunks, name="tridiax_recurrence_tpu", vmem_limit=budget.limit,
                  interpret=interpret)
    if totals:
        *h, total = h
        return _plain_result(g, h, P, T, Q, final_only, complex_, out_dtype), _tpu.from_tiles(g, total)
    return _plain_result(g, h, P, T, Q, final_only, complex_, out_dtype)


def _plain_result(g, h, P, T, Q, final_only, complex_, out_dtype):
    """The kernel's h parts as the (P, T, Q) result (or (P, 1, Q) final states)."""
    if final_only:
        h = [_tpu.from_tiles(g, part) for part in h]
        return jax.lax.complex(*h) if complex_ else h[0].astype(out_dtype)
    h = jax.lax.complex(*h) if complex_ else h[0]
    return h.reshape(P, T, Q)
