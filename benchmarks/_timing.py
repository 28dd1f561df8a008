"""Timing shared by the benchmarks: compile once, warm up, take the minimum of repeats."""

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
