"""The one timing rule of `python -m tridiax` and benchmarks/: warm up, then the minimum of
repeats (these machines are noisy; the minimum is the least disturbed run)."""

import time

import jax


def best_time(fn, args, repeats: int) -> float:
    """Seconds of the fastest of `repeats` calls `fn(*args)`, after one warm-up call."""
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best
