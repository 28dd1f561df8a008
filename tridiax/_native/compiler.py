"""Compiling the C++ CPU kernels into shared libraries: the sources, their flags, the x86-64
levels a package carries, the parallel compile and link.

Nothing here imports jax or the rest of tridiax: the install hook (`hatch_build.py` at the
repository's root) loads this file on its own in pip's build environment, where jax is not
installed, and `build.py` calls it to build on first use. The XLA FFI headers the sources include
come from the caller: the copy in `third_party/` at install, jaxlib's own on first use.
"""

from __future__ import annotations

import ctypes.util
import dataclasses
import os
import pathlib
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

HERE = pathlib.Path(__file__).parent
# One translation unit per kind of kernel (README.md in this folder has the map), and
# ffi.cc, which only declares the FFI handlers.
SOURCES = tuple(HERE / name for name in (
    "solve.cc", "chunks.cc", "factor.cc", "recurrence.cc", "banded.cc", "block.cc", "ffi.cc"))
# The headers the sources include: every one is hashed into a library's cache key.
HEADERS = tuple(sorted(HERE.glob("*.h")))
# The XLA FFI headers as jaxlib ships them, for builds without jax (third_party/README.md).
VENDORED_INCLUDE = HERE / "third_party"

# The x86-64 microarchitecture levels an installed package carries, baseline first: jaxlib
# itself needs AVX, so v3 (AVX2, FMA) and v4 (AVX-512) cover what it runs on, v2 the rest.
LEVELS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")
# A library built on first use for the machine it runs on.
NATIVE = "native"

# -O3: GCC 12 vectorizes at -O2 only what is very cheap (bench_levels.py measures both).
_OPTIMIZATION = "-O3"
_BLOCK_SOURCE = HERE / "block.cc"
# -ffp-contract=off: no multiply-add is fused into one rounding, so every code path (vector
# loops, scalar tails, tiles of any width) rounds each operation as the sequential sweep
# written out does, and a system gets the same answer, bit for bit, in any batch or layout.
# The block kernel fuses them (=fast) as XLA's CPU compiler does, so that its block
# eliminations round as the XLA formulation's, bit for bit. TRIDIAX_FP_CONTRACT_OFF tells the
# headers whose arithmetic must not be contracted (sweeps.h) that they may be included.
_CONTRACTION = {_BLOCK_SOURCE: ("-ffp-contract=fast",)}
# Only the FFI handlers and the built-with queries are exported (ffi.cc marks them): two levels'
# libraries in one process then share no symbol.
_COMMON = ("-std=c++17", "-fPIC", "-fvisibility=hidden", "-fvisibility-inlines-hidden")


def is_x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def arch_flags(level: str) -> tuple[str, ...]:
    """-march for `level`: an x86-64 level with generic tuning; `NATIVE`: this CPU's own
    instructions where the compiler knows them (x86-64), none elsewhere (aarch64 compilers
    take -mcpu, and their defaults run on every CPU of the architecture)."""
    if level == NATIVE:
        return ("-march=native",) if is_x86_64() else ()
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}: one of {(*LEVELS, NATIVE)}")
    return (f"-march={level}", "-mtune=generic")


def source_flags(source: pathlib.Path, level: str) -> tuple[str, ...]:
    return (_OPTIMIZATION, *arch_flags(level), *_COMMON,
            *_CONTRACTION.get(source, ("-ffp-contract=off", "-DTRIDIAX_FP_CONTRACT_OFF")))


def find_compiler() -> str | None:
    """$CXX, else c++ or g++ on PATH; None where there is none."""
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def vector_math_library() -> str | None:
    """glibc's vector math library (libmvec, glibc >= 2.35: the float64 tanh of IndRNN), by the
    name the linker takes (`libmvec.so.1`), or None where there is none."""
    if platform.system() != "Linux":
        return None
    return ctypes.util.find_library("mvec")


def cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity outside Linux
        return max(1, os.cpu_count() or 1)


# What compiling each source costs one core, in seconds, low and high: the order the sources
# are started in (longest first, so that the cores finish together) and the build notice's
# estimate. A source not listed counts as _DEFAULT_SECONDS.
SOURCE_SECONDS = {"block.cc": (14, 29), "banded.cc": (14, 27), "recurrence.cc": (7, 14),
                  "chunks.cc": (5, 10), "solve.cc": (3, 6), "ffi.cc": (3, 7),
                  "factor.cc": (2, 4)}
_DEFAULT_SECONDS = (5, 10)


def seconds(source: pathlib.Path) -> tuple[int, int]:
    return SOURCE_SECONDS.get(source.name, _DEFAULT_SECONDS)


def estimate(libraries: int = 1, cores_: int | None = None) -> str:
    """What building `libraries` libraries costs on `cores_` cores (default: those this process
    may run on), for the build notices: the sources compile as `compile_libraries` starts
    them, longest first, each on the first core to be free."""
    cores_, sources = max(1, cores_ or cores()), len(SOURCES) * libraries

    def finish(costs):
        free = [0] * cores_
        for cost in sorted(costs, reverse=True):
            free[free.index(min(free))] += cost
        return max(free)

    low, high = (finish([seconds(source)[k] for source in SOURCES] * libraries) for k in (0, 1))
    return (f"{sources} C++ compilation{'s' if sources > 1 else ''} on {cores_} "
            f"core{'s' if cores_ > 1 else ''}: about {low}-{high} s")


Progress = Callable[[int, int], None]


class BuildError(RuntimeError):
    """A compiler or linker run failed; the message holds its command's output."""


@dataclasses.dataclass(frozen=True)
class Library:
    """One library to build: where, for which level, and whether it links libmvec."""
    path: pathlib.Path
    level: str
    vector_math: str | None


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def _failure(job: subprocess.CompletedProcess) -> BuildError:
    output = (job.stderr or job.stdout or "").strip() or "(no output)"
    return BuildError(f"{job.args[0]} failed (exit status {job.returncode}): "
                      f"{' '.join(map(str, job.args[-4:]))}\n{output}")


def compile_libraries(libraries: Iterable[Library], *, compiler: str, include_dir: str | os.PathLike,
                      jobs: int | None = None, progress: Progress | None = None
                      ) -> dict[pathlib.Path, BuildError | None]:
    """Compile every source of every library, `jobs` compiler processes at once (default: one
    per core), the longest first; then link each library whose objects all compiled. Returns,
    per library path, None (built) or the error. A library is written whole or not at all.
    `progress(done, total)` is called as each compilation ends."""
    libraries = list(libraries)
    extra = ("-I", str(include_dir))
    with tempfile.TemporaryDirectory(prefix="tridiax-build-") as tmp:
        work = pathlib.Path(tmp)

        def objects(index):
            return {source: work / f"{index}-{source.stem}.o" for source in SOURCES}

        tasks = []
        for index, library in enumerate(libraries):
            defines = ("-DTRIDIAX_LIBMVEC",) if library.vector_math else ()
            for source, obj in objects(index).items():
                cmd = [compiler, *source_flags(source, library.level), *defines, *extra, "-c",
                       str(source), "-o", str(obj)]
                tasks.append((index, seconds(source)[1], cmd))
        tasks.sort(key=lambda task: -task[1])
        finished = []

        def run(task):
            job = _run(task[2])
            finished.append(task)  # list.append is atomic: the count is exact
            if progress is not None:
                progress(len(finished), len(tasks))
            return task[0], job

        with ThreadPoolExecutor(max_workers=jobs or cores()) as pool:
            done = list(pool.map(run, tasks))
        failed = {}
        for index, job in done:
            if job.returncode and index not in failed:
                failed[index] = _failure(job)
        results = {}
        for index, library in enumerate(libraries):
            if index not in failed:
                linked = work / f"{index}.so"
                cmd = [compiler, "-shared", *map(str, objects(index).values()), "-o", str(linked),
                       "-lpthread", *([f"-l:{library.vector_math}"] if library.vector_math else [])]
                job = _run(cmd)
                if job.returncode:
                    failed[index] = _failure(job)
                else:
                    library.path.parent.mkdir(parents=True, exist_ok=True)
                    staged = library.path.with_name(f".{library.path.name}.{os.getpid()}")
                    shutil.copyfile(linked, staged)
                    os.replace(staged, library.path)  # atomic: concurrent builders race harmlessly
            results[library.path] = failed.get(index)
    return results


def build(paths: dict[str, pathlib.Path], *, compiler: str, include_dir: str | os.PathLike,
          jobs: int | None = None, warn: Callable[[str], None] = print,
          progress: Progress | None = None) -> dict[str, str | None]:
    """Build one library per level (`paths`: level -> where), with libmvec where this system
    has it; a level whose build with libmvec fails is built again without it (float64 tanh
    IndRNNs then take libm's scalar tanh), with a warning. Returns, per level, None (built)
    or why it could not be built."""
    vector_math = vector_math_library()
    wanted = {level: Library(pathlib.Path(path), level, vector_math) for level, path in paths.items()}
    errors = compile_libraries(wanted.values(), compiler=compiler, include_dir=include_dir, jobs=jobs,
                               progress=progress)
    retry = {level: dataclasses.replace(library, vector_math=None)
             for level, library in wanted.items() if errors[library.path] and vector_math}
    for level in retry:
        warn(f"tridiax: building the {level} kernels with glibc's {vector_math} failed "
             f"({str(errors[wanted[level].path]).strip()[:300]}); building them without it "
             "(float64 tanh IndRNNs then take libm's scalar tanh)")
    if retry:
        errors.update(compile_libraries(retry.values(), compiler=compiler, include_dir=include_dir,
                                        jobs=jobs, progress=progress))
    return {level: (None if errors[library.path] is None else str(errors[library.path]))
            for level, library in wanted.items()}


def ffi_api_version(include_dir: str | os.PathLike) -> str | None:
    """The XLA FFI C API version ("major.minor") of the headers in `include_dir`."""
    try:
        text = (pathlib.Path(include_dir) / "xla" / "ffi" / "api" / "c_api.h").read_text()
    except OSError:
        return None
    found = [re.search(rf"#define XLA_FFI_API_{part}\s+(\d+)", text) for part in ("MAJOR", "MINOR")]
    return None if None in found else ".".join(match.group(1) for match in found)
