"""`solve_block_tridiagonal` and `solveh_block_tridiagonal`: block-tridiagonal systems with
small dense blocks, batched along any axis.

The checks (what the blocks, `rhs` and `axis` may be, and how `rhs` is read) look only at
shapes and dtypes, once per signature; the computation binds `block_solve_p`
(`_block/primitive.py`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from .._core import along_axis as _along
from .._core import backend as _backend
from .._core.check import BreakdownMessages, messages_for, run_checked
from .._core.inputs import Plan, plan_of, read, x64_enabled
from . import algebra
from .primitive import block_solve_p

_NAMES = ("lower", "diag", "upper", "rhs")


def solve_block_tridiagonal(lower: ArrayLike, diag: ArrayLike, upper: ArrayLike,
                            rhs: ArrayLike, *, axis: int = -1, pivoting: bool = True,
                            check: bool = False) -> Array:
    r"""Solve many block-tridiagonal systems $Ax = b$ with k x k blocks lying along `axis`.

    Along `axis`, block row i of each system reads

        lower[i] @ x[i-1] + diag[i] @ x[i] + upper[i] @ x[i+1] = rhs[i]

    with `lower[i]`, `diag[i]`, `upper[i]` k x k matrices and `x[i]`, `rhs[i]` k-vectors (or
    k x m matrices); `lower[0]` and `upper[N-1]` are ignored whatever they hold. k = 1 is
    `solve_tridiagonal`. Equivalent to assembling each system's Nk x Nk matrix and calling
    `scipy.linalg.solve`, or `scipy.linalg.solve_banded` with bandwidths (2k - 1, 2k - 1)
    (`tridiax.verify.reference_solve_block_tridiagonal` does both), in O(N k^3) work and
    O(N k^2) memory.

    **Arguments:**

    - `lower`, `diag`, `upper`: the blocks, shape `(..., N, ..., k, k)`: the two block
      dimensions are the last two, and `axis` counts in the dimensions before them (the
      batch and block-row dimensions), as `solve_tridiagonal` counts in its bands. The three
      broadcast together and with `rhs` under NumPy's rules, there: blocks of shape
      `(N, k, k)` are one matrix shared by every batch element of `rhs` (read once, never
      copied); a block array of size 1 along `axis` is the same block in every row.
    - `rhs`: `(..., N, ..., k)`, one right-hand side per system, or `(..., N, ..., k, m)`,
      m of them. When both readings fit a shape (its last two sizes are both k), the one whose
      dimensions before the block dimensions are as many as the blocks' is taken (the
      blocks' rank decides, as in NumPy 1's `linalg.solve`); if that does not decide, the
      call is refused with both readings.
    - `axis`: the block-row axis, counted in the dimensions before the block dimensions
      (negative from the end of those: the default -1 is the one just before them).
    - `pivoting`: block Thomas with each Schur complement $S_i = D_i - L_i S_{i-1}^{-1}
      U_{i-1}$ factored by Gaussian elimination with partial pivoting inside the block (the
      default). `pivoting=False` never swaps rows: faster, and stable for block diagonally
      dominant matrices. Neither pivots across block rows: a matrix whose Schur complements
      are singular (although A is not) fails; `check=True` finds those systems.
    - `check`: count the systems whose solution is not finite or whose normwise backward
      error exceeds sqrt(eps), and raise an error saying how many failed and what to do
      (`tridiax.BreakdownError` eagerly, through `equinox` under jit, vmap and grad; see
      `solve_tridiagonal`). Costs one block matrix-vector product.

    **Returns:**

    `x` with the broadcast shape of the inputs' leading dimensions, then `(k,)` or `(k, m)`
    as `rhs`, in their common dtype (float32, float64, complex64, complex128; float16 and
    bfloat16 are eliminated in float32).

    **Numerics and gradients:** a singular Schur complement gives inf/NaN in that system only.
    Gradients w.r.t. every block and `rhs` by implicit differentiation: the cotangent of
    `rhs` is one transposed solve (the same kernel reading the blocks of A^T), that of
    `diag[i]` is $-\bar b_i x_i^T$, of `lower[i]` $-\bar b_i x_{i-1}^T$ and of `upper[i]`
    $-\bar b_i x_{i+1}^T$; jvp, second order and vmap at any `in_axes` (no transposes unless a
    block dimension is mapped).

    **Example:**

    ```python
    import jax.numpy as jnp, tridiax
    n, k = 50, 2  # two coupled species on 50 points: 2 x 2 blocks, 8 systems side by side
    diag = jnp.broadcast_to(jnp.array([[4.0, 1.0], [0.5, 3.0]]), (8, n, k, k))
    off = jnp.broadcast_to(-jnp.eye(k), (8, n, k, k))
    x = tridiax.solve_block_tridiagonal(off, diag, off, jnp.ones((8, n, k)))  # (8, 50, 2)
    ```
    """
    return solve(lower, diag, upper, rhs, axis=axis, pivoting=pivoting, check=check)


def solveh_block_tridiagonal(lower: ArrayLike, diag: ArrayLike, rhs: ArrayLike, *,
                             axis: int = -1, check: bool = False) -> Array:
    r"""Solve many Hermitian (real symmetric) positive definite block-tridiagonal systems.

    The matrix of block row i has `diag[i]` (Hermitian) on the diagonal, `lower[i]` =
    A[i, i-1] below it and, above it, the conjugate transpose A[i-1, i] = `lower[i]`^H
    (`lower[0]` is ignored): the posterior precision of a linear-Gaussian state-space model,
    or a symmetric discretisation of coupled diffusion. Shapes, `axis`, `rhs`, dtypes and
    `check` as `solve_block_tridiagonal`; `diag` is used as given (nothing is symmetrised).

    The matrix is eliminated without pivoting (block Cholesky's Schur complements, each
    Hermitian positive definite exactly when A is): a pivot whose real part is not positive
    (A not positive definite, at this precision) makes that system NaN rather than a wrong
    answer, and `check=True` turns that into an error that counts them. Gradients, jvp and
    vmap as `solve_block_tridiagonal`; the gradient w.r.t. `lower[i]` accounts for both
    blocks it stands for.

    **Example:**

    ```python
    import jax.numpy as jnp, tridiax
    n, k = 100, 2  # a random-walk prior's precision plus an observation term, one track
    lower = jnp.broadcast_to(-jnp.eye(k), (n, k, k))
    diag = jnp.broadcast_to(2.5 * jnp.eye(k), (n, k, k))
    mean = tridiax.solveh_block_tridiagonal(lower, diag, jnp.ones((n, k)))  # (100, 2)
    ```
    """
    return solve(lower, diag, None, rhs, axis=axis, check=check, hermitian=True)


def solve(lower, diag, upper, rhs, *, axis: int = -1, pivoting: bool = False,
          check: bool = False, hermitian: bool = False, backend: str | None = None) -> Array:
    """`solve_block_tridiagonal` (or `solveh_block_tridiagonal`: `hermitian`, `upper` None)
    with a backend override, for tests, operators and solvers."""
    if hermitian:
        values, signatures = read(("lower", "diag", "rhs"), (lower, diag, rhs))
        values.insert(2, None)
        signatures = signatures[:2] + (signatures[0],) + signatures[2:]
    else:
        values, signatures = read(_NAMES, (lower, diag, upper, rhs))
    args = (signatures, axis, pivoting, check, hermitian, backend, x64_enabled())
    return run_checked(_checked_call, args, _compute, tuple(values), check)


@dataclasses.dataclass(frozen=True)
class _BlockCall:
    """The static part of a checked call (hashable: the jit cache key)."""

    plan: Plan  # of the dimensions before the block dimensions
    k: int
    m: int | None  # right-hand sides per system; None: one, as a vector
    kind: str
    hermitian: bool
    backend: str | None
    check: bool
    messages: BreakdownMessages | None


def block_size(shapes: dict[str, tuple[int, ...]]) -> int:
    """k, from blocks of shape (..., k, k), or a ValueError naming the block that is not."""
    sizes = set()
    for name, shape in shapes.items():
        if len(shape) < 2 or shape[-1] != shape[-2] or shape[-1] == 0:
            raise ValueError(
                f"{name} must hold square blocks in its last two dimensions, shape "
                f"(..., N, k, k) with k >= 1; got shape {shape}.")
        sizes.add(shape[-1])
    if len(sizes) > 1:
        described = ", ".join(f"{n}{s}" for n, s in shapes.items())
        raise ValueError(f"the blocks differ in size: {described}; lower, diag and upper must "
                         "all be (..., k, k) with the same k.")
    return sizes.pop()


def read_rhs(block_signatures, rhs_signature, names, axis, k: int) -> tuple[Plan, int | None]:
    """How `rhs` reads against blocks of size k (the docstring's rule): the plan of the
    dimensions before the block dimensions, and m (None: one vector per system)."""
    shape = rhs_signature[0]
    block_rank = max(len(s) for s, _, _ in block_signatures) - 2
    readings, errors = {}, []
    for m, stripped in ((None, 1), ("m", 2)):
        if len(shape) < stripped or shape[-stripped] != k:
            continue
        rhs_sig = (shape[:len(shape) - stripped],) + tuple(rhs_signature[1:])
        try:
            plan = plan_of(tuple((s[:-2], d, w) for s, d, w in block_signatures) + (rhs_sig,),
                           names, axis)
        except ValueError as err:
            errors.append(str(err))
            continue
        readings[m] = (plan, None if m is None else shape[-1], len(shape) - stripped)
    if not readings:
        detail = f" Reading it as (..., N, k) or (..., N, k, m): {errors[0]}" if errors else ""
        raise ValueError(
            f"rhs of shape {shape} does not fit blocks of size k = {k}: it must be "
            f"(..., N, k) (one right-hand side per system) or (..., N, k, m) (m of them), with "
            f"dimensions before those broadcasting against the blocks'.{detail}")
    if len(readings) == 2:
        same_rank = [m for m, (_, _, rank) in readings.items() if rank == block_rank]
        if len(same_rank) != 1:
            raise ValueError(
                f"rhs of shape {shape} fits blocks of size k = {k} both as (..., N, k) vectors "
                f"(systems shape {shape[:-1]}) and as (..., N, k, m) with m = {shape[-1]} "
                f"(systems shape {shape[:-2]}), and the blocks' rank does not decide; tridiax "
                f"does not guess. For vectors pass rhs[..., None] (one right-hand side as a "
                f"k x 1 matrix) and take x[..., 0]; for m right-hand sides give the blocks "
                f"the systems' leading dimensions (size 1 where shared).")
        readings = {same_rank[0]: readings[same_rank[0]]}
    plan, m, _ = next(iter(readings.values()))
    return plan, m


@functools.lru_cache(maxsize=4096)
def _checked_call(signatures, axis, pivoting, check, hermitian, backend, x64):
    del x64  # part of the cache key: the dtype plan_of returns depends on it
    _backend.check_flags(pivoting=pivoting, check=check)
    block_signatures, rhs_signature = signatures[:3], signatures[3]
    names = ("lower", "diag", "upper")
    shapes = {n: s for n, (s, _, _) in zip(names, block_signatures, strict=True)
              if not (hermitian and n == "upper")}
    k = block_size(shapes)
    if hermitian:
        names = ("lower", "diag", "lower", "rhs")
    else:
        names = _NAMES
    p, m = read_rhs(block_signatures, rhs_signature, names, axis, k)
    _backend.check_backend(backend, p.dtype, op="block")
    if hermitian:
        kind = "block_hermitian"
    else:
        kind = "block_pivoted" if pivoting else "block"
    family = "hermitian block-tridiagonal" if hermitian else "block-tridiagonal"
    messages = messages_for(p.shape, p.axis, p.dtype, pivoting=bool(pivoting), periodic=False,
                            family=family) if check else None
    return _BlockCall(p, k, m, kind, bool(hermitian), backend, bool(check), messages)


def _compute(call: _BlockCall, lower, diag, upper, rhs):
    p = call.plan

    def conform(x, tail: int):
        x = jnp.asarray(x).astype(p.dtype)
        return x.reshape((1,) * (p.ndim + tail - x.ndim) + x.shape)

    diag, lower = conform(diag, 2), conform(lower, 2)
    if call.hermitian:
        upper = hermitian_upper(lower, p.axis)
    else:
        upper = conform(upper, 2)
    b = conform(rhs, 1 if call.m is None else 2)
    if call.m is None:
        b = b[..., None]
    x = block_solve_p.bind(lower, diag, upper, b, axis=p.axis, transposed=False,
                           backend=call.backend, kind=call.kind)
    out = x[..., 0] if call.m is None else x
    if not call.check:
        return out
    return out, algebra.count_failures(x, lower, diag, upper, b, axis=p.axis)


def hermitian_upper(lower: Array, axis: int) -> Array:
    """upper[i] = lower[i + 1]^H along `axis` (zero in the last row, which is ignored)."""
    upper = jnp.conj(jnp.swapaxes(lower, -1, -2))
    if lower.shape[axis] == 1:
        return upper
    return _along.shift(upper, -1, axis)
