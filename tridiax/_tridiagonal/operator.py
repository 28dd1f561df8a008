"""Equinox modules for the Equinox way of working: the operator `Tridiagonal` and the solver
`TDMA`. Both are pytrees (bands are leaves, settings are static), so they pass through jit,
vmap and grad; the work is done by `_tridiagonal/api.py` and `_tridiagonal/factorization.py`. How `axis` and shapes
are read: `_core/inputs.py` (rule 3 for operators)."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from .._core import along_axis as _along
from .._core import backend as _backend
from .._core import dispatch as _dispatch
from .._core import not_lineax as _not_lineax
from .._core.inputs import band_shape, check_operator_rank, conform, operator_axis, plan_of, read
from . import algebra
from .api import check_periodic_size, solve
from .factorization import TridiagonalFactorization, factor

_NAMES = ("lower", "diag", "upper")


class Tridiagonal(eqx.Module):
    r"""Many tridiagonal matrices lying along `axis` of N-d band arrays, as one operator.

    Row i of each matrix reads `lower[i]*x[i-1] + diag[i]*x[i] + upper[i]*x[i+1]` (the
    convention of `tridiax.solve_tridiagonal`: `lower[0]` and `upper[-1]` are ignored). With
    `periodic=True` indices wrap around: `lower[0]` is A[0, N-1] and `upper[N-1]` is
    A[N-1, 0] (N >= 3).

    **Arguments:**

    - `lower`, `diag`, `upper`: arrays that broadcast together, e.g. `(N,)` for one matrix,
      `(N, B)` with `axis=0` for B matrices, `(N, 1)` with `axis=0` for one matrix shared by
      the B columns of an `(N, B)` right-hand side, or size 1 along `axis` for coefficients
      constant along the system.
    - `axis`: the axis the systems lie along, counted in the bands' broadcast shape. A
      right-hand side with more (leading) dimensions than the bands is aligned with them at
      the right, as NumPy broadcasts: a negative `axis` (counted from the end) then means the
      same dimension in both; a non-negative one is ambiguous there and raises an error that
      shows both readings ([Shapes and axis](../guides/tridiagonal.md#shapes-and-axis)).
    - `periodic`: cyclic matrices (rings, periodic grids, closed splines).

    Checked when built: floating or complex dtypes, shapes that broadcast, `axis` in range,
    N >= 3 when periodic.

    **Operations:** `A.mv(x)` (A @ x along `axis`), `A.T`, `A.as_matrix()`, `A.solve(rhs)`,
    `A.factor()` (see `TridiagonalFactorization`), `s * A`, `-A`, `A.shift_diagonal(s)`
    (A + s I) and `A + B`, `A - B` for operators on the same axis. Implicit Euler for
    u_t = L u is `L.scale(-dt).shift_diagonal(1.0).solve(u)`, i.e. (I - dt L) u' = u.
    `jax.jit(A.solve)` (and the other methods) works as for any callable; the bands are then
    constants of the compiled program, as with `jax.jit(model.__call__)`. Inside a function
    that is itself being traced (A made of tracers), call `A.solve` directly, or use
    `equinox.filter_jit(A.solve)`: jax.jit's cache compares bound methods by value, which
    tracers cannot answer.

    **Example:**

    ```python
    import jax.numpy as jnp, tridiax
    n, dt = 64, 1e-3
    lap = tridiax.Tridiagonal(jnp.ones(n), -2 * jnp.ones(n), jnp.ones(n)) * (n + 1) ** 2
    step = (-dt * lap).shift_diagonal(1.0).factor()  # I - dt*L, eliminated once
    u = jnp.sin(jnp.pi * jnp.linspace(0, 1, n + 2)[1:-1])
    for _ in range(10):
        u = step.solve(u)
    ```
    """

    lower: Array
    diag: Array
    upper: Array
    axis: int = eqx.field(static=True)
    periodic: bool = eqx.field(static=True)
    band_shape: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, lower: ArrayLike, diag: ArrayLike, upper: ArrayLike, *, axis: int = -1,
                 periodic: bool = False):
        bands, signatures = read(_NAMES, (lower, diag, upper))
        p = plan_of(signatures, _NAMES, axis)  # dtypes as given, before JAX's 32-bit mode
        if periodic:
            check_periodic_size(p.shape, p.axis)
        self.lower, self.diag, self.upper = (jnp.asarray(b) for b in bands)
        self.axis = int(axis)
        self.periodic = bool(periodic)
        self.band_shape = p.shape

    __hash__ = _dispatch.structural_hash
    __array_ufunc__ = None  # numpy_array * A: NumPy defers to __rmul__
    __getattr__ = _not_lineax.attribute_error(
        "Solve with it directly, `A.solve(b)` or `tridiax.TDMA()(A, b)` (any batch, any axis). "
        "lineax.linear_solve needs a lineax operator: for one non-periodic system of 1-D "
        "bands, `lineax.TridiagonalLinearOperator(diag, lower[1:], upper[:-1])`, with "
        "solver=tridiax.TDMA() (jax.vmap batches those).")

    @property
    def axis_from_end(self) -> int:
        """The axis counted from the end (negative): the same dimension of the bands and of a
        right-hand side with more leading dimensions."""
        now = band_shape(self)
        return operator_axis(self, now) - len(now)

    # --- shapes -------------------------------------------------------------------------

    @property
    def ndim(self) -> int:
        return max(jnp.ndim(b) for b in (self.lower, self.diag, self.upper))

    def _expanded(self, ndim: int) -> tuple[list[Array], int]:
        """The bands with leading size-1 dimensions up to `ndim`, and the axis >= 0."""
        ndim = max(ndim, self.ndim)
        bands = [jnp.reshape(b, (1,) * (ndim - jnp.ndim(b)) + jnp.shape(b))
                 for b in (self.lower, self.diag, self.upper)]
        return bands, ndim + self.axis_from_end

    def _axis_for(self, ndim: int) -> int:
        """This operator's axis for bands of `ndim` dimensions (the same dimension, counted
        from the end), with the sign it was given (rule 3 of `_core/inputs.py` reads the sign)."""
        from_end = self.axis_from_end
        return from_end + ndim if self.axis >= 0 else from_end

    def _with_bands(self, lower, diag, upper) -> Tridiagonal:
        """An operator on the same axis with new bands, which may have more leading
        dimensions than these."""
        ndim = max(jnp.ndim(b) for b in (lower, diag, upper))
        return Tridiagonal(lower, diag, upper, axis=self._axis_for(ndim), periodic=self.periodic)

    def _check_band_like(self, s) -> None:
        """`s` (for scale, shift_diagonal) broadcasts like a band, by the bands' rule."""
        names = _NAMES + ("s",)
        _, signatures = read(names, (self.lower, self.diag, self.upper, s))
        plan_of(signatures, names, self.axis_from_end)

    # --- linear algebra -----------------------------------------------------------------

    def mv(self, x: ArrayLike) -> Array:
        """A @ x along `axis` for every system (x broadcasts against the bands)."""
        from_end = check_operator_rank(self, "x", x)
        names = _NAMES + ("x",)
        values, signatures = read(names, (self.lower, self.diag, self.upper, x))
        p = plan_of(signatures, names, from_end)
        return _dispatch.run(_matvec, (p, self.periodic), *values)

    @property
    def T(self) -> Tridiagonal:
        """The transposed operator: lower_T[i] = upper[i-1], upper_T[i] = lower[i+1] (cyclic
        when periodic). A band constant along the axis stays size 1."""
        (lo, di, up), axis = self._expanded(0)

        def moved(band, k):
            if band.shape[axis] == 1:
                return band
            return _along.roll(band, k, axis) if self.periodic else _along.shift(band, k, axis)

        return self._with_bands(moved(up, 1), di, moved(lo, -1))

    def as_matrix(self) -> Array:
        """Dense matrices, shape `batch + (N, N)` with `batch` the bands' broadcast shape
        without `axis`. For checking small systems: N*N values per system."""
        (lo, di, up), axis = self._expanded(0)
        shape = np.broadcast_shapes(lo.shape, di.shape, up.shape)
        n = shape[axis]
        lo, di, up = (jnp.moveaxis(jnp.broadcast_to(b, shape), axis, -1)[..., :, None]
                      for b in (lo, di, up))
        rows = np.arange(n)
        eye = rows[:, None] == rows[None, :]
        below = rows[:, None] - 1 == rows[None, :]
        above = rows[:, None] + 1 == rows[None, :]
        if self.periodic:
            below = below | ((rows[:, None] == 0) & (rows[None, :] == n - 1))
            above = above | ((rows[:, None] == n - 1) & (rows[None, :] == 0))
        zero = jnp.zeros((), di.dtype)
        return (jnp.where(eye, di, zero) + jnp.where(below, lo, zero)
                + jnp.where(above, up, zero))

    def solve(self, rhs: ArrayLike, *, pivoting: bool = False, check: bool = False) -> Array:
        """x with A x = rhs (`tridiax.solve_tridiagonal`, or the periodic solve); `pivoting`
        and `check` as there."""
        return TDMA(pivoting=pivoting, check=check)(self, rhs)

    def factor(self) -> TridiagonalFactorization:
        """Eliminate once; `.solve(rhs)` of the result reuses the pivots (differentiable)."""
        return TDMA().factor(self)

    # --- operator algebra (elementwise on the bands; fused by XLA under jit) -------------

    def scale(self, s: ArrayLike) -> Tridiagonal:
        """s * A for a scalar `s` (or an array broadcasting like a band, by the same rule)."""
        self._check_band_like(s)
        s = jnp.asarray(s)
        return self._with_bands(s * self.lower, s * self.diag, s * self.upper)

    def shift_diagonal(self, s: ArrayLike) -> Tridiagonal:
        """A + s*I for a scalar `s` (or an array broadcasting like a band, by the same rule:
        per-row shifts of one matrix shared by the columns of an (N, B) right-hand side have
        shape (N, 1)): only the diagonal changes; lower and upper are the same arrays."""
        self._check_band_like(s)
        return self._with_bands(self.lower, self.diag + jnp.asarray(s), self.upper)

    def __mul__(self, s):
        if isinstance(s, Tridiagonal):
            return NotImplemented
        return self.scale(s)

    __rmul__ = __mul__

    def __neg__(self):
        return self.scale(-1)

    def __add__(self, other):
        if not isinstance(other, Tridiagonal):
            return NotImplemented
        if (other.axis_from_end, other.periodic) != (self.axis_from_end, self.periodic):
            raise ValueError("operators added together must share axis and periodic, got "
                             f"axis {self.axis}/{other.axis} (from the end "
                             f"{self.axis_from_end}/{other.axis_from_end}), periodic "
                             f"{self.periodic}/{other.periodic}.")
        return self._with_bands(self.lower + other.lower, self.diag + other.diag,
                                self.upper + other.upper)

    def __sub__(self, other):
        if not isinstance(other, Tridiagonal):
            return NotImplemented
        return self + (-other)


def _matvec(call, lower, diag, upper, x):
    p, periodic = call
    lower, diag, upper, x = conform((lower, diag, upper, x), p)
    # x broadcast to every row first: matvec reads N from x (an x constant along the axis
    # is still N values).
    return algebra.matvec(lower, diag, upper, jnp.broadcast_to(x, p.shape), axis=p.axis,
                         periodic=periodic)


class TDMA(eqx.Module):
    """The tridiagonal solver (Thomas algorithm) as a module: `TDMA()(operator, rhs)`.

    **Fields** (static, so a TDMA is a leafless pytree):

    - `backend`: None for the platform's default, or one of "native" (C++ on CPU), "xla",
      "pallas_triton" (GPU), "mosaic_gpu" (Hopper GPUs, opt-in), "pallas_tpu" (TPU),
      "pallas_interpret" and "pallas_tpu_interpret" (tests); see `tridiax._core.backend`.
    - `block`: None, or the (bp, bq) tile of systems one Pallas program solves (powers of
      two; bp along the batch axes before `axis`, bq along those after it). Other backends
      choose their own tiling.
    - `pivoting`: partial pivoting (row interchanges, as LAPACK's gtsv) for matrices that are
      not diagonally dominant; see `tridiax.solve_tridiagonal` (periodic operators:
      `tridiax.solve_periodic_tridiagonal`).
    - `check`: raise an error counting the systems that failed (`tridiax.solve_tridiagonal`).
    - `chunk`: how long systems are split ([Long systems](../guides/long-systems.md)). None lets the planner
      decide from the shape, dtype and device (few long systems are split into chunks solved
      as one batch by the partition method); 0 never splits; an int >= 2 asks for chunks of
      about that many rows. Unpivoted chunking needs every chunk's interior matrix
      nonsingular, which diagonally dominant and symmetric positive definite matrices
      guarantee; with pivoting=True each chunk is pivoted and the answer's backward error is
      checked, the sequential pivoted sweep taking over where the check fails.

    `operator` is a `tridiax.Tridiagonal` (periodic or not) or a `TridiagonalFactorization`
    (then the backend and block it was made with apply).

    **lineax:** a TDMA is also a lineax solver (`lineax.linear_solve(op, b,
    solver=tridiax.TDMA())`) for operators tagged tridiagonal, when lineax is installed; it
    then behaves as `tridiax.lineax.TDMA`, which subclasses lineax's `AbstractLinearSolver`.
    """

    backend: str | None = eqx.field(static=True, default=None)
    block: tuple[int, int] | None = eqx.field(static=True, default=None)
    pivoting: bool = eqx.field(static=True, default=False)
    check: bool = eqx.field(static=True, default=False)
    chunk: int | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        _backend.check_solver_settings(self.backend, self.block, pivoting=self.pivoting,
                                       check=self.check)
        _backend.check_chunk(self.chunk, "pivoted" if self.pivoting else None)

    def __call__(self, operator, rhs: ArrayLike) -> Array:
        if isinstance(operator, TridiagonalFactorization):
            if self.pivoting or self.check or self.chunk:
                raise ValueError("a TridiagonalFactorization has no pivoting, check or chunk "
                                 "settings (its solve sweeps each system whole); solve the "
                                 "Tridiagonal operator instead.")
            return operator.solve(rhs)
        if not isinstance(operator, Tridiagonal):
            raise TypeError("TDMA solves a tridiax.Tridiagonal or TridiagonalFactorization, "
                            f"got {type(operator).__name__}; for lineax operators call "
                            "lineax.linear_solve(operator, vector, solver=tridiax.TDMA()).")
        from_end = check_operator_rank(operator, "rhs", rhs)
        return solve(operator.lower, operator.diag, operator.upper, rhs,
                     axis=from_end, backend=self.backend,
                     periodic=operator.periodic, block=self.block, pivoting=self.pivoting,
                     check=self.check, chunk=self.chunk)

    def factor(self, operator: Tridiagonal) -> TridiagonalFactorization:
        """`operator.factor()` with this solver's backend and block sizes (unpivoted)."""
        if self.pivoting or self.check:
            raise ValueError("factor() stores an unpivoted factorization without a check; with "
                             "pivoting=True or check=True solve with TDMA(...)(operator, rhs) "
                             "each time.")
        return factor(operator.lower, operator.diag, operator.upper,
                      axis=operator._axis_for(operator.ndim), periodic=operator.periodic,
                      backend=self.backend, block=self.block)

    # --- the lineax solver interface (lineax.AbstractLinearSolver), used by linear_solve ---

    def init(self, operator, options):
        return _lineax().init_state(self, operator)

    def compute(self, state, vector, options):
        return _lineax().compute_solution(self, state, vector)

    def transpose(self, state, options):
        return _lineax().transpose_state(state), options

    def conj(self, state, options):
        return _lineax().conj_state(state), options

    def assume_full_rank(self) -> bool:
        return True


def _lineax():
    from .. import lineax  # raises an ImportError that says how to install lineax

    return lineax
