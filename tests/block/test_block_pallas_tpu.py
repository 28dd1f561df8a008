"""The Pallas Mosaic TPU block-tridiagonal kernel, `_block/pallas_tpu.py`, in TPU interpret
mode (TPU semantics on CPU, VMEM starting as NaNs).

`TestPallasTpuInterpret` runs the block kernel contract (block_contract.py) on it in float32,
half precision and complex64 (as float32 real and imaginary parts), against dense solves of the
assembled matrices and the XLA formulation it follows step for step: every k up to 4 and k = 5 and 8, every kind in
both orientations, N = 1, 2, 3 and odd N, every broadcast of the blocks, batch-first systems
(Q = 1, taken along lanes) and groups of systems that overhang the batch. The kernel takes
each operand in one of three arrangements (`Arrangement`: entries inside rows, their columns
first, or rows inside entries), chosen here as on a TPU by the block size: k = 2 and 4 with
m = 1 take the first, k = 2 with m = 3 right-hand sides the second (b and x), k = 3 and 5 the
third, which reads bfloat16 through float32 stages. The plain tests check what only this kernel
has: systems of several chunks, its VMEM plan, the streamed kernels for systems too long for
it and XLA's loop under a budget too small even for those. The
kernel compiled for a TPU without one: tests/tpu/test_tpu_compile.py.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from block_contract import KINDS, BlockKernelContract, assert_close, check, compiled, condition, problem, xla_solve

from tridiax._block import pallas_tpu as _tpu_block
from tridiax._pallas import tpu as _tpu

pytestmark = pytest.mark.skipif(not _tpu.available(), reason="this JAX has no Pallas TPU backend")

F32, BF16, F16, C64 = np.float32, jnp.bfloat16, np.float16, np.complex64

# The kernel in TPU interpret mode.
tpu_solve = compiled(_tpu_block.solve_pnq, interpret=_tpu.interpret_params())


class TestPallasTpuInterpret(BlockKernelContract):
    DTYPE = F32
    COMPLEX = C64
    BITWISE_TWIN = False
    # Every k up to 5 and 8, N and m, each kind in both orientations.
    SYSTEMS = [
        (1, 33, 1, F32, "block", False),
        (2, 33, 1, F32, "block_pivoted", True),
        (2, 1, 3, F32, "block_hermitian", False),
        (2, 2, 1, F32, "block", True),
        (3, 33, 2, F32, "block_hermitian", True),
        (3, 3, 1, F32, "block_pivoted", False),
        (4, 5, 1, F32, "block_pivoted", True),
        (4, 2, 2, F32, "block", False),
        (5, 7, 1, F32, "block_pivoted", False),
        (8, 5, 2, F32, "block_hermitian", True),
    ]
    TWIN_SYSTEMS = [(2, 9, 1, F32, kind, t) for kind, t in zip(KINDS, (False, True, False), strict=True)] + [
        (3, 9, 2, F32, "block_pivoted", True)]
    TWIN_LAYOUTS = True
    # Every broadcast: a matrix shared by every system (SMEM scalars), blocks constant along N
    # (one tile per entry), blocks shared along P or Q; batch-first systems (Q = 1).
    LAYOUTS = [(2, 1, F32, (2, 7, 130), "block_pivoted", ("1NQ", "P1Q", "PN1")),
               (3, 2, F32, (3, 5, 9), "block", ("111", "111", "111")),
               (2, 3, F32, (131, 6, 1), "block_hermitian", ("P11", "PNQ", "P11")),
               (4, 1, F32, (5, 3, 1), "block", ("1N1", "PN1", "P1Q"))]
    DTYPES = [(2, (2, 7, 19), BF16), (3, (21, 7, 1), BF16), (2, (3, 5, 5), F16), (2, (3, 5, 5), C64),
              (3, (21, 7, 1), C64)]
    PIVOTING = [(2, (2, 17, 19), True), (3, (19, 17, 1), False)]
    SINGULAR = [(2, (2, 9, 3), "block_pivoted"), (3, (2, 9, 3), "block")]
    INDEFINITE = [(2, (3, 9, 19), F32), (5, (3, 9, 1), F32), (2, (3, 9, 5), C64)]
    ZERO_SIZES = [((0, 7, 5), 2, 1), ((3, 7, 0), 2, 1)]


    def solve(self, *operands, **options):
        return tpu_solve(*operands, **options)

    def batch(self, k, n):
        return [(2, n, 5), (7, n, 1)]

    def twin_batch(self, k, n):
        return [(2, n, 19)]


@pytest.mark.parametrize("k, m, dtype, transposed", [(2, 1, BF16, True), (3, 2, F32, False)])
def test_several_chunks(k, m, dtype, transposed):
    """Systems of 257 rows (chunks, the last one a single row) in "lanes" row tiles that
    overhang the batch (130 systems): E and y carried across the chunk boundary, and (k = 3) the
    float32 stages refilled at each chunk."""
    shape = (1, 257, 130)
    operands, clean = problem("block_pivoted", shape, k, m, dtype=dtype, seed=k)
    g = _tpu_block._setup(*(jnp.asarray(x) for x in operands), dtype, kind="block_pivoted",
                          budget=_tpu.VMEM_BUDGET)[0]
    assert g.chunks > 1 and (257 - 1) % g.chunk == 0 and g.layout == "lanes"
    options = dict(kind="block_pivoted", transposed=transposed)
    got = tpu_solve(*operands, **options)
    check(got, clean, operands[-1], transposed)
    assert_close(got, xla_solve(*operands, **options), dtype,
                 condition(clean, operands[-1].shape, transposed))


def test_arrangements_follow_the_block_size():
    """Without a TPU's layouts: entries inside rows where they fill whole tiles (power-of-two
    sizes), rows inside entries otherwise; b's columns first when only its rows are a power of
    two; batch-first systems swapped to lanes."""
    def roles(shape, r, c, swapped=False):
        return _tpu_block.arrangement(shape, np.float32, r, c, swapped=swapped).roles

    assert roles((1, 9, 300, 2, 2), 2, 2) == ("n", "r", "c")
    assert roles((1, 9, 300, 4, 1), 4, 1) == ("n", "r")
    assert roles((1, 9, 300, 2, 3), 2, 3) == ("n", "c", "r")
    assert roles((1, 9, 300, 3, 3), 3, 3) == ("r", "c", "n")
    assert roles((1, 9, 300, 3, 1), 3, 1) == ("r", "n")
    x = jnp.arange(2 * 3 * 4 * 5 * 6.0).reshape(2, 3, 4, 5, 6)
    for order in _tpu_block.ROLES:
        how = _tpu_block.Arrangement(order, 5, 6)
        np.testing.assert_array_equal(how.unview(how.view(x), 3), x)


def test_vmem_plan_narrows_the_row_tile_and_falls_back_for_long_systems(monkeypatch):
    """E and y of a whole system stay in VMEM: longer systems get row tiles of fewer sublanes;
    systems too long for any stream E and y through HBM (next test), and under a budget too
    small even for their chunks XLA's loop runs; both agree with dense solves."""
    assert _tpu_block.fits(1, 300, 1024, np.float32, k=2)
    monkeypatch.setattr(_tpu, "VMEM_BUDGET", 6 << 20)
    shape = (1, 40, 1024)
    operands, clean = problem("block", shape, 2, dtype=F32, seed=4)
    g = _tpu_block._setup(*(jnp.asarray(x) for x in operands), F32, kind="block",
                          budget=_tpu.VMEM_BUDGET)[0]
    assert g is not None and g.s < 8
    assert not _tpu_block.fits(1, 3000, 1024, np.float32, k=2)
    check(tpu_solve(*operands, kind="block", transposed=False), clean, operands[-1], False)
    monkeypatch.setattr(_tpu, "VMEM_BUDGET", 1 << 16)
    operands, clean = problem("block", (1, 40, 3), 2, dtype=F32, seed=5)
    assert _tpu_block._setup(*(jnp.asarray(x) for x in operands), F32, kind="block",
                             budget=_tpu.VMEM_BUDGET, streamed=True)[0] is None
    check(tpu_solve(*operands, kind="block", transposed=True), clean, operands[-1], True)


# (kind, k, m, (P, N, Q), dtype, transposed): several chunks of 32 rows, the last of one row
# (193) or two; batch-first systems (Q = 1, swapped to lanes) with x staged (bfloat16, rows
# minor); complex64 parts; 8 x 8 blocks.
STREAMED = [("block_pivoted", 2, 1, (1, 193, 3), F32, True),
            ("block", 2, 1, (1, 194, 3), F32, False),
            ("block_hermitian", 3, 2, (4, 193, 1), BF16, True),
            ("block_pivoted", 2, 1, (1, 193, 5), C64, False),
            ("block_pivoted", 8, 1, (1, 65, 3), F32, True)]


@pytest.mark.parametrize("kind, k, m, shape, dtype, transposed", STREAMED)
def test_systems_too_long_for_vmem_stream_e_and_y(kind, k, m, shape, dtype, transposed, monkeypatch):
    """Under a VMEM budget too small for the whole system's E and y, two kernels run (the
    forward sweep writing E and y to HBM chunk by chunk, the back substitution reading them
    last chunk first), not XLA's loop: against dense solves and the XLA formulation."""
    operands, clean = problem(kind, shape, k, m, dtype=dtype, seed=k + m)
    arrays = [jnp.asarray(x) for x in operands]
    budget = next(b for b in (int(1.1 ** e) for e in range(200, 130, -1))
                  if _tpu_block._setup(*arrays, dtype, kind=kind, budget=b)[0] is None)
    g = _tpu_block._setup(*arrays, dtype, kind=kind, budget=budget, streamed=True)[0]
    assert g is not None and g.chunks > 2
    want = xla_solve(*operands, kind=kind, transposed=transposed)
    monkeypatch.setattr(_tpu, "VMEM_BUDGET", budget)

    def refuse(*args, **kwargs):
        raise AssertionError("XLA's loop ran")

    monkeypatch.setattr(_tpu_block._xla, "solve_pnq", refuse)
    got = np.asarray(_tpu_block.solve_pnq(*arrays, kind=kind, transposed=transposed, out_dtype=dtype,
                                          interpret=_tpu.interpret_params()))
    check(got, clean, operands[-1], transposed)
    assert_close(got, want, dtype, condition(clean, operands[-1].shape, transposed))
