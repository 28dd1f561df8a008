"""Sweeps that load k rows at a time: the plain Thomas sweep and linear recurrences by tiles
of rows, in place in either layout.

The row kernels of `_tridiagonal/pallas_triton.py` and `_recurrence/pallas_triton.py` load one row of their
(bp, bq) tile of systems per step and wait for it before the next. These kernels load k
consecutive rows at once (ROW_BYTES of each system: k = 16 in float32, 8 in float64), split
the tile into its k rows in registers, sweep them one after another (the same operations in
the same order as the row kernels: `verify.sequential_solve`'s), and write results back as
tiles of k rows: k rows' loads in flight per step instead of one. Two orientations:

- "p": systems whose rows are contiguous (Q = 1: the (B, N) layout along its last axis, the
  chunks of one long system, a chunked solve's reduced system). A tile is (bp, k): each
  system's k rows are one burst, read in place, where the row kernel fetched a burst for each
  value (so the planner used to move these systems to columns by XLA transposes).
- "q": tiles of 64 systems side by side along Q (the (N, B) layout along axis 0). A tile is
  (k, bq): k = 4 rows of bq contiguous values each.

The loop over tiles is a loop (compile time flat in N); the k rows inside a tile are written
out, k being a small constant. The last tile of rows starts at N - k (it would otherwise run
past the arrays) and leaves the rows of the tile before it as they were (masked stores; its
carries skip them). Values outside the matrix (row 0's lower band, row N-1's upper band, the
coefficient before a shifted recurrence's first step) are replaced by zeros, as the
sequential sweeps never read them.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .._core.dtypes import compute_dtype
from .._core.layout import broadcast_shape
from .tiles import _TRITON, Tiles, _correctly_rounded_quotient, launch

# Bytes of each system's rows a tile reads at once: one 64-byte HBM burst in the "p"
# orientation (16 float32 rows, 8 float64 rows; twice that many rows take twice the
# registers, and spill).
ROW_BYTES = 64
# Systems of a program's tile in each orientation, rows of a "q" tile, and the warps of a
# program: compiled for sm_90a, 32 systems x 16 float32 rows take 120 registers in 4 warps
# (226 in 2, 255 and spills in 1); 4 rows x 64 systems 64 (the recurrence 32), where 8 rows
# took 164 (the recurrence 56 and spilled 8 bytes).
P_SYSTEMS = 32
Q_SYSTEMS = 64  # the row kernels' tile along Q
Q_ROWS = 4
WARPS = 4
# Rows of a tile when the kernels run in interpret mode through the public functions (the
# tests): the k rows of a tile are written out, so XLA's compile time on CPU grows with k. The
# logic is the same for every k; tests/gpu/test_pallas_rows.py runs the compiled tiles' k directly.
INTERPRET_ROWS = 4


def orientation(P: int, N: int, Q: int, dtype) -> str | None:
    """"p", "q" or None (the row kernel runs) for real (P, N, Q) systems or sequences."""
    if jnp.issubdtype(dtype, jnp.complexfloating) or N < 2:
        return None
    if Q == 1:
        return "p"
    if Q >= Q_SYSTEMS:
        return "q"
    return None


def applies(P: int, N: int, Q: int, dtype, *, kind: str) -> bool:
    """Whether a solve of (P, N, Q) systems runs this module's kernel (plain real systems in
    either orientation)."""
    return kind == "thomas" and orientation(P, N, Q, dtype) is not None


def _rows_per_tile(n: int, dtype, along: str, rows: int | None = None) -> int:
    """Rows of a tile: ROW_BYTES of the compute dtype ("p"), Q_ROWS ("q"), at most `rows` and
    the largest power of two not above n (Triton tiles are powers of two)."""
    most = ROW_BYTES // jnp.dtype(dtype).itemsize if along == "p" else Q_ROWS
    most = min(most, rows or most)
    k = 1
    while 2 * k <= min(n, most):
        k *= 2
    return k


class RowTiles:
    """Tiles of k rows of one program's systems; build it inside a kernel body.

    A row is a "column" value: (bp, 1) in the "p" orientation, (1, bq) in "q"; rows broadcast
    against each other as the row kernels' rows do."""

    def __init__(self, P: int, Q: int, n: int, k: int, tiles: Tiles, along: str, dtype):
        self.n, self.k, self.along, self.dtype = n, k, along, dtype
        self.P, self.Q = P, Q
        self.bp, self.bq = tiles.bp, tiles.bq
        self.count = pl.cdiv(n, k)
        if along == "p":
            self.ok = (pl.program_id(0) * self.bp
                       + lax.broadcasted_iota(jnp.int32, (self.bp, 1), 0)) < P
            self.ragged = P % self.bp != 0
            self.rows_shape = (1, k)
        else:
            self.ok = (pl.program_id(1) * self.bq
                       + lax.broadcasted_iota(jnp.int32, (1, self.bq), 1)) < Q
            self.ragged = Q % self.bq != 0
            self.rows_shape = (k, 1)
        self.index = lax.broadcasted_iota(jnp.int32, self.rows_shape, 1 if along == "p" else 0)

    @property
    def shape(self):
        return (self.bp, self.k) if self.along == "p" else (self.k, self.bq)

    @property
    def row_shape(self):
        return (self.bp, 1) if self.along == "p" else (1, self.bq)

    def zero(self):
        return jnp.zeros(self.row_shape, self.dtype)

    def bounds(self, t):
        """(start, first) of tile t: the first row it reads and the first it solves (the last
        tile reads the final k rows, some of which belong to the tile before it)."""
        first = t * self.k
        return jnp.minimum(first, self.n - self.k), first

    def _view(self, ref, start, rows):
        """The (bp|1, rows|1, bq|1) block of rows start.. (all three dims kept: Pallas Triton
        does not lower a load indexed by a scalar and a slice together)."""
        if ref.shape[1] == 1:  # broadcast along the rows: its one row, whole
            return ref
        return ref.at[:, pl.ds(jnp.asarray(start, int), rows), :]

    def _flat(self, block_shape):
        """The 2-D shape of a view: (bp|1, rows|1) in "p", (rows|1, bq|1) in "q"."""
        p, r, q = block_shape
        return (p, r) if self.along == "p" else (r, q)

    def _load(self, ref, view):
        full = ref.shape[0] > 1 if self.along == "p" else ref.shape[2] > 1
        if not (full and self.ragged):
            return view[...].reshape(self._flat(view.shape))
        mask = jnp.broadcast_to(self._mask3(), view.shape)
        if _TRITON is not None:
            value = _TRITON.load(view, mask=mask)
        else:
            value = jnp.where(mask, view[...], 0)
        return value.reshape(self._flat(view.shape))

    def _mask3(self):
        """`ok` as a (bp, 1, 1) or (1, 1, bq) block mask."""
        return self.ok[:, :, None] if self.along == "p" else self.ok[:, None, :]

    def _store(self, ref, view, value, mask):
        """Store a 2-D (k or 1 rows) value where `mask` (2-D) holds."""
        value = value.astype(ref.dtype).reshape(view.shape)
        mask = mask.reshape(view.shape)
        if _TRITON is not None:
            _TRITON.store(view, value, mask=mask)
        else:
            view[...] = jnp.where(mask, value, view[...])

    def read(self, ref, start):
        """Rows start .. start+k-1 of ref (in range), as k rows in the compute dtype; an
        operand broadcast along the systems or the rows is broadcast to them."""
        tile = jnp.broadcast_to(self._load(ref, self._view(ref, start, self.k))
                                .astype(self.dtype), self.shape)
        if self.k == 1:
            return [tile]
        return jnp.split(tile, self.k, axis=1 if self.along == "p" else 0)

    def read_row(self, ref, i):
        """Row i (in range): the one value a tile needs from beyond its rows."""
        value = self._load(ref, self._view(ref, i, 1)).astype(self.dtype)
        return jnp.broadcast_to(value, self.row_shape)

    def write(self, ref, start, rows, first):
        """Store k rows at start.. where the row is at least `first` (and the system exists)."""
        tile = jnp.zeros(self.shape, self.dtype)
        for j, row in enumerate(rows):
            tile = jnp.where(self.index == j, row, tile)
        mask = jnp.broadcast_to((start + self.index >= first) & self.ok, self.shape)
        self._store(ref, self._view(ref, start, self.k), tile, mask)

    def store_row(self, ref, i, row):
        """Store one row (the final state of a recurrence)."""
        value = jnp.broadcast_to(row, self.row_shape)
        self._store(ref, self._view(ref, i, 1), value, jnp.broadcast_to(self.ok, self.row_shape))


def _tiles(P: int, Q: int, along: str) -> Tiles:
    if along == "p":
        return Tiles(bp=min(P_SYSTEMS, 1 << max(0, (P - 1).bit_length())), bq=1,
                     num_warps=WARPS)
    return Tiles(bp=1, bq=Q_SYSTEMS, num_warps=WARPS)


def _thomas_kernel(l_ref, d_ref, u_ref, b_ref, x_ref, c_ref, *extra, n, k, along, transposed,
                   tiles, P, Q, compiled):
    y_ref = extra[0] if extra else x_ref  # y' in the compute dtype for a half-precision x
    rows = RowTiles(P, Q, n, k, tiles, along, y_ref.dtype)
    divide = _correctly_rounded_quotient if compiled else (lambda a, b: a / b)

    def forward(t, carry):
        c_prev, y_prev = carry
        start, first = rows.bounds(t)
        if transposed:  # sub(i) = u[i-1], sup(i) = l[i+1], from the tile and one row beyond it
            sub = [rows.read_row(u_ref, jnp.maximum(start - 1, 0))] + rows.read(u_ref, start)[:-1]
            sup = rows.read(l_ref, start)[1:] + [rows.read_row(l_ref, jnp.minimum(start + k, n - 1))]
        else:
            sub, sup = rows.read(l_ref, start), rows.read(u_ref, start)
        d, b = rows.read(d_ref, start), rows.read(b_ref, start)
        cs, ys = [], []
        for j in range(k):
            i = start + j
            a = jnp.where(i > 0, sub[j], 0)  # row 0's lower band lies outside the matrix
            s = jnp.where(i < n - 1, sup[j], 0)  # and row N-1's upper band
            p = d[j] - a * c_prev
            c = divide(s, p)
            y = divide(b[j] - a * y_prev, p)
            solves = i >= first
            c_prev, y_prev = jnp.where(solves, c, c_prev), jnp.where(solves, y, y_prev)
            cs.append(c_prev)
            ys.append(y_prev)
        rows.write(c_ref, start, cs, first)
        rows.write(y_ref, start, ys, first)
        return c_prev, y_prev

    lax.fori_loop(0, rows.count, forward, (rows.zero(), rows.zero()))

    def backward(s, x_next):
        start, first = rows.bounds(rows.count - 1 - s)
        c, y = rows.read(c_ref, start), rows.read(y_ref, start)
        xs = [None] * k
        for j in reversed(range(k)):
            i = start + j
            x = jnp.where(i < n - 1, y[j] - c[j] * x_next, y[j])
            x_next = jnp.where(i >= first, x, x_next)
            xs[j] = x_next
        rows.write(x_ref, start, xs, first)
        return x_next

    lax.fori_loop(0, rows.count, backward, rows.zero())


def solve_pnq(l, d, u, b, *, transposed: bool, out_dtype, interpret: bool = False,
              compiler_params=None, rows: int | None = None):
    """The plain solve of (P|1, N|1, Q|1) operands along axis 1 (`applies`); returns (P, N, Q).
    `rows`: at most this many rows a tile (None: the compiled kernels' choice)."""
    P, N, Q = broadcast_shape(l, d, u, b)
    cdt = compute_dtype(out_dtype)
    along = orientation(P, N, Q, cdt)
    outs = [(N, out_dtype), (N, cdt)]
    if jnp.dtype(cdt) != jnp.dtype(out_dtype):
        outs.append((N, cdt))
    kernel = functools.partial(_thomas_kernel, n=N, k=_rows_per_tile(N, cdt, along, rows),
                               along=along, transposed=transposed, compiled=not interpret)
    return launch(kernel, (l, d, u, b), outs, name="tridiax_thomas_rows", interpret=interpret,
                  tiles=_tiles(P, Q, along), compiler_params=compiler_params)[0]


def recurrence_applies(P: int, T: int, Q: int, dtype) -> bool:
    """Whether a recurrence over (P, T, Q) runs this module's kernel (real, either
    orientation)."""
    return orientation(P, T, Q, dtype) is not None


def _recurrence_kernel(a_ref, x_ref, h0_ref, h_ref, *, T, k, along, reverse, shifted,
                       activation, final_only, tiles, P, Q):
    rows = RowTiles(P, Q, T, k, tiles, along, compute_dtype(h_ref.dtype))
    act = activation or (lambda v: v)

    def step(s, h):
        start, first = rows.bounds(rows.count - 1 - s if reverse else s)
        a, x = rows.read(a_ref, start), rows.read(x_ref, start)
        if shifted:  # the coefficient of the previous step's index, from one row beyond
            if reverse:
                a = a[1:] + [rows.read_row(a_ref, jnp.minimum(start + k, T - 1))]
            else:
                a = [rows.read_row(a_ref, jnp.maximum(start - 1, 0))] + a[:-1]
        hs = [None] * k
        for j in (reversed(range(k)) if reverse else range(k)):
            t = start + j
            coefficient = a[j]
            if shifted:  # zero at the first step
                coefficient = jnp.where(t == (T - 1 if reverse else 0), 0, coefficient)
            h_new = jnp.broadcast_to(act(coefficient * h + x[j]), rows.row_shape)
            h = jnp.where(t >= first, h_new, h)
            hs[j] = h
        if not final_only:
            rows.write(h_ref, start, hs, first)
        return h

    h0 = rows.read_row(h0_ref, 0)
    h = lax.fori_loop(0, rows.count, step, h0)
    if final_only:
        rows.store_row(h_ref, 0, h)


def recurrence_pnq(a, x, h0, *, reverse: bool, shifted: bool, activation, final_only: bool,
                   out_dtype, interpret: bool = False, compiler_params=None,
                   rows: int | None = None):
    """`_pallas_recurrence.recurrence_pnq` by tiles of rows (`recurrence_applies`); `rows` as
    for `solve_pnq`."""
    P, T, Q = broadcast_shape(a, x, h0)
    cdt = compute_dtype(out_dtype)
    along = orientation(P, T, Q, cdt)
    kernel = functools.partial(_recurrence_kernel, T=T, k=_rows_per_tile(T, cdt, along, rows),
                               along=along, reverse=reverse, shifted=shifted,
                               activation=activation, final_only=final_only)
    return launch(kernel, (a, x, h0), [(1 if final_only else T, out_dtype)],
                  name="tridiax_recurrence_rows", interpret=interpret, tiles=_tiles(P, Q, along),
                  compiler_params=compiler_params)[0]
