"""Factor once, solve many: `TridiagonalFactorization` and the factored solve's derivatives.

The factors are A = L D V with L unit lower bidiagonal (sub-diagonal l), D = diag(m) the
inverse pivots and V unit upper bidiagonal (super-diagonal c'), all stored along the solve
axis with the bands' shape. Factoring divides by each pivot p[i] = d[i] - lower[i]*c'[i-1] as
the Thomas sweep does: c'[i] = upper[i] / p[i] (the sweep's own c'), m[i] = 1/p[i] and
l[i] = lower[i] / p[i-1] (kernels: `factor_pnq` of each backend). A solve from the stored
factors then needs no division: y[i] = b[i] - l[i]*y[i-1], x[i] = m[i]*y[i] - c'[i]*x[i+1]
(kind "factored"), and the transposed solve (reverse mode) is the same sweep with l and c'
exchanged.

A periodic matrix A = T' + u v^T (Sherman-Morrison, see `solve_periodic_tridiagonal`) stores
the factors of T' and the correction w = T'^{-1}u / (1 + v.T'^{-1}u): then
x = y - (y[0] + kappa*y[N-1]) w with y = T'^{-1}b, one factored solve and one elementwise pass.

Derivatives are implicit: the factors are computed from stop_gradient(bands) and carry no
tangent; `solve` is a `lax.custom_linear_solve` whose matrix-vector product uses the bands it
keeps, so dx = A^{-1}(db - dA x) is one more factored solve and reverse mode one transposed
factored solve (the same kernel with l and c' exchanged), at every order.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jax.interpreters import batching
from jax.typing import ArrayLike

from .._core import along_axis as _along
from .._core import backend as _backend
from .._core import dispatch as _dispatch
from .._core import layout as _layout
from .._core import not_lineax as _not_lineax
from .._core import planner as _planner
from .._core import sharding as _sharding
from .._core.inputs import check_operator_rank, conform, plan_of, read
from .._core.jax_private import ShapedArray
from .._core.primitive import VaryingPrimitive, def_jit_impl
from . import algebra
from . import periodic as _periodic
from .api import check_periodic_size
from .primitive import tridiagonal_solve_p

_BAND_NAMES = ("lower", "diag", "upper")


class TridiagonalFactorization(eqx.Module):
    """The eliminated form of a `tridiax.Tridiagonal`, made by `Tridiagonal.factor()`.

    `solve(rhs)` reads the stored factors instead of eliminating again: the divisions by the
    pivots are done once, when factoring, however many right-hand sides follow (implicit time
    stepping with fixed coefficients), and a solve needs none. Differentiable w.r.t. `rhs`
    and the bands it was made from.

    **Fields** (all along `axis`, with the broadcast shape of the bands):

    - `lower`, `diag`, `upper`: the operator's bands (kept for the derivatives).
    - `lower_factor` (l), `inverse_pivots` (m), `upper_factor` (c'): A = L D V with
      L[i, i-1] = l[i], D = diag(m), V[i, i+1] = c'[i]; with the pivots p[i] = diag[i] -
      lower[i]*c'[i-1]: l[i] = lower[i] / p[i-1], m[i] = 1/p[i], c'[i] = upper[i] / p[i].
    - `periodic_correction` (w) and `periodic_weight` (kappa, size 1 along `axis`): for a
      periodic operator, x = y - (y[0] + kappa*y[N-1]) w; None otherwise.
    - `axis` (as given to the operator, counted in its bands), `band_shape` (their broadcast
      shape then), `periodic`, `backend`, `block`: static. A right-hand side with more
      dimensions than the bands follows the operator's rule (`tridiax.Tridiagonal`).

    `jax.jit(factorization.solve)` works (the factors are then constants of the program).
    """

    lower: Array
    diag: Array
    upper: Array
    lower_factor: Array
    inverse_pivots: Array
    upper_factor: Array
    periodic_correction: Array | None
    periodic_weight: Array | None
    axis: int = eqx.field(static=True)
    band_shape: tuple[int, ...] = eqx.field(static=True)
    periodic: bool = eqx.field(static=True, default=False)
    backend: str | None = eqx.field(static=True, default=None)
    block: tuple[int, int] | None = eqx.field(static=True, default=None)

    __hash__ = _dispatch.structural_hash
    __getattr__ = _not_lineax.attribute_error(
        "Solve with it directly, `F.solve(b)`. lineax.linear_solve needs a lineax operator: "
        "for one non-periodic system of 1-D bands, `lineax.TridiagonalLinearOperator(diag, "
        "lower[1:], upper[:-1])`, with solver=tridiax.TDMA().")

    def solve(self, rhs: ArrayLike) -> Array:
        """x with A x = rhs, `rhs` broadcasting against the bands (more leading batch
        dimensions allowed); returns the broadcast shape."""
        from_end = check_operator_rank(self, "rhs", rhs)
        arrays = [self.lower, self.diag, self.upper, self.lower_factor, self.inverse_pivots,
                  self.upper_factor]
        names = list(_BAND_NAMES) + ["lower_factor", "inverse_pivots", "upper_factor"]
        if self.periodic:
            arrays += [self.periodic_correction, self.periodic_weight]
            names += ["periodic_correction", "periodic_weight"]
        values, signatures = read(names + ["rhs"], arrays + [rhs])
        p = plan_of(signatures, names + ["rhs"], from_end)
        rhs_shape = (1,) * (p.ndim - np.ndim(rhs)) + np.shape(rhs)
        n, n_rhs = np.shape(self.inverse_pivots)[from_end], rhs_shape[p.axis]
        if n != n_rhs and n_rhs != 1:
            raise ValueError(
                f"rhs has {n_rhs} rows along axis {self.axis} but this factorization was made "
                f"for N = {n}" + (" (every band was constant along the axis, so N was unknown: "
                                  "give one band its N rows before factor())" if n == 1 else "")
                + ".")
        call = (p, self.periodic, self.backend, self.block)
        return _dispatch.run(_solve_factored, call, *values)


def _solve_factored(call, *values):
    p, periodic, backend, block = call
    operands = conform(values, p)
    static = (p.axis, periodic, backend, block)
    return _solve_with(static, tuple(operands[:3]), tuple(operands[3:-1]), operands[-1])


def _solve_with(static, bands, factors, rhs):
    """A^{-1} rhs from the stored factors, as `lax.custom_linear_solve`: the matrix-vector
    product closes over the bands (differentiable), the solves over the factors (not). Its
    rules give dx = A^{-1}(db - dA x) and a transpose that is again such a solve, so reverse
    mode and every higher order stay differentiable w.r.t. the bands."""
    axis, periodic, backend, block = static
    shape = _layout.broadcast_shape(*bands, *factors, rhs)
    rhs = jnp.broadcast_to(rhs, shape)  # custom_linear_solve maps x and b of one shape

    def matvec(x):
        return jnp.broadcast_to(algebra.matvec(*bands, x, axis=axis, periodic=periodic), shape)

    def solve(_, b):
        return jnp.broadcast_to(_apply_factors(static, factors, b), shape)

    def transpose_solve(_, g):
        (out,) = jax.linear_transpose(functools.partial(solve, None), g)(g)
        return out

    return lax.custom_linear_solve(matvec, rhs, solve, transpose_solve)


def _apply_factors(static, factors, rhs):
    """x = A^{-1} rhs with A = L D V (and the periodic correction): one factored sweep."""
    axis, periodic, backend, block = static
    l, m, c = factors[:3]
    x = tridiagonal_solve_p.bind(l, m, c, rhs, axis=axis, transposed=False, backend=backend,
                                 kind="factored", block=block, chunk=0)
    if periodic:
        w, kappa = factors[3:]
        n = x.shape[axis]
        first = lax.slice_in_dim(x, 0, 1, axis=axis)
        last = lax.slice_in_dim(x, n - 1, n, axis=axis)
        x = x - (first + kappa * last) * w
    return x


def factor(lower, diag, upper, *, axis: int, periodic: bool = False, backend=None,
           block=None) -> TridiagonalFactorization:
    """Eliminate the bands once (see `TridiagonalFactorization`); `axis` as an operator's
    (counted in the bands, its sign kept)."""
    bands, signatures = read(_BAND_NAMES, (lower, diag, upper))
    p = plan_of(signatures, _BAND_NAMES, axis)
    _backend.check_backend(backend, p.dtype)
    block = _backend.check_block(block)
    if periodic:
        check_periodic_size(p.shape, p.axis)
    arrays = _dispatch.run(_factor, (p, periodic, backend, block), *bands)
    return TridiagonalFactorization(*arrays, axis=axis, band_shape=p.shape, periodic=periodic,
                                    backend=backend, block=block)


def _factor(call, *bands):
    """The factorization's arrays: bands, factors, and the periodic correction and weight."""
    p, periodic, backend, block = call
    bands = conform(bands, p)
    axis, full, dtype = p.axis, p.shape, p.dtype
    n = full[axis]
    lo, di, up = (lax.stop_gradient(b) for b in bands)
    if periodic:
        # T' = A - u v^T without its corners (`_tridiagonal/periodic.py`): d'[0] = d[0] - gamma,
        # d'[N-1] = d[N-1] - alpha*beta/gamma.
        d0 = lax.slice_in_dim(di, 0, 1, axis=axis)
        alpha = lax.slice_in_dim(lo, 0, 1, axis=axis)
        beta = lax.slice_in_dim(up, up.shape[axis] - 1, up.shape[axis], axis=axis)
        gamma = _periodic.split(d0, alpha, lax.slice_in_dim(up, 0, 1, axis=axis))
        di = _along.broadcast_along(di, axis, n)
        d_last = lax.slice_in_dim(di, n - 1, n, axis=axis)
        di = _along.set_ends(di, d0 - gamma, d_last - alpha * beta / gamma, axis)
    factors = _factor_arrays(lo, di, up, axis, dtype, backend, block)
    correction = weight = None
    if periodic:
        # z = T'^{-1} u with u = (gamma, 0, ..., 0, beta); w = z / (1 + v.z), kappa = alpha/gamma.
        u = _along.set_ends(jnp.zeros(full, dtype), gamma, beta, axis)
        z = _apply_factors((axis, False, backend, block), factors, u)
        weight = alpha / gamma
        denominator = (1 + lax.slice_in_dim(z, 0, 1, axis=axis)
                       + weight * lax.slice_in_dim(z, n - 1, n, axis=axis))
        correction = z / denominator
    return (*bands, *factors, correction, weight)


def _factor_arrays(lower, diag, upper, axis: int, dtype, backend, block
                   ) -> tuple[Array, Array, Array]:
    """(l, m, c') of the bands along `axis`, each of the bands' broadcast shape, by `backend`'s
    factor kernel (None: the platform's default) in `block` tiles (Pallas; None: the plan's)."""
    return tuple(factor_p.bind(lower.astype(dtype), diag.astype(dtype), upper.astype(dtype),
                               axis=axis, backend=backend, block=block))


# The elimination without a right-hand side, as a primitive so that its lowering can be
# partitioned over sharded batch axes (`_sharding.partitioned`) and vmap stays a batch
# dimension. Its inputs are stop_gradient'ed bands: it is never differentiated.
factor_p = VaryingPrimitive("tridiax_factor")
factor_p.multiple_results = True
def_jit_impl(factor_p)


@factor_p.def_abstract_eval
def _factor_abstract_eval(lower, diag, upper, *, axis, backend, block):
    full = _layout.broadcast_shape(lower, diag, upper)
    return [ShapedArray(full, diag.dtype)] * 3


def _factor_lowering(platform: str):
    def factor_bands(lower, diag, upper, *, axis, backend, block):
        full = _layout.broadcast_shape(lower, diag, upper)
        if 0 in full:  # no systems (or no rows): nothing to launch
            return [jnp.zeros(full, diag.dtype)] * 3
        backend = backend or _backend.default_backend(platform, diag.dtype)
        kernel = _backend.kernels(backend).factor

        def local(*bands):  # the systems one device holds; a split axis is gathered
            shape = _layout.broadcast_shape(*bands)
            views = [_layout.to_pnq(x, axis, shape) for x in bands]
            P, N, Q = _layout.broadcast_shape(*views)
            move = _planner.gpu_columns(P, Q, diag.dtype, backend=backend, block=block)
            views, P, Q, back = _layout.columns_if(move, views, P, Q)
            plan = _planner.factor_plan(backend, P, N, Q, diag.dtype, block=block)
            factors = kernel(*views, out_dtype=diag.dtype, tiling=plan.tiling)
            return tuple(back(f).reshape(shape) for f in factors)

        bands = (lower, diag, upper)
        return _sharding.partitioned(local, [b.shape for b in bands], [full] * 3,
                                     axis)(*bands)

    return factor_bands


for _platform in ("cpu", "cuda", "rocm", "tpu"):
    _sharding.register_lowering(factor_p, _factor_lowering(_platform), _platform,
                                multiple_results=True)


def _factor_batch(operands, dims, *, axis, backend, block):
    moved, bdim, axis = _along.align_batch(operands, dims, axis, preferred=1)
    return factor_p.bind(*moved, axis=axis, backend=backend, block=block), [bdim] * 3


batching.primitive_batchers[factor_p] = _factor_batch
