"""Gaussian elimination of k x k blocks held as lists of values (row tiles of many systems, or
`SplitComplex` pairs of them), the step of block Thomas that the Pallas kernels unroll
(`_xla_block` states the algorithm).

`eliminate` factors S column by column (optionally swapping up the row of largest |S[r, c]|,
|Re| + |Im| for complex values, first of equals, a NaN first, as jnp.argmax; Hermitian kinds
make a pivot whose real part is not positive NaN) and keeps what `apply` needs to solve
S X = R later: its row choices, multipliers and U with 1/pivot. `apply` replays the swaps and
eliminations on R in the order `eliminate` made them, then substitutes back, so that
apply(eliminate(S), R) is the elimination of the augmented [S | R], operation for operation.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from .._core.split_complex import magnitude, select


@dataclasses.dataclass(frozen=True)
class Elimination:
    """S's elimination: for column c, `pivots[c]` (the row swapped with row c, a float32 tile
    of row numbers; None without pivoting), `multipliers[c]` (rows c+1.., after the swap) and
    `upper[c]` (1/pivot, then U's row c right of the diagonal)."""

    pivots: tuple
    multipliers: tuple
    upper: tuple

    def values(self) -> list:
        """Every tile, in a fixed order (the carry across rows)."""
        out = [v for row in self.multipliers for v in row]
        out += [v for row in self.upper for v in row]
        return out + [p for p in self.pivots if p is not None]

    @classmethod
    def from_values(cls, values, k: int, pivoting: bool) -> Elimination:
        values = list(values)
        multipliers = []
        for c in range(k):
            multipliers.append(tuple(values[:k - c - 1]))
            del values[:k - c - 1]
        upper = []
        for c in range(k):
            upper.append(tuple(values[:k - c]))
            del values[:k - c]
        pivots = tuple(values[:k]) if pivoting else (None,) * k
        return cls(pivots, tuple(multipliers), tuple(upper))


def carry_size(k: int, pivoting: bool) -> int:
    """Row tiles of an `Elimination`."""
    return k * k + (k if pivoting else 0)


def eliminate(S, *, pivoting: bool, hermitian: bool) -> Elimination:
    """Eliminate S (k lists of k values) column by column (module docstring)."""
    k = len(S)
    rows = [list(r) for r in S]
    pivots, multipliers, upper = [], [], []
    for c in range(k):
        if pivoting:
            # argmax of |rows[r][0]| (|Re| + |Im|) over r >= c, first of equals; a NaN wins first.
            size = [magnitude(row[0]) for row in rows]
            best, p = size[0], jnp.zeros_like(size[0]) + c
            for r in range(1, len(rows)):
                take = (size[r] > best) | (jnp.isnan(size[r]) & ~jnp.isnan(best))
                best, p = jnp.where(take, size[r], best), jnp.where(take, float(c + r), p)
            rows = _swap_rows(rows, p, c)
            pivots.append(p)
        else:
            pivots.append(None)
        head, *rows = rows
        pivot = head[0]
        if hermitian:
            pivot = select(pivot.real > 0, pivot, jnp.nan)
        inverse = 1 / pivot
        factors = [row[0] * inverse for row in rows]
        rows = [[a - f * h for a, h in zip(row[1:], head[1:], strict=True)]
                for f, row in zip(factors, rows, strict=True)]
        multipliers.append(tuple(factors))
        upper.append((inverse, *head[1:]))
    return Elimination(tuple(pivots), tuple(multipliers), tuple(upper))


def _swap_rows(rows, p, c: int):
    """`rows` (rows c.. of a matrix, as lists) with row c exchanged with row p (a tile of row
    numbers >= c), per system."""
    top = rows[0]
    out = [None] + list(rows[1:])
    for r in range(1, len(rows)):
        chosen = p == float(c + r)
        top = [select(chosen, a, t) for a, t in zip(rows[r], top, strict=True)]
        out[r] = [select(chosen, a0, a) for a0, a in zip(rows[0], rows[r], strict=True)]
    out[0] = top
    return out


def apply(e: Elimination, R):
    """S^-1 R for S's elimination `e` and R (k lists of w values): the swaps and
    eliminations in the order `eliminate` made them, then the back substitution."""
    k = len(R)
    rows = [list(r) for r in R]
    for c in range(k):
        if e.pivots[c] is not None:
            rows[c:] = _swap_rows(rows[c:], e.pivots[c], c)
        head = rows[c]
        for f, r in zip(e.multipliers[c], range(c + 1, k), strict=True):
            rows[r] = [a - f * h for a, h in zip(rows[r], head, strict=True)]
    solution = []  # rows c + 1.. of the result
    for c in reversed(range(k)):
        inverse, *coefficients = e.upper[c]
        rhs = rows[c]
        for a, x in zip(coefficients, solution, strict=True):
            rhs = [v - a * w for v, w in zip(rhs, x, strict=True)]
        solution.insert(0, [v * inverse for v in rhs])
    return solution


def product(A, B):
    """A B for lists of rows of values (summed in the order of `_xla_block._mm`)."""
    return [[sum((row[s] * B[s][j] for s in range(1, len(B))), row[0] * B[0][j])
             for j in range(len(B[0]))] for row in A]


# LAPACK's getrf layout of S's elimination, as `_xla_block.factor_pnq` stores it: row r holds
# the multipliers of columns c < r (each moved by the swaps of the columns after c), 1/pivot at
# column r and U's row r right of it; the pivot rows separately. The factored solves below
# replay it as `_xla_block._lu_solve` and `_lu_solve_transposed` do, operation for operation.


def getrf(e: Elimination):
    """`e` in getrf's layout: (k lists of k values, the k pivot rows as float tiles; a column
    without pivoting gets its own row number)."""
    k = len(e.upper)
    rows = [[None] * k for _ in range(k)]
    for c in range(k):
        rows[c][c:] = list(e.upper[c])
        for r, f in zip(range(c + 1, k), e.multipliers[c], strict=True):
            rows[r][c] = f
    for c in range(1, k):  # column c's swap moves the multipliers of the columns before it
        if e.pivots[c] is not None:
            left = _swap_rows([row[:c] for row in rows[c:]], e.pivots[c], c)
            for row, moved in zip(rows[c:], left, strict=True):
                row[:c] = moved
    like = e.upper[0][0]
    pivots = [jnp.zeros(like.shape, jnp.float32) + c if p is None else p
              for c, p in enumerate(e.pivots)]
    return rows, pivots


def solve_getrf(lu, pivots, R):
    """S^-1 R from S's factors in getrf's layout (`lu`: k lists of k values, `pivots`: k
    float tiles of row numbers) and R (k lists of w values): the swaps in order, then L's
    forward and U's back substitution."""
    k = len(R)
    rows = [list(r) for r in R]
    for c in range(k):
        rows[c:] = _swap_rows(rows[c:], pivots[c], c)
    for c in range(k):
        for s in range(c + 1, k):
            rows[s] = [a - lu[s][c] * h for a, h in zip(rows[s], rows[c], strict=True)]
    for c in reversed(range(k)):
        total = rows[c]
        for s in range(c + 1, k):
            total = [a - lu[c][s] * h for a, h in zip(total, rows[s], strict=True)]
        rows[c] = [a * lu[c][c] for a in total]
    return rows


def solve_getrf_transposed(lu, pivots, R):
    """S^-T R (the plain transpose) from the factors `solve_getrf` takes: U^T's forward
    substitution, L^T's back substitution, then the swaps in reverse order."""
    k = len(R)
    rows = [list(r) for r in R]
    for c in range(k):
        total = rows[c]
        for s in range(c):
            total = [a - lu[s][c] * h for a, h in zip(total, rows[s], strict=True)]
        rows[c] = [a * lu[c][c] for a in total]
    for c in reversed(range(k)):
        for s in range(c + 1, k):
            rows[c] = [a - lu[s][c] * h for a, h in zip(rows[c], rows[s], strict=True)]
    for c in reversed(range(k)):
        rows[c:] = _swap_rows(rows[c:], pivots[c], c)
    return rows
