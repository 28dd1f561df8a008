"""The Pallas (Triton) block-tridiagonal kernel, `_block/pallas_triton.py`.

On CPU the kernel runs in interpret mode: `TestPallasInterpret` runs the block kernel contract
(block_contract.py) on it, against dense solves of the assembled matrices and the XLA
formulation it follows step for step, with a ragged last tile (Q = 5 is not a multiple of the
default tile, 8 or more). Each case compiles a program of its own, unrolled over the k x k
entries, so the cases are fewer than the native kernel's: every k up to 4, N, m, dtype and kind
in both orientations, and k = 8 once (its program alone takes seconds to compile; the pivoted
kind is checked up to k = 4, its code does not depend on k). The plain tests check what only
this kernel has: tiles ragged along P and Q, argument checks, the default tiles, and GPU
readiness. Interpret mode pads ragged tiles and would hide a missing mask, so GPU readiness is
checked on the kernel lowered for CUDA (every Triton load and store of a ragged tile masked,
broadcast blocks read in place) and, in the last block, compiled for an H100 without a GPU
(`gpu_aot`): registers, spills and blocks per launch.

The interpret-mode programs are compiled by XLA:CPU at optimization level 0 and without its
fusion emitters: a third of the compile time of the default, which dominates these tests.
"""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from block_contract import BlockKernelContract, assert_close, check, compiled, condition, problem, xla_solve
from helpers import case_id, triton_kernels

from tridiax._block import pallas_triton as _pallas_block
from tridiax._block import xla as _xla_block
from tridiax._pallas.tiles import Tiles

# The interpret-mode kernel, compiled once per shapes, options and tiles.
pallas = compiled(_pallas_block.solve_pnq, interpret=True)


F32, F64, C64 = np.float32, np.float64, np.complex64


class TestPallasInterpret(BlockKernelContract):
    BITWISE_TWIN = False
    # Every k, N, m, dtype and kind, both orientations (k = 8 once).
    SYSTEMS = [
        (1, 33, 1, F64, "block", False),
        (1, 5, 2, C64, "block_pivoted", True),
        (1, 2, 1, F32, "block_hermitian", False),
        (2, 33, 2, F64, "block_pivoted", False),
        (2, 1, 1, C64, "block_hermitian", True),
        (2, 5, 1, F32, "block", True),
        (3, 33, 1, F64, "block_hermitian", False),
        (3, 2, 2, F64, "block_pivoted", True),
        (3, 5, 2, C64, "block", False),
        (4, 5, 2, F32, "block_pivoted", True),
        (4, 33, 1, F64, "block", True),
        (4, 2, 1, C64, "block_hermitian", False),
        (8, 5, 2, F32, "block_hermitian", True),
    ]
    TWIN_SYSTEMS = SYSTEMS
    TWIN_LAYOUTS = True
    LAYOUTS = [(2, 2, F64, (2, 7, 5), "block_pivoted", ("1NQ", "P11", "PN1")),
               (3, 2, F64, (2, 7, 5), "block_hermitian", ("111", "1NQ", "111"))]
    DTYPES = [(2, (2, 5, 5), np.float16)]
    PIVOTING = [(3, (2, 5, 5), False)]
    SINGULAR = [(2, (2, 5, 5), kind) for kind in ("block", "block_pivoted")]
    INDEFINITE = [(2, (2, 7, 5), dtype) for dtype in (F64, C64)]

    def solve(self, *operands, **options):
        return pallas(*operands, **options)

    def batch(self, k, n):
        return [(2, n, 5)]

    def twin_batch(self, k, n):
        return [(2, n, 5)]


@pytest.mark.parametrize("tiles", [(2, 4), (1, 1)], ids=case_id)
def test_ragged_tiles_along_p_and_q(tiles):
    # P = 3, Q = 6: ragged tiles along both axes (and 1x1 tiles, none ragged); k = 2 loads each
    # block at once, k = 3 (9 entries, not a power of two) in two pieces (8 + 1).
    tiles = Tiles.of_block(*tiles)
    for k, m, dtype, kind, transposed in [(2, 2, np.complex64, "block_pivoted", False),
                                          (3, 1, np.float64, "block", True)]:
        operands, clean = problem(kind, (3, 5, 6), k, m, dtype=dtype, seed=1)
        options = dict(kind=kind, transposed=transposed)
        got = pallas(*operands, tiles=tiles, **options)
        check(got, clean, operands[-1], transposed)
        assert_close(got, xla_solve(*operands, **options), dtype,
                     condition(clean, operands[-1].shape, transposed))


def test_empty_and_invalid():
    blocks = jnp.ones((2, 0, 3, 2, 2))
    options = dict(kind="block", transposed=False, out_dtype=np.float64)
    assert _pallas_block.solve_pnq(blocks, blocks, blocks, jnp.ones((2, 0, 3, 2, 1)),
                                   **options).shape == (2, 0, 3, 2, 1)
    blocks, b = jnp.ones((1, 5, 1, 2, 2)), jnp.ones((1, 5, 1, 2, 1))
    with pytest.raises(ValueError, match="kind"):
        _pallas_block.solve_pnq(blocks, blocks, blocks, b, **{**options, "kind": "lu"})
    with pytest.raises(ValueError, match="diag must be"):
        _pallas_block.solve_pnq(blocks, jnp.ones((1, 5, 1, 3, 3)), blocks, b, **options)


def test_default_tiles():
    # Two systems per thread (64-system tiles) for k = 1, one (32) for larger blocks.
    assert _pallas_block.default_tiles(4, 1000, k=1) == Tiles.of_block(1, 64)
    assert _pallas_block.default_tiles(4, 1000, k=2) == Tiles.of_block(1, 32)
    assert _pallas_block.default_tiles(100, 1, k=8) == Tiles.of_block(32, 1)


# --- GPU readiness on any machine: the kernel lowered for CUDA ------------------------------


def _triton_params(tiles):
    from tridiax._core.backend import _triton_params

    return _triton_params(tiles)


def _lower_cuda(k, kind, transposed, block_shape, b_shape, dtype, m=2):
    def f(lower, diag, upper, b):
        return _pallas_block.solve_pnq(lower, diag, upper, b, kind=kind, transposed=transposed,
                                       out_dtype=b.dtype, compiler_params=_triton_params)

    specs = [jax.ShapeDtypeStruct((*block_shape, k, k), dtype)] * 3 + [
        jax.ShapeDtypeStruct((*b_shape, k, m), dtype)]
    return jax.jit(f).trace(*specs).lower(lowering_platforms=("cuda",))


def _loads_stores(ir):
    return [line for line in ir.splitlines() if re.search(r"\btt\.(load|store)\b", line)]


def _unmasked(ir):
    """Loads/stores without a mask operand, except those of a (·, 1, 1) tile (an operand
    broadcast along P and Q: its only system, always in bounds)."""
    return [a for a in _loads_stores(ir)
            if re.search(r"tt\.load %\w+ :|tt\.store %\w+, %\w+ :", a)
            and not re.search(r"tensor<(\d+x)*1x1x!tt\.ptr", a)]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.complex64])
@pytest.mark.parametrize("k", [2, 3])
def test_cuda_lowering_masks_every_access_of_a_ragged_tile(k, dtype):
    # 1000 systems along Q: ragged tiles. The N block rows are walked by two loops (scf.for),
    # not unrolled, and each block row is loaded and stored whole (k = 2), or in two pieces of
    # 8 + 1 entries (k = 3): per part (2 for complex), 4 operands are loaded and E and y stored
    # in the forward loop, E and y loaded and x stored in the backward one (Pallas lowers a
    # masked store as a swap: a load, dead, and the store).
    for kind, transposed in (("block_pivoted", False), ("block_hermitian", True)):
        irs = [triton_kernels(_lower_cuda(k, kind, transposed, (3, n, 1000), (3, n, 1000),
                                          dtype))[0] for n in (7, 100)]
        for ir in irs:
            assert _loads_stores(ir) and ir.count("scf.for") == 2
            assert not _unmasked(ir), _unmasked(ir)
        pieces = {2: 1, 3: 2}[k]  # of k*k = 4 (9) and of k*m = 4 (6) entries
        parts = 2 if dtype == jnp.complex64 else 1
        assert len(_loads_stores(irs[0])) == len(_loads_stores(irs[1])) == 12 * pieces * parts


@pytest.mark.parametrize("block_shape", [(1, 100, 1), (1, 1, 1), (3, 1, 1000)])
def test_cuda_lowering_reads_broadcast_blocks_in_place(block_shape):
    lowered = _lower_cuda(2, "block_pivoted", False, block_shape, (3, 100, 1000), jnp.float32)
    assert "stablehlo.broadcast_in_dim" not in lowered.as_text()
    (ir,) = triton_kernels(lowered)
    assert not _unmasked(ir), _unmasked(ir)



@pytest.mark.parametrize("k, m, triton", [(8, 1, False), (8, 8, False), (2, 8, True), (6, 1, True)])
def test_cuda_default_backend_follows_the_block_size(k, m, triton):
    # Blocks larger than PALLAS_BLOCK_LIMIT run XLA's loop on a GPU, whatever m is (the choice
    # once read m, the last size of b, for k).
    import tridiax

    specs = [jax.ShapeDtypeStruct((50, 7, k, k), jnp.float32)] * 3 + [
        jax.ShapeDtypeStruct((50, 7, k, m), jnp.float32)]
    lowered = jax.jit(lambda *a: tridiax.solve_block_tridiagonal(*a, axis=0)).trace(
        *specs).lower(lowering_platforms=("cuda",))
    assert bool(triton_kernels(lowered)) == triton

# --- GPU readiness: deviceless compile for an H100 (tests/support/gpu_aot.py) -------------------------
# Skipped without the CUDA plugin (`python tests/support/gpu_aot.py --install`) unless
# TRIDIAX_REQUIRE_GPU_AOT is set, as in test_gpu_compile.py. Each case compiles the kernel alone
# on (P, N, Q) = (2, 1000, 132 * 32 + 100) with m = 2: a ragged last tile (every access masked)
# and at least one block per SM. k = 8 compiles in 10-30 s per kind (k = 2, 4: about 1 s) and
# spills a little in float32 (more in float64 and complex): the test compiles it unpivoted only;
# `python tests/block/test_block_pallas.py [dtype]` prints every k and kind.

SMS = 132
AOT_SHAPE = (2, 1000, SMS * 32 + 100)


def aot_entry(kind, transposed):
    """The kernel as the Triton backend calls it, for `gpu_aot` ("test_block_pallas:aot_entry(...)")."""
    def f(lower, diag, upper, b):
        return _pallas_block.solve_pnq(lower, diag, upper, b, kind=kind, transposed=transposed,
                                       out_dtype=b.dtype, compiler_params=_triton_params)

    return f


def aot_reports(dtype: str, cases):
    """gpu_aot's reports of the kernel for each (k, kind, transposed) of `cases`."""
    from gpu_aot import compile_reports

    requests = {(k, kind, t): (f"test_block_pallas:aot_entry({kind!r}, {t})",
                               [((*AOT_SHAPE, k, k), dtype)] * 3 + [((*AOT_SHAPE, k, 2), dtype)])
                for k, kind, t in cases}
    reports = compile_reports({f"k={k} {kind} transposed={t} {dtype}": request
                               for (k, kind, t), request in requests.items()},
                              x64=dtype in ("float64", "complex128"))
    return dict(zip(requests, reports.values(), strict=True))


def test_h100_compile():
    from gpu_aot import unavailable_reason

    if reason := unavailable_reason():
        if os.environ.get("TRIDIAX_REQUIRE_GPU_AOT", "") not in ("", "0"):
            pytest.fail(f"TRIDIAX_REQUIRE_GPU_AOT is set but deviceless GPU compilation cannot run: {reason}")
        pytest.skip(reason)
    cases = [(k, kind, False) for k in (2, 4) for kind in _xla_block.KINDS]
    reports = aot_reports("float32", [*cases, (4, "block_pivoted", True), (8, "block", False)])
    problems = []
    for (k, kind, t), r in reports.items():
        if r.error:
            problems.append(f"k={k} {kind} transposed={t}:\n{r.error}")
            continue
        kernels = [x for x in r.kernels if x.origin == "pallas_triton"]
        if len(kernels) != 1 or kernels[0].registers is None or kernels[0].arch != "sm_90a":
            problems.append(f"k={k} {kind}: expected one Pallas kernel for sm_90a: {r.kernels}")
            continue
        (kernel,) = kernels
        print(f"k={k} {kind} transposed={t}: {kernel}")
        if k <= 4 and (kernel.spill_store_bytes or kernel.spill_load_bytes):
            problems.append(f"k={k} {kind} transposed={t}: spills registers: {kernel}")
        if kernel.blocks < SMS:
            problems.append(f"k={k} {kind}: fewer than {SMS} blocks: {kernel}")
    assert not problems, "\n".join(problems)


def test_h100_compile_of_one_system():
    # One system (every operand one system wide along P and Q): Triton's compiler crashed on
    # this kernel (a segfault, so the whole process died on a GPU); the wrapper solves it
    # beside a zero right-hand side.
    from gpu_aot import compile_reports, unavailable_reason

    if reason := unavailable_reason():
        if os.environ.get("TRIDIAX_REQUIRE_GPU_AOT", "") not in ("", "0"):
            pytest.fail(f"TRIDIAX_REQUIRE_GPU_AOT is set but deviceless GPU compilation cannot run: {reason}")
        pytest.skip(reason)
    solve = "tridiax._block.api:lambda *a: solve(*a, pivoting=True, backend='pallas_triton')"
    cases = {f"k={k} m={m} {dtype}": (solve, [((6, k, k), dtype)] * 3 + [((6, k, m), dtype)])
             for k, m, dtype in ((2, 1, "float64"), (3, 1, "float32"), (2, 5, "float32"))}
    for name, r in compile_reports(cases, x64=True).items():
        assert r.error is None, f"{name}: {r.error}"
        assert [x.origin for x in r.kernels].count("pallas_triton") == 1, (name, r.kernels)


def test_one_system_matches_scipy():
    # The one-system path (test_h100_compile_of_one_system says why it exists) in interpret
    # mode: b solved beside a zero right-hand side, which must not leak into b's answer.
    for k, m, kind in ((2, 1, "block_pivoted"), (3, 2, "block"), (2, 1, "block_hermitian")):
        (lower, diag, upper, b), clean = problem(kind, (1, 9, 1), k, m, seed=k + m)
        x = pallas(lower, diag, upper, b, kind=kind, transposed=False)
        assert x.shape == b.shape
        check(x, clean, b, False)


if __name__ == "__main__":  # every k and kind: python tests/block/test_block_pallas.py [dtype [k,k,...]]
    import sys

    dtype = sys.argv[1] if len(sys.argv) > 1 else "float32"
    ks = [int(k) for k in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 2, 4, 8]
    for (k, kind, t), r in aot_reports(dtype, [(k, kind, False) for k in ks
                                               for kind in _xla_block.KINDS]).items():
        pallas = [str(x) for x in r.kernels if x.origin == "pallas_triton"]
        others = len(r.kernels) - len(pallas)  # the layout copies around the kernel
        print(f"k={k} {kind} {dtype} ({r.compile_seconds:.0f} s): "
              + (r.error or "; ".join(pallas) + f"; and {others} XLA kernels"))
