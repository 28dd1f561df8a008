"""What every tridiax primitive shares: eager calls compiled once per shape and parameters, and
the rules of a linear solve x = A^{-1} b written once for every family.

A solve primitive's operands are the arrays that make up A (bands, blocks, factors), then the
right-hand side b; its params hold at least `axis` (the solve axis of b, non-negative) and
`transposed` (solve with A^T, reading the same operands). Differentiation is implicit:

    d x = A^{-1} (d b - dA x)                   (JVP: one more solve with the same A)
    b_bar = A^{-T} x_bar                        (transpose: one solve with `transposed` flipped)

and the cotangents of A's operands come from transposing the family's product -dA x, so
reverse mode keeps only x and A, and higher orders compose from the same rules.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from . import along_axis as _along
from . import jax_private as _jax_private
from . import sharding as _sharding

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


class VaryingPrimitive(Primitive):
    """A Primitive that works inside shard_map with check_vma (its default): its operands are
    cast to vary over the same mesh axes before it binds (`_jax_private.vary_together`), and
    its results vary over them (the abstract evaluation declares it). Outside shard_map it is
    a plain Primitive."""

    def bind(self, *args, **params):
        return super().bind(*_jax_private.vary_together(args), **params)

    def def_abstract_eval(self, abstract_eval):
        def varying(*avals, **params):
            out = abstract_eval(*avals, **params)
            axes = frozenset().union(*(_jax_private.varying_axes(a) for a in avals))
            if not axes:
                return out
            like = next(a for a in avals if _jax_private.varying_axes(a))
            if self.multiple_results:
                return [_jax_private.with_varying(o, axes, like) for o in out]
            return _jax_private.with_varying(out, axes, like)

        super().def_abstract_eval(varying)
        return abstract_eval


def def_jit_impl(primitive: Primitive) -> None:
    """Eager calls of `primitive` run its lowering under jit, compiled once per shape and
    parameters like any jitted function."""

    @functools.cache
    def compiled(**params):
        return jax.jit(functools.partial(primitive.bind, **params))

    primitive.def_impl(lambda *operands, **params: compiled(**params)(*operands))


def factor_primitive(name: str, *, abstract_eval: Callable,
                     lowering: Callable[[str], Callable], align_batch: Callable) -> Primitive:
    """A JAX primitive computing a factorization (several results, constants to
    differentiation), with its eager implementation, abstract evaluation, lowering on every
    platform and batching rule: `align_batch(operands, dims, axis)` gives the operands with
    their vmapped dimensions in place, each result's batch dimension and the shifted `axis`."""
    primitive = VaryingPrimitive(name)
    primitive.multiple_results = True
    def_jit_impl(primitive)
    primitive.def_abstract_eval(abstract_eval)
    for platform in PLATFORMS:
        _sharding.register_lowering(primitive, lowering(platform), platform,
                                    multiple_results=True)

    def batch(operands: Sequence, dims: Sequence, *, axis: int, **params):
        moved, out_dims, axis = align_batch(operands, dims, axis)
        return primitive.bind(*moved, axis=axis, **params), out_dims

    batching.primitive_batchers[primitive] = batch
    return primitive


def solve_primitive(name: str, *, solves: str, abstract_eval: Callable,
                    lowering: Callable[[str], Callable], jvp_term: Callable,
                    align_batch: Callable) -> Primitive:
    """A JAX primitive for x = A^{-1} b, with its eager implementation, abstract evaluation,
    lowering on every platform (through `_sharding.register_lowering`), JVP, transpose and
    batching rule.

    **Arguments:**
    - `name`: the primitive's name.
    - `solves`: what it solves, for error messages ("the banded solve").
    - `abstract_eval(*operands, **params)`: the output's ShapedArray.
    - `lowering(platform)`: the function of (*operands, **params) that computes x there.
    - `jvp_term(tangents, x, **params)`: -dA x, from the tangents of A's operands (None where
      an operand's tangent is zero; at least one is not); raises NotImplementedError where A's
      operands cannot be differentiated.
    - `align_batch(operands, dims, axis)`: the operands with their vmapped dimensions (None:
      unbatched) in one place, that dimension of the output, and the solve axis after it.
    """
    primitive = VaryingPrimitive(name)
    def_jit_impl(primitive)
    primitive.def_abstract_eval(abstract_eval)
    for platform in PLATFORMS:
        _sharding.register_lowering(primitive, lowering(platform), platform)

    def jvp(primals, tangents, **params):
        *matrix, _ = primals
        x = primitive.bind(*primals, **params)
        *matrix_t, rhs_t = (None if type(t) is ad.Zero else t for t in tangents)
        terms = [] if rhs_t is None else [rhs_t]
        if any(t is not None for t in matrix_t):
            terms.append(jvp_term(matrix_t, x, **params))
        if not terms:
            return x, ad.Zero.from_primal_value(x)
        return x, primitive.bind(*matrix, sum(terms[1:], terms[0]), **params)

    def transpose(x_bar, *operands, transposed, **params):
        *matrix, rhs = operands
        none = (None,) * len(matrix)
        if any(ad.is_undefined_primal(m) for m in matrix):
            raise NotImplementedError(f"{solves} is linear in its right-hand side only")
        if type(x_bar) is ad.Zero:
            return (*none, ad.Zero(rhs.aval))
        b_bar = primitive.bind(*matrix, x_bar, transposed=not transposed, **params)
        return (*none, _along.unbroadcast(b_bar, rhs.aval.shape))

    def batch(operands: Sequence, dims: Sequence, *, axis: int, **params):
        moved, bdim, axis = align_batch(operands, dims, axis)
        return primitive.bind(*moved, axis=axis, **params), bdim

    ad.primitive_jvps[primitive] = jvp
    ad.primitive_transposes[primitive] = transpose
    batching.primitive_batchers[primitive] = batch
    return primitive
