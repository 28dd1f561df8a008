"""The Thomas algorithm as one Pallas kernel over the (P, N, Q) view.

Each program owns a (bp, bq) tile of systems and walks their N rows: the forward elimination
stores the eliminated super-diagonal c' and right-hand side y' one row at a time, then the back
substitution reads them back in reverse and writes x. Rows are addressed directly through the
BlockSpecs and `ref.at[:, i, :]` indexing, so no array is transposed whatever the solve axis.

GPU notes (Triton):
- Tile sizes are powers of two; N may be anything because a row is loaded at a time.
- Triton does not mask a ragged last tile, so every load and store carries an explicit mask
  (interpret mode pads and would hide a missing one; tests count masks in the Triton IR).
- Triton has no scratch memory, so c' (and y' for half precision, which is eliminated in
  float32) are extra outputs that the launcher drops.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .._dtypes import compute_dtype


def _next_power_of_2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


@dataclasses.dataclass(frozen=True)
class ThomasBlocks:
    """Tile of systems one program solves: bp along P, bq along Q (powers of two)."""

    bp: int
    bq: int
    num_warps: int

    @classmethod
    def default(cls, P: int, Q: int, *, threads: int = 128) -> ThomasBlocks:
        # Systems along Q are contiguous in memory, so a row of a Q tile is a coalesced load;
        # use Q for the tile as far as it goes and fill the rest with P.
        bq = min(_next_power_of_2(Q), threads)
        bp = min(_next_power_of_2(P), max(1, threads // bq))
        return cls(bp=bp, bq=bq, num_warps=max(1, min(4, bp * bq // 32)))


def _thomas_kernel(l_ref, d_ref, u_ref, b_ref, x_ref, c_ref, *scratch, n, P, Q, bp, bq,
                   transposed, masked):
    y_ref = scratch[0] if scratch else x_ref
    cdt = c_ref.dtype

    p_ok = (pl.program_id(0) * bp + lax.broadcasted_iota(jnp.int32, (bp, 1), 0)) < P
    q_ok = (pl.program_id(1) * bq + lax.broadcasted_iota(jnp.int32, (1, bq), 1)) < Q

    def mask_for(ref):
        """Mask of the valid systems in a tile of `ref` (broadcast operands are smaller)."""
        if not masked:
            return None
        full_p, full_q = ref.shape[0] > 1, ref.shape[2] > 1
        if full_p and full_q:
            return p_ok & q_ok
        if full_p:
            return p_ok
        if full_q:
            return q_ok
        return None

    def load(ref, i):
        if ref.shape[1] == 1:  # broadcast along the solve axis
            i = 0
        i = jnp.asarray(i, int)  # masked loads want a traced index in interpret mode
        mask = mask_for(ref)
        view = ref.at[:, i, :]
        value = plgpu.load(view, mask=mask) if mask is not None else view[...]
        return value.astype(cdt)

    def store(ref, i, value):
        i = jnp.asarray(i, int)
        mask = mask_for(ref)
        value = jnp.broadcast_to(value, (bp, bq)).astype(ref.dtype)
        if mask is not None:
            plgpu.store(ref.at[:, i, :], value, mask=mask)
        else:
            ref[:, i, :] = value

    def sub(i):
        return load(u_ref, i - 1) if transposed else load(l_ref, i)

    def sup(i):
        return load(l_ref, jnp.minimum(i + 1, n - 1)) if transposed else load(u_ref, i)

    r0 = 1 / load(d_ref, 0)
    c0 = sup(0) * r0
    y0 = load(b_ref, 0) * r0
    store(c_ref, 0, c0)
    store(y_ref, 0, y0)

    def forward(i, carry):
        c_prev, y_prev = carry
        a = sub(i)
        r = 1 / (load(d_ref, i) - a * c_prev)
        c = sup(i) * r
        y = (load(b_ref, i) - a * y_prev) * r
        store(c_ref, i, c)
        store(y_ref, i, y)
        return jnp.broadcast_to(c, (bp, bq)), jnp.broadcast_to(y, (bp, bq))

    init = (jnp.broadcast_to(c0, (bp, bq)), jnp.broadcast_to(y0, (bp, bq)))
    _, x_last = lax.fori_loop(1, n, forward, init)
    if scratch:
        store(x_ref, n - 1, x_last)

    def backward(k, x_next):
        i = n - 2 - k
        x = load(y_ref, i) - load(c_ref, i) * x_next
        store(x_ref, i, x)
        return x

    lax.fori_loop(0, n - 1, backward, x_last)


def solve_pnq(l, d, u, b, *, transposed: bool, out_dtype, interpret: bool = False,
              blocks: ThomasBlocks | None = None, compiler_params=None):
    """Solve along axis 1 of (P|1, N|1, Q|1) operands with the Pallas kernel.

    `compiler_params`, if given, maps the tile sizes to the backend's CompilerParams.
    """
    operands = (l, d, u, b)
    P = max(x.shape[0] for x in operands)
    N = max(x.shape[1] for x in operands)
    Q = max(x.shape[2] for x in operands)
    blocks = blocks or ThomasBlocks.default(P, Q)
    bp, bq = blocks.bp, blocks.bq
    grid = (pl.cdiv(P, bp), pl.cdiv(Q, bq))
    masked = P % bp != 0 or Q % bq != 0

    def spec(shape):
        full_p, full_q = shape[0] > 1, shape[2] > 1
        block = (bp if full_p else 1, shape[1], bq if full_q else 1)
        return pl.BlockSpec(
            block, lambda i, j: (i if full_p else 0, 0, j if full_q else 0)
        )

    cdt = compute_dtype(out_dtype)
    out_shapes = [jax.ShapeDtypeStruct((P, N, Q), out_dtype), jax.ShapeDtypeStruct((P, N, Q), cdt)]
    if jnp.dtype(cdt) != jnp.dtype(out_dtype):
        out_shapes.append(jax.ShapeDtypeStruct((P, N, Q), cdt))
    kernel = functools.partial(
        _thomas_kernel, n=N, P=P, Q=Q, bp=bp, bq=bq, transposed=transposed, masked=masked
    )
    outs = pl.pallas_call(
        kernel,
        out_shape=tuple(out_shapes),
        grid=grid,
        in_specs=[spec(x.shape) for x in operands],
        out_specs=tuple(spec((P, N, Q)) for _ in out_shapes),
        interpret=interpret,
        compiler_params=compiler_params(blocks) if compiler_params else None,
        name="tridiax_thomas",
    )(*operands)
    return outs[0]
