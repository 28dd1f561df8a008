"""`block_solve_p`: the block-tridiagonal solve as a JAX primitive, built like `banded_solve_p`.

Operands: `lower`, `diag`, `upper` (blocks, (..., k, k)) and `b` ((..., k, m)), of one dtype
and one rank, whose dimensions before the two trailing ones broadcast together; the block rows
lie along `axis` of those (non-negative). Params: `axis`, `transposed` (solve A^T x = b, the
plain transpose, reading the same blocks), `backend` (None: per platform, `_core/backend.py`) and
`kind` (`_block/xla.py`, `KINDS`).

Differentiation is implicit, as for the tridiagonal solve (`_tridiagonal/primitive.py`):
    d x = A^{-1} (d b - dA x)          (JVP: one more solve with the same blocks)
    b_bar = A^{-T} x_bar,  diag_bar[i] = -b_bar[i] x[i]^T,  lower_bar[i] = -b_bar[i] x[i-1]^T,
    upper_bar[i] = -b_bar[i] x[i+1]^T                          (transpose of the JVP)
The JVP's dA x is `algebra.matvec`, plain jnp, so JAX transposes it into those block
cotangents (zero for lower[0] and upper[N-1]); the transposed solve is the same kernel reading
the blocks of A^T. Second order composes from the same rules; the batching rule makes a vmapped
dimension one more batch dimension (moving it only when it was one of the block dimensions).

Sharded batch dimensions stay sharded: each device solves the systems it holds
(`_core/sharding.py`); a sharded solve axis is gathered first.

`block_factor_p` (lower, diag, upper -> lu, pivots, e: `_xla_block.factor_pnq`'s factors) and
`block_factored_solve_p` (lu, pivots, e, lower, b -> x) are `BlockTridiagonalFactorization`'s
two steps, built the same way. The factors are constants (no JVP: derivatives with respect to
the blocks come from the factorization's custom_linear_solve). On a TPU both run the Pallas
kernels of `pallas_tpu_factors.py`; elsewhere XLA's loops.
"""

from __future__ import annotations

import jax.numpy as jnp

from .._core import along_axis as _along
from .._core import backend as _backend
from .._core import layout as _layout
from .._core import planner as _planner
from .._core import sharding as _sharding
from .._core.dtypes import compute_dtype
from .._core.jax_private import ShapedArray
from .._core.primitive import factor_primitive, solve_primitive
from . import algebra


def _systems_shape(*operands) -> tuple[int, ...]:
    """The broadcast shape of the dimensions before the two block dimensions."""
    return tuple(jnp.broadcast_shapes(*(x.shape[:-2] for x in operands)))


def _abstract_eval(lower, diag, upper, b, *, axis, transposed, backend, kind):
    del axis, transposed, backend, kind
    return ShapedArray(_systems_shape(lower, diag, upper, b) + b.shape[-2:], b.dtype)


def to_pnq_blocks(x, axis: int, systems: tuple[int, ...]):
    """`x` (systems-compatible dims, then two block dims) as (P|1, N|1, Q|1, r, c)."""
    return _layout.to_pnq(x, axis, systems, trailing=2)


def _lowering(platform: str):
    def solve(lower, diag, upper, b, *, axis, transposed, backend, kind):
        backend = backend or _backend.default_block_backend(platform, b.dtype, diag.shape[-1])
        kernel = _backend.kernels(backend).block

        def local(lower, diag, upper, b):
            """The systems one device holds (all of them when unsharded)."""
            systems = _systems_shape(lower, diag, upper, b)
            blocks = [to_pnq_blocks(x, axis, systems) for x in (lower, diag, upper)]
            b_view = to_pnq_blocks(jnp.broadcast_to(b, systems + b.shape[-2:]), axis, systems)
            # On a GPU, systems whose rows are narrower than a memory sector (batch-first)
            # are moved to columns, as the tridiagonal kernels' are (`_planner.gpu_columns`).
            P, _, Q = b_view.shape[:3]
            views, P, Q, back = _layout.columns_if(
                _planner.gpu_columns(P, Q, b.dtype, backend=backend), [*blocks, b_view], P, Q)
            x = kernel(*views, kind=kind, transposed=transposed, out_dtype=b.dtype)
            return back(x).reshape(systems + b.shape[-2:])

        operands = (lower, diag, upper, b)
        out = _systems_shape(*operands) + b.shape[-2:]
        return _sharding.partitioned(local, [x.shape for x in operands], [out], axis,
                                     trailing=2)(*operands)

    return solve


def _jvp_term(tangents, x, *, axis, transposed, backend, kind):
    del backend, kind
    return -algebra.matvec(*tangents, x, axis=axis, transposed=transposed)


def _align_batch(operands, dims, axis):
    # A vmapped dimension among the two block dimensions moves to the front first: the batch
    # dimensions are the ones before them. Ties go to the last operand's position (b's).
    operands, dims = list(operands), list(dims)
    for k, (x, d) in enumerate(zip(operands, dims, strict=True)):
        if d is not None and d > x.ndim - 3:
            operands[k], dims[k] = jnp.moveaxis(x, d, 0), 0
    return _along.align_batch(operands, dims, axis, preferred=len(operands) - 1)


block_solve_p = solve_primitive(
    "tridiax_block_solve", solves="the block-tridiagonal solve", abstract_eval=_abstract_eval,
    lowering=_lowering, jvp_term=_jvp_term, align_batch=_align_batch)


# ---------------------------------------------------------------------------------------------
# Factor once, solve many (`BlockTridiagonalFactorization`): the factorization and the factored
# solve as primitives, so that a TPU runs them as Pallas kernels (`pallas_tpu_factors.py`) and
# every other platform as XLA's loops (`xla.py`), with sharded batch dimensions kept sharded.


def _factor_abstract_eval(lower, diag, upper, *, axis, kind, backend):
    """lu and e (systems, k, k) and the pivots (systems, k, 1) int32 (`_xla_block.factor_pnq`),
    in the dtype the elimination computes in."""
    del axis, kind, backend
    systems, k, dtype = _systems_shape(lower, diag, upper), diag.shape[-1], compute_dtype(diag.dtype)
    return [ShapedArray(systems + (k, k), dtype), ShapedArray(systems + (k, 1), jnp.int32),
            ShapedArray(systems + (k, k), dtype)]


def _factor_lowering(platform: str):
    def factor(lower, diag, upper, *, axis, kind, backend):
        backend = backend or _backend.default_block_backend(platform, diag.dtype, diag.shape[-1])
        kernel = _backend.factorization_kernels(backend, "_block")[0]
        outs = _factor_abstract_eval(lower, diag, upper, axis=axis, kind=kind, backend=backend)

        def local(lower, diag, upper):
            systems = _systems_shape(lower, diag, upper)
            blocks = [to_pnq_blocks(x, axis, systems) for x in (lower, diag, upper)]
            factors = kernel(*blocks, kind=kind, out_dtype=compute_dtype(diag.dtype))
            return [f.reshape(systems + f.shape[-2:]) for f in factors]

        operands = (lower, diag, upper)
        return _sharding.partitioned(local, [x.shape for x in operands], [o.shape for o in outs],
                                     axis, trailing=2)(*operands)

    return factor


def _align_factor_batch(operands, dims, axis):
    moved, bdim, axis = _align_batch(operands, dims, axis)
    return moved, [bdim] * 3, axis


block_factor_p = factor_primitive("tridiax_block_factor", abstract_eval=_factor_abstract_eval,
                                  lowering=_factor_lowering, align_batch=_align_factor_batch)


def _factored_lowering(platform: str):
    def solve(lu, pivots, e, lower, b, *, axis, transposed, backend):
        backend = backend or _backend.default_block_backend(platform, b.dtype, b.shape[-2])
        kernel = _backend.factorization_kernels(backend, "_block")[1]

        def local(*operands):
            systems = _systems_shape(*operands)
            *factors, b = operands
            views = [to_pnq_blocks(x, axis, systems) for x in factors]
            b_view = to_pnq_blocks(jnp.broadcast_to(b, systems + b.shape[-2:]), axis, systems)
            x = kernel(*views, b_view, transposed=transposed, out_dtype=b.dtype)
            return x.reshape(systems + b.shape[-2:])

        operands = (lu, pivots, e, lower, b)
        out = _systems_shape(*operands) + b.shape[-2:]
        return _sharding.partitioned(local, [x.shape for x in operands], [out], axis,
                                     trailing=2)(*operands)

    return solve


def _factored_abstract_eval(lu, pivots, e, lower, b, *, axis, transposed, backend):
    del axis, transposed, backend
    return ShapedArray(_systems_shape(lu, pivots, e, lower, b) + b.shape[-2:], b.dtype)


def _factored_jvp_term(tangents, x, **params):
    raise NotImplementedError("the factors are constants of a factored solve: its derivatives "
                              "come from the operator's blocks (`BlockTridiagonalFactorization"
                              ".solve`)")


block_factored_solve_p = solve_primitive(
    "tridiax_block_factored_solve", solves="the factored block-tridiagonal solve",
    abstract_eval=_factored_abstract_eval, lowering=_factored_lowering,
    jvp_term=_factored_jvp_term, align_batch=_align_batch)
