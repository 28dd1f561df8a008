"""Banded solves as a Pallas kernel over the (P, N, Q) view (tiles: `_pallas/tiles.py`).

The algorithm is `_xla_banded.solve_pnq`'s, step for step (read its docstring for the window,
the band layout and the three kinds); here each program owns a (bp, bq) tile of systems and
keeps the window of every lane in registers:

    W[r][c] = row (j + r) of the matrix solved, column (j + c),   r = 0..lo,  c = 0..lo + up.

The window's dimensions are small and static, so its rows and columns are Python lists of
(bp, bq) tiles (unrolled), while the walk over the N rows is a `fori_loop`. Step j loads row
j + lo (the window's last row) straight from scipy's layout of `ab`, optionally swaps the row of
largest |Re| + |Im| in column 0 to the top (first of equals, a NaN first, as jnp.argmax), stores
row 0 as row j of U (1/pivot, then the kept superdiagonals) and y[j], and eliminates column 0
from the other rows. Only rows 0..lo-1 are carried from one step to the next. Without pivoting,
row r of the window has nonzeros in columns 0..r + up only: the others are left out statically
(the XLA formulation computes them as w - m * 0: 0 too, unless a zero pivot already made the
system inf/NaN). The back substitution walks up, keeping the kept - 1 solution values below
row j.

Triton has no scratch memory, so U's kept columns (and y, for half precision, which is
eliminated in float32; otherwise y is stored in x and overwritten by the back substitution)
are extra outputs that the launcher drops. `ab` (l + u + 1, Pa, Na, Qa) is passed as it is, a
4-D operand whose blocks cover every band and the whole N axis; broadcast dims (size 1) are
read in place. Entries of `ab` outside the matrix are never used: an entry A[i, i + d] of the
matrix solved is read only if row i and column i + d both lie in 0..N-1 (ab is read at a clipped
index and the value replaced by 0 with a select otherwise), so a NaN there cannot leak, in either
orientation, as in the XLA formulation.

Tiles: `default_tiles` gives two systems per thread (64-system tiles, `Tiles.default`) while the
window is small, and one system per thread (32-system tiles) for larger windows, so that
ptxas's register count stays in range without spills (tests/banded/test_banded_pallas.py compiles
every kind for an H100).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax

from .._core.dtypes import compute_dtype
from .._core.split_complex import SplitComplex, SplitRef, as_split, real_dtype, select
from .._pallas.tiles import SYSTEMS_PER_PROGRAM, TileRows, Tiles, launch
from . import window as _window
from .xla import check_operands


def window_words(l: int, u: int, kind: str, transposed: bool, dtype) -> int:
    """32-bit registers one system's window needs: its rows' entries that can be nonzero and
    their right-hand sides (a row of lo + up + 1 entries each with pivoting)."""
    lo, up = (u, l) if transposed else (l, u)
    width = lo + up + 1
    entries = (lo + 1) * width if kind == "banded_pivoted" else sum(r + up + 1 for r in range(lo + 1))
    dtype = np.dtype(compute_dtype(dtype))
    return (entries + lo + 1) * (2 if dtype.kind == "c" else 1) * max(1, real_dtype(dtype).itemsize // 4)


# Windows of up to this many words per system take two systems per thread (64-system tiles);
# larger ones one (32-system tiles), which keeps ptxas's registers per thread in range (no
# spills for every kind and dtype up to (l, u) = (3, 3); tests/banded/test_banded_pallas.py).
TWO_SYSTEMS_PER_THREAD_WORDS = 12


def default_tiles(P: int, Q: int, *, l: int, u: int, kind: str, transposed: bool,
                  dtype) -> Tiles:
    """`Tiles.default`, with one system per thread for windows too large for two."""
    words = window_words(l, u, kind, transposed, dtype)
    systems = SYSTEMS_PER_PROGRAM if words <= TWO_SYSTEMS_PER_THREAD_WORDS else 32
    return Tiles.default(P, Q, systems=systems)


class _BandRows(TileRows):
    """`TileRows` plus masked rows of the 4-D `ab` operand, and values promoted to the compute
    dtype's kind (a real operand of a complex system becomes a SplitComplex)."""

    def __init__(self, P: int, Q: int, tiles: Tiles, cdt):
        super().__init__(P, Q, tiles, cdt)
        self.is_complex = jnp.issubdtype(cdt, jnp.complexfloating)

    def _kind(self, value):
        if self.is_complex:
            return as_split(value)
        return value.re if isinstance(value, SplitComplex) else value

    def row(self, ref, i):
        """Row i of a (P|1, N|1, Q|1) operand."""
        return self._kind(self.load(ref, i))

    def band(self, ref, k: int, i):
        """ab[k, :, i, :] of the tile (row 0 of a band broadcast along N)."""
        if isinstance(ref, SplitRef):
            return self._kind(SplitComplex(self._band(ref.re, k, i), self._band(ref.im, k, i)))
        return self._kind(self._band(ref, k, i))

    def _band(self, ref, k: int, i):
        if ref.shape[2] == 1:
            i = 0
        i, k = jnp.asarray(i, int), jnp.asarray(k, int)  # masked loads want traced indices
        return self.read(ref.at[k, :, i, :], self.mask_for(ref.shape[1] > 1, ref.shape[3] > 1))

    def zero(self):
        z = jnp.zeros((self.bp, self.bq), self.dtype)
        return SplitComplex(z, z) if self.is_complex else z


def _kernel(ab_ref, b_ref, x_ref, *work, n, l, u, kind, transposed, half, tiles, P, Q, cdt):
    rows = _BandRows(P, Q, tiles, cdt)
    full = rows.full
    lo, up = (u, l) if transposed else (l, u)
    width = lo + up + 1
    pivoting, hermitian = kind == "banded_pivoted", kind == "banded_hermitian"
    kept = _window.kept_columns(l, u, kind, transposed)
    u_refs = work[:kept]
    y_ref = work[kept] if half else x_ref  # y[j] is read back just before x[j] overwrites it
    zero = rows.zero()

    def entry(i, d: int):
        """A[i, i + d] of the matrix solved, 0 outside it: row i and column i + d both in
        0..N-1 (else ab is read at a clipped index and the value dropped by a select). ab's
        column is i + d, or i when transposed (A^T[i, i + d] = A[i + d, i] = ab[u + d, i])."""
        k, index = (u + d, i) if transposed else (u - d, i + d)
        if isinstance(i, int):  # a row of the first window: decided statically
            if not (0 <= i < n and 0 <= i + d < n):
                return zero
            return full(rows.band(ab_ref, k, index))
        valid = (i < n) & (i + d >= 0) & (i + d < n)  # i >= 0 in the loop
        return full(select(valid, rows.band(ab_ref, k, jnp.clip(index, 0, n - 1)), zero))

    def load_row(i, shift: int, length: int):
        """Row i at columns i - shift .. i - shift + length - 1 (`length` <= width)."""
        return [entry(i, c - shift) if c - shift <= up else zero for c in range(length)]

    def row_length(r: int) -> int:
        # Columns of window row r that can be nonzero: all of them once rows are interchanged;
        # without pivoting, row r reaches column r + up only (its band ends there).
        return width if pivoting else r + up + 1

    def rhs(i):
        if isinstance(i, int):
            return full(rows.row(b_ref, i)) if i < n else zero
        return full(select(i < n, rows.row(b_ref, jnp.minimum(i, n - 1)), zero))

    def forward(j, carry):
        window, values = carry
        window = [*window, load_row(j + lo, lo, row_length(lo))]
        values = [*values, rhs(j + lo)]
        inverse, head, y, rest, rest_values = _window.eliminate(
            window, values, pivoting=pivoting, hermitian=hermitian, zero=zero, full=full)
        for ref, value in zip(u_refs, [inverse, *head[: kept - 1]], strict=True):
            rows.store(ref, j, value)
        rows.store(y_ref, j, y)
        return rest, rest_values

    first = ([load_row(r, r, row_length(r)) for r in range(lo)], [rhs(r) for r in range(lo)])
    lax.fori_loop(0, n, forward, first)

    def backward(k, below):  # below[c] = x[j + 1 + c]
        j = n - 1 - k
        urow = [rows.row(ref, j) for ref in u_refs]
        y = rows.row(y_ref, j)
        if kept > 1:
            total = urow[1] * below[0]
            for c in range(2, kept):
                total = total + urow[c] * below[c - 1]
            y = y - total
        x = full(y * urow[0])
        rows.store(x_ref, j, x)
        return [x, *below][: kept - 1]

    lax.fori_loop(0, n, backward, [zero] * (kept - 1))


def solve_pnq(ab, b, *, l: int, u: int, kind: str, transposed: bool, out_dtype,
              interpret: bool = False, compiler_params=None, tiles=None):
    """Solve A x = b (A^T x = b when `transposed`) for every system along axis 1, with the
    semantics of `_xla_banded.solve_pnq`.

    `ab`: (l + u + 1, P|1, N|1, Q|1) bands in scipy's layout along axis 2; `b`: (P, N, Q).
    `kind`: "banded", "banded_pivoted" or "banded_hermitian". `tiles`: a `Tiles` (default
    `default_tiles`); `compiler_params`: maps the tiles to the backend's CompilerParams
    (`_backend._triton_params`). Returns x, (P, N, Q) of `out_dtype`.
    """
    check_operands(ab, b, l=l, u=u, kind=kind)
    P, N, Q = b.shape
    out_dtype = np.dtype(out_dtype)
    if P * N * Q == 0:
        return jnp.zeros((P, N, Q), out_dtype)
    cdt = compute_dtype(out_dtype)
    is_complex = jnp.issubdtype(cdt, jnp.complexfloating)

    def operand(x):
        if not (jnp.issubdtype(x.dtype, jnp.floating)
                or jnp.issubdtype(x.dtype, jnp.complexfloating)):
            return x.astype(cdt)
        if jnp.iscomplexobj(x) and not is_complex:
            return x.real  # astype(real) in the XLA kernel: the imaginary part is dropped
        return x

    ab, b = operand(ab), operand(b)
    half = np.dtype(cdt) != out_dtype
    kept = _window.kept_columns(l, u, kind, transposed)
    tiles = tiles or default_tiles(P, Q, l=l, u=u, kind=kind, transposed=transposed,
                                   dtype=cdt)
    outs = [(N, d) for d in [out_dtype] + [cdt] * kept + ([cdt] if half else [])]
    kernel = functools.partial(_kernel, n=N, l=l, u=u, kind=kind, transposed=transposed,
                               half=half, cdt=np.dtype(cdt))
    return launch(kernel, (ab, b), outs, name="tridiax_banded", interpret=interpret,
                  tiles=tiles, compiler_params=compiler_params)[0]
