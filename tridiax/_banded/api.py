"""`solve_banded` and `solveh_banded`: scipy's banded solvers, batched along any axis.

The checks (what `l_and_u`, `ab`, `b` and `axis` may be) read only shapes and dtypes, once per
signature; the computation binds `banded_solve_p` (`_banded/primitive.py`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from .._core import backend as _backend
from .._core.check import BreakdownMessages, messages_for, run_checked
from .._core.inputs import Plan, plan_of, read, x64_enabled
from . import algebra
from .primitive import banded_solve_p

_NAMES = ("ab (each band)", "b")


def solve_banded(l_and_u: tuple[int, int], ab: ArrayLike, b: ArrayLike, *, axis: int = -1,
                 pivoting: bool = True, check: bool = False) -> Array:
    r"""Solve many banded systems $Ax = b$ lying along `axis` of an N-d array.

    Equivalent to `scipy.linalg.solve_banded(l_and_u, ab, b)` applied to every system, with
    scipy's argument order and layout: for `l_and_u = (l, u)` (l subdiagonals, u
    superdiagonals),

        ab[u + i - j, j] == A[i, j]        for max(0, j - u) <= i <= min(N - 1, j + l),

    so `ab[u]` is the diagonal, `ab[u - 1]` the first superdiagonal (its first entry unused)
    and `ab[u + 1]` the first subdiagonal (its last entry unused). Entries of `ab` outside
    the matrix are ignored whatever they hold, as in scipy.

    **Arguments:**

    - `l_and_u`: `(l, u)`, non-negative ints: the numbers of nonzero lower and upper
      diagonals. `(1, 1)` is a tridiagonal system (the same answers as
      `tridiax.solve_tridiagonal(..., pivoting=True)`).
    - `ab`: the bands, shape `(l + u + 1, *s)`: the band index is always the leading axis,
      and `s`, the shape of one band, broadcasts against `b` under NumPy's rules (aligned at
      the right) with `j` running along `axis`, as the bands of `solve_tridiagonal` do. An
      `ab` of shape `(l + u + 1, N)` is one matrix, shared by every system whatever the
      axis: scipy's `solve_banded((l, u), ab, b)` with `b` of shape `(N, K)` is
      `tridiax.solve_banded((l, u), ab, b, axis=0)`.
    - `b`: the right-hand sides, shape `(..., N, ...)` with N along `axis`.
    - `axis`: the axis of `b` (and of the broadcast shape) the systems lie along.
    - `pivoting`: Gaussian elimination with partial pivoting, as LAPACK's gbsv (scipy's
      solver), by default: accurate for any nonsingular matrix, at the cost of l more
      fill-in superdiagonals. `pivoting=False` eliminates in order, faster, and stable for
      diagonally dominant and Hermitian positive definite matrices.
    - `check`: count the systems whose solution is not finite or whose normwise backward
      error exceeds sqrt(eps), and raise an error saying how many failed and what to do
      (`tridiax.BreakdownError` eagerly, through `equinox` under jit, vmap and grad; see
      `solve_tridiagonal`). Costs one banded matrix-vector product.

    **Returns:**

    `x` with the broadcast shape of `ab[0]` and `b`, in their common dtype (float32,
    float64, complex64, complex128; float16 and bfloat16 are eliminated in float32).

    **Numerics and gradients:** a singular (or, without pivoting, zero-pivot) system gives
    inf/NaN in that system only. Gradients w.r.t. `ab` and `b` by implicit
    differentiation: the cotangent of `b` is one transposed solve (the same kernel reading
    the band of A^T), that of `ab` is $-\bar b_i x_j$ on the band and zero outside it; jvp,
    second order and vmap at any `in_axes` work as for `solve_tridiagonal`.

    **Example:**

    ```python
    import jax.numpy as jnp, tridiax
    n = 6  # one pentadiagonal matrix (l = u = 2), three right-hand sides along axis 0
    ab = jnp.stack([jnp.ones(n), -4 * jnp.ones(n), 6 * jnp.ones(n), -4 * jnp.ones(n), jnp.ones(n)])
    x = tridiax.solve_banded((2, 2), ab, jnp.ones((n, 3)), axis=0)  # (6, 3)
    ```
    """
    return solve(l_and_u, ab, b, axis=axis, pivoting=pivoting, check=check)


def solveh_banded(ab: ArrayLike, b: ArrayLike, *, lower: bool = False, axis: int = -1,
                  check: bool = False) -> Array:
    r"""Solve many Hermitian (real symmetric) positive definite banded systems along `axis`.

    Equivalent to `scipy.linalg.solveh_banded(ab, b, lower=lower)` applied to every system,
    with scipy's layout for `ab` of shape `(u + 1, *s)` (u off-diagonals):

        upper form (default):  ab[u + i - j, j] == A[i, j]   for i <= j  (ab[u] the diagonal)
        lower form:            ab[i - j, j]     == A[i, j]   for i >= j  (ab[0] the diagonal)

    The other triangle is the conjugate transpose; the diagonal's imaginary part is ignored,
    as LAPACK's pbsv does. Shapes, `axis` and dtypes as `solve_banded`.

    The matrix is factored A = L D L^H without pivoting (Cholesky without square roots: the
    same pivots, so it succeeds exactly when A is positive definite). A pivot that is not
    positive (A not positive definite, at this precision) makes that system NaN rather
    than a wrong answer; `check=True` turns that into an error that counts them.
    Gradients, jvp and vmap as `solve_banded`; the gradient w.r.t. an off-diagonal entry of
    `ab` accounts for both entries of A it stands for.

    **Example:**

    ```python
    import jax.numpy as jnp, tridiax
    n = 6  # the 1-D biharmonic-like SPD matrix (1, -4, 6, -4, 1) + 1, upper form
    ab = jnp.stack([jnp.ones(n), -4 * jnp.ones(n), 7 * jnp.ones(n)])
    x = tridiax.solveh_banded(ab, jnp.ones(n))
    ```
    """
    return solve(None, ab, b, axis=axis, hermitian="lower" if lower else "upper", check=check)


def solve(l_and_u, ab, b, *, axis: int = -1, pivoting: bool = False, check: bool = False,
          hermitian: str | None = None, backend: str | None = None) -> Array:
    """`solve_banded` (or `solveh_banded`, `hermitian` = "upper" or "lower", `l_and_u`
    None) with a backend override, for tests, operators and solvers."""
    values, signatures = read(("ab", "b"), (ab, b))
    args = (l_and_u, signatures, axis, pivoting, check, hermitian, backend, x64_enabled())
    return run_checked(_checked_call, args, _compute, values, check)


@dataclasses.dataclass(frozen=True)
class _BandedCall:
    """The static part of a checked call (hashable: the jit cache key)."""

    plan: Plan
    l: int
    u: int
    band_shape: tuple[int, ...]  # one band, with the leading 1s that align it with the plan
    kind: str
    hermitian: str | None
    backend: str | None
    check: bool
    messages: BreakdownMessages | None


def check_bandwidths(l_and_u) -> tuple[int, int]:
    """`(l, u)` as two non-negative ints, or a ValueError/TypeError that says what it got."""
    try:
        l, u = l_and_u
    except (TypeError, ValueError):
        raise TypeError(f"l_and_u must be a pair (l, u) of non-negative ints (the numbers of "
                        f"lower and upper diagonals), got {l_and_u!r}.") from None
    for name, v in (("l", l), ("u", u)):
        if isinstance(v, bool | np.bool_) or not isinstance(v, int | np.integer):
            raise TypeError(f"l_and_u must be a pair of ints; {name} = {v!r}.")
        if v < 0:
            raise ValueError(f"l_and_u must be non-negative, got {name} = {v}.")
    return int(l), int(u)


@functools.lru_cache(maxsize=4096)
def _checked_call(l_and_u, signatures, axis, pivoting, check, hermitian, backend, x64):
    del x64  # part of the cache key: the dtype plan_of returns depends on it
    _backend.check_flags(pivoting=pivoting, check=check)
    (ab_shape, ab_dtype, ab_weak), b_signature = signatures
    if len(ab_shape) < 2:
        raise ValueError(
            f"ab must have the band index as its leading axis and at least one more axis (the "
            f"rows), shape (bands, N) or (bands, ...); got shape {ab_shape}.")
    bands = ab_shape[0]
    if hermitian is None:
        l, u = check_bandwidths(l_and_u)
        if bands != l + u + 1:
            raise ValueError(
                f"ab has {bands} band rows along its leading axis, but l_and_u = ({l}, {u}) "
                f"needs l + u + 1 = {l + u + 1}: ab[u + i - j, j] = A[i, j] (scipy's layout).")
    else:
        l = u = bands - 1
    b_shape = b_signature[0]
    if not b_shape:
        raise ValueError("b is 0-d; a banded system needs an axis to lie along.")
    band_shape = tuple(ab_shape[1:])
    if len(ab_shape) == 2:  # one matrix (scipy's 2-d ab): its rows lie along `axis` of b
        if not isinstance(axis, int | np.integer) or isinstance(axis, bool):
            raise TypeError(f"axis must be an int, got {type(axis).__name__}.")
        if not -len(b_shape) <= axis < len(b_shape):
            raise ValueError(f"axis={axis} is out of range for b of shape {b_shape} (ndim "
                             f"{len(b_shape)}).")
        band_shape = band_shape + (1,) * (len(b_shape) - 1 - int(axis) % len(b_shape))
    p = plan_of(((band_shape, ab_dtype, ab_weak), b_signature), _NAMES, axis)
    band_shape = (1,) * (p.ndim - len(band_shape)) + band_shape
    _backend.check_backend(backend, p.dtype, op="banded")
    if hermitian is not None:
        kind = "banded_hermitian"
    else:
        kind = "banded_pivoted" if pivoting else "banded"
    family = "banded" if hermitian is None else "hermitian banded"
    messages = messages_for(p.shape, p.axis, p.dtype, pivoting=bool(pivoting), periodic=False,
                            family=family) if check else None
    return _BandedCall(p, l, u, band_shape, kind, hermitian, backend, bool(check), messages)


def _compute(call: _BandedCall, ab, b):
    p = call.plan
    ab = jnp.asarray(ab).astype(p.dtype)
    ab = ab.reshape((ab.shape[0],) + call.band_shape)
    b = jnp.asarray(b).astype(p.dtype)
    b = b.reshape((1,) * (p.ndim - b.ndim) + b.shape)
    # A Hermitian matrix is passed as its stored triangle: the kernels that can read the
    # mirrored entries from it do, the others form all the bands first.
    x = banded_solve_p.bind(ab, b, l=call.l, u=call.u, axis=p.axis, transposed=False,
                            backend=call.backend, kind=call.kind, stored=call.hermitian)
    if not call.check:
        return x
    if call.hermitian is not None:
        ab = algebra.hermitian_bands(ab, lower=call.hermitian == "lower", axis=p.axis + 1,
                                     n=p.shape[p.axis])
    return x, algebra.count_failures(x, ab, b, l=call.l, u=call.u, axis=p.axis)
