"""`band_product_p`: the term -(dA) x that the tridiagonal solve's JVP adds to its right-hand side.

With x = A^{-1} b, x' = A^{-1}(b' - A' x) (`_tridiagonal/primitive.py`). Reverse mode transposes the solve
into b_bar = A^{-T} x_bar, and this term into the band cotangents

    lower_bar[i] = -b_bar[i] x[i-1],  diag_bar[i] = -b_bar[i] x[i],  upper_bar[i] = -b_bar[i] x[i+1]

(zero where the neighbour lies outside the system; across the corners when periodic; for a
solve with A^T, b_bar and x swap places in the first and last). Left to JAX's transposition of
the product (`algebra.matvec`), XLA:CPU forms them in three loops that each read b_bar and x
(6 array reads, 3 writes). Here the transpose binds `band_cotangents_p`, which the native CPU
kernel runs as one pass (2 reads, 3 writes). It falls back to XLA's formulation
(`_cotangents`: the same values, one fusion) wherever the kernel does not apply: another
platform or backend, a dtype the kernel lacks, a program partitioned over devices (XLA's partitioner
exchanges the neighbours), and bands broadcast against the others (whose cotangents are sums,
fused by XLA).

Both primitives are bilinear in (bands, x) resp. (b_bar, x); their JVPs are sums of the same
primitives (band_product_p) or XLA's own (band_cotangents_p), so higher orders compose.
Params: `axis`, `transposed` (the solve is with A^T), `periodic`, `present` (which of lower,
diag, upper are operands; the others are zero) and `backend` (the solve's, None = per platform).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching

from .._core import along_axis as _along
from .._core import backend as _backend
from .._core import jax_private as _jax_private
from .._core import layout as _layout
from .._core import sharding as _sharding
from .._core.jax_private import ShapedArray
from .._core.primitive import VaryingPrimitive, def_jit_impl
from . import algebra

band_product_p = VaryingPrimitive("tridiax_band_product")
band_cotangents_p = VaryingPrimitive("tridiax_band_cotangents")
band_cotangents_p.multiple_results = True


def _bands_of(operands, present):
    """(lower, diag, upper) with None for the bands absent from `operands`."""
    it = iter(operands)
    return tuple(next(it) if want else None for want in present)


def _product(*operands, axis, transposed, periodic, present, backend):
    """-(dA) x (or -(dA^T) x): operands are the present bands, then x."""
    del backend
    lower, diag, upper = _bands_of(operands[:-1], present)
    return -algebra.matvec(lower, diag, upper, operands[-1], axis=axis, transposed=transposed,
                          periodic=periodic)


def band_product(lower, diag, upper, x, *, axis: int, transposed: bool, periodic: bool,
                 backend=None):
    """-(dA) x for the band tangents (None: zero; at least one given), as the primitive."""
    present = tuple(b is not None for b in (lower, diag, upper))
    bands = [b for b in (lower, diag, upper) if b is not None]
    return band_product_p.bind(*bands, x, axis=axis, transposed=transposed, periodic=periodic,
                               present=present, backend=backend)


@band_product_p.def_abstract_eval
def _product_abstract_eval(*operands, **_):
    return ShapedArray(_layout.broadcast_shape(*operands), operands[-1].dtype)


def_jit_impl(band_product_p)
for _platform in ("cpu", "cuda", "rocm", "tpu"):
    jax.interpreters.mlir.register_lowering(
        band_product_p, jax.interpreters.mlir.lower_fun(_product, multiple_results=False),
        platform=_platform)


def _product_jvp(primals, tangents, *, present, **params):
    out = band_product_p.bind(*primals, present=present, **params)
    bands, x = primals[:-1], primals[-1]
    band_ts, x_t = tangents[:-1], tangents[-1]
    terms = []
    nonzero = [type(t) is not ad.Zero for t in band_ts]
    if any(nonzero):  # the bands' tangents times x
        mask = iter(nonzero)
        sub = tuple(want and next(mask) for want in present)
        terms.append(band_product_p.bind(*(t for t, nz in zip(band_ts, nonzero) if nz), x,
                                         present=sub, **params))
    if type(x_t) is not ad.Zero:  # the bands times x's tangent
        terms.append(band_product_p.bind(*bands, x_t, present=present, **params))
    if not terms:
        return out, ad.Zero.from_primal_value(out)
    return out, sum(terms[1:], terms[0])


ad.primitive_jvps[band_product_p] = _product_jvp


def _product_transpose(ct, *operands, axis, transposed, periodic, present, backend):
    bands, x = operands[:-1], operands[-1]
    if type(ct) is ad.Zero:
        return [None] * len(operands)
    if ad.is_undefined_primal(x):
        if any(ad.is_undefined_primal(b) for b in bands):
            raise NotImplementedError("band_product_p is bilinear: one factor must be known")
        lower, diag, upper = _bands_of(bands, present)
        x_bar = algebra.matvec(lower, diag, upper, -ct, axis=axis, transposed=not transposed,
                              periodic=periodic)
        return [None] * len(bands) + [_along.unbroadcast(x_bar, x.aval.shape)]
    # Cotangents of the bands: those of the full shape in one pass (band_cotangents_p), those
    # broadcast (summed) or known by JAX's transposition of the product.
    shape = jnp.shape(x)
    unknown = [ad.is_undefined_primal(b) for b in bands]
    full = [u and b.aval.shape == shape and b.aval.dtype == x.dtype
            for u, b in zip(unknown, bands)]
    out = [None] * len(operands)
    slots = [k for k, want in enumerate(present) if want]  # band index of each operand
    if any(full):
        want = tuple(any(f and slots[j] == k for j, f in enumerate(full)) for k in range(3))
        cots = band_cotangents_p.bind(jnp.broadcast_to(ct, shape), x, axis=axis,
                                      transposed=transposed, periodic=periodic, present=want,
                                      backend=backend)
        by_band = dict(zip([k for k in range(3) if want[k]], cots))
        for j, f in enumerate(full):
            if f:
                out[j] = by_band[slots[j]]
    rest = [j for j, u in enumerate(unknown) if u and not full[j]]
    if rest:
        avals = [bands[j].aval for j in rest]

        def product(*ts):
            filled = list(bands)
            for j, t in zip(rest, ts):
                filled[j] = t
            filled = [jnp.zeros(b.aval.shape, b.aval.dtype) if ad.is_undefined_primal(b) else b
                      for b in filled]
            return _product(*filled, x, axis=axis, transposed=transposed, periodic=periodic,
                            present=present, backend=backend)

        rest_bars = jax.linear_transpose(product, *map(_jax_private.struct_of, avals))(ct)
        for j, bar in zip(rest, rest_bars):
            out[j] = bar
    return out


ad.primitive_transposes[band_product_p] = _product_transpose


def _product_batch(operands, dims, *, axis, **params):
    moved, bdim, axis = _along.align_batch(operands, dims, axis, preferred=len(operands) - 1)
    return band_product_p.bind(*moved, axis=axis, **params), bdim


batching.primitive_batchers[band_product_p] = _product_batch


# ---- band_cotangents_p: (b_bar, x) -> the present bands' cotangents, each of x's shape ----

def _cotangents(g, x, *, axis, transposed, periodic, present, backend):
    """XLA's formulation: each band's cotangent one product of b_bar and x with the neighbour
    moved along `axis` before it (shifted, or rolled when periodic), so that XLA forms all
    three in one pass over b_bar and x. JAX's transposition of the product gives the same
    values but moves each product after it is formed: on a TPU, a pass of its own per band."""
    del backend
    def move(v, k):
        return _along.roll(v, k, axis) if periodic else _along.shift(v, k, axis)

    negated = -g
    cots = []
    if present[0]:  # -g[i] x[i-1]; transposed, -g[i-1] x[i]
        cots.append(move(negated, 1) * x if transposed else negated * move(x, 1))
    if present[1]:
        cots.append(negated * x)
    if present[2]:  # -g[i] x[i+1]; transposed, -g[i+1] x[i]
        cots.append(move(negated, -1) * x if transposed else negated * move(x, -1))
    return cots


@band_cotangents_p.def_abstract_eval
def _cotangents_abstract_eval(g, x, *, present, **_):
    return [ShapedArray(x.shape, x.dtype)] * sum(present)


def _cotangents_lowering(platform: str):
    def lower(g, x, *, axis, transposed, periodic, present, backend):
        params = dict(axis=axis, transposed=transposed, periodic=periodic, present=present,
                      backend=backend)
        if platform != "cpu" or _sharding.partitioning() or not _native_applies(x, backend):
            return _cotangents(g, x, **params)
        from .._native import ffi as _native

        P, N = int(np.prod(x.shape[:axis])), x.shape[axis]
        view = (P, N, x.size // max(P * N, 1))
        cots = _native.band_cotangents_pnq(g.reshape(view), x.reshape(view),
                                           transposed=transposed, periodic=periodic,
                                           present=present)
        return [c.reshape(x.shape) for c in cots if c is not None]

    return lower


def _native_applies(x, backend) -> bool:
    if backend not in (None, "native") or x.size == 0:
        return False
    from .._native import ffi as _native

    return (np.dtype(x.dtype) in map(np.dtype, _native.BAND_COTANGENT_DTYPES)
            and _backend.unavailable("native", x.dtype, platform="cpu") is None)


def_jit_impl(band_cotangents_p)
for _platform in ("cpu", "cuda", "rocm", "tpu"):
    _sharding.register_lowering(band_cotangents_p, _cotangents_lowering(_platform), _platform,
                                multiple_results=True)


def _cotangents_jvp(primals, tangents, **params):
    tangents = tuple(ad.instantiate_zeros(t) for t in tangents)
    return jax.jvp(lambda g, x: _cotangents(g, x, **params), tuple(primals), tangents)


ad.primitive_jvps[band_cotangents_p] = _cotangents_jvp


def _cotangents_batch(operands, dims, *, axis, **params):
    moved, bdim, axis = _along.align_batch(operands, dims, axis, preferred=0)
    shape = _layout.broadcast_shape(*moved)
    moved = [jnp.broadcast_to(v, shape) for v in moved]
    outs = band_cotangents_p.bind(*moved, axis=axis, **params)
    return outs, [bdim] * len(outs)


batching.primitive_batchers[band_cotangents_p] = _cotangents_batch
