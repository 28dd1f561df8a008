"""Tridiagonal solves and linear recurrences as Pallas Mosaic GPU kernels (Hopper, sm_90+).

The backend that outlives Pallas Triton (deprecated in jax 0.11). One CUDA block is one
warpgroup of 128 threads and owns 128 systems (or features); thread j sweeps system j. In the
(P, N, Q) view they are 128 columns of one p, moved in boxes of (rows x 128) values; for
batch-first data (Q = 1: each system's rows contiguous) they are 128 systems along P, moved
in boxes of (128 x rows) values, whose row r each thread reads as a column of the box
(`_Boxes`). Boxes move between global and shared memory by TMA copies, coalesced, through a
ring of `STAGES` shared-memory slots (each slot's loads signal one barrier; a slot is
refilled once the store of the step before has read it), so the copies of later row blocks
overlap the sweep of the current one. Results are written in place into the slot and stored
back by TMA: out-of-bounds rows and columns of a ragged last box read as zeros and are not
written, so N and Q may be anything.

- Thomas (no pivoting): the forward sweep stores c' = u / p (a work output) and
  y' = (b - a y'_prev) / p (into x), dividing by each pivot p = d - a c'_prev as
  `verify.sequential_solve` does; the backward sweep reads both back block by block from the
  last one. Rows 0 and N-1 are peeled (the first step of each sweep), so lower[0] and
  upper[N-1] are never read into the result and the zeros of a ragged box never reach it.
- Linear recurrence h[t] = a[t] h[t-1] + x[t] from h = 0: an initial state, a reversed or a
  shifted coefficient are folded in by `recurrence_pnq` around the kernel.

The other kinds (periodic, pivoted, pivoted periodic, factored), the factorization
(`factor_pnq`) and IndRNN's nonlinear recurrences run the Triton kernels' bodies
(`_tridiagonal/pallas_triton.py`, `_recurrence/pallas_triton.py`) through `WarpgroupRows`: each row a coalesced
512-byte load or store from global memory, no TMA pipeline, Q padded to whole 128-column
tiles.

Real float32/float16/bfloat16 only (computed in float32; Mosaic GPU has no float64 or
complex: `_backend.unavailable` refuses them). An activation that calls a custom_jvp (other
than jax.nn.relu, rewritten as a maximum) and the gated recurrences run the XLA loop. Layout:
the row kernels of the other kinds, and every kernel when 1 < Q < 128 with P > 1, move the
operands to (1, N, P*Q) by one XLA transpose each way; broadcast operands are materialised;
16-bit operands are converted to float32 by XLA before the kernel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from .._core.layout import broadcast_shape, to_columns
from .._recurrence import pallas_triton as _pallas_recurrence
from .._recurrence import xla as _xla_recurrence
from .._tridiagonal import pallas_triton as _pallas_thomas
from .._tridiagonal import xla as _xla_thomas

LANES = 128  # columns of one block: one warpgroup, a column per thread
STAGES = 3  # shared-memory slots of the TMA ring
SOLVE_ROWS = 16  # rows per box: 4 operands x 3 slots x 16 x 128 x 4 B = 96 KiB of shared memory
RECURRENCE_ROWS = 32
# TMA wants 16-byte strides between rows: Q a multiple of 4 float32 values (padded if not).
_ALIGN = 4
_KERNEL_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def runs(dtype, *, activation=None, gate=None) -> bool:
    """Whether the Mosaic GPU kernels run this call themselves (else the XLA loop does)."""
    return (jnp.dtype(dtype) in _KERNEL_DTYPES and gate is None
            and (activation is None or _kernel_activation(activation) is not None))


def _kernel_activation(activation):
    """`activation` as the kernel can apply it, or None: Mosaic GPU lowers no custom_jvp or
    custom_vjp call, so relu (a custom_jvp in jax.nn) becomes a maximum, and an activation
    that calls one elsewhere runs the XLA loop."""
    if activation is jax.nn.relu:
        return lambda v: jnp.maximum(v, 0.0)
    try:
        jaxpr = jax.make_jaxpr(activation)(jnp.zeros((LANES,), jnp.float32)).jaxpr
    except Exception:  # noqa: BLE001 - anything the kernel could not trace either
        return None
    custom = any(eqn.primitive.name.startswith(("custom_jvp", "custom_vjp")) for eqn in jaxpr.eqns)
    return None if custom else activation


def _modules():
    # Imported on use: a JAX without Mosaic GPU still imports tridiax.
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return pl, plgpu


def _kernel(plgpu, body, **kwargs):
    """plgpu.kernel with lane semantics (each value a per-thread fragment of a warpgroup's
    array), the default of jax 0.10; jax 0.11 turned warpgroup semantics on by default, whose
    layout inference refuses a column of a shared-memory box ("We cannot apply swizzle to
    non-contiguous refs") and a scalar broadcast in a select ("Implicit broadcast not
    implemented"), both of which these kernels use."""
    params = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane)
    return plgpu.kernel(body, compiler_params=params, **kwargs)


def _ring(pl, plgpu, steps, stages, load, sweep, *, reverse=False):
    """The body of step s of a sweep over `steps` row blocks (last first when `reverse`) through
    a ring of `stages` slots; it issues the loads of the first `stages` blocks when built.

    load(block, slot) starts the TMA copies of a block into a slot (arriving on its barrier);
    sweep(s, block, slot, carry) waits for them, sweeps the rows and starts the stores."""
    block = (lambda s: steps - 1 - s) if reverse else (lambda s: s)
    for s in range(min(stages, steps)):
        load(block(s), s)

    def step(s, carry):
        slot = lax.rem(s, stages)
        carry = sweep(s, block(s), slot, carry)
        refill = s + stages - 1  # into the slot of step s - 1, once its store has read it

        @pl.when(jnp.logical_and(s >= 1, refill < steps))
        def _():
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)
            load(block(refill), lax.rem(refill, stages))

        return carry

    return step


class _Boxes:
    """The TMA boxes of one block, in either layout of the operands:

    - columns (3-D (P, N, Q) arrays, grid ("p", "q")): a box is (rows x LANES) values, rows
      block `block` of this block's 128 columns of one p; row r of a slot is slot[r];
    - systems (2-D (P, N) arrays of batch-first data, rows contiguous, grid ("s",)): a box is
      (LANES x rows) values, 128 systems' rows; row r is the column slot[:, r].

    Box starts are traced, so the last box may run past N (TMA reads zeros there and writes
    only what lies inside)."""

    def __init__(self, pl, plgpu, rows, systems: bool):
        self.plgpu, self.rows, self.systems = plgpu, rows, systems
        if systems:
            self.lanes = pl.ds(lax.axis_index("s") * LANES, LANES)
        else:
            self.p = lax.axis_index("p")
            self.lanes = pl.ds(lax.axis_index("q") * LANES, LANES)
        self.ds = pl.ds

    def box(self, ref, block):
        rows = self.ds(jnp.int32(block) * self.rows, self.rows)
        return ref.at[self.lanes, rows] if self.systems else ref.at[self.p, rows, self.lanes]

    def loader(self, pairs, barrier):
        """load(block, slot): TMA copies of that box of each (global, shared) pair into the
        slot, arriving on its barrier."""

        def load(block, slot):
            for g, s in pairs:
                self.plgpu.copy_gmem_to_smem(self.box(g, block), s.at[slot], barrier.at[slot])

        return load

    def get(self, tile, r):
        return tile[:, r] if self.systems else tile[r]

    def put(self, tile, r, value):
        if self.systems:
            tile[:, r] = value
        else:
            tile[r] = value


def _launch(plgpu, body, operands, out, tiles, barriers, *, rows, interpret):
    """plgpu.kernel over the blocks of either layout (see _Boxes): 2-D operands are batch-first
    systems, 3-D ones columns; `tiles` shared-memory rings of (slots, box) and `barriers`
    (arrivals per slot) as scratch."""
    systems = operands[0].ndim == 2
    if systems:
        grid, names, box = (-(-operands[0].shape[0] // LANES),), ("s",), (LANES, rows)
    else:
        P, _, Q = operands[0].shape
        grid, names, box = (P, -(-Q // LANES)), ("p", "q"), (rows, LANES)
    slots = barriers[0][1]
    scratch = ([plgpu.SMEM((slots, *box), jnp.float32)] * tiles
               + [plgpu.Barrier(num_arrivals=k, num_barriers=n) for k, n in barriers])
    return _kernel(plgpu, functools.partial(body, systems=systems), out_type=out,
                   scratch_types=scratch, grid=grid, grid_names=names,
                   interpret=interpret)(*operands)


def _run(step, steps, carry):
    # Step 0 runs outside the loop: its block is a Python int (the peeled rows), and the loop
    # then starts from a carry in the layout of the rows read from shared memory.
    carry = step(0, carry)
    return lax.fori_loop(1, steps, step, carry)


def _thomas(a, b, c, d, *, interpret):
    """x with a[i] x[i-1] + b[i] x[i] + c[i] x[i+1] = d[i] along the rows (axis 1) of float32
    arrays, (P, N, Q) with Q a multiple of _ALIGN or batch-first (P, N) with N a multiple of
    _ALIGN (a[:, 0] and c[:, N-1] ignored)."""
    pl, plgpu = _modules()
    N = d.shape[1]
    R = min(SOLVE_ROWS, N)
    steps = -(-N // R)
    S = min(STAGES, steps)

    def body(a_g, b_g, c_g, d_g, x_g, cp_g, a_s, b_s, c_s, d_s, forward_bar, backward_bar, *,
             systems):
        t = _Boxes(pl, plgpu, R, systems)
        get, put = t.get, t.put
        load_bands = t.loader(((a_g, a_s), (b_g, b_s), (c_g, c_s), (d_g, d_s)), forward_bar)

        def eliminate(s, block, slot, carry):
            plgpu.barrier_wait(forward_bar.at[slot])
            lo, di, up, rhs = (ref.at[slot] for ref in (a_s, b_s, c_s, d_s))

            def row(r, carry):
                c_prev, y_prev = carry
                sub = get(lo, r)
                pivot = get(di, r) - sub * c_prev
                carry = (get(up, r) / pivot, (get(rhs, r) - sub * y_prev) / pivot)
                put(up, r, carry[0])
                put(rhs, r, carry[1])
                return carry

            first = 0
            if isinstance(block, int) and block == 0:  # row 0: lower[0] is not read
                pivot = get(di, 0)
                carry = (get(up, 0) / pivot, get(rhs, 0) / pivot)
                put(up, 0, carry[0])
                put(rhs, 0, carry[1])
                first = 1
            carry = lax.fori_loop(first, R, row, carry, unroll=True)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(up, t.box(cp_g, block), commit_group=False)
            plgpu.copy_smem_to_gmem(rhs, t.box(x_g, block))
            return carry

        zero = jnp.zeros((LANES,), jnp.float32)
        _run(_ring(pl, plgpu, steps, S, load_bands, eliminate), steps, (zero, zero))
        plgpu.wait_smem_to_gmem(0)  # c' and y' are in global memory before they are read back

        load_work = t.loader(((cp_g, c_s), (x_g, d_s)), backward_bar)

        def substitute(s, block, slot, x_next):
            plgpu.barrier_wait(backward_bar.at[slot])
            cp, y = c_s.at[slot], d_s.at[slot]
            rows = R
            if isinstance(block, int):  # the last block: x[N-1] = y'[N-1], upper[N-1] unread
                rows = N - block * R - 1
                x_next = get(y, rows)

            def row(k, x_next):
                r = rows - 1 - k
                x = get(y, r) - get(cp, r) * x_next
                put(y, r, x)
                return x

            x_next = lax.fori_loop(0, rows, row, x_next, unroll=True)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(y, t.box(x_g, block))
            return x_next

        _run(_ring(pl, plgpu, steps, S, load_work, substitute, reverse=True), steps, zero)
        plgpu.wait_smem_to_gmem(0)

    out = jax.ShapeDtypeStruct(d.shape, jnp.float32)
    x, _ = _launch(plgpu, body, (a, b, c, d), (out, out), 4, ((4, S), (2, S)), rows=R,
                   interpret=interpret)
    return x


class WarpgroupRows:
    """Row access for the other kinds: the interface of `_pallas_tiles.TileRows` (load, store,
    full) over this block's 128 columns of full (P, N, Q) float32 arrays in global
    memory, so the Triton kernel bodies of `_tridiagonal/pallas_triton.py` run here unchanged. Each row is
    a coalesced 512-byte access; Q is a multiple of 128 (padded), so nothing is masked."""

    def __init__(self, P, Q, tiles, compute_dtype, *, interpret=None):
        pl, plgpu = _modules()
        del P, Q, tiles, compute_dtype  # the arrays are full float32 (P, N, Q)
        self.p = lax.axis_index("p")
        self.cols = pl.ds(lax.axis_index("q") * LANES, LANES)
        # Values built from constants must have the rows' (strided) layout to be loop carries:
        # a zero row of that layout, to add them to. (The interpreter knows no layouts, and no
        # layout_cast.)
        layout = None if interpret else plgpu.Layout.WG_STRIDED((LANES,), vec_size=1)
        self._zeros = plgpu.broadcasted_iota(jnp.float32, (LANES,), 0, layout=layout) * 0

    def load(self, ref, i):
        return ref[self.p, i, self.cols]

    def store(self, ref, i, value):
        ref[self.p, i, self.cols] = self.full(value)

    def full(self, value):
        return self._zeros + value

    @staticmethod
    def divide(x, y):
        """x / y (real float32: Mosaic GPU's division, arith.divf without fast-math flags)."""
        return x / y


def _over_warpgroup_rows(body, operands, out_type, *, interpret, **params):
    """A Triton kernel body (`_pallas_thomas`, `_pallas_recurrence`) run over `WarpgroupRows`
    on full float32 (P|1, ·, Q) operands, Q a multiple of LANES: one warpgroup per 128 columns
    of each of the P rows of tiles."""
    _, plgpu = _modules()
    P, _, Q = broadcast_shape(*operands)
    body = functools.partial(body, tiles=None, P=P, Q=Q, **params,
                             rows_class=functools.partial(WarpgroupRows, interpret=interpret))
    return _kernel(plgpu, body, out_type=out_type, grid=(P, Q // LANES), grid_names=("p", "q"),
                   interpret=interpret)(*operands)


def _other_kind(l, d, u, b, *, kind, transposed, interpret):
    """The periodic, pivoted and factored solves of full float32 (P, N, Q) arrays, Q a
    multiple of LANES: `_pallas_thomas`'s kernel body over `WarpgroupRows`."""
    out = jax.ShapeDtypeStruct(b.shape, jnp.float32)
    work = _pallas_thomas._WORK_OUTPUTS[kind]
    return _over_warpgroup_rows(_pallas_thomas._kernel, (l, d, u, b), (out,) * (1 + work),
                                interpret=interpret, n=b.shape[1], kind=kind,
                                transposed=transposed)[0]


def factor_pnq(l, d, u, *, out_dtype, interpret=None, tiles=None):
    """The factors (l, m, c') of the (P|1, N|1, Q|1) bands' systems along axis 1 (see
    `_xla_thomas.factor_pnq`): `_pallas_thomas`'s factor body over `WarpgroupRows`, in whole
    128-column tiles padded with solvable systems (diagonal 1)."""
    if not runs(out_dtype):
        return _xla_thomas.factor_pnq(l, d, u, out_dtype=out_dtype)
    del tiles
    (l, d, u), back = _to_columns((l, d, u), columns=LANES, fills=(0, 1, 0))
    out = jax.ShapeDtypeStruct(d.shape, jnp.float32)
    factors = _over_warpgroup_rows(_pallas_thomas._factor_kernel, (l, d, u), (out,) * 3,
                                   interpret=interpret, n=d.shape[1], dtype=jnp.float32)
    return tuple(back(f).astype(out_dtype) for f in factors)


def _activated_recurrence(a, x, h0, *, activation, reverse, shifted, final_only, interpret):
    """h[t] = activation(c[t] h[t-1] + x[t]) (IndRNN) over full float32 (P, T, Q) arrays, Q a
    multiple of LANES: `_pallas_recurrence`'s kernel body over `WarpgroupRows`."""
    P, T, Q = x.shape
    out = jax.ShapeDtypeStruct((P, 1 if final_only else T, Q), jnp.float32)
    return _over_warpgroup_rows(_pallas_recurrence._recurrence_kernel, (a, x, h0), out,
                                interpret=interpret, T=T, reverse=reverse, shifted=shifted,
                                activation=activation, final_only=final_only)


def _recurrence(a, x, *, interpret):
    """h[t] = a[t] h[t-1] + x[t] from h = 0 along the rows (axis 1) of float32 arrays, (P, T, Q)
    with Q a multiple of _ALIGN or batch-first (P, T) with T a multiple of _ALIGN."""
    pl, plgpu = _modules()
    T = x.shape[1]
    R = min(RECURRENCE_ROWS, T)
    steps = -(-T // R)
    S = min(STAGES, steps)

    def body(a_g, x_g, h_g, a_s, x_s, bar, *, systems):
        t = _Boxes(pl, plgpu, R, systems)
        load = t.loader(((a_g, a_s), (x_g, x_s)), bar)

        def sweep(s, block, slot, h):
            plgpu.barrier_wait(bar.at[slot])
            coefficient, values = a_s.at[slot], x_s.at[slot]

            def row(r, h):
                h = t.get(coefficient, r) * h + t.get(values, r)
                t.put(values, r, h)
                return h

            h = lax.fori_loop(0, R, row, h, unroll=True)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(values, t.box(h_g, block))
            return h

        _run(_ring(pl, plgpu, steps, S, load, sweep), steps, jnp.zeros((LANES,), jnp.float32))
        plgpu.wait_smem_to_gmem(0)

    return _launch(plgpu, body, (a, x), jax.ShapeDtypeStruct(x.shape, jnp.float32), 2,
                   ((2, S),), rows=R, interpret=interpret)


# --- Around the kernels: layout, dtype and the folded-in parts of each call ------------------


def _to_columns(arrays, *, rows=None, columns=_ALIGN, fills=None):
    """Full float32 (P', N', Q') arrays with columns along Q' (a multiple of `columns`, padded
    with `fills`, a value per array), and the function that puts a result back in the
    (P, N, Q) layout.

    `rows`: pad N and Q' to whole (rows x LANES) boxes, for the interpreter: the jax 0.10.2
    Mosaic GPU interpreter drops a TMA store that is partly out of bounds, where the hardware
    writes the part inside."""
    P, N, Q = broadcast_shape(*arrays)
    full = [jnp.broadcast_to(x, (P, N, Q)).astype(jnp.float32) for x in arrays]
    from_columns = None
    if Q < LANES and P > 1:  # systems along P: put them along the columns
        full, from_columns = to_columns(full, P, Q)
    width = full[0].shape[2]
    pad_n = 0 if rows is None else -N % rows
    pad_q = -width % (columns if rows is None else LANES)
    if pad_n or pad_q:
        full = [jnp.pad(x, ((0, 0), (0, pad_n), (0, pad_q)), constant_values=fill)
                for x, fill in zip(full, fills or (0,) * len(full), strict=True)]

    def back(y):  # y has N rows, or one (a final state)
        rows_out = min(N, y.shape[1])
        y = y[:, :rows_out, :width]
        return y if from_columns is None else from_columns(y)

    return full, back


def _to_boxes(arrays, *, rows, fills, interpret):
    """Operands of the TMA kernels: batch-first data (Q = 1, several systems along P, each
    system's rows contiguous) as 2-D (P, N') float32 arrays, read in (LANES x rows) boxes
    with no transpose; anything else through `_to_columns`. N' pads N to 16-byte rows (TMA's
    rule) with `fills`; the interpreter pads to whole boxes. Returns (arrays, back)."""
    P, N, Q = broadcast_shape(*arrays)
    if not (Q == 1 and P > 1):
        return _to_columns(arrays, rows=rows if interpret is not None else None, fills=fills)
    full = [jnp.broadcast_to(x, (P, N, 1)).astype(jnp.float32)[:, :, 0] for x in arrays]
    pad_n = -N % (rows if interpret is not None else _ALIGN)
    pad_p = -P % LANES if interpret is not None else 0
    if pad_n or pad_p:
        full = [jnp.pad(x, ((0, pad_p), (0, pad_n)), constant_values=fill)
                for x, fill in zip(full, fills, strict=True)]

    def back(y):  # y has N rows, or one (a final state)
        return y[:P, :min(N, y.shape[1]), None]

    return full, back


def _shift(x, by: int):
    """x moved `by` rows along axis 1 (down for by > 0), zeros coming in."""
    N = x.shape[1]
    if N == 1:
        return jnp.zeros_like(x)
    zeros = jnp.zeros_like(x[:, :1])
    return (jnp.concatenate([zeros, x[:, :-1]], 1) if by > 0
            else jnp.concatenate([x[:, 1:], zeros], 1))


def solve_pnq(l, d, u, b, *, transposed: bool, out_dtype, kind: str = "thomas",
              interpret=None, tiles=None):
    """Solve along axis 1 of (P|1, N|1, Q|1) operands (see `_xla_thomas.solve_pnq`)."""
    if not runs(out_dtype):
        return _xla_thomas.solve_pnq(l, d, u, b, transposed=transposed, out_dtype=out_dtype,
                                     kind=kind)
    del tiles  # the box is fixed: 128 columns, SOLVE_ROWS rows
    P, N, Q = broadcast_shape(l, d, u, b)
    if kind != "thomas":  # whole 128-column tiles, padded with solvable systems (diagonal 1)
        (l, d, u, b), back = _to_columns((l, d, u, b), columns=LANES, fills=(0, 1, 0, 0))
        x = _other_kind(l, d, u, b, kind=kind, transposed=transposed, interpret=interpret)
        return back(x).astype(out_dtype)
    l, d, u, b = (jnp.broadcast_to(x, (P, N, Q)) for x in (l, d, u, b))
    if transposed:  # the bands of A^T: sub[i] = upper[i-1], sup[i] = lower[i+1]
        l, u = _shift(u, 1), _shift(l, -1)
    u = u.at[:, N - 1:].set(0)  # unread; padded rows (diagonal 1) must not couple to row N-1
    (l, d, u, b), back = _to_boxes((l, d, u, b), rows=min(SOLVE_ROWS, N), fills=(0, 1, 0, 0),
                                   interpret=interpret)
    return back(_thomas(l, d, u, b, interpret=interpret)).astype(out_dtype)


def recurrence_pnq(a, x, h0, *, reverse: bool, shifted: bool, activation, final_only: bool,
                   out_dtype, interpret=None, tiles=None):
    """Run along axis 1 of (P|1, T|1, Q|1) operands (see `_xla_recurrence.recurrence_pnq`)."""
    kernel_activation = None if activation is None else _kernel_activation(activation)
    if not runs(out_dtype) or (activation is not None and kernel_activation is None):
        return _xla_recurrence.recurrence_pnq(a, x, h0, reverse=reverse, shifted=shifted,
                                              activation=activation, final_only=final_only,
                                              out_dtype=out_dtype)
    del tiles
    P, T, Q = broadcast_shape(a, x, h0)
    if activation is not None:  # nonlinear: whole 128-column tiles, the generic body
        h0 = jnp.broadcast_to(h0, (P, 1, Q))
        (a, x), back = _to_columns((a, x), columns=LANES)
        (h0,), _ = _to_columns((h0,), columns=LANES)
        h = _activated_recurrence(a, x, h0, activation=kernel_activation, reverse=reverse,
                                  shifted=shifted, final_only=final_only, interpret=interpret)
        return back(h).astype(out_dtype)
    a = jnp.broadcast_to(a, (P, T, Q)).astype(jnp.float32)
    x = jnp.broadcast_to(x, (P, T, Q)).astype(jnp.float32)
    if shifted:  # coefficient at step t: a at the previous step (zero at the first)
        a = _shift(a, -1 if reverse else 1)
    if reverse:
        a, x = jnp.flip(a, 1), jnp.flip(x, 1)
    # The initial state enters through the first step: h[0] = a[0] h0 + x[0].
    x = x.at[:, :1].add(a[:, :1] * jnp.broadcast_to(h0, (P, 1, Q)).astype(jnp.float32))
    (a, x), back = _to_boxes((a, x), rows=min(RECURRENCE_ROWS, T), fills=(0, 0),
                             interpret=interpret)
    h = back(_recurrence(a, x, interpret=interpret))
    if reverse:
        h = jnp.flip(h, 1)
    if final_only:
        h = h[:, :1] if reverse else h[:, -1:]
    return h.astype(out_dtype)


@functools.cache
def interpret_params():
    """The Mosaic GPU interpreter's settings (`interpret=` of the kernels, for tests on CPU):
    out-of-bounds TMA reads give zeros, as the hardware's copies do. None where this JAX has
    no such interpreter (`_jax_private.mosaic_gpu_interpreter`)."""
    from .._core import jax_private as _jax_private

    params = _jax_private.mosaic_gpu_interpreter()
    if params is None:
        return None
    return params(out_of_bounds_reads="uninitialized", uninitialized_memory="zero")
