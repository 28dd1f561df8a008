"""Accuracy of every plan against the plain sequential sweep, on the systems PDE users solve.

For each system (tests/support/helpers.py, `pde_bands`: Poisson, a nearly singular Poisson problem,
implicit heat steps with r = 1 to 1e4, upwind advection-diffusion, uneven splines, a complex
Crank-Nicolson step, periodic rings), size, dtype, layout and kind, this prints

- `sweep`: the relative error of `tridiax.verify.sequential_solve` in the same dtype (the
  Thomas sweep dividing by each pivot, row after row; gtsv's order with pivoting), and
- `ratio`: tridiax's relative error over the sweep's, for each backend,

both against the exact answer of the same (rounded) bands: the sequential sweep in a wider
precision (float64 for float32, 80-bit long double for float64). A ratio of 1.00 with `=`
means bitwise equal to the sweep. The plan column says what the native backend's planner
chose: `whole` (every system swept in one lane; `tile` the C++ tile) or `chunks of m`
(the partition method). At the end: the worst ratio per plan, dtype and backend.

Measuring against the exact answer matters: LAPACK's gtsv and the sweep make almost the same
roundings, so an error measured against LAPACK flatters the sweep on nearly singular systems.

    python benchmarks/bench_accuracy.py            # every case (a few minutes)
    python benchmarks/bench_accuracy.py --quick    # small sizes only
    python benchmarks/bench_accuracy.py --json benchmarks/data/accuracy_cpu.json
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# Four host devices for the sharded partition method (set before jax starts).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _timing import add_json_option, machine, row, write_rows  # noqa: E402  benchmarks/ on sys.path
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from helpers import (  # noqa: E402  tests/support/helpers.py: the systems and the error measure
    PDE_SYSTEMS,
    PERIODIC_SYSTEMS,
    pde_bands,
    pde_rhs,
    relative_error,
    truth_dtype,
)

import tridiax  # noqa: E402
from tridiax import verify  # noqa: E402
from tridiax._core import backend as _backend  # noqa: E402
from tridiax._core import planner as _planner
from tridiax._tridiagonal.api import solve  # noqa: E402

jax.config.update("jax_enable_x64", True)

# (layout, batch): how the systems lie. "rows": (batch, n) along the last axis (batch-first);
# "columns": (n, batch) along axis 0; "one": a single system.
LAYOUTS = {"rows": -1, "columns": 0, "one": -1}


def arrange(a, layout):
    return a.T if layout == "columns" else a[0] if layout == "one" else a


def transposed_bands(lower, upper):
    """Bands of A^T along the last axis: lower_T[i] = upper[i-1], upper_T[i] = lower[i+1]."""
    lower_t, upper_t = np.zeros_like(lower), np.zeros_like(upper)
    lower_t[..., 1:], upper_t[..., :-1] = upper[..., :-1], lower[..., 1:]
    return lower_t, upper_t


def plan_label(kind, shape, axis, dtype):
    """What the native planner does with these systems."""
    if kind in ("factored", "sharded"):
        return kind
    axis = axis % len(shape)
    P_ = int(np.prod(shape[:axis], dtype=int))
    Q = int(np.prod(shape[axis + 1:], dtype=int))
    base = {"transposed": "thomas", "periodic_pivoted": "pivoted"}.get(kind, kind)
    plan = _planner.solve_plan("native", "cpu", P_, shape[axis], Q, jnp.dtype(dtype), kind=base)
    t = plan.tiling
    where = f"chunks of {plan.chunk}" if plan.chunk else "whole"
    return f"{where}, tile {t.lanes}{t.width}"


def tridiax_solve(kind, backend, lower, diag, upper, rhs, axis):
    """tridiax's answer for `kind` with `backend` (arrays already in the dtype and layout)."""
    args = [jnp.asarray(a) for a in (lower, diag, upper, rhs)]
    if kind in ("thomas", "pivoted", "periodic", "periodic_pivoted"):
        return solve(*args, axis=axis, backend=backend, pivoting="pivoted" in kind,
                     periodic=kind.startswith("periodic"))
    if kind == "factored":
        op = tridiax.Tridiagonal(*args[:3], axis=axis)
        return tridiax.TDMA(backend=backend).factor(op).solve(args[3])
    if kind == "transposed":  # the gradient's solve: b_bar = A^{-T} x_bar
        _, vjp = jax.vjp(lambda b: solve(*args[:3], b, axis=axis, backend=backend), args[3])
        return vjp(args[3])[0]
    if kind == "sharded":  # rows split over 4 devices: the partition method across devices
        mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
        spec = [None] * args[3].ndim
        spec[axis] = "x"
        sharded = [jax.device_put(a, NamedSharding(mesh, P(*spec))) for a in args]
        return jax.jit(lambda *a: tridiax.solve_tridiagonal(*a, axis=axis))(*sharded)
    raise ValueError(kind)


def reference(kind, lower, diag, upper, rhs, dtype):
    """The sequential sweep of the same problem in `dtype` (bands (batch, n), last axis)."""
    if kind == "transposed":
        lower, upper = transposed_bands(lower, upper)
    return verify.sequential_solve(lower, diag, upper, rhs, dtype=dtype,
                                   periodic=kind.startswith("periodic"),
                                   pivoting="pivoted" in kind)


def cases(quick: bool):
    """(kind, system, n, layout, batch) to measure."""
    small = (32, 1000) if quick else (32, 1000, 10_000)
    out = []
    for system in PDE_SYSTEMS:
        for n in small:
            out += [("thomas", system, n, "rows", 64), ("thomas", system, n, "columns", 64),
                    ("thomas", system, n, "columns", 4), ("thomas", system, n, "one", 1)]
        out += [("pivoted", system, 1000, "rows", 64), ("factored", system, 1000, "rows", 16),
                ("transposed", system, 1000, "columns", 64)]
        if not quick:
            out += [("thomas", system, 100_000, "columns", 64),
                    ("thomas", system, 100_000, "rows", 4),
                    ("thomas", system, 1_000_000, "one", 1),
                    ("pivoted", system, 100_000, "one", 1),
                    ("transposed", system, 100_000, "one", 1),
                    ("sharded", system, 10_000, "columns", 8)]
    for system in PERIODIC_SYSTEMS:
        for n in small:
            out += [("periodic", system, n, "rows", 64), ("periodic", system, n, "columns", 4)]
        out += [("periodic_pivoted", system, 1000, "rows", 16)]
        if not quick:
            out += [("periodic", system, 100_000, "one", 1)]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--backends", nargs="+", default=["native", "xla"],
                        help="backends to measure (pallas_interpret is slow past N = 1000)")
    add_json_option(parser)
    args = parser.parse_args()
    print(machine())
    rows, worst = [], {}
    head = (f"{'kind':17s}{'system':17s}{'n':>8s} {'layout':8s}{'dtype':11s}{'plan':22s}"
            f"{'sweep':>9s}" + "".join(f"{b:>18s}" for b in args.backends))
    print(head)
    for kind, system, n, layout, batch in cases(args.quick):
        if kind == "sharded" and jax.device_count() < 4:
            continue
        lower, diag, upper = pde_bands(system, n, batch)
        complex_system = np.iscomplexobj(diag)
        dtypes = (np.complex64, np.complex128) if complex_system else (np.float32, np.float64)
        for dtype in dtypes:
            bands = [b.astype(dtype) for b in (lower, diag, upper)]
            rhs = pde_rhs((batch, n), dtype)
            truth = reference(kind, *bands, rhs, truth_dtype(dtype))
            sweep = reference(kind, *bands, rhs, dtype)
            sweep_error = relative_error(sweep, truth)
            axis = LAYOUTS[layout]
            plan = plan_label(kind, arrange(rhs, layout).shape, axis, dtype)
            line = (f"{kind:17s}{system:17s}{n:8d} {layout:8s}{np.dtype(dtype).name:11s}"
                    f"{plan:22s}{sweep_error:9.1e}")
            for backend in args.backends:
                too_slow = backend.endswith("_interpret") and n * batch > 100_000
                if too_slow or _backend.unavailable(backend, dtype) is not None:
                    line += f"{'-':>18s}"  # interpreted and large, or a dtype it cannot take
                    continue
                x = tridiax_solve(kind, backend, *(arrange(b, layout) for b in bands),
                                  arrange(rhs, layout), axis)
                x = np.asarray(x)
                x = x.T if layout == "columns" else x[None] if layout == "one" else x
                error = relative_error(x, truth)
                ratio = error / sweep_error
                same = np.array_equal(x, sweep)
                line += f"{ratio:16.2f}{'=' if same else ' '} "
                key = (plan.split(",")[0] if kind == "thomas" else kind, np.dtype(dtype).name,
                       backend)
                worst[key] = max(worst.get(key, 0.0), ratio)
                rows.append(row(table="accuracy", case=f"{kind} {system} n={n} {layout}",
                                shape=list(arrange(rhs, layout).shape), axis=axis,
                                dtype=np.dtype(dtype).name, method=backend, grad=False, ms=None,
                                error=error, kind=kind, system=system, plan=plan,
                                sweep_error=sweep_error, error_ratio=ratio, bitwise=bool(same)))
            print(line, flush=True)
    print("\nWorst ratio to the sequential sweep's error, per plan, dtype and backend:")
    for (plan, dtype, backend), ratio in sorted(worst.items()):
        print(f"  {plan:22s}{dtype:11s}{backend:18s}{ratio:8.2f}")
    if args.json:
        write_rows(args.json, rows, {"args": vars(args)})


if __name__ == "__main__":
    main()
