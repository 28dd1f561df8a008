"""Timing shared by the benchmarks: compile once, warm up, take the minimum of repeats."""

import os
import platform
import time

import jax

from tridiax._timing import best_time


def timed(fn, *args, repeats):
    """(best seconds, compile seconds, compiled function) for `jax.jit(fn)(*args)`."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    return best_time(compiled, args, repeats), compile_s, compiled


def cell(value, spec):
    """`value` formatted with `spec` (e.g. ">10.1e"), or a dash where nothing was measured."""
    width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit()) or "0"
    return format(value, spec) if value == value else format("-", ">" + width)


def machine() -> str:
    """The device every figure is measured on: on CPU the model `lscpu` shows, its cores and
    widest vector extension; on an accelerator its kind. With jax's version and whether
    GLIBC_TUNABLES (hugetlb) is set."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        model, flags = platform.processor() or "unknown CPU", set()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        model = line.split(":", 1)[1].strip()
                    elif line.startswith("flags"):
                        flags = set(line.split(":", 1)[1].split())
        except OSError:
            pass
        vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
        where = f"{model} ({os.cpu_count()} cores, {vector})"
    else:
        where = f"{device.device_kind} ({device.platform})"
    return (f"{where}, jax {jax.__version__}, "
            f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}")
