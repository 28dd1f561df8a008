"""`solve_tridiagonal`: checks and arranges the inputs, then binds the primitive."""

from __future__ import annotations

import dataclasses
import functools

from jax import Array
from jax.typing import ArrayLike

from .._core import backend as _backend
from .._core.check import BreakdownMessages, messages_for, run_checked
from .._core.inputs import Plan, conform, plan_of, read, x64_enabled
from . import algebra
from .periodic import is_periodic
from .primitive import tridiagonal_solve_p

_NAMES = ("lower", "diag", "upper", "rhs")


def solve_tridiagonal(
    lower: ArrayLike, diag: ArrayLike, upper: ArrayLike, rhs: ArrayLike, *, axis: int = -1,
    pivoting: bool = False, check: bool = False,
) -> Array:
    r"""Solve many tridiagonal systems $Ax = b$ lying along `axis` of an N-d array.

    Along `axis`, row i of each system reads

        lower[i]*x[i-1] + diag[i]*x[i] + upper[i]*x[i+1] = rhs[i],

    the convention of `jax.lax.linalg.tridiagonal_solve`; `lower[0]` and `upper[-1]` are
    ignored whatever they hold. Every other axis is a batch axis.

    The same systems as `scipy.linalg.solve_banded((1, 1), ab, b)` solves, one per system:
    the Thomas algorithm by default, Gaussian elimination with partial pivoting (LAPACK's
    gtsv) with `pivoting=True`. The bands are not scipy's rows, though: scipy's `ab` stores
    the diagonals by column (`ab[u + i - j, j] == A[i, j]`), these by row, so its upper band
    is shifted by one. `ab[1]` is `diag`, `ab[2, :-1]` is `lower[1:]` and `ab[0, 1:]` is
    `upper[:-1]` (`ab[0, 0]`, `ab[2, -1]`, `lower[0]` and `upper[-1]` lie outside the
    matrix). Convert them as the second example below does, or pass scipy's `ab` as it is
    to `tridiax.solve_banded((1, 1), ab, b)`, which takes scipy's layout.

    **Arguments:**

    - `lower`, `diag`, `upper`: the bands; `rhs`: the right-hand sides. The four broadcast
      together under NumPy's rules (aligned at the right), and `axis` is a dimension of their
      broadcast shape. Bands of shape `(N, 1)` solve every column of an `(N, B)` right-hand
      side with one matrix (read, never copied B times); a band of size 1 along `axis` is
      constant along the systems. Bands of shape `(N,)` lie along the last axis: for systems
      along axis 0 of an `(N, B)` right-hand side they must be `(N, 1)`, and the error says
      so. The whole rule: [Shapes and axis](../guides/tridiagonal.md#shapes-and-axis).
    - `axis`: the axis the systems lie along (negative counts from the end).
    - `pivoting`: eliminate with row interchanges (partial pivoting, one fill-in diagonal, as
      LAPACK's gtsv): accurate for any nonsingular matrix (backward error of order eps*N),
      at about 1.2x the cost of the unpivoted solve on CPU ([Performance](../performance.md)).
    - `check`: after the solve, count the systems whose solution is not finite or whose
      backward error ||b - Ax|| / (||A|| ||x|| + ||b||) exceeds sqrt(eps), and raise an error
      saying how many failed and what to do: `tridiax.BreakdownError` when called eagerly;
      under `jax.jit`, `equinox.filter_jit`, vmap and grad the same message arrives through
      `equinox.branched_error_if` (`equinox.filter_jit` shows it most clearly). Under vmap
      it counts the systems of the whole vmapped batch. Costs one matrix-vector product.

    **Returns:**

    `x` with the broadcast shape of the four inputs and their common dtype (float32, float64,
    complex64, complex128; float16 and bfloat16 are eliminated in float32 and rounded once).

    **Numerics:** without pivoting the solve is stable for diagonally dominant (|diag[i]| >=
    |lower[i]| + |upper[i]|, strictly in at least one row of each irreducible block) and
    symmetric positive definite matrices, and for M-matrices: most implicit diffusion and
    spline systems. Otherwise (Helmholtz, convection-dominated upwind schemes, general
    matrices) pass `pivoting=True`. A zero pivot gives inf/NaN in the affected systems only
    (every other system is solved exactly as if it were alone); a tiny one can give a finite,
    wrong answer, which `check=True` detects when it shows in the normwise backward error (in
    a badly scaled system, rows differing by many orders of magnitude, it can hide there:
    pivot, or scale the rows).

    **Performance:** the rows of each system are walked in place, whatever the axis: on CPU
    by a C++ kernel (built on first use; an XLA loop where no compiler is found), on GPU by
    a Pallas (Triton) kernel. Gradients (reverse and forward mode, w.r.t. all four inputs)
    cost one more solve plus elementwise work, by implicit differentiation; vmap at any
    `in_axes` adds a batch dimension without moving data.

    **Example:**

    ```python
    import jax.numpy as jnp, tridiax
    n = 5  # 3 systems of 5 rows along axis 0, one matrix for all: bands (n, 1)
    lower, diag, upper = -jnp.ones((n, 1)), 2 * jnp.ones((n, 1)), -jnp.ones((n, 1))
    x = tridiax.solve_tridiagonal(lower, diag, upper, jnp.ones((n, 3)), axis=0)  # (5, 3)
    ```

    From scipy's banded layout (`ab[0, 1:]` the upper diagonal, `ab[1]` the diagonal,
    `ab[2, :-1]` the lower one):

    ```python
    import numpy as np, tridiax
    ab = np.array([[0.0, 1, 2, 3], [5, 6, 7, 8], [4, 3, 2, 0]])  # A: 4 x 4
    b = np.ones(4)
    lower, diag, upper = np.roll(ab[2], 1), ab[1], np.roll(ab[0], -1)  # lower[i] = A[i, i-1]
    x = tridiax.solve_tridiagonal(lower, diag, upper, b)  # = solve_banded((1, 1), ab, b)
    ```
    """
    return solve(lower, diag, upper, rhs, axis=axis, pivoting=pivoting, check=check)


def solve_periodic_tridiagonal(
    lower: ArrayLike, diag: ArrayLike, upper: ArrayLike, rhs: ArrayLike, *, axis: int = -1,
    pivoting: bool = False, check: bool = False,
) -> Array:
    r"""Solve many cyclic (periodic) tridiagonal systems along `axis` of an N-d array.

    Row i of each system couples x[i-1], x[i] and x[i+1] with indices taken modulo N:

        lower[i]*x[(i-1) % N] + diag[i]*x[i] + upper[i]*x[(i+1) % N] = rhs[i],

    so `lower[0]` is the corner A[0, N-1] and `upper[N-1]` the corner A[N-1, 0] (rings,
    periodic grids, closed splines). Needs N >= 3.

    Solved by Sherman-Morrison, A = T' + u v^T with T' tridiagonal: T' differs from A in
    d'[0] = diag[0] - gamma and d'[N-1] = diag[N-1] - lower[0]*upper[N-1]/gamma, with the
    split gamma = -sign(diag[0]) * max(|diag[0]|, |lower[0]|, |upper[0]|) chosen per system so
    that row 0 of T' is diagonally dominant even when diag[0] is zero or tiny, and row N-1 of
    T' is dominant wherever row N-1 of A is. Without pivoting one kernel sweep eliminates T'
    for both right-hand sides (rhs and u): the bands and rhs are read once.

    **Arguments:** as `solve_tridiagonal` (shapes broadcast, any `axis`, same dtypes,
    `check`), and

    - `pivoting`: eliminate T' with partial pivoting (as `solve_tridiagonal(...,
      pivoting=True)`), for cyclic matrices that are not diagonally dominant. Costs 1.9-3.7x
      a pivoted solve on CPU (both right-hand sides through the pivoted kernel, then the
      correction; [Performance](../performance.md)).

    **Returns:** `x` with the broadcast shape of the inputs.

    **Numerics:** without pivoting, stable when rows 1..N-1 are diagonally dominant (row 0
    need not be: diag[0] may be zero). With pivoting, accurate for any nonsingular cyclic
    matrix whose tridiagonal part T' is nonsingular for the split chosen; some structured
    matrices have a singular T' for every split (a cyclic shift: lower = 1, diag = upper = 0),
    and give inf/NaN, which `check=True` reports: solve those densely. Gradients
    w.r.t. all four inputs by implicit differentiation, vmap at any in_axes, as for
    `solve_tridiagonal`.

    **Example:**

    ```python
    import jax.numpy as jnp, tridiax
    n = 8  # a ring of 8 nodes: x[i] - 0.25*(x[i-1] + x[i+1]) = 1 everywhere
    x = tridiax.solve_periodic_tridiagonal(-0.25 * jnp.ones(n), jnp.ones(n), -0.25 * jnp.ones(n), jnp.ones(n))
    ```
    """
    return solve(lower, diag, upper, rhs, axis=axis, periodic=True, pivoting=pivoting,
                 check=check)


def solve(lower, diag, upper, rhs, *, axis: int = -1, backend: str | None = None,
          periodic: bool = False, block=None, pivoting: bool = False,
          check: bool = False, chunk: int | None = None) -> Array:
    """`solve_tridiagonal` (or, `periodic`, `solve_periodic_tridiagonal`) with a backend
    override, Pallas block sizes (see `_core/backend.py`) and the chunk length of long systems
    (`_core/planner.py`); for tests and modules."""
    values, signatures = read(_NAMES, (lower, diag, upper, rhs))
    args = (signatures, axis, backend, periodic, block, pivoting, check, chunk, x64_enabled())
    return run_checked(_checked_call, args, _compute, values, check)


@dataclasses.dataclass(frozen=True)
class _SolveCall:
    """The static part of a checked call (hashable: the jit cache key)."""

    plan: Plan
    kind: str
    backend: str | None
    block: tuple[int, int] | None
    check: bool
    chunk: int | None
    messages: BreakdownMessages | None


@functools.lru_cache(maxsize=4096)
def _checked_call(signatures, axis, backend, periodic, block, pivoting, check, chunk,
                  x64) -> _SolveCall:
    """Every check of a call that needs no data, once per signature and settings (and JAX's
    64-bit mode, which `plan_of` reads)."""
    p = plan_of(signatures, _NAMES, axis)
    _backend.check_backend(backend, p.dtype)
    _backend.check_flags(pivoting=pivoting, check=check)
    if periodic:
        check_periodic_size(p.shape, p.axis)
    kind = ("periodic_pivoted" if pivoting else "periodic") if periodic else (
        "pivoted" if pivoting else "thomas")
    messages = messages_for(p.shape, p.axis, p.dtype, pivoting=bool(pivoting),
                            periodic=periodic) if check else None
    chunk = _backend.check_chunk(chunk, kind)
    return _SolveCall(p, kind, backend, _backend.check_block(block), bool(check), chunk,
                      messages)


def _compute(call: _SolveCall, *values):
    operands = conform(values, call.plan)
    x = tridiagonal_solve_p.bind(*operands, axis=call.plan.axis, transposed=False,
                                 backend=call.backend, kind=call.kind, block=call.block,
                                 chunk=call.chunk)
    if not call.check:
        return x
    return x, algebra.count_failures(x, *operands, axis=call.plan.axis,
                             periodic=is_periodic(call.kind))


def check_periodic_size(shape, axis: int) -> None:
    n = shape[axis]
    if n < 3:
        raise ValueError(
            f"a periodic system needs N >= 3 rows along axis {axis}, got N = {n}: with N < 3 "
            "the corners lower[0] and upper[N-1] fall on the ordinary off-diagonals. Solve it "
            "as an ordinary tridiagonal system with those entries added in."
        )
