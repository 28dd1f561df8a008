"""Block-tridiagonal solves as a Pallas Mosaic TPU kernel over the (P, N, Q) view.

The algorithm is block Thomas, as `_xla_block.solve_pnq` states it for every backend, step for
step in float32: row block i forms S = D'[i] - L'[i] E[i-1] and t = b[i] - L'[i] y[i-1] and
eliminates S column by column (kind "block_pivoted": swapping up the row of largest |S[r, c]|,
first of equals, a NaN first, as jnp.argmax; "block_hermitian": no swaps, a pivot that is not
positive made NaN), then x[N-1] = y[N-1], x[i] = y[i] - E[i] x[i+1]. L', D', U' are the blocks
of A, or of A^T when `transposed` (L'[i] = U[i-1]^T, D'[i] = D[i]^T, U'[i] = L[i+1]^T).

No row reads ahead into the next chunk: E[i] = S_i^-1 U'[i] needs U'[i], which is L[i+1]^T
when transposed, so row i keeps S_i's elimination (its multipliers, U and 1/pivot, and the
pivot rows: k*k + k row tiles) and y[i] in the carry, and row i+1 applies it to U'[i] (carried
from row i, or read at row i+1 when transposed). The elimination applied later is the one
applied to the augmented columns [U'[i] | t] at once, in the same order, so the values are
those of the XLA kernel. E[i-1] is stored at row i of its scratch, which the backward sweep
reads one row early, as the tridiagonal kernels store c'[i-1].

Systems are grouped into row tiles and rows into chunks as `_pallas/tpu.py` describes, in its
"lanes" layout only: row tiles of s x 128 consecutive systems along the last batch axis, with
Q == 1 batch-first systems (P, N, 1) taken as (1, N, P), and the k x k entries of a block row
between the rows and the systems, (P, N, k, k, Q): the order in which a TPU stores
(..., N, ..., k, k) blocks batched along a long axis (`f32[1000, 4096, 2, 2]` lies as
(1000, 2, 2, 4096)), so that the kernel's operands are the arrays as stored. Entry (r, c) of
block row i is one sublane of a (k, s*128) tile of the block, loaded at row i (a dynamic
index along an untiled axis: bfloat16 loads too, no stage). E and y stay in VMEM scratch for
the whole system (one row tile per entry and row), so the row tile narrows as N grows. The
grid walks each group's chunks forward, then backward, in one pallas_call: every input is read
once and x written once. Systems too long for VMEM (`fits`) run the same sweeps in two
kernels (`_streamed_call`): the forward one writes E and y to float32 arrays in HBM (rows
minor, `work_arrangement`), the backward one reads them last chunk first; XLA's loop runs only
where not even their chunks fit.

Operands as `_tpu.operand` classifies them: blocks shared by every system are SMEM scalars
(a stack of k*k (P|1, N) arrays, entries first), blocks constant along N one row tile per
entry, others rows.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .._core.split_complex import SplitComplex, as_split, select
from .._pallas import tpu as _tpu
from . import xla as _xla
from .elimination import Elimination, apply, carry_size, eliminate, product

KINDS = _xla.KINDS


def _transpose(A):
    return [list(col) for col in zip(*A, strict=True)]


def _conj(A):
    """The entries' complex conjugates (real entries as they are)."""
    return [[SplitComplex(v.re, -v.im) if isinstance(v, SplitComplex) else v for v in row]
            for row in A]


def _parts(value, parts: int):
    """The `parts` real tiles of a value (real, or `SplitComplex` when parts is 2)."""
    if parts == 1:
        return (value,)
    value = as_split(value)
    return (value.re, value.im)


def _combine(parts):
    """Lists of rows of tiles, one per part, as one list of rows of values."""
    if len(parts) == 1:
        return parts[0]
    return [[SplitComplex(re, im) for re, im in zip(*rows, strict=True)]
            for rows in zip(*parts, strict=True)]


# ---------------------------------------------------------------------------------------------
# Operands.


ROLES = (("n", "r", "c"), ("n", "c", "r"), ("r", "c", "n"))


@dataclasses.dataclass(frozen=True)
class Arrangement:
    """The order of a "rows" operand's dimensions in the kernel: (p, *roles, q), the systems
    along lanes last; `roles` orders its rows ("n") and its entries' rows and columns ("r",
    "c"; left out where of size 1), as the TPU stores the operand (`arrangement`)."""

    roles: tuple[str, ...]
    r: int
    c: int

    def sizes(self, rows: int) -> tuple[int, ...]:
        return tuple({"n": rows, "r": self.r, "c": self.c}[role] for role in self.roles)

    def view(self, x):
        """A (p, n, q, r, c) operand as the kernel takes it."""
        p, n, q, _, _ = x.shape
        x = jnp.transpose(x, (0, 3, 4, 1, 2))  # (p, r, c, n, q)
        kept = [role for role in ("r", "c", "n") if role in self.roles]
        x = x.reshape(p, *(x.shape[1 + ("r", "c", "n").index(role)] for role in kept), q)
        return jnp.transpose(x, (0, *(1 + kept.index(role) for role in self.roles),
                                 len(kept) + 1))

    def unview(self, x, n: int):
        """`view`'s inverse: the kernel's output as (p, n, q, r, c)."""
        p, q = x.shape[0], x.shape[-1]
        kept = [role for role in ("r", "c", "n") if role in self.roles]
        x = jnp.transpose(x, (0, *(1 + self.roles.index(role) for role in kept),
                              len(kept) + 1))
        return jnp.transpose(x.reshape(p, self.r, self.c, n, q), (0, 3, 4, 1, 2))

    @property
    def rows_minor(self) -> bool:
        """Whether rows lie along sublanes (a row is one sublane of a (rows, 128) tile)."""
        return self.roles[-1] == "n"

    def index(self, i, a: int, b: int):
        """The index of entry (a, b) of row i in the kernel's block (the second-minor one a
        one-sublane slice); i None: every row."""
        out = [{"n": slice(None) if i is None else i, "r": a, "c": b}[role]
               for role in self.roles]
        if i is not None or not self.rows_minor:
            out[-1] = pl.ds(out[-1], 1)
        return (*out, slice(None))

    def spec(self, g, p_full: bool, chunk_of):
        place = self.roles.index("n")
        return pl.BlockSpec(
            (None, *self.sizes(g.rows), g.s * _tpu.LANES),
            lambda a, b, s: (a if p_full else 0,
                             *(chunk_of(s) if d == place else 0 for d in range(len(self.roles))),
                             b))


def arrangement(shape, dtype, r: int, c: int, *, swapped: bool,
                column_axis: bool = False) -> Arrangement:
    """How the kernel takes a (p, n, q, r, c) operand (`swapped`: Q == 1 systems, p and q
    exchanged): in the order the TPU being lowered for stores it (a bitcast), where that is one
    of ROLES with the systems minor. Elsewhere as a TPU stores such arrays: an entry axis whose
    size is a power of two as the second-minor (its (size, 128) tiles do not pad), else the
    rows ((8, 128) tiles of rows and systems). `column_axis`: the array as a user holds it
    has its column axis also where c == 1 (a factorization's pivots)."""
    # The layout of the array as a user holds it: no systems axis of size 1 (a TPU lays out
    # (4096, 1000, 1, 3, 3) otherwise than (4096, 1000, 3, 3)), and a vector right-hand side
    # has no column axis.
    entries = [d for d, size in ((3, r), (4, c)) if size > 1 or (d == 4 and column_axis)]
    dims = [d for d in (0, 1, 2) if shape[d] > 1 or d == 1] + entries
    query = tuple(shape[d] for d in dims)
    minor_to_major = _tpu.default_minor_to_major(query, dtype)
    sizes = dict(zip("pnqrc", shape, strict=True))
    if swapped:
        sizes["p"], sizes["q"] = sizes["q"], sizes["p"]
    kept = ("n", "c") if column_axis else ("n",)  # a column axis of size 1 kept: a bitcast
    candidates = [Arrangement(tuple(d for d in roles if d in kept or sizes[d] > 1), r, c)
                  for roles in ROLES]
    if minor_to_major is not None:
        system_names = ("q", "n", "p") if swapped else ("p", "n", "q")
        names = tuple(system_names[d] if d < 3 else "-rc"[d - 2] for d in dims)
        stored = [names[d] for d in reversed(minor_to_major) if query[d] > 1 or names[d] in kept]
        for candidate in candidates:
            order = ["p", *candidate.roles, "q"]
            if [d for d in order if d in stored] == stored:
                return candidate

    def tiles_whole(size):
        return 1 < size <= _tpu.SUBLANES and size & (size - 1) == 0

    if tiles_whole(c) or (c == 1 and tiles_whole(r)):
        return candidates[0]
    return candidates[1 if tiles_whole(r) else 2]


class _Entries:
    """Row i of a block operand (r x c entries per row) inside the kernel, as row tiles: its
    blocks `refs` (one per part: complex values' real and imaginary parts), and their float32
    `stages` where staged."""

    def __init__(self, g, op, refs, r: int, c: int, arranged: Arrangement | None = None,
                 stages=None):
        self.g, self.op, self.refs, self.r, self.c = g, op, refs, r, c
        self.arranged, self.stages = arranged, stages

    def stage_in(self):
        """Fill the float32 stages from the blocks (16-bit rows along sublanes: a packed row
        cannot be loaded at a dynamic index)."""
        for ref, stage in zip(self.refs, self.stages, strict=True):
            for a in range(self.r):
                for b in range(self.c):
                    stage[a * self.c + b] = ref[self.arranged.index(None, a, b)].astype(
                        jnp.float32)

    def load(self, i):
        """The r x c entries of row i (a list of rows of float32 tiles, or `SplitComplex`)."""
        stages = self.stages or (None,) * len(self.refs)
        return _combine([self._load(ref, stage, i)
                         for ref, stage in zip(self.refs, stages, strict=True)])

    def _load(self, ref, stage, i):
        g = self.g
        if self.op.kind == "tile":
            return [[ref[a * self.c + b] for b in range(self.c)] for a in range(self.r)]
        if self.op.kind == "scalar":
            return [[jnp.full(g.tile, ref[a * self.c + b, 0, i], jnp.float32)
                     for b in range(self.c)] for a in range(self.r)]
        if stage is not None:
            return [[stage[a * self.c + b, pl.ds(i, 1), :].reshape(g.tile)
                     for b in range(self.c)] for a in range(self.r)]
        return [[ref[self.arranged.index(i, a, b)].astype(jnp.float32).reshape(g.tile)
                 for b in range(self.c)] for a in range(self.r)]


class _Scratch:
    """r x c entries per row of a whole system: float32 (r*c*total_rows, s*128) scratches (one
    per part), entry e of row i at row e*total_rows + i."""

    def __init__(self, g, refs, r: int, c: int):
        self.g, self.refs, self.r, self.c = g, refs, r, c

    def _row(self, e: int, i):
        return pl.ds(e * self.g.total_rows + i, 1)

    def load(self, i):
        return _combine([[[ref[self._row(a * self.c + b, i), :].reshape(self.g.tile)
                           for b in range(self.c)] for a in range(self.r)] for ref in self.refs])

    def chunk(self, e: int, offset):
        """Entry e of the rows of the chunk at `offset` ((rows, s*128)), of a real scratch."""
        return self.refs[0][pl.ds(e * self.g.total_rows + offset, self.g.rows), :]

    def store(self, i, values):
        for a, row in enumerate(values):
            for b, v in enumerate(row):
                for ref, part in zip(self.refs, _parts(v, len(self.refs)), strict=True):
                    ref[self._row(a * self.c + b, i), :] = part.reshape(1, -1)


class _WorkBlocks:
    """r x c float32 entries per row of a chunk in the streamed kernels' work blocks (one per
    part), arranged rows minor (`work_arrangement`): what `_Scratch` holds for a whole system,
    one chunk at a time through HBM."""

    def __init__(self, g, refs, r: int, c: int):
        self.how = work_arrangement(r, c)
        self.refs, self.r, self.c = refs, r, c
        self.entries = _Entries(g, _tpu.Operand("rows"), refs, r, c, self.how)

    def load(self, i):
        return self.entries.load(i)

    def store(self, i, values):
        _entry_writer(self.refs, self.how, len(self.refs))(i, values)


def work_arrangement(r: int, c: int) -> Arrangement:
    """The streamed kernels' work arrays of r x c entries per row: rows minor, so that a row is
    one sublane of a (rows, 128) tile."""
    return Arrangement(tuple(d for d, size in (("r", r), ("c", c), ("n", 0)) if d == "n" or size > 1),
                       r, c)


# ---------------------------------------------------------------------------------------------
# The kernels.


class _Carry:
    """The carry scratch: row tiles, complex values as two (real and imaginary parts)."""

    def __init__(self, ref, parts: int):
        self.ref, self.parts = ref, parts

    def load(self, count, real=range(0)):
        """The first `count` values (`real`: the slots holding real values, the pivot rows)."""
        if self.parts == 1:
            return [self.ref[n] for n in range(count)]
        return [self.ref[2 * n] if n in real else
                SplitComplex(self.ref[2 * n], self.ref[2 * n + 1]) for n in range(count)]

    def store(self, values):
        for n, value in enumerate(values):
            for part, tile in enumerate(_parts(value, self.parts)):
                self.ref[self.parts * n + part] = tile


def _unflatten(values, k: int, c: int):
    return [list(values[a * c:(a + 1) * c]) for a in range(k)]


def _flat(A):
    return [v for row in A for v in row]


def _subtract(A, B):
    return [[a - b for a, b in zip(ra, rb, strict=True)] for ra, rb in zip(A, B, strict=True)]


def _forward(g, operands, es, ys, carry, *, j, offset, k, m, kind, transposed):
    """The forward sweep over chunk j (traced), from chunk 0's zero carry: E[i-1] and y[i]
    stored at row `offset` + i of `es` and `ys`."""
    pivoting, hermitian = kind == "block_pivoted", kind == "block_hermitian"
    lower, diag, *upper, rhs = operands
    n_fact = carry_size(k, pivoting)
    pivot_slots = range(n_fact - k, n_fact) if pivoting else range(0)  # real row numbers
    carried = _carried(k, m, kind)  # S's elimination, y[i-1], U[i-1] (unless Hermitian)
    start = j * g.chunk
    for operand in operands:
        if operand.stages is not None:
            operand.stage_in()

    @pl.when(j == 0)
    def _():
        carry.store([jnp.zeros(g.tile, jnp.float32)] * carried)  # real zeros: as_split gives the parts

    def run(count):
        def row(i, values):
            first = start + i == 0
            fact = Elimination.from_values(values[:n_fact], k, pivoting)
            y_prev = _unflatten(values[n_fact:n_fact + k * m], k, m)
            # U'[i-1] and L'[i]: U[i-1] and L[i], or L[i]^T and U[i-1]^T; a Hermitian
            # matrix has U[i-1] = L[i]^H.
            if hermitian:
                l_i = lower.load(i)
                sup_prev = _transpose(l_i) if transposed else _transpose(_conj(l_i))
                sub = _conj(l_i) if transposed else l_i
            else:
                u_prev = _unflatten(values[n_fact + k * m:], k, k)
                sup_prev = _transpose(lower.load(i)) if transposed else u_prev
                sub = _transpose(u_prev) if transposed else lower.load(i)
            # E[i-1] = S_{i-1}^-1 U'[i-1]
            e_prev = [[select(first, 0.0, v) for v in row] for row in apply(fact, sup_prev)]
            es.store(offset + i, e_prev)
            sub = [[select(first, 0.0, v) for v in row] for row in sub]
            d = _transpose(diag.load(i)) if transposed else diag.load(i)
            fact = eliminate(_subtract(d, product(sub, e_prev)), pivoting=pivoting,
                             hermitian=hermitian)
            y = apply(fact, _subtract(rhs.load(i), product(sub, y_prev)))
            ys.store(offset + i, y)
            return (*fact.values(), *_flat(y), *(v for u in upper for v in _flat(u.load(i))))

        carry.store(_tpu.loop(count, row, tuple(carry.load(carried, pivot_slots))))

    _tpu.over_rows(g, j, run)


def _backward(g, es, ys, carry, store_x, *, j, offset, k, m):
    """The back substitution over chunk j (traced), from the last chunk's zero carry: x[i] =
    y[i] - E[i] x[i+1] (E[i] stored at row i+1; zero at row N-1), written by `store_x(i, x)`."""
    @pl.when(j == g.chunks - 1)
    def _():
        carry.store([jnp.zeros(g.tile, jnp.float32)] * (k * m + k * k))

    def run(count):
        def row(i, values):
            x_next, e_next = _unflatten(values[:k * m], k, m), _unflatten(values[k * m:], k, k)
            x = _subtract(ys.load(offset + i), product(e_next, x_next))
            store_x(i, x)
            return (*_flat(x), *_flat(es.load(offset + i)))

        carry.store(_tpu.loop(count, row, tuple(carry.load(k * m + k * k)), reverse=True))

    _tpu.over_rows(g, j, run)


def _operands(g, ops, in_refs, arranged, staged, stages, *, k, m, parts):
    """The `_Entries` of the blocks and b (`stages` consumed by the staged ones)."""
    shapes = [(k, k)] * len(ops) + [(k, m)]
    return [_Entries(g, op, refs_, r, c, how, tuple(stages.pop(0) for _ in range(parts)) if stage else None)
            for op, refs_, (r, c), how, stage in zip(
                (*ops, _tpu.Operand("rows")), in_refs, shapes, arranged, staged, strict=True)]


def _grouped(refs, parts: int):
    return [tuple(refs[n:n + parts]) for n in range(0, len(refs), parts)]


def _entry_writer(refs, how: Arrangement, parts: int):
    """store(i, values): row i's r x c values into blocks arranged by `how` (one per part),
    converted to their dtype: `_backward`'s store_x into x's blocks, or a work block's."""
    def store(i, values):
        for a, row in enumerate(values):
            for b, v in enumerate(row):
                for ref, part in zip(refs, _parts(v, parts), strict=True):
                    ref[how.index(i, a, b)] = part.reshape(1, -1).astype(ref.dtype)

    return store


def _kernel(*refs, g, ops, arranged, staged, k, m, kind, transposed, parts):
    """Refs: the blocks' (lower, diag and, unless Hermitian, upper) and b's, x's block, the E
    and y scratches, the carry, the float32 stages of staged operands (`staged`: which of the
    inputs are); of each operand, output and scratch its `parts` (2: complex values' real and
    imaginary parts, one after the other)."""
    n_in = (len(ops) + 1) * parts
    in_refs = _grouped(refs[:n_in], parts)
    x_refs, e_refs, y_refs = _grouped(refs[n_in:n_in + 3 * parts], parts)
    carry_ref, *stages = refs[n_in + 3 * parts:]
    C = g.chunks
    step = pl.program_id(2)
    operands = _operands(g, ops, in_refs, arranged, staged, stages, k=k, m=m, parts=parts)
    es, ys = _Scratch(g, e_refs, k, k), _Scratch(g, y_refs, k, m)
    carry = _Carry(carry_ref, parts)
    out = arranged[-1]

    @pl.when(step < C)
    def _():
        _forward(g, operands, es, ys, carry, j=step, offset=step * g.rows, k=k, m=m, kind=kind,
                 transposed=transposed)

    @pl.when(step >= C)
    def _():
        j = 2 * C - 1 - step
        offset = j * g.rows
        in_place = out.rows_minor and x_refs[0].dtype.itemsize < 4  # x through y's scratch

        def store_in_place(i, x):
            ys.store(offset + i, x)

        store_x = store_in_place if in_place else _entry_writer(x_refs, out, parts)
        _backward(g, es, ys, carry, store_x, j=j, offset=offset, k=k, m=m)
        if in_place:
            for a in range(k):
                for b in range(m):
                    x_refs[0][out.index(None, a, b)] = ys.chunk(a * m + b, offset).astype(
                        x_refs[0].dtype)


def _streamed_forward(*refs, g, ops, arranged, staged, k, m, kind, transposed, parts):
    """The forward sweep of a system too long for VMEM: E and y written to float32 work
    blocks. Refs: the inputs' blocks (as `_kernel`'s), E's and y's work blocks, the carry, the
    stages of staged inputs; each in its `parts`."""
    n_in = (len(ops) + 1) * parts
    in_refs = _grouped(refs[:n_in], parts)
    e_refs, y_refs = _grouped(refs[n_in:n_in + 2 * parts], parts)
    carry_ref, *stages = refs[n_in + 2 * parts:]
    operands = _operands(g, ops, in_refs, arranged, staged, stages, k=k, m=m, parts=parts)
    _forward(g, operands, _WorkBlocks(g, e_refs, k, k), _WorkBlocks(g, y_refs, k, m),
             _Carry(carry_ref, parts), j=pl.program_id(2), offset=0, k=k, m=m, kind=kind,
             transposed=transposed)


def _streamed_backward(*refs, out, k, m, g, parts):
    """The back substitution of a system too long for VMEM, last chunk first, from E's and y's
    work blocks. Refs: those blocks, x's blocks, the carry, and a float32 stage of x's chunk
    where x is 16-bit with rows minor (a packed row cannot be stored at a dynamic index); each
    in its `parts`."""
    e_refs, y_refs, x_refs = _grouped(refs[:3 * parts], parts)
    carry_ref, *stage = refs[3 * parts:]
    ys = _WorkBlocks(g, y_refs, k, m)
    staged_x = _WorkBlocks(g, tuple(stage), k, m) if stage else None
    store_x = staged_x.store if stage else _entry_writer(x_refs, out, parts)
    _backward(g, _WorkBlocks(g, e_refs, k, k), ys, _Carry(carry_ref, parts), store_x,
              j=g.chunks - 1 - pl.program_id(2), offset=0, k=k, m=m)
    if stage:
        for a in range(k):
            for b in range(m):
                x_refs[0][out.index(None, a, b)] = stage[0][staged_x.how.index(None, a, b)].astype(
                    x_refs[0].dtype)


# ---------------------------------------------------------------------------------------------
# Planning and the call.


def _block_bytes(g, how: Arrangement, dtype) -> int:
    """VMEM bytes of one buffer of a "rows" operand's block: its second-minor dimension in
    whole tiles (8 rows; 16 for 16-bit types)."""
    itemsize = jnp.dtype(dtype).itemsize
    *major, minor = how.sizes(g.rows)
    tile = _tpu.SUBLANES * max(1, 4 // itemsize)
    return math.prod(major) * (-(-minor // tile) * tile) * g.s * _tpu.LANES * itemsize


def _operand_bytes(g, shape, dtype, how: Arrangement, r: int, c: int) -> int:
    """VMEM bytes of an input of r x c entries per row (`_tpu.operand`'s kind for its (p, n,
    q) `shape`): two buffers of its block, and its float32 stage where staged."""
    op = _tpu.operand(g, shape, dtype)
    if op.kind == "rows":
        stage = r * c * g.rows * g.row_tile_bytes() if _staged(how, dtype) else 0
        return 2 * _block_bytes(g, how, dtype) + stage
    if op.kind == "tile":
        return 2 * r * c * g.row_tile_bytes()
    return 2 * _tpu.SUBLANES * g.scalar_rows * r * c * 4


def _plan(P, N, Q, operands, out_dtype, *, k: int, m: int, kind: str, budget, streamed: bool = False):
    """The geometry of a solve of (P, N, Q) systems (the lanes view) in `budget` bytes of
    VMEM. `operands`: (shape (p, n, q), dtype, Arrangement) of the blocks and b. Complex
    calls hold two float32 parts of every operand, output and scratch. `streamed`: E and y go
    through HBM (`_streamed_forward`, `_streamed_backward`; both kernels' buffers counted)."""
    carried = _carried(k, m, kind)
    parts, out_dtype = _tpu.split_dtype(out_dtype)

    def need(g):
        columns = [k] * (len(operands) - 1) + [m]
        total = sum(_operand_bytes(g, shape, jnp.float32 if parts == 2 else dtype, how, k, c)
                    for (shape, dtype, how), c in zip(operands, columns, strict=True))
        total += 2 * _block_bytes(g, operands[-1][2], out_dtype)
        if streamed:  # two buffers of E's and y's work blocks, x's stage
            work = [_block_bytes(g, work_arrangement(k, c), jnp.float32) for c in (k, m)]
            total += 2 * sum(work) + work[1]
        else:
            total += (k * k + k * m) * g.total_rows * g.row_tile_bytes()
        return parts * total + _tpu.carry_bytes(g, carried * parts) + _tpu.MOSAIC_SCRATCH

    # the "lanes" layout whatever (P, Q) are; chunks down to 32 rows (large blocks take many
    # row tiles a row)
    return _tpu.geometry(P, N, Q, vmem_bytes=need, budget=budget, layout="lanes",
                         chunk_sizes=_tpu.chunks_down_to(32))


def _staged(how: Arrangement, dtype) -> bool:
    """Whether a "rows" operand is read through a float32 stage."""
    return how.rows_minor and jnp.dtype(dtype).itemsize < 4


def _swap(x):
    """Batch-first systems (Q == 1) along lanes: (P, N, 1, ...) as (1, N, P, ...)."""
    return jnp.swapaxes(x, 0, 2)


def _prepare(g, x, op, how: Arrangement):
    """The array to pass for a (p, n, q, r, c) operand."""
    p, n, q, r, c = x.shape
    if op.kind == "tile":
        return jnp.stack([_tpu.tiles_of(g, x[:, :, :, a, b]) for a in range(r)
                          for b in range(c)])
    if op.kind == "scalar":  # entries first, as a TPU stores (N, k, k) blocks
        return jnp.moveaxis(x[:, :, 0], (2, 3), (0, 1)).reshape(r * c, p, n).astype(jnp.float32)
    return how.view(x)


def _spec(g, op, chunk_of, how: Arrangement, entries: int):
    if op.kind == "rows":
        return how.spec(g, op.p_full, chunk_of)
    return _tpu.block_spec(g, op, chunk_of, stack=entries)


def _carried(k: int, m: int, kind: str) -> int:
    """Row tiles the forward sweep carries: S's elimination, y and (unless Hermitian) U."""
    return (carry_size(k, kind == "block_pivoted") + k * m
            + (0 if kind == "block_hermitian" else k * k))


def _setup(lower, diag, upper, b, out_dtype, *, kind, budget, streamed: bool = False):
    """The lanes view of the operands the kernel reads (a Hermitian matrix's upper blocks are
    its lower ones', not read), their arrangements and the geometry (None: too long for
    VMEM; `streamed`: for the streamed kernels)."""
    P, N, Q, k, m = b.shape
    swapped = Q == 1 and P > 1
    operands, views = [], []
    blocks = (lower, diag) if kind == "block_hermitian" else (lower, diag, upper)
    for x, c in [*((x, k) for x in blocks), (b, m)]:
        how = arrangement(x.shape, x.dtype, k, c, swapped=swapped)
        view = _swap(x) if swapped else x
        operands.append(((view.shape[0], view.shape[1], view.shape[2]), view.dtype, how))
        views.append(view)
    Pv, _, Qv = operands[-1][0]
    g = _plan(Pv, N, Qv, operands, out_dtype, k=k, m=m, kind=kind, budget=budget, streamed=streamed)
    return g, views, operands, swapped


def fits(P: int, N: int, Q: int, dtype, *, k: int, m: int = 1, kind: str = "block",
         budget=None) -> bool:
    """Whether a solve of (P, N, Q) systems of k x k blocks fits `budget` bytes of VMEM (all
    operands full; None: `_tpu.VMEM_BUDGET`)."""
    blocks = [jax.ShapeDtypeStruct((P, N, Q, k, k), dtype)] * 3
    b = jax.ShapeDtypeStruct((P, N, Q, k, m), dtype)
    g, *_ = _setup(*blocks, b, dtype, kind=kind,
                   budget=_tpu.VMEM_BUDGET if budget is None else budget)
    return g is not None


def solve_pnq(lower, diag, upper, b, *, kind: str, transposed: bool, out_dtype, interpret=None):
    """Solve A x = b (A^T x = b when `transposed`) for every block-tridiagonal system along
    axis 1, with the semantics of `_xla_block.solve_pnq`: `lower`, `diag`, `upper` (P|1, N|1,
    Q|1, k, k) blocks, `b` (P, N, Q, k, m). Returns x, (P, N, Q, k, m) of `out_dtype`.
    `interpret`: Pallas's interpret mode (`pltpu.InterpretParams`, or True) to run on CPU.
    Systems too long for VMEM (`fits`) run in two kernels whose E and y go through HBM (XLA's
    loop where not even their chunks fit). Kind "block_hermitian" takes
    upper[i] = lower[i+1]^T (as `solveh_block_tridiagonal` binds it) and reads it from
    `lower`, so that XLA need not form `upper`."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    P, N, Q, k, m = b.shape
    out_dtype = jnp.dtype(out_dtype)
    _tpu.check_dtype(out_dtype)
    if b.size == 0:
        return jnp.zeros(b.shape, out_dtype)
    budget = _tpu.vmem()
    g, views, operands, swapped = _setup(lower, diag, upper, b, out_dtype, kind=kind,
                                         budget=budget.budget)
    streamed = g is None
    if streamed:
        g, views, operands, swapped = _setup(lower, diag, upper, b, out_dtype, kind=kind,
                                             budget=budget.budget, streamed=True)
    if g is None:
        return _xla.solve_pnq(lower, diag, upper, b, kind=kind, transposed=transposed,
                              out_dtype=out_dtype)
    parts, part_dtype = _tpu.split_dtype(out_dtype)
    complex_ = parts == 2
    ops = [_tpu.operand(g, shape, dtype) for shape, dtype, _ in operands[:-1]]
    arranged = [how for _, _, how in operands]
    rows = _tpu.Operand("rows")
    C = g.chunks

    def chunk_in(s):
        return jnp.minimum(s, C - 1)

    def chunk_out(s):
        return jnp.clip(2 * C - 1 - s, 0, C - 1)

    inputs = [_prepare(g, part, op, how)
              for x, op, how in zip(views, (*ops, rows), arranged, strict=True)
              for part in _tpu.parts_of(x, complex_)]
    entries = (k * k,) * len(ops) + (k * m,)
    in_specs = [_spec(g, op, chunk_in, how, e)
                for op, how, e in zip((*ops, rows), arranged, entries, strict=True)
                for _ in range(parts)]
    staged = [op.kind == "rows" and _staged(how, part_dtype if complex_ else x.dtype)
              for op, how, x in zip((*ops, rows), arranged, views, strict=True)]
    vmem = _tpu.pltpu.VMEM
    lanes = g.s * _tpu.LANES
    carried = _carried(k, m, kind)
    stages = [vmem((e, g.rows, lanes), jnp.float32)
              for e, stage in zip(entries, staged, strict=True) if stage for _ in range(parts)]
    out_shape = jax.ShapeDtypeStruct(inputs[-1].shape, part_dtype)
    call = functools.partial(_tpu.call, vmem_limit=budget.limit, interpret=interpret)
    if streamed:
        x = _streamed_call(call, g, inputs, ops, arranged, staged, stages, out_shape, k=k, m=m,
                           kind=kind, transposed=transposed, parts=parts)
    else:
        scratch = [vmem((k * k * g.total_rows, lanes), jnp.float32)] * parts
        scratch += [vmem((k * m * g.total_rows, lanes), jnp.float32)] * parts
        scratch += [vmem((carried * parts, *g.tile), jnp.float32)]
        kernel = functools.partial(_kernel, g=g, ops=ops, arranged=arranged, staged=staged, k=k,
                                   m=m, kind=kind, transposed=transposed, parts=parts)
        x = call(kernel, g, inputs, in_specs, [out_shape] * parts,
                 [_spec(g, rows, chunk_out, arranged[-1], k * m)] * parts, scratch + stages,
                 steps=2 * C, name=f"tridiax_{kind}_tpu")
    return joined(x, arranged[-1], N, swapped)


def joined(parts, how: Arrangement, n: int, swapped: bool):
    """A kernel's result, its parts (complex values' real and imaginary parts, or one real
    array) arranged by `how`, as one (P, N, Q, r, c) array (batch-first systems swapped back)."""
    x = [how.unview(part, n) for part in parts]
    x = jax.lax.complex(*x) if len(x) == 2 else x[0]
    return _swap(x) if swapped else x


def _streamed_call(call, g, inputs, ops, arranged, staged, stages, out_shape, *, k, m, kind,
                   transposed, parts):
    """The two streamed kernels (`call`: `_tpu.call` with the VMEM limit): the forward sweep
    reads every input once and writes E and y (float32, rows minor) chunk by chunk, the back
    substitution reads them last chunk first and writes x."""
    C, rows = g.chunks, _tpu.Operand("rows")
    vmem = _tpu.pltpu.VMEM
    Pv, Qv = inputs[-1].shape[0], inputs[-1].shape[-1]
    works = [work_arrangement(k, k), work_arrangement(k, m)]
    work_shapes = [jax.ShapeDtypeStruct((Pv, *how.sizes(g.N), Qv), jnp.float32)
                   for how in works for _ in range(parts)]

    def forward_chunk(s):
        return s

    def backward_chunk(s):
        return C - 1 - s

    def work_specs(chunk_of):
        return [how.spec(g, True, chunk_of) for how in works for _ in range(parts)]

    entries = (k * k,) * len(ops) + (k * m,)
    in_specs = [_spec(g, op, forward_chunk, how, e)
                for op, how, e in zip((*ops, rows), arranged, entries, strict=True)
                for _ in range(parts)]
    kernel = functools.partial(_streamed_forward, g=g, ops=ops, arranged=arranged, staged=staged,
                               k=k, m=m, kind=kind, transposed=transposed, parts=parts)
    scratch = [vmem((_carried(k, m, kind) * parts, *g.tile), jnp.float32), *stages]
    work = call(kernel, g, inputs, in_specs, work_shapes, work_specs(forward_chunk), scratch,
                steps=C, name=f"tridiax_{kind}_forward_tpu")
    out = arranged[-1]
    scratch = [vmem(((k * m + k * k) * parts, *g.tile), jnp.float32)]
    if out.rows_minor and out_shape.dtype.itemsize < 4:
        scratch.append(vmem((*works[1].sizes(g.rows), g.s * _tpu.LANES), jnp.float32))
    kernel = functools.partial(_streamed_backward, out=out, k=k, m=m, g=g, parts=parts)
    return call(kernel, g, work, work_specs(backward_chunk), [out_shape] * parts,
                [_spec(g, rows, backward_chunk, out, k * m)] * parts, scratch, steps=C,
                name=f"tridiax_{kind}_backward_tpu")
