"""One step of the banded elimination on the window as lists of tiles: what the Pallas kernels
(`pallas_triton.py`, `pallas_tpu.py`) share.

The window (`_xla_banded`'s docstring) is R = lo + 1 rows, each a list of tiles (a row's
entries that can be nonzero), and `values` their right-hand sides. The tiles may be real
arrays or `SplitComplex` pairs: `select` and `magnitude` take either.
"""

from __future__ import annotations

import jax.numpy as jnp

from .._core.split_complex import magnitude, select


def kept_columns(l: int, u: int, kind: str, transposed: bool) -> int:
    """Columns of U stored per row (1/pivot included): lo + up + 1 with pivoting, else up + 1."""
    lo, up = (u, l) if transposed else (l, u)
    return lo + up + 1 if kind == "banded_pivoted" else up + 1


def window_tiles(l: int, u: int, kind: str, transposed: bool) -> int:
    """Tiles of the window a step carries to the next: rows 1..lo (the entries each can hold,
    `eliminate`'s rest) and their right-hand sides."""
    lo, up = (u, l) if transposed else (l, u)
    width = lo + up + 1
    rows = lo * width if kind == "banded_pivoted" else sum(r + up + 1 for r in range(lo))
    return rows + lo


def eliminate(window, values, *, pivoting: bool, hermitian: bool, zero, full=lambda v: v,
              factors: bool = False):
    """Step j of the elimination: with `pivoting`, the row of largest |W[r, 0]| (|Re| + |Im|)
    swapped to the top (first of equals; a NaN first, as jnp.argmax); then row 0 kept and
    column 0 eliminated from the others. `hermitian`: a pivot whose real part is not positive
    becomes NaN. `zero`: the tile the eliminated rows gain at their end with pivoting;
    `full(tile)`: a tile broadcast to the kernel's tile shape. Returns (1/pivot, row 0's other
    entries, row 0's right-hand side, rows 1..R-1 eliminated, their right-hand sides), and with
    `factors` also the multipliers of rows 1..R-1 and the row swapped to the top (int32 tile,
    0 without pivoting): a factorization's entries (`_xla_banded.factor_pnq`)."""
    window, values = [list(row) for row in window], list(values)
    R = len(window)
    p = jnp.zeros(jnp.shape(magnitude(window[0][0])), jnp.int32)
    if pivoting and R > 1:
        size = [magnitude(row[0]) for row in window]
        best = size[0]
        for r in range(1, R):
            take = (size[r] > best) | (jnp.isnan(size[r]) & ~jnp.isnan(best))
            best = jnp.where(take, size[r], best)
            p = jnp.where(take, r, p)
        top, top_value = list(window[0]), values[0]
        for r in range(1, R):
            chosen = p == r
            top = [select(chosen, w, t) for w, t in zip(window[r], top, strict=True)]
            top_value = select(chosen, values[r], top_value)
            window[r] = [select(chosen, w0, w) for w0, w in zip(window[0], window[r], strict=True)]
            values[r] = select(chosen, values[0], values[r])
        window[0], values[0] = top, top_value
    pivot = window[0][0]
    if hermitian:
        pivot = select(pivot.real > 0, pivot, jnp.nan)
    inverse = 1 / pivot
    head = window[0][1:]
    rest, rest_values, multipliers = [], [], []
    for r in range(1, R):
        m = window[r][0] * inverse
        multipliers.append(m)
        row = [w - m * head[c] if c < len(head) else w for c, w in enumerate(window[r][1:])]
        if pivoting:
            row.append(zero)
        rest.append([full(v) for v in row])
        rest_values.append(full(values[r] - m * values[0]))
    if factors:
        return inverse, head, values[0], rest, rest_values, multipliers, full(p)
    return inverse, head, values[0], rest, rest_values
