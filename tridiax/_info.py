"""`python -m tridiax --info`: what this installation can run, and how to fix what it cannot.

Prints the versions, the devices, which build of the native CPU kernel runs (its x86-64 level,
whether installed or built on first use, and why; or why none), and for every platform present
the backend each operation would run on each dtype, with the reason each other backend cannot.
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import platform as _platform
import shutil
import sys
import warnings

import jax
import jax.numpy as jnp

from . import __version__
from ._core import backend as _backend
from ._core import planner as _planner
from ._native import build as _native

DTYPES = ("float32", "float64", "complex64", "complex128")

# (name, how its backend is chosen): the rows of the backend table.
OPERATIONS = (
    ("solve_tridiagonal (every kind)", lambda p, dt: _backend.default_backend(p, dt)),
    ("solve_banded", lambda p, dt: _backend.default_backend(p, dt, op="banded")),
    ("solve_block_tridiagonal k=2", lambda p, dt: _backend.default_block_backend(p, dt, 2)),
    ("solve_block_tridiagonal k=8", lambda p, dt: _backend.default_block_backend(p, dt, 8)),
    ("linear_recurrence", lambda p, dt: _backend.default_backend(p, dt, op="recurrence")),
    ("indrnn (tanh)", lambda p, dt: _backend.default_backend(
        p, dt, activation=jnp.tanh, op="recurrence")),
    ("indrnn (your activation)", lambda p, dt: _backend.default_backend(
        p, dt, activation=lambda v: v, op="recurrence")),
)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _installed_lines() -> list[str]:
    """What the install compiled (the wheel's manifest), where there was an install build."""
    manifest = _native.manifest()
    if manifest is None:
        return []
    built, failed = manifest.get("built", {}), manifest.get("failed", {})
    lines = [f"  installed: {', '.join(built) or 'no level'} compiled at install"
             + (f" in {manifest['seconds']:.0f} s on {manifest['cores']} cores with "
                f"{manifest['compiler']}" if built else "")]
    lines += [f"  not installed: {level}: {error.splitlines()[0]}" for level, error in failed.items()]
    return lines


def _native_lines() -> list[str]:
    reason = _native.unavailable_reason()
    if reason is None:
        choice = _native.choice()
        tanh = ("float32 vectorized, float64 glibc's vector tanh (libmvec)"
                if _native.vector_math() else
                "float32 vectorized, float64 libm's scalar tanh (no libmvec found: ~10x slower)")
        level = "this CPU's own (-march=native)" if choice.level == "native" else choice.level
        return [f"native CPU kernel: {level}, {choice.origin} ({choice.why}), {choice.path}",
                *_installed_lines(),
                "  TRIDIAX_CPU_LEVEL pins an installed level; TRIDIAX_NATIVE=build compiles this "
                "CPU's own on first use, TRIDIAX_NATIVE=0 turns it off",
                f"native IndRNN tanh: {tanh}"]
    lines = ["native CPU kernel: NOT AVAILABLE, the XLA loops run instead (correct, slower)"]
    lines += [f"  {'why: ' if i == 0 else '     '}{line}" for i, line in enumerate(reason.splitlines())]
    lines += _installed_lines()
    cxx = os.environ.get("CXX")
    mode = os.environ.get("TRIDIAX_NATIVE", "1")
    if mode == "0":
        lines.append("  fix: unset TRIDIAX_NATIVE to use it")
    elif "TRIDIAX_CPU_LEVEL" in reason:
        lines.append("  fix: unset TRIDIAX_CPU_LEVEL, or pin a level this CPU runs")
    elif cxx and shutil.which(cxx) is None:
        lines.append(f"  fix: CXX={cxx} is not a program found on PATH: point CXX at a C++17 "
                     "compiler, or unset it to use c++ / g++")
    elif not cxx and shutil.which("c++") is None and shutil.which("g++") is None:
        lines.append("  fix: install a C++17 compiler (Debian/Ubuntu: apt-get install g++; conda: "
                     "conda install gxx) or point CXX at one, then reinstall tridiax (or set "
                     "TRIDIAX_NATIVE=build)")
    else:
        lines.append("  fix: the compiler's error is above; CXX picks another compiler, "
                     "TRIDIAX_CACHE_DIR another cache directory")
    return lines


def _backend_table(platform: str) -> list[str]:
    width = max(len(name) for name, _ in OPERATIONS)
    lines = [f"  {'operation':<{width}}  " + "  ".join(f"{d:<10}" for d in DTYPES)]
    for name, choose in OPERATIONS:
        cells = [choose(platform, jnp.dtype(d)) for d in DTYPES]
        lines.append(f"  {name:<{width}}  " + "  ".join(f"{c:<10}" for c in cells))
    return lines


def _why_not(platform: str) -> list[str]:
    lines = []
    for backend in _backend.BACKENDS:
        if backend.endswith("_interpret"):
            continue  # runs anywhere, slowly: for tests
        reason = _backend.unavailable(backend, jnp.float32, platform=platform)
        lines.append(f"  {backend:<14} " + ("can run" if reason is None else f"cannot: {reason}"))
    return lines


def report() -> str:
    """The text `python -m tridiax --info` prints."""
    with warnings.catch_warnings():  # the native kernel's warning: the report says it, and more
        warnings.simplefilter("ignore", RuntimeWarning)
        return _report()


def _report() -> str:
    here = pathlib.Path(__file__).parent
    lines = [
        f"tridiax {__version__} ({here})",
        f"python {_platform.python_version()} ({sys.executable}), jax {jax.__version__}, "
        f"jaxlib {_version('jaxlib')}, numpy {_version('numpy')}, scipy {_version('scipy')}, "
        f"equinox {_version('equinox')}, lineax {_version('lineax')}",
        f"machine: {_platform.machine()}, {os.cpu_count()} CPU cores",
        "devices:",
    ]
    devices = jax.devices()
    platforms = [_backend.device_platform(d) for d in devices]
    lines += [f"  {d.id}: {d.device_kind} ({p})" for d, p in zip(devices, platforms)]
    lines += _native_lines()
    shown = ["cpu", *platforms]
    if "tpu" not in platforms and _backend.unavailable("pallas_tpu", jnp.float32) is None:
        shown.append("tpu")  # what a TPU would run with this JAX (its kernels compile without one)
    for platform in dict.fromkeys(shown):
        absent = "" if platform in ("cpu", *platforms) else ", no TPU here: what one would run"
        lines.append(f"backends on {platform}{absent} (the first of "
                     f"{_backend.PREFERENCE.get(platform, ('xla',))} that can run the call; "
                     "`backend=` overrides):")
        lines += _backend_table(platform)
        if platform == "tpu":
            lines.append("  bfloat16 and float16 run the Pallas TPU kernels too (eliminated in float32); "
                         "complex64 too (as float32 parts) but for IndRNN activations; "
                         "float64, complex128 and blocks larger than "
                         f"{_backend.TPU_BLOCK_LIMIT} x {_backend.TPU_BLOCK_LIMIT} run XLA's loops; "
                         "Banded.factor() and its solves run Pallas TPU kernels while the factors "
                         "fit VMEM, BlockTridiagonal.factor() and its solves at any length")
        if platform == "cuda":
            lines.append(f"  and plain solves of at most {_planner.GPU_LIBRARY_SYSTEMS} systems of at "
                         f"least {_planner.GPU_MIN_ROWS} rows: cuSPARSE gtsv2 (no backend= given)")
        lines.append(f"  why not the others, on {platform} (float32):")
        lines += _why_not(platform)
    if not any(p in _backend.GPU_PLATFORMS for p in platforms):
        lines.append("no GPU visible: for NVIDIA GPUs install jax[cuda12] (or cuda13), then "
                     "jax.devices() lists them")
    return "\n".join(lines)
