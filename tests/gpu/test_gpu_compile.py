"""Every public entry point compiles for an H100 (sm_90a) without register spills, and wide
problems launch enough Pallas blocks to fill its 132 SMs: compiled without a GPU by `gpu_aot`.

The shapes are abstract (nothing is allocated), so problems of any size cost only their
compilation. All cases of one dtype compile in one `gpu_aot` subprocess. Without the CUDA
plugin (`python tests/support/gpu_aot.py --install`) these tests skip, unless TRIDIAX_REQUIRE_GPU_AOT
is set (as CI does), when they fail.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import pytest
from gpu_aot import compile_reports, unavailable_reason

import tridiax

SMS = 132  # streaming multiprocessors of an H100 SXM
WIDE = SMS * 128  # systems (recurrence features): one 128-thread block per SM
RAGGED = WIDE + 100  # not a multiple of any tile larger than 4: every access is masked
ROWS = 1000  # rows of each system (time steps of each recurrence)


def _require_harness():
    if reason := unavailable_reason():
        if os.environ.get("TRIDIAX_REQUIRE_GPU_AOT", "") not in ("", "0"):
            pytest.fail(f"TRIDIAX_REQUIRE_GPU_AOT is set but deviceless GPU compilation cannot run: {reason}")
        pytest.skip(reason)


# --- entry points: entry_point(name, axis) is a function of the arrays `arity(name)` says ------


def _loss(f):
    return lambda *a: jnp.sum(jnp.abs(f(*a)) ** 2)  # real for complex systems too


def _solver(kind, axis):
    periodic, pivoting = "periodic" in kind, "pivot" in kind
    solve = tridiax.solve_periodic_tridiagonal if periodic else tridiax.solve_tridiagonal
    return lambda *a: solve(*a, axis=axis, pivoting=pivoting)


def _vmapped(f, axis):
    # A single system per call, batched by vmap along the other axis of the 2-D layout.
    batch = 1 if axis in (0, -2) else 0
    return jax.vmap(lambda *a: f(*a), in_axes=batch, out_axes=batch)


SOLVE_KINDS = ("plain", "pivoting", "periodic", "periodic pivoting")


def entry_point(name: str, axis: int):
    """The function named `name` on 2-D arrays whose systems (sequences) lie along `axis`."""
    kind, _, transform = name.partition(" / ")
    if kind in SOLVE_KINDS:
        f = _solver(kind, axis)
        if transform == "":
            return f
        if transform == "grad":
            return jax.grad(_loss(f), argnums=(0, 1, 2, 3))
        if transform == "jvp":
            return lambda *a: jax.jvp(f, a, a)[1]
        if transform == "vmap":
            return _vmapped(_solver(kind, 0), axis)
    if kind == "factor":
        return lambda l, d, u: tridiax.Tridiagonal(l, d, u, axis=axis).factor()
    if kind == "factored solve":
        f = lambda l, d, u, b: tridiax.Tridiagonal(l, d, u, axis=axis).factor().solve(b)  # noqa: E731
        return f if transform == "" else jax.grad(_loss(f), argnums=(0, 1, 2, 3))
    if kind in ("linear_recurrence", "linear_recurrence reverse"):
        f = lambda a, x: tridiax.linear_recurrence(a, x, axis=axis, reverse="reverse" in kind)  # noqa: E731
        return f if transform == "" else jax.grad(_loss(f), argnums=(0, 1))
    if kind == "indrnn":
        f = lambda w, z: tridiax.indrnn(w, z, axis=axis)  # noqa: E731
        return f if transform == "" else jax.grad(_loss(f), argnums=(0, 1))
    raise ValueError(name)


ENTRY_POINTS = (
    *(f"{kind}{t}" for kind in SOLVE_KINDS for t in ("", " / grad", " / jvp", " / vmap")),
    "factor", "factored solve", "factored solve / grad",
    "linear_recurrence", "linear_recurrence reverse", "linear_recurrence / grad", "indrnn", "indrnn / grad",
)


def arity(name: str) -> int:
    if name.startswith(("linear_recurrence", "indrnn")):
        return 2
    return 3 if name == "factor" else 4


def _shape(systems: int, rows: int, axis: int) -> tuple[int, int]:
    return (rows, systems) if axis == 0 else (systems, rows)


def _cases(dtype: str, systems: int, rows: int = ROWS, names=ENTRY_POINTS, axes=(0, -1)):
    return {f"{name} axis={axis} {_shape(systems, rows, axis)} {dtype}":
            (f"test_gpu_compile:entry_point({name!r}, {axis})", [(_shape(systems, rows, axis), dtype)] * arity(name))
            for name in names for axis in axes}


XLA_COMPLEX128_SPILL = 8  # bytes (see the spill check)
# Complex systems run the same Pallas kernels on real and imaginary parts; IndRNN is real.
COMPLEX_ENTRY_POINTS = tuple(name for name in ENTRY_POINTS if not name.startswith("indrnn"))


@functools.cache
def _compiled(dtype: str):
    """Every entry point, both layouts, on WIDE systems (tiles fit: no masks) and on RAGGED ones
    (every access masked), compiled in one subprocess."""
    names = COMPLEX_ENTRY_POINTS if dtype.startswith("complex") else ENTRY_POINTS
    cases = {**_cases(dtype, WIDE, names=names), **_cases(dtype, RAGGED, names=names)}
    return compile_reports(cases, x64=dtype in ("float64", "complex128"))


def _errors(reports):
    errors = {case: r.error for case, r in reports.items() if r.error}
    return "\n\n".join(f"{case}:\n{e}" for case, e in errors.items())


def _few_blocks(reports):
    return [f"{case}: {k}" for case, r in reports.items() for k in r.kernels
            if k.origin == "pallas_triton" and k.blocks < SMS]


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
def test_entry_points_compile_without_spills_and_fill_the_device(dtype):
    # One test per dtype, so that its cases compile once (pytest-xdist runs tests of one module
    # on different workers, which share no cache).
    _require_harness()
    reports = _compiled(dtype)
    assert not _errors(reports), _errors(reports)
    problems = []
    for case, r in reports.items():
        pallas = [k for k in r.kernels if k.origin == "pallas_triton"]
        if not pallas:  # factor() included: a kernel, not an XLA loop over the rows
            problems.append(f"{case}: no Pallas kernel; kernels: {[k.name for k in r.kernels]}")
        for k in r.kernels:
            # XLA's own elementwise fusions of complex128 gradients (complex products of
            # shifted slices, the band cotangents) spill 8 bytes: XLA's register choice,
            # bounded here; tridiax's kernels must not spill at all.
            allowed = XLA_COMPLEX128_SPILL if k.origin == "xla" and dtype == "complex128" else 0
            if max(k.spill_store_bytes or 0, k.spill_load_bytes or 0) > allowed:
                problems.append(f"{case}: spills registers: {k}")
        for k in pallas:
            if k.registers is None or k.arch != "sm_90a":
                problems.append(f"{case}: ptxas did not report the kernel for sm_90a: {k}")
    # Launches of >= 132 x 128 systems (features), in both layouts: a block for every SM.
    problems += [f"fewer than {SMS} blocks: {line}" for line in _few_blocks(reports)]
    assert not problems, "\n".join(problems)


def test_few_long_systems_fill_the_device():
    # 2 048 systems of 10^5 rows (64 features of 10^6 steps): 32 blocks (one) unless the rows
    # are split into chunks, pivoted ones too. The chunk sweeps (each chunk a system of one batch) must fill the
    # SMs; the reduced systems in between (one row per chunk, 1/m of the work) may launch
    # fewer blocks. (Fewer plain systems than that go to cuSPARSE: the test below.)
    _require_harness()
    reports = compile_reports(_long_cases())
    assert not _errors(reports), _errors(reports)
    for case, r in reports.items():
        pallas = [k for k in r.kernels if k.origin == "pallas_triton"]
        # tridiax's kernels; XLA's own concatenate fusion around the chunks spills 8 B along
        # axis -1 (XLA's register choice, not a tridiax kernel).
        assert not [k for k in pallas if k.spill_store_bytes or k.spill_load_bytes], case
        full = [k for k in pallas if k.blocks >= SMS]
        # At least the two sweeps of a solve (ends, fix-up) or of a recurrence (ends, rerun)
        # over every chunk fill the device, the largest several times over.
        assert len(full) >= 2, f"{case}: " + ", ".join(str(k) for k in pallas)
        assert max(k.blocks for k in pallas) >= 4 * SMS, case


def _long_cases():
    return {**_cases("float32", 2048, 10**5, names=("plain", "plain / grad", "pivoting")),
            **_cases("float32", 64, 10**6, names=("linear_recurrence",), axes=(0,))}


def test_few_long_plain_systems_compile_to_cusparse():
    # 64 systems of 10^6 rows and one of 10^7: cuSPARSE's gtsv2 (the planner's gpu_library),
    # forward and gradient, in both layouts; no Pallas kernel, nothing spills.
    _require_harness()
    cases = {**_cases("float32", 64, 10**6, names=("plain", "plain / grad")),
             "one system of 10^7 rows": ("tridiax:lambda *a: solve_tridiagonal(*a)",
                                         [((10**7,), "float32")] * 4)}
    reports = compile_reports(cases)
    assert not _errors(reports), _errors(reports)
    for case, r in reports.items():
        assert not [k for k in r.kernels if k.origin == "pallas_triton"], (case, r.kernels)
        assert not [k for k in r.kernels if k.spill_store_bytes or k.spill_load_bytes], case


if __name__ == "__main__":  # print every kernel: python tests/gpu/test_gpu_compile.py [float32|float64|long]
    import sys
    import time

    which = sys.argv[1] if len(sys.argv) > 1 else "float32"
    start = time.perf_counter()
    if which == "long":
        reports = compile_reports(_long_cases())
    else:
        reports = _compiled(which)
    for case, r in reports.items():
        print(f"{case}:\n" + (r.error or "\n".join(f"  {k}" for k in r.kernels)))
    print(f"{len(reports)} cases in {time.perf_counter() - start:.1f} s; "
          f"compile {sum(r.compile_seconds for r in reports.values()):.1f} s")
