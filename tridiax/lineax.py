"""lineax interop: `tridiax.lineax.TDMA`, a lineax solver that runs tridiax's kernels.

```python
import jax.numpy as jnp, lineax as lx, tridiax
n = 8
diag, lower_diag, upper_diag = 4 * jnp.ones(n), jnp.ones(n - 1), jnp.ones(n - 1)
op = lx.TridiagonalLinearOperator(diag, lower_diag, upper_diag)   # (N,), (N-1,), (N-1,)
x = lx.linear_solve(op, jnp.ones(n), solver=tridiax.lineax.TDMA()).value
```

`tridiax.TDMA()` works in its place. A lineax operator is one system; `jax.vmap` over a batch
of operators and right-hand sides runs one batched kernel (tridiax's batching rule), not a
loop. Needs lineax (`pip install ".[lineax]"`).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

try:
    import lineax as lx
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tridiax.lineax needs lineax, an optional dependency: pip install lineax "
        "(or install tridiax with the extra: pip install \".[lineax]\")."
    ) from err

from . import _backend
from ._solve import solve

__all__ = ["TDMA"]


class TDMA(lx.AbstractLinearSolver):
    """The Thomas algorithm as a lineax solver, for operators tagged tridiagonal
    (`lineax.TridiagonalLinearOperator`, or any operator with `lineax.tridiagonal_tag`).

    By default no pivoting: stable for diagonally dominant and symmetric positive definite
    matrices; `pivoting=True` eliminates with row interchanges (as LAPACK's gtsv) for any
    nonsingular matrix. A zero pivot gives a non-finite solution, reported as
    `lineax.RESULTS.singular` (so `linear_solve(..., throw=True)` raises). Gradients w.r.t. the
    operator and the vector come from lineax's implicit differentiation, which calls this
    solver's transpose.

    A lineax operator is one system (its vector is flattened); batch with `jax.vmap`, which
    runs one batched kernel. `tridiax.TDMA()` works with `lineax.linear_solve` in the same
    way; this class also subclasses `lineax.AbstractLinearSolver`, for code that checks.

    **Fields** (static): `backend`, `block`, `pivoting` and `chunk` as in `tridiax.TDMA`.
    """

    backend: str | None = eqx.field(static=True, default=None)
    block: tuple[int, int] | None = eqx.field(static=True, default=None)
    pivoting: bool = eqx.field(static=True, default=False)
    chunk: int | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        _backend.check_solver_settings(self.backend, self.block, pivoting=self.pivoting)
        _backend.check_chunk(self.chunk, "pivoted" if self.pivoting else None)

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        return init_state(self, operator)

    def compute(self, state, vector, options: dict[str, Any]):
        return compute_solution(self, state, vector)

    def transpose(self, state, options: dict[str, Any]):
        return transpose_state(state), options

    def conj(self, state, options: dict[str, Any]):
        return conj_state(state), options

    def assume_full_rank(self) -> bool:
        return True


# The solver interface's work, shared by this TDMA and tridiax.TDMA (which duck-types it).

def init_state(solver, operator: lx.AbstractLinearOperator):
    """The bands (diag, lower, upper) of a square tridiagonal lineax operator."""
    name = "tridiax.lineax.TDMA" if isinstance(solver, TDMA) else "tridiax.TDMA"
    if operator.in_size() != operator.out_size():
        raise ValueError(
            f"{name} solves square systems; the operator maps {operator.in_size()} values to "
            f"{operator.out_size()}.")
    if not lx.is_tridiagonal(operator):
        raise ValueError(
            f"{name} needs a tridiagonal operator, got {type(operator).__name__} without "
            "lineax.tridiagonal_tag. Use lineax.TridiagonalLinearOperator(diag, lower_diag, "
            "upper_diag), or tag the operator if it is tridiagonal.")
    if jax.tree.structure(operator.in_structure()) != jax.tree.structure(
            operator.out_structure()):
        raise ValueError(f"{name} needs the same input and output structure.")
    return lx.tridiagonal(operator)


def compute_solution(solver, state, vector):
    """lineax's (solution, result, stats) for one system, with the solver's settings."""
    diag, lower, upper = state
    flat, unravel = ravel_pytree(vector)
    zero = jnp.zeros((1,), diag.dtype)
    # lineax stores the off-diagonals with N-1 entries; tridiax's bands have N (lower[0]
    # and upper[N-1] ignored).
    x = solve(jnp.concatenate([zero, lower]), diag, jnp.concatenate([upper, zero]), flat,
              axis=-1, backend=solver.backend, block=solver.block, pivoting=solver.pivoting,
              check=getattr(solver, "check", False), chunk=solver.chunk)
    result = lx.RESULTS.where(jnp.all(jnp.isfinite(x)), lx.RESULTS.successful,
                              lx.RESULTS.singular)
    return unravel(x), result, {}


def transpose_state(state):
    diag, lower, upper = state
    return diag, upper, lower


def conj_state(state):
    return tuple(jnp.conj(x) for x in state)
