"""`tridiagonal_solve_p`: the solve as a JAX primitive with its own AD and batching rules.

Why a primitive rather than custom_vjp/custom_linear_solve around a pallas_call:
- autodiff does not pass through pallas_call, and custom_vjp gives no jvp;
- the batching rule here treats a vmapped dimension as one more batch dimension and shifts
  `axis`, so vmap at any in_axes never transposes (Pallas's own rule and custom_vmap move the
  batch to the front);
- differentiation is implicit: with x = A^{-1} b,
    d x = A^{-1} (d b - dA x)        (JVP: one more solve with the same bands)
    b_bar = A^{-T} x_bar,  dA_bar = -b_bar * x (shifted)   (transpose: one transposed solve;
                                                         the product: `_tridiagonal/band_product.py`)
  and the transposed solve is the same kernel reading the bands shifted (`transposed=True`),
  so reverse mode keeps only x and the bands, and second order composes from the same rules.

Operands: four arrays of one dtype and one rank that broadcast together (`_tridiagonal/api.py` checks
and arranges this). Params: `axis` (non-negative), `transposed`, `backend` (None = per platform,
see `_core/backend.py`), `block` (None, or the (bp, bq) tile of systems a Pallas program solves),
`chunk` (None: the planner decides whether to split long systems into chunks, `_core/planner.py`;
0: never; m: chunks of about m rows) and `kind`:
- "thomas": (lower, diag, upper, rhs), the tridiagonal solve;
- "periodic": the same operands, with lower[0] and upper[N-1] the corners A[0, N-1] and
  A[N-1, 0] of a cyclic matrix (N >= 3), by Sherman-Morrison in one sweep;
- "pivoted": the "thomas" operands, eliminated with partial pivoting (row interchanges, as
  LAPACK's gtsv); same JVP as "thomas" (x = A^{-1} b whatever the elimination order);
- "periodic_pivoted": the "periodic" operands, Sherman-Morrison around the pivoted kernel
  (`_periodic.solve_pivoted`);
- "factored": (l, m, c', rhs), stored factors A = L D V (`_tridiagonal/factorization.py`); linear in rhs
  only here, gradients w.r.t. the bands the factors came from are that module's business.
The transpose rule is the same for every kind: one solve with `transposed` flipped.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from .._core import along_axis as _along
from .._core import backend as _backend
from .._core import layout as _layout
from .._core import planner as _planner
from .._core import sharding as _sharding
from .._core.jax_private import ShapedArray
from .._core.primitive import solve_primitive
from .._long_systems import chunked as _chunked
from .._long_systems import partition_method as _partition_method
from . import cusparse as _cusparse
from . import periodic as _periodic


def _abstract_eval(lower, diag, upper, rhs, *, axis, transposed, backend, kind, block, chunk):
    del transposed, backend, kind, block, chunk
    shape = _layout.broadcast_shape(lower, diag, upper, rhs)
    return ShapedArray(shape, rhs.dtype)


def _lowering(platform: str):
    def solve(lower, diag, upper, rhs, *, axis, transposed, backend, kind, block, chunk):
        full = _layout.broadcast_shape(lower, diag, upper, rhs)
        if 0 in full:
            return jnp.zeros(full, rhs.dtype)
        chosen = backend
        backend = backend or _backend.default_backend(platform, rhs.dtype)
        kernels = _backend.kernels(backend)
        dtype = rhs.dtype

        def plan(P, N, Q, kind, override):
            return _planner.solve_plan(backend, platform, P, N, Q, dtype, kind=kind,
                                       chunk=override, block=block)

        def local_solve(*operands, axis, kind, transposed=False, ordered=False):
            """The systems one device holds (all of them when unsharded)."""
            if backend in _planner.TPU_BACKENDS and not ordered:
                from .._pallas import tpu as _tpu  # the operands as TPU memory holds them

                moved, moved_axis, back = _tpu.in_physical_order(operands, axis, dtype)
                return back(local_solve(*moved, axis=moved_axis, kind=kind,
                                        transposed=transposed, ordered=True))
            if kind == "periodic_pivoted" and (backend not in _planner.TPU_BACKENDS or chunk):
                # Sherman-Morrison around the pivoted kernel (the TPU kernel has the kind)
                pivoted = functools.partial(local_solve, kind="pivoted", ordered=ordered)
                return _periodic.solve_pivoted(*operands, axis=axis, transposed=transposed,
                                               pivoted_solve=pivoted)
            shape = _layout.broadcast_shape(*operands)
            views = [_layout.to_pnq(x, axis, shape) for x in operands]
            P, N, Q = _layout.broadcast_shape(*views)
            if _planner.gpu_library(P, N, Q, kind=kind, platform=platform, backend=chosen,
                                    chunk=chunk, block=block):
                x = _cusparse.solve_pnq(*views, transposed=transposed,
                                        out_dtype=operands[3].dtype)
                return x.reshape(shape)
            move = _planner.gpu_columns(P, Q, dtype, backend=backend, block=block,
                                        kind=kind, N=N)
            views, P, Q, back = _layout.columns_if(move, views, P, Q)
            reduced = kind if kind in ("periodic", "pivoted") else "thomas"
            x = _chunked.solve_any(
                kernels, *views, plan=plan(P, N, Q, kind, chunk), transposed=transposed,
                kind=kind, out_dtype=operands[3].dtype,
                replan=lambda P, C, Q: plan(P, C, Q, reduced, None if chunk != 0 else 0),
                whole=plan(P, N, Q, kind, 0))
            return back(x).reshape(shape)

        split = None if kind == "factored" else functools.partial(
            _partition_method.solve_split, axis=axis, kind=kind, transposed=transposed,
            local_solve=local_solve)
        operands = (lower, diag, upper, rhs)

        def local(lower, diag, upper, rhs):
            return local_solve(lower, diag, upper, rhs, axis=axis, kind=kind,
                               transposed=transposed)

        return _sharding.partitioned(local, [x.shape for x in operands], [full], axis,
                                     split=split)(*operands)

    return solve


def _jvp_term(tangents, x, *, axis, transposed, backend, kind, block, chunk):
    del block, chunk
    if kind == "factored":
        raise NotImplementedError(
            "a factored solve is differentiated through the bands it was made from "
            "(TridiagonalFactorization.solve), not through its factors")
    # -(dA) x as a primitive whose transpose forms the band cotangents in one pass.
    from .band_product import band_product  # imports this module

    return band_product(*tangents, x, axis=axis, transposed=transposed,
                        periodic=_periodic.is_periodic(kind), backend=backend)


def _align_batch(operands, dims, axis):
    return _along.align_batch(operands, dims, axis, preferred=3)


tridiagonal_solve_p = solve_primitive(
    "tridiax_tridiagonal_solve", solves="the tridiagonal solve", abstract_eval=_abstract_eval,
    lowering=_lowering, jvp_term=_jvp_term, align_batch=_align_batch)
