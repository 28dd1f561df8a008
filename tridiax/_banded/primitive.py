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
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._core import backend as _backend
from .._core import layout as _layout
from .._core import planner as _planner
from .._core import sharding as _sharding
from .._core.jax_private import ShapedArray
from .._core.primitive import solve_primitive
from . import algebra


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
                return _in_physical_order(solve_ordered, ab, b, axis, b.dtype)
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
            x = kernel(ab_view, b_view, l=l, u=u, kind=kind, transposed=transposed,
                       out_dtype=b.dtype, **options)
            return x.reshape(full)

        return _sharding.partitioned(local, [ab.shape, b.shape], [_full_shape(ab, b)], axis,
                                     leading=(1, 0))(ab, b)

    return solve


def _in_physical_order(solve, ab, b, axis: int, dtype):
    """`solve(ab, b, axis)` on the operands transposed into the order a TPU stores them in
    (`_pallas/tpu.py`, `physical_order`; the band axis stays first), transposed back."""
    from .._pallas import tpu as _tpu

    order = _tpu.physical_order(_full_shape(ab, b), dtype)
    if order is None:
        return solve(ab, b, axis)
    rank = len(order)
    ab = ab.reshape(ab.shape[:1] + (1,) * (rank + 1 - ab.ndim) + ab.shape[1:])
    b = b.reshape((1,) * (rank - b.ndim) + b.shape)
    inverse = tuple(order.index(d) for d in range(len(order)))
    x = solve(jnp.transpose(ab, (0, *(d + 1 for d in order))), jnp.transpose(b, order),
              order.index(axis))
    return jnp.transpose(x, inverse)


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
