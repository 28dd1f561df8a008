"""How a public call runs: its checks in Python, then its computation as one cached jit.

Checks read only shapes and dtypes (`_core/inputs.py`), so they cost no device work. The
computation (casts, reshapes, the primitive, the check=True arithmetic) is a function of
static settings and arrays, jitted once per function and cached by JAX per settings and input
types: an eager call then costs one dispatch of a compiled program instead of one dispatch per
jnp operation (which made small eager solves slower than jax.lax.linalg), and under an
enclosing jit, vmap or grad the nested jit is simply inlined.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from . import jax_private as _jax_private


def run(compute, static, *arrays):
    """`compute(static, *arrays)`, with `static` hashable, through one cached jit."""
    return _jitted(compute)(static, *arrays)


@functools.cache
def _jitted(compute):
    return jax.jit(compute, static_argnums=0)


def is_traced(x) -> bool:
    """Whether `x` is a tracer (the call is being traced by jit, vmap, grad, ...)."""
    return _jax_private.is_tracer(x)


def structural_hash(module) -> int:
    """A hash of an Equinox module that reads no array values: its type, pytree structure
    (static fields included) and its leaves' shapes and dtypes.

    Equinox hashes a module by its fields, and arrays are unhashable, so `jax.jit(A.solve)`
    (which hashes the bound method, and through it `A`) failed. Modules that equinox
    compares equal (same structure, leaves equal by value) have equal structural hashes, as
    Python requires; jax.jit then tells two operators apart by comparing their values."""
    leaves, treedef = jax.tree.flatten(module)
    return hash((treedef, tuple((np.shape(x), str(getattr(x, "dtype", type(x)))) for x in leaves)))

