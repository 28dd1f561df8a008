"""Benchmark the IndRNN recurrence h[t] = relu(w*h[t-1] + z[t]) and the linear recurrence.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/bench_recurrence.py [--T 1000] [--F 1000 100000]
        [--json FILE]

The published IndRNN benchmark (T = 1000, F = 1000, float32, relu) compared a Python loop
under jit, lax.scan and a one-kernel Pallas version. For each F this checks every method
against a NumPy loop, then times forward and forward+backward (gradient of sum(h**2) w.r.t.
w and z), minimum of --repeats after a warm-up, compile time separately, ratios from this run:
- fused: one XLA elementwise op reading two (T, F) arrays and writing one, the memory floor;
- lax.scan (unroll=1, the fastest pure-JAX form measured here);
- python loop under jit: compile time grows with T, so it runs at --loop-T steps only;
- pallas (T, 1) block: the plain one-kernel version with a (T, 1) block per program (GPU; on
  CPU it runs in interpret mode with a grid, which is not a production path, and is skipped
  for F > 1000);
- tridiax.indrnn and tridiax.linear_recurrence.
--json writes the tables as data (tables "recurrence" and "compile time"; a fwd+bwd row's ratio
is to its own forward; see benchmarks/_timing.py).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from _timing import add_json_option, cell, machine, row, timed, write_rows  # benchmarks/ on sys.path
from jax.experimental import pallas as pl

import tridiax


def scan_indrnn(w, z):
    def step(h, zt):
        h = jax.nn.relu(w * h + zt)
        return h, h

    return jax.lax.scan(step, jnp.zeros_like(z[0]), z)[1]


def python_loop_indrnn(w, z):
    h, out = jnp.zeros_like(z[0]), []
    for t in range(z.shape[0]):
        h = jax.nn.relu(w * h + z[t])
        out.append(h)
    return jnp.stack(out)


def pallas_t1_indrnn(w, z):
    """The plain one-kernel baseline: each program owns one feature column, block (T, 1)."""
    T, F = z.shape

    def kernel(w_ref, z_ref, h_ref):
        def step(t, h):
            h = jax.nn.relu(w_ref[0, 0] * h + z_ref[t, 0])
            h_ref[t, 0] = h
            return h

        jax.lax.fori_loop(0, T, step, jnp.zeros((), z.dtype))

    interpret = jax.default_backend() == "cpu"
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(z.shape, z.dtype), grid=(F,),
        in_specs=[pl.BlockSpec((1, 1), lambda j: (0, j)), pl.BlockSpec((T, 1), lambda j: (0, j))],
        out_specs=pl.BlockSpec((T, 1), lambda j: (0, j)), interpret=interpret,
    )(w.reshape(1, F), z)


def fused(w, z):
    return w * z + z


def with_grad(f):
    return lambda w, z: jax.grad(lambda w, z: jnp.sum(f(w, z) ** 2), argnums=(0, 1))(w, z)


def numpy_indrnn(w, z):
    h, out = np.zeros(z.shape[1]), np.empty(z.shape)
    for t in range(z.shape[0]):
        h = np.maximum(w * h + z[t], 0)
        out[t] = h
    return out


# The data file's method names of the printed ones.
METHODS = {"fused 2-read 1-write": "floor", "pallas (T, 1) block": "pallas (T, 1)"}


def run(args):
    rows = []  # the tables as data, for --json
    print(f"machine: {machine()}; float32, T={args.T}, min of {args.repeats} after warm-up")
    print(f"{'F':>7} {'method':<30}{'fwd ms':>9}{'fwd+bwd ms':>12}{'compile s':>11}"
          f"{'err':>9}{'fwd / fused':>13}{'fwd+bwd / fwd':>15}")
    for F in args.F:
        rng = np.random.default_rng(0)
        w = jnp.asarray(rng.uniform(0, 1, F), jnp.float32)
        z = jnp.asarray(rng.standard_normal((args.T, F)), jnp.float32)
        reference = numpy_indrnn(np.asarray(w, np.float64), np.asarray(z, np.float64))
        methods = {
            "fused 2-read 1-write": fused,
            "lax.scan": scan_indrnn,
            "tridiax.indrnn": lambda w, z: tridiax.indrnn(w, z),
            "tridiax.linear_recurrence": lambda w, z: tridiax.linear_recurrence(w, z),
        }
        if F <= 1000 or jax.default_backend() != "cpu":
            methods["pallas (T, 1) block"] = pallas_t1_indrnn
        floor = None
        for name, fn in methods.items():
            t_fwd, c_fwd, compiled = timed(fn, w, z, repeats=args.repeats)
            err = float("nan")
            if name not in ("fused 2-read 1-write", "tridiax.linear_recurrence"):
                err = float(np.max(np.abs(np.asarray(compiled(w, z)) - reference)))
            if name.startswith("fused") or name.startswith("pallas"):  # no backward pass
                floor = floor or t_fwd
                t_bwd = c_bwd = float("nan")
            else:
                t_bwd, c_bwd, _ = timed(with_grad(fn), w, z, repeats=args.repeats)
            print(f"{F:>7} {name:<30}{t_fwd * 1e3:>9.2f}{cell(t_bwd * 1e3, '>12.2f')}"
                  f"{c_fwd:>11.2f}{cell(err, '>9.1e')}{t_fwd / floor:>12.2f}x"
                  f"{cell(t_bwd / t_fwd, '>14.2f')}")
            method = METHODS.get(name, name)
            common = dict(case=f"F={F}", shape=z.shape, axis=0, dtype="float32")
            rows.append(row("recurrence", method=method, ms=t_fwd * 1e3, compile_s=c_fwd,
                            error=err, ratio=t_fwd / floor, ratio_to="floor", **common))
            if t_bwd == t_bwd:  # fwd+bwd: its ratio is to its own forward
                rows.append(row("recurrence", method=method, grad=True, ms=t_bwd * 1e3,
                                compile_s=c_bwd, ratio=t_bwd / t_fwd, ratio_to=method,
                                **common))

    print(f"compile time (F = {args.F[0]}): python loop under jit vs tridiax, growing T")
    for T in args.loop_T:
        z = jnp.zeros((T, args.F[0]), jnp.float32)
        w = jnp.zeros((args.F[0],), jnp.float32)
        _, c_loop, _ = timed(python_loop_indrnn, w, z, repeats=1)
        _, c_ours, _ = timed(lambda w, z: tridiax.indrnn(w, z), w, z, repeats=1)
        print(f"  T={T:<6} python loop {c_loop:7.2f} s   tridiax.indrnn {c_ours:5.2f} s")
        for method, compile_s in (("python loop", c_loop), ("tridiax.indrnn", c_ours)):
            rows.append(row("compile time", f"T={T}", method, shape=z.shape, axis=0,
                            dtype="float32", compile_s=compile_s))
    for T in (10, 1000, 100_000):
        z = jnp.zeros((T, 8), jnp.float32)
        _, c_ours, _ = timed(with_grad(lambda w, z: tridiax.indrnn(w, z)), jnp.zeros(8), z,
                             repeats=1)
        print(f"  T={T:<6} tridiax.indrnn forward+backward compile {c_ours:5.2f} s")
        rows.append(row("compile time", f"T={T}", "tridiax.indrnn", shape=z.shape, axis=0,
                        dtype="float32", grad=True, compile_s=c_ours))
    if args.json:
        write_rows(args.json, rows, {"args": vars(args)})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=1000)
    parser.add_argument("--F", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--loop-T", type=int, nargs="+", default=[50, 100, 200])
    add_json_option(parser)
    run(parser.parse_args())
