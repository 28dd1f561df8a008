"""What every tridiax Pallas kernel shares: tiles of systems over the (P, N, Q) view.

A program owns a (bp, bq) tile of independent systems (or feature columns) and walks their N
rows one at a time. Tiles are powers of two (Triton); N may be anything because a row is
loaded at a time. Triton does not mask a ragged last tile, so when P or Q is not a multiple
of the tile every load and store carries an explicit mask (interpret mode pads and would hide
a missing one). Operands broadcast along P, N or Q have size 1 there and are read in place.
"""

from __future__ import annotations

import dataclasses
import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from .._core import jax_private as _jax_private
from .._core.split_complex import SplitComplex, SplitRef, as_split, divide, real_dtype

# Masked loads and stores (None where this JAX has no Triton backend: then only interpret
# mode runs these kernels, and it masks by selecting, which its padded blocks allow).
_TRITON = _jax_private.pallas_triton()


@functools.cache
def _on_rocm() -> bool:
    """Whether this process has ROCm GPUs (Pallas Triton then compiles for AMD, not CUDA)."""
    try:
        return bool(jax.devices("rocm"))
    except RuntimeError:
        return False


def _correctly_rounded_quotient(x, y):
    """x / y rounded once, on CUDA too. Triton compiles a float32 `/` for CUDA to PTX's
    div.full.f32 (within 2 ulp: a quotient through an approximate reciprocal, the error the
    dividing sweeps avoid); div.rn.f32 is IEEE's division. float64 `/` is div.rn.f64 already,
    and AMD's float32 `/` is IEEE's."""
    x, y = jnp.broadcast_arrays(x, y)
    dtype = jnp.result_type(x, y)
    if (dtype != jnp.float32 or _TRITON is None or not hasattr(_TRITON, "elementwise_inline_asm")
            or _on_rocm()):
        return x / y
    [quotient] = _TRITON.elementwise_inline_asm(
        "div.rn.f32 $0, $1, $2;", args=[x.astype(dtype), y.astype(dtype)],
        constraints="=f,f,f", pack=1, result_shape_dtypes=[jax.ShapeDtypeStruct(x.shape, dtype)])
    return quotient


def _next_power_of_2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


# Systems one program sweeps by default: two per thread of one warp. ptxas gives a kernel of
# one warp per block (.reqntid 32) up to 64 registers without losing occupancy (32 blocks of 32
# threads fill an SM's 1024-thread share of its registers), and the sweeps (pivoted and
# float64 gradients included) fit without spilling; with 2 or more warps per block it aims
# at 32 registers and spills values live across the loops (tests/gpu/test_gpu_compile.py).
# Two systems per thread keep 2048 systems in flight per SM, as full occupancy of 128-thread
# blocks would; and 64-system tiles give 132 SMs a block each from 132 x 64 systems on.
SYSTEMS_PER_PROGRAM = 64
SYSTEMS_PER_THREAD = 2


@dataclasses.dataclass(frozen=True)
class Tiles:
    """Tile of systems one program solves: bp along P, bq along Q (powers of two)."""

    bp: int
    bq: int
    num_warps: int

    @classmethod
    def default(cls, P: int, Q: int, *, systems: int = SYSTEMS_PER_PROGRAM) -> Tiles:
        # Systems along Q are contiguous in memory, so a row of a Q tile is a coalesced load;
        # use Q for the tile as far as it goes and fill the rest with P.
        bq = min(_next_power_of_2(Q), systems)
        bp = min(_next_power_of_2(P), max(1, systems // bq))
        return cls.of_block(bp, bq)

    @classmethod
    def of_block(cls, bp: int, bq: int) -> Tiles:
        """A (bp, bq) tile with warps for its threads (two systems per thread, 1 to 4 warps)."""
        return cls(bp=bp, bq=bq, num_warps=max(1, min(4, bp * bq // (32 * SYSTEMS_PER_THREAD))))


class TileRows:
    """Masked row access for the program's tile, and its division; build it inside a kernel
    body. `compiled`: the kernel is compiled by Triton (not interpreted), whose float32 `/`
    on CUDA is not IEEE's division (`divide` then rounds the quotient once itself)."""

    def __init__(self, P: int, Q: int, tiles: Tiles, compute_dtype, *, compiled: bool = False):
        self._real_divide = _correctly_rounded_quotient if compiled else operator.truediv
        self.bp, self.bq = tiles.bp, tiles.bq
        self.masked = P % tiles.bp != 0 or Q % tiles.bq != 0
        self.dtype = real_dtype(compute_dtype)  # of a row, or of each part of a complex one
        self.p_ok = (pl.program_id(0) * self.bp + lax.broadcasted_iota(jnp.int32, (self.bp, 1), 0)) < P
        self.q_ok = (pl.program_id(1) * self.bq + lax.broadcasted_iota(jnp.int32, (1, self.bq), 1)) < Q

    def _mask(self, ref):
        return self.mask_for(ref.shape[0] > 1, ref.shape[2] > 1)

    def mask_for(self, full_p: bool, full_q: bool):
        """The mask of an operand that is full (not broadcast) along P and/or Q; None where no
        load can run past the arrays."""
        if not self.masked:
            return None
        if full_p and full_q:
            return self.p_ok & self.q_ok
        if full_p:
            return self.p_ok
        if full_q:
            return self.q_ok
        return None

    def load(self, ref, i):
        """Row i (row 0 of an operand broadcast along N), in the compute dtype (a SplitComplex
        for a complex operand)."""
        if isinstance(ref, SplitRef):
            return SplitComplex(self.load(ref.re, i), self.load(ref.im, i))
        if ref.shape[1] == 1:
            i = 0
        i = jnp.asarray(i, int)  # masked loads want a traced index in interpret mode
        return self.read(ref.at[:, i, :], self._mask(ref))

    def read(self, view, mask):
        """A (bp, bq) view's values in the compute dtype, masked (lanes outside: 0)."""
        if mask is None:
            value = view[...]
        elif _TRITON is not None:
            value = _TRITON.load(view, mask=mask)
        else:
            value = jnp.where(mask, view[...], 0)
        return value.astype(self.dtype)

    def store(self, ref, i, value):
        if isinstance(ref, SplitRef):
            value = as_split(value)
            self.store(ref.re, i, value.re)
            self.store(ref.im, i, value.im)
            return
        i = jnp.asarray(i, int)
        mask = self._mask(ref)
        value = jnp.broadcast_to(value, (self.bp, self.bq)).astype(ref.dtype)
        if mask is None:
            ref[:, i, :] = value
        elif _TRITON is not None:
            _TRITON.store(ref.at[:, i, :], value, mask=mask)
        else:
            ref[:, i, :] = jnp.where(mask, value, ref[:, i, :])

    def full(self, value):
        if isinstance(value, SplitComplex):
            return value.map(self.full)
        return jnp.broadcast_to(value, (self.bp, self.bq))

    def divide(self, x, y):
        """x / y, real or split (`_split_complex.divide`), each real quotient rounded once."""
        return divide(x, y, self._real_divide)


def launch(kernel, operands, out_shapes, *, name, interpret=False, tiles=None,
           compiler_params=None):
    """pallas_call `kernel(*operand_refs, *out_refs, tiles=...)` over tiles of (P, ·, Q).

    Operands are (P|1, ·, Q|1), or have leading dimensions before those three (the band stack
    of a banded solve), which every tile takes whole. `out_shapes` are (rows, dtype) pairs;
    every output is (P, rows, Q). A tile wider than P or Q (a user's block) is cut to the next
    power of two of it. `compiler_params`, if given, maps the tiles to the backend's
    CompilerParams. Complex operands and outputs travel as their real and imaginary parts, and
    the kernel sees a `SplitRef` for each.
    """
    P, _, Q = np.broadcast_shapes(*(x.shape[-3:] for x in operands))
    tiles = tiles or Tiles.default(P, Q)
    bp, bq = min(tiles.bp, _next_power_of_2(P)), min(tiles.bq, _next_power_of_2(Q))
    if (bp, bq) != (tiles.bp, tiles.bq):  # a tile (the user's block) wider than the systems
        tiles = Tiles.of_block(bp, bq)
    is_complex = [jnp.iscomplexobj(x) for x in operands] + [
        jnp.issubdtype(dtype, jnp.complexfloating) for _, dtype in out_shapes]
    parts = [p for x in operands for p in ((x.real, x.imag) if jnp.iscomplexobj(x) else (x,))]
    part_shapes = [(rows, d) for rows, dtype in out_shapes
                   for d in ((real_dtype(dtype),) * 2 if jnp.issubdtype(dtype, jnp.complexfloating)
                             else (dtype,))]

    def body(*refs):
        grouped, k = [], 0
        for split in is_complex:
            grouped.append(SplitRef(refs[k], refs[k + 1]) if split else refs[k])
            k += 2 if split else 1
        kernel(*grouped, tiles=tiles, P=P, Q=Q)

    outs = _launch_real(body, parts, part_shapes, name=name, interpret=interpret, tiles=tiles,
                        compiler_params=compiler_params)
    results, k = [], 0
    for split in is_complex[len(operands):]:
        results.append(jax.lax.complex(outs[k], outs[k + 1]) if split else outs[k])
        k += 2 if split else 1
    return results


def _launch_real(kernel, operands, out_shapes, *, name, interpret, tiles, compiler_params):
    P, _, Q = np.broadcast_shapes(*(x.shape[-3:] for x in operands))
    bp, bq = tiles.bp, tiles.bq

    def spec(shape):
        *lead, p, n, q = shape
        full_p, full_q = p > 1, q > 1
        block = (*lead, bp if full_p else 1, n, bq if full_q else 1)
        zeros = (0,) * len(lead)
        return pl.BlockSpec(block, lambda i, j: (*zeros, i if full_p else 0, 0,
                                                 j if full_q else 0))

    shapes = [jax.ShapeDtypeStruct((P, rows, Q), dtype) for rows, dtype in out_shapes]
    return pl.pallas_call(
        kernel,
        out_shape=tuple(shapes),
        grid=(pl.cdiv(P, bp), pl.cdiv(Q, bq)),
        in_specs=[spec(x.shape) for x in operands],
        out_specs=tuple(spec(s.shape) for s in shapes),
        interpret=interpret,
        compiler_params=compiler_params(tiles) if compiler_params else None,
        name=name,
    )(*operands)
