"""Accuracy against the plain sequential sweep, on the systems PDE users solve.

Every plan is compared with `tridiax.verify.sequential_solve` in the same dtype (the Thomas
sweep dividing by each pivot, row after row; gtsv's order with pivoting), with tolerances
relative to that sweep's own error against the exact answer (the sweep in a wider precision),
not to a cond(A)*eps bound: such a bound is met by formulations that lose two to four digits
on heat steps and nearly singular Poisson problems, where the sweep is far more accurate
than its bound.

- Systems the plan does not chunk: on the native kernel (the CPU default), bitwise the
  sweep's answer, in every layout and tile, alone or in a batch of any size, and through
  the transposed solve of the gradient; on the other backends within SWEEP_FACTOR of its
  error.
- Chunked systems (the partition method) and factored solves: within SWEEP_FACTOR of the
  sweep's error.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    PDE_SYSTEMS,
    PERIODIC_SYSTEMS,
    backends,
    pde_bands,
    pde_rhs,
    relative_error,
    truth_dtype,
)

import tridiax
from tridiax import verify
from tridiax._core import planner as _planner
from tridiax._tridiagonal.api import solve

# The most that a plan's error may exceed the sequential sweep's (both against the exact
# answer). Plans that keep the sweep's order meet 1 exactly on the native kernel.
SWEEP_FACTOR = 4.0

REAL = (np.float32, np.float64)
REAL_SYSTEMS = tuple(s for s in PDE_SYSTEMS if s != "schrodinger")
# Row counts: the smallest systems, odd ones around the kernels' blocks of 8 and 16 rows.
SIZES = (1, 2, 3, 17, 33, 257)


def dtype_id(dtype):
    return np.dtype(dtype).name


def bands_of(system, n, batch, dtype):
    return [b.astype(dtype) for b in pde_bands(system, n, batch)] + [
        pde_rhs((batch, n), dtype)]


def errors(x, bands, dtype, **kind):
    """(tridiax's error, the sweep's error), both against the sweep in a wider precision."""
    truth = verify.sequential_solve(*bands, dtype=truth_dtype(dtype), **kind)
    sweep = verify.sequential_solve(*bands, dtype=dtype, **kind)
    return relative_error(x, truth), relative_error(sweep, truth)


def assert_near_sweep(x, bands, dtype, factor=SWEEP_FACTOR, **kind):
    error, sweep_error = errors(x, bands, dtype, **kind)
    assert error <= factor * sweep_error, (
        f"error {error:.2e} is {error / sweep_error:.1f}x the sequential sweep's {sweep_error:.2e}")


def transposed(lower, upper):
    """Bands of A^T (along the last axis)."""
    lower_t, upper_t = np.zeros_like(lower), np.zeros_like(upper)
    lower_t[..., 1:], upper_t[..., :-1] = upper[..., :-1], lower[..., 1:]
    return lower_t, upper_t


# ---------------------------------------------------------------------------------------------
# Whole systems on the native kernel: the sweep's answer, bit for bit.

# (layout, batch): systems along the last axis (batch-first) in strided tiles, in tiles of
# ROWS_TILE_VECTORS vectors (forced), along axis 0 in tiles of contiguous lanes (64 of them,
# or 4: a tile of a few), and one system alone.
LAYOUTS = ("rows", "row_tiles", "columns", "few_columns", "one")


def layout_of(layout, dtype):
    """(batch, axis, transposed-to-columns) of a layout."""
    tiles = _planner.ROWS_TILE_VECTORS * _planner.vector_lanes(dtype) + 5
    return {"rows": (5, -1, False), "row_tiles": (tiles, -1, False), "columns": (64, 0, True),
            "few_columns": (4, 0, True), "one": (1, -1, False)}[layout]


def solve_in_layout(bands, layout, dtype, *, backend="native", **kind):
    batch, axis, columns = layout_of(layout, dtype)
    args = [jnp.asarray(b.T if columns else b[0] if layout == "one" else b) for b in bands]
    x = np.asarray(solve(*args, axis=axis, backend=backend, chunk=0, **kind))
    return x.T if columns else x[None] if layout == "one" else x


@pytest.mark.cpu_device
@pytest.mark.parametrize("dtype", REAL, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("system", REAL_SYSTEMS)
def test_native_whole_systems_are_the_sequential_sweep_bitwise(system, layout, dtype, monkeypatch):
    if "native" not in backends(dtype):
        pytest.skip("the native kernel is not built on this machine")
    # The planner's tile for many short batch-first systems, forced where asked.
    monkeypatch.setattr(_planner, "_rows_by_tiles", lambda P, N, dt: layout == "row_tiles")
    batch = layout_of(layout, dtype)[0]
    for n in SIZES:
        bands = bands_of(system, n, batch, dtype)
        x = solve_in_layout(bands, layout, dtype)
        want = verify.sequential_solve(*bands, dtype=dtype)
        np.testing.assert_array_equal(x, want, err_msg=f"n = {n}")


@pytest.mark.cpu_device
@pytest.mark.parametrize("dtype", REAL, ids=dtype_id)
@pytest.mark.parametrize("kind", ["pivoted", "periodic", "transposed"])
def test_native_whole_kinds_are_the_sequential_sweep_bitwise(kind, dtype):
    if "native" not in backends(dtype):
        pytest.skip("the native kernel is not built on this machine")
    systems = PERIODIC_SYSTEMS if kind.startswith("periodic") else REAL_SYSTEMS
    flags = dict(pivoting="pivoted" in kind, periodic=kind.startswith("periodic"))
    for system in systems:
        for layout in ("rows", "columns"):
            for n in (3, 33, 257):
                lower, diag, upper, rhs = bands_of(system, n, 5, dtype)
                if kind == "transposed":  # the gradient w.r.t. rhs: A^{-T} x_bar
                    batch, axis, columns = layout_of(layout, dtype)
                    args = [jnp.asarray(b.T if columns else b) for b in (lower, diag, upper, rhs)]
                    _, vjp = jax.vjp(lambda b: solve(*args[:3], b, axis=axis, backend="native",
                                                     chunk=0), args[3])
                    x = np.asarray(vjp(args[3])[0])
                    x = x.T if columns else x
                    want = verify.sequential_solve(*transposed(lower, upper)[:1], diag,
                                                   transposed(lower, upper)[1], rhs, dtype=dtype)
                else:
                    x = solve_in_layout((lower, diag, upper, rhs), layout, dtype, **flags)
                    want = verify.sequential_solve(lower, diag, upper, rhs, dtype=dtype, **flags)
                np.testing.assert_array_equal(x, want, err_msg=f"{system}, {layout}, n = {n}")


@pytest.mark.cpu_device
@pytest.mark.parametrize("dtype", REAL, ids=dtype_id)
def test_native_same_answer_whatever_the_batch(dtype):
    # One system of 300 rows alone, and inside batches of every size and both layouts (other
    # systems drawn at random around it): the same bits, in the default plan (not chunked).
    if "native" not in backends(dtype):
        pytest.skip("the native kernel is not built on this machine")
    lower, diag, upper, rhs = bands_of("heat_1e2", 300, 1, dtype)
    alone = np.asarray(tridiax.solve_tridiagonal(*(jnp.asarray(b[0]) for b in
                                                  (lower, diag, upper, rhs))))
    rng = np.random.default_rng(0)
    tiles = _planner.ROWS_TILE_VECTORS * _planner.vector_lanes(dtype)
    for batch in (2, 7, 2 * tiles + 3):
        others = [np.broadcast_to(b, (batch, 300)).copy() for b in (lower, diag, upper, rhs)]
        for b in others:
            b *= rng.uniform(0.5, 1.5, b.shape).astype(dtype)
        at = batch // 2
        for b, mine in zip(others, (lower, diag, upper, rhs), strict=True):
            b[at] = mine[0]
        for axis in (-1, 0):
            args = [jnp.asarray(b if axis == -1 else b.T) for b in others]
            x = np.asarray(tridiax.solve_tridiagonal(*args, axis=axis))
            np.testing.assert_array_equal(x[at] if axis == -1 else x[:, at], alone,
                                          err_msg=f"batch {batch}, axis {axis}")


# ---------------------------------------------------------------------------------------------
# Every backend, whole systems: within SWEEP_FACTOR of the sweep's error.


@pytest.mark.parametrize("dtype", [*REAL, np.complex64, np.complex128], ids=dtype_id)
@pytest.mark.parametrize("backend", backends())
def test_every_backend_near_the_sweep(backend, dtype):
    if backend not in backends(dtype):
        pytest.skip(f"{backend} does not run {np.dtype(dtype).name}")
    complex_dtype = np.issubdtype(dtype, np.complexfloating)
    systems = ("schrodinger",) if complex_dtype else REAL_SYSTEMS
    for system in systems:
        for layout in ("rows", "columns"):
            for n in (33, 257):
                bands = bands_of(system, n, 5, dtype)
                x = solve_in_layout(bands, layout, dtype, backend=backend)
                assert_near_sweep(x, bands, dtype)


@pytest.mark.parametrize("dtype", REAL, ids=dtype_id)
@pytest.mark.parametrize("kind", ["pivoted", "periodic", "periodic_pivoted", "factored"])
@pytest.mark.parametrize("backend", backends())
def test_every_backend_kind_near_the_sweep(backend, kind, dtype):
    # The pivoted periodic solve combines its two pivoted sweeps in XLA (`_tridiagonal/periodic.py`),
    # whose fused multiply-adds round otherwise than the sweep written out.
    systems = PERIODIC_SYSTEMS if kind.startswith("periodic") else REAL_SYSTEMS
    for system in systems:
        bands = bands_of(system, 257, 5, dtype)
        if kind == "factored":
            op = tridiax.Tridiagonal(*(jnp.asarray(b) for b in bands[:3]))
            x = tridiax.TDMA(backend=backend).factor(op).solve(jnp.asarray(bands[3]))
            assert_near_sweep(x, bands, dtype)
        else:
            flags = dict(pivoting="pivoted" in kind, periodic=kind.startswith("periodic"))
            x = solve_in_layout(bands, "columns", dtype, backend=backend, **flags)
            assert_near_sweep(x, bands, dtype, **flags)


# ---------------------------------------------------------------------------------------------
# Chunked systems: the partition method, within SWEEP_FACTOR of the sweep's error.


def chunked_cases():
    """(backend, layout): every layout on the native kernel, whose chunk sweeps read each its
    own way; the composed sweeps of the other backends read every layout alike."""
    layouts = ("rows", "columns", "few_columns", "one")
    return [(b, layout) for b in backends()
            for layout in (layouts if b == "native" else ("few_columns", "one"))]


@pytest.mark.parametrize("dtype", REAL, ids=dtype_id)
@pytest.mark.parametrize("kind", ["thomas", "pivoted", "periodic"])
@pytest.mark.parametrize("backend, layout", chunked_cases())
def test_chunked_near_the_sweep(backend, layout, kind, dtype):
    systems = PERIODIC_SYSTEMS if kind == "periodic" else REAL_SYSTEMS
    flags = dict(pivoting=kind == "pivoted", periodic=kind == "periodic")
    batch, axis, columns = layout_of(layout, dtype)
    n, chunk = 2000, 61  # 33 chunks, the last one short
    for system in systems:
        bands = bands_of(system, n, batch, dtype)
        args = [jnp.asarray(b.T if columns else b[0] if layout == "one" else b) for b in bands]
        x = np.asarray(solve(*args, axis=axis, backend=backend, chunk=chunk, **flags))
        x = x.T if columns else x[None] if layout == "one" else x
        assert_near_sweep(x, bands, dtype, **flags)
