"""`check=True`: find the systems whose solve broke down and raise an error that counts them.

A system fails when its solution is not finite or its normwise backward error

    ||b - A x||_inf / (||A||_inf ||x||_inf + ||b||_inf)

exceeds sqrt(eps) of the dtype: half the digits lost in the backward sense, which a stable
solve (pivoted, or unpivoted on a diagonally dominant matrix) never comes near, and a zero or
tiny pivot always does. The error is raised through `equinox.branched_error_if`, so it works
eagerly, under `jax.jit` and `equinox.filter_jit` (which gives the clearest traceback), under
vmap (the count is then that of the worst vmapped instance, out of the systems of one
instance), and in forward and reverse mode: the check rides on the cotangent too, so
jit(grad(f)) raises even when the solution's value itself is never used.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import equinox as eqx
import jax.numpy as jnp
from jax import Array, lax

from . import _bands


@dataclasses.dataclass(frozen=True)
class BreakdownMessages(Sequence):
    """The error message for each possible number of failed systems (built on demand: a
    batch of a million systems must not make a million strings). Hashable, as equinox wants
    its messages static."""

    total: int
    tolerance: float
    pivoting: bool

    def __len__(self) -> int:
        return self.total + 1

    def __getitem__(self, failed: int) -> str:
        if not 0 <= failed <= self.total:
            raise IndexError(failed)
        head = (f"tridiax: {failed} of {self.total} tridiagonal systems failed: the solution is "
                f"not finite or its backward error exceeds {self.tolerance:.1e}. ")
        if self.pivoting:
            return head + (
                "The solve pivoted, so those matrices are singular or nearly singular at this "
                "precision, or their inputs hold inf/NaN: check the inputs, use float64, or "
                "regularise the problem.")
        return head + (
            "Without pivoting (the Thomas algorithm) a zero or tiny pivot breaks the solve; it "
            "is safe for diagonally dominant or symmetric positive definite matrices. Pass "
            "pivoting=True (row interchanges, as LAPACK's gtsv), or use a better-conditioned "
            "formulation; if the inputs hold inf/NaN, fix those.")


def check_solution(x: Array, lower: Array, diag: Array, upper: Array, rhs: Array, *, axis: int,
                   periodic: bool, pivoting: bool) -> Array:
    """`x`, with a runtime error attached that fires when any system failed (see module)."""
    shape, solution = x.shape, x
    n, total = shape[axis], math.prod(shape) // shape[axis]
    tolerance = math.sqrt(float(jnp.finfo(x.dtype).eps))
    compute = jnp.promote_types(x.dtype, jnp.float32)
    # The count is not differentiated: no tangents or cotangents for its arithmetic.
    lower, diag, upper, rhs, x = (lax.stop_gradient(v).astype(compute)
                                  for v in (lower, diag, upper, rhs, x))

    def norm(v):  # per system: max over the axis
        return jnp.max(jnp.broadcast_to(jnp.abs(v), shape), axis=axis)

    residual = rhs - _bands.matvec(lower, diag, upper, x, axis=axis, periodic=periodic)
    # ||A||_inf: lower[0] and upper[N-1] are outside a non-periodic matrix, whatever they hold.
    row = jnp.arange(n).reshape([n if k == axis else 1 for k in range(len(shape))])
    lower, upper = jnp.abs(lower), jnp.abs(upper)
    if not periodic:
        lower, upper = jnp.where(row > 0, lower, 0), jnp.where(row < n - 1, upper, 0)
    scale = norm(lower + jnp.abs(diag) + upper) * norm(x) + norm(rhs)
    error = norm(residual) / jnp.where(scale > 0, scale, 1)
    failed = ~(jnp.isfinite(error) & jnp.all(jnp.isfinite(x), axis=axis)) | (error > tolerance)
    count = jnp.sum(failed, dtype=jnp.int32)
    return _guard(solution, count, BreakdownMessages(total, tolerance, pivoting))


def _guard(x: Array, count: Array, messages: BreakdownMessages) -> Array:
    """`x`, raising `messages[count]` when count > 0, in every mode of use.

    Under jit(grad(f)) the solution's value is often never used (the backward pass reads the
    primitive's own residuals), so XLA would drop a check attached to `x` alone. As the
    "solve" of an identity `lax.custom_linear_solve`, the check also runs on every tangent
    (forward mode) and, as its transpose solve, on every cotangent (reverse mode)."""

    def check(_, v):
        return eqx.branched_error_if(v, count > 0, count, messages)

    return lax.custom_linear_solve(lambda v: v, x, solve=check, transpose_solve=check)
