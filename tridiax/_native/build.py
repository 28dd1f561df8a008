"""The build of the C++ CPU kernels: compiled on first use, cached, loaded, registered as XLA
FFI targets; and what the library was built with (`scan_rows`, `vector_math`), for the planner.
The calls into it are in `ffi.py`.

The library is compiled once per machine, source and jax version with the system C++
compiler against the headers jaxlib ships (`jax.ffi.include_dir()`), and cached in
$TRIDIAX_CACHE_DIR (default ~/.cache/tridiax); the build logs a line to the "tridiax" logger
(shown by default) as it starts, with where and what it will cost here (`_build_estimate`),
and one when it is done, with the time it took. Where no compiler is found or the build fails,
`available()` is False and the CPU falls back to the XLA formulation, with one warning that
says why; set TRIDIAX_NATIVE=0 to skip the native kernel altogether.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import functools
import hashlib
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import time
import warnings

import jax

_HERE = pathlib.Path(__file__).parent
# One translation unit per kind of kernel (README.md in this folder has the map), and
# ffi.cc, which only declares the FFI handlers.
_SOURCES = tuple(_HERE / name for name in (
    "solve.cc", "chunks.cc", "factor.cc", "recurrence.cc", "banded.cc", "block.cc", "ffi.cc"))
_BLOCK_SOURCE = _HERE / "block.cc"
# The headers the sources include: every one is hashed into the library's cache key.
_HEADERS = tuple(sorted(_HERE.glob("*.h")))
_LOG = logging.getLogger("tridiax")
# FFI target names (those ffi.py calls) and the C++ symbols behind them (ffi.cc).
_TARGETS = {
    "tridiax_thomas_cpu": "TridiaxThomasCpu",
    "tridiax_chunk_ends_cpu": "TridiaxChunkEndsCpu",
    "tridiax_chunk_solve_cpu": "TridiaxChunkSolveCpu",
    "tridiax_factor_cpu": "TridiaxFactorCpu",
    "tridiax_band_cotangents_cpu": "TridiaxBandCotangentsCpu",
    "tridiax_recurrence_cpu": "TridiaxRecurrenceCpu",
    "tridiax_recurrence_ends_cpu": "TridiaxRecurrenceEndsCpu",
    "tridiax_banded_cpu": "TridiaxBandedCpu",
    "tridiax_block_cpu": "TridiaxBlockCpu",
}


# -march=native: the library is cached per CPU (the key includes its feature flags).
_FLAGS = ("-O3", "-march=native", "-std=c++17", "-fPIC")
# -ffp-contract=off: no multiply-add is fused into one rounding, so every code path (vector
# loops, scalar tails, tiles of any width) rounds each operation as the sequential sweep
# written out does, and a system gets the same answer, bit for bit, in any batch or layout.
# The block kernel fuses them (=fast) as XLA's CPU compiler does, so that its block
# eliminations round as the XLA formulation's, bit for bit. TRIDIAX_FP_CONTRACT_OFF tells the
# headers whose arithmetic must not be contracted (sweeps.h) that they may be included.
_CONTRACTION = {_BLOCK_SOURCE: ("-ffp-contract=fast",)}


def _source_flags(source: pathlib.Path) -> tuple[str, ...]:
    return (*_FLAGS,
            *_CONTRACTION.get(source, ("-ffp-contract=off", "-DTRIDIAX_FP_CONTRACT_OFF")))


def _cpu_flags() -> str:
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    return next((line for line in text.splitlines() if line.startswith("flags")), "")


@functools.cache
def _vector_math_library() -> str | None:
    """glibc's vector math library (libmvec, glibc >= 2.35: the float64 tanh of IndRNN), by the
    name the linker takes (`libmvec.so.1`), or None where there is none."""
    if platform.system() != "Linux":
        return None
    return ctypes.util.find_library("mvec")


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity outside Linux
        return max(1, os.cpu_count() or 1)


# What compiling each source costs one core, in seconds, low and high: the order the sources
# are started in (longest first, so that the cores finish together) and the build notice's
# estimate. A source not listed counts as _DEFAULT_SECONDS.
_SOURCE_SECONDS = {"block.cc": (15, 30), "banded.cc": (15, 30), "recurrence.cc": (8, 16),
                   "chunks.cc": (5, 10), "solve.cc": (3, 7), "ffi.cc": (3, 7),
                   "factor.cc": (3, 6)}
_DEFAULT_SECONDS = (5, 10)


def _seconds(source: pathlib.Path) -> tuple[int, int]:
    return _SOURCE_SECONDS.get(source.name, _DEFAULT_SECONDS)


def _compile(compiler: str, out: pathlib.Path, *, vector_math: str | None) -> None:
    """One compiler process per source, as many at once as there are cores, the longest
    first; then one link into the library."""
    extra = ["-I", jax.ffi.include_dir(), *(["-DTRIDIAX_LIBMVEC"] if vector_math else [])]
    objects = {source: out.with_name(f"{out.name}.{source.stem}.o") for source in _SOURCES}

    def compile_one(source):
        cmd = [compiler, *_source_flags(source), *extra, "-c", str(source), "-o",
               str(objects[source])]
        return subprocess.run(cmd, capture_output=True, text=True)

    order = sorted(_SOURCES, key=lambda source: -_seconds(source)[1])
    with concurrent.futures.ThreadPoolExecutor(max_workers=_cores()) as pool:
        done = list(pool.map(compile_one, order))
    for job in done:
        if job.returncode:
            raise subprocess.CalledProcessError(job.returncode, job.args, job.stdout, job.stderr)
    cmd = [compiler, "-shared", *(str(objects[source]) for source in _SOURCES), "-o", str(out),
           "-lpthread", *([f"-l:{vector_math}"] if vector_math else [])]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def _build(compiler: str, out: pathlib.Path) -> None:
    """Build with libmvec where there is one; where that build fails, without it."""
    vector_math = _vector_math_library()
    if vector_math:
        try:
            return _compile(compiler, out, vector_math=vector_math)
        except subprocess.CalledProcessError as err:
            _LOG.warning("tridiax: building with glibc's %s failed (%s); building without it "
                         "(float64 tanh IndRNNs then take libm's scalar tanh)", vector_math,
                         (err.stderr or "").strip()[:200] or f"exit status {err.returncode}")
    _compile(compiler, out, vector_math=None)


def _build_estimate(cores: int | None = None) -> str:
    """What the build costs on `cores` cores (default: those this process may run on), for
    the notice: the sources compile as `_compile` starts them, longest first, each on the
    first core to be free."""
    cores, sources = max(1, cores or _cores()), len(_SOURCES)

    def finish(costs):
        free = [0] * cores
        for cost in sorted(costs, reverse=True):
            free[free.index(min(free))] += cost
        return max(free)

    low, high = (finish([_seconds(source)[k] for source in _SOURCES]) for k in (0, 1))
    return (f"{sources} C++ source{'s' if sources > 1 else ''} on {cores} "
            f"core{'s' if cores > 1 else ''}: about {low}-{high} s")


@functools.cache
def _library_path() -> pathlib.Path:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX or install g++)")
    key = hashlib.sha256(
        b"\0".join([*(path.read_bytes() for path in (*_SOURCES, *_HEADERS)),
                    jax.__version__.encode(), _cpu_flags().encode(), compiler.encode(),
                    *(" ".join(_source_flags(source)).encode() for source in _SOURCES),
                    str(_vector_math_library()).encode()])
    ).hexdigest()[:16]
    cache = pathlib.Path(os.environ.get("TRIDIAX_CACHE_DIR", "~/.cache/tridiax")).expanduser()
    path = cache / f"cpu_kernels-{key}.so"
    if not path.exists():
        _LOG.warning(
            "tridiax: building the native CPU kernel, once per machine, compiler and jax version "
            "(%s), into %s (TRIDIAX_CACHE_DIR); silence this with "
            "logging.getLogger('tridiax').setLevel(logging.ERROR)", _build_estimate(), path)
        start = time.perf_counter()
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            built = pathlib.Path(tmp) / path.name
            try:
                _build(compiler, built)
            except subprocess.CalledProcessError as err:
                output = (err.stderr or err.stdout or "").strip() or "(no output)"
                raise RuntimeError(f"building the kernels with {compiler} failed (exit status "
                                   f"{err.returncode}):\n{output}") from None
            os.replace(built, path)  # atomic: concurrent builders race harmlessly
        _LOG.warning("tridiax: built the native CPU kernel in %.0f s", time.perf_counter() - start)
    return path


@functools.cache
def scan_rows(itemsize: int) -> int:
    """Rows of a real element of `itemsize` bytes that the kernel scans per vector register in
    contiguous lanes (lanes.h, VectorOps): 16 float32 with AVX-512; 0 where the kernel
    is not built or was built without them (the planner then sends no tile there)."""
    if not available():
        return 0
    function = ctypes.cdll.LoadLibrary(str(_library_path())).TridiaxScanRows
    function.restype = ctypes.c_int64
    function.argtypes = [ctypes.c_int64]
    return int(function(itemsize))


@functools.cache
def vector_math() -> bool:
    """Whether the built kernel takes float64 tanh from glibc's vector math library (libmvec);
    False where the kernel is not built, or was built without it."""
    if not available():
        return False
    function = ctypes.cdll.LoadLibrary(str(_library_path())).TridiaxVectorMath
    function.restype = ctypes.c_int64
    return bool(function())


@functools.cache
def unavailable_reason() -> str | None:
    """Why the native CPU kernel cannot run (None: it is built and registered; builds it on first
    call): TRIDIAX_NATIVE=0, no compiler, or the compiler's error."""
    if os.environ.get("TRIDIAX_NATIVE", "1") == "0":
        return "TRIDIAX_NATIVE=0 turns it off"
    try:
        library = ctypes.cdll.LoadLibrary(str(_library_path()))
        for target, symbol in _TARGETS.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)),
                                        platform="cpu")
    except (OSError, RuntimeError) as err:
        return str(err)
    return None


def library_path() -> pathlib.Path | None:
    """Where the built library is cached (None: not built)."""
    return None if unavailable_reason() else _library_path()


@functools.cache
def available() -> bool:
    """Whether the native CPU kernel is built and registered (builds it on first call)."""
    reason = unavailable_reason()
    if reason is not None and os.environ.get("TRIDIAX_NATIVE", "1") != "0":
        warnings.warn(
            f"tridiax: the native CPU kernel is unavailable ({reason}); using the slower XLA "
            "formulation on CPU (python -m tridiax --info says more).",
            RuntimeWarning,
            stacklevel=2,
        )
    return reason is None
