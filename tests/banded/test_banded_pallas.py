"""The Pallas (Triton) banded kernel, `_banded/pallas_triton.py`.

On CPU the kernel runs in interpret mode: `TestPallasInterpret` runs the banded kernel contract
(banded_contract.py) on it, against scipy.linalg.solve_banded and the XLA formulation it follows
step for step, with a ragged last tile (Q = 70 is not a multiple of any tile) and bandwidths up
to (3, 3): each case compiles a program of its own, so the cases are fewer than the native
kernel's. The plain tests check what only this kernel has: tiles ragged along P and Q, the
default tiles, and GPU readiness. Interpret mode pads ragged tiles and would hide a missing
mask, so GPU readiness is checked on the kernel lowered for CUDA (every Triton load and store
of a ragged tile masked, broadcast bands read in place) and, in the last block, compiled for an
H100 without a GPU (`gpu_aot`): no register spills, and enough blocks for the device.

The interpret-mode programs are compiled by XLA:CPU at optimization level 0 (half the compile
time of the default, which dominates these tests; the results are the same to rounding).
"""

from __future__ import annotations

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from banded_contract import (
    KINDS,
    SHORT,
    BandedKernelContract,
    assert_close,
    case_id,
    check,
    compiled,
    condition,
    problem,
    xla_solve,
)
from helpers import triton_kernels

from tridiax._banded import pallas_triton as _pallas_banded
from tridiax._pallas.tiles import Tiles

BANDS = [(0, 0), (1, 1), (2, 2), (3, 1), (0, 3), (2, 0)]


# The interpret-mode kernel, compiled once per shapes, options and tiles (`tiles=`).
pallas = compiled(_pallas_banded.solve_pnq, interpret=True)


class TestPallasInterpret(BandedKernelContract):
    # Every band, kind and orientation at N = 33; shorter systems one kind each.
    SYSTEMS = ([(l, u, kind, 33, t) for l, u in BANDS for kind in KINDS for t in (False, True)]
               + [(l, u, kind, n, t) for l, u in BANDS for n, kind, t in SHORT])
    TWIN_SYSTEMS = SYSTEMS
    LAYOUTS = [(2, 2, "banded_pivoted", True, (2, 33, 70), np.float64),
               (1, 1, "banded_hermitian", True, (2, 33, 70), np.complex64)]
    BROADCASTS = ("1NQ", "PN1", "111", "P1Q")
    TWIN_LAYOUTS = LAYOUTS
    TWIN_BROADCASTS = BROADCASTS
    DTYPES = ([(l, u, kind, (l + u) % 2 == 1, (2, 33, 70), dtype) for l, u in BANDS
               for dtype in (np.float32, np.complex64) for kind in KINDS]
              + [(l, u, kind, t, (2, n, 70), np.complex128) for l, u, n, t in [(2, 2, 33, True),
                                                                                (3, 1, 7, False)]
                 for kind in KINDS])
    TWIN_DTYPES = DTYPES
    INDEFINITE = [(l, False, (2, 33, 70), dtype) for l in (0, 1, 2)
                  for dtype in (np.float64, np.complex64)]

    def solve(self, ab, b, **options):
        return pallas(ab, b, **options)

    def batch(self, n):
        return [(2, n, 70)]

    def twin_batch(self, n):
        return [(2, n, 70)]


@pytest.mark.parametrize("tiles", [(2, 16), (4, 8), (1, 1)], ids=case_id)
def test_ragged_tiles_along_p_and_q(tiles):
    # P = 3, Q = 70: ragged tiles along both axes (and 1x1 tiles, none ragged).
    tiles = Tiles.of_block(*tiles)
    for l, u, kind, transposed, dtype in [(3, 1, "banded_pivoted", True, np.float64),
                                          (1, 2, "banded", False, np.complex64)]:
        ab, b, clean = problem(l, u, kind, (3, 7, 70), dtype=dtype, seed=1)
        options = dict(l=l, u=u, kind=kind, transposed=transposed)
        got = pallas(ab, b, tiles=tiles, **options)
        check(got, clean, b, l, u, transposed)
        assert_close(got, xla_solve(ab, b, **options), dtype, condition(clean, l, u, b.shape, transposed))


def test_empty_and_invalid():
    ab, b = np.ones((3, 2, 0, 4)), np.ones((2, 0, 4))
    options = dict(l=1, u=1, kind="banded", transposed=False, out_dtype=np.float64)
    assert _pallas_banded.solve_pnq(jnp.asarray(ab), jnp.asarray(b), **options).shape == (2, 0, 4)
    with pytest.raises(ValueError, match="kind"):
        _pallas_banded.solve_pnq(jnp.ones((3, 1, 5, 1)), jnp.ones((1, 5, 1)), **{**options, "kind": "lu"})
    with pytest.raises(ValueError, match="ab must be"):
        _pallas_banded.solve_pnq(jnp.ones((2, 1, 5, 1)), jnp.ones((1, 5, 1)), **options)


def test_default_tiles():
    # Two systems per thread (64-system tiles) for small windows, one (32) for larger ones.
    assert _pallas_banded.default_tiles(4, 1000, l=1, u=1, kind="banded", transposed=False,
                                        dtype=np.float32) == Tiles.of_block(1, 64)
    assert _pallas_banded.default_tiles(4, 1000, l=2, u=2, kind="banded", transposed=False,
                                        dtype=np.float32) == Tiles.of_block(1, 32)
    assert _pallas_banded.default_tiles(100, 1, l=1, u=1, kind="banded_pivoted", transposed=True,
                                        dtype=np.complex128) == Tiles.of_block(32, 1)


# --- GPU readiness on any machine: the kernel lowered for CUDA ------------------------------------


def _triton_params(tiles):
    from tridiax._core.backend import _triton_params

    return _triton_params(tiles)


def _lower_cuda(l, u, kind, transposed, ab_shape, b_shape, dtype):
    def f(ab, b):
        return _pallas_banded.solve_pnq(ab, b, l=l, u=u, kind=kind, transposed=transposed,
                                        out_dtype=b.dtype, compiler_params=_triton_params)

    specs = (jax.ShapeDtypeStruct((l + u + 1, *ab_shape), dtype), jax.ShapeDtypeStruct(b_shape, dtype))
    return jax.jit(f).trace(*specs).lower(lowering_platforms=("cuda",))


def _loads_stores(ir):
    return [line for line in ir.splitlines() if re.search(r"\btt\.(load|store)\b", line)]


def _unmasked(ir):
    """Loads/stores without a mask operand, except 1x1 ones (a broadcast operand's only value,
    always in bounds), as in test_gpu_lowering.py."""
    return [a for a in _loads_stores(ir)
            if re.search(r"tt\.load %\w+ :|tt\.store %\w+, %\w+ :", a) and "tensor<1x1x" not in a]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.complex64])
@pytest.mark.parametrize("l,u", BANDS)
def test_cuda_lowering_masks_every_access_of_a_ragged_tile(l, u, dtype):
    # 1000 systems along Q: ragged tiles. The N rows are walked by two loops (scf.for), not
    # unrolled: the kernel's loads and stores are as many for N = 7 as for N = 100.
    for kind, transposed in (("banded_pivoted", False), ("banded_hermitian", True)):
        irs = [triton_kernels(_lower_cuda(l, u, kind, transposed, (3, n, 1000), (3, n, 1000), dtype))[0]
               for n in (7, 100)]
        for ir in irs:
            assert _loads_stores(ir) and ir.count("scf.for") == 2
            assert not _unmasked(ir), _unmasked(ir)
        assert len(_loads_stores(irs[0])) == len(_loads_stores(irs[1]))


@pytest.mark.parametrize("ab_shape", [(1, 100, 1), (1, 1, 1), (3, 1, 1000), (1, 100, 1000)])
def test_cuda_lowering_reads_broadcast_bands_in_place(ab_shape):
    lowered = _lower_cuda(2, 1, "banded_pivoted", False, ab_shape, (3, 100, 1000), jnp.float32)
    text = lowered.as_text()
    assert "stablehlo.broadcast_in_dim" not in text and "stablehlo.transpose" not in text
    (ir,) = triton_kernels(lowered)
    assert not _unmasked(ir), _unmasked(ir)


# --- GPU readiness: deviceless compile for an H100 (tests/support/gpu_aot.py) -----------------------------
# Skipped without the CUDA plugin (`python tests/support/gpu_aot.py --install`) unless TRIDIAX_REQUIRE_GPU_AOT
# is set, as in test_gpu_compile.py. Each case compiles the kernel alone on (P, N, Q) = (2, 1000,
# 132 * 64 + 100): a ragged last tile (every access masked) and at least one block per SM.

SMS = 132
AOT_SHAPE = (2, 1000, SMS * 64 + 100)


def aot_entry(l, u, kind, transposed):
    """The kernel as the Triton backend calls it, for `gpu_aot` ("test_banded_pallas:aot_entry(...)")."""
    def f(ab, b):
        return _pallas_banded.solve_pnq(ab, b, l=l, u=u, kind=kind, transposed=transposed,
                                        out_dtype=b.dtype, compiler_params=_triton_params)

    return f


@functools.cache
def _aot_reports(dtype: str):
    from gpu_aot import compile_reports

    cases = {f"l={l} u={u} {kind} transposed={t} {dtype}":
             (f"test_banded_pallas:aot_entry({l}, {u}, {kind!r}, {t})",
              [((l + u + 1, *AOT_SHAPE), dtype), (AOT_SHAPE, dtype)])
             for l, u in BANDS for kind in KINDS for t in (False, True)}
    return compile_reports(cases, x64=dtype in ("float64", "complex128"))


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
def test_h100_compile_without_spills(dtype):
    from gpu_aot import unavailable_reason

    if reason := unavailable_reason():
        if os.environ.get("TRIDIAX_REQUIRE_GPU_AOT", "") not in ("", "0"):
            pytest.fail(f"TRIDIAX_REQUIRE_GPU_AOT is set but deviceless GPU compilation cannot run: {reason}")
        pytest.skip(reason)
    reports = _aot_reports(dtype)
    errors = {case: r.error for case, r in reports.items() if r.error}
    assert not errors, "\n\n".join(f"{case}:\n{e}" for case, e in errors.items())
    problems = []
    for case, r in reports.items():
        pallas_kernels = [k for k in r.kernels if k.origin == "pallas_triton"]
        if len(pallas_kernels) != 1:
            problems.append(f"{case}: expected one Pallas kernel, got {[str(k) for k in r.kernels]}")
        for k in pallas_kernels:
            if k.registers is None or k.arch != "sm_90a":
                problems.append(f"{case}: ptxas did not report the kernel for sm_90a: {k}")
            if k.spill_store_bytes or k.spill_load_bytes:
                problems.append(f"{case}: spills registers: {k}")
            if k.blocks < SMS:
                problems.append(f"{case}: fewer than {SMS} blocks: {k}")
    assert not problems, "\n".join(problems)


if __name__ == "__main__":  # print every kernel: python tests/banded/test_banded_pallas.py [dtype]
    import sys

    for case, r in _aot_reports(sys.argv[1] if len(sys.argv) > 1 else "float32").items():
        print(f"{case}: " + (r.error or "; ".join(str(k) for k in r.kernels)))
