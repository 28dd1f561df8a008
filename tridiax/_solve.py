"""`solve_tridiagonal`: checks and arranges the inputs, then binds the primitive."""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from . import _backend
from ._check import check_solution
from ._dtypes import is_supported
from ._primitive import tridiagonal_solve_p

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

    Equivalent to `scipy.linalg.solve_banded((1, 1), ...)` applied to every system: the
    Thomas algorithm by default, Gaussian elimination with partial pivoting (LAPACK's gtsv)
    with `pivoting=True`.

    **Arguments:**

    - `lower`, `diag`, `upper`: the bands, each `(*batch, N, *batch2)` or anything that
      broadcasts to the shape of the result under NumPy rules: bands of shape `(N, 1)` solve
      every column of an `(N, B)` right-hand side with one matrix, and are never copied B times.
      A band of size 1 along `axis` is constant along the system.
    - `rhs`: the right-hand sides, broadcasting with the bands likewise.
    - `axis`: the axis the systems lie along (negative counts from the end).
    - `pivoting`: eliminate with row interchanges (partial pivoting, one fill-in diagonal, as
      LAPACK's gtsv): accurate for any nonsingular matrix (backward error of order eps*N),
      at about 1.2x the cost of the unpivoted solve on CPU (benchmarks/README.md).
    - `check`: after the solve, count the systems whose solution is not finite or whose
      backward error ||b - Ax|| / (||A|| ||x|| + ||b||) exceeds sqrt(eps), and raise an error
      saying how many failed and what to do (`equinox.branched_error_if`: works eagerly and
      under `jax.jit`/`equinox.filter_jit`, vmap and grad). Costs one matrix-vector product.

    **Returns:**

    `x` with the broadcast shape of the four inputs and their common dtype (float32, float64,
    complex64, complex128; float16 and bfloat16 are eliminated in float32 and rounded once).

    **Numerics:** without pivoting the solve is stable for diagonally dominant (|diag[i]| >=
    |lower[i]| + |upper[i]|, strictly in at least one row of each irreducible block) and
    symmetric positive definite matrices, and for M-matrices: most implicit diffusion and
    spline systems. Otherwise (Helmholtz, convection-dominated upwind schemes, general
    matrices) pass `pivoting=True`. A zero pivot gives inf/NaN in the affected systems only
    (every other system is solved exactly as if it were alone); a tiny one can give a finite,
    wrong answer, which `check=True` detects.

    **Performance:** on GPU a Pallas (Triton) kernel walks the rows of each system in place,
    whatever the axis; on CPU an XLA loop does the same. Gradients (reverse and forward mode,
    w.r.t. all four inputs) cost one more solve plus elementwise work, by implicit
    differentiation; vmap at any `in_axes` adds a batch dimension without moving data.

    **Example:**

    ```python
    import jax.numpy as jnp, tridiax
    n = 5
    x = tridiax.solve_tridiagonal(-jnp.ones(n), 2 * jnp.ones(n), -jnp.ones(n), jnp.ones((n, 3)), axis=0)
    ```
    """
    return solve(lower, diag, upper, rhs, axis=axis, pivoting=pivoting, check=check)


def solve_periodic_tridiagonal(
    lower: ArrayLike, diag: ArrayLike, upper: ArrayLike, rhs: ArrayLike, *, axis: int = -1,
    check: bool = False,
) -> Array:
    r"""Solve many cyclic (periodic) tridiagonal systems along `axis` of an N-d array.

    Row i of each system couples x[i-1], x[i] and x[i+1] with indices taken modulo N:

        lower[i]*x[(i-1) % N] + diag[i]*x[i] + upper[i]*x[(i+1) % N] = rhs[i],

    so `lower[0]` is the corner A[0, N-1] and `upper[N-1]` the corner A[N-1, 0] (rings,
    periodic grids, closed splines). Needs N >= 3.

    Solved by Sherman-Morrison: with gamma = -diag[0], A = T' + u v^T where T' is tridiagonal
    (diag[0] - gamma, diag[N-1] - lower[0]*upper[N-1]/gamma), u = (gamma, 0, ..., 0,
    upper[N-1]) and v = (1, 0, ..., 0, lower[0]/gamma). One kernel sweep eliminates T' for
    both right-hand sides (rhs and u) and forms x = y - (v.y)/(1 + v.z) z: the bands and rhs
    are read once.

    **Arguments:** as `solve_tridiagonal` (shapes broadcast, any `axis`, same dtypes, `check`);
    there is no pivoting option.

    **Returns:** `x` with the broadcast shape of the inputs.

    **Numerics:** no pivoting; stable for diagonally dominant matrices (for which T' stays
    dominant). Gradients w.r.t. all four inputs by implicit differentiation, vmap at any
    in_axes, as for `solve_tridiagonal`.

    **Example:**

    ```python
    import jax.numpy as jnp, tridiax
    n = 8  # a ring of 8 nodes: x[i] - 0.25*(x[i-1] + x[i+1]) = 1 everywhere
    x = tridiax.solve_periodic_tridiagonal(-0.25 * jnp.ones(n), jnp.ones(n), -0.25 * jnp.ones(n), jnp.ones(n))
    ```
    """
    return solve(lower, diag, upper, rhs, axis=axis, periodic=True, check=check)


def solve(lower, diag, upper, rhs, *, axis: int = -1, backend: str | None = None,
          periodic: bool = False, block=None, pivoting: bool = False,
          check: bool = False) -> Array:
    """`solve_tridiagonal` (or, `periodic`, `solve_periodic_tridiagonal`) with a backend
    override and Pallas block sizes (see `_backend.py`); for tests and modules."""
    operands, axis = prepare_operands((lower, diag, upper, rhs), _NAMES, axis)
    _backend.check_backend(backend, operands[0].dtype)
    _backend.check_flags(pivoting=pivoting, check=check)
    if periodic:
        check_periodic_size(operands, axis)
        if pivoting:
            raise ValueError(
                "pivoting=True applies to non-periodic systems; the periodic solve is "
                "Sherman-Morrison around an unpivoted elimination, safe for diagonally dominant "
                "cyclic matrices. Use check=True to detect a breakdown.")
    kind = "periodic" if periodic else "pivoted" if pivoting else "thomas"
    x = tridiagonal_solve_p.bind(*operands, axis=axis, transposed=False, backend=backend,
                                 kind=kind, block=_backend.check_block(block))
    if check:
        x = check_solution(x, *operands, axis=axis, periodic=periodic, pivoting=bool(pivoting))
    return x


def check_periodic_size(operands, axis: int) -> None:
    n = np.broadcast_shapes(*(x.shape for x in operands))[axis]
    if n < 3:
        raise ValueError(
            f"a periodic system needs N >= 3 rows along axis {axis}, got N = {n}: with N < 3 "
            "the corners lower[0] and upper[N-1] fall on the ordinary off-diagonals. Solve it "
            "as an ordinary tridiagonal system with those entries added in."
        )


def prepare_operands(values: Sequence, names: Sequence[str], axis) -> tuple[list[Array], int]:
    """Check dtypes, shapes and axis; return arrays of one dtype and one rank, and axis >= 0.

    Raises TypeError or ValueError at trace time naming the offending argument and the shapes.
    """
    arrays = []
    for name, value in zip(names, values, strict=True):
        try:
            arrays.append(jnp.asarray(value))
        except TypeError as err:
            raise TypeError(f"{name} must be an array, got {type(value).__name__}: {err}") from None
    for name, x in zip(names, arrays, strict=True):
        if not is_supported(x.dtype):
            raise TypeError(
                f"{name} has dtype {x.dtype}; tridiax works on floating-point or complex arrays "
                f"(float16, bfloat16, float32, float64, complex64, complex128). Cast it first, "
                f"e.g. {name}.astype(jnp.float32)."
            )
    shapes = {name: x.shape for name, x in zip(names, arrays, strict=True)}
    try:
        shape = np.broadcast_shapes(*shapes.values())
    except ValueError:
        described = ", ".join(f"{n}{s}" for n, s in shapes.items())
        raise ValueError(
            f"the shapes do not broadcast together: {described}. Every input must broadcast to "
            "the shape of the solution under NumPy rules."
        ) from None
    ndim = len(shape)
    if ndim == 0:
        raise ValueError(
            "all inputs are scalars (0-d); a tridiagonal system needs an axis to lie along."
        )
    if not isinstance(axis, int | np.integer) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}.")
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"axis={axis} is out of range for inputs broadcasting to shape {shape} "
            f"(ndim {ndim}); use -{ndim} <= axis < {ndim}."
        )
    axis = int(axis) % ndim
    if shape[axis] == 0:
        raise ValueError(
            f"axis {axis} has size 0 in the broadcast shape {shape}; a system or sequence "
            "needs at least one row."
        )
    dtype = jnp.result_type(*arrays)
    arrays = [x.astype(dtype).reshape((1,) * (ndim - x.ndim) + x.shape) for x in arrays]
    return arrays, axis
