"""Which build of the C++ CPU kernels this process runs, loaded and registered as XLA FFI targets;
and what it was built with (`scan_rows`, `vector_math`), for the planner. The calls into it are in
`ffi.py`; the compiling is `compiler.py`'s.

Where the kernels come from, in order:

1. **The installed package.** `pip install` and `pip wheel` compile one library per x86-64
   level (`compiler.LEVELS`) into `lib/` beside this file, with a manifest of what was built
   (`hatch_build.py`). The best level this CPU runs is loaded (the baseline library reports the
   CPU's level); TRIDIAX_CPU_LEVEL=x86-64-v3 (for example) pins one. Where the install's build
   failed, the manifest says why, and the XLA formulation runs.
2. **Built on first use** for this CPU (-march=native on x86-64): in a source tree, on other
   architectures, where the installed libraries do not match this jaxlib's FFI version, or when
   TRIDIAX_NATIVE=build asks for it; with TRIDIAX_CPU_LEVEL set, for that level instead (a
   level this CPU does not run is refused once built, never run). The build is cached in $TRIDIAX_CACHE_DIR (default
   ~/.cache/tridiax) per source, compiler and jax version, and logs a notice with what it costs
   here, its progress, and the time it took. A failed build is recorded beside the cache (not as a
   library), so later processes do not compile again; deleting the record retries.
3. **None**: TRIDIAX_NATIVE=0, or no compiler, or a failed build. `available()` is False, the CPU
   runs the XLA formulation, and one warning says why (`python -m tridiax --info` says more).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import json
import logging
import os
import pathlib
import platform
import time
import warnings

import jax

from . import compiler

_LOG = logging.getLogger("tridiax")
INSTALLED = compiler.HERE / "lib"
MANIFEST = INSTALLED / "manifest.json"
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
# Progress lines of a first-use build at most this often, in seconds.
_PROGRESS_EVERY = 10.0


def library_name(level: str) -> str:
    return f"cpu_kernels-{level}.so"


@dataclasses.dataclass(frozen=True)
class Choice:
    """The library this process loads: where, for which level (an x86-64 level or "native"),
    where it came from ("installed", "built on first use") and why this one."""
    path: pathlib.Path
    level: str
    origin: str
    why: str


class Unavailable(RuntimeError):
    """No native kernel here; the message says why and what would change it."""


def _mode() -> str:
    mode = os.environ.get("TRIDIAX_NATIVE", "1")
    if mode not in ("0", "1", "build"):
        raise Unavailable(f"TRIDIAX_NATIVE={mode!r} is not one of 0 (off), 1 (default) or build "
                          "(compile on first use even where the package has compiled kernels)")
    return mode


def _load(path: pathlib.Path) -> ctypes.CDLL:
    return ctypes.cdll.LoadLibrary(str(path))


@functools.cache
def manifest() -> dict | None:
    """What the install built (hatch_build.py writes it): None in a source tree."""
    try:
        return json.loads(MANIFEST.read_text())
    except FileNotFoundError:
        return None


@functools.cache
def cpu_level(probe: pathlib.Path | None = None) -> int:
    """The highest x86-64 level this CPU runs (2, 3, 4; 1 below; 0 elsewhere), as a library built
    for the baseline level (`probe`) reports it."""
    if not compiler.is_x86_64() or probe is None:
        return 0
    function = _load(probe).TridiaxCpuLevel
    function.restype = ctypes.c_int64
    return int(function())


def _level_number(level: str) -> int:
    return int(level.rsplit("v", 1)[1])


def _installed_choice(built: dict) -> Choice:
    """The installed library for this CPU: the pinned level, else the highest it runs."""
    levels = sorted(built, key=_level_number)
    runs = cpu_level(INSTALLED / built[levels[0]])
    pinned = _pinned()
    if pinned:
        if pinned not in built:
            raise Unavailable(f"TRIDIAX_CPU_LEVEL={pinned} names no installed level (installed: "
                              f"{', '.join(levels)})")
        if _level_number(pinned) > runs:
            raise Unavailable(f"TRIDIAX_CPU_LEVEL={pinned}: this CPU runs x86-64-v{runs} at most")
        return Choice(INSTALLED / built[pinned], pinned, "installed", "pinned by TRIDIAX_CPU_LEVEL")
    usable = [level for level in levels if _level_number(level) <= runs]
    if not usable:
        raise Unavailable(f"this CPU runs x86-64-v{runs}; the installed kernels need "
                          f"{levels[0]} or above")
    return Choice(INSTALLED / built[usable[-1]], usable[-1], "installed",
                  f"the best of the installed levels ({', '.join(levels)}) this CPU runs "
                  f"(x86-64-v{runs})")


def _runtime_ffi_version() -> str | None:
    return compiler.ffi_api_version(jax.ffi.include_dir())


def _cache_key(compiler_path: str, level: str) -> str:
    """The first-use build's key: the sources, the compiler, the flags, the FFI headers and
    this CPU (for -march=native)."""
    include = pathlib.Path(jax.ffi.include_dir())
    cpu_flags = ""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
        cpu_flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    except OSError:
        cpu_flags = platform.processor()
    parts = [*(path.read_bytes() for path in (*compiler.SOURCES, *compiler.HEADERS)),
             *(path.read_bytes() for path in sorted(include.rglob("*.h"))),
             jax.__version__.encode(), cpu_flags.encode(), compiler_path.encode(),
             *(" ".join(compiler.source_flags(source, level)).encode()
               for source in compiler.SOURCES),
             str(compiler.vector_math_library()).encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def _pinned() -> str | None:
    """The level TRIDIAX_CPU_LEVEL pins, if any."""
    return os.environ.get("TRIDIAX_CPU_LEVEL") or None


def _checked(choice: Choice) -> Choice:
    """`choice`, if this CPU runs its level (a pinned one may not)."""
    if choice.level != compiler.NATIVE:
        runs = cpu_level(choice.path)
        if _level_number(choice.level) > runs:
            raise Unavailable(f"TRIDIAX_CPU_LEVEL={choice.level}: this CPU runs x86-64-v{runs} at most")
    return choice


def _built_on_first_use(why: str) -> Choice:
    """This CPU's library (or the pinned level's) from the cache, built there first if it is
    not."""
    level = _pinned() or compiler.NATIVE
    if level != compiler.NATIVE and (level not in compiler.LEVELS or not compiler.is_x86_64()):
        raise Unavailable(f"TRIDIAX_CPU_LEVEL={level} is not one of the x86-64 levels {compiler.LEVELS}")
    if level != compiler.NATIVE:
        why = f"{why}; pinned by TRIDIAX_CPU_LEVEL"
    compiler_path = compiler.find_compiler()
    if compiler_path is None:
        raise Unavailable("no C++ compiler found (set CXX or install g++)")
    cache = pathlib.Path(os.environ.get("TRIDIAX_CACHE_DIR", "~/.cache/tridiax")).expanduser()
    path = cache / f"cpu_kernels-{level}-{_cache_key(compiler_path, level)}.so"
    failed = path.with_suffix(".failed")
    if path.exists():
        return _checked(Choice(path, level, "built on first use", why))
    if failed.exists():
        raise Unavailable(f"building the kernels with {compiler_path} failed before (the record: "
                          f"{failed}; delete it to try again):\n{failed.read_text().strip()}")
    _LOG.warning(
        "tridiax: building the native CPU kernel for %s (%s; %s), once per machine, compiler "
        "and jax version, into %s (TRIDIAX_CACHE_DIR); silence this with "
        "logging.getLogger('tridiax').setLevel(logging.ERROR)",
        "this CPU" if level == compiler.NATIVE else level, why, compiler.estimate(), path)
    start = last = time.perf_counter()

    def progress(done, total):
        nonlocal last
        now = time.perf_counter()
        if done < total and now - last >= _PROGRESS_EVERY:
            last = now
            _LOG.warning("tridiax: compiling the native CPU kernel: %d of %d sources, %.0f s",
                         done, total, now - start)

    cache.mkdir(parents=True, exist_ok=True)
    errors = compiler.build({level: path}, compiler=compiler_path,
                            include_dir=jax.ffi.include_dir(), warn=_LOG.warning, progress=progress)
    error = errors[level]
    if error is not None:
        failed.write_text(error)
        raise Unavailable(f"building the kernels with {compiler_path} failed (recorded in "
                          f"{failed}; delete it to try again):\n{error}")
    _LOG.warning("tridiax: built the native CPU kernel in %.0f s", time.perf_counter() - start)
    return _checked(Choice(path, level, "built on first use", why))


@functools.cache
def choice() -> Choice:
    """The library this process runs (see the module docstring); raises `Unavailable`."""
    mode = _mode()
    if mode == "0":
        raise Unavailable("TRIDIAX_NATIVE=0 turns it off")
    if mode == "build":
        return _built_on_first_use("TRIDIAX_NATIVE=build")
    installed = manifest()
    if installed is None:
        return _built_on_first_use("no compiled kernels installed: a source tree")
    built = installed.get("built", {})
    if not built:
        failures = "; ".join(f"{level}: {error.splitlines()[0]}"
                             for level, error in installed.get("failed", {}).items())
        raise Unavailable("the install compiled no kernels (" + (failures or "no build ran") +
                          "); reinstall where a C++ compiler works, or set TRIDIAX_NATIVE=build")
    runtime = _runtime_ffi_version()
    if runtime is not None and installed.get("ffi_api_version") not in (None, runtime):
        return _built_on_first_use(
            f"the installed kernels use XLA FFI {installed['ffi_api_version']}, this jaxlib "
            f"{runtime}")
    return _installed_choice(built)


@functools.cache
def _library() -> ctypes.CDLL:
    return _load(choice().path)


@functools.cache
def unavailable_reason() -> str | None:
    """Why the native CPU kernel cannot run (None: it is loaded and registered; builds it on first
    call where it must)."""
    try:
        library = _library()
        for target, symbol in _TARGETS.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)),
                                        platform="cpu")
    except (OSError, Unavailable) as err:
        return str(err)
    return None


@functools.cache
def available() -> bool:
    """Whether the native CPU kernel is loaded and registered (builds it on first call where it
    must)."""
    reason = unavailable_reason()
    if reason is not None and os.environ.get("TRIDIAX_NATIVE", "1") != "0":
        warnings.warn(
            f"tridiax: the native CPU kernel is unavailable ({reason}); using the slower XLA "
            "formulation on CPU (python -m tridiax --info says more).",
            RuntimeWarning,
            stacklevel=2,
        )
    return reason is None


def library_path() -> pathlib.Path | None:
    """The library this process runs (None: none)."""
    return None if unavailable_reason() else choice().path


@functools.cache
def scan_rows(itemsize: int) -> int:
    """Rows of a real element of `itemsize` bytes that the kernel scans per vector register in
    contiguous lanes (lanes.h, VectorOps): 16 float32 with AVX-512; 0 where the kernel
    is not built or was built without them (the planner then sends no tile there)."""
    if not available():
        return 0
    function = _library().TridiaxScanRows
    function.restype = ctypes.c_int64
    function.argtypes = [ctypes.c_int64]
    return int(function(itemsize))


@functools.cache
def vector_math() -> bool:
    """Whether the loaded kernel takes float64 tanh from glibc's vector math library (libmvec);
    False where the kernel is not built, or was built without it."""
    if not available():
        return False
    function = _library().TridiaxVectorMath
    function.restype = ctypes.c_int64
    return bool(function())
