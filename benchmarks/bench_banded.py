"""Benchmark tridiax.solve_banded against SciPy, a dense solve and the memory floor.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/bench_banded.py [--batch 100000] [--n 100]
        [--json FILE]

Pentadiagonal systems (l = u = 2 unless --l/--u say otherwise), float32 unless --dtype, in both
layouts: (N, B) with axis=0 and (B, N) with axis=-1. Every method is first checked against
tridiax.verify.reference_solve_banded (SciPy) on a sample of systems; then each is timed
(minimum of --repeats after a warm-up; compile time reported separately), ratios side by side
in this one run:
- fused: one XLA elementwise op reading the l + u + 1 bands and b and writing one array, the
  memory floor of a banded solve;
- scipy loop: scipy.linalg.solve_banded called once per system (on --scipy-systems systems,
  scaled to the batch); SciPy has no batched banded solver (1.17: `ab` must be 2-d);
- dense: jnp.linalg.solve on the (B, N, N) matrices (on --dense-systems systems, scaled);
- grad: the solve plus the gradient of a scalar loss w.r.t. ab and b.
--json writes the table as data (table "banded", ratios to the floor; see benchmarks/_timing.py).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
from _timing import add_json_option, cell, machine, row, timed, write_rows  # benchmarks/ on sys.path

import tridiax
from tridiax import verify


def problem(l, u, n, batch, axis, dtype, seed=0):
    """(ab, b): dominant bands, ab (l + u + 1, *shape) with the rows along `axis`."""
    rng = np.random.default_rng(seed)
    shape = (n, batch) if axis == 0 else (batch, n)
    ab = rng.uniform(-1, 1, (l + u + 1,) + shape)
    ab[u] += (l + u + 1) * 1.0
    b = rng.standard_normal(shape)
    return jnp.asarray(ab, dtype), jnp.asarray(b, dtype)


def sample_error(x, ab, b, l, u, axis, sample=100):
    """Largest relative error of a sample of systems against SciPy."""
    columns = np.linspace(0, b.shape[1 if axis == 0 else 0] - 1, sample).astype(int)
    if axis == 0:
        ab_s, b_s, x_s = np.asarray(ab)[:, :, columns], np.asarray(b)[:, columns], \
            np.asarray(x)[:, columns]
    else:
        ab_s, b_s, x_s = np.asarray(ab)[:, columns], np.asarray(b)[columns], np.asarray(x)[columns]
    ref = verify.reference_solve_banded((l, u), ab_s, b_s, axis=axis)
    return float(np.max(np.abs(x_s - ref)) / np.max(np.abs(ref)))


def dense(ab, l, u):
    """(B, N, N) from (K, B, N) bands (scipy's layout along the last axis)."""
    k_count, _, n = ab.shape
    rows, cols = np.arange(n)[:, None], np.arange(n)[None, :]
    out = 0
    for k in range(k_count):
        out = out + jnp.where(rows - cols == k - u, ab[k][:, None, :], 0)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--l", type=int, default=2)
    parser.add_argument("--u", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--scipy-systems", type=int, default=2000)
    parser.add_argument("--dense-systems", type=int, default=2000)
    add_json_option(parser)
    args = parser.parse_args()
    data = []  # the table as data, for --json
    l, u, n, batch, dtype = args.l, args.u, args.n, args.batch, jnp.dtype(args.dtype)
    if dtype == jnp.float64:
        jax.config.update("jax_enable_x64", True)
    print(f"# {machine()}")
    print(f"# solve_banded ({l}, {u}): {batch} systems of N = {n}, {dtype.name}; times in ms, "
          "min of repeats; ratios to the fused floor measured in this run")
    header = (f"{'layout':<16}{'method':<22}{'ms':>10}{'/ floor':>9}{'compile s':>11}"
              f"{'rel. err':>10}")
    print(header)
    if jax.devices()[0].platform == "cpu":
        from tridiax._native import build as _native

        _native.available()  # build the native kernel now, not inside a compile time
    for axis in (0, -1):
        layout = "(N, B) axis 0" if axis == 0 else "(B, N) axis -1"
        ab, b = problem(l, u, n, batch, axis, dtype)

        def floor(ab, b):  # elementwise: XLA fuses it into one pass (a reduce over ab's
            return sum(ab[k] * b for k in range(ab.shape[0]))  # axis 0 would not)

        floor_s, floor_c, _ = timed(floor, ab, b, repeats=args.repeats)
        rows = [("fused floor", floor_s, floor_c, float("nan"))]
        methods = [("floor", False, {})]  # the data file's method of each printed row
        for pivoting in (True, False):
            def solve(ab, b, pivoting=pivoting):
                return tridiax.solve_banded((l, u), ab, b, axis=axis, pivoting=pivoting)

            seconds, compile_s, compiled = timed(solve, ab, b, repeats=args.repeats)
            error = sample_error(compiled(ab, b), ab, b, l, u, axis)
            rows.append((f"tridiax pivot={pivoting}", seconds, compile_s, error))
            methods.append((f"tridiax pivoting={pivoting}", False, {"pivoting": pivoting}))

            def loss(ab, b, solve=solve):
                return jnp.sum(jnp.sin(solve(ab, b)))

            grad_s, grad_c, _ = timed(jax.grad(loss, (0, 1)), ab, b, repeats=max(args.repeats // 2, 2))
            rows.append(("  fwd+grad", grad_s, grad_c, float("nan")))
            methods.append((f"tridiax pivoting={pivoting}", True, {"pivoting": pivoting}))
        # SciPy, one call per system, on a subset; scaled to the batch.
        count = min(args.scipy_systems, batch)
        moved_ab = np.asarray(ab) if axis == -1 else np.moveaxis(np.asarray(ab), 1, 2)
        moved_b = np.asarray(b) if axis == -1 else np.asarray(b).T
        start = time.perf_counter()
        for s in range(count):
            scipy.linalg.solve_banded((l, u), moved_ab[:, s], moved_b[s], check_finite=False)
        scipy_s = (time.perf_counter() - start) * batch / count
        rows.append((f"scipy loop (x{batch // count})", scipy_s, 0.0, float("nan")))
        methods.append(("scipy loop", False, {"systems_timed": count}))
        # Dense LU on a subset of (B, N, N) matrices; scaled to the batch.
        count = min(args.dense_systems, batch)
        sub_ab, sub_b = jnp.asarray(moved_ab[:, :count]), jnp.asarray(moved_b[:count])

        def dense_solve(ab, b):
            return jnp.linalg.solve(dense(ab, l, u), b[..., None])[..., 0]

        dense_s, dense_c, _ = timed(dense_solve, sub_ab, sub_b, repeats=3)
        rows.append((f"dense LU (x{batch // count})", dense_s * batch / count, dense_c,
                     float("nan")))
        methods.append(("dense LU", False, {"systems_timed": count}))
        for (name, seconds, compile_s, error), (method, grad, extra) in zip(rows, methods):
            print(f"{layout:<16}{name:<22}{seconds * 1e3:>10.2f}{seconds / floor_s:>9.2f}"
                  f"{compile_s:>11.2f}{cell(error, '>10.1e')}")
            data.append(row("banded", layout, method, shape=b.shape, axis=axis, dtype=dtype.name,
                            grad=grad, ms=seconds * 1e3, error=error,
                            compile_s=None if method == "scipy loop" else compile_s,
                            ratio=seconds / floor_s, ratio_to="floor", bands=[l, u], **extra))
    if args.json:
        write_rows(args.json, data, {"args": vars(args)})


if __name__ == "__main__":
    main()
