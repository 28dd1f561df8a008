"""`check=True`: find the systems whose solve broke down and raise an error that counts them.

A system fails when its solution is not finite or its normwise backward error

    ||b - A x||_inf / (||A||_inf ||x||_inf + ||b||_inf)

exceeds sqrt(eps) of the dtype: half the digits lost in the backward sense, which a stable
solve (pivoted, or unpivoted on a diagonally dominant matrix) never comes near, and a zero or
tiny pivot always does.

How the error is raised depends on how the call runs (`run_checked`):
- eagerly (also under an eager jax.grad or jax.jvp, where the count carries no tangent), the
  count is a concrete number after the solve, and `BreakdownError` is raised directly from
  the call: a few lines of traceback, the count and what to do;
- under a transformation (jax.jit, equinox.filter_jit, vmap, grad), through
  `equinox.branched_error_if`, which is what JAX allows at run time: `equinox.filter_jit`
  shows it as a clean `EquinoxRuntimeError`, `jax.jit` inside JAX's `JaxRuntimeError`. Under
  vmap the message counts the systems of the whole vmapped batch (`breakdown_check_p`). The
  check rides on the tangents and cotangents too, so jit(grad(f)) raises even when the
  solution's value itself is never used.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import equinox as eqx
import jax.numpy as jnp
from jax import Array, lax
from jax.interpreters import ad, batching, mlir

from . import dispatch as _dispatch
from .primitive import VaryingPrimitive


class BreakdownError(RuntimeError):
    """Raised by a call with `check=True` when some systems failed (see `solve_tridiagonal`).

    Its message says how many of how many, and what to do. Under a transformation the same
    message arrives through `equinox.branched_error_if` (module docstring)."""

    __module__ = "tridiax"  # shown as tridiax.BreakdownError, its public name


@dataclasses.dataclass(frozen=True)
class BreakdownMessages(Sequence):
    """The error message for each possible number of failed systems (built on demand: a
    batch of a million systems must not make a million strings). Hashable, as equinox wants
    its messages static. The advice is the one that applies to the call that was checked."""

    total: int
    tolerance: float
    pivoting: bool
    periodic: bool = False
    # or "banded", "hermitian banded" (solveh_banded), "block-tridiagonal" or "hermitian
    # block-tridiagonal" (solveh_block_tridiagonal)
    family: str = "tridiagonal"

    def __len__(self) -> int:
        return self.total + 1

    def __getitem__(self, failed: int) -> str:
        if not 0 <= failed <= self.total:
            raise IndexError(failed)
        kind = f"periodic {self.family}" if self.periodic else self.family
        head = (f"tridiax: {failed} of {self.total} {kind} systems failed: the solution is "
                f"not finite or its backward error exceeds {self.tolerance:.1e}. ")
        if self.family == "hermitian banded":
            return head + (
                "solveh_banded factors A = L D L^H without pivoting and refuses (NaN) a matrix "
                "whose pivots are not all positive: those matrices are not Hermitian positive "
                "definite at this precision (or their inputs hold inf/NaN). Use "
                "tridiax.solve_banded (partial pivoting) for indefinite matrices.")
        if self.family == "hermitian block-tridiagonal":
            return head + (
                "solveh_block_tridiagonal eliminates without pivoting and refuses (NaN) a "
                "matrix with a pivot that is not positive: those matrices are not Hermitian "
                "positive definite at this precision (or their inputs hold inf/NaN). Use "
                "tridiax.solve_block_tridiagonal (pivoting inside the blocks) for indefinite "
                "matrices.")
        if self.family == "block-tridiagonal":
            if self.pivoting:
                return head + (
                    "The solve pivoted inside each diagonal block but not across block rows, so "
                    "those matrices are singular or nearly singular at this precision, or one "
                    "of their Schur complements is (although the matrix may not be: solve "
                    "those with tridiax.solve_banded and bandwidths (2k - 1, 2k - 1), which "
                    "pivots across rows), or their inputs hold inf/NaN.")
            return head + (
                "Without pivoting a zero or tiny pivot inside a diagonal block breaks the "
                "elimination; it is safe for block diagonally dominant or Hermitian positive "
                "definite matrices. Pass pivoting=True (partial pivoting inside the blocks); if "
                "the inputs hold inf/NaN, fix those.")
        if self.family == "banded":
            if self.pivoting:
                return head + (
                    "The solve pivoted (LAPACK's gbsv), so those matrices are singular or nearly "
                    "singular at this precision, or their inputs hold inf/NaN: check the "
                    "inputs, use float64, or regularise the problem.")
            return head + (
                "Without pivoting a zero or tiny pivot breaks the elimination; it is safe for "
                "diagonally dominant or Hermitian positive definite matrices. Pass "
                "pivoting=True (row interchanges, as LAPACK's gbsv); if the inputs hold "
                "inf/NaN, fix those.")
        if self.pivoting:
            tail = (" (or the tridiagonal part left by the Sherman-Morrison split is singular "
                    "although the cyclic matrix is not, as for a cyclic shift: solve those "
                    "systems densely)" if self.periodic else "")
            return head + (
                "The solve pivoted, so those matrices are singular or nearly singular at this "
                "precision, or their inputs hold inf/NaN" + tail + ": check the inputs, use "
                "float64, or regularise the problem.")
        return head + (
            "Without pivoting (the Thomas algorithm) a zero or tiny pivot breaks the solve; it "
            "is safe for diagonally dominant or symmetric positive definite matrices. Pass "
            "pivoting=True (row interchanges, as LAPACK's gtsv), or use a better-conditioned "
            "formulation; if the inputs hold inf/NaN, fix those.")


def uncounted(*arrays):
    """The count is not differentiated: no tangents or cotangents for its arithmetic, which
    runs in at least float32."""
    compute = jnp.promote_types(arrays[-1].dtype, jnp.float32)
    return [lax.stop_gradient(v).astype(compute) for v in arrays]


def count_failed(x: Array, rhs: Array, residual: Array, row_sums: Array, *, axis: int) -> Array:
    """Systems whose x is not finite or whose normwise backward error ||r|| / (||A|| ||x|| +
    ||b||) (inf-norms per system; ||A|| from the absolute row sums) exceeds the tolerance."""
    shape = x.shape
    tolerance = failure_tolerance(x.dtype)

    def norm(v):  # per system: max over the axis
        return jnp.max(jnp.broadcast_to(jnp.abs(v), shape), axis=axis)

    scale = norm(row_sums) * norm(x) + norm(rhs)
    error = norm(residual) / jnp.where(scale > 0, scale, 1)
    failed = ~(jnp.isfinite(error) & jnp.all(jnp.isfinite(x), axis=axis)) | (error > tolerance)
    return jnp.sum(failed, dtype=jnp.int32)


def failure_tolerance(dtype) -> float:
    return math.sqrt(float(jnp.finfo(dtype).eps))


def messages_for(shape, axis: int, dtype, *, pivoting: bool, periodic: bool,
                 family: str = "tridiagonal") -> BreakdownMessages:
    total = math.prod(shape) // shape[axis]
    return BreakdownMessages(total, failure_tolerance(dtype), bool(pivoting), bool(periodic),
                             family)


def run_checked(checked_call, args: tuple, compute, values: tuple, check: bool) -> Array:
    """A public solve: `call = checked_call(*args)` (a cached function of hashable settings
    and input signatures that raises for bad input and returns the computation's static part,
    with its `messages`), then `compute(call, *values)` through `_dispatch.run`; with `check`,
    compute returns (x, count), and a count > 0 raises `messages[count]`: directly
    (`BreakdownError`, in this frame: the user's traceback stays short) when the count is
    concrete, eagerly or under an eager grad or jvp; through equinox at run time when it is
    traced (module docstring)."""
    try:
        call = checked_call(*args)
    except TypeError as err:  # an unhashable setting: check it uncached, for its message
        if "unhashable" not in str(err):
            raise
        call = checked_call.__wrapped__(*args)
    out = _dispatch.run(compute, call, *values)
    if not check:
        return out
    x, count = out
    if _dispatch.is_traced(count):
        return _guard(x, count, call.messages)
    failed = int(count)
    if failed:
        raise BreakdownError(call.messages[failed])
    return x


def _guard(x: Array, count: Array, messages: BreakdownMessages) -> Array:
    """`x`, raising `messages[count]` when count > 0, in every mode of use.

    Under jit(grad(f)) the solution's value is often never used (the backward pass reads the
    primitive's own residuals), so XLA would drop a check attached to `x` alone. As the
    "solve" of an identity `lax.custom_linear_solve`, the check also runs on every tangent
    (forward mode) and, as its transpose solve, on every cotangent (reverse mode)."""

    def check(_, v):
        return breakdown_check_p.bind(v, count, messages=messages)

    return lax.custom_linear_solve(lambda v: v, x, solve=check, transpose_solve=check)


# The check as a primitive, `x = breakdown_check_p.bind(x, count, messages=...)`: `x`,
# raising `messages[count]` when count > 0. Equinox's branched_error_if, called inside the
# vmapped function, sees one instance: its count (the largest over the batch) and the
# static total of one instance's systems. This primitive's batching rule sees each vmapped
# dimension as it is added: it sums the count over that dimension and multiplies the total
# by its size, so the message, built only when the primitive is lowered (or evaluated),
# counts the whole batch, whether vmap runs outside or inside jit, nested or not. A count
# that is not batched along a vmapped dimension comes from the same systems in every
# instance (jax.jacrev maps over the cotangents of one solve): it and the total stay.
breakdown_check_p = VaryingPrimitive("tridiax_breakdown_check")


@breakdown_check_p.def_impl
def _check_impl(x, count, *, messages):
    # Evaluated on concrete values (an eager vmap evaluates the batched program op by op):
    # the error is raised here, as eagerly (run_checked).
    failed = int(count)
    if failed:
        raise BreakdownError(messages[failed])
    return x


@breakdown_check_p.def_abstract_eval
def _check_abstract_eval(x, count, *, messages):
    del count, messages
    return x


def _check_lowering(x, count, *, messages):
    return eqx.branched_error_if(x, count > 0, count, messages)


mlir.register_lowering(breakdown_check_p,
                       mlir.lower_fun(_check_lowering, multiple_results=False))


def _check_batch(args, dims, *, messages):
    (x, count), (x_dim, count_dim) = args, dims
    if count_dim is None:  # the same systems in every instance
        return breakdown_check_p.bind(x, count, messages=messages), x_dim
    size = count.shape[count_dim]
    whole = dataclasses.replace(messages, total=messages.total * size)
    count = jnp.sum(count, axis=count_dim, dtype=count.dtype)
    return breakdown_check_p.bind(x, count, messages=whole), x_dim


batching.primitive_batchers[breakdown_check_p] = _check_batch


def _check_jvp(primals, tangents, *, messages):
    (x, count), (x_dot, _) = primals, tangents
    out = breakdown_check_p.bind(x, count, messages=messages)
    if type(x_dot) is ad.Zero:
        return out, ad.Zero.from_primal_value(out)
    return out, breakdown_check_p.bind(x_dot, count, messages=messages)


def _check_transpose(ct, x, count, *, messages):
    del x
    if type(ct) is ad.Zero:
        return ct, None
    return breakdown_check_p.bind(ct, count, messages=messages), None


ad.primitive_jvps[breakdown_check_p] = _check_jvp
ad.primitive_transposes[breakdown_check_p] = _check_transpose
