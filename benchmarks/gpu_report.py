"""One command for a GPU machine: tests, bandwidth per kind and backend, shapes, a tile sweep.

    python benchmarks/gpu_report.py [--out gpu_report.md] [--quick] [--skip-tests]
                                    [--all-tests] [--workers N] [--only SECTION ...]
                                    [--deadline SECONDS] [--tests-timeout SECONDS]

Written for one H100 or H200, where a machine is lent for minutes: `--deadline` skips the
sections that would start after it, and the tests stop after `--tests-timeout`. It also runs
on CPU (with --quick: small shapes, a smoke run of the script itself). It writes a markdown
report, the sections most worth a short run first:

1. the machine: device, jax and jaxlib, the backend each operation picks per dtype;
2. the shape table of bench_shapes.py (many short systems, few long ones, one very long one,
   recurrences) in float32, also written as data (`benchmarks/data/shapes_<gpu>.json` on a
   GPU, `--json` elsewhere; compare it with the cost model:
   `python benchmarks/gpu_model.py --measured FILE`), with the bandwidth reached (the bytes
   of reading every input and writing the output once, over tridiax's time) as GB/s and
   fraction of peak, and lax (associative_scan for recurrences) beside it;
3. the GPU test subset (`pytest -m "not large"` on the solve, recurrence, chunking, banded,
   block-tridiagonal, factorization, backend, GPU lowering and Mosaic GPU tests: on a GPU they
   compare Triton, Mosaic GPU and XLA with the references; `--all-tests`: the whole suite), in
   `--workers` processes, its summary line and failures (the whole log, written as the tests
   finish, beside the report: `<out>.pytest.log`);
4. bandwidth of every kind (plain, pivoted, periodic, periodic pivoted, factored solve,
   linear recurrence, IndRNN, banded, block-tridiagonal), in both layouts ((N, B) along
   axis 0 and (B, N) along the last axis), per backend that runs on the device (on CUDA:
   pallas_triton, xla and the opt-in mosaic_gpu, whose figures decide whether it becomes the
   default): time, GB/s of the bytes each call must move (inputs read once, the output
   written once), that as a fraction of the device's peak, and the ratio to a fused XLA op
   moving the same bytes (the floor); these rows go into the data file too;
5. the shape table in the other `--dtypes` (float64, with jax_enable_x64 on for it alone);
6. a Pallas tile sweep: (bp, bq) blocks on the (N, B) and (B, N) layouts.

Every figure is the minimum of repeats after a warm-up (compile time excluded), ratios taken
from this one run. The report and the data file are rewritten after every section, so a run
cut short keeps what it finished. Put the report in benchmarks/README.md, and make the defaults (PREFERENCE in
tridiax/_core/backend.py, tiles in tridiax/_pallas/tiles.py) follow it.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import signal
import subprocess
import sys
import time

import bench_banded
import bench_block
import jax
import jax.numpy as jnp
import numpy as np
from _timing import machine, row, write_rows  # benchmarks/ is on sys.path when run as a script
from bench_shapes import QUICK, SHAPES, data_rows, fmt, recurrence_problem, run_shape, solve_problem, time_best

import tridiax
from tridiax._banded.api import solve as banded_solve
from tridiax._block.api import solve as block_solve
from tridiax._core import backend as _backend
from tridiax._recurrence.api import recurrence
from tridiax._tridiagonal.api import solve

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Peak memory bandwidth (GB/s) by device kind (vendor figures), for the fraction column.
PEAK_GBS = {"H100": 3350.0, "H200": 4800.0, "A100": 2039.0, "L4": 300.0}
# First what a GPU run has shown wrong or never run (pytest-xdist hands out tests in this order,
# so a run stopped by --tests-timeout has done those): the public banded and block solves and
# factorizations on the device's default backend (their kernels' own tests run them in
# interpret mode), then each family's contract per GPU backend (test_<family>_<backend>.py),
# then the rest.
TEST_FILES = ["tests/block/test_block.py", "tests/block/test_block_operator.py",
              "tests/banded/test_banded.py",
              *(f"tests/{family}/test_{name}_{b}.py" for b in ("mosaic_gpu", "pallas_triton", "xla")
                for family, name in (("tridiagonal", "solve"), ("recurrence", "recurrence"))),
              "tests/tridiagonal/test_solve.py", "tests/recurrence/test_recurrence.py",
              "tests/tridiagonal/test_operator.py", "tests/long_systems/test_chunked.py",
              "tests/project/test_jax_private.py", "tests/gpu/test_mosaic_gpu.py",
              "tests/gpu/test_gpu_lowering.py"]
KINDS = {  # name: keyword arguments of solve, or "factored" / "recurrence" / "indrnn" / family
    "plain": {}, "pivoted": {"pivoting": True}, "periodic": {"periodic": True},
    "periodic pivoted": {"periodic": True, "pivoting": True},
    "factored solve": "factored", "linear recurrence": "recurrence", "indrnn": "indrnn",
    "banded (2, 2)": "banded", "block 2 x 2": "block",
}
BANDS = (2, 2)  # (l, u) of the banded rows
BLOCK = 2  # k of the block rows


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


def section_tests(files, workers, log, timeout_s):
    """Run the tests in `workers` processes (each allocating GPU memory as it goes, so that
    they share the device), stopped after `timeout_s`; the log, written as the tests finish
    (one line per test), goes to `log`, each failure's traceback to `<log>.failures` as it
    happens (`_pytest_failures.py`), the report gets the failures and the summary."""
    start = time.perf_counter()
    parallel = ["-n", str(workers)] if workers > 1 else []
    failures = pathlib.Path(f"{log}.failures")
    failures.unlink(missing_ok=True)
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
           "TRIDIAX_FAILURES_LOG": str(failures.resolve()),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"),
                                                        os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "pytest", "-v", "--tb=short", "-rf", "-m", "not large",
               "-p", "no:cacheprovider", "-p", "_pytest_failures", *parallel, *files]
    with open(log, "w") as stream:
        # In a session of its own, so that a timeout stops the xdist workers too (left
        # running, they would share the GPU with the timings that follow).
        tests = subprocess.Popen(command, cwd=ROOT, stdout=stream, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
        try:
            code = tests.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(tests.pid, signal.SIGKILL)
            tests.wait()
            code = f"stopped after {timeout_s:.0f} s"
    lines = [line for line in pathlib.Path(log).read_text().splitlines() if line.strip()]
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))
              or " FAILED " in line or " ERROR " in line]
    passed = sum(" PASSED " in line for line in lines)
    return [f"`pytest -v -m 'not large' {' '.join(parallel + files)}` "
            f"(exit {code}, {time.perf_counter() - start:.0f} s, {passed} passed as logged):",
            "", "```", *failed[:60], *lines[-3:], "```"]


def _call(kind, backend, axis, block=None):
    spec = KINDS[kind]
    if spec == "banded":  # solve_banded's default, partial pivoting
        return lambda ab, b: banded_solve(BANDS, ab, b, axis=axis, pivoting=True, backend=backend)
    if spec == "block":
        return lambda *a: block_solve(*a, axis=axis, pivoting=True, backend=backend)
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
    """The operands of one call, the right-hand side (or x) last."""
    spec = KINDS[kind]
    if spec in ("recurrence", "indrnn"):
        return recurrence_problem(shape, dtype)
    n, batch = shape if axis == 0 else shape[::-1]
    if spec == "banded":  # diagonally dominant, in scipy's layout (bands first)
        return list(bench_banded.problem(*BANDS, n, batch, axis, dtype))
    if spec == "block":  # block diagonally dominant
        return bench_block.problem(BLOCK, n, batch, axis, dtype)
    return solve_problem(shape, axis, dtype)


def _floor(*operands):
    """A fused XLA op that reads every operand once and writes an array of the last one's
    shape: the least time a call with these operands and that output can take. Bands and
    block columns are added slice by slice, which fuses into one elementwise loop."""
    out = operands[-1]
    for a in operands[:-1]:
        if a.shape[1:] == out.shape:  # banded: the band axis leads
            a = sum(a[i] for i in range(a.shape[0]))
        elif a.shape[:-1] == out.shape:  # block: (..., k, k) against (..., k)
            a = sum(a[..., j] for j in range(a.shape[-1]))
        out = out + a
    return out


class Problem:
    """One kind's operands in one layout, made once for every backend, and the floor's time."""

    def __init__(self, kind, shape, axis, dtype):
        self.kind, self.axis = kind, axis
        self.data = _data(kind, shape, axis, dtype)
        self.moved = sum(a.nbytes for a in self.data) + self.data[-1].nbytes  # read all, write x
        self.floor_s = time_best(_floor, self.data, budget_s=1.0)[0]

    def row(self, backend, peak, block=None):
        """(seconds, GB/s, fraction of peak, ratio to the floor, compile seconds) of a call."""
        t, compile_s, _ = time_best(_call(self.kind, backend, self.axis, block), self.data,
                                    budget_s=1.0)
        gbs = self.moved / t / 1e9
        return t, gbs, gbs / peak, t / self.floor_s, compile_s


def _op(kind) -> str:
    """The operation `_backend.unavailable` asks about for a kind."""
    spec = KINDS[kind]
    return spec if spec in ("banded", "block") else "recurrence" if spec == "indrnn" else "thomas"


def section_bandwidth(platform, backends, layouts, dtype, peak, collected=None):
    """The bandwidth table; each row also goes into `collected` (table "bandwidth")."""
    lines = ["| kind | layout | backend | ms | GB/s | of peak | / floor | compile s |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    times = {}  # (kind, layout, backend): seconds
    for kind in KINDS:
        for label, shape, axis in layouts:
            problem = None
            for backend in backends:
                if _backend.unavailable(backend, jnp.dtype(dtype), platform=platform, op=_op(kind),
                                        activation=jax.nn.relu if kind == "indrnn" else None):
                    continue
                try:
                    problem = problem or Problem(kind, shape, axis, dtype)
                    t, gbs, frac, ratio, c = problem.row(backend, peak)
                except Exception as err:  # noqa: BLE001 - a report records failures and goes on
                    lines.append(f"| {kind} | {label} | {backend} | failed: "
                                 f"{type(err).__name__}: {str(err)[:120]} | | | | |")
                    continue
                times[kind, label, backend] = t
                if collected is not None:
                    collected.append(row("bandwidth", f"{kind}, {label}", backend, shape=list(shape),
                                         axis=axis, dtype=dtype, ms=t * 1e3, compile_s=c,
                                         ratio=ratio, ratio_to="floor", gbs=gbs))
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
        problem = Problem("plain", shape, axis, "float32")
        for block in ((1, 32), (1, 64), (1, 128), (2, 64), (4, 32), (32, 1), (64, 1), (128, 1)):
            try:
                t, gbs, frac, _, _ = problem.row("pallas_triton", peak, block=block)
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
    parser.add_argument("--tests", nargs="+", metavar="TEST",
                        help="these test files or ids instead of the subset (a rerun of failures)")
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist processes")
    parser.add_argument("--skip-lax", action="store_true", help="leave lax out of the shapes")
    parser.add_argument("--only", nargs="+", metavar="SECTION",
                        choices=["machine", "tests", "bandwidth", "shapes", "tiles"],
                        help="these sections alone")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"],
                        help="dtypes of the shape table")
    parser.add_argument("--json", help="the shape and bandwidth tables as data (default on a GPU: "
                        "benchmarks/data/shapes_<gpu>.json)")
    parser.add_argument("--deadline", type=float, default=float("inf"),
                        help="seconds after the start past which no section starts")
    parser.add_argument("--tests-timeout", type=float, default=600.0,
                        help="seconds after which the tests are stopped")
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
    tests = args.tests or (["tests"] if args.all_tests else TEST_FILES)
    collected: list[dict] = []
    json_path = args.json or data_file(device, platform)
    log = out.with_name(out.name + ".pytest.log")
    skip_lax = args.skip_lax or platform == "cpu"

    def shapes(dtype):
        # float64 needs jax_enable_x64, for this table alone (the others pass 32-bit arrays,
        # but their helper arrays would turn 64-bit).
        with jax.enable_x64(dtype == "float64"):
            return section_shapes(args.quick, peak, skip_lax, dtype, collected)

    first, *others = args.dtypes
    sections = [
        ("machine", "Machine and backend choice", lambda: section_machine(platform)),
        (f"shapes {first}", f"Shapes, {first}", functools.partial(shapes, first)),
        ("tests", "Tests", lambda: section_tests(
            tests, args.workers, log, max(1.0, min(args.tests_timeout, deadline_left())))),
        ("bandwidth", f"Bandwidth per kind, float32 (peak {fmt(peak, '.0f')} GB/s)",
         lambda: section_bandwidth(platform, backends, layouts, "float32", peak, collected)),
        *((f"shapes {dtype}", f"Shapes, {dtype}", functools.partial(shapes, dtype))
          for dtype in others),
        ("tiles", "Pallas Triton tile sweep, plain solve, float32",
         lambda: section_tiles(layouts, peak)),
    ]

    def deadline_left():
        return args.deadline - (time.perf_counter() - start)

    wanted = {name for name, _, _ in sections
              if not args.only or name.split()[0] in args.only}
    wanted -= {"tests"} if args.skip_tests else set()
    wanted -= set() if "pallas_triton" in backends else {"tiles"}
    for name, title, build in sections:
        if name not in wanted:
            continue
        if deadline_left() <= 0:
            report += [f"## {title}", "", f"Not run: past the deadline ({args.deadline:.0f} s).", ""]
            continue
        t0 = time.perf_counter()
        body = build()
        report += [f"## {title}", "", *body, "", f"({time.perf_counter() - t0:.0f} s)", ""]
        print("\n".join(report[-len(body) - 5:]), flush=True)
        out.write_text("\n".join(report) + "\n")  # what is done survives a run cut short
        if collected and json_path:
            write_rows(json_path, collected, {"args": vars(args)})
    report.append(f"Total: {time.perf_counter() - start:.0f} s.")
    if collected and json_path:
        report.append(f"Shape and bandwidth tables as data: {json_path}; beside the model: "
                      f"python benchmarks/gpu_model.py --measured {json_path}")
    out.write_text("\n".join(report) + "\n")
    print(f"wrote {out} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
