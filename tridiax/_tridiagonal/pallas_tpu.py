"""Tridiagonal solves and factorizations as Pallas Mosaic TPU kernels over the (P, N, Q) view.

Row i reads sub[i]*x[i-1] + d[i]*x[i] + sup[i]*x[i+1] = b[i], with sub = l, sup = u, or, when
`transposed` (the solve that gradients run), sub[i] = u[i-1], sup[i] = l[i+1]: the same
conventions, kinds and divisions as `_tridiagonal/xla.py` and `verify.sequential_solve`,
computed in float32. Kinds (`_tridiagonal/primitive.py`):

- "thomas": p[i] = d[i] - sub[i]*c'[i-1], c'[i] = sup[i] / p[i], y'[i] = (b[i] -
  sub[i]*y'[i-1]) / p[i]; back substitution x[i] = y'[i] - c'[i]*x[i+1];
- "factored": (l, m, c') of A = L D V: y[i] = b[i] - sub[i]*y[i-1], x[i] = m[i]*y[i] -
  c'[i]*x[i+1] (sub, sup: the factors' bands);
- "periodic": the "thomas" sweep of T' = A - u v^T (`_tridiagonal/periodic.py`: the split
  gamma from row 0, alpha = l[0], beta = u[N-1]) with z' riding along, then x = y - f z. The
  transposed solve runs A^T = T'^T + v u^T, the same T' (its split is A's, read at row 0): z
  = T'^{-T} v, f = (u.y) / (1 + u.z), so no value is needed before the row that holds it
  (the split of A^T would need u[N-1] at row 0);
- "pivoted": partial pivoting in LAPACK gtsv's order (`_xla.pivot_step`), U's rows (pivot, U1,
  U2, y) kept, back substitution x[i] = (y[i] - U1[i]*x[i+1] - U2[i]*x[i+2]) / pivot[i];
- "periodic_pivoted": "periodic" with T' eliminated by the "pivoted" sweep, z's right-hand side
  beside b's (one launch, where `_tridiagonal/periodic.py`'s `solve_pivoted` stacks them).

Systems are grouped into row tiles and rows into chunks as `_pallas/tpu.py` describes. The grid
walks each group's chunks in phases, in one pallas_call: steps 0..C-1 eliminate chunk k
forward, keeping each row's work values (c' and y'; z' too; U's rows) in VMEM scratch that
holds the whole system; steps C..2C-1 substitute back from the last chunk to the first and
write x; a periodic solve walks its chunks a third time to write y - f z once f (which needs
row 0 of y and z) is known. The inputs' blocks stay on their last chunk after the forward
phase and the output's on the chunk it writes first until it is written, so Pallas reads every
input once and writes x once.

No row reads ahead into the next chunk: the forward sweep forms c'[i-1] at row i (from
u[i-1], or l[i] when transposed; c'[i-1] = sup[i-1] / p[i-1] is the quotient of the same two
values, rounded the same way), and the pivoted sweep eliminates row i-1 when it reads row i
(sup[i-1] is l[i] when transposed), the last row after the loop. Row 0 ignores l[0] and u[N-1]
is never read (periodic solves read them as the corners): they may hold anything, inf and NaN
too.

The scratch holds (work values) x N row tiles, so the row tile narrows (fewer sublanes) as N
grows (`_tpu.geometry`; a float32 "thomas" solve in v5e's and v6e's 48 MiB budget: 8 sublanes
up to about 5400 rows, then 4, 2 and 1, up to about 48000 rows; in the 12 MiB a chip not known
gets, 8 sublanes up to about 760 rows, 1 up to 11500; "pivoted" half as long). Longer systems
run in two launches whose work rows go through HBM (`_streamed_solve`: the forward sweep
writes c' and y' (and z'; the pivoted kinds U's rows, two rows down, the last two in a tail of
row tiles), the back substitution reads them, no VMEM-sized scratch), unless the planner
splits them into chunks that fit (fewer systems than a row tile holds, `fits`). A streamed
periodic solve cannot walk its chunks a third time: its forward sweep sums row 0 of y and z
as it goes (`_first_row_sums`) and forms f, and the back substitution writes x = y - f z.

Complex64 systems are solved as their float32 real and imaginary parts (`_pallas/tpu.py`,
`parts_of`): every operand, output, scratch and carried tile comes in two parts, the rows are
read as `SplitComplex` tiles, and the same code does their arithmetic (Smith's division, pivots
by |Re| + |Im|, as every backend).

`factor_pnq` is the "thomas" forward elimination without a right-hand side, writing the
factors (l, m, c') row by row in one pass (`_tridiagonal/factorization.py`); complex factors
come from XLA's sweep.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .._core.layout import broadcast_shape
from .._core.split_complex import SplitComplex, as_split, magnitude, select, zeros_like
from .._pallas import tpu as _tpu
from . import periodic as _periodic
from .xla import pivot_step

KINDS = ("thomas", "factored", "periodic", "pivoted", "periodic_pivoted")
# Float32 scratches of N row tiles each kind keeps from its forward sweep for the backward one
# ("separated": "thomas" over the partition method's chunks, `solve_pnq(separators=...)`).
_WORK = {"thomas": 2, "separated": 2, "factored": 2, "periodic": 3, "pivoted": 4,
         "periodic_pivoted": 5}
# Row tiles the forward sweep carries across chunks (the periodic kinds' last three: alpha,
# gamma, beta, which the third phase reads). The backward one carries at most four.
_CARRY = {"thomas": 3, "separated": 3, "factored": 2, "periodic": 7, "pivoted": 7,
          "periodic_pivoted": 11}


def _carry_tiles(kind: str) -> int:
    """Row tiles of the carry scratch: the forward sweep's, and at least the four the backward
    one carries."""
    return max(_CARRY[kind], 4)


def _pivoting(kind: str) -> bool:
    return kind in ("pivoted", "periodic_pivoted")


def _corners(carry, l_i, d_i, u_i, *, first, last, transposed):
    """The periodic kinds at one row: the corners and the split (alpha = A[0, N-1], gamma,
    beta = A[N-1, 0], kept in the carry's last three tiles from the row that holds them),
    this row's diagonal of T', and z's right-hand side at rows 0 and N-1: u = (gamma, 0, ...,
    beta), or v = (1, 0, ..., alpha/gamma) for A^T."""
    alpha = select(first, l_i, carry[-3])
    gamma = select(first, _periodic.split_values(d_i, l_i, u_i), carry[-2])
    beta = select(last, u_i, carry[-1])
    corr = -alpha * beta / gamma  # d'[N-1] = d[N-1] - alpha*beta/gamma
    diag = d_i - select(first, gamma, 0.0) + select(last, corr, 0.0)
    ends = (1.0, alpha / gamma) if transposed else (gamma, beta)
    return (alpha, gamma, beta), diag, ends


def _forward_row(kind, transposed, bands, carry, *, first, last):
    """One row of the unpivoted forward sweeps: (the work values stored at this row, the next
    carry). `bands`: this row's (l, d, u, b) tiles; `first`, `last`: whether it is row 0
    (N-1).

    "separated" (a chunk of the partition method's last sweep, `bands` followed by two tiles:
    the previous separator, and its own separator): row 0's coupling to the previous separator
    moves to its right-hand side, and the last row, the separator, becomes an identity row
    holding the separator's value, so that the rows above it see it through their coupling
    (c'[N-2], formed at that row from the band as in "thomas"). Row 0's coupling is its own
    l[0], unless `transposed`: then it is the previous chunk's u at its separator row, which
    this chunk does not read, so the first tile comes multiplied by it. A previous separator of
    zero (the first chunk's, not periodic) adds nothing, whatever l[0] holds."""
    l_i, d_i, u_i, b_i = bands[:4]
    separated = kind == "separated"
    if separated:
        left, right = bands[4:]
        if not transposed:
            left = select(magnitude(left) == 0, 0.0, l_i * left)
        b_i = select(first, b_i - left, select(last, right, b_i))
        d_i = select(last, 1.0, d_i)
        kind = "thomas"
    u_prev = carry[{"thomas": 2, "factored": 1, "periodic": 3}[kind]]  # u[i-1]
    numerator, a = (l_i, u_prev) if transposed else (u_prev, l_i)
    a = select(jnp.logical_or(first, last) if separated else first, 0.0, a)
    if kind == "factored":
        y_prev = carry[0]
        y = b_i - a * y_prev
        return (select(first, 0.0, numerator), d_i * y), (y, u_i)
    p_prev, y_prev = carry[0], carry[1]
    c_prev = select(first, 0.0, numerator / p_prev)  # c'[i-1]
    if kind == "thomas":
        p = d_i - a * c_prev
        y = (b_i - a * y_prev) / p
        return (c_prev, y), (p, y, u_i)
    corners, diag, (start, end) = _corners(carry, l_i, d_i, u_i, first=first, last=last,
                                           transposed=transposed)
    p = diag - a * c_prev
    y = (b_i - a * y_prev) / p
    z = (select(first, start, select(last, end, 0.0)) - a * carry[2]) / p
    return (c_prev, y, z), (p, y, z, u_i, *corners)


def _pivoted_row(kind, transposed, bands, carry, work, *, r, target, last):
    """The pivoted sweeps at row r: eliminate row r-1 (U's row r-2 stored at local row
    `target`, clamped to row 0 while r < 2: stores there are rewritten), or start the pending
    row from row 0 (r == 1). Carry: the pending row (a, c and a right-hand side each: b, and
    z's for periodic systems), row r-1's (sub, d, b, u), the corners (periodic). Returns the
    next carry and the values kept (U's row r-2 from r = 2 on)."""
    l_i, d_i, u_i, b_i = bands
    periodic = _periodic.is_periodic(kind)
    rhs = 2 if periodic else 1
    pending = carry[:2 + rhs]
    sub_prev, d_prev, b_prev, u_prev = carry[2 + rhs:6 + rhs]
    sub = u_prev if transposed else l_i
    sup_prev = l_i if transposed else u_prev  # row r-1's super-diagonal
    corners, diag = (), d_i
    rhs_prev = (b_prev,)
    if periodic:
        corners, diag, (start, _) = _corners(carry, l_i, d_i, u_i, first=r == 0, last=last,
                                             transposed=transposed)
        rhs_prev += (select(r == 1, start, 0.0),)  # row N-1's is eliminated after the loop
    kept, stepped = pivot_step(pending, sub_prev, d_prev, sup_prev, rhs_prev)
    for rows, value in zip(work, kept, strict=True):
        rows.store(target, value)
    started = (d_prev, sup_prev, *rhs_prev)
    pending = tuple(select(r >= 2, s, select(r == 1, b, p))
                    for s, b, p in zip(stepped, started, pending, strict=True))
    return (*pending, sub, diag, b_i, u_i, *corners), kept


# Row tiles of the sums that give row 0 of y and z during a streamed periodic forward sweep
# (`_first_row_sums`): the weight w (unpivoted; pivoted, what the next two rows owe to the
# weights so far), then each sum and its compensation.
_SUMS = {"periodic": 5, "periodic_pivoted": 6}


def _streamed_carry_tiles(kind: str) -> int:
    """Row tiles a streamed forward sweep carries across chunks: the sweep's, then the sums."""
    return _CARRY[kind] + _SUMS.get(kind, 0)


def _first_row_sums(kind, sums, row, *, first, valid=True):
    """Row 0 of y = U^{-1} y' (and z) as the sum of w[k] y'[k], U^T w = e_0, updated with U's row
    k (`row`: c'[k-1], y'[k], z'[k] unpivoted; pivot, U1, U2, y'[k], z'[k] pivoted; `first`:
    k == 0; `valid`: a row of U at all): the streamed forward sweep forms f before the back
    substitution, which then writes x = y - f z at once instead of y and z. The sums are
    compensated (`_compensated_add`): summed plainly, on weakly dominant systems (implicit
    diffusion with large steps), they lose digits that the back substitution keeps."""
    pivoting = kind == "periodic_pivoted"
    weights, (sum_y, error_y, sum_z, error_z) = sums[:-4], sums[-4:]
    if pivoting:
        ahead, after = weights  # what rows k and k+1 owe to w[k-1] and w[k-2]
        pivot, u1, u2, y, z = row
        w = select(first, 1.0, -ahead) / pivot
        weights = (select(first, 0.0, after) + u1 * w, u2 * w)
    else:  # a unit upper bidiagonal U, c'[k] above the diagonal: w[k] = -c'[k-1] w[k-1]
        c_prev, y, z = row
        w = select(first, 1.0, -c_prev * sums[0])
        weights = (w,)
    restart = [select(first, 0.0, v) for v in (sum_y, error_y, sum_z, error_z)]
    updated = (*weights, *_compensated_add(*restart[:2], w * y), *_compensated_add(*restart[2:], w * z))
    return tuple(select(valid, new, old) for new, old in zip(updated, sums, strict=True))


def _compensated_add(total, error, term):
    """Neumaier's compensated sum: (total + term, the rounding error so far); the sum is their
    sum. Complex values add part by part."""
    if any(isinstance(v, SplitComplex) for v in (total, error, term)):
        total, error, term = (as_split(v) for v in (total, error, term))
        re, im = (_compensated_add(*(getattr(v, part) for v in (total, error, term)))
                  for part in ("re", "im"))
        return SplitComplex(re[0], im[0]), SplitComplex(re[1], im[1])
    new = total + term
    lost = jnp.where(jnp.abs(total) >= jnp.abs(term), (total - new) + term, (term - new) + total)
    return new, error + lost


def _pivoted_last_values(g, kind, transposed, carry):
    """After the pivoted sweeps' last row: U's rows N-2 (None when N == 1) and N-1, row N-1
    with nothing below it eliminated and x[N-1] (and z[N-1]) kept as a row that back
    substitution passes through ((y - 0 - 0) / 1)."""
    rhs = 2 if _periodic.is_periodic(kind) else 1
    pending = carry[:2 + rhs]
    sub_last, d_last, b_last = carry[2 + rhs:5 + rhs]
    zero = zeros_like(d_last)
    if g.N == 1:
        return None, (zero + 1, zero, zero, b_last / d_last)
    rhs_last = (b_last,)
    if rhs == 2:
        alpha, gamma, beta = carry[-3:]
        rhs_last += (alpha / gamma if transposed else beta,)
    kept, (a, _, *f) = pivot_step(pending, sub_last, d_last, zero, rhs_last)
    return kept, (zero + 1, zero, zero, *(fk / a for fk in f))


def _pivoted_last_rows(g, kind, transposed, work, carry, start):
    """`_pivoted_last_values` stored in U's rows N-2 and N-1 (`work`, chunk from `start`)."""
    before, last = _pivoted_last_values(g, kind, transposed, carry)
    rows = [(g.N - 1, last)] if before is None else [(g.N - 2, before), (g.N - 1, last)]
    for row, values in rows:
        for work_rows, value in zip(work, values, strict=True):
            work_rows.store(row - start, value)


def _substitution_row(work, store):
    """The unpivoted kinds' back substitution at row i, x[i] = v[i] - c'[i]*x[i+1] for each
    right-hand side v (`work`: c' stored one row down, then the v's), given to `store(i, xs)`;
    the carry is (x[i+1] of each, c'[i])."""
    cs, *vectors = work

    def row(i, carry):
        *after, c_next = carry
        for n, v in enumerate(vectors):
            after[n] = v.load(i) - c_next * after[n]
        store(i, after)
        return (*after, cs.load(i))

    return row


def _storing(sinks):
    """`store(i, xs)` writing each solution of xs to its sink."""
    def store(i, xs):
        for sink, x in zip(sinks, xs, strict=True):
            sink.store(i, x)
    return store


class _Parts:
    """A kernel's refs in `parts` (2: complex values' real and imaginary parts, one ref after
    the other): row accesses joined over the parts."""

    def __init__(self, g, parts: int):
        self.g, self.parts = g, parts

    def groups(self, refs):
        """`refs` as one group of `parts` refs per operand."""
        return [refs[n:n + self.parts] for n in range(0, len(refs), self.parts)]

    def readers(self, ops, refs, stages):
        """The row access of each operand (its blocks `refs`, `parts` each; staged operands
        fill the next of `stages`)."""
        return _tpu.part_readers(self.g, ops, self.groups(refs), stages)

    def rows_of(self, refs):
        """Row accesses of "rows" output blocks, straight into the blocks."""
        return [_tpu.block_rows(self.g, group) for group in self.groups(refs)]

    def scratches(self, refs, rows=None, offset=0):
        """Row accesses of VMEM scratches (`_tpu.scratch_rows`)."""
        return [_tpu.scratch_rows(self.g, group, rows, offset) for group in self.groups(refs)]


def _initial_carry(g, kind):
    """The forward sweep's carry before row 0 (p = 1 for the dividing sweeps)."""
    return [jnp.full(g.tile, 1.0 if n == 0 and kind != "factored" else 0.0, jnp.float32)
            for n in range(_CARRY[kind])]


def _kernel(*refs, g, ops, kind, transposed, direct_out, parts):
    """Refs: the operands' blocks (l, d, u, b; "separated": and its two tiles), x's block, the
    work scratches (`_WORK`), the carry (`_CARRY` row tiles), the stages of staged operands;
    of each operand, output and scratch its `parts` (2: complex values' real and imaginary
    parts, one after the other)."""
    n_work = _WORK[kind]
    band_refs, refs = refs[:len(ops) * parts], refs[len(ops) * parts:]
    x_refs, refs = refs[:parts], refs[parts:]
    work_refs, (carry_ref, *stages) = refs[:n_work * parts], refs[n_work * parts:]
    C = g.chunks
    k = pl.program_id(2)
    tile = functools.partial(jnp.full, g.tile, dtype=jnp.float32)
    io = _Parts(g, parts)
    carry = _tpu.CarryTiles(carry_ref, parts)
    carry_get, carry_set, load_carry, store_carry = carry.get, carry.set, carry.load, carry.store

    def work_rows(j, offset=None):
        offset = _tpu.aligned(j * g.rows) if offset is None else offset
        return io.scratches(work_refs, g.total_rows, offset)

    def output_rows():
        return io.rows_of(x_refs)[0]

    @pl.when(k < C)
    def _():
        j = k
        readers = io.readers(ops, band_refs, stages)
        work = work_rows(j)
        start = j * g.chunk

        @pl.when(k == 0)
        def _():
            store_carry(_initial_carry(g, kind))

        def run(count):
            def row(i, carry):
                r = start + i
                bands = [reader.load(i) for reader in readers]
                if _pivoting(kind):
                    return _pivoted_row(kind, transposed, bands, carry, work, r=r,
                                        target=i - jnp.minimum(r, 2), last=r == g.N - 1)[0]
                values, after = _forward_row(kind, transposed, bands, carry, first=r == 0,
                                             last=r == g.N - 1)
                for rows, value in zip(work, values, strict=True):
                    rows.store(i, value)
                return after

            store_carry(_tpu.loop(count, row, load_carry(_CARRY[kind])))
            if _pivoting(kind):
                @pl.when(j == C - 1)
                def _():
                    _pivoted_last_rows(g, kind, transposed, work, load_carry(_CARRY[kind]),
                                       start)

        _tpu.over_rows(g, j, run)

    @pl.when(jnp.logical_and(k >= C, k < 2 * C))
    def _():
        j = 2 * C - 1 - k
        work = work_rows(j)
        if _periodic.is_periodic(kind):
            out = None  # y and z stay in their scratches for the third phase
        elif direct_out:
            out = output_rows()
        else:
            out = work[-1]  # x overwrites y (in place: each row is read before it is written)

        @pl.when(k == C)
        def _():
            store_carry([tile(0.0)] * 4)

        def run(count):
            vectors = work[3:] if _pivoting(kind) else work[1:]
            store = _storing(vectors if out is None else [out])
            if _pivoting(kind):
                def row(i, carry):  # carry: x[i+1], x[i+2] of each right-hand side
                    after = _pivoted_substitution([w.load(i) for w in work], carry)
                    store(i, after[::2])
                    return tuple(after)
            else:
                row = _substitution_row(work, store)
            rhs = len(vectors)
            carry = load_carry(2 * rhs if _pivoting(kind) else rhs + 1)
            store_carry(_tpu.loop(count, row, carry, reverse=True))

        _tpu.over_rows(g, j, run)
        if out is not None and not direct_out:
            _tpu.stage_out_parts(g, out, x_refs)

    if _periodic.is_periodic(kind):
        @pl.when(k >= 2 * C)
        def _():
            j = k - 2 * C
            ys, zs = work_rows(j)[-2:]

            @pl.when(k == 2 * C)
            def _():  # f, before x overwrites y (a staged output is written into y's scratch)
                everything = work_rows(0, 0)[-2:]
                alpha, gamma, beta = (carry_get(n) for n in range(_CARRY[kind] - 3, _CARRY[kind]))
                (y0, z0), (yl, zl) = ([v.load(i) for v in everything] for i in (0, g.N - 1))
                carry_set(0, _periodic.sherman_morrison_factor(y0, yl, z0, zl, alpha, gamma, beta,
                                                               transposed=transposed))

            f = carry_get(0)
            out = output_rows() if direct_out else ys

            def run(count):
                def row(i, _):
                    out.store(i, ys.load(i) - f * zs.load(i))
                    return 0

                _tpu.loop(count, row, 0)

            _tpu.over_rows(g, j, run)
            if not direct_out:
                _tpu.stage_out_parts(g, ys, x_refs)


# ---------------------------------------------------------------------------------------------
# Systems too long for VMEM: the work rows streamed through HBM.


def _streamed_forward(*refs, g, ops, kind, transposed, parts, staged_work):
    """The forward sweep, writing each row's work values (`_WORK[kind]` of them: c' one row
    down, y', and z' for periodic systems; U's rows of the pivoted kinds, row r-2 at row r,
    rows N-2 and N-1 in a tail of row tiles) to float32 outputs; a periodic sweep sums row 0 of
    y and z as it goes (`_first_row_sums`) and writes f of x = y - f z, a row tile per group.
    Refs: the bands' blocks, the work outputs' blocks, the tail's block (pivoted kinds), f's
    block (periodic kinds), the carry (with the sums), the stages of staged operands, then of
    the work outputs (`staged_work`); each in its `parts`."""
    n_work, pivoting, periodic = _WORK[kind], _pivoting(kind), _periodic.is_periodic(kind)
    band_refs, refs = refs[:4 * parts], refs[4 * parts:]
    work_refs, refs = refs[:n_work * parts], refs[n_work * parts:]
    tail_ref, refs = (refs[0], refs[1:]) if pivoting else (None, refs)
    f_ref, (carry_ref, *stages) = (refs[0], refs[1:]) if periodic else (None, refs)
    out_stages = stages[len(stages) - n_work * parts:] if staged_work else []
    stages = stages[:len(stages) - len(out_stages)]
    j = pl.program_id(2)
    io, carry = _Parts(g, parts), _tpu.CarryTiles(carry_ref, parts)
    readers = io.readers(ops, band_refs, stages)
    sinks = io.scratches(out_stages) if staged_work else io.rows_of(work_refs)
    n, total = _CARRY[kind], _streamed_carry_tiles(kind)

    @pl.when(j == 0)
    def _():
        zero = jnp.zeros(g.tile, jnp.float32)
        carry.store(_initial_carry(g, kind) + [zero] * (total - n))

    def run(count):
        def row(i, state):
            r = j * g.chunk + i
            bands = [reader.load(i) for reader in readers]
            if pivoting:
                after, kept = _pivoted_row(kind, transposed, bands, state[:n], sinks, r=r,
                                           target=i, last=r == g.N - 1)
                if periodic:
                    return (*after, *_first_row_sums(kind, state[n:], kept, first=r == 2,
                                                     valid=r >= 2))
                return after
            values, after = _forward_row(kind, transposed, bands, state[:n], first=r == 0,
                                         last=r == g.N - 1)
            for sink, value in zip(sinks, values, strict=True):
                sink.store(i, value)
            if periodic:
                return (*after, *_first_row_sums(kind, state[n:], values, first=r == 0))
            return after

        carry.store(_tpu.loop(count, row, carry.load(total)))

    _tpu.over_rows(g, j, run)
    if pivoting or periodic:
        pl.when(j == g.chunks - 1)(functools.partial(
            _finish_forward, g, kind, transposed, carry, tail_ref, f_ref, parts))

    for m, sink in enumerate(sinks if staged_work else ()):
        _tpu.stage_out_parts(g, sink, work_refs[m * parts:(m + 1) * parts])


def _finish_forward(g, kind, transposed, carry, tail_ref, f_ref, parts):
    """After a streamed forward sweep's last row: the pivoted kinds' last two rows of U to the
    tail, and a periodic solve's f of x = y - f z (`carry`: the sweep's, then the sums)."""
    n = _CARRY[kind]
    state = carry.load(_streamed_carry_tiles(kind))
    if _pivoting(kind):
        before, last = _pivoted_last_values(g, kind, transposed, state[:n])
        _tpu.CarryTiles(tail_ref, parts).store([*before, *last])
        if f_ref is None:
            return
        # U's rows N-2 and N-1 (N >= 3); the last holds y[N-1] and z[N-1] themselves
        sums = _first_row_sums(kind, state[n:], before, first=False)
        sums, ends = _first_row_sums(kind, sums, last, first=False), last[3:]
    else:
        sums, ends = state[n:], state[1:3]  # y'[N-1] = y[N-1], z'[N-1] = z[N-1]
    sum_y, error_y, sum_z, error_z = sums[-4:]
    y0, z0 = sum_y + error_y, sum_z + error_z
    alpha, gamma, beta = state[n - 3:n]
    yl, zl = ends
    _tpu.CarryTiles(f_ref, parts).set(0, _periodic.sherman_morrison_factor(
        y0, yl, z0, zl, alpha, gamma, beta, transposed=transposed))


def _split_refs(refs, n_work, parts, staged_out, *, tail, periodic):
    """The back substitution's refs: the work values' blocks, the tail's block (`tail`), f's
    (`periodic`), x's blocks, the carry, the stages of the work values and of x."""
    work_refs, refs = refs[:n_work * parts], refs[n_work * parts:]
    tail_ref, refs = (refs[0], refs[1:]) if tail else (None, refs)
    f_ref, refs = (refs[0], refs[1:]) if periodic else (None, refs)
    x_refs, (carry_ref, *stages) = refs[:parts], refs[parts:]
    out_stages = stages[len(stages) - parts:] if staged_out else []
    stages = stages[:len(stages) - len(out_stages)]
    return work_refs, tail_ref, f_ref, x_refs, carry_ref, stages, out_stages


def _solution_store(outs, f_ref, parts):
    """`store(i, xs)` of a streamed back substitution (xs: the solution of each right-hand
    side): x = y - f z of a periodic solve (`f_ref`), else each solution to its output."""
    if f_ref is None:
        return _storing(outs)
    f = _tpu.CarryTiles(f_ref, parts).get(0)
    (out,) = outs

    def store(i, xs):
        y, z = xs
        out.store(i, y - f * z)

    return store


def _streamed_backward(*refs, g, n_work, parts, staged_work, staged_out, periodic):
    """The back substitution from the `n_work` work outputs (c', then a right-hand side's
    each), last chunk first, writing one solution per right-hand side (x = y - f z for periodic
    systems). Refs: `_split_refs`'s (no tail); each in its `parts`."""
    work_refs, _, f_ref, x_refs, carry_ref, stages, out_stages = _split_refs(
        refs, n_work, parts, staged_out, tail=False, periodic=periodic)
    k = pl.program_id(2)
    j = g.chunks - 1 - k
    io, carry = _Parts(g, parts), _tpu.CarryTiles(carry_ref, parts)
    work = io.readers([_tpu.Operand("rows", staged=staged_work)] * n_work, work_refs, stages)
    outs = io.scratches(out_stages) if staged_out else io.rows_of(x_refs)

    @pl.when(k == 0)
    def _():
        carry.store([jnp.zeros(g.tile, jnp.float32)] * n_work)

    def run(count):
        row = _substitution_row(work, _solution_store(outs, f_ref, parts))
        carry.store(_tpu.loop(count, row, carry.load(n_work), reverse=True))

    _tpu.over_rows(g, j, run)
    for n, out in enumerate(outs if staged_out else ()):
        _tpu.stage_out_parts(g, out, x_refs[n * parts:(n + 1) * parts])


def _pivoted_substitution(u_row, xs):
    """x[i] = (v[i] - U1[i]*x[i+1] - U2[i]*x[i+2]) / pivot[i] for each right-hand side v of U's
    row i (pivot, U1, U2, v...); `xs`: (x[i+1], x[i+2]) of each. Returns (x[i], x[i+1]) of each."""
    pivot, u1, u2, *vectors = u_row
    after = []
    for n, v in enumerate(vectors):
        x1, x2 = xs[2 * n:2 * n + 2]
        after += [(v - u1 * x1 - u2 * x2) / pivot, x1]
    return after


def _streamed_pivoted_backward(*refs, g, n_work, parts, staged_work, staged_out, periodic):
    """The pivoted back substitution from U's rows as `_streamed_forward` writes them (row i
    at row i+2, the last two in the tail), last chunk first. A chunk of rows lo..hi-1 holds U's
    rows lo-2..hi-3: its top two solutions use the two rows above (the tail, or the first two
    rows of the chunk after it, carried), and it carries its own first two rows to the chunk
    before it. Carry: x[i+1] and x[i+2] of each right-hand side, then U's two rows above;
    periodic systems write x = y - f z."""
    rhs = n_work - 3
    work_refs, tail_ref, f_ref, x_refs, carry_ref, stages, out_stages = _split_refs(
        refs, n_work, parts, staged_out, tail=True, periodic=periodic)
    k = pl.program_id(2)
    io, carry = _Parts(g, parts), _tpu.CarryTiles(carry_ref, parts)
    work = io.readers([_tpu.Operand("rows", staged=staged_work)] * n_work, work_refs, stages)
    outs = io.scratches(out_stages) if staged_out else io.rows_of(x_refs)
    X = 2 * rhs

    @pl.when(k == 0)
    def _():
        zero = jnp.zeros(g.tile, jnp.float32)
        carry.store([zero] * X + list(_tpu.CarryTiles(tail_ref, parts).load(2 * n_work)))

    solution = _solution_store(outs, f_ref, parts)

    def store(i, xs):
        solution(i, xs[::2])

    def run(count):
        xs = carry.load(X)
        above = carry.load(X + 2 * n_work)[X:]
        first, second = above[:n_work], above[n_work:]  # U's rows hi-2 and hi-1
        for i, u_row in [(count - 1, second), (count - 2, first)][:min(count, 2)]:
            xs = _pivoted_substitution(u_row, xs)
            store(i, xs)

        def row(i, xs):
            xs = _pivoted_substitution([w.load(i + 2) for w in work], xs)
            store(i, xs)
            return tuple(xs)

        if count > 2:
            xs = _tpu.loop(count - 2, row, tuple(xs), reverse=True)
        below = [w.load(0) for w in work] + ([w.load(1) for w in work] if count >= 2 else list(first))
        carry.store([*xs, *below])

    _tpu.over_rows(g, g.chunks - 1 - k, run)
    for n, out in enumerate(outs if staged_out else ()):
        _tpu.stage_out_parts(g, out, x_refs[n * parts:(n + 1) * parts])


def _streamed_solve(l, d, u, b, *, kind, transposed, out_dtype, budget, interpret):
    """A solve of systems too long for VMEM in two launches: the forward sweep writes its work
    values to HBM (`_WORK[kind]` float32 arrays; the pivoted kinds' last two rows of U as
    row tiles, a tail; a periodic solve's f as a row tile per group), the back substitution
    reads them, last chunk first, and writes x (x = y - f z for periodic systems). The operands
    are read once and x written once, as by the one-launch kernel; the work values cost two
    more passes each over a float32 array."""
    P, N, Q = broadcast_shape(l, d, u, b)
    pivoting, periodic = _pivoting(kind), _periodic.is_periodic(kind)
    if pivoting and N < 3:  # rows 0 and 1 of the work outputs hold no row of U
        return _xla_loop(l, d, u, b, transposed=transposed, out_dtype=out_dtype, kind=kind)
    parts, part_dtype = _tpu.split_dtype(out_dtype)
    complex_ = parts == 2
    operands = [part for v in (l, d, u, b) for part in _tpu.parts_of(v, complex_)]
    rows, tile = _tpu.Operand("rows"), _tpu.Operand("tile")
    n_work = _WORK[kind]
    rhs = n_work - (3 if pivoting else 1)
    # Row tiles per group passed from the forward sweep to the back substitution: the pivoted
    # kinds' tail (U's last two rows), a periodic solve's f
    tiles = 2 * n_work * pivoting + periodic
    carried = (2 * rhs + 2 * n_work) if pivoting else n_work

    def need(g):
        ops = [_tpu.operand(g, v.shape, v.dtype) for v in operands]
        staged_work, staged_out = _tpu.staged(g, jnp.float32), _tpu.staged(g, part_dtype)
        forward = _tpu.vmem_need(
            g, [(op, v.dtype.itemsize) for op, v in zip(ops, operands, strict=True)] + [(tile, 4)] * (tiles * parts),
            stages=sum(op.kind == "rows" and op.staged for op in ops) + n_work * parts * staged_work,
            scratch_rows=0, outputs=[4] * (n_work * parts),
            carry_tiles=_streamed_carry_tiles(kind) * parts)
        backward = _tpu.vmem_need(g, [(rows, 4)] * (n_work * parts) + [(tile, 4)] * (tiles * parts),
                                  stages=parts * (n_work * staged_work + staged_out),
                                  scratch_rows=0, outputs=[part_dtype.itemsize] * parts,
                                  carry_tiles=carried * parts)
        return max(forward, backward)

    g = _tpu.geometry(P, N, Q, vmem_bytes=need, budget=budget.budget)
    if g is None:  # not even one chunk's buffers fit (a budget far below any chip's)
        return _xla_loop(l, d, u, b, transposed=transposed, out_dtype=out_dtype, kind=kind)
    prepared = [_tpu.prepare(g, v) for v in operands]
    ops = [op for _, op in prepared[::parts]]
    staged_work, staged_out = _tpu.staged(g, jnp.float32), _tpu.staged(g, part_dtype)
    C = g.chunks
    vmem = _tpu.pltpu.VMEM
    stage = vmem(_tpu.stage_shape(g), jnp.float32)
    shape = (P, N) if g.layout == "transposed" else (P, N, Q)
    work_shapes = [jax.ShapeDtypeStruct(shape, jnp.float32)] * (n_work * parts)
    tile_shapes, tile_specs = [], []  # one block of row tiles per group, written at the last step
    for count in (2 * n_work * parts,) * pivoting + (parts,) * periodic:
        tile_shapes.append(jax.ShapeDtypeStruct((*g.groups, count, *g.tile), jnp.float32))
        tile_specs.append(pl.BlockSpec((None, None, count, *g.tile), lambda a, b_, k: (a, b_, 0, 0, 0)))

    def forward_chunk(k):
        return k

    def backward_chunk(k):
        return C - 1 - k

    scratch = [vmem((_streamed_carry_tiles(kind) * parts, *g.tile), jnp.float32)]
    scratch += [stage for _, op in prepared if op.kind == "rows" and op.staged]
    scratch += [stage] * (n_work * parts * staged_work)
    kernel = functools.partial(_streamed_forward, g=g, ops=ops, kind=kind, transposed=transposed,
                               parts=parts, staged_work=staged_work)
    work = _tpu.call(kernel, g, [v for v, _ in prepared],
                     [_tpu.block_spec(g, op, forward_chunk) for _, op in prepared],
                     work_shapes + tile_shapes,
                     [_tpu.block_spec(g, rows, forward_chunk)] * (n_work * parts) + tile_specs, scratch,
                     steps=C, name=f"tridiax_{kind}_forward_tpu", vmem_limit=budget.limit,
                     interpret=interpret)
    scratch = [vmem((carried * parts, *g.tile), jnp.float32)]
    scratch += [stage] * (parts * (n_work * staged_work + staged_out))
    backward = _streamed_pivoted_backward if pivoting else _streamed_backward
    kernel = functools.partial(backward, g=g, n_work=n_work, parts=parts, staged_work=staged_work,
                               staged_out=staged_out, periodic=periodic)
    x = _tpu.call(kernel, g, work,
                  [_tpu.block_spec(g, rows, backward_chunk)] * (n_work * parts) + tile_specs,
                  [jax.ShapeDtypeStruct(shape, part_dtype)] * parts,
                  [_tpu.block_spec(g, rows, backward_chunk)] * parts, scratch,
                  steps=C, name=f"tridiax_{kind}_backward_tpu", vmem_limit=budget.limit,
                  interpret=interpret)
    return (jax.lax.complex(*x) if complex_ else x[0]).reshape(P, N, Q)


def _plan(P, N, Q, operands, out_dtype, *, kind="thomas", budget=None):
    """The geometry of a solve in `budget` bytes of VMEM (None: `_tpu.VMEM_BUDGET`); complex
    calls hold two float32 parts of every operand, output and scratch."""
    parts, out_part = _tpu.split_dtype(out_dtype)
    # the dtype of each operand's parts (float32 in a complex call)
    dtypes = [out_part if parts == 2 else jnp.dtype(v.dtype) for v in operands]

    def need(g):
        ops = [_tpu.operand(g, v.shape, dtype) for v, dtype in zip(operands, dtypes, strict=True)]
        staged = parts * sum(op.kind == "rows" and op.staged for op in ops)
        sizes = [(op, dtype.itemsize) for op, dtype in zip(ops, dtypes, strict=True)] * parts
        return _tpu.vmem_need(g, sizes, stages=staged,
                              scratch_rows=parts * _WORK[kind] * g.total_rows,
                              outputs=[out_part.itemsize] * parts,
                              carry_tiles=parts * _carry_tiles(kind))

    return _tpu.geometry(P, N, Q, vmem_bytes=need, budget=budget)


def fits(P: int, N: int, Q: int, dtype, *, kind: str = "thomas", budget=None) -> bool:
    """Whether a solve of (P, N, Q) systems fits `budget` bytes of VMEM (all its operands
    full; None: `_tpu.VMEM_BUDGET`)."""
    operands = [jax.ShapeDtypeStruct((P, N, Q), dtype)] * 4
    return _plan(P, N, Q, operands, dtype, kind=kind, budget=budget) is not None


def _xla_loop(l, d, u, b, *, transposed, out_dtype, kind):
    """XLA's loop (`_xla.sweep`) for systems whose streamed chunks do not fit VMEM either (a
    budget far below any chip's), along the last axis of the operands as (P, Q, N),
    dimensions of size 1 dropped: a TPU pads the last two dimensions of an array to whole
    (8, 128) tiles, so a loop over (1, N, 1) buffers would hold 1024 times their values (one
    system of ten million rows did not fit in a v5e's HBM), and one over (N, 4) rows 32
    times."""
    from . import xla as _xla

    P, N, Q = broadcast_shape(l, d, u, b)
    drop = tuple(a for a, size in ((0, P), (1, Q)) if size == 1)
    operands = [jnp.squeeze(jnp.moveaxis(v, 1, 2), drop) for v in (l, d, u, b)]
    axis = 2 - len(drop)
    sweep = functools.partial(_xla.sweep, out_dtype=out_dtype)
    if kind == "periodic_pivoted":
        x = _periodic.solve_pivoted(*operands, axis=axis, transposed=transposed,
                                    pivoted_solve=functools.partial(sweep, transposed=False,
                                                                    kind="pivoted"))
    else:
        x = sweep(*operands, axis=axis, transposed=transposed, kind=kind)
    return jnp.moveaxis(x.astype(out_dtype).reshape(P, Q, N), 2, 1)


def solve_pnq(l, d, u, b, *, transposed: bool, out_dtype, kind: str = "thomas", interpret=None,
              separators=None):
    """Solve along axis 1 of (P|1, N|1, Q|1) operands; returns (P, N, Q) of `out_dtype`.
    `kind`: one of KINDS (module docstring; the periodic kinds need N >= 3). `interpret`: Pallas's
    interpret mode (`pltpu.InterpretParams`, or True) to run on CPU. Systems too long for
    VMEM (`fits`) stream their work rows through HBM (`_streamed_solve`).

    `separators`: (left, right), two (P|1, 1, Q|1) arrays, makes a "thomas" solve the
    partition method's last sweep over chunks as systems (`_forward_row`, "separated"): row 0's
    right-hand side less l[0] * `left` (`transposed`: less `left`, row 0's coupling already
    in it), the last row x = `right`. Only in one launch: None where the systems do not fit
    VMEM (`fits`)."""
    if kind not in KINDS:
        raise ValueError(f"the Pallas TPU solve has no kind {kind!r}; kinds: {KINDS}")
    operands = (l, d, u, b)
    if separators is not None:
        if kind != "thomas":
            raise ValueError(f"separators are for the 'thomas' kind, not {kind!r}")
        kind, operands = "separated", operands + tuple(separators)
    P, N, Q = broadcast_shape(*operands)
    out_dtype = jnp.dtype(out_dtype)
    budget = _tpu.vmem()
    g = _plan(P, N, Q, operands, out_dtype, kind=kind, budget=budget.budget)
    if g is None:
        if separators is not None:
            return None
        return _streamed_solve(l, d, u, b, kind=kind, transposed=transposed, out_dtype=out_dtype,
                               budget=budget, interpret=interpret)
    parts, part_dtype = _tpu.split_dtype(out_dtype)
    complex_ = parts == 2
    prepared = [[_tpu.prepare(g, part) for part in _tpu.parts_of(v, complex_)]
                for v in operands]
    ops = [pieces[0][1] for pieces in prepared]
    direct_out = not _tpu.staged(g, part_dtype)
    C = g.chunks

    def chunk_in(k):
        return jnp.minimum(k, C - 1)

    def chunk_out(k):
        if _periodic.is_periodic(kind):  # written by the third phase, first chunk first
            return jnp.clip(k - 2 * C, 0, C - 1)
        return jnp.clip(2 * C - 1 - k, 0, C - 1)

    inputs = [v for pieces in prepared for v, _ in pieces]
    in_specs = [_tpu.block_spec(g, op, chunk_in) for op in ops for _ in range(parts)]
    shape = (P, N) if g.layout == "transposed" else (P, N, Q)
    out_spec = _tpu.block_spec(g, _tpu.Operand("rows"), chunk_out)
    vmem = _tpu.pltpu.VMEM
    scratch = [vmem(_tpu.rows_shape(g, g.total_rows), jnp.float32)] * (_WORK[kind] * parts)
    scratch.append(vmem((_carry_tiles(kind) * parts, *g.tile), jnp.float32))
    scratch += [vmem(_tpu.stage_shape(g), jnp.float32)
                for pieces in prepared for _, op in pieces if op.kind == "rows" and op.staged]
    kernel = functools.partial(_kernel, g=g, ops=ops, kind=kind, transposed=transposed,
                               direct_out=direct_out, parts=parts)
    phases = 3 if _periodic.is_periodic(kind) else 2
    x = _tpu.call(kernel, g, inputs, in_specs, [jax.ShapeDtypeStruct(shape, part_dtype)] * parts,
                  [out_spec] * parts, scratch, steps=phases * C, name=f"tridiax_{kind}_tpu",
                  vmem_limit=budget.limit, interpret=interpret)
    x = jax.lax.complex(*x) if complex_ else x[0]
    return x.reshape(P, N, Q)


# ---------------------------------------------------------------------------------------------
# The factorization.


def _factor_kernel(l_ref, d_ref, u_ref, lo_ref, m_ref, c_ref, carry_ref, *stages, g, ops,
                   staged_out):
    """One pass: l[i] = lower[i] / p[i-1] (0 at row 0), m[i] = 1 / p[i], c'[i] = upper[i] /
    p[i] (0 at row N-1); the carry holds the previous row's p and c'."""
    k = pl.program_id(2)
    stages = list(stages)
    out_stages = stages[-3:] if staged_out else None
    readers = []
    for op, ref in zip(ops, (l_ref, d_ref, u_ref), strict=True):
        stage = stages.pop(0) if op.kind == "rows" and op.staged else None
        if stage is not None:
            _tpu.stage_in(g, ref, stage)
        readers.append(_tpu.reader(g, op, ref, stage))
    lo, di, up = readers
    outputs = (lo_ref, m_ref, c_ref)
    sinks = ([_tpu.RowRef(g, s, g.rows) for s in out_stages] if staged_out
             else [_tpu.RowRef(g, ref.at[0], g.rows) for ref in outputs])
    start = k * g.chunk

    @pl.when(k == 0)
    def _():
        carry_ref[0] = jnp.ones(g.tile, jnp.float32)
        carry_ref[1] = jnp.zeros(g.tile, jnp.float32)

    def run(count):
        def row(i, carry):
            p_prev, c_prev = carry
            r = start + i
            first = r == 0
            a = jnp.where(first, 0.0, lo.load(i))
            p = di.load(i) - a * c_prev
            c = jnp.where(r == g.N - 1, 0.0, up.load(i) / p)
            for sink, value in zip(sinks, (jnp.where(first, 0.0, a / p_prev), 1 / p, c),
                                   strict=True):
                sink.store(i, value)
            return p, c

        carry_ref[0], carry_ref[1] = _tpu.loop(count, row, (carry_ref[0], carry_ref[1]))

    _tpu.over_rows(g, k, run)
    if staged_out:
        for sink, ref in zip(sinks, outputs, strict=True):
            _tpu.stage_out(g, sink, ref)


def factor_pnq(l, d, u, *, out_dtype, interpret=None):
    """The factors (l, m, c') of the systems along axis 1 of (P|1, N|1, Q|1) bands, three
    (P, N, Q) arrays of `out_dtype` (`_xla.factor_sweep` states them); complex factors by
    XLA's sweep (the solves with them run the kernel)."""
    P, N, Q = broadcast_shape(l, d, u)
    out_dtype = jnp.dtype(out_dtype)
    if jnp.issubdtype(out_dtype, jnp.complexfloating):
        from . import xla as _xla

        return _xla.factor_pnq(l, d, u, out_dtype=out_dtype)
    budget = _tpu.vmem()
    bands = (l, d, u)

    def need(g):
        ops = [_tpu.operand(g, v.shape, v.dtype) for v in bands]
        staged = sum(op.kind == "rows" and op.staged for op in ops)
        staged += 3 * _tpu.staged(g, out_dtype)
        return _tpu.vmem_need(g, [(op, v.dtype.itemsize) for op, v in zip(ops, bands, strict=True)],
                              stages=staged, scratch_rows=0, outputs=[out_dtype.itemsize] * 3,
                              carry_tiles=2)

    g = _tpu.geometry(P, N, Q, vmem_bytes=need, budget=budget.budget)
    prepared = [_tpu.prepare(g, v) for v in bands]
    ops = [op for _, op in prepared]
    staged_out = _tpu.staged(g, out_dtype)

    def chunk_of(k):
        return k

    shape = (P, N) if g.layout == "transposed" else (P, N, Q)
    out_spec = _tpu.block_spec(g, _tpu.Operand("rows"), chunk_of)
    vmem = _tpu.pltpu.VMEM
    stage = vmem(_tpu.stage_shape(g), jnp.float32)
    scratch = [vmem((2, *g.tile), jnp.float32)]
    scratch += [stage for op in ops if op.kind == "rows" and op.staged]
    scratch += [stage] * (3 * staged_out)
    kernel = functools.partial(_factor_kernel, g=g, ops=ops, staged_out=staged_out)
    factors = _tpu.call(kernel, g, [v for v, _ in prepared],
                        [_tpu.block_spec(g, op, chunk_of) for op in ops],
                        [jax.ShapeDtypeStruct(shape, out_dtype)] * 3, [out_spec] * 3, scratch,
                        steps=g.chunks, name="tridiax_factor_tpu", vmem_limit=budget.limit,
                        interpret=interpret)
    return tuple(x.reshape(P, N, Q) for x in factors)
