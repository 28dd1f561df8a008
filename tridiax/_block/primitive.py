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
The JVP's dA x is `_bands.block_matvec`, plain jnp, so JAX transposes it into those block
cotangents (zero for lower[0] and upper[N-1]); the transposed solve is the same kernel reading
the blocks of A^T. Second order composes from the same rules; the batching rule makes a vmapped
dimension one more batch dimension (moving it only when it was one of the block dimensions).

Sharded operands are gathered by XLA (no custom partitioning yet): correct, not fast.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from .._core import backend as _backend
from .._core import band_algebra as _bands
from .._core import layout as _layout
from .._core import sharding as _sharding
from .._core.jax_private import ShapedArray
from .._core.primitive import def_jit_impl

block_solve_p = Primitive("tridiax_block_solve")
def_jit_impl(block_solve_p)


def _systems_shape(*operands) -> tuple[int, ...]:
    """The broadcast shape of the dimensions before the two block dimensions."""
    return tuple(jnp.broadcast_shapes(*(x.shape[:-2] for x in operands)))


@block_solve_p.def_abstract_eval
def _abstract_eval(lower, diag, upper, b, *, axis, transposed, backend, kind):
    del axis, transposed, backend, kind
    return ShapedArray(_systems_shape(lower, diag, upper, b) + b.shape[-2:], b.dtype)


def to_pnq_blocks(x, axis: int, systems: tuple[int, ...]):
    """`x` (systems-compatible dims, then two block dims) as (P|1, N|1, Q|1, r, c)."""
    return _layout.to_pnq(x, axis, systems, trailing=2)


def _lowering(platform: str):
    def solve(lower, diag, upper, b, *, axis, transposed, backend, kind):
        systems = _systems_shape(lower, diag, upper, b)
        backend = backend or _backend.default_block_backend(platform, b.dtype, diag.shape[-1])
        kernel = _backend.block_kernel(backend)
        blocks = [to_pnq_blocks(x, axis, systems) for x in (lower, diag, upper)]
        b_view = to_pnq_blocks(jnp.broadcast_to(b, systems + b.shape[-2:]), axis, systems)
        x = kernel(*blocks, b_view, kind=kind, transposed=transposed, out_dtype=b.dtype)
        return x.reshape(systems + b.shape[-2:])

    return solve


for _platform in ("cpu", "cuda", "rocm", "tpu"):
    _sharding.register_lowering(block_solve_p, _lowering(_platform), _platform)


def _jvp(primals, tangents, *, axis, transposed, backend, kind):
    lower, diag, upper, b = primals
    params = dict(axis=axis, transposed=transposed, backend=backend, kind=kind)
    x = block_solve_p.bind(lower, diag, upper, b, **params)
    block_tangents = [None if type(t) is ad.Zero else t for t in tangents[:3]]
    b_t = None if type(tangents[3]) is ad.Zero else tangents[3]
    terms = [] if b_t is None else [b_t]
    if any(t is not None for t in block_tangents):
        terms.append(-_bands.block_matvec(*block_tangents, x, axis=axis, transposed=transposed))
    if not terms:
        return x, ad.Zero.from_primal_value(x)
    total = terms[0] if len(terms) == 1 else terms[0] + terms[1]
    return x, block_solve_p.bind(lower, diag, upper, jnp.broadcast_to(total, x.shape), **params)


ad.primitive_jvps[block_solve_p] = _jvp


def _transpose(x_bar, lower, diag, upper, b, *, axis, transposed, backend, kind):
    if any(ad.is_undefined_primal(block) for block in (lower, diag, upper)):
        raise NotImplementedError("the block-tridiagonal solve is linear in b only")
    if type(x_bar) is ad.Zero:
        return None, None, None, ad.Zero(b.aval)
    b_bar = block_solve_p.bind(lower, diag, upper, x_bar, axis=axis, transposed=not transposed,
                               backend=backend, kind=kind)
    return None, None, None, _bands.unbroadcast(b_bar, b.aval.shape)


ad.primitive_transposes[block_solve_p] = _transpose


def _batch(operands, dims, *, axis, **params):
    # A vmapped dimension among the two block dimensions moves to the front first: the batch
    # dimensions are the ones before them.
    operands, dims = list(operands), list(dims)
    for k, (x, d) in enumerate(zip(operands, dims, strict=True)):
        if d is not None and d > x.ndim - 3:
            operands[k], dims[k] = jnp.moveaxis(x, d, 0), 0
    moved, bdim, axis = _bands.align_batch(operands, dims, axis, preferred=3)
    return block_solve_p.bind(*moved, axis=axis, **params), bdim


batching.primitive_batchers[block_solve_p] = _batch
