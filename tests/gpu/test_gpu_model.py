"""The GPU cost model (benchmarks/gpu_model.py): its parts on hand-counted launches, its fit to
the H100 run it was calibrated on, and the shape table of this checkout: no row may get slower
in the model than the committed figures, and every row is held to the goal (rows that do not
meet it yet are strict expected failures, so a row that starts meeting it must be moved).

The shape table is compiled for an H100 without a GPU (`gpu_aot`); without the CUDA plugin
those tests skip, unless TRIDIAX_REQUIRE_GPU_AOT is set (as CI does), when they fail.
"""

from __future__ import annotations

import functools
import json
import math
import os
import pathlib
import sys

import pytest
from gpu_aot import KernelReport, instruction_bytes, shape_bytes, unavailable_reason

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_model  # noqa: E402

sys.path.pop(0)

DATA = json.loads(gpu_model.DATA.read_text())
# Rows whose modelled ratio, transposes, library calls or grids do not meet the goal yet.
BELOW_GOAL = {
    "(N, B) = (100, 100 000)", "(B, N) = (100 000, 100)", "(N, B) = (10 000, 1 000)",
    "(N, B) = (100 000, 64)", "(N, B) = (1 000 000, 64)", "(N, B) = (1 000 000, 128)",
    "(N, B) = (1 000 000, 4)", "(B, N) = (64, 1 000 000)", "one system, N = 10 000 000",
    "recurrence (F, T) = (64, 1 000 000)", "recurrence (T, F) = (10 000 000, 1)",
    "recurrence (T, F) = (1 000 000, 4)",
}
# Rows whose modelled forward and gradient take more than GRAD_GOAL times the forward.
GRAD_BELOW_GOAL = {
    "(N, B) = (100, 100 000)", "(B, N) = (100 000, 100)", "recurrence (T, F) = (1 000, 100 000)",
    "recurrence (F, T) = (64, 1 000 000)", "recurrence (T, F) = (10 000 000, 1)",
}
LABELS = [label for label, *_ in gpu_model.shapes()]


def _kernel(name="tridiax_thomas", origin="pallas_triton", blocks=1, threads=32, registers=40,
            arrays=(), operand_bytes=0, result_bytes=0, accesses=()):
    return KernelReport(name=name, origin=origin, registers=registers, spill_store_bytes=0,
                        spill_load_bytes=0, shared_memory_bytes=0, grid=(blocks, 1, 1),
                        block=(threads, 1, 1), arch="sm_90a", operand_bytes=operand_bytes,
                        result_bytes=result_bytes, arrays=tuple(arrays), accesses=tuple(accesses))


def _array(shape, block, itemsize=4, output=False):
    return {"shape": list(shape), "block": list(block), "itemsize": itemsize, "output": output}


# --- the parts --------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, block, itemsize, expected", [
    ((1, 100, 1000), (1, 100, 64), 4, 1.0),  # rows of 64 contiguous values: whole bursts
    ((1000, 100, 1), (64, 100, 1), 4, 8.0),  # batch-first float32: a 32-byte sector per value
    ((1000, 100, 1), (64, 100, 1), 8, 4.0),  # float64
    ((1, 10**6, 1), (1, 10**6, 1), 4, 1.0),  # one system: consecutive rows share sectors
    ((100, 50, 4), (16, 50, 4), 4, 2.0),  # rows of 4 values (16 bytes)
    ((100, 50, 3), (16, 50, 4), 4, 32 / 12),  # a block wider than the array's 3 values
])
def test_run_waste(shape, block, itemsize, expected):
    """From block specs (kernels whose IR was not recorded): one row of the block a step."""
    assert gpu_model.run_waste(_array(shape, block, itemsize), 32) == pytest.approx(expected)


@pytest.mark.parametrize("accesses, expected_waste, rows", [
    ([(1, 64, 4)] * 3, 1.0, 1),  # the row kernel, (N, B): rows of 64 values, one row a step
    ([(64, 1, 4)] * 3, 8.0, 1),  # the row kernel, batch-first: one value per system a step
    ([(32, 16, 1, 4)] * 3, 1.0, 16),  # tiles of rows, batch-first: 16 rows of each system
    ([(1, 8, 64, 4)] * 3, 1.0, 8),  # tiles of rows, (N, B): 8 rows of 64 values
    ([(32, 16, 1, 4)] * 2 + [(32, 1, 1, 4)], (2 * 512 * 4 + 32 * 32) / (2 * 512 * 4 + 32 * 4),
     16),  # and one row beyond the tile (the transposed sweep): a sector for each value
    ([(1, 1, 4)] * 2, 1.0, 1),  # one system's row after row
])
def test_access_waste_and_rows_per_step(accesses, expected_waste, rows):
    assert gpu_model.access_waste(accesses, 32) == pytest.approx(expected_waste)
    assert gpu_model.rows_per_step(_kernel(accesses=accesses)) == rows


def test_two_sweep_traffic_and_latency():
    # A Thomas kernel: 4 inputs read once, its solution written twice and read once (y' then
    # x), its c' written and read back: 9 arrays; one block of 32 threads steps through 2N rows,
    # ROW_S each (its arrays do not fit in the L2), or ROW_L2_S (a small, reduced system).
    c = gpu_model.Constants()
    for n, q, row_s in ((100_000, 64, c.row_s), (1000, 64, c.row_l2_s)):
        arrays = ([_array((1, n, q), (1, n, q))] * 4
                  + [_array((1, n, q), (1, n, q), output=True)] * 2)
        launch = gpu_model.model_launch(_kernel(arrays=arrays), c)
        size = n * q * 4
        assert launch.bytes == 9 * size
        assert launch.memory_s == pytest.approx(9 * size / (c.stream * gpu_model.PEAK_BYTES_S))
        assert launch.latency_s == pytest.approx(2 * n * row_s)  # one wave
        assert launch.seconds == pytest.approx(max(launch.memory_s, launch.latency_s)
                                               + c.launch_s)
        # A one-sweep kernel (a recurrence) reads and writes each array once, N steps.
        rec = gpu_model.model_launch(
            _kernel("tridiax_recurrence__1", arrays=arrays[:2] + arrays[4:5]), c)
        assert rec.bytes == 3 * size and rec.latency_s == pytest.approx(n * row_s)
    # Tiles of 16 rows of each of 32 systems: a sixteenth of the steps, whole sectors.
    arrays = [_array((1000, 10**5, 1), (32, 10**5, 1))] * 4 + [
        _array((1000, 10**5, 1), (32, 10**5, 1), output=True)] * 2
    tiled = gpu_model.model_launch(_kernel("tridiax_thomas_rows", arrays=arrays,
                                           accesses=[(32, 16, 1, 4)] * 8), c)
    assert tiled.latency_s == pytest.approx(2 * 10**5 // 16 * c.row_s)
    assert tiled.waste == 1.0


def test_waves_follow_occupancy():
    # 40 registers x 128 threads: 12 blocks an SM; twice that many blocks run in two waves.
    arrays = [_array((1, 10, 8), (1, 10, 8))]
    kernel = _kernel(name="tridiax_recurrence", blocks=2 * 12 * gpu_model.SMS, threads=128,
                     arrays=arrays)
    assert gpu_model.resident_blocks(kernel) == 12 * gpu_model.SMS
    c = gpu_model.Constants()
    assert gpu_model.model_launch(kernel, c).latency_s == pytest.approx(2 * 10 * c.row_l2_s)


def test_xla_and_library_traffic():
    c = gpu_model.Constants()
    fusion = gpu_model.model_launch(_kernel("loop_fusion", "xla", operand_bytes=300,
                                            result_bytes=100), c)
    assert fusion.bytes == 400 and fusion.latency_s == 0
    # An in-place dynamic-update-slice moves its update (operands minus the buffer) twice.
    update = gpu_model.model_launch(_kernel("loop_dynamic_update_slice_fusion", "xla",
                                            operand_bytes=1000 + 64, result_bytes=1000), c)
    assert update.bytes == 128
    library = gpu_model.model_library({"target": "cusparse_gtsv2_ffi", "operand_bytes": 500,
                                       "result_bytes": 100}, c)
    assert library.memory_s == pytest.approx(c.library * 600 / (c.stream * gpu_model.PEAK_BYTES_S))


def test_hlo_bytes():
    assert shape_bytes("f32[1,100,1000]{2,1,0}") == 400_000
    assert shape_bytes("(f32[2,3]{1,0}, f64[4]{0}, pred[])") == 24 + 32 + 1
    hlo = """
  %p0 = f32[100,1000]{1,0} parameter(0), sharding={replicated}
  %p1 = bf16[1000]{0} parameter(1)
  %fusion.1 = f32[1000,100]{1,0} fusion(%p0, %p1), kind=kInput, calls=%c
  ROOT %call = (f32[10]{0}, s32[]) custom-call(%fusion.1), custom_call_target="x"
"""
    sizes = instruction_bytes(hlo)
    assert sizes["fusion.1"] == (400_000 + 2_000, 400_000)
    assert sizes["call"] == (400_000, 44)


# --- the fit ----------------------------------------------------------------------------------


@functools.cache
def _measured_tables():
    stored = DATA["measured_commit"]
    return (gpu_model.model_table(gpu_model.reports_from_data(stored["reports"])),
            gpu_model.model_table(gpu_model.reports_from_data(stored["lax_reports"])))


# The model of the row kernel reading batch-first rows in place counts one 32-byte sector per
# value; the H100 fetched more (the fit's one outlier, 0.43 of the measured time).
CALIBRATION_BOUNDS = {"(B, N) = (100 000, 100)": (0.4, 1.0)}


@pytest.mark.parametrize("label", list(gpu_model.MEASURED))
def test_model_matches_the_h100_run(label):
    """The model of the code the H100 measured (compiled then, stored) is within 0.65-1.5x of
    each measured time, tridiax's, the floor's and cuSPARSE's (0.43 for the row kernel on
    batch-first rows: CALIBRATION_BOUNDS)."""
    tridiax_table, lax_table = _measured_tables()
    ms, floor_ms, lax_ms = gpu_model.MEASURED[label]
    low, high = CALIBRATION_BOUNDS.get(label, (0.65, 1.5))
    model_ms, model_floor_ms = gpu_model.timed_ms(tridiax_table[label])
    assert low <= model_ms / ms <= high, (model_ms, ms)
    assert 0.65 <= model_floor_ms / floor_ms <= 1.5, (model_floor_ms, floor_ms)
    if lax_table.get(label) is not None:
        lax_model_ms = gpu_model.timed_ms(lax_table[label])[0]
        assert 0.65 <= lax_model_ms / lax_ms <= 1.5, (lax_model_ms, lax_ms)


def test_constants_are_the_fit():
    """The constants in use are the ones the calibration fitted (rounded), so that a change of
    the model's formula comes with a new fit (`python benchmarks/gpu_model.py --write`)."""
    fitted = DATA["measured_commit"]["fitted"]
    used = gpu_model.Constants()
    for name, value in fitted.items():
        assert math.isclose(getattr(used, name), value, rel_tol=0.02), name


# --- this checkout ----------------------------------------------------------------------------


def _require_harness():
    if reason := unavailable_reason():
        if os.environ.get("TRIDIAX_REQUIRE_GPU_AOT", "") not in ("", "0"):
            pytest.fail(f"TRIDIAX_REQUIRE_GPU_AOT is set but deviceless GPU compilation cannot run: {reason}")
        pytest.skip(reason)


@functools.cache
def _current():
    reports, grads = gpu_model.compile_shapes(), gpu_model.compile_shapes(grad=True)
    return reports, gpu_model.model_table(reports), grads, gpu_model.model_table(grads)


@pytest.mark.parametrize("label", LABELS)
def test_no_row_gets_slower(label):
    """Each row's modelled ratio to the floor, and its forward and gradient over its forward,
    at most 10% above the committed ones."""
    _require_harness()
    reports, table, grads, grad_table = _current()
    assert reports[label].error is None, reports[label].error
    assert grads[label].error is None, grads[label].error
    committed = DATA["current"]
    assert table[label].ratio <= 1.10 * committed["ratio"][label], (
        table[label].ratio, committed["ratio"][label])
    grad_ratio = grad_table[label].seconds / table[label].seconds
    assert grad_ratio <= 1.10 * committed["grad_ratio"][label], (
        grad_ratio, committed["grad_ratio"][label])


def _goal_params(below):
    return [pytest.param(label, marks=pytest.mark.xfail(strict=True, reason="below the goal "
                                                        "(issue 43)")) if label in below
            else label for label in LABELS]


@pytest.mark.parametrize("label", _goal_params(BELOW_GOAL))
def test_row_meets_the_goal(label):
    """Modelled ratio within the goal (2x; 1.4x for the design shapes), no XLA transpose around
    a kernel, no library hand-off, and every Pallas launch at least one block per SM."""
    _require_harness()
    reports, table, _, _ = _current()
    report, modelled = reports[label], table[label]
    assert not [k.name for k in report.kernels if "transpose" in k.name]
    assert not report.library_calls
    assert all(k.blocks >= gpu_model.SMS for k in report.kernels if k.origin == "pallas_triton")
    assert modelled.ratio <= gpu_model.goal(label)


@pytest.mark.parametrize("label", _goal_params(GRAD_BELOW_GOAL))
def test_gradient_meets_the_goal(label):
    """Forward and gradient modelled at most GRAD_GOAL times the forward."""
    _require_harness()
    _, table, _, grad_table = _current()
    assert grad_table[label].seconds <= gpu_model.GRAD_GOAL * table[label].seconds


def test_compare_with_a_gpu_run(tmp_path):
    """--measured reads a shape table's forward rows (gpu_report.py's data) and pairs them
    with the model's rows: tridiax's and the floor's times, the call overhead included."""
    rows = [
        {"table": "shapes", "case": "(N, B) = (100, 100 000)", "dtype": "float32",
         "method": method, "grad": grad, "ms": ms}
        for method, grad, ms in (("tridiax", False, 0.3), ("floor", False, 0.2),
                                 ("tridiax", True, 0.9), ("lax", False, 0.8))
    ] + [{"table": "shapes", "case": "(N, B) = (100, 100 000)", "dtype": "float64",
          "method": "tridiax", "grad": False, "ms": 5.0}]
    path = tmp_path / "shapes_h100.json"
    path.write_text(json.dumps({"meta": {}, "rows": rows}))
    measured = gpu_model.measured_rows(path)
    assert measured == {"(N, B) = (100, 100 000)": {"tridiax": 0.3, "floor": 0.2, "lax": 0.8}}
    stored = gpu_model.model_table(gpu_model.reports_from_data(DATA["current"]["reports"]))
    pairs = gpu_model.compare(stored, measured)
    label = "(N, B) = (100, 100 000)"
    assert list(pairs) == [label]
    model_ms, model_floor_ms, ms, floor_ms = pairs[label]
    assert (ms, floor_ms) == (0.3, 0.2)
    assert (model_ms, model_floor_ms) == pytest.approx(gpu_model.timed_ms(stored[label]))
