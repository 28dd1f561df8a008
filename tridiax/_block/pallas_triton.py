"""Block-tridiagonal solves as a Pallas (Triton) kernel over the (P, N, Q) view (tiles:
`_pallas/tiles.py`).

The algorithm is block Thomas, as `_xla_block.solve_pnq` states it for every backend. Row block
i of a system reads L[i] x[i-1] + D[i] x[i] + U[i] x[i+1] = b[i] (k x k blocks, m right-hand
sides); `transposed` solves A^T x = b, whose blocks are L'[i] = U[i-1]^T, D'[i] = D[i]^T,
U'[i] = L[i+1]^T. The forward sweep forms S = D[i] - L[i] E[i-1] and t = b[i] - L[i] y[i-1] and
solves S [E[i] | y[i]] = [U[i] | t] by Gaussian elimination of the k x (2k + m) augmented
matrix: column by column, optionally (kind "block_pivoted") swapping up the row of largest
|Re| + |Im| (first of equals, a NaN first, as jnp.argmax), then back substitution. The kind
"block_hermitian" does not pivot and makes a pivot whose real part is not positive NaN, which
spreads to its whole system. The backward sweep gives x[N-1] = y[N-1], x[i] = y[i] - E[i] x[i+1].

Each program owns a (bp, bq) tile of systems; the k x k entries are small and static, so the
blocks are Python lists of (bp, bq) tiles (unrolled over k), while the walks over the N block
rows are `fori_loop`s. L[0] and U[N-1] lie outside the matrix and are never used: they are read
at a clipped index and replaced by 0 with a select, so a NaN there cannot leak.

Layout: `launch` tiles (P, ·, Q) and takes leading dimensions whole, so the wrapper moves each
block's trailing (k, k) (b's (k, m)) to a leading k*k (k*m) axis, and x comes back as rows
(i, r, j) of a (P, N*k*m, Q) output moved back to (P, N, Q, k, m): on a GPU each of these is a
copy (an XLA transpose) of the operand, which about doubles the memory traffic of a solve.
Triton has no scratch memory, so E (and y for half precision, which is eliminated in float32;
otherwise y is stored in x and overwritten by the backward sweep) are extra outputs that the
launcher drops.

Loads and stores: a block row's k*k (k*m) entries are one masked load or store of a
(length, bp, bq) tensor per power-of-two piece of their count (one for k = 2, 4, 8; 8 + 1 for
k = 3), split into entries in registers (`_unstack`: Triton splits pairs) or joined
(`_stack`). Triton's coalescing pass walks the whole loop body for each load and store, so
its time grows as (memory operations) x (operations), which a load per entry would make
quadratic in k^2.

Tiles: `default_tiles` gives two systems per thread (64-system tiles) for k = 1 and one system
per thread (32-system tiles) otherwise, the fewest registers a thread can have here; they still
grow as k^2 (the carried E[i-1] alone is k*k values per system), which is why larger blocks
run XLA's loop by default (`_core/backend.py`, PALLAS_BLOCK_LIMIT; tests/block/test_block_pallas.py
compiles each k for an H100 and reads its registers and spills).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from .._banded.pallas_triton import _BandRows
from .._core.dtypes import compute_dtype
from .._core.split_complex import SplitComplex, SplitRef, as_split, select
from .._pallas.tiles import _TRITON, SYSTEMS_PER_PROGRAM, Tiles, launch
from .elimination import apply, eliminate, product
from .xla import KINDS


def default_tiles(P: int, Q: int, *, k: int) -> Tiles:
    """`Tiles.default`: two systems per thread for scalar blocks (k = 1), one for larger ones."""
    return Tiles.default(P, Q, systems=SYSTEMS_PER_PROGRAM if k == 1 else 32)


def gauss(S, R, *, pivoting: bool, hermitian: bool):
    """X with S X = R, by Gaussian elimination (k x k S and k x w R: lists of rows of values;
    `_block/elimination.py`)."""
    return apply(eliminate(S, pivoting=pivoting, hermitian=hermitian), R)


def _unstack(value):
    """The 2^L values along the last axis of `value`, in order (Triton splits pairs only)."""
    if value.shape[-1] == 1:
        return [value.reshape(value.shape[:-1])]
    even, odd = lax.unstack(value.reshape(*value.shape[:-1], value.shape[-1] // 2, 2), axis=-1)
    return [v for pair in zip(_unstack(even), _unstack(odd), strict=True) for v in pair]


def _stack(values):
    """`_unstack`'s inverse: 2^L values stacked along a new last axis (by pairs)."""
    if len(values) == 1:
        return values[0].reshape(*values[0].shape, 1)
    even, odd = _stack(values[0::2]), _stack(values[1::2])
    return lax.stack([even, odd], axis=-1).reshape(*even.shape[:-1], len(values))


def _pieces(size: int) -> list[tuple[int, int]]:
    """(start, length) of the power-of-two pieces of 0..size-1, largest first (9: 8 + 1)."""
    lengths = [1 << bit for bit in reversed(range(size.bit_length())) if size >> bit & 1]
    return [(sum(lengths[:j]), length) for j, length in enumerate(lengths)]


class _BlockRows(_BandRows):
    """`_BandRows` plus whole block rows, loaded and stored in power-of-two pieces (module
    docstring)."""

    def _mask_along(self, ref, axis: int, full_p: bool, full_q: bool):
        """The tile's mask with a size-1 axis inserted where `ref`'s entries lie, or None."""
        mask = self.mask_for(full_p, full_q)
        return None if mask is None else jnp.expand_dims(mask, axis)

    def entries(self, ref, i):
        """Row i of a (r, P|1, N|1, Q|1) operand (row 0 if broadcast along N): its r values."""
        if isinstance(ref, SplitRef):
            parts = zip(self._entries(ref.re, i), self._entries(ref.im, i), strict=True)
            return [self._kind(SplitComplex(re, im)) for re, im in parts]
        return [self._kind(v) for v in self._entries(ref, i)]

    def _entries(self, ref, i):
        i = jnp.asarray(0 if ref.shape[2] == 1 else i, int)
        mask = self._mask_along(ref, 0, ref.shape[1] > 1, ref.shape[3] > 1)
        values = []
        for start, length in _pieces(ref.shape[0]):
            view = ref.at[pl.ds(start, length), :, i, :]
            value = self.read(view, None if mask is None else jnp.broadcast_to(mask, view.shape))
            values += _unstack(jnp.moveaxis(value, 0, -1))
        return values

    def group(self, ref, i, size: int):
        """Rows i*size .. i*size + size - 1 of a (P, rows, Q) output, as a list."""
        if isinstance(ref, SplitRef):
            parts = zip(self.group(ref.re, i, size), self.group(ref.im, i, size), strict=True)
            return [SplitComplex(re, im) for re, im in parts]
        mask = self._mask_along(ref, 1, ref.shape[0] > 1, ref.shape[2] > 1)
        values = []
        for start, length in _pieces(size):
            view = ref.at[:, pl.ds(i * size + start, length), :]
            value = self.read(view, None if mask is None else jnp.broadcast_to(mask, view.shape))
            values += _unstack(jnp.moveaxis(value, 1, -1))
        return values

    def store_group(self, ref, i, values):
        """`group`'s inverse: values stored as rows i*len(values) .. of a (P, rows, Q) output."""
        if isinstance(ref, SplitRef):
            values = [as_split(v) for v in values]
            self.store_group(ref.re, i, [v.re for v in values])
            self.store_group(ref.im, i, [v.im for v in values])
            return
        size = len(values)
        mask = self._mask_along(ref, 1, ref.shape[0] > 1, ref.shape[2] > 1)
        for start, length in _pieces(size):
            piece = [self.full(v).astype(ref.dtype) for v in values[start:start + length]]
            value = jnp.moveaxis(_stack(piece), -1, 1)
            view = ref.at[:, pl.ds(i * size + start, length), :]
            if mask is None:
                view[...] = value
            elif _TRITON is not None:
                _TRITON.store(view, value, mask=jnp.broadcast_to(mask, value.shape))
            else:
                view[...] = jnp.where(mask, value, view[...])


def _kernel(l_ref, d_ref, u_ref, b_ref, x_ref, e_ref, *work, n, k, m, kind, transposed, tiles,
            P, Q, cdt):
    rows = _BlockRows(P, Q, tiles, cdt)
    full, zero = rows.full, rows.zero()
    y_ref = work[0] if work else x_ref  # y[i] is read back just before x[i] overwrites it
    pivoting, hermitian = kind == "block_pivoted", kind == "block_hermitian"

    def block(ref, i, transpose=False, valid=None):
        """Block i of a (k*k, P|1, N|1, Q|1) operand (transposed), 0 where not `valid`."""
        flat = rows.entries(ref, i)
        value = [[flat[c * k + r] if transpose else flat[r * k + c] for c in range(k)]
                 for r in range(k)]
        if valid is not None:
            value = [[select(valid, v, zero) for v in row] for row in value]
        return value

    def matrix(i):
        """L'[i], D'[i], U'[i] of the matrix solved, L'[0] = U'[N-1] = 0."""
        if transposed:
            return (block(u_ref, jnp.maximum(i - 1, 0), True, i > 0), block(d_ref, i, True),
                    block(l_ref, jnp.minimum(i + 1, n - 1), True, i < n - 1))
        return block(l_ref, i, valid=i > 0), block(d_ref, i), block(u_ref, i, valid=i < n - 1)

    def forward(i, carry):
        e, y = carry  # E[i-1], y[i-1] (zeros at i = 0)
        lower, diag, upper = matrix(i)
        flat = rows.entries(b_ref, i)
        le, ly = product(lower, e), product(lower, y)
        S = [[d - p for d, p in zip(dr, pr, strict=True)] for dr, pr in zip(diag, le, strict=True)]
        t = [[flat[r * m + j] - ly[r][j] for j in range(m)] for r in range(k)]
        X = gauss(S, [ur + tr for ur, tr in zip(upper, t, strict=True)], pivoting=pivoting,
                  hermitian=hermitian)
        e = [[full(v) for v in row[:k]] for row in X]
        y = [[full(v) for v in row[k:]] for row in X]
        rows.store_group(e_ref, i, [v for row in e for v in row])
        rows.store_group(y_ref, i, [v for row in y for v in row])
        return e, y

    zeros = [[zero] * k for _ in range(k)], [[zero] * m for _ in range(k)]
    _, y_last = lax.fori_loop(0, n, forward, zeros)

    def backward(s, x_next):
        i = n - 2 - s
        flat = rows.group(e_ref, i, k * k)
        ex = product([flat[r * k:(r + 1) * k] for r in range(k)], x_next)
        y = rows.group(y_ref, i, k * m)
        x = [[full(y[r * m + j] - ex[r][j]) for j in range(m)] for r in range(k)]
        rows.store_group(x_ref, i, [v for row in x for v in row])
        return x

    if work:  # y in a work output: x[N-1] = y[N-1] still to be stored
        rows.store_group(x_ref, n - 1, [v for row in y_last for v in row])
    lax.fori_loop(0, n - 1, backward, y_last)


def solve_pnq(lower, diag, upper, b, *, kind: str, transposed: bool, out_dtype,
              interpret: bool = False, compiler_params=None, tiles=None):
    """Solve A x = b (A^T x = b when `transposed`) for every block-tridiagonal system along
    axis 1, with the semantics of `_xla_block.solve_pnq`.

    `lower`, `diag`, `upper`: (P|1, N|1, Q|1, k, k) blocks (size-1 dims broadcast; lower[:, 0]
    and upper[:, N-1] are never used); `b`: (P, N, Q, k, m). `kind`: "block", "block_pivoted"
    or "block_hermitian". `tiles`: a `Tiles` (default `default_tiles`); `compiler_params`: maps
    the tiles to the backend's CompilerParams (`_backend._triton_params`). Returns x,
    (P, N, Q, k, m) of `out_dtype`.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if b.ndim != 5:
        raise ValueError(f"b must be (P, N, Q, k, m), got {b.shape}")
    P, N, Q, k, m = b.shape
    for name, x in (("lower", lower), ("diag", diag), ("upper", upper)):
        if x.ndim != 5 or x.shape[3:] != (k, k) or any(
                s not in (1, t) for s, t in zip(x.shape[:3], b.shape[:3], strict=True)):
            raise ValueError(f"{name} must be (P|1, N|1, Q|1, {k}, {k}) for b {b.shape}, "
                             f"got {x.shape}")
    out_dtype = np.dtype(out_dtype)
    if b.size == 0:
        return jnp.zeros(b.shape, out_dtype)
    if P == Q == 1:
        # Triton's compiler crashes (a segfault) on this kernel when every operand is one
        # system wide: solve b beside a zero right-hand side of the same matrix (which breaks
        # down exactly where b's system does) and keep b's.
        wide = jnp.concatenate([b, jnp.zeros_like(b)], axis=2)
        return solve_pnq(lower, diag, upper, wide, kind=kind, transposed=transposed,
                         out_dtype=out_dtype, interpret=interpret,
                         compiler_params=compiler_params, tiles=tiles)[:, :, :1]
    cdt = compute_dtype(out_dtype)
    is_complex = jnp.issubdtype(cdt, jnp.complexfloating)

    def operand(x):
        """x as (r*c, P|1, N|1, Q|1) in a dtype the kernel loads (complex only for complex
        systems: astype(real) drops the imaginary part, as in the XLA kernel)."""
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            x = x.astype(cdt)
        elif jnp.iscomplexobj(x) and not is_complex:
            x = x.real
        x = jnp.moveaxis(x, (3, 4), (0, 1))
        return x.reshape(-1, *x.shape[2:])

    half = np.dtype(cdt) != out_dtype
    tiles = tiles or default_tiles(P, Q, k=k)
    outs = [(N * k * m, out_dtype), (N * k * k, cdt)] + ([(N * k * m, cdt)] if half else [])
    kernel = functools.partial(_kernel, n=N, k=k, m=m, kind=kind, transposed=transposed,
                               cdt=np.dtype(cdt))
    x = launch(kernel, [operand(a) for a in (lower, diag, upper, b)], outs, name="tridiax_block",
               interpret=interpret, tiles=tiles, compiler_params=compiler_params)[0]
    return jnp.moveaxis(x.reshape(P, N, k, m, Q), 4, 2)
