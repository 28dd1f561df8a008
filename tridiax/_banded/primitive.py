"""`banded_solve_p`: the banded solve as a JAX primitive, built like `tridiagonal_solve_p`.

Operands: `ab`, the bands in scipy's layout on a leading axis of their own, ab[u + i - j, j] =
A[i, j] along `axis` + 1 (shape (l + u + 1, *s) with s broadcasting against b), and `b`.
Params: `l`, `u`, `axis` (of b, non-negative), `transposed` (solve A^T x = b, reading the
same bands), `backend` (None: per platform, `_core/backend.py`), `kind` (`_xla_banded.KINDS`)
and `stored`: None (`ab` holds all l + u + 1 bands) or "upper"/"lower" (a Hermitian matrix,
l = u, of which `ab` holds the u + 1 bands of one triangle in solveh_banded's layout). The TPU
kernel reads the other triangle's entries from the stored one; the other backends are given
all the bands (`algebra.hermitian_bands`), formed where they are solved.

Differentiation is implicit, as for the tridiagonal solve (`_tridiagonal/primitive.py`):
    d x = A^{-1} (d b - dA x)          (JVP: one more solve with the same bands)
    b_bar = A^{-T} x_bar,  ab_bar[u + i - j, j] = -b_bar[i] x[j]   (transpose of the JVP)
The JVP's dA x is `algebra.matvec` (`algebra.hermitian_matvec` on a stored triangle: each
stored band's cotangent is then one product, not a fold of all 2u + 1), plain jnp, so JAX
transposes it into that ab_bar (zero on the entries of ab outside the matrix); the transposed solve is the same kernel
reading the band of A^T. Second order composes from the same rules; the batching rule adds a
vmapped dimension as one more batch dimension of b (and of ab, after its band axis).

Sharded batch dimensions stay sharded: each device solves the systems it holds
(`_core/sharding.py`); a sharded solve axis is gathered first.

`BandedFactorization` runs on two more primitives, built the same way: `banded_factor_p`
(the bands, with the band shape, to the factors of `_xla_banded.factor_pnq`; its input is
stop_gradient'ed, so it is never differentiated) and `banded_factored_solve_p` (the factors
and b to x, a solve primitive whose transpose is the factored solve with A^T; the derivatives
with respect to the bands come from `BandedFactorization.solve`'s custom_linear_solve). On a
TPU both run the Pallas kernels of `pallas_tpu_factors.py`; elsewhere XLA's loops.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._core import backend as _backend
from .._core import layout as _layout
from .._core import planner as _planner
from .._core import sharding as _sharding
from .._core.dtypes import compute_dtype
from .._core.jax_private import ShapedArray
from .._core.primitive import factor_primitive, solve_primitive
from . import algebra, window


def _full_shape(ab, b) -> tuple[int, ...]:
    return tuple(jnp.broadcast_shapes(ab.shape[1:], b.shape))


def _abstract_eval(ab, b, *, l, u, axis, transposed, backend, kind, stored):
    del l, u, axis, transposed, backend, kind, stored
    return ShapedArray(_full_shape(ab, b), b.dtype)


def _lowering(platform: str):
    def solve(ab, b, *, l, u, axis, transposed, backend, kind, stored):
        backend = backend or _backend.default_backend(platform, b.dtype, op="banded")
        kernel = _backend.kernels(backend).banded
        on_tpu = backend in _planner.TPU_BACKENDS
        options = {"stored": stored} if on_tpu else {}

        def local(ab, b):
            """The systems one device holds (all of them when unsharded)."""
            if on_tpu:
                return _in_physical_order(solve_ordered, (ab, b), (1, 0), axis,
                                          _full_shape(ab, b), b.dtype)
            return solve_ordered(ab, b, axis)

        def solve_ordered(ab, b, axis):
            full = _full_shape(ab, b)
            if stored is not None and not on_tpu:
                ab = algebra.hermitian_bands(ab, lower=stored == "lower", axis=axis + 1,
                                             n=full[axis])
            # The bands as (K, P|1, N|1, Q|1): the same view of every band row (a free
            # reshape, unless a band is broadcast in part of a group, which `to_pnq`
            # materialises).
            ab_view = jax.vmap(lambda band: _layout.to_pnq(band, axis, full))(ab)
            b_view = _layout.to_pnq(jnp.broadcast_to(b, full), axis, full)
            # On a GPU, systems whose rows are narrower than a memory sector (batch-first)
            # are moved to columns, as the tridiagonal kernels' are (`_planner.gpu_columns`).
            P, _, Q = b_view.shape
            back = lambda x: x  # noqa: E731
            if _planner.gpu_columns(P, Q, b.dtype, backend=backend):
                # the band index as a trailing axis, so that one transpose moves all bands
                (bands, b_view), back = _layout.to_columns(
                    [jnp.moveaxis(ab_view, 0, -1), b_view], P, Q)
                ab_view = jnp.moveaxis(bands, -1, 0)
            x = kernel(ab_view, b_view, l=l, u=u, kind=kind, transposed=transposed,
                       out_dtype=b.dtype, **options)
            return back(x).reshape(full)

        return _sharding.partitioned(local, [ab.shape, b.shape], [_full_shape(ab, b)], axis,
                                     leading=(1, 0))(ab, b)

    return solve


def _in_physical_order(solve, operands, leading, axis: int, shape, dtype, out_leading=(0,)):
    """`solve(*operands, axis)` on the operands transposed into the order a TPU stores
    systems of `shape` and `dtype` in (`_pallas/tpu.py`, `physical_order`), its results
    transposed back. Operand i has `leading[i]` stacked axes first (bands, factors), which stay
    first, as do each result's `out_leading`; an operand of fewer dimensions than `shape`
    broadcasts against it from the right."""
    from .._pallas import tpu as _tpu

    order = _tpu.physical_order(shape, dtype)
    if order is None:
        return solve(*operands, axis)
    rank = len(order)
    inverse = tuple(order.index(d) for d in range(rank))

    def permuted(x, lead, permutation):
        x = x.reshape(x.shape[:lead] + (1,) * (rank + lead - x.ndim) + x.shape[lead:])
        return jnp.transpose(x, (*range(lead), *(d + lead for d in permutation)))

    results = solve(*(permuted(x, lead, order) for x, lead in zip(operands, leading, strict=True)),
                    order.index(axis))
    if isinstance(results, (list, tuple)):
        return [permuted(x, lead, inverse) for x, lead in zip(results, out_leading, strict=True)]
    return permuted(results, out_leading[0], inverse)


def _jvp_term(tangents, x, *, l, u, axis, transposed, backend, kind, stored):
    del backend, kind
    (ab_t,) = tangents
    if stored is not None:  # dA is Hermitian too: both triangles move with the stored one
        return -algebra.hermitian_matvec(ab_t, x, lower=stored == "lower", axis=axis,
                                         transposed=transposed)
    return -algebra.matvec(ab_t, x, l=l, u=u, axis=axis, transposed=transposed)


def _align_batch(operands, dims, axis):
    ab, b = operands
    ab_dim, b_dim = dims
    # Put the vmapped dimension where b has it (or, b unbatched, where ab has it), counted
    # in b's dimensions; ab carries it one further, after its band axis.
    if b_dim is not None:
        bdim = b_dim
    else:
        bdim = max(ab_dim - 1, 0)
        b = jnp.expand_dims(b, bdim)
    if ab_dim is None:
        ab = jnp.expand_dims(ab, bdim + 1)
    elif ab_dim != bdim + 1:
        ab = jnp.moveaxis(ab, ab_dim, bdim + 1)
    axis = axis + 1 if bdim <= axis else axis
    return (ab, b), bdim, axis


banded_solve_p = solve_primitive(
    "tridiax_banded_solve", solves="the banded solve", abstract_eval=_abstract_eval,
    lowering=_lowering, jvp_term=_jvp_term, align_batch=_align_batch)


# ---------------------------------------------------------------------------------------------
# Factor once, solve many (`BandedFactorization`): the factorization and the factored solve as
# primitives, so that a TPU runs them as Pallas kernels (`pallas_tpu_factors.py`) and every
# other platform as XLA's loops (`xla.py`), with sharded batch dimensions kept sharded.


def _factor_abstract_eval(ab, *, l, u, axis, kind, backend):
    """The factors (`_xla_banded.factor_pnq`), in the dtype the elimination computes in."""
    del axis, backend
    shape, dtype = ab.shape[1:], compute_dtype(ab.dtype)
    kept = window.kept_columns(l, u, kind, False)
    return [ShapedArray((kept, *shape), dtype), ShapedArray((l, *shape), dtype),
            ShapedArray(shape, jnp.int32)]


def _factor_lowering(platform: str):
    def factor(ab, *, l, u, axis, kind, backend):
        backend = backend or _backend.default_backend(platform, ab.dtype, op="banded")
        kernel = _backend.factorization_kernels(backend, "_banded")[0]
        outs = _factor_abstract_eval(ab, l=l, u=u, axis=axis, kind=kind, backend=backend)

        def factor_ordered(ab, axis):
            shape = ab.shape[1:]
            ab_view = jax.vmap(lambda band: _layout.to_pnq(band, axis, shape))(ab)
            factors = kernel(ab_view, l=l, u=u, kind=kind, shape=ab_view.shape[1:],
                             out_dtype=compute_dtype(ab.dtype))
            return [f.reshape(f.shape[:-3] + shape) for f in factors]

        def local(ab):
            if backend not in _planner.TPU_BACKENDS:
                return factor_ordered(ab, axis)
            return _in_physical_order(factor_ordered, (ab,), (1,), axis, ab.shape[1:],
                                      compute_dtype(ab.dtype), out_leading=(1, 1, 0))

        return _sharding.partitioned(local, [ab.shape], [o.shape for o in outs], axis,
                                     leading=(1,), out_leading=(1, 1, 0))(ab)

    return factor


def _align_factor_batch(operands, dims, axis):
    (ab,), (dim,) = operands, dims
    ab = jnp.moveaxis(ab, dim, 1)  # one more batch dimension, first of the systems'
    return [ab], [1, 1, 0], axis + 1


banded_factor_p = factor_primitive("tridiax_banded_factor", abstract_eval=_factor_abstract_eval,
                                   lowering=_factor_lowering, align_batch=_align_factor_batch)


def _factored_abstract_eval(u_rows, multipliers, pivots, b, *, axis, transposed, backend):
    del u_rows, multipliers, pivots, axis, transposed, backend
    return ShapedArray(b.shape, b.dtype)


def _factored_lowering(platform: str):
    def solve(u_rows, multipliers, pivots, b, *, axis, transposed, backend):
        backend = backend or _backend.default_backend(platform, b.dtype, op="banded")
        kernel = _backend.factorization_kernels(backend, "_banded")[1]

        def local(u_rows, multipliers, pivots, b):
            operands = (u_rows, multipliers, pivots, b)
            if backend not in _planner.TPU_BACKENDS:
                return solve_ordered(*operands, axis)
            return _in_physical_order(solve_ordered, operands, (1, 1, 0, 0), axis, b.shape,
                                      b.dtype)

        def solve_ordered(u_rows, multipliers, pivots, b, axis):
            full = b.shape

            def view(stack):  # (c, *s) as (c, P|1, N, Q|1) against b's shape
                return jax.vmap(lambda f: _layout.to_pnq(f, axis, full))(stack)

            x = kernel(view(u_rows), view(multipliers), _layout.to_pnq(pivots, axis, full),
                       _layout.to_pnq(b, axis, full), transposed=transposed, out_dtype=b.dtype)
            return x.reshape(full)

        return _sharding.partitioned(
            local, [u_rows.shape, multipliers.shape, pivots.shape, b.shape], [b.shape], axis,
            leading=(1, 1, 0, 0))(u_rows, multipliers, pivots, b)

    return solve


def _factored_jvp_term(tangents, x, **params):
    raise NotImplementedError("the factors are constants of a factored solve: its derivatives "
                              "come from the operator's bands (`BandedFactorization.solve`)")


def _align_factored_batch(operands, dims, axis):
    """The vmapped dimension where b has it (or the first batch position), the factors'
    after their stack axis; unbatched factors get a size-1 dimension there, which the kernels
    broadcast, and an unbatched b is broadcast to the batch (the solution's shape is b's)."""
    u_rows, multipliers, pivots, b = operands
    u_dim, m_dim, p_dim, b_dim = dims

    def place(x, d, lead):
        if d is None:
            return jnp.expand_dims(x, bdim + lead)
        return jnp.moveaxis(x, d, bdim + lead)

    if b_dim is not None:
        bdim = b_dim
        b = place(b, b_dim, 0)
    else:
        bdim = next(d - 1 for d in (u_dim, m_dim) if d is not None) if p_dim is None else p_dim
        bdim = max(bdim, 0)
        size = next(x.shape[d] for x, d in zip(operands[:3], dims[:3], strict=True)
                    if d is not None)
        b = jnp.expand_dims(b, bdim)
        b = jnp.broadcast_to(b, b.shape[:bdim] + (size,) + b.shape[bdim + 1:])
    moved = (place(u_rows, u_dim, 1), place(multipliers, m_dim, 1), place(pivots, p_dim, 0), b)
    return moved, bdim, axis + 1 if bdim <= axis else axis


banded_factored_solve_p = solve_primitive(
    "tridiax_banded_factored_solve", solves="the factored banded solve",
    abstract_eval=_factored_abstract_eval, lowering=_factored_lowering,
    jvp_term=_factored_jvp_term, align_batch=_align_factored_batch)
