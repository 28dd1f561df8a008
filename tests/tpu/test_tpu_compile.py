"""Every public entry point compiles for a TPU v5e into Mosaic TPU kernels: no XLA loop over
the rows, each kernel's scoped VMEM (as the compiler allotted it, pipeline buffers included)
within the budget the kernels plan for and the limit they ask for, and the bytes the program
moves through HBM against the floor: one read of every input, one write of the output; for a
gradient, that and the adjoint's; for a system too long for VMEM, that and its work rows
written and read once (`_floor`).

The HBM bytes are read from the compiled program (`tpu_aot`, `hbm_bytes`): every top-level
instruction's operands and results in HBM, not those XLA keeps in VMEM between kernels. XLA's
cost analysis counts those too, and does not count its own custom calls (the splitting of
complex64 arrays into their parts): both figures are printed, the HBM one is held.
Compiled without a TPU by `tpu_aot` (libtpu describes a v5e slice); the other generations
libtpu knows compile the main entry points too (outside the fast tier).

Without libtpu in tpu_aot's directory (`python tests/support/tpu_aot.py --install`) these tests
skip, unless TRIDIAX_REQUIRE_TPU_AOT is set (as CI does), when they fail. `pytest -s` prints
what each case compiled to.
"""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tpu_aot import TOPOLOGIES, bytes_accessed, compile_reports, padded_bytes, read_program, unavailable_reason

import tridiax
from tridiax._pallas import tpu as _tpu

V5E = "v5e:2x2"
# Cost analysis counts arrays as XLA lays them out in HBM, tiles padded: within this factor
# of the logical floor (a ragged (1030, 999) array pads to (1032, 1024), 2.7% more).
FLOOR_FACTOR = 1.2


# A compiled program as libtpu prints it (abridged): a relayout of the initial state (a
# fusion), the kernel, and a loop around an XLA kernel.
PROGRAM = """\
HloModule jit_f, is_scheduled=true

%body (p: (s32[], f32[8,128])) -> (s32[], f32[8,128]) {
  %c = f32[8,128]{1,0:T(8,128)} custom-call(%x), custom_call_target="tpu_custom_call", backend_config={}
}

ENTRY %main.2 (a.1: bf16[1,300,1200], h0.1: bf16[1,1,1200]) -> bf16[1,300,1200] {
  %h0.1 = bf16[1,1,1200]{2,1,0:T(2,128)(2,1)} parameter(1), metadata={op_name="h0"}
  %a.1 = bf16[1,300,1200]{2,1,0:T(8,128)(2,1)} parameter(0), metadata={op_name="a"}
  %bitcast.3 = bf16[1,1200]{1,0:T(2,128)(2,1)} bitcast(%h0.1)
  %pad_convert_fusion = f32[1,2048]{1,0:T(1,128)S(1)} fusion(%bitcast.3), kind=kLoop, calls=%fused_computation
  %w = (s32[], f32[8,128]{1,0}) while(%t), condition=%cond, body=%body
  ROOT %tridiax_recurrence_tpu.1 = bf16[1,300,1200]{2,1,0:T(8,128)(2,1)} custom-call(%a.1, %pad_convert_fusion), \
custom_call_target="tpu_custom_call", backend_config={"flag_configs":[],"scoped_memory_configs":[{"memory_space":"1",\
"offset":"0","size":"16777216"}],"used_scoped_memory_configs":[{"memory_space":"1","offset":"0","size":"6295552"}]}
}
"""


# An operand prefetched into VMEM (S(1)) by an asynchronous copy and, half of it, by an
# asynchronous slice; a kernel that leaves its result there, and a fusion writing the
# program's result to HBM.
VMEM_PROGRAM = """\
ENTRY %main (p: f32[8,128]) -> f32[8,128] {
  %p = f32[8,128]{1,0:T(8,128)} parameter(0)
  %copy-start = (f32[8,128]{1,0:T(8,128)S(1)}, f32[8,128]{1,0:T(8,128)}, u32[]{:S(2)}) copy-start(%p)
  %copy-done = f32[8,128]{1,0:T(8,128)S(1)} copy-done(%copy-start)
  %slice-start = ((f32[8,128]{1,0:T(8,128)}), f32[4,128]{1,0:T(4,128)S(1)}, u32[]{:S(2)}) slice-start(%p)
  %slice-done = f32[4,128]{1,0:T(4,128)S(1)} slice-done(%slice-start)
  %k = f32[8,128]{1,0:T(8,128)S(1)} custom-call(%copy-done, %slice-done), custom_call_target="tpu_custom_call"
  ROOT %f = f32[8,128]{1,0:T(8,128)} fusion(%k), kind=kLoop, calls=%fused
}
"""


# A gradient's stack of bands built in place: the fusion writes one band of the (4, 8, 128)
# buffer it takes, from an (8, 128) operand.
IN_PLACE_PROGRAM = """\
%fused (param_0.1: f32[4,8,128], param_1.2: f32[8,128]) -> f32[4,8,128] {
  %param_0.1 = f32[4,8,128]{2,1,0:T(8,128)} parameter(0)
  %param_1.2 = f32[8,128]{1,0:T(8,128)} parameter(1)
  %bitcast.1 = f32[1,8,128]{2,1,0:T(8,128)} bitcast(%param_1.2)
  %constant.1 = s32[] constant(1)
  %constant.0 = s32[] constant(0)
  ROOT %dynamic-update-slice.1 = f32[4,8,128]{2,1,0:T(8,128)} dynamic-update-slice(%param_0.1, %bitcast.1, \
%constant.1, %constant.0, %constant.0)
}

ENTRY %main (stack: f32[4,8,128], band: f32[8,128]) -> f32[4,8,128] {
  %stack = f32[4,8,128]{2,1,0:T(8,128)} parameter(0)
  %band = f32[8,128]{1,0:T(8,128)} parameter(1)
  ROOT %update_fusion = f32[4,8,128]{2,1,0:T(8,128)} fusion(%stack, %band), kind=kLoop, calls=%fused
}
"""


def test_harness_reads_compiled_programs():
    assert padded_bytes("f32[4,1000,2048]{2,1,0:T(8,128)}") == 4 * 1000 * 2048 * 4
    assert padded_bytes("f32[1030,999]{0,1:T(8,128)}") == 1152 * 1000 * 4  # column-major
    assert padded_bytes("bf16[2,37,1030]{2,0,1:T(2,128)(2,1)}") == 37 * 2 * 1152 * 2
    assert padded_bytes("(f32[8,128]{1,0:T(8,128)}, s32[])") == 4096 + 4
    program = read_program(PROGRAM)
    assert program["whiles"] == 1 and program["others"] == ["fusion", "while"]
    kernel, nested = program["kernels"]
    assert (kernel["vmem_bytes"], kernel["vmem_limit_bytes"]) == (6295552, 16 << 20)
    assert kernel["operand_bytes"] == 304 * 1280 * 2 + 2048 * 4
    assert kernel["result_bytes"] == 304 * 1280 * 2
    assert nested["name"] == "nested"
    # HBM: the fusion's read of the state (bf16 tiles of (2, 128)), the while's tuple, the
    # kernel's read of `a` and its result; not the fusion's result nor the kernel's read of it
    # (both in VMEM).
    assert program["hbm_bytes"] == 2 * 1280 * 2 + (4 + 4096) + 2 * 304 * 1280 * 2
    assert padded_bytes("f32[8,128]{1,0:T(8,128)S(1)}", hbm_only=True) == 0
    # the copy reads p from HBM, the slice half of it; the kernel works in VMEM; the fusion
    # writes the result
    assert read_program(VMEM_PROGRAM)["hbm_bytes"] == 2 * 8 * 128 * 4 + 4 * 128 * 4
    # the band read and written into the stack, which is neither read nor written whole
    assert read_program(IN_PLACE_PROGRAM)["hbm_bytes"] == 2 * 8 * 128 * 4
    assert bytes_accessed({"bytes accessed0{}": 3.0, "bytes accessedout{}": 4.0, "bytes accessed": 1.0,
                           "utilization0{}": 9.0}) == 7.0


def _require_harness():
    if reason := unavailable_reason():
        if os.environ.get("TRIDIAX_REQUIRE_TPU_AOT", "") not in ("", "0"):
            pytest.fail(f"TRIDIAX_REQUIRE_TPU_AOT is set but deviceless TPU compilation cannot run: {reason}")
        pytest.skip(reason)


def _grad(f, argnums):
    return jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) ** 2), argnums=argnums)


def _solve(axis, **kinds):
    return lambda *a: tridiax.solve_tridiagonal(*a, axis=axis, **kinds)


def _block(axis):
    return lambda *a: tridiax.solve_block_tridiagonal(*a, axis=axis)


def _block_specs(shape, k, dtype):
    """Blocks and a vector right-hand side for systems of `shape`."""
    return [((*shape, k, k), dtype)] * 3 + [((*shape, k), dtype)]


def _factors(factorization):
    return factorization.lower_factor, factorization.inverse_pivots, factorization.upper_factor


def _banded_factors(factorization):
    return factorization.u_rows, factorization.multipliers, factorization.pivots


def _block_factors(factorization):
    return factorization.lu, factorization.pivots, factorization.e


def _block_factorization(axis, lower, lu, pivots, e, b):
    """A block factorization from its factors, the operator's diagonal and upper blocks stood
    in for by lu and e (of their shape: only a gradient reads them)."""
    return tridiax.BlockTridiagonalFactorization(tridiax.BlockTridiagonal(lower, lu, e, axis=axis),
                                                 _factors=(lu, pivots, e))


def _block_factor_specs(shape, k):
    """lower, lu, pivots, e and a vector right-hand side of systems of `shape`."""
    blocks = ((*shape, k, k), "float32")
    return [blocks, blocks, ((*shape, k, 1), "int32"), blocks, ((*shape, k), "float32")]


def _banded_factorization(ab, multipliers, pivots):
    """The factorization of Banded(ab, (2, 2)) along axis 0 with pivoting, from its factors:
    U's five kept rows are ab's shape, so ab stands in for them."""
    return tridiax.BandedFactorization(tridiax.Banded(ab, (2, 2), axis=0),
                                       _factors=(ab, multipliers, pivots))


def _banded_factor_specs(shape, rhs=None):
    """The bands (and U's kept rows), multipliers, pivots and right-hand side of systems of
    `shape`, (2, 2) bands."""
    return [((5, *shape), "float32"), ((2, *shape), "float32"), (shape, "int32"),
            (rhs or shape, "float32")]


# name: (function, argument specs, kernels it must compile to, held to the floor (within
# FLOOR_FACTOR): "program", its program's HBM bytes (a gradient's ("grad-") floor is the
# adjoint's too, `_floor`); ("streamed", w), its program's bytes, the floor counting w float32
# work arrays written and read again (`_floor`); "kernels", each kernel's operands and result;
# None, neither)
ENTRY_POINTS = {
    # batch-first, stored row-major: transposed on chip by "transposed" row tiles
    "solve-batch-first-f32": (_solve(-1), [((4096, 1024), "float32")] * 4, 1, "program"),
    # batch-first systems of 1000 rows, which the TPU stores column-major (1000 rows of 4096
    # values pad least): read by lanes, with no transpose anywhere
    "solve-batch-first-column-major-f32": (_solve(-1), [((4096, 1000), "float32")] * 4, 1, "program"),
    # ragged batch-first systems stored row-major (bf16 tiles of 16 rows): transposed on chip,
    # blocks overhanging both dimensions
    "solve-batch-first-ragged-bf16": (_solve(-1), [((1030, 999), "bfloat16")] * 4, 1, "program"),
    "solve-columns-f32": (_solve(0), [((1000, 4096), "float32")] * 4, 1, "program"),
    "solve-middle-axis-bf16": (_solve(1), [((8, 1000, 512), "bfloat16")] * 4, 1, "program"),
    "solve-one-matrix-f32": (_solve(0), [((1000, 1), "float32")] * 3 + [((1000, 4096), "float32")], 1, "program"),
    # long systems: row tiles of fewer sublanes keep their eliminated rows in VMEM
    "solve-long-f32": (_solve(0), [((20000, 1024), "float32")] * 4, 1, "program"),
    "grad-solve-f32": (_grad(_solve(-1), (0, 1, 2, 3)), [((4096, 1024), "float32")] * 4, 2, "program"),
    # the other kinds: one kernel each, the periodic corners and the split read in the kernel
    "solve-pivoted-f32": (_solve(0, pivoting=True), [((1000, 4096), "float32")] * 4, 1, "program"),
    "solve-pivoted-batch-first-ragged-bf16": (_solve(-1, pivoting=True),
                                              [((1030, 999), "bfloat16")] * 4, 1, "program"),
    "solve-periodic-middle-axis-bf16": (lambda *a: tridiax.solve_periodic_tridiagonal(*a, axis=1),
                                        [((8, 1000, 512), "bfloat16")] * 4, 1, "program"),
    "solve-periodic-pivoted-f32": (lambda *a: tridiax.solve_periodic_tridiagonal(*a, axis=0, pivoting=True),
                                   [((1000, 4096), "float32")] * 4, 1, "program"),
    "grad-periodic-f32": (_grad(lambda *a: tridiax.solve_periodic_tridiagonal(*a, axis=-1), (0, 1, 2, 3)),
                          [((4096, 1024), "float32")] * 4, 2, "program"),
    "factor-f32": (lambda *a: _factors(tridiax.TDMA().factor(tridiax.Tridiagonal(*a, axis=0))),
                   [((1000, 4096), "float32")] * 3, 1, "program"),
    # factoring and solving in one program (the factors stay in VMEM between the kernels); then
# a solve with given factors, the operation a
    # factorization is for (the bands a factorization keeps for derivatives are unread here:
    # the factors stand in for them, so the floor counts each array once)
    "factor-and-solve-f32": (lambda *a: tridiax.TDMA().factor(tridiax.Tridiagonal(*a[:3], axis=0)).solve(a[3]),
                             [((1000, 4096), "float32")] * 4, 2, "program"),
    "factored-solve-f32": (lambda l, m, c, d: tridiax.TridiagonalFactorization(
        l, m, c, l, m, c, None, None, axis=0, band_shape=l.shape).solve(d),
                           [((1000, 4096), "float32")] * 4, 1, "program"),
    "grad-solve-columns-bf16": (_grad(_solve(0), (0, 1, 2, 3)), [((1000, 4096), "bfloat16")] * 4, 2, "program"),
    # banded solves: the bands in scipy's layout, one kernel reading each band once
    "banded-pivoted-f32": (lambda ab, b: tridiax.solve_banded((2, 2), ab, b, axis=0),
                           [((5, 1000, 4096), "float32"), ((1000, 4096), "float32")], 1, "program"),
    "banded-one-matrix-f32": (lambda ab, b: tridiax.solve_banded((2, 1), ab, b, axis=0),
                              [((4, 1000, 1), "float32"), ((1000, 4096), "float32")], 1, "program"),
    "banded-batch-first-column-major-bf16": (lambda ab, b: tridiax.solve_banded((1, 3), ab, b, axis=-1),
                                             [((5, 4096, 1000), "bfloat16"), ((4096, 1000), "bfloat16")],
                                             1, "program"),
    "banded-middle-axis-f32": (lambda ab, b: tridiax.solve_banded((1, 1), ab, b, axis=1),
                               [((3, 8, 1000, 512), "float32"), ((8, 1000, 512), "float32")], 1, "program"),
    "grad-banded-f32": (_grad(lambda ab, b: tridiax.solve_banded((2, 2), ab, b, axis=0), (0, 1)),
                        [((5, 1000, 4096), "float32"), ((1000, 4096), "float32")], 2, "program"),
    # too long for VMEM: U's kept rows (1/pivot and l + u superdiagonals with pivoting) and y
    # streamed through HBM
    "banded-longer-than-vmem-f32": (lambda ab, b: tridiax.solve_banded((2, 2), ab, b, axis=0),
                                    [((5, 30000, 1024), "float32"), ((30000, 1024), "float32")], 2,
                                    ("streamed", 6)),
    # a banded factorization: the forward elimination writing U's kept rows, the multipliers
    # and the pivots; then solves with given factors (U's five kept rows passed as the bands,
    # which only the gradient reads), A x = b and A^T x = b, and one matrix's factors (SMEM
    # scalars) against many right-hand sides
    "banded-factor-f32": (lambda ab: _banded_factors(tridiax.Banded(ab, (2, 2), axis=0).factor()),
                          [((5, 1000, 4096), "float32")], 1, "program"),
    "banded-factor-batch-first-bf16": (
        lambda ab: _banded_factors(tridiax.Banded(ab, (1, 2), axis=-1).factor(pivoting=False)),
        [((4, 4096, 1000), "bfloat16")], 1, "program"),
    "banded-factored-solve-f32": (lambda ab, m, p, b: _banded_factorization(ab, m, p).solve(b),
                                  _banded_factor_specs((1000, 4096)), 1, "program"),
    "banded-factored-solve-transposed-f32": (lambda ab, m, p, b: _banded_factorization(ab, m, p).T.solve(b),
                                             _banded_factor_specs((1000, 4096)), 1, "program"),
    "banded-factored-solve-batch-first-f32": (
        lambda ab, m, p, b: tridiax.BandedFactorization(tridiax.Banded(ab, (2, 2), axis=-1),
                                                        _factors=(ab, m, p)).solve(b),
        [((5, 4096, 1000), "float32"), ((2, 4096, 1000), "float32"), ((4096, 1000), "int32"),
         ((4096, 1000), "float32")], 1, "program"),
    "banded-factored-solve-one-matrix-f32": (lambda ab, m, p, b: _banded_factorization(ab, m, p).solve(b),
                                             _banded_factor_specs((1000, 1), rhs=(1000, 4096)), 1,
                                             "program"),
    # the bands' cotangent built band by band in place (the transpose of `algebra.matvec`'s split)
    "grad-banded-factored-solve-f32": (_grad(lambda ab, m, p, b: _banded_factorization(ab, m, p).solve(b), (0, 3)),
                                       _banded_factor_specs((1000, 4096)), 2, "program"),
    # solveh_banded: the kernel reads the other triangle's entries from the stored one
    "solveh-banded-f32": (lambda ab, b: tridiax.solveh_banded(ab, b, axis=0),
                          [((3, 1000, 4096), "float32"), ((1000, 4096), "float32")], 1, "program"),
    "solveh-banded-lower-batch-first-bf16": (lambda ab, b: tridiax.solveh_banded(ab, b, lower=True, axis=-1),
                                             [((3, 4096, 1000), "bfloat16"), ((4096, 1000), "bfloat16")],
                                             1, "program"),
    "grad-solveh-banded-f32": (_grad(lambda ab, b: tridiax.solveh_banded(ab, b, axis=0), (0, 1)),
                               [((3, 1000, 4096), "float32"), ((1000, 4096), "float32")], 2, "program"),
    "banded-complex64": (lambda ab, b: tridiax.solve_banded((1, 2), ab, b, axis=0),
                         [((4, 1000, 4096), "complex64"), ((1000, 4096), "complex64")], 1, "kernels"),
    "solveh-banded-lower-complex64-middle-axis": (lambda ab, b: tridiax.solveh_banded(ab, b, lower=True, axis=1),
                                                  [((2, 8, 1000, 512), "complex64"),
                                                   ((8, 1000, 512), "complex64")], 1, "kernels"),
    # complex64: the kernels take the float32 real and imaginary parts. XLA splits each
    # complex64 operand into them with copies of its own (X64SplitLow/High custom calls, given
    # buffers of their own), 2.3-3x the floor in all: not held; each kernel moves its operands once
    "solve-complex64": (_solve(0), [((1000, 4096), "complex64")] * 4, 1, "kernels"),
    "solve-periodic-pivoted-complex64-middle-axis": (
        lambda *a: tridiax.solve_periodic_tridiagonal(*a, axis=1, pivoting=True),
        [((8, 1000, 512), "complex64")] * 4, 1, "kernels"),
    "grad-solve-complex64": (_grad(lambda *a: jnp.abs(_solve(-1)(*a)), (0, 1, 2, 3)),
                             [((4096, 1024), "complex64")] * 4, 2, "kernels"),
    # an LRU's complex diagonal recurrence, and its gradient (the reversed recurrence)
    "recurrence-complex64": (lambda a, x: tridiax.linear_recurrence(a, x), [((1000, 4096), "complex64")] * 2,
                             1, "kernels"),
    "grad-recurrence-complex64": (_grad(lambda a, x: jnp.abs(tridiax.linear_recurrence(a, x)), (0, 1)),
                                  [((1000, 4096), "complex64")] * 2, 2, "kernels"),
    # block-tridiagonal solves: each operand read in the order a TPU stores it, the entries
    # of a power-of-two block inside its rows ((k, 128) tiles), of other blocks outside them
    "block-columns-f32": (_block(0), _block_specs((1000, 4096), 2, "float32"), 1, "program"),
    "block-batch-first-f32": (_block(-1), _block_specs((4096, 1000), 2, "float32"), 1, "program"),
    "block-middle-axis-k3-f32": (_block(1), _block_specs((8, 1000, 512), 3, "float32"), 1, "program"),
    "block-middle-axis-bf16": (_block(1), _block_specs((8, 1000, 512), 4, "bfloat16"), 1, "program"),
    "block-columns-k3-bf16": (_block(0), _block_specs((1000, 4096), 3, "bfloat16"), 1, "program"),
    # one matrix (N, k, k) for every batch-first system: SMEM scalars
    "block-one-matrix-f32": (_block(-1), [((1000, 2, 2), "float32")] * 3 + [((4096, 1000, 2), "float32")],
                             1, "program"),
    "block-k8-rhs-matrix-f32": (_block(0), [((500, 2048, 8, 8), "float32")] * 3
                                + [((500, 2048, 8, 3), "float32")], 1, "program"),
    # a Hermitian matrix's upper blocks read from its lower ones in the kernel: not formed by XLA
    # (complex64 split by XLA, as above)
    "solveh-block-batch-first-k3-bf16": (lambda l, d, b: tridiax.solveh_block_tridiagonal(l, d, b, axis=-1),
                                         _block_specs((4096, 1000), 3, "bfloat16")[1:], 1, "program"),
    # a block factorization writing lu, the pivots and E in one pass; then solves with given
    # factors (the operator's diagonal and upper blocks, which only the gradient reads, stood
    # in for by lu and e: the floor counts each array once)
    "block-factor-f32": (lambda l, d, u: _block_factors(tridiax.BlockTridiagonal(l, d, u, axis=0).factor()),
                         _block_specs((1000, 4096), 2, "float32")[:3], 1, "program"),
    "block-factor-batch-first-k3-bf16": (
        lambda l, d, u: _block_factors(tridiax.BlockTridiagonal(l, d, u, axis=-1).factor(pivoting=False)),
        _block_specs((4096, 1000), 3, "bfloat16")[:3], 1, "program"),
    "block-factored-solve-f32": (lambda *a: _block_factorization(0, *a).solve(a[-1]),
                                 _block_factor_specs((1000, 4096), 2), 1, "program"),
    "block-factored-solve-transposed-f32": (lambda *a: _block_factorization(0, *a).T.solve(a[-1]),
                                            _block_factor_specs((1000, 4096), 2), 1, "program"),
    "block-factored-solve-batch-first-k3-f32": (lambda *a: _block_factorization(-1, *a).solve(a[-1]),
                                                _block_factor_specs((4096, 1000), 3), 1, "program"),
    # too long for VMEM: y streamed through HBM between two kernels (one float32 work array)
    "block-factored-solve-longer-than-vmem-f32": (lambda *a: _block_factorization(0, *a).T.solve(a[-1]),
                                                  _block_factor_specs((100000, 1024), 2), 2, ("streamed", 1)),
    "block-complex64": (_block(0), _block_specs((1000, 4096), 2, "complex64"), 1, "kernels"),
    "solveh-block-complex64-k3": (lambda l, d, b: tridiax.solveh_block_tridiagonal(l, d, b, axis=1),
                                  _block_specs((4, 1000, 512), 3, "complex64")[1:], 1, "kernels"),
    "grad-block-f32": (_grad(_block(0), (0, 1, 2, 3)), _block_specs((1000, 4096), 2, "float32"), 2, "program"),
    # too long for VMEM: E and y streamed through HBM (k + 1 solution-sized arrays a row)
    "block-longer-than-vmem-k8-f32": (_block(0), _block_specs((3000, 1024), 8, "float32"), 2, ("streamed", 9)),
    "block-longer-than-vmem-batch-first-f32": (_block(-1), _block_specs((1024, 30000), 2, "float32"), 2,
                                               ("streamed", 3)),
    # too long for VMEM: two sweeps, the work rows (c' and y') streamed through HBM: held to the
    # floor of a solve that cannot keep its rows on chip ("streamed", `_floor`)
    "solve-longer-than-vmem-f32": (_solve(0), [((60000, 1024), "float32")] * 4, 2, ("streamed", 2)),
    "solve-long-narrow-f32": (_solve(0), [((1000000, 64), "float32")] * 4, 2, ("streamed", 2)),
    # fewer systems than a row tile, at least 128 wide: the partition method's own kernels
    # (ends, the reduced system, the solve with the separators known), which read the bands
    # twice: the floor of a streamed solve's 9 arrays; the periodic kind the same
    "solve-few-long-chunked-f32": (_solve(0), [((1000000, 128), "float32")] * 4, 3, ("streamed", 2)),
    "solve-periodic-few-long-chunked-f32": (lambda *a: tridiax.solve_periodic_tridiagonal(*a, axis=0),
                                            [((1000000, 128), "float32")] * 4, 3, ("streamed", 2)),
    # one system in chunks of 128 rows, one a lane (the (C, 128) view of its 1-D arrays): the
    # same kernels, the reduced system of 78 125 rows streamed, the chunks' end rows written
    # by the first kernel (XLA's slices of them would read the bands again): 9 arrays; its
    # gradient: two such solves, a transposed one slicing its chunks' first couplings
    "solve-one-system-chunked-f32": (_solve(0), [((10000000,), "float32")] * 4, 4, ("streamed", 2)),
    "grad-solve-one-system-chunked-f32": (_grad(_solve(0), (0, 1, 2, 3)), [((10000000,), "float32")] * 4,
                                          8, ("streamed", 4)),
    # pivoted: U's rows (pivot, two super-diagonals, y') streamed
    "solve-pivoted-longer-than-vmem-f32": (_solve(0, pivoting=True), [((30000, 1024), "float32")] * 4,
                                           2, ("streamed", 4)),
    "solve-pivoted-long-narrow-f32": (_solve(0, pivoting=True), [((1000000, 64), "float32")] * 4,
                                      2, ("streamed", 4)),
    # periodic: z' streamed too; f formed by the forward sweep, x = y - f z written by the back
    # substitution
    "solve-periodic-pivoted-long-narrow-f32": (
        lambda *a: tridiax.solve_periodic_tridiagonal(*a, axis=0, pivoting=True),
        [((1000000, 64), "float32")] * 4, 2, ("streamed", 5)),
    "solve-periodic-long-narrow-f32": (lambda *a: tridiax.solve_periodic_tridiagonal(*a, axis=0),
                                       [((1000000, 64), "float32")] * 4, 2, ("streamed", 3)),
    # few long sequences: row tiles of one sublane, each chunk as eight runs of steps side by
    # side, one per sublane
    "recurrence-few-long-f32": (lambda a, x: tridiax.linear_recurrence(a, x, axis=0),
                                [((100000, 128), "float32")] * 2, 1, "program"),
    "recurrence-few-long-512-f32": (lambda a, x: tridiax.linear_recurrence(a, x, axis=0),
                                    [((100000, 512), "float32")] * 2, 1, "program"),
    "grad-recurrence-few-long-f32": (_grad(lambda a, x: tridiax.linear_recurrence(a, x, axis=0), (0, 1)),
                                     [((100000, 128), "float32")] * 2, 2, "program"),
    "recurrence-f32": (lambda a, x: tridiax.linear_recurrence(a, x), [((1000, 4096), "float32")] * 2, 1, "program"),
    "recurrence-batch-first-bf16": (lambda a, x: tridiax.linear_recurrence(a, x, axis=-1),
                                    [((4096, 1024), "bfloat16")] * 2, 1, "program"),
    "recurrence-batch-first-column-major-bf16": (lambda a, x: tridiax.linear_recurrence(a, x, axis=-1),
                                                 [((4096, 1000), "bfloat16")] * 2, 1, "program"),
    "recurrence-decay-per-feature-f32": (lambda a, x: tridiax.linear_recurrence(a, x),
                                         [((4096,), "float32"), ((1000, 4096), "float32")], 1, "program"),
    "recurrence-final-state-f32": (lambda a, x: tridiax.linear_recurrence(a, x, final_only=True),
                                   [((1000, 4096), "float32")] * 2, 1, "program"),
    "indrnn-relu-bf16": (lambda w, z: tridiax.indrnn(w, z, axis=1),
                         [((1024,), "bfloat16"), ((8, 1000, 1024), "bfloat16")], 1, "program"),
    "grad-recurrence-f32": (_grad(lambda a, x: tridiax.linear_recurrence(a, x), (0, 1)),
                            [((1000, 4096), "float32")] * 2, 2, "program"),
    "grad-indrnn-tanh-f32": (_grad(functools.partial(tridiax.indrnn, activation=jnp.tanh), (0, 1)),
                             [((4096,), "float32"), ((1000, 4096), "float32")], 2, "program"),
    # arrays too large for XLA to keep any in VMEM: `test_constant_weights_sum_in_the_kernel`
    "grad-indrnn-relu-larger-than-vmem-f32": (_grad(tridiax.indrnn, (0, 1)),
                                              [((100_000,), "float32"), ((1000, 100_000), "float32")], 2, None),
    "grad-recurrence-decay-larger-than-vmem-f32": (
        _grad(lambda a, x: tridiax.linear_recurrence(a, x), (0, 1)),
        [((100_000,), "float32"), ((1000, 100_000), "float32")], 2, None),
}


def _bytes(specs) -> int:
    return sum(math.prod(shape) * np.dtype(jnp.dtype(dtype)).itemsize for shape, dtype in specs)


def _floor(name) -> int:
    """`_floor_of` the entry point; a streamed solve's counts its work arrays (float32, the
    solution's shape; a gradient's: a gradient's) written by the forward sweep and read by the
    back substitution: no solve of systems longer than VMEM moves less (chunks re-read the
    bands instead)."""
    fn, specs, _, held = ENTRY_POINTS[name]
    floor = _floor_of(fn, specs, gradient=name.startswith("grad-"))
    if isinstance(held, tuple):
        _, work = held
        out = jax.eval_shape(fn, *[jax.ShapeDtypeStruct(s, d) for s, d in specs])
        floor += 2 * work * max(x.size for x in jax.tree.leaves(out)) * 4
    return floor


def _floor_of(fn, specs, *, gradient: bool) -> int:
    """Bytes of one read of every argument and one write of the result. A gradient's: the
    forward's floor, then the adjoint's: every argument and the forward's result read again,
    every gradient written; the result taken as large as the largest argument (a solution, a
    recurrence's states): 3 x the arguments + 2 x the result."""
    if gradient:
        return 3 * _bytes(specs) + 2 * max(_bytes([spec]) for spec in specs)
    out = jax.eval_shape(fn, *[jax.ShapeDtypeStruct(s, d) for s, d in specs])
    return _bytes(specs) + sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(out))


def _problems(name, report, *, gradient_program=True):
    """What is wrong with one compiled entry point. `gradient_program`: hold a gradient's
    program bytes to its floor (else only its kernels': where XLA's VMEM placements leave a
    margin of one array, which they have been seen to vary by between compiles)."""
    _, specs, kernels, held = ENTRY_POINTS[name]
    held = held[0] if isinstance(held, tuple) else held
    if report.error:
        return [f"{name}: {report.error}"]
    problems = []
    if len(report.kernels) != kernels:
        problems.append(f"{name}: {len(report.kernels)} Mosaic kernels, expected {kernels}")
    if report.whiles:
        problems.append(f"{name}: {report.whiles} XLA while loops")
    vmem = _tpu.vmem(report.device_kind)  # the chip's plan: a quarter of the limit left over
    if vmem.limit == _tpu.VMEM_LIMIT and report.device_kind != "TPU v4":
        problems.append(f"{name}: no VMEM plan for a {report.device_kind}")
    for k in report.kernels:
        if not 0 < k.vmem_bytes <= vmem.budget:
            problems.append(f"{name}: {k.name} uses {k.vmem_bytes} B of VMEM, over its budget {vmem.budget}")
        if k.vmem_limit_bytes != vmem.limit:
            problems.append(f"{name}: {k.name} runs under {k.vmem_limit_bytes} B of scoped VMEM, "
                            f"not {vmem.limit}")
    floor = _floor(name)
    program = held in ("program", "streamed") and (gradient_program or not name.startswith("grad-"))
    if program and report.hbm_bytes > FLOOR_FACTOR * floor:
        problems.append(f"{name}: {report.hbm_bytes:.4g} B through HBM, floor {floor:.4g}")
    if held and not program and name.startswith("grad-"):  # each kernel: a forward call's floor
        forward = _bytes(specs) + max(_bytes([spec]) for spec in specs)
        if any(k.operand_bytes + k.result_bytes > FLOOR_FACTOR * forward for k in report.kernels):
            problems.append(f"{name}: a kernel moves more than {FLOOR_FACTOR} x {forward} B")
    if held and not name.startswith("grad-") and any(k.operand_bytes + k.result_bytes > FLOOR_FACTOR * floor
                                                     for k in report.kernels):
        problems.append(f"{name}: a kernel moves more than {FLOOR_FACTOR} x {floor} B")
    return problems


def _describe(name, report):
    floor = _floor(name)
    kernels = ", ".join(f"{k.vmem_bytes / 2**20:.2f} MiB VMEM, {(k.operand_bytes + k.result_bytes) / 2**20:.1f} MiB"
                        for k in report.kernels)
    return (f"{name}: HBM {report.hbm_bytes / floor:.3f} x floor ({report.hbm_bytes / 2**20:.1f} MiB; "
            f"cost analysis {report.bytes_accessed / floor:.3f} x), "
            f"kernels [{kernels}], others {list(report.others)}, {report.compile_seconds:.1f} s")


@functools.cache
def _reports(topology, names):
    cases = {name: (f"test_tpu_compile:ENTRY_POINTS[{name!r}][0]", ENTRY_POINTS[name][1]) for name in names}
    return compile_reports(cases, topology=topology)


def test_entry_points_compile_to_mosaic_kernels_for_v5e():
    _require_harness()
    reports = _reports(V5E, tuple(ENTRY_POINTS))
    for name, report in reports.items():
        if not report.error:
            print(_describe(name, report))
    problems = [p for name, report in reports.items() for p in _problems(name, report)]
    assert not problems, "\n".join(problems)


def test_gradient_kernels_move_each_array_once():
    """A gradient's kernels (the solve and the transposed solve; the recurrence and the reversed
    one) each read their operands and write their result once: five arrays a solve, three a
    recurrence (IndRNN's backward reads the loss's cotangent and the states whose slope gates
    it, its weight a tile per feature)."""
    _require_harness()
    reports = _reports(V5E, tuple(ENTRY_POINTS))
    for name in ("grad-solve-f32", "grad-periodic-f32", "grad-recurrence-f32", "grad-indrnn-tanh-f32"):
        _, specs, _, _ = ENTRY_POINTS[name]
        array = max(math.prod(s) * np.dtype(jnp.dtype(d)).itemsize for s, d in specs)
        arrays = 3 if "recurrence" in name or "indrnn" in name else 5
        for k in reports[name].kernels:
            assert k.operand_bytes + k.result_bytes <= FLOOR_FACTOR * arrays * array, (name, k)


@pytest.mark.parametrize("name", ["grad-indrnn-relu-larger-than-vmem-f32",
                                  "grad-recurrence-decay-larger-than-vmem-f32"])
def test_constant_weights_sum_in_the_kernel(name):
    """IndRNN's forward and gradient (a weight per feature; arrays of T x F no VMEM holds) move 7
    arrays of T x F through HBM: the forward (z read, h written), the loss's cotangent (h read,
    2h written) and the reversed recurrence gated in the kernel (the cotangent and h read, z's
    cotangent written), which also sums the weight's cotangent over T from the rows it holds.
    Summed by XLA instead, the weight's cotangent reads z's cotangent and h again: 9; with the
    gate's slope materialized too, XLA writes the slope-scaled weight and cotangent as two
    arrays more and the kernel reads them instead of h: 12. A linear recurrence's decay per
    feature moves the same 7: its reversed run, ungated, reads h for the sum alone."""
    _require_harness()
    report = _reports(V5E, (name,))[name]
    assert not _problems(name, report), _problems(name, report)
    array = 1000 * 100_000 * 4
    print(f"{name}: {report.hbm_bytes / array:.2f} arrays of T x F through HBM")
    assert report.hbm_bytes <= 7.05 * array, report.hbm_bytes / array


@pytest.mark.parametrize("topology", [t for t in TOPOLOGIES if t != V5E])
def test_other_generations(topology):
    """v4, v5p, v6e and 7x compile the kernels too, within their scoped VMEM, each forward
    program within the floor's bytes as on a v5e (7x prefetches operands into VMEM: through
    HBM once, which XLA's cost analysis counts twice); a gradient's kernels each move their
    operands once (its program: 0.6-1.13x its floor, printed, one array from the limit on v5p)."""
    _require_harness()
    names = ("solve-batch-first-f32", "solve-middle-axis-bf16", "grad-recurrence-f32", "block-middle-axis-k3-f32",
             "banded-factor-f32", "banded-factored-solve-transposed-f32", "block-factor-f32",
             "block-factored-solve-transposed-f32")
    reports = _reports(topology, names)
    for name, report in reports.items():
        if not report.error:
            print(topology, _describe(name, report))
    problems = [p for name, report in reports.items()
                for p in _problems(name, report, gradient_program=False)]
    assert not problems, "\n".join(problems)


# Sharded forms, over the four chips of a v5e 2x2 slice: under shard_map each device runs the
# kernel on the systems it holds, with no communication. (jit over NamedSharding inputs goes
# through custom_partitioning, whose partitioner libtpu's compile-only client does not have:
# "Custom emitter for CustomSPMDPartitioning not found"; tests/transformations/ runs those on
# CPU devices.)
DEVICES = 4


def _split(specs, dim=-1):
    """Argument specs split over the devices along dimension `dim` (a batch dimension)."""
    return [(shape, dtype, tuple("devices" if d == dim % len(shape) else None for d in range(len(shape))))
            for shape, dtype in specs]


def _partition(spec):
    return jax.sharding.PartitionSpec(*spec[2])


# name: (what each device runs, argument specs split over the devices)
SHARDED_FORMS = {
    "sharded-solve-f32": (_solve(0), _split([((1000, 4096), "float32")] * 4)),
    "sharded-grad-solve-f32": (_grad(_solve(0), (0, 1, 2, 3)), _split([((1000, 4096), "float32")] * 4)),
    "sharded-banded-f32": (lambda ab, b: tridiax.solve_banded((2, 2), ab, b, axis=0),
                           _split([((5, 1000, 4096), "float32"), ((1000, 4096), "float32")])),
    "sharded-block-f32": (_block(0), _split(_block_specs((1000, 4096), 2, "float32"), dim=1)),
    "sharded-recurrence-f32": (lambda a, x: tridiax.linear_recurrence(a, x),
                               _split([((1000, 4096), "float32")] * 2)),
}


def _sharded(name):
    """The entry point as shard_map runs it over the slice's devices."""
    fn, specs = SHARDED_FORMS[name]
    mesh = jax.sharding.AbstractMesh((DEVICES,), ("devices",))
    out = jax.eval_shape(fn, *[jax.ShapeDtypeStruct(s, d) for s, d, _ in specs])
    return jax.shard_map(fn, mesh=mesh, in_specs=tuple(map(_partition, specs)),
                         out_specs=jax.tree.map(lambda _: _partition(specs[-1]), out))


def test_sharded_forms_compile_per_device():
    """Each device's program: the kernels of the unsharded entry point on a quarter of the
    systems, no XLA loop, within the chip's VMEM, a quarter of the floor's bytes (a
    gradient's: `_floor`)."""
    _require_harness()
    cases = {name: (f"test_tpu_compile:_sharded({name!r})", specs)
             for name, (_, specs) in SHARDED_FORMS.items()}
    reports = compile_reports(cases, topology=V5E)
    problems = []
    vmem = _tpu.vmem("TPU v5 lite")
    for name, report in reports.items():
        if report.error:
            problems.append(f"{name}: {report.error}")
            continue
        fn, specs = SHARDED_FORMS[name]
        floor = _floor_of(fn, [(s, d) for s, d, _ in specs], gradient="grad" in name) / DEVICES
        print(f"{name}: HBM {report.hbm_bytes / floor:.3f} x a device's floor, kernels "
              f"{[round(k.vmem_bytes / 2**20, 2) for k in report.kernels]} MiB VMEM, others {list(report.others)}")
        if not report.kernels or report.whiles:
            problems.append(f"{name}: {len(report.kernels)} kernels, {report.whiles} XLA loops")
        if any(k.vmem_bytes > vmem.budget for k in report.kernels):
            problems.append(f"{name}: a kernel over its VMEM budget")
        if report.hbm_bytes > FLOOR_FACTOR * floor:
            problems.append(f"{name}: {report.hbm_bytes:.4g} B through HBM, a device's floor {floor:.4g}")
    assert not problems, "\n".join(problems)
