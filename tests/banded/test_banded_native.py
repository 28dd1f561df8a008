"""The native banded kernel (banded.cc through `_native.banded_pnq`).

`TestNative` runs the banded kernel contract (banded_contract.py) on it with every case: every
bandwidth up to (8, 8), every kind and size, every layout of vector lanes and broadcast bands,
every dtype, against scipy.linalg.solve_banded and the XLA formulation it follows step for step.
The plain tests check what only this kernel has: many systems shared out over the threads, the
call under jit and its argument checks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from banded_contract import BandedKernelContract, assert_close, check, condition, problem, xla_solve

from tridiax._native import build as _native_build
from tridiax._native import ffi as _native

pytestmark = [
    pytest.mark.cpu_device,
    pytest.mark.skipif(not _native_build.available(), reason="the native CPU kernel is unavailable"),
]


def native(ab, b, *, l, u, kind, transposed, out_dtype=None):
    out = _native.banded_pnq(jnp.asarray(ab), jnp.asarray(b), l=l, u=u, kind=kind,
                             transposed=transposed, out_dtype=out_dtype or b.dtype)
    return np.array(out)


class TestNative(BandedKernelContract):
    def solve(self, ab, b, **options):
        return native(ab, b, **options)


def test_many_systems_on_every_core():
    """The benchmark's shapes scaled down: pentadiagonal float32 systems along axis 0 of (N, B)
    and batch first, many tiles shared out over the threads."""
    for shape in [(1, 100, 1001), (1001, 100, 1)]:
        for kind in ("banded", "banded_pivoted"):
            ab, b, clean = problem(2, 2, kind, shape, (1, 100, shape[2]) if shape[2] > 1 else None,
                                   dtype=np.float32, seed=7)
            options = dict(l=2, u=2, kind=kind, transposed=False)
            assert_close(native(ab, b, **options), xla_solve(ab, b, **options), np.float32,
                         condition(clean, 2, 2, shape))


def test_under_jit():
    ab, b, clean = problem(2, 2, "banded", (3, 7, 5), seed=23)
    f = jax.jit(lambda ab, b: _native.banded_pnq(ab, b, l=2, u=2, kind="banded", transposed=False,
                                                 out_dtype=jnp.float64))
    check(np.asarray(f(ab, b)), clean, b, 2, 2, False)


def test_bad_arguments():
    ab, b, _ = problem(2, 2, "banded", (3, 7, 5))
    options = dict(l=2, u=2, kind="banded", transposed=False)
    with pytest.raises(ValueError, match="kind"):
        native(ab, b, **{**options, "kind": "tridiagonal"})
    with pytest.raises(ValueError, match="bands"):
        native(ab, b, **{**options, "l": 1})
    with pytest.raises(ValueError, match="bands"):
        native(ab[:, :, :3], b, **options)
