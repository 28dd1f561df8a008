"""What building the native CPU kernels costs: each source's compile (CPU seconds of one compiler
process) at -O2 and -O3, and the whole build of every x86-64 level as `pip install` runs it
(wall seconds, one compiler process per core).

    python benchmarks/bench_build.py [--levels x86-64-v2 x86-64-v3 x86-64-v4] [--json FILE]

The compiles run one at a time (so each is timed alone), then the whole build runs as
`hatch_build.py` would. Nothing is installed or cached.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))  # a source tree's tridiax, where it is not installed

from tridiax._native import compiler  # noqa: E402


def compile_seconds(source: Path, level: str, optimization: str, out: Path, cxx: str) -> float:
    """CPU seconds (user + system) of compiling `source` once."""
    flags = [optimization if flag == compiler._OPTIMIZATION else flag
             for flag in compiler.source_flags(source, level)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([cxx, *flags, "-I", str(compiler.VENDORED_INCLUDE), "-c", str(source), "-o", str(out)],
                   check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", nargs="+", default=list(compiler.LEVELS))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cxx = compiler.find_compiler()
    if cxx is None:
        raise SystemExit("no C++ compiler found (set CXX)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        print(f"compiler {cxx}, {compiler.cores()} cores; CPU seconds per source at {args.levels[-1]}")
        print("| source | -O2 s | -O3 s |")
        print("|---|---:|---:|")
        totals = {"-O2": 0.0, "-O3": 0.0}
        for source in compiler.SOURCES:
            cells = {}
            for optimization in ("-O2", "-O3"):
                seconds = compile_seconds(source, args.levels[-1], optimization, Path(tmp) / "x.o", cxx)
                cells[optimization] = seconds
                totals[optimization] += seconds
                rows.append({"table": "compile", "source": source.name, "level": args.levels[-1],
                             "optimization": optimization, "cpu_s": round(seconds, 2)})
            print(f"| {source.name} | {cells['-O2']:.1f} | {cells['-O3']:.1f} |")
        print(f"| all | {totals['-O2']:.1f} | {totals['-O3']:.1f} |")
        paths = {level: Path(tmp) / f"{level}.so" for level in args.levels}
        start = time.perf_counter()
        errors = compiler.build(paths, compiler=cxx, include_dir=compiler.VENDORED_INCLUDE)
        wall = time.perf_counter() - start
        if any(errors.values()):
            raise SystemExit(f"the build failed: {errors}")
        print(f"the whole build ({', '.join(args.levels)}, {compiler._OPTIMIZATION}) on "
              f"{compiler.cores()} cores: {wall:.0f} s wall (the notice estimates "
              f"{compiler.estimate(len(args.levels))})")
        rows.append({"table": "build", "levels": args.levels, "optimization": compiler._OPTIMIZATION,
                     "cores": compiler.cores(), "wall_s": round(wall, 1)})
    if args.json:
        import platform

        meta = {"script": "benchmarks/bench_build.py", "command": " ".join(sys.argv),
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "machine": platform.processor() or platform.machine(), "compiler": cxx,
                "compiler_version": subprocess.run([cxx, "--version"], capture_output=True,
                                                   text=True).stdout.splitlines()[0],
                "cpu_count": os.cpu_count()}
        try:
            meta["machine"] = next(line.split(":", 1)[1].strip()
                                   for line in Path("/proc/cpuinfo").read_text().splitlines()
                                   if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
