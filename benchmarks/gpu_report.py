"""One command for a GPU machine: tests, bandwidth per kind and backend, shapes, a tile sweep.

    python benchmarks/gpu_report.py [--out gpu_report.md] [--quick] [--skip-tests]
                                    [--all-tests] [--workers N] [--only SECTION ...]

Written for one H100 or H200 (about 6 minutes on an H100; budget 8), it also runs on CPU
(with --quick: small shapes, a smoke run of the script itself). It writes a markdown report:

1. the machine: device, jax and jaxlib, the backend each operation picks per dtype;
2. the GPU test subset (`pytest -m "not large"` on the solve, recurrence, chunking, backend,
   GPU lowering and Mosaic GPU tests: on a GPU they compare Triton, Mosaic GPU and XLA with
   the references; `--all-tests`: the whole suite), in `--workers` processes, its summary line
   and failures (the whole log beside the report, `<out>.pytest.log`);
3. bandwidth of every kind (plain, pivoted, periodic, periodic pivoted, factored solve,
   linear recurrence, IndRNN), in both layouts ((N, B) along axis 0 and (B, N) along the last
   axis), per backend that runs on the device (on CUDA: pallas_triton, xla and the opt-in
   mosaic_gpu, whose figures decide whether it becomes the default): time, GB/s of the bytes each call must move
   (inputs read once, the output written once), that as a fraction of the device's peak, and
   the ratio to a fused XLA elementwise op moving the same bytes (the floor);
4. the shape table of bench_shapes.py (many short systems, few long ones, one very long one,
   recurrences), in float32 and float64 (`--dtypes`), also written as data
   (`benchmarks/data/shapes_<gpu>.json` on a GPU, `--json` elsewhere; compare it with the cost
   model: `python benchmarks/gpu_model.py --measured FILE`), with the bandwidth reached (the
   bytes of reading every input and writing the output once, over tridiax's time) as GB/s
   and fraction of peak, and lax (associative_scan for recurrences) beside it;
5. a Pallas tile sweep: (bp, bq) blocks on the (N, B) and (B, N) layouts.

Every figure is the minimum of repeats after a warm-up (compile time excluded), ratios taken
from this one run. The report is rewritten after every section, so a run cut short keeps what
it finished. Put the report in benchmarks/README.md, and make the defaults (PREFERENCE in
tridiax/_core/backend.py, tiles in tridiax/_pallas/tiles.py) follow it.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from _timing import machine, write_rows  # benchmarks/ is on sys.path when run as a script
from bench_shapes import QUICK, SHAPES, data_rows, fmt, recurrence_problem, run_shape, solve_problem, time_best

import tridiax
from tridiax._core import backend as _backend
from tridiax._recurrence.api import recurrence
from tridiax._tridiagonal.api import solve

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Peak memory bandwidth (GB/s) by device kind (vendor figures), for the fraction column.
PEAK_GBS = {"H100": 3350.0, "H200": 4800.0, "A100": 2039.0, "L4": 300.0}
# Each family's contract runs once per GPU backend (test_<family>_<backend>.py).
GPU_TESTED = ("pallas_triton", "mosaic_gpu", "xla")
TEST_FILES = ["tests/tridiagonal/test_solve.py", *(f"tests/tridiagonal/test_solve_{b}.py" for b in GPU_TESTED),
              "tests/recurrence/test_recurrence.py",
              *(f"tests/recurrence/test_recurrence_{b}.py" for b in GPU_TESTED),
              "tests/long_systems/test_chunked.py", "tests/project/test_jax_private.py",
              "tests/gpu/test_gpu_lowering.py", "tests/gpu/test_mosaic_gpu.py"]
KINDS = {  # name: (keyword arguments of solve, or "factored" / "recurrence" / "indrnn")
    "plain": {}, "pivoted": {"pivoting": True}, "periodic": {"periodic": True},
    "periodic pivoted": {"periodic": True, "pivoting": True},
    "factored solve": "factored", "linear recurrence": "recurrence", "indrnn": "indrnn",
}


def peak_gbs(device) -> float:
    kind = getattr(device, "device_kind", "")
    return next((v for k, v in PEAK_GBS.items() if k in kind), float("nan"))


def device_backends(platform: str) -> list[str]:
    """The backends that run on this platform: its PREFERENCE list and the opt-in ones (the
    interpret mode only tests)."""
    names = [*_backend.PREFERENCE.get(platform, ("xla",))] + ["mosaic_gpu"] * (platform == "cuda")
    return [b for b in names if _backend.unavailable(b, jnp.float32, platform=platform) is None]


def section_machine(platform):
    lines = [f"Machine: {machine()}", "",
             "| operation | dtype | backend picked |", "|---|---|---|"]
    for dtype in ("float32", "float64", "complex64", "bfloat16"):
        for op in ("thomas", "recurrence"):
            lines.append(f"| {op} | {dtype} | "
                         f"{_backend.default_backend(platform, jnp.dtype(dtype), op=op)} |")
    return lines


def section_tests(files, workers, log):
    """Run the tests in `workers` processes (each allocating GPU memory as it goes, so that
    they share the device); the whole log goes to `log`, the report gets the failures and
    the summary."""
    start = time.perf_counter()
    parallel = ["-n", str(workers)] if workers > 1 else []
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-m", "not large", "-p",
                          "no:cacheprovider", *parallel, *files], cwd=ROOT, capture_output=True,
                         text=True, env=env)
    log.write_text(out.stdout + out.stderr)
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return [f"`pytest -q -m 'not large' {' '.join(parallel + files)}` "
            f"(exit {out.returncode}, {time.perf_counter() - start:.0f} s):", "", "```",
            *failed[:60], *lines[-3:], "```"]


def _call(kind, backend, axis, block=None):
    spec = KINDS[kind]
    if spec == "recurrence":
        return lambda a, x: recurrence(a, x, axis=axis, backend=backend)
    if spec == "indrnn":
        return lambda a, x: recurrence(a, x, axis=axis, activation=jax.nn.relu, backend=backend)
    if spec == "factored":
        def factored(l, d, u, b):
            factors = tridiax.TDMA(backend=backend).factor(tridiax.Tridiagonal(l, d, u, axis=axis))
            return factors.solve(b)
        return factored
    return lambda *a: solve(*a, axis=axis, backend=backend, block=block, **spec)


def _data(kind, shape, axis, dtype):
    if KINDS[kind] in ("recurrence", "indrnn"):
        return recurrence_problem(shape, dtype)
    return solve_problem(shape, axis, dtype)


def bandwidth_row(kind, backend, shape, axis, dtype, peak, block=None):
    data = _data(kind, shape, axis, dtype)
    moved = sum(a.nbytes for a in data) + data[-1].nbytes  # read every input, write x or h
    t, compile_s, _ = time_best(_call(kind, backend, axis, block), data, budget_s=1.0)
    floor = time_best(lambda *a: sum(a[1:], a[0]), data, budget_s=1.0)[0]
    gbs = moved / t / 1e9
    return t, gbs, gbs / peak, t / floor, compile_s


def section_bandwidth(platform, backends, layouts, dtype, peak):
    lines = ["| kind | layout | backend | ms | GB/s | of peak | / floor | compile s |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    times = {}  # (kind, layout, backend): seconds
    for kind in KINDS:
        for label, shape, axis in layouts:
            for backend in backends:
                if _backend.unavailable(backend, jnp.dtype(dtype), platform=platform,
                                        op="recurrence" if kind == "indrnn" else "thomas",
                                        activation=jax.nn.relu if kind == "indrnn" else None):
                    continue
                try:
                    t, gbs, frac, ratio, c = bandwidth_row(kind, backend, shape, axis, dtype, peak)
                except Exception as err:  # noqa: BLE001 - a report records failures and goes on
                    lines.append(f"| {kind} | {label} | {backend} | failed: "
                                 f"{type(err).__name__}: {str(err)[:120]} | | | | |")
                    continue
                times[kind, label, backend] = t
                lines.append(f"| {kind} | {label} | {backend} | {t * 1e3:.3f} | {gbs:.0f} | "
                             f"{fmt(frac * 100, '.0f')}% | {ratio:.2f}x | {c:.2f} |")
    return lines + ["", *_mosaic_verdict(times)]


def _mosaic_verdict(times):
    """Where mosaic_gpu is at least as fast as pallas_triton (the rule for making it the
    default in _backend.PREFERENCE)."""
    pairs = [(key[:2], times[key], times.get((*key[:2], "mosaic_gpu")))
             for key in times if key[2] == "pallas_triton"]
    pairs = [(where, triton, mosaic) for where, triton, mosaic in pairs if mosaic is not None]
    if not pairs:
        return []
    wins = [f"{kind}, {layout}" for (kind, layout), triton, mosaic in pairs if mosaic <= triton]
    ratios = "; ".join(f"{kind} / {layout}: {triton / mosaic:.2f}x"
                       for (kind, layout), triton, mosaic in pairs)
    return [f"**mosaic_gpu at least as fast as pallas_triton on {len(wins)} of {len(pairs)} "
            f"rows** (Triton time / Mosaic time: {ratios})."]


def section_shapes(quick, peak, skip_lax, dtype="float32", collected=None):
    """The shape table in `dtype`; each shape's data rows (bench_shapes.data_rows) are added
    to `collected`."""
    lines = ["| data | tridiax ms | GB/s | of peak | floor ms | tridiax / floor | fwd+grad / fwd "
             "| lax / tridiax | err |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    itemsize = np.dtype(dtype).itemsize
    for label, shape, axis, op in SHAPES:
        shape = QUICK.get(shape, shape) if quick else shape
        try:
            r = run_shape(label, shape, axis, op, dtype, skip_lax=skip_lax)
        except Exception as err:  # noqa: BLE001 - a report records failures and goes on
            lines.append(f"| {label} | failed: {type(err).__name__}: {str(err)[:120]} "
                         "| | | | | | | |")
            continue
        if collected is not None:
            collected.extend(data_rows(r))
        # Every input read once and the output written once: 4 + 1 arrays (solve), 2 + 1.
        moved = (5 if op == "solve" else 3) * itemsize * int(np.prod(shape))
        gbs = moved / (r.tridiax_ms * 1e-3) / 1e9
        lines.append(f"| {label} {'(quick: ' + str(shape) + ')' if quick else ''} | "
                     f"{r.tridiax_ms:.3f} | {gbs:.0f} | {fmt(gbs / peak * 100, '.0f')}{'%' * (peak == peak)} | "
                     f"{r.floor_ms:.3f} | {r.vs_floor:.2f}x | {r.grad_vs_fwd:.2f}x | "
                     f"{fmt(r.lax_ms / r.tridiax_ms, '.2f')}{'x' * (r.lax_ms == r.lax_ms)} | {r.error:.0e} |")
    return lines


def data_file(device, platform: str) -> pathlib.Path | None:
    """Where a GPU run's shape table goes: benchmarks/data/shapes_<gpu>.json (h100, h200, ...;
    None on CPU, whose tables bench_shapes.py writes)."""
    if platform not in ("cuda", "rocm"):
        return None
    kind = getattr(device, "device_kind", "")
    name = next((k.lower() for k in PEAK_GBS if k in kind), "gpu")
    return ROOT / "benchmarks" / "data" / f"shapes_{name}.json"


def section_tiles(layouts, peak):
    lines = ["| layout | block (bp, bq) | ms | GB/s | of peak |", "|---|---|---:|---:|---:|"]
    for label, shape, axis in layouts:
        for block in ((1, 32), (1, 64), (1, 128), (2, 64), (4, 32), (32, 1), (64, 1), (128, 1)):
            try:
                t, gbs, frac, _, _ = bandwidth_row("plain", "pallas_triton", shape, axis,
                                                   "float32", peak, block=block)
            except Exception as err:  # noqa: BLE001
                lines.append(f"| {label} | {block} | failed: {type(err).__name__} | | |")
                continue
            lines.append(f"| {label} | {block} | {t * 1e3:.3f} | {gbs:.0f} | "
                         f"{fmt(frac * 100, '.0f')}% |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_report.md")
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--all-tests", action="store_true", help="the whole suite, not the subset")
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist processes")
    parser.add_argument("--skip-lax", action="store_true", help="leave lax out of the shapes")
    parser.add_argument("--only", nargs="+", metavar="SECTION",
                        choices=["machine", "tests", "bandwidth", "shapes", "tiles"],
                        help="these sections alone")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"],
                        help="dtypes of the shape table")
    parser.add_argument("--json", help="the shape table as data (default on a GPU: "
                        "benchmarks/data/shapes_<gpu>.json)")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    start = time.perf_counter()
    device = jax.devices()[0]
    platform = _backend.device_platform(device)
    peak = peak_gbs(device)
    n, b = (100, 4096) if args.quick else (1000, 132 * 512)
    layouts = [(f"(N, B) = ({n}, {b}), axis 0", (n, b), 0),
               (f"(B, N) = ({b}, {n}), axis -1", (b, n), -1)]
    backends = device_backends(platform)
    report = [f"# tridiax GPU report ({time.strftime('%Y-%m-%d')})", ""]
    tests = ["tests"] if args.all_tests else TEST_FILES
    collected: list[dict] = []
    json_path = args.json or data_file(device, platform)
    log = out.with_name(out.name + ".pytest.log")
    sections = [
        ("machine", "Machine and backend choice", lambda: section_machine(platform)),
        ("tests", "Tests", lambda: section_tests(tests, args.workers, log)),
        ("bandwidth", f"Bandwidth per kind, float32 (peak {fmt(peak, '.0f')} GB/s)",
         lambda: section_bandwidth(platform, backends, layouts, "float32", peak)),
        *((f"shapes {dtype}", f"Shapes, {dtype}",
           functools.partial(section_shapes, args.quick, peak, args.skip_lax or platform == "cpu",
                             dtype, collected)) for dtype in args.dtypes),
        ("tiles", "Pallas Triton tile sweep, plain solve, float32",
         lambda: section_tiles(layouts, peak)),
    ]
    wanted = {name for name, _, _ in sections
              if not args.only or name.split()[0] in args.only}
    wanted -= {"tests"} if args.skip_tests else set()
    wanted -= set() if "pallas_triton" in backends else {"tiles"}
    for name, title, build in sections:
        if name not in wanted:
            continue
        t0 = time.perf_counter()
        body = build()
        report += [f"## {title}", "", *body, "", f"({time.perf_counter() - t0:.0f} s)", ""]
        print("\n".join(report[-len(body) - 5:]), flush=True)
        out.write_text("\n".join(report) + "\n")  # what is done survives a run cut short
        if name.startswith("shapes") and collected and json_path:
            write_rows(json_path, collected, {"args": vars(args)})
    report.append(f"Total: {time.perf_counter() - start:.0f} s.")
    if collected and json_path:
        report.append(f"Shape table as data: {json_path}; beside the model: "
                      f"python benchmarks/gpu_model.py --measured {json_path}")
    out.write_text("\n".join(report) + "\n")
    print(f"wrote {out} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
