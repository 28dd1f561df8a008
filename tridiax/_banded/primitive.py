"""`banded_solve_p`: the banded solve as a JAX primitive, built like `tridiagonal_solve_p`.

Operands: `ab`, the bands in scipy's layout on a leading axis of their own, ab[u + i - j, j] =
A[i, j] along `axis` + 1 (shape (l + u + 1, *s) with s broadcasting against b), and `b`.
Params: `l`, `u`, `axis` (of b, non-negative), `transposed` (solve A^T x = b, reading the
same bands), `backend` (None: per platform, `_core/backend.py`) and `kind` (`_xla_banded.KINDS`).

Differentiation is implicit, as for the tridiagonal solve (`_tridiagonal/primitive.py`):
    d x = A^{-1} (d b - dA x)          (JVP: one more solve with the same bands)
    b_bar = A^{-T} x_bar,  ab_bar[u + i - j, j] = -b_bar[i] x[j]   (transpose of the JVP)
The JVP's dA x is `_bands.banded_matvec`, plain jnp, so JAX transposes it into that ab_bar
(zero on the entries of ab outside the matrix); the transposed solve is the same kernel
reading the band of A^T. Second order composes from the same rules; the batching rule adds a
vmapped dimension as one more batch dimension of b (and of ab, after its band axis).

Sharded operands are gathered by XLA (no custom partitioning yet): correct, not fast.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from .._core import backend as _backend
from .._core import band_algebra as _bands
from .._core import layout as _layout
from .._core import sharding as _sharding
from .._core.jax_private import ShapedArray
from .._core.primitive import def_jit_impl

banded_solve_p = Primitive("tridiax_banded_solve")
def_jit_impl(banded_solve_p)


def _full_shape(ab, b) -> tuple[int, ...]:
    return tuple(jnp.broadcast_shapes(ab.shape[1:], b.shape))


@banded_solve_p.def_abstract_eval
def _abstract_eval(ab, b, *, l, u, axis, transposed, backend, kind):
    del l, u, axis, transposed, backend, kind
    return ShapedArray(_full_shape(ab, b), b.dtype)


def _lowering(platform: str):
    def solve(ab, b, *, l, u, axis, transposed, backend, kind):
        full = _full_shape(ab, b)
        backend = backend or _backend.default_backend(platform, b.dtype)
        kernel = _backend.banded_kernel(backend)
        # The bands as (K, P|1, N|1, Q|1): the same view of every band row (a free reshape,
        # unless a band is broadcast in part of a group, which `to_pnq` materialises).
        ab_view = jax.vmap(lambda band: _layout.to_pnq(band, axis, full))(ab)
        b_view = _layout.to_pnq(jnp.broadcast_to(b, full), axis, full)
        x = kernel(ab_view, b_view, l=l, u=u, kind=kind, transposed=transposed,
                   out_dtype=b.dtype)
        return x.reshape(full)

    return solve


for _platform in ("cpu", "cuda", "rocm", "tpu"):
    _sharding.register_lowering(banded_solve_p, _lowering(_platform), _platform)


def _jvp(primals, tangents, *, l, u, axis, transposed, backend, kind):
    ab, b = primals
    params = dict(l=l, u=u, axis=axis, transposed=transposed, backend=backend, kind=kind)
    x = banded_solve_p.bind(ab, b, **params)
    ab_t, b_t = (None if type(t) is ad.Zero else t for t in tangents)
    terms = [] if b_t is None else [b_t]
    if ab_t is not None:
        terms.append(-_bands.banded_matvec(ab_t, x, l=l, u=u, axis=axis, transposed=transposed))
    if not terms:
        return x, ad.Zero.from_primal_value(x)
    total = terms[0] if len(terms) == 1 else terms[0] + terms[1]
    return x, banded_solve_p.bind(ab, jnp.broadcast_to(total, x.shape), **params)


ad.primitive_jvps[banded_solve_p] = _jvp


def _transpose(x_bar, ab, b, *, l, u, axis, transposed, backend, kind):
    if ad.is_undefined_primal(ab):
        raise NotImplementedError("the banded solve is linear in b only")
    if type(x_bar) is ad.Zero:
        return None, ad.Zero(b.aval)
    b_bar = banded_solve_p.bind(ab, x_bar, l=l, u=u, axis=axis, transposed=not transposed,
                                backend=backend, kind=kind)
    return None, _bands.unbroadcast(b_bar, b.aval.shape)


ad.primitive_transposes[banded_solve_p] = _transpose


def _batch(operands, dims, *, axis, **params):
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
    return banded_solve_p.bind(ab, b, axis=axis, **params), bdim


batching.primitive_batchers[banded_solve_p] = _batch
