"""Benchmark tridiax.solve_tridiagonal against jax.lax.linalg.tridiagonal_solve and the memory floor.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/bench_solve.py [--batch 100000] [--n 100]
        [--long-n 100000 1000000] [--compile-n 10 100 1000 10000] [--json FILE]

For both layouts, (N, B) with axis=0 and (B, N) with axis=-1, it checks every method against
tridiax.verify on a sample of systems, then times each (minimum of --repeats after a warm-up,
compile time reported separately) and prints ratios measured side by side in this one run:
- lax: jax.lax.linalg.tridiagonal_solve (last axis only: the (N, B) layout pays its transposes);
- fused: one XLA elementwise op reading four arrays and writing one, the memory floor of a solve;
- grad: the solve plus the gradient of a scalar loss w.r.t. all four inputs.
It also times few long systems ((N, B) = (10^5, 64) and (10^6, 64) along axis 0) against the
fused op, reports compile time at growing N (it must stay flat) and, on a GPU, the fraction
of memory bandwidth reached (5 arrays moved once). --json writes the three tables as data
(tables "solve", "long systems" and "compile time"; see benchmarks/_timing.py).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from _timing import add_json_option, cell, machine, row, timed, write_rows  # benchmarks/ on sys.path

import tridiax
from tridiax import verify
from tridiax._tridiagonal.api import solve

# Published peak memory bandwidth (bytes/s) of the GPUs this project is measured on.
PEAK_BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12}


def problem(n, batch, axis, dtype, seed=0):
    rng = np.random.default_rng(seed)
    shape = (n, batch) if axis == 0 else (batch, n)
    lower = rng.uniform(-1, 1, shape)
    upper = rng.uniform(-1, 1, shape)
    diag = 3 + rng.uniform(0, 1, shape)
    rhs = rng.standard_normal(shape)
    return [jnp.asarray(a, dtype) for a in (lower, diag, upper, rhs)]


def check(x, args, axis, sample=200):
    """Compare a sample of systems with scipy (verify.reference_solve)."""
    idx = np.linspace(0, x.shape[1 - axis % 2] - 1, sample).astype(int)
    take = (lambda a: np.asarray(a)[:, idx]) if axis == 0 else (lambda a: np.asarray(a)[idx])
    ref = verify.reference_solve(*(take(a) for a in args), axis=axis)
    err = np.max(np.abs(take(x) - ref)) / np.max(np.abs(ref))
    return err


def lax_solve(axis):
    def f(lower, diag, upper, rhs):
        if axis == 0:
            lower, diag, upper, rhs = (a.T for a in (lower, diag, upper, rhs))
        x = jax.lax.linalg.tridiagonal_solve(lower, diag, upper, rhs[..., None])[..., 0]
        return x.T if axis == 0 else x

    return f


def fused(lower, diag, upper, rhs):
    return lower * diag + upper * rhs


# The data file's method names of the printed ones.
METHODS = {"tridiax": ("tridiax", False), "lax.tridiagonal_solve": ("lax", False),
           "fused 4-read 1-write": ("floor", False), "tridiax + grad": ("tridiax", True)}


def run(args):
    rows = []  # the tables as data, for --json
    dtype = jnp.dtype(args.dtype)
    device = jax.devices()[0]
    print(f"machine: {machine()}; dtype {dtype.name}, N={args.n}, B={args.batch}, "
          f"min of {args.repeats} after warm-up")
    print(f"{'layout':<16}{'method':<22}{'ms':>9}{'compile s':>11}{'rel err':>10}"
          f"{'vs tridiax':>12}")
    for axis in (0, -1):
        data = problem(args.n, args.batch, axis, dtype)
        layout = "(N, B) axis=0" if axis == 0 else "(B, N) axis=-1"
        methods = {
            "tridiax": lambda *a, axis=axis: tridiax.solve_tridiagonal(*a, axis=axis),
            "lax.tridiagonal_solve": lax_solve(axis),
            "fused 4-read 1-write": fused,
            "tridiax + grad": lambda *a, axis=axis: jax.grad(
                lambda *b: jnp.sum(tridiax.solve_tridiagonal(*b, axis=axis) ** 2),
                argnums=(0, 1, 2, 3))(*a),
        }
        if args.backend:
            methods["tridiax backend=" + args.backend] = (
                lambda *a, axis=axis: solve(*a, axis=axis, backend=args.backend))
        times = {}
        for name, fn in methods.items():
            if name == "lax.tridiagonal_solve" and args.skip_lax:
                continue
            t, c, compiled = timed(fn, *data, repeats=args.repeats)
            err = check(compiled(*data), data, axis) if "solve" in name or name.startswith(
                "tridiax") and "grad" not in name else float("nan")
            times[name] = t
            print(f"{layout:<16}{name:<22}{t * 1e3:>9.2f}{c:>11.2f}{cell(err, '>10.1e')}"
                  f"{t / times['tridiax']:>11.2f}x")
            method, grad = METHODS.get(name, (name, False))
            rows.append(row("solve", layout, method, shape=data[3].shape, axis=axis,
                            dtype=dtype.name, grad=grad, ms=t * 1e3, compile_s=c, error=err,
                            ratio=t / times["tridiax"], ratio_to="tridiax"))
        ref = times["tridiax"]
        if "lax.tridiagonal_solve" in times:
            print(f"  -> tridiax is {times['lax.tridiagonal_solve'] / ref:.1f}x faster than lax; "
                  f"{ref / times['fused 4-read 1-write']:.2f}x the fused op; "
                  f"solve+grad = {times['tridiax + grad'] / ref:.2f}x solve")
        gpu = next((k for k in PEAK_BANDWIDTH if k in device.device_kind), None)
        if gpu:
            moved = 5 * args.n * args.batch * dtype.itemsize
            print(f"  -> bandwidth: {moved / ref / 1e9:.0f} GB/s = "
                  f"{moved / ref / PEAK_BANDWIDTH[gpu]:.0%} of {gpu} peak")

    print("few long systems, (N, B) along axis 0 (each tile's scratch outgrows the cache):")
    for n in args.long_n:
        batch = 64
        data = problem(n, batch, 0, dtype)
        t, c, compiled = timed(lambda *a: tridiax.solve_tridiagonal(*a, axis=0), *data,
                               repeats=max(3, args.repeats // 2))
        t_fused, c_fused, _ = timed(fused, *data, repeats=max(3, args.repeats // 2))
        err = check(compiled(*data), data, 0, 16)
        print(f"  N={n:<8} B={batch:<4} tridiax {t * 1e3:8.1f} ms, fused {t_fused * 1e3:7.1f} ms: "
              f"{t / t_fused:5.1f}x the floor (rel err {err:.1e})")
        for method, seconds, compile_s, error in (("tridiax", t, c, err),
                                                  ("floor", t_fused, c_fused, float("nan"))):
            rows.append(row("long systems", f"N={n} B={batch}", method, shape=(n, batch), axis=0,
                            dtype=dtype.name, ms=seconds * 1e3, compile_s=compile_s,
                            error=error, ratio=seconds / t_fused, ratio_to="floor"))

    print("compile time of tridiax (must not grow with N):")
    for n in args.compile_n:
        data = problem(n, 64, 0, dtype)
        _, c, _ = timed(lambda *a: tridiax.solve_tridiagonal(*a, axis=0), *data, repeats=1)
        _, cg, _ = timed(lambda *a: jax.grad(lambda *b: jnp.sum(
            tridiax.solve_tridiagonal(*b, axis=0)))(*a), *data, repeats=1)
        print(f"  N={n:<6} solve {c:.2f} s, grad {cg:.2f} s")
        for grad, compile_s in ((False, c), (True, cg)):
            rows.append(row("compile time", f"N={n}", "tridiax", shape=(n, 64), axis=0,
                            dtype=dtype.name, grad=grad, compile_s=compile_s))
    if args.json:
        write_rows(args.json, rows, {"args": vars(args)})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--backend", default=None, help="also time this tridiax backend")
    parser.add_argument("--skip-lax", action="store_true")
    parser.add_argument("--long-n", type=int, nargs="+", default=[100_000, 1_000_000],
                        help="N of the few long systems (64 of them)")
    parser.add_argument("--compile-n", type=int, nargs="+", default=[10, 100, 1000, 10000],
                        help="N of the compile-time sweep")
    add_json_option(parser)
    run(parser.parse_args())
