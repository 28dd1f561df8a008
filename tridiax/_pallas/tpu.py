"""What the Pallas Mosaic TPU kernels share: the (P, N, Q) view cut into row tiles.

A TPU core computes on vector registers of 8 sublanes x 128 lanes, and its memories (HBM and
the on-chip VMEM) store the last two dimensions of an array in (8, 128) tiles (bf16: (16, 128),
two rows packed per 32-bit word). A sweep walks the N rows of its systems one after the other,
so a register should hold one row of many systems: a *row tile* of s sublanes x 128 lanes
(s <= 8) of systems, in float32 whatever the operands' dtype. How the systems of (P, N, Q)
arrays become row tiles is the *layout* (`Geometry.layout`):

- "lanes" (Q >= 1024, or Q >= 128 with P < 8): a group is s*128 consecutive q of one p. The
  HBM block (1, rows, s*128) lies in VMEM as tiles of 8 rows x 128 q, so row i of the group is
  one sublane of each of s tiles: one strided load (`RowRef`), no data moved around.
- "transposed" (Q == 1: batch-first systems): a group is s*128 consecutive p (fewer than 128
  systems fill part of one group: their operands are 2D (P, N) arrays, which a TPU stores
  without padding, where a (P, N, 1) array would pad its last dimension to 128 lanes); the
  (P, N) operand's block (s*128, rows) holds its rows along lanes, so it is transposed on chip,
  128 systems at a time by the transpose unit, into a (rows, s*128) stage read as in "lanes".
  The transposes stay in VMEM: no HBM transpose, one read of each operand.
- "sublanes" (every other (P, Q): 1 < Q < 1024 with P >= 8, or 1 < Q < 128): a group is s values of p
  times w = 128 values of q (w = Q when Q < 128, the other lanes idle). Each p of the block is
  staged into a 2D scratch (s * rows, w), where row i of the s systems is every rows-th sublane:
  one strided load (`RowRef`).

Rows are cut into chunks of `Geometry.chunk` rows, the last axis of the grid: a block holds one
chunk of every operand, so VMEM holds the same few chunks whatever N is, and Pallas's
pipeline fetches the next chunk while the sweep walks this one (two buffers per operand).
A kernel plans its VMEM (`vmem_need`: buffers, stages, scratch) within a budget under the
scoped VMEM it asks for (`vmem`: half a TensorCore's VMEM on the chip being compiled for, 64 MiB
of v5e's and v6e's 128, 32 of v5p's and 7x's 64, 16 MiB where the chip is unknown), by
narrowing the row tile (fewer sublanes) where it must (`geometry`). A row tile of 8 sublanes
is the fast one: Mosaic shuffles narrower ones into place at every row.
Groups are the first two axes of the grid ("parallel": TensorCores of a megacore chip share
them); chunks are "arbitrary" (walked in order, the sweep's state carried in scratch).

Operands arrive as (P|1, N|1, Q|1) (`prepare` readies each): full along N they are read by
rows; broadcast along N (a per-system constant, an initial state) they become one tile per group
(`tiles_of`, an XLA relayout of P*Q values, small next to the N-long operands); full along N
and broadcast along P and Q (one matrix for every system) they are read as one scalar per row
from SMEM. Other partial broadcasts (along P or Q only, in the "sublanes" and "transposed"
layouts) are broadcast to the full shape first, at the cost of the bytes that writes.

Half-precision operands are converted to float32 in VMEM (staged like a transposed layout's
operands): a packed bf16 row cannot be loaded at a dynamic row. Complex64 operands are passed
as their float32 real and imaginary parts (`parts_of`; XLA takes a complex64 array apart, and
puts the results together, with copies of its own) and read as `SplitComplex` tiles
(`SplitRows`).
Float64 and complex128 are not taken (`_core/backend.py` says why and runs XLA's loop instead).

HBM layouts: XLA stores an array on a TPU in the dimension order that pads its tiles least
(its default layout: f32[4096, 1000] lies as 1000 rows of 4096 values, `{0,1:T(8,128)}`),
while a Mosaic kernel takes its operands row-major. `in_physical_order` therefore transposes the
operands into the order their default layout stores them in before the (P, N, Q) view is taken:
a bitcast for arrays in that layout (a jit's arguments and results), where a row-major kernel
would make XLA copy each operand through a transpose. Such batch-first systems are then read
by "lanes", with no transpose at all.

Ragged sizes: blocks at the edges of P, Q and N overhang the arrays; their rows and systems
outside the arrays hold whatever VMEM held, are computed like any other lane (no lane reads
another's) and never written back (Pallas clips the copies), and the loops run over the
chunk's valid rows only.

`interpret`: a `pltpu.InterpretParams` runs the kernels on CPU with TPU semantics, True in
Pallas's HLO interpreter (tests).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .._core.split_complex import SplitComplex, as_split

try:  # Pallas's Mosaic TPU backend (jax.experimental.pallas.tpu)
    from jax.experimental.pallas import tpu as pltpu
except ImportError:  # pragma: no cover - a JAX without it: the backend is unavailable
    pltpu = None

SUBLANES = 8
LANES = 128
# Rows per chunk of long systems: a multiple of 128, since an SMEM band's block (1, chunk) has
# its rows on lanes, and a "transposed" block too.
CHUNK = 256
# Scoped VMEM a kernel asks for where the chip is unknown (the default of v4, v5e and v5p, and
# all of v4's), and the bytes it plans for in it (pipeline buffers and scratch), a quarter left
# to Mosaic's own scratch. On a known chip, half a TensorCore's VMEM, at most MAX_VMEM_LIMIT.
VMEM_BUDGET = 12 << 20
VMEM_LIMIT = 16 << 20
MAX_VMEM_LIMIT = 64 << 20
# Chip versions (`pltpu.ChipVersion` values) of the device kinds JAX reports.
_CHIPS = {"TPU v4": "v4", "TPU v4 lite": "v4i", "TPU v5 lite": "v5e", "TPU v5e": "v5e",
          "TPU v5": "v5p", "TPU v5p": "v5p", "TPU v6 lite": "v6e", "TPU v6e": "v6e",
          "TPU7": "7", "TPU7x": "7x"}
TAKES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def unavailable_dtype(dtype) -> str | None:
    """Why the TPU kernels cannot take `dtype` (None: they can): they take the dtypes of
    TAKES, and complex64 as float32 real and imaginary parts."""
    dtype = jnp.dtype(dtype)
    if dtype not in TAKES and dtype != jnp.complex64:
        return (f"the Pallas TPU kernels take float32, bfloat16 and float16 (computed in "
                f"float32) and complex64 (as float32 parts), not {dtype}")
    return None


def check_dtype(dtype) -> None:
    """ValueError for a `dtype` the kernels cannot take (the backend routes such calls to XLA's
    loop; `unavailable_dtype` says why)."""
    if (reason := unavailable_dtype(dtype)) is not None:
        raise ValueError(reason)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


@dataclasses.dataclass(frozen=True)
class Geometry:
    """How a call over (P, N, Q) arrays is cut into groups of systems and chunks of rows.

    `s` x `w`: a row tile (sublanes x lanes holding systems; w is 128 except in the
    "sublanes" layout for Q < 128). `chunk`: rows of one block along N; `chunks`: blocks
    along N (the last one may overhang N)."""

    layout: str
    P: int
    N: int
    Q: int
    s: int
    w: int
    chunk: int
    chunks: int

    @property
    def groups(self) -> tuple[int, int]:
        """Grid extent of the groups of systems (along P, along Q)."""
        if self.layout == "lanes":
            return self.P, -(-self.Q // (self.s * LANES))
        if self.layout == "sublanes":
            return -(-self.P // self.s), -(-self.Q // self.w)
        return -(-self.P // (self.s * LANES)), 1

    @property
    def tile(self) -> tuple[int, int]:
        """Shape of a row tile (the values a sweep computes on at each row)."""
        return (self.s, self.w)

    @property
    def rows(self) -> int:
        """Rows of every chunk's VMEM buffers: the chunk, or N rounded up to a whole number of
        tiles (16 rows: bf16's tiles; 128 where rows lie on lanes) when one chunk holds N."""
        if self.chunks > 1:
            return self.chunk
        return _round_up(self.N, LANES if self.layout == "transposed" else 16)

    @property
    def scalar_rows(self) -> int:
        """Rows of an SMEM band's block, on lanes: a multiple of 128."""
        return self.chunk if self.chunks > 1 else _round_up(self.N, LANES)

    @property
    def total_rows(self) -> int:
        """Rows of a scratch holding every chunk (the solve's eliminated rows)."""
        return self.chunks * self.rows

    def valid(self, j):
        """Rows of chunk j (a traced chunk index) that lie in the arrays."""
        if self.chunks == 1:
            return self.N
        return jnp.minimum(self.chunk, self.N - j * self.chunk)

    def row_tile_bytes(self) -> int:
        """VMEM bytes of one float32 row tile as the scratches store it (lanes padded to 128)."""
        return self.s * LANES * 4

    def block_bytes(self, itemsize: int) -> int:
        """VMEM bytes of one buffer of an operand's block (tiles padded to (8, 128))."""
        if self.layout == "sublanes":
            return self.s * _round_up(self.rows, 16) * LANES * max(itemsize, 4)
        if self.layout == "transposed":
            return _round_up(self.s * LANES, 16) * self.rows * itemsize
        return self.rows * self.s * LANES * max(itemsize, 4)


def choose_layout(P: int, Q: int) -> str:
    """The layout of (P, N, Q) arrays (module docstring)."""
    if Q >= 1024 or (Q >= LANES and P < SUBLANES):
        return "lanes"
    if Q == 1:
        return "transposed"
    return "sublanes"


@dataclasses.dataclass(frozen=True)
class Vmem:
    """Scoped VMEM a kernel asks for (`limit`) and the bytes it plans for in it (`budget`)."""

    budget: int
    limit: int


def vmem(device_kind: str | None = None) -> Vmem:
    """The VMEM plan for a TPU of `device_kind` (None: the device being lowered for; the
    defaults, VMEM_BUDGET of VMEM_LIMIT, where that is no TPU JAX knows)."""
    if device_kind is None:
        from .._core import sharding as _sharding

        device = _sharding.lowering_device()
        if device is not None and getattr(device, "platform", None) == "tpu":
            device_kind = getattr(device, "device_kind", None)
    try:
        info = pltpu.get_tpu_info_for_chip(pltpu.ChipVersion(_CHIPS[device_kind]), 1)
    except (KeyError, ValueError, AttributeError):
        return Vmem(VMEM_BUDGET, VMEM_LIMIT)
    limit = max(VMEM_LIMIT, min(info.vmem_capacity_bytes // 2, MAX_VMEM_LIMIT))
    return Vmem(VMEM_BUDGET * limit // VMEM_LIMIT, limit)


def chunks_down_to(shortest: int) -> tuple[int, ...]:
    """`geometry`'s `chunk_sizes` from CHUNK rows down to `shortest` by halves, longest first."""
    return tuple(CHUNK >> n for n in range(int(math.log2(CHUNK // shortest)) + 1))


def geometry(P: int, N: int, Q: int, *, vmem_bytes, budget: int | None = None,
             layout: str | None = None, chunk_sizes=(CHUNK, CHUNK // 2),
             sublanes: int = SUBLANES) -> Geometry | None:
    """The geometry of a call whose VMEM need is `vmem_bytes(geometry)`: the widest row tile
    (most sublanes, at most `sublanes`) that fits `budget` (VMEM_BUDGET), with chunks of the
    first of `chunk_sizes` that fits (by default CHUNK rows or half as many: a grid step still
    walks a hundred rows and more). `layout`: `choose_layout`'s, unless given. None when no row
    tile fits (systems too long for a kernel that keeps all their rows: the caller runs XLA's
    loop)."""
    layout = layout or choose_layout(P, Q)
    if layout == "lanes":
        s, w = min(sublanes, -(-Q // LANES)), LANES
    elif layout == "sublanes":
        s, w = min(sublanes, P), min(Q, LANES)
    else:
        s, w = min(sublanes, -(-P // LANES)), LANES
    while s >= 1:
        for chunk in chunk_sizes:
            chunks = 1 if N <= chunk else -(-N // chunk)
            g = Geometry(layout, P, N, Q, s, w, chunk, chunks)
            if vmem_bytes(g) <= (VMEM_BUDGET if budget is None else budget):
                return g
        s //= 2
    return None


# ---------------------------------------------------------------------------------------------
# Operands: how each is passed, and its rows inside the kernel.


@dataclasses.dataclass(frozen=True)
class Operand:
    """How one operand reaches the kernel: `kind` is "rows" (full along N, read row by row,
    straight from its block or from a float32 stage), "tile" (broadcast along N: one row tile
    per group) or "scalar" (one value per row for every system, in SMEM). `staged`: its rows
    are read from a float32 stage filled from the block at each chunk. `p_full`: full along P
    (else its block index along P is 0)."""

    kind: str
    staged: bool = False
    p_full: bool = True


def staged(g: Geometry, dtype) -> bool:
    """Whether rows of this dtype are staged in float32 (not read from the block itself)."""
    return g.layout != "lanes" or jnp.dtype(dtype).itemsize < 4


def operand(g: Geometry, shape, dtype) -> Operand:
    """How a (P|1, N|1, Q|1) operand of this shape and dtype reaches the kernel (module
    docstring): broadcast along N, a tile; one band for every system, SMEM scalars; in
    "lanes", a band constant along Q, SMEM scalars per p, and others rows read in place (a
    band shared along P too); in the other layouts, rows staged (partial broadcasts
    broadcast first)."""
    p, n, q = shape
    if n == 1 and g.N > 1:
        return Operand("tile")
    if p == 1 and q == 1 and (g.P > 1 or g.Q > 1):
        return Operand("scalar", p_full=False)
    if g.layout == "lanes" and q == 1 and g.Q > 1:
        return Operand("scalar", p_full=p > 1)
    if g.layout == "lanes":
        return Operand("rows", staged=staged(g, dtype), p_full=p > 1)
    return Operand("rows", staged=True)


def prepare(g: Geometry, x):
    """The array to pass for a (P|1, N|1, Q|1) operand, and its `Operand`: tiles and SMEM
    scalars in float32, "transposed" rows as (P, N)."""
    op = operand(g, x.shape, x.dtype)
    p, n, q = x.shape
    if op.kind == "tile":
        return tiles_of(g, x), op
    if op.kind == "scalar":
        return x.reshape(p, n).astype(jnp.float32), op
    if g.layout == "lanes":
        return x, op
    x = jnp.broadcast_to(x, (g.P, n, g.Q))  # the partial broadcasts this layout does not read
    if g.layout == "transposed":
        x = x.reshape(g.P, n)
    return x, op


def tiles_of(g: Geometry, x):
    """(G0, G1, s, w) float32 row tiles of a (P|1, 1, Q|1) operand: group (g0, g1)'s values laid
    out as its row tiles hold its systems."""
    G0, G1 = g.groups
    x = jnp.broadcast_to(x.astype(jnp.float32), (g.P, 1, g.Q))[:, 0, :]
    if g.layout == "lanes":
        width = G1 * g.s * LANES
        x = jnp.pad(x, ((0, 0), (0, width - g.Q)))
        return x.reshape(G0, G1, g.s, LANES)
    if g.layout == "sublanes":
        x = jnp.pad(x, ((0, G0 * g.s - g.P), (0, G1 * g.w - g.Q)))
        return x.reshape(G0, g.s, G1, g.w).transpose(0, 2, 1, 3)
    x = jnp.pad(x[:, 0], (0, G0 * g.s * LANES - g.P))
    return x.reshape(G0, 1, g.s, LANES)


def from_tiles(g: Geometry, t):
    """The (P, 1, Q) array of (G0, G1, s, w) row tiles (the inverse of `tiles_of`)."""
    G0, G1 = g.groups
    if g.layout == "lanes":
        return t.reshape(G0, G1 * g.s * LANES)[:, : g.Q][:, None, :]
    if g.layout == "sublanes":
        x = t.transpose(0, 2, 1, 3).reshape(G0 * g.s, G1 * g.w)
        return x[: g.P, : g.Q][:, None, :]
    return t.reshape(G0 * g.s * LANES)[: g.P].reshape(g.P, 1, 1)


def block_spec(g: Geometry, op: Operand, chunk_of, stack: int | None = None):
    """The BlockSpec of a prepared operand `x`; `chunk_of(k)` is the chunk grid step k reads.
    `stack`: the operand is a stack of that many operands on a leading axis (a banded matrix's
    bands), every block holding all of them."""
    if op.kind == "tile":
        spec = ((None, None, g.s, g.w), lambda a, b, k: (a, b, 0, 0))
    elif op.kind == "scalar":
        spec = ((1, g.scalar_rows), lambda a, b, k: (a if op.p_full else 0, chunk_of(k)))
    elif g.layout == "lanes":
        spec = ((1, g.rows, g.s * LANES),
                lambda a, b, k: (a if op.p_full else 0, chunk_of(k), b))
    elif g.layout == "sublanes":
        spec = ((g.s, g.rows, g.w), lambda a, b, k: (a, chunk_of(k), b))
    else:
        spec = ((g.s * LANES, g.rows), lambda a, b, k: (a, chunk_of(k)))
    shape, index = spec
    if stack is not None:
        shape, index = (stack, *shape), (lambda a, b, k, index=index: (0, *index(a, b, k)))
    space = {"memory_space": pltpu.SMEM} if op.kind == "scalar" else {}
    return pl.BlockSpec(shape, index, **space)


def stage_shape(g: Geometry) -> tuple[int, int]:
    """Shape of a float32 stage holding one chunk (`rows_shape` with `g.rows` rows)."""
    return rows_shape(g, g.rows)


def rows_shape(g: Geometry, rows: int) -> tuple[int, int]:
    """Shape of a float32 scratch holding `rows` row tiles: (rows, s*128) for "lanes" and
    "transposed" (a row is one sublane of each of s tiles), (s*rows, w) for "sublanes" (a row
    is every rows-th sublane)."""
    if g.layout == "sublanes":
        return (g.s * rows, g.w)
    return (rows, g.s * LANES)


class RowRef:
    """Row tiles stored in a 2D float32 ref in `rows_shape` form (a stage, a scratch, or a
    float32 "lanes" block), rows `offset`, `offset` + 1, ... of it."""

    def __init__(self, g: Geometry, ref, rows: int, offset=0):
        self.g, self.ref, self.rows, self.offset = g, ref, rows, offset

    def at(self, offset) -> RowRef:
        return RowRef(self.g, self.ref, self.rows, offset)

    def _index(self, i):
        if self.g.layout == "sublanes":
            return pl.ds(self.offset + i, self.g.s, stride=self.rows)
        return pl.ds(self.offset + i, 1)

    def load(self, i):
        value = self.ref[self._index(i), :]
        return value if self.g.layout == "sublanes" else value.reshape(self.g.tile)

    def store(self, i, value):
        if self.g.layout != "sublanes":
            value = value.reshape(1, self.g.s * LANES)
        self.ref[self._index(i), :] = value.astype(self.ref.dtype)

    def load_rows(self, i, count: int, stride: int):
        """Rows i, i + stride, ..., `count` of them, as one (count, w) value: a strided load
        along sublanes, for row tiles of one sublane (Mosaic loads strided from a base of 128
        lanes only)."""
        return self.ref[pl.ds(self.offset + i, count, stride=stride), :].astype(jnp.float32)

    def store_rows(self, i, value, stride: int):
        """`load_rows`' inverse: value's rows to rows i, i + stride, ..."""
        self.ref[pl.ds(self.offset + i, value.shape[0], stride=stride), :] = value.astype(self.ref.dtype)


class SplitRows:
    """A complex operand's (or scratch's) rows as two row accesses of the same kind, its real
    and imaginary parts: loads give `SplitComplex` tiles."""

    def __init__(self, re, im):
        self.re, self.im = re, im

    def load(self, i):
        return SplitComplex(self.re.load(i), self.im.load(i))

    def store(self, i, value):
        value = as_split(value)
        self.re.store(i, value.re)
        self.im.store(i, value.im)

    def load_rows(self, i, count: int, stride: int):
        return SplitComplex(self.re.load_rows(i, count, stride), self.im.load_rows(i, count, stride))

    def store_rows(self, i, value, stride: int):
        value = as_split(value)
        self.re.store_rows(i, value.re, stride)
        self.im.store_rows(i, value.im, stride)


def joined(accesses):
    """One row access from the accesses of an operand's parts (one part: itself)."""
    return accesses[0] if len(accesses) == 1 else SplitRows(*accesses)


def block_rows(g: Geometry, blocks):
    """The rows of a "rows" block (an output's, a work array's), joined over its parts
    (`blocks`: one per part), read and written in place."""
    return joined([RowRef(g, ref.at[0], g.rows) for ref in blocks])


def scratch_rows(g: Geometry, refs, rows: int | None = None, offset=0):
    """The rows of a VMEM scratch (a stage, a work scratch of `rows` rows from `offset`),
    joined over its parts (`refs`: one per part)."""
    return joined([RowRef(g, ref, g.rows if rows is None else rows, offset) for ref in refs])


def split_dtype(dtype) -> tuple[int, jnp.dtype]:
    """How a kernel holds values of `dtype`: (its parts, the dtype of each): complex64 as two
    float32 parts, a real dtype as itself."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return 2, jnp.dtype(jnp.float32)
    return 1, dtype


def parts_of(x, complex_: bool):
    """The real arrays a kernel takes for `x`: its real and imaginary parts when the call is
    complex (a real `x` gets zeros), else `x` itself. XLA's TPU backend splits a complex64
    array with copies (X64SplitLow/High custom calls, each given a buffer of its own), so a
    complex operand is read, written as its two parts and read again by the kernel."""
    if not complex_:
        return (x,)
    return tuple(part(x).astype(jnp.float32) for part in (jnp.real, jnp.imag))


def part_readers(g: Geometry, ops, groups, stages):
    """The row access of each operand (`reader`), joined over its parts: `groups` holds each
    operand's blocks (one per part); a staged one fills the next of `stages` (consumed)."""
    readers = []
    for op, refs in zip(ops, groups, strict=True):
        accesses = []
        for ref in refs:
            stage = stages.pop(0) if op.kind == "rows" and op.staged else None
            if stage is not None:
                stage_in(g, ref, stage)
            accesses.append(reader(g, op, ref, stage))
        readers.append(joined(accesses))
    return readers


class CarryTiles:
    """A carry scratch of row tiles (what a kernel keeps from one grid step to the next), its
    values in `parts`: a complex value's real and imaginary parts are tiles 2n and 2n + 1, and
    a real tile stored in a complex carry gets a zero imaginary part."""

    def __init__(self, ref, parts: int):
        self.ref, self.parts = ref, parts

    def get(self, n):
        if self.parts == 1:
            return self.ref[n]
        return SplitComplex(self.ref[2 * n], self.ref[2 * n + 1])

    def set(self, n, value):
        if self.parts == 1:
            self.ref[n] = value
        else:
            value = as_split(value)
            self.ref[2 * n], self.ref[2 * n + 1] = value.re, value.im

    def load(self, count):
        return tuple(self.get(n) for n in range(count))

    def store(self, values):
        for n, value in enumerate(values):
            self.set(n, value)


def stage_out_parts(g: Geometry, source, blocks):
    """`stage_out` for each part of a `joined` scratch (`blocks`: the outputs of the parts)."""
    sources = (source.re, source.im) if isinstance(source, SplitRows) else (source,)
    for part, block in zip(sources, blocks, strict=True):
        stage_out(g, part, block)


class TileRef:
    """An operand broadcast along N: the same row tile at every row."""

    def __init__(self, ref):
        self.ref = ref

    def load(self, i):
        del i
        return self.ref[...]

    def load_rows(self, i, count: int, stride: int):
        del stride
        value = self.load(i)  # a row tile of one sublane
        return jnp.broadcast_to(value, (count, value.shape[-1]))


class ScalarRef:
    """A band shared by every system: row i is one SMEM value, splat over the row tile."""

    def __init__(self, g: Geometry, ref):
        self.g, self.ref = g, ref

    def load(self, i):
        return jnp.full(self.g.tile, self.ref[0, i], jnp.float32)

    def load_rows(self, i, count: int, stride: int):
        """Rows i, i + stride, ... (each one value for every system), one per sublane."""
        shape = (count, self.g.w)
        sublane = lax.broadcasted_iota(jnp.int32, shape, 0)
        value = jnp.full(shape, self.ref[0, i], jnp.float32)
        for n in range(1, count):
            value = jnp.where(sublane == n, self.ref[0, i + n * stride], value)
        return value


def stage_in(g: Geometry, block, stage, offset=0, rows: int | None = None):
    """Fill a float32 stage (`stage_shape`, or `rows_shape` of `rows` rows: `offset` + g.rows
    unless given) with the chunk's rows of a "rows" block, from row `offset` of the stage on
    (traced where `rows` is given: a chunk of a scratch holding every chunk)."""
    total = offset + g.rows if rows is None else rows
    if g.layout == "lanes":
        stage[pl.ds(offset, g.rows), :] = block[0].astype(jnp.float32)
    elif g.layout == "sublanes":
        for p in range(g.s):
            stage[pl.ds(p * total + offset, g.rows), :] = block[p].astype(jnp.float32)
    else:
        for j in range(g.s):
            lanes = slice(j * LANES, (j + 1) * LANES)
            stage[pl.ds(offset, g.rows), lanes] = block[lanes, :].astype(jnp.float32).T


def stage_out(g: Geometry, source: RowRef, block):
    """Write the chunk's rows held in `source` (rows source.offset ... + g.rows of a scratch of
    source.rows rows) to an output block, converted to its dtype (and transposed back)."""
    rows, start = g.rows, source.offset
    if g.layout == "lanes":
        block[0] = source.ref[pl.ds(start, rows), :].astype(block.dtype)
    elif g.layout == "sublanes":
        for p in range(g.s):
            block[p] = source.ref[pl.ds(p * source.rows + start, rows), :].astype(block.dtype)
    else:
        for j in range(g.s):
            lanes = slice(j * LANES, (j + 1) * LANES)
            block[lanes, :] = source.ref[pl.ds(start, rows), lanes].T.astype(block.dtype)


def aligned(offset):
    """`offset` (a traced multiple of the rows of a chunk) marked as a multiple of 16, so that
    Mosaic loads whole tiles of the scratch at it."""
    return offset if isinstance(offset, int) else pl.multiple_of(offset, 16)


def reader(g: Geometry, op: Operand, ref, stage):
    """The row access of an operand inside the kernel: its block ref (and stage, if staged)."""
    if op.kind == "tile":
        return TileRef(ref)
    if op.kind == "scalar":
        return ScalarRef(g, ref)
    if op.staged:
        return RowRef(g, stage, g.rows)
    return RowRef(g, ref.at[0], g.rows)


def compiler_params(vmem_limit: int):
    """Mosaic's parameters: the groups of systems are independent ("parallel": a megacore
    chip splits them between its TensorCores), the chunks are walked in order, and the scoped
    VMEM the kernel asks for."""
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                vmem_limit_bytes=vmem_limit)


def interpret_params():
    """TPU interpret mode's parameters for the tests: VMEM starts as NaNs, so that a value read
    before it is written shows."""
    return pltpu.InterpretParams(uninitialized_memory="nan")


def call(kernel, g: Geometry, inputs, in_specs, out_shapes, out_specs, scratch, *, steps: int,
         name: str, vmem_limit: int = VMEM_LIMIT, interpret=None):
    """pallas_call over the grid (groups along P, groups along Q, `steps`)."""
    G0, G1 = g.groups
    return pl.pallas_call(
        kernel,
        out_shape=tuple(out_shapes),
        grid=(G0, G1, steps),
        in_specs=list(in_specs),
        out_specs=tuple(out_specs),
        scratch_shapes=list(scratch),
        compiler_params=None if interpret else compiler_params(vmem_limit),
        interpret=interpret if interpret else False,
        name=name,
    )(*inputs)


# VMEM Mosaic allots beside a kernel's buffers and scratch (its internal scratch, which the
# compiler counts in the kernel's scoped VMEM): every plan leaves room for it.
MOSAIC_SCRATCH = 64 << 10


def carry_bytes(g: Geometry, tiles: int) -> int:
    """VMEM bytes of a carry scratch of `tiles` row tiles, (tiles, s, 128) float32: each row
    tile pads to whole (8, 128) tiles, whatever its sublanes s."""
    return tiles * _round_up(g.s, SUBLANES) * LANES * 4


def vmem_need(g: Geometry, operands, *, stages: int, scratch_rows: int, outputs,
              carry_tiles: int = 0) -> int:
    """VMEM bytes of a kernel: two buffers of every block (`operands`: (Operand, itemsize)
    pairs; `outputs`: itemsizes of "rows" outputs), `stages` float32 stages of a chunk,
    scratches of `scratch_rows` row tiles in all (stored as rows of (rows, s*128) arrays), a
    carry of `carry_tiles` row tiles (`carry_bytes`) and Mosaic's own scratch."""
    total = carry_bytes(g, carry_tiles) + MOSAIC_SCRATCH
    for op, itemsize in operands:
        if op.kind == "rows":
            total += 2 * g.block_bytes(itemsize)
        elif op.kind == "tile":
            total += 2 * SUBLANES * LANES * 4
        else:
            total += 2 * SUBLANES * g.scalar_rows * 4  # SMEM, counted as VMEM-sized to be safe
    total += sum(2 * g.block_bytes(itemsize) for itemsize in outputs)
    total += stages * math.prod(stage_shape(g)) * 4
    total += scratch_rows * g.row_tile_bytes()
    return total


def default_minor_to_major(shape, dtype) -> tuple[int, ...] | None:
    """The minor-to-major order of the default layout of a `dtype` array of `shape` on the
    device being lowered for (`_core/sharding.py`, `lowering_device`); None where that is no
    TPU or does not say."""
    from .._core import sharding as _sharding

    device = _sharding.lowering_device()
    if device is None or getattr(device, "platform", None) != "tpu":
        return None
    try:
        layout = device.client.get_default_layout(jnp.dtype(dtype), tuple(shape), device)
    except Exception:  # a client without default layouts: keep the order
        return None
    found = re.match(r"\{([\d,]*)", str(layout))
    return tuple(int(d) for d in found[1].split(",") if d) if found else None


def physical_order(shape, dtype) -> tuple[int, ...] | None:
    """The order, major to minor, in which the default layout of a `dtype` array of `shape`
    stores its dimensions (module docstring); None where that is the array's own (dimensions
    of size 1 aside) or unknown."""
    minor_to_major = default_minor_to_major(shape, dtype)
    if minor_to_major is None or sorted(minor_to_major) != list(range(len(shape))):
        return None
    order = tuple(reversed(minor_to_major))
    if [d for d in order if shape[d] > 1] == sorted(d for d in order if shape[d] > 1):
        return None
    return order


def in_physical_order(operands, axis: int, dtype):
    """`operands` (one rank, broadcasting together) transposed into `physical_order` of their
    broadcast shape, the solve axis in that order, and the function that transposes a result
    back. Where that order is the arrays' own or unknown: the operands, `axis` and the
    identity."""
    shape = tuple(max(d) for d in zip(*(x.shape for x in operands), strict=True))
    order = physical_order(shape, dtype)
    if order is None:
        return operands, axis, lambda x: x
    inverse = tuple(order.index(d) for d in range(len(order)))
    return ([jnp.transpose(x, order) for x in operands], order.index(axis),
            lambda x: jnp.transpose(x, inverse))


@functools.cache
def available() -> bool:
    """Whether this JAX has Pallas's Mosaic TPU backend."""
    return pltpu is not None and hasattr(pltpu, "CompilerParams")


def loop(count: int, body, carry, *, reverse: bool = False):
    """fori_loop over rows 0..count-1 (`reverse`: count-1 down to 0) of a chunk, never
    unrolled; `body(i, carry)`."""
    if not reverse:
        return lax.fori_loop(0, count, body, carry)
    return lax.fori_loop(0, count, lambda k, c: body(count - 1 - k, c), carry)


def over_rows(g: Geometry, j, fn) -> None:
    """Run `fn(count)` for chunk j (traced) with its count of valid rows as a Python int: the
    last chunk of ragged N gets a branch of its own, so that every row loop has static bounds."""
    if g.chunks == 1:
        fn(g.N)
        return
    last = g.N - (g.chunks - 1) * g.chunk
    if last == g.chunk:
        fn(g.chunk)
        return

    @pl.when(j < g.chunks - 1)
    def _():
        fn(g.chunk)

    @pl.when(j == g.chunks - 1)
    def _():
        fn(last)
