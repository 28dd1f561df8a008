"""What every tridiax primitive shares: eager calls compiled once per shape and parameters."""

from __future__ import annotations

import functools

import jax
from jax.extend.core import Primitive


def def_jit_impl(primitive: Primitive) -> None:
    """Eager calls of `primitive` run its lowering under jit, compiled once per shape and
    parameters like any jitted function."""

    @functools.cache
    def compiled(**params):
        return jax.jit(functools.partial(primitive.bind, **params))

    primitive.def_impl(lambda *operands, **params: compiled(**params)(*operands))
