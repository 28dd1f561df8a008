"""Which dtypes the solvers accept and which dtype they compute in."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

#: Low-precision inputs are loaded, eliminated and substituted in float32, then rounded once.
_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def compute_dtype(dtype) -> np.dtype:
    dtype = jnp.dtype(dtype)
    return jnp.dtype(jnp.float32) if dtype in _HALF else dtype


def is_supported(dtype) -> bool:
    dtype = jnp.dtype(dtype)
    return jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating)
