"""The native block-tridiagonal kernel (block.cc through `_native.block_pnq`).

`TestNative` runs the block kernel contract (block_contract.py) on it with every case: block
sizes 1-4 (unrolled at compile time) and 5, 8, 16 (at run time), every kind and length, lanes
along Q (vectors with a ragged last one, through 8x8 transposes or value by value) and along P,
broadcast blocks, every dtype, against dense solves of the assembled matrices and the XLA
formulation it follows step for step. The plain tests check what only this kernel has: many
systems shared out over the threads, the call under jit, its argument checks, and the public
solve calling it with no copy of an operand around it.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from block_contract import BlockKernelContract, check, problem, residual

import tridiax
from tridiax._core.planner import cpu_cache_bytes
from tridiax._native import build as _native_build
from tridiax._native import ffi as _native

pytestmark = [
    pytest.mark.cpu_device,
    pytest.mark.skipif(not _native_build.available(), reason="the native CPU kernel is unavailable"),
]

# The cache a tile fits in, as the planner gives it to the kernel (`_core/backend.py`).
CACHE = cpu_cache_bytes()


def native(lower, diag, upper, b, *, kind, transposed, out_dtype=None):
    out = _native.block_pnq(*map(jnp.asarray, (lower, diag, upper, b)), kind=kind,
                            transposed=transposed, out_dtype=out_dtype or b.dtype, cache=CACHE)
    return np.array(out)


class TestNative(BlockKernelContract):
    def solve(self, *operands, **options):
        return native(*operands, **options)


def test_many_systems_on_every_core():
    """The benchmark's shapes scaled down (many tiles shared out over the threads), checked
    by their block residuals."""
    for k in (2, 4):
        for shape in [(1, 100, 1001), (1001, 100, 1)]:
            for kind in ("block", "block_pivoted"):
                for transposed in (False, True):
                    operands, clean = problem(kind, shape, k, dtype=np.float32, seed=k)
                    got = native(*operands, kind=kind, transposed=transposed)
                    assert np.isfinite(got).all()
                    assert residual(clean, operands[-1], got, transposed) < 1e-5 * (4 * k + 1)


def test_under_jit():
    operands, clean = problem("block", (3, 7, 5), 2, 2, seed=23)
    f = jax.jit(lambda *ops: _native.block_pnq(*ops, kind="block", transposed=False,
                                               out_dtype=jnp.float64, cache=CACHE))
    check(np.asarray(f(*operands)), clean, operands[-1], False)


def test_bad_arguments():
    (lower, diag, upper, b), _ = problem("block", (3, 7, 5), 2, 2)
    options = dict(kind="block", transposed=False)
    with pytest.raises(ValueError, match="kind"):
        native(lower, diag, upper, b, kind="banded", transposed=False)
    with pytest.raises(ValueError, match="diag"):
        native(lower, diag[..., :1, :], upper, b, **options)
    with pytest.raises(ValueError, match="upper"):
        native(lower, diag, upper[:, :3], b, **options)
    with pytest.raises(ValueError, match="b of shape"):
        native(lower, diag, upper, b[..., 0], **options)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("shared", [False, True])
def test_public_solve_moves_no_data_around_the_kernel(axis, shared):
    # The blocks are viewed as (P, N, Q, k, k) by one reshape: the compiled program is the
    # kernel and bitcasts, with no transpose or copy of an operand (a view vmapped over the
    # block dimensions once cost two copies of each, 1.8x the kernel's time).
    systems = (5, 6, 7)
    n = systems[axis]
    block_shape = tuple(s if i == axis % 3 else 1 for i, s in enumerate(systems)) if shared else systems
    specs = [jax.ShapeDtypeStruct(block_shape + (2, 2), np.float32)] * 3 + [
        jax.ShapeDtypeStruct(systems + (2,), np.float32)]
    assert n > 1
    hlo = jax.jit(lambda *a: tridiax.solve_block_tridiagonal(*a, axis=axis)).trace(
        *specs).lower().compile().as_text()
    ops = re.findall(r"= \S+ (\w[\w-]*)\(", hlo)
    assert "custom-call" in ops, hlo
    assert not {"transpose", "copy", "fusion", "broadcast"} & set(ops), hlo
