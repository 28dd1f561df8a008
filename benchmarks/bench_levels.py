"""The shape table once per build of the native CPU kernels, side by side: each x86-64 level
(pinned with TRIDIAX_CPU_LEVEL) and this CPU's own build (TRIDIAX_NATIVE=build, -march=native);
`native-O2` is this CPU's own build compiled at -O2 instead of -O3 (what the optimization level
is worth).

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/bench_levels.py [--levels x86-64-v3 native]
        [--dtype float32] [--only SUBSTRING ...] [--quick] [--rounds 1] [--json FILE]

Each build runs `bench_shapes.py --skip-lax` in a process of its own (which checks the answers
against the references before timing them); with --rounds 2 the builds take turns twice and
the minimum of the rounds is kept, so that a noisy minute does not fall on one build. An
installed tridiax runs its installed levels; a source tree builds each level on first use
(cached, a few minutes each the first time). The table gives, per shape, the forward time of
each build relative to the fused floor measured in the same process, and the forward time of
each build over the best build's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))  # a source tree's tridiax, where it is not installed

from tridiax._native import build, compiler  # noqa: E402

NATIVE = compiler.NATIVE
NATIVE_O2 = "native-O2"
# bench_shapes.py in a process whose first-use build compiles at -O2.
AT_O2 = ("import runpy, sys; from tridiax._native import compiler; compiler._OPTIMIZATION = '-O2'; "
         "sys.path.insert(0, {here!r}); sys.argv = sys.argv[1:]; "
         "runpy.run_path(sys.argv[0], run_name='__main__')")


def runnable_levels() -> list[str]:
    """The x86-64 levels this CPU runs (installed ones where tridiax is installed), and native."""
    if not build.available():
        raise SystemExit(f"the native kernels are unavailable: {build.unavailable_reason()}")
    runs = build.cpu_level(build.library_path())
    installed = build.manifest()
    levels = sorted(installed["built"]) if installed else list(compiler.LEVELS)
    return [level for level in levels if int(level[-1]) <= runs] + [NATIVE]


def run_shapes(level: str, args, out: Path) -> dict:
    env = dict(os.environ)
    if level in (NATIVE, NATIVE_O2):
        env.update(TRIDIAX_NATIVE="build")
        env.pop("TRIDIAX_CPU_LEVEL", None)
    else:
        env.update(TRIDIAX_CPU_LEVEL=level)
    python = [sys.executable, *(["-c", AT_O2.format(here=str(HERE))] if level == NATIVE_O2 else [])]
    cmd = [*python, str(HERE / "bench_shapes.py"), "--skip-lax", "--dtype", *args.dtype,
           "--json", str(out), *(["--quick"] if args.quick else []),
           *(["--only", *args.only] if args.only else [])]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", nargs="+", default=None, help="builds to compare (default: all)")
    parser.add_argument("--dtype", nargs="+", default=["float32"])
    parser.add_argument("--only", nargs="+", default=None, help="only shapes whose label contains these")
    parser.add_argument("--quick", action="store_true", help="bench_shapes --quick: 100x smaller shapes")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", default=None, help="write every build's rows as one data file")
    args = parser.parse_args()
    levels = args.levels or runnable_levels()

    best: dict[tuple, dict] = {}  # (level, case, dtype, grad) -> the row with the smallest ms
    floors: dict[tuple, float] = {}
    cases: dict[tuple, None] = {}  # (case, dtype, grad) in the order bench_shapes prints them
    meta = None
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for level in levels:
                data = run_shapes(level, args, Path(tmp) / f"{level}-{round_}.json")
                meta = meta or data["meta"]
                for row in data["rows"]:
                    key = (row["case"], row["dtype"], row["grad"])
                    cases.setdefault(key)
                    if row["method"] == "floor":
                        floors[key] = min(floors.get(key, float("inf")), row["ms"])
                    elif row["method"] == "tridiax" and row["ms"] is not None:
                        mine = best.get((level, *key))
                        if mine is None or row["ms"] < mine["ms"]:
                            best[(level, *key)] = dict(row, build=level)

    print(f"machine: {meta['machine']}; builds: {', '.join(levels)}; minimum of {args.rounds} round(s)")
    header = "| case | dtype | pass | floor ms | " + " | ".join(f"{level} / floor" for level in levels)
    print(header + " | " + " | ".join(f"{level} / best" for level in levels) + " |")
    print("|---|---|---|---:|" + "---:|" * (2 * len(levels)))
    rows_out = []
    for case, dtype, grad in cases:
        if not any((level, case, dtype, grad) in best for level in levels):
            continue
        times = {level: best.get((level, case, dtype, grad), {}).get("ms") for level in levels}
        floor = floors.get((case, dtype, False))
        fastest = min(t for t in times.values() if t is not None)
        cells = [f"{t / floor:.2f}x" if t and floor else "-" for t in times.values()]
        cells += [f"{t / fastest:.2f}" if t else "-" for t in times.values()]
        print(f"| {case} | {dtype} | {'fwd+grad' if grad else 'fwd'} | {floor:.2f} | " + " | ".join(cells) + " |")
        for level, ms in times.items():
            if ms is not None:
                rows_out.append(dict(best[(level, case, dtype, grad)], floor_ms=floor,
                                     ratio_to_best=ms / fastest))
    if args.json:
        meta = dict(meta, script="benchmarks/bench_levels.py", command=" ".join(sys.argv),
                    args=vars(args), builds=levels)
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows_out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
