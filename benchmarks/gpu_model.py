"""A GPU cost model that runs without a GPU: every shape's modelled time and ratio to the floor.

    python benchmarks/gpu_model.py                  # the shape table for the code of this checkout
    python benchmarks/gpu_model.py --calibrate      # model beside the H100 run it is calibrated on
    python benchmarks/gpu_model.py --write          # both, stored in benchmarks/data/gpu_model_h100.json
    python benchmarks/gpu_model.py --measured benchmarks/data/shapes_h100.json  # beside a GPU run

Each call is compiled for an H100 without a GPU (`tests/support/gpu_aot.py`: XLA's deviceless compile,
ptxas, the thunk sequence), which lists every kernel launched with its grid, threads and
registers, the bytes of its operands and results (compiled HLO) and, for a Pallas Triton
kernel, its block specs and the tiles its Triton IR loads and stores. From these, per launch:

- **traffic**: each operand read once and each result written once; a Pallas sweep kernel that
  sweeps back (`TWO_SWEEP`) writes its work outputs in the forward sweep and reads them back in
  the backward one, and writes the solution twice (y' then x) and reads it once; an XLA fusion
  that updates a buffer in place (dynamic-update-slice) moves only the update, read and written;
- **coalescing**: each global load and store of a Pallas kernel moves a tile whose last dim (or
  its rows, for systems of one value a row) is a run of contiguous values; a run shorter than
  `FETCH_BYTES` fetches that many bytes (the row kernel on batch-first systems: one float32
  value of each system a step, 8x the bytes); `waste` = fetched / used, weighted over the
  accesses (from the block specs, one row of the block a step, where the IR was not recorded);
- **memory time**: the bytes times their waste over `STREAM` of the peak bandwidth;
- **latency time**: a sweep kernel's program steps through its rows one after another, `ROW_S`
  seconds a step (`ROW_L2_S` where the kernel's arrays fit in the L2: a reduced system); a
  step loads one row, or k rows where its tiles hold k rows (`_pallas/row_tiles.py`); the GPU holds
  `resident` programs at once (SMs times the blocks an SM fits by threads and registers), so
  `waves` = ceil(blocks / resident) rounds of steps x passes;
- the launch takes max(memory, latency) plus `LAUNCH_S`; library calls (cuSPARSE's gtsv2) take
  `LIBRARY` times the memory time of their operands and results.

The floor is the bytes a call must move (each input read once, the output written once) at
`STREAM` of the peak, plus one launch. The goal (issue: GPU shapes) is a modelled ratio of at
most 2x on every row, 1.4x on the design shapes (many systems in either layout, long
recurrences), and forward plus gradient (of sum(x**2) w.r.t. every input) at most
`GRAD_GOAL` times the forward. `--calibrate` compiles the code the H100 measured on
2026-11-24 (commit `MEASURED_COMMIT`, in a temporary worktree) and prints the model beside
those measurements; the constants above are fitted to them (`fit`). What the model does not
see: caches beyond the one rule above (the L2 holds 50 MB: a burst fetched for one row may
still be there for the next), instruction costs other than a row's dependent chain, and the
kernels of a library call.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))  # gpu_aot: the deviceless compile and its reports

import gpu_aot  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "gpu_model_h100.json"
MEASURED_COMMIT = "cc065f7436ba78bfe3aded0b741b34303c834260"

# An H100 SXM: streaming multiprocessors, peak HBM bandwidth (bytes/s), per-SM limits.
SMS = 132
PEAK_BYTES_S = 3.35e12
SM_THREADS = 2048
SM_BLOCKS = 32
SM_REGISTERS = 65536
SECTOR_BYTES = 32

# Fitted to the 2026-11-24 H100 run (`fit`; `--calibrate` prints the fit).
STREAM = 0.78  # fraction of the peak a streaming kernel reaches
ROW_S = 0.6e-6  # one row step of a sweep kernel's program, when nothing else hides it
ROW_L2_S = 0.025e-6  # the same, for a kernel whose arrays fit in the L2 (a reduced system)
L2_BYTES = 50 * 2**20
LAUNCH_S = 5e-6  # one kernel launch (not fitted)
LIBRARY = 7.0  # a library call's time over the memory time of its operands and results
# Bytes fetched for a run shorter than this (a 32-byte sector; HBM3 bursts are 64 bytes: the
# fit chooses between the two).
FETCH_BYTES = 32
# What a timed call costs beyond its kernels (dispatch and synchronization of the benchmark's
# loop): in measured times only, the floor's included, never in the ratios the goal is about.
CALL_S = 125e-6

# Pallas kernels that sweep forward and back (work outputs written, then read back).
TWO_SWEEP = ("tridiax_thomas", "tridiax_thomas_rows", "tridiax_banded", "tridiax_block")
GOAL = 2.0
DESIGN_GOAL = 1.4
GRAD_GOAL = 2.5

# The 2026-11-24 H100 run (benchmarks/data/gpu_h100.json): float32, ms of tridiax, of the
# floor, and of lax (cuSPARSE, associative_scan), per row of the shape table.
MEASURED = {
    "(N, B) = (100, 100 000)": (0.328, 0.191, 0.873),
    "(B, N) = (100 000, 100)": (2.885, 0.223, 0.837),
    "(N, B) = (10 000, 1 000)": (1.495, 0.201, 0.927),
    "(N, B) = (100 000, 64)": (1.156, 0.152, 0.624),
    "(N, B) = (1 000 000, 64)": (6.250, 0.590, 4.500),
    "(N, B) = (1 000 000, 128)": (8.811, 1.072, 8.899),
    "(B, N) = (64, 1 000 000)": (36.07, 0.575, 3.607),
    "one system, N = 10 000 000": (3.920, 0.277, 0.941),
    "recurrence (T, F) = (1 000, 100 000)": (0.901, 0.618, 1.523),
    "recurrence (F, T) = (64, 1 000 000)": (3.008, 0.431, 1.203),
    "recurrence (T, F) = (10 000 000, 1)": (0.569, 0.127, 0.393),
}


def shapes():
    """(label, shape, axis, op) of bench_shapes.py's table."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_shapes import SHAPES

    return SHAPES


def design_shape(label: str) -> bool:
    """Rows whose goal is 1.4x: many systems in either layout, long recurrences."""
    return label in ("(N, B) = (100, 100 000)", "(B, N) = (100 000, 100)",
                     "recurrence (T, F) = (1 000, 100 000)", "recurrence (F, T) = (64, 1 000 000)",
                     "recurrence (T, F) = (10 000 000, 1)")


def goal(label: str) -> float:
    return DESIGN_GOAL if design_shape(label) else GOAL


# ---------------------------------------------------------------------------------------------
# The model.


@dataclasses.dataclass(frozen=True)
class Constants:
    stream: float = STREAM
    row_s: float = ROW_S
    row_l2_s: float = ROW_L2_S
    launch_s: float = LAUNCH_S
    library: float = LIBRARY
    call_s: float = CALL_S
    fetch_bytes: int = FETCH_BYTES


@dataclasses.dataclass(frozen=True)
class Launch:
    """One modelled kernel launch (or library call)."""

    name: str
    origin: str
    blocks: int
    bytes: float  # moved, before coalescing waste
    waste: float  # bytes fetched over bytes used (1: coalesced)
    memory_s: float
    latency_s: float
    seconds: float


def run_waste(array: dict, fetch_bytes: int = FETCH_BYTES) -> float:
    """Bytes fetched per byte used when a kernel reads this array's block a row at a time:
    a row of the block is bp runs of bq values along the last (contiguous) dimension."""
    shape, block, itemsize = array["shape"], array["block"], array["itemsize"]
    if len(shape) < 2:
        return 1.0
    run = min(block[-1], shape[-1]) * itemsize if shape[-1] > 1 else itemsize
    other = math.prod(shape[:-2])
    if run >= fetch_bytes or (shape[-1] == 1 and other == 1):
        return 1.0  # whole bursts, or one system: consecutive rows share their bursts
    return fetch_bytes / run


def resident_blocks(kernel) -> int:
    """Blocks of this launch the GPU runs at once (SMs times what one SM fits)."""
    threads = max(1, kernel.threads_per_block)
    per_sm = min(SM_BLOCKS, SM_THREADS // threads)
    if kernel.registers:
        per_sm = min(per_sm, SM_REGISTERS // (kernel.registers * threads))
    return SMS * max(1, per_sm)


def kernel_stem(name: str) -> str:
    """A kernel's name without the suffix XLA gives repeated kernels ("tridiax_thomas__1")."""
    return re.sub(r"__\d+$", "", name)


def access_run(dims) -> int:
    """Contiguous values of one access tile: its last dim; a 3-D (systems, rows, 1) tile of
    arrays with one value a row (Q = 1) runs along its rows."""
    if len(dims) >= 3 and dims[-1] == 1:
        return dims[-2]
    return dims[-1]


def access_waste(accesses, fetch_bytes: int = FETCH_BYTES) -> float | None:
    """Bytes fetched per byte used over a kernel's global loads and stores (its Triton IR:
    [tile dims..., itemsize] each), weighted by the values each moves: a run shorter than a
    burst fetches the whole burst; a single value (one system's row after row) shares its
    bursts with the next rows. None when the IR was not recorded."""
    if not accesses:
        return None
    used = fetched = 0.0
    for *dims, itemsize in accesses:
        values = math.prod(dims)
        run = access_run(dims) * itemsize
        waste = 1.0 if values == 1 or run >= fetch_bytes else fetch_bytes / run
        used += values * itemsize
        fetched += values * itemsize * waste
    return fetched / used


def rows_per_step(kernel) -> int:
    """Rows a sweep kernel's program loads at once: the rows dim of its 3-D (systems, rows,
    systems) access tiles (`_pallas/row_tiles.py`); 1 for the row kernels' 2-D tiles of one row."""
    rows = [dims[-2] for *dims, _ in kernel.accesses if len(dims) >= 3]
    return max(rows) if rows else 1


def _pallas_traffic(kernel, fetch_bytes: int) -> tuple[float, float, int]:
    """(bytes moved, bytes fetched, dependent steps of one program) of a Pallas kernel."""
    two_sweep = kernel_stem(kernel.name) in TWO_SWEEP
    ir_waste = access_waste(kernel.accesses, fetch_bytes)
    moved = fetched = 0.0
    first_output = True
    rows = 0
    for array in kernel.arrays:
        size = math.prod(array["shape"]) * array["itemsize"]
        passes = 1
        if array["output"]:
            passes = (3 if first_output else 2) if two_sweep else 1
            first_output = False
        moved += passes * size
        waste = ir_waste if ir_waste is not None else run_waste(array, fetch_bytes)
        fetched += passes * size * waste
        if len(array["block"]) >= 2:
            rows = max(rows, array["block"][-2])
    steps = -(-rows // rows_per_step(kernel))
    return moved, fetched, steps * (2 if two_sweep else 1)


def model_launch(kernel, c: Constants = Constants()) -> Launch:
    if kernel.origin == "pallas_triton" and kernel.arrays:
        moved, fetched, rows = _pallas_traffic(kernel, c.fetch_bytes)
    else:
        moved = kernel.operand_bytes + kernel.result_bytes
        if "dynamic_update_slice" in kernel.name:  # in place: the update is read and written
            moved = 2 * max(0, kernel.operand_bytes - kernel.result_bytes)
        fetched, rows = moved, 0
        if kernel.origin == "mosaic_gpu":  # a sweep over its block's rows, TMA-coalesced
            rows = 0
    memory = fetched / (c.stream * PEAK_BYTES_S)
    waves = -(-kernel.blocks // resident_blocks(kernel))
    latency = waves * rows * (c.row_l2_s if moved <= L2_BYTES else c.row_s)
    return Launch(kernel.name, kernel.origin, kernel.blocks, moved, fetched / max(moved, 1),
                  memory, latency, max(memory, latency) + c.launch_s)


def model_library(call: dict, c: Constants = Constants()) -> Launch:
    moved = call["operand_bytes"] + call["result_bytes"]
    memory = c.library * moved / (c.stream * PEAK_BYTES_S)
    return Launch(call["target"], "library", 0, moved, 1.0, memory, 0.0, memory + c.launch_s)


@dataclasses.dataclass(frozen=True)
class Modelled:
    seconds: float
    floor_seconds: float
    launches: tuple[Launch, ...]

    @property
    def ratio(self) -> float:
        return self.seconds / self.floor_seconds


def floor_bytes(shape, op: str, itemsize: int) -> int:
    """Each input read once and the output written once: 5 arrays (a solve), 3 (a recurrence)."""
    return (5 if op == "solve" else 3) * math.prod(shape) * itemsize


def model_case(report, floor: int, c: Constants = Constants()) -> Modelled:
    launches = tuple(model_launch(k, c) for k in report.kernels) + tuple(
        model_library(call, c) for call in report.library_calls)
    return Modelled(sum(x.seconds for x in launches),
                    floor / (c.stream * PEAK_BYTES_S) + c.launch_s, launches)


# ---------------------------------------------------------------------------------------------
# Compiling the shapes.


def _entry(op: str, axis: int, lax: bool = False, grad: bool = False) -> str:
    if lax:  # cuSPARSE through lax.linalg, as bench_shapes.py times it (transposes included)
        return f"bench_shapes:lax_solve({axis})"
    if op == "solve":
        call, arguments = f"solve_tridiagonal(*b, axis={axis})", "(0, 1, 2, 3)"
    else:
        call, arguments = f"linear_recurrence(*b, axis={axis})", "(0, 1)"
    if grad:  # forward and the gradient of sum(x**2) w.r.t. every input, as bench_shapes.py
        return (f"tridiax:lambda *a: __import__('jax').grad(lambda *b: ({call} ** 2).sum(), "
                f"argnums={arguments})(*a)")
    return f"tridiax:lambda *b: {call}"


def compile_shapes(dtype: str = "float32", root: pathlib.Path | None = None,
                   lax: bool = False, grad: bool = False) -> dict:
    """{label: CaseReport} of every shape compiled for an H100 from the code at `root` (or,
    `lax`: the solves through lax.linalg, cuSPARSE; `grad`: forward and gradient)."""
    cases = {label: (_entry(op, axis, lax, grad), [(shape, dtype)] * (4 if op == "solve" else 2))
             for label, shape, axis, op in shapes() if op == "solve" or not lax}
    env = {"GPU_AOT_ROOT": str(root or ROOT),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"),
                                                       os.environ.get("PYTHONPATH")]))}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return gpu_aot.compile_reports(cases)
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def reports_as_data(reports: dict) -> dict:
    return {label: dataclasses.asdict(r) for label, r in reports.items()}


def reports_from_data(data: dict) -> dict:
    return {label: gpu_aot.case_report(r) for label, r in data.items()}


def model_table(reports: dict, c: Constants = Constants(), dtype_size: int = 4) -> dict:
    """{label: Modelled} (None where the case failed to compile)."""
    table = {}
    for label, shape, _, op in shapes():
        report = reports.get(label)
        if report is None or report.error:
            table[label] = None
            continue
        table[label] = model_case(report, floor_bytes(shape, op, dtype_size), c)
    return table


# ---------------------------------------------------------------------------------------------
# Calibration.


def measured_commit_reports() -> dict:
    """The shapes compiled from the code the H100 measured (a temporary worktree)."""
    with tempfile.TemporaryDirectory(prefix="tridiax_measured_") as tmp:
        tree = pathlib.Path(tmp, "tree")
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree),
                        MEASURED_COMMIT], check=True, capture_output=True)
        try:
            return compile_shapes(root=tree)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=True, capture_output=True)


def timed_ms(m: Modelled, c: Constants = Constants()) -> tuple[float, float]:
    """(tridiax, floor) as the benchmark's timed call would measure them, in ms."""
    return (m.seconds + c.call_s) * 1e3, (m.floor_seconds + c.call_s) * 1e3


def log_errors(reports: dict, c: Constants) -> dict[str, tuple[float, float]]:
    """Per measured row: log(modelled / measured) of tridiax's time and of the floor's."""
    table = model_table(reports, c)
    errors = {}
    for label, (ms, floor_ms, _) in MEASURED.items():
        if table.get(label) is not None:
            model_ms, model_floor_ms = timed_ms(table[label], c)
            errors[label] = (math.log(model_ms / ms), math.log(model_floor_ms / floor_ms))
    return errors


def fit_library(lax_reports: dict, c: Constants) -> float:
    """LIBRARY that makes the modelled cuSPARSE solves match lax's measured times (the median
    over the measured rows of measured kernel time over the model's time at LIBRARY = 1)."""
    base = dataclasses.replace(c, library=1.0)
    ratios = []
    for label, (_, _, lax_ms) in MEASURED.items():
        report = lax_reports.get(label)
        if report is None or report.error or not report.library_calls:
            continue
        m = model_case(report, 1, base)
        library_s = sum(x.seconds for x in m.launches if x.origin == "library")
        other_s = m.seconds - library_s
        ratios.append((lax_ms * 1e-3 - c.call_s - other_s) / library_s)
    ratios.sort()
    return ratios[len(ratios) // 2] if ratios else c.library


def fit(reports: dict) -> Constants:
    """The constants minimizing the squared log errors of the measured times, tridiax's and
    the floor's (a grid search); LIBRARY is `fit_library`'s."""
    best = None
    for stream, call_us, row_ns, row_l2_ns, fetch in itertools.product(
            (0.6, 0.7, 0.78, 0.85), (75, 100, 125, 150),
            (200, 300, 400, 600, 800, 1000, 1200), (25, 50, 100, 200, 400), (32, 64)):
        c = Constants(stream, row_ns * 1e-9, row_l2_ns * 1e-9, LAUNCH_S, LIBRARY,
                      call_us * 1e-6, fetch)
        err = sum(a * a + b * b for a, b in log_errors(reports, c).values())
        if best is None or err < best[0]:
            best = (err, c)
    return best[1]


# ---------------------------------------------------------------------------------------------
# Printing.


def _dominant(m: Modelled) -> str:
    top = max(m.launches, key=lambda x: x.seconds)
    bound = "latency" if top.latency_s > top.memory_s else (
        f"memory, waste {top.waste:.1f}x" if top.waste > 1.05 else "memory")
    return f"{len(m.launches)} launches; slowest {top.name} ({top.blocks} blocks, {bound})"


def print_table(reports: dict, *, measured: bool, c: Constants = Constants(),
                grad_reports: dict | None = None) -> None:
    table = model_table(reports, c)
    grads = model_table(grad_reports, c) if grad_reports else {}
    if measured:
        print("| data (float32, H100) | measured ms | modelled ms | model / measured | "
              "floor measured | floor modelled | measured / floor | modelled / floor (timed) | "
              "modelled / floor (kernels) | what the model sees |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    else:
        print("| data (float32, H100) | modelled ms | modelled / floor | goal | meets | "
              "fwd+grad / fwd | what the model sees |")
        print("|---|---:|---:|---:|---|---:|---|")
    for label, *_ in shapes():
        m = table[label]
        if m is None:
            print(f"| {label} | compile failed |")
            continue
        if measured:
            if label not in MEASURED:
                continue
            ms, floor_ms, _ = MEASURED[label]
            model_ms, model_floor_ms = timed_ms(m, c)
            print(f"| {label} | {ms:.3f} | {model_ms:.3f} | {model_ms / ms:.2f} | "
                  f"{floor_ms:.3f} | {model_floor_ms:.3f} | {ms / floor_ms:.2f}x | "
                  f"{model_ms / model_floor_ms:.2f}x | {m.ratio:.2f}x | {_dominant(m)} |")
        else:
            g = grads.get(label)
            grad = f"{g.seconds / m.seconds:.2f}x" if g is not None else "-"
            print(f"| {label} | {m.seconds * 1e3:.3f} | {m.ratio:.2f}x | {goal(label)}x | "
                  f"{'yes' if m.ratio <= goal(label) else 'no'} | {grad} | {_dominant(m)} |")


def measured_rows(path: pathlib.Path, dtype: str = "float32") -> dict[str, dict[str, float]]:
    """{case: {method: ms}} of the forward rows of a bench_shapes.py / gpu_report.py data file
    (`shapes_<gpu>.json`)."""
    rows = json.loads(pathlib.Path(path).read_text())["rows"]
    found: dict[str, dict[str, float]] = {}
    for r in rows:
        if r.get("table") == "shapes" and r["dtype"] == dtype and not r["grad"] and r["ms"]:
            found.setdefault(r["case"], {})[r["method"]] = r["ms"]
    return found


def compare(table: dict, measured: dict, c: Constants = Constants()) -> dict:
    """{case: (modelled ms, measured ms, modelled floor ms, measured floor ms)} for the rows
    both have (modelled as the benchmark times them: `timed_ms`)."""
    out = {}
    for label, m in table.items():
        row = measured.get(label, {})
        if m is not None and "tridiax" in row and "floor" in row:
            out[label] = (*timed_ms(m, c), row["tridiax"], row["floor"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calibrate", action="store_true",
                        help="model the code the H100 measured, beside the measurements")
    parser.add_argument("--write", action="store_true",
                        help=f"store both tables' compile reports and ratios in {DATA.name}")
    parser.add_argument("--measured", metavar="JSON",
                        help="a GPU run's shape table (gpu_report.py's shapes_<gpu>.json): the "
                             "model of this checkout beside it")
    args = parser.parse_args()
    data = {}
    if args.calibrate or args.write:
        measured = measured_commit_reports()
        fitted = fit(measured)
        lax_reports = compile_shapes(lax=True)
        fitted = dataclasses.replace(fitted, library=round(fit_library(lax_reports, fitted), 2))
        print(f"Calibration: the code of {MEASURED_COMMIT[:7]} against the H100 run of 2026-11-24;"
              f" fitted constants {fitted} (in use: {Constants()})\n")
        print_table(measured, measured=True, c=fitted)
        print("\ncuSPARSE (lax.linalg.tridiagonal_solve, transposes included), measured and modelled:\n")
        print("| data (float32, H100) | measured ms | modelled ms | model / measured |")
        print("|---|---:|---:|---:|")
        for label, m in model_table(lax_reports, fitted).items():
            if m is not None and label in MEASURED:
                model_ms = timed_ms(m, fitted)[0]
                print(f"| {label} | {MEASURED[label][2]:.3f} | {model_ms:.3f} | "
                      f"{model_ms / MEASURED[label][2]:.2f} |")
        print()
        data["measured_commit"] = {"commit": MEASURED_COMMIT, "measured": MEASURED,
                                   "fitted": dataclasses.asdict(fitted),
                                   "reports": reports_as_data(measured),
                                   "lax_reports": reports_as_data(lax_reports)}
    current, current_grad = compile_shapes(), compile_shapes(grad=True)
    print("This checkout:\n")
    print_table(current, measured=False, grad_reports=current_grad)
    if args.measured:
        rows = compare(model_table(current), measured_rows(args.measured))
        print(f"\nModel beside {args.measured} (ms as timed, with the fitted call overhead):\n")
        print("| data | modelled ms | measured ms | model / measured | modelled / floor | "
              "measured / floor |")
        print("|---|---:|---:|---:|---:|---:|")
        for label, (model_ms, model_floor, ms, floor) in rows.items():
            print(f"| {label} | {model_ms:.3f} | {ms:.3f} | {model_ms / ms:.2f} | "
                  f"{model_ms / model_floor:.2f}x | {ms / floor:.2f}x |")
    if args.write:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from _timing import run_meta

        data = {"meta": run_meta(args=vars(args), modelled_device="H100 SXM (deviceless)"), **data}
        table = model_table(current)
        grads = model_table(current_grad)
        data["current"] = {"reports": reports_as_data(current),
                           "grad_reports": reports_as_data(current_grad),
                           "ratio": {k: (v.ratio if v else None) for k, v in table.items()},
                           "grad_ratio": {k: (grads[k].seconds / v.seconds if v and grads[k]
                                              else None) for k, v in table.items()}}
        DATA.write_text(json.dumps(data, separators=(",", ":")) + "\n")
        print(f"\nwrote {DATA.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
