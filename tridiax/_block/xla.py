"""Block-tridiagonal solves as a plain XLA program: the formulation every platform can run.

The matrix has N block rows of k x k blocks; row block i reads

    lower[i] @ x[i - 1] + diag[i] @ x[i] + upper[i] @ x[i + 1] = b[i]

(lower[0] and upper[N - 1] lie outside the matrix and are never used, whatever they hold).
`transposed` solves A^T x = b (the plain transpose, also for complex), whose blocks are
lower'[i] = upper[i - 1]^T, diag'[i] = diag[i]^T, upper'[i] = lower[i + 1]^T, read from the
same operands.

One algorithm for every backend (the native and Pallas kernels follow it step for step), block
Thomas with each diagonal block eliminated by Gaussian elimination:

    forward, i = 0..N-1:  S = diag[i] - lower[i] @ E[i - 1]      (S = diag[0] at i = 0)
                          t = b[i] - lower[i] @ y[i - 1]
                          S [E[i] | y[i]] = [upper[i] | t]
    backward:             x[N - 1] = y[N - 1],  x[i] = y[i] - E[i] @ x[i + 1]

The k x (k + m) system S [E | y] = [upper | t] is eliminated column by column: for column c,
(kind "block_pivoted") the row r >= c of largest |S[r, c]| (|Re| + |Im| for complex, first of
equals: LAPACK's getrf) is swapped with row c, the multiples S[r, c] / S[c, c] of row c are
subtracted from the rows below, and a back substitution inside the block finishes it. Kind
"block" never swaps (stable for block diagonally dominant matrices); kind "block_hermitian"
never swaps and makes a system NaN when a pivot's real part is not positive (a Hermitian
matrix that is not positive definite: its Schur complements S are Hermitian positive definite
exactly when A is). A singular S makes its own system inf/NaN and no other.

Here the loop runs over rows-first arrays, (N, k, k, P, Q): every step works on (k, k, P, Q)
slices whose last two dimensions are the systems, so XLA vectorises across them; the k loops
are unrolled (k is small and static), the N loop never is.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array, lax

from .._banded.xla import _swap
from .._core.dtypes import compute_dtype
from .._core.split_complex import magnitude

KINDS = ("block", "block_pivoted", "block_hermitian")


def solve_pnq(lower: Array, diag: Array, upper: Array, b: Array, *, kind: str,
              transposed: bool, out_dtype) -> Array:
    """Solve A x = b (A^T x = b when `transposed`) for every system along axis 1.

    `lower`, `diag`, `upper`: (P|1, N|1, Q|1, k, k) blocks (a size-1 dimension is
    broadcast); `b`: (P, N, Q, k, m). `kind`: one of KINDS (module docstring). Returns x,
    (P, N, Q, k, m) of `out_dtype` (half precision is eliminated in float32)."""
    _check_kind(kind)
    cdt = compute_dtype(out_dtype)
    blocks = _Blocks(*(_rows_first(x.astype(cdt)) for x in (lower, diag, upper)),
                     n=b.shape[1], transposed=transposed)
    rhs = _rows_first(b.astype(cdt))
    lu, _, e_rows, y_rows = _forward(blocks, rhs, kind=kind, record=False)
    del lu
    return _from_rows_first(_back_substitute(e_rows, y_rows)).astype(out_dtype)


def factor_pnq(lower: Array, diag: Array, upper: Array, *, kind: str, out_dtype):
    """The factors of every system's A, as (P, N, Q, ...) arrays (P, N, Q those of the
    broadcast blocks): `lu` (P, N, Q, k, k), each Schur complement S[i] eliminated in place
    (LAPACK's getrf layout: multipliers below the diagonal, U above it, but 1/pivot on it),
    `pivots` (P, N, Q, k, 1) int32 (the row swapped with row c at column c; c itself without
    pivoting) and `e` (P, N, Q, k, k), E[i] = S[i]^-1 upper[i]."""
    _check_kind(kind)
    cdt = compute_dtype(out_dtype)
    lower, diag, upper = (_rows_first(x.astype(cdt)) for x in (lower, diag, upper))
    n = max(x.shape[0] for x in (lower, diag, upper))
    k = diag.shape[1]
    P, Q = (max(x.shape[d] for x in (lower, diag, upper)) for d in (3, 4))
    blocks = _Blocks(lower, diag, upper, n=n, transposed=False)
    lu, pivots, e_rows, _ = _forward(blocks, jnp.zeros((n, k, 0, P, Q), cdt), kind=kind,
                                     record=True)
    return (_from_rows_first(lu), _from_rows_first(pivots[:, :, None]),
            _from_rows_first(e_rows))


def factored_solve_pnq(lu: Array, pivots: Array, e: Array, lower: Array, b: Array, *,
                       transposed: bool, out_dtype) -> Array:
    """Solve A x = b (or A^T x = b) with `factor_pnq`'s factors and the operator's `lower`
    blocks, all (P|1, N, Q|1, ...) broadcasting against b (P, N, Q, k, m); returns x (P, N,
    Q, k, m)."""
    cdt = compute_dtype(out_dtype)
    b = _rows_first(b.astype(cdt))
    n = b.shape[0]
    lu, e_rows = _rows_first(lu.astype(cdt)), _rows_first(e.astype(cdt))
    pivots = _rows_first(pivots)[:, :, 0]
    blocks = _Blocks(_rows_first(lower.astype(cdt)), None, None, n=n, transposed=False)
    zeros = (jnp.zeros(b.shape[1:], cdt), jnp.zeros_like(b))
    if not transposed:  # L y = b block forward (L: diagonal S[i], subdiagonal lower[i]), U x = y
        def forward(i, state):
            prev, ys = state
            t = lax.dynamic_index_in_dim(b, i, 0, keepdims=False) - _mm(blocks.lower(i), prev)
            y = _lu_solve(_row(lu, i), _row(pivots, i), t)
            return y, lax.dynamic_update_index_in_dim(ys, y, i, 0)

        _, y_rows = lax.fori_loop(0, n, forward, zeros)
        return _from_rows_first(_back_substitute(e_rows, y_rows)).astype(out_dtype)

    # A^T = U^T L^T: U^T z = b forward (z[i] = b[i] - E[i-1]^T z[i-1]), then L^T x = z
    # backward (x[i] = S[i]^-T (z[i] - lower[i+1]^T x[i+1])).
    def forward_t(i, state):
        prev, zs = state
        e_prev = _row(e_rows, jnp.maximum(i - 1, 0))
        z = lax.dynamic_index_in_dim(b, i, 0, keepdims=False) - jnp.where(
            i > 0, _mm(_t(e_prev), prev), 0)
        return z, lax.dynamic_update_index_in_dim(zs, z, i, 0)

    _, z_rows = lax.fori_loop(0, n, forward_t, zeros)

    def backward_t(step, state):
        below, xs = state
        i = n - 1 - step
        coupling = _t(blocks.lower(jnp.minimum(i + 1, n - 1)))
        w = lax.dynamic_index_in_dim(z_rows, i, 0, keepdims=False) - jnp.where(
            i < n - 1, _mm(coupling, below), 0)
        x = _lu_solve_transposed(_row(lu, i), _row(pivots, i), w)
        return x, lax.dynamic_update_index_in_dim(xs, x, i, 0)

    _, x_rows = lax.fori_loop(0, n, backward_t, zeros)
    return _from_rows_first(x_rows).astype(out_dtype)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown block kind {kind!r}; expected one of {KINDS}")


def _rows_first(x: Array) -> Array:
    """(P, N, Q, r, c) -> (N, r, c, P, Q)."""
    return jnp.transpose(x, (1, 3, 4, 0, 2))


def _from_rows_first(x: Array) -> Array:
    """(N, r, c, P, Q) -> (P, N, Q, r, c)."""
    return jnp.transpose(x, (3, 0, 4, 1, 2))


def _row(x: Array, i) -> Array:
    """Row i of a rows-first array (row 0 of one that is constant along the rows)."""
    return lax.dynamic_index_in_dim(x, 0 if x.shape[0] == 1 else i, 0, keepdims=False)


def _t(block: Array) -> Array:
    return jnp.swapaxes(block, 0, 1)


def _mm(a: Array, x: Array) -> Array:
    """a @ x per system: (k, k, P, Q) @ (k, c, P, Q) -> (k, c, P, Q), as k multiply-adds."""
    k = a.shape[1]
    out = a[:, 0, None] * x[None, 0]
    for s in range(1, k):
        out = out + a[:, s, None] * x[None, s]
    return out


class _Blocks:
    """Block row i of the matrix solved (A, or A^T read from A's blocks), zero outside it."""

    def __init__(self, lower, diag, upper, *, n: int, transposed: bool):
        self._lower, self._diag, self._upper = lower, diag, upper
        self.n, self.transposed = n, transposed

    def _read(self, x: Array, i, valid) -> Array:
        block = _row(x, jnp.clip(i, 0, self.n - 1))
        return jnp.where(valid, block, 0)

    def lower(self, i) -> Array:
        if self.transposed:
            return _t(self._read(self._upper, i - 1, i > 0))
        return self._read(self._lower, i, i > 0)

    def diag(self, i) -> Array:
        block = _row(self._diag, i)
        return _t(block) if self.transposed else block

    def upper(self, i) -> Array:
        if self.transposed:
            return _t(self._read(self._lower, i + 1, i < self.n - 1))
        return self._read(self._upper, i, i < self.n - 1)


def _eliminate(aug: Array, k: int, *, kind: str):
    """Gaussian elimination of the (k, w, P, Q) augmented matrix [S | R] (module docstring):
    the solution S^-1 R (k, w - k, P, Q), the eliminated S (multipliers below the diagonal,
    1/pivot on it) and the pivot rows (k, P, Q) int32."""
    pivoting, hermitian = kind == "block_pivoted", kind == "block_hermitian"
    pivots, inverses = [], []
    for c in range(k):
        rows = aug[c:]
        if pivoting and k - c > 1:
            p = jnp.argmax(magnitude(rows[:, c]), axis=0).astype(jnp.int32)  # first of equals
            rows = _swap(rows, p[None], axis=0)
            pivots.append(p + c)
        else:
            pivots.append(jnp.full(aug.shape[2:], c, jnp.int32))
        pivot = rows[0, c]
        if hermitian:
            pivot = jnp.where(pivot.real > 0, pivot, jnp.nan)
        inverse = 1 / pivot
        inverses.append(inverse)
        multipliers = rows[1:, c] * inverse  # (k - c - 1, P, Q)
        # Columns right of c are eliminated; column c keeps the multipliers (in place of the
        # zeros) and the columns left of it the earlier ones, which move with the swaps.
        below = jnp.concatenate([rows[1:, :c], multipliers[:, None],
                                 rows[1:, c + 1:] - multipliers[:, None] * rows[0, c + 1:]],
                                axis=1)
        aug = jnp.concatenate([aug[:c], rows[:1], below]) if c else jnp.concatenate(
            [rows[:1], below])
    # Back substitution: solution row c = (R[c] - sum_{s > c} U[c, s] solution[s]) / U[c, c].
    solution = [None] * k
    for c in reversed(range(k)):
        total = aug[c, k:]
        for s in range(c + 1, k):
            total = total - aug[c, s] * solution[s]
        solution[c] = total * inverses[c]
    eliminated = aug[:, :k]
    diagonal = jnp.arange(k)[:, None, None, None] == jnp.arange(k)[None, :, None, None]
    eliminated = jnp.where(diagonal, jnp.stack(inverses)[:, None], eliminated)
    return jnp.stack(solution), eliminated, jnp.stack(pivots)


def _forward(blocks: _Blocks, rhs: Array, *, kind: str, record: bool):
    """The forward sweep: E and y for every row (and, with `record`, S's elimination)."""
    n, k, m = rhs.shape[0], rhs.shape[1], rhs.shape[2]
    cdt = rhs.dtype
    P, Q = rhs.shape[3], rhs.shape[4]
    lu_shape = (n, k, k, P, Q) if record else (0,)

    def step(i, state):
        e_prev, y_prev, e_rows, y_rows, lu, pivots = state
        lower = blocks.lower(i)
        s = blocks.diag(i) - _mm(lower, e_prev)
        t = lax.dynamic_index_in_dim(rhs, i, 0, keepdims=False) - _mm(lower, y_prev)
        aug = jnp.concatenate([jnp.broadcast_to(s, (k, k, P, Q)),
                               jnp.broadcast_to(blocks.upper(i), (k, k, P, Q)),
                               jnp.broadcast_to(t, (k, m, P, Q))], axis=1)
        solution, eliminated, p = _eliminate(aug, k, kind=kind)
        e, y = solution[:, :k], solution[:, k:]
        e_rows = lax.dynamic_update_index_in_dim(e_rows, e, i, 0)
        y_rows = lax.dynamic_update_index_in_dim(y_rows, y, i, 0)
        if record:
            lu = lax.dynamic_update_index_in_dim(lu, eliminated, i, 0)
            pivots = lax.dynamic_update_index_in_dim(pivots, p, i, 0)
        return e, y, e_rows, y_rows, lu, pivots

    state = (jnp.zeros((k, k, P, Q), cdt), jnp.zeros((k, m, P, Q), cdt),
             jnp.zeros((n, k, k, P, Q), cdt), jnp.zeros((n, k, m, P, Q), cdt),
             jnp.zeros(lu_shape, cdt), jnp.zeros((n, k, P, Q) if record else (0,), jnp.int32))
    _, _, e_rows, y_rows, lu, pivots = lax.fori_loop(0, n, step, state)
    return lu, pivots, e_rows, y_rows


def _back_substitute(e_rows: Array, y_rows: Array) -> Array:
    """x[N - 1] = y[N - 1], x[i] = y[i] - E[i] @ x[i + 1], last row first."""
    n = y_rows.shape[0]

    def step(j, state):
        below, xs = state
        i = n - 1 - j
        x = lax.dynamic_index_in_dim(y_rows, i, 0, keepdims=False) - jnp.where(
            i < n - 1, _mm(_row(e_rows, i), below), 0)
        return x, lax.dynamic_update_index_in_dim(xs, x, i, 0)

    return lax.fori_loop(0, n, step, (jnp.zeros(y_rows.shape[1:], y_rows.dtype),
                                      jnp.zeros_like(y_rows)))[1]


def _lu_solve(lu: Array, pivots: Array, r: Array) -> Array:
    """S^-1 r from S's elimination (`_eliminate`, LAPACK's getrf convention S = P L U, the
    multipliers moved by the later swaps): the swaps applied to r (k, m, P, Q) in order, then
    L's forward and U's back substitution."""
    k = lu.shape[0]
    rows = _swapped(_rows_of(lu, r), pivots, range(k))
    for c in range(k):
        for s in range(c + 1, k):
            rows[s] = rows[s] - lu[s, c] * rows[c]
    for c in reversed(range(k)):
        total = rows[c]
        for s in range(c + 1, k):
            total = total - lu[c, s] * rows[s]
        rows[c] = total * lu[c, c]
    return jnp.stack(rows)


def _lu_solve_transposed(lu: Array, pivots: Array, r: Array) -> Array:
    """S^-T r = P L^-T U^-T r: U^T's forward substitution, L^T's back substitution, then the
    swaps in reverse order."""
    k = lu.shape[0]
    rows = _rows_of(lu, r)
    for c in range(k):  # U^T a = r: a[c] = (r[c] - sum_{s < c} U[s, c] a[s]) / U[c, c]
        total = rows[c]
        for s in range(c):
            total = total - lu[s, c] * rows[s]
        rows[c] = total * lu[c, c]
    for c in reversed(range(k)):
        for s in range(c + 1, k):
            rows[c] = rows[c] - lu[s, c] * rows[s]
    return jnp.stack(_swapped(rows, pivots, reversed(range(k))))


def _rows_of(lu: Array, r: Array) -> list:
    """r's k rows, broadcast against the factors' systems."""
    shape = r.shape[1:2] + jnp.broadcast_shapes(lu.shape[2:], r.shape[2:])
    return [jnp.broadcast_to(r[c], shape) for c in range(r.shape[0])]


def _swapped(rows: list, pivots: Array, order) -> list:
    """`rows` with row c exchanged with row pivots[c] (>= c, per system), c in `order`."""
    rows = list(rows)
    for c in order:
        p = pivots[c]
        chosen = rows[c]
        for s in range(c + 1, len(rows)):
            chosen = jnp.where(p == s, rows[s], chosen)
        rows = [jnp.where(p == s, rows[c], rows[s]) if s > c else rows[s]
                for s in range(len(rows))]
        rows[c] = chosen
    return rows
