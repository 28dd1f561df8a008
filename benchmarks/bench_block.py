"""Benchmark tridiax.solve_block_tridiagonal against dense and banded solves and the memory floor.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/bench_block.py [--batch 100000] [--n 100] [--k 2 4 8]

Block-tridiagonal systems of N block rows with k x k blocks, float32 unless --dtype, in both
layouts: (N, B, k, k) blocks with axis=0 and (B, N, k, k) with axis=-1. Every method is first
checked against tridiax.verify.reference_solve_block_tridiagonal (SciPy) on a sample of
systems; then each is timed (minimum of --repeats after a warm-up; compile time reported
separately), ratios side by side in this one run:
- fused: one XLA elementwise op reading lower, diag, upper and rhs and writing x, the memory
  floor of a block-tridiagonal solve (written column by column, the form XLA:CPU runs at
  memory speed);
- banded: tridiax.solve_banded with bandwidths (2k - 1, 2k - 1) on the same matrices (the
  layout conversion not timed), the solver one would use without block support;
- dense: jnp.linalg.solve on the assembled (B, N k, N k) matrices, on --dense-systems systems
  and scaled to the batch (all of them would not fit in memory);
- grad: the solve plus the gradient of a scalar loss w.r.t. every block and rhs.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from _timing import cell, machine, timed  # benchmarks/ is on sys.path when run as a script

import tridiax
from tridiax import verify


def problem(k, n, batch, axis, dtype, seed=0):
    """lower, diag, upper (block diagonally dominant) and rhs, rows along `axis`."""
    rng = np.random.default_rng(seed)
    systems = (n, batch) if axis == 0 else (batch, n)
    lower, diag, upper = (rng.uniform(-1, 1, systems + (k, k)).astype(dtype) for _ in range(3))
    diag += (3 * k * np.eye(k)).astype(dtype)
    rhs = rng.standard_normal(systems + (k,)).astype(dtype)
    return [jnp.asarray(v) for v in (lower, diag, upper, rhs)]


def batch_first(arrays, axis):
    return [np.asarray(v) if axis == -1 else np.moveaxis(np.asarray(v), 0, 1) for v in arrays]


def sample_error(x, arrays, axis, sample=50):
    """Largest relative error of a sample of systems against SciPy."""
    lower, diag, upper, rhs, x = batch_first(list(arrays) + [x], axis)
    pick = np.linspace(0, rhs.shape[0] - 1, sample).astype(int)
    ref = verify.reference_solve_block_tridiagonal(lower[pick], diag[pick], upper[pick],
                                                   rhs[pick])
    return float(np.max(np.abs(x[pick] - ref)) / np.max(np.abs(ref)))


def to_band(lower, diag, upper, k):
    """scipy's band layout (4k - 1, B, N k) of batch-first blocks (B, N, k, k)."""
    w = 2 * k - 1
    b, n = diag.shape[:2]
    ab = np.zeros((2 * w + 1, b, n * k), diag.dtype)
    for offset, blocks in ((-1, lower), (0, diag), (1, upper)):
        for r in range(k):
            for c in range(k):
                rows = np.arange(n) * k + r  # A[i k + r, (i + offset) k + c]
                cols = (np.arange(n) + offset) * k + c
                inside = (cols >= 0) & (cols < n * k)
                ab[w + rows[inside] - cols[inside], :, cols[inside]] = \
                    blocks[:, inside, r, c].T
    return jnp.asarray(ab)


def dense(lower, diag, upper):
    """(B, N k, N k) matrices of batch-first blocks."""
    b, n, k = diag.shape[:3]
    out = jnp.zeros((b, n * k, n * k), diag.dtype)
    for i in range(n):
        rows = slice(i * k, (i + 1) * k)
        out = out.at[:, rows, rows].set(diag[:, i])
        if i > 0:
            out = out.at[:, rows, (i - 1) * k:i * k].set(lower[:, i])
        if i < n - 1:
            out = out.at[:, rows, (i + 1) * k:(i + 2) * k].set(upper[:, i])
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--k", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--dense-systems", type=int, default=200)
    parser.add_argument("--skip-banded", action="store_true")
    args = parser.parse_args()
    n, batch, dtype = args.n, args.batch, jnp.dtype(args.dtype)
    if dtype == jnp.float64:
        jax.config.update("jax_enable_x64", True)
    print(f"# {machine()}")
    print(f"# solve_block_tridiagonal: {batch} systems of N = {n} block rows, {dtype.name}; "
          "times in ms, min of repeats; ratios to the fused floor measured in this run")
    print(f"{'k':>3} {'layout':<16}{'method':<24}{'ms':>10}{'/ floor':>9}{'compile s':>11}"
          f"{'rel. err':>10}")
    if jax.devices()[0].platform == "cpu":
        from tridiax._native import build as _native

        _native.available()  # build the native kernel now, not inside a compile time
    for k in args.k:
        for axis in (0, -1):
            layout = "(N, B) axis 0" if axis == 0 else "(B, N) axis -1"
            arrays = problem(k, n, batch, axis, dtype)

            def floor(lower, diag, upper, rhs):  # reads the three blocks and rhs, writes x
                # Column by column: XLA:CPU fuses this into one pass at memory speed, where a
                # .sum(-1) over the k-wide last dimension ran 2-4x slower on the same bytes.
                return sum(lower[..., j] + diag[..., j] + upper[..., j]
                           for j in range(lower.shape[-1])) * rhs

            floor_s, floor_c, _ = timed(floor, *arrays, repeats=args.repeats)
            rows = [("fused floor", floor_s, floor_c, float("nan"))]
            for pivoting in (True, False):
                def solve(lower, diag, upper, rhs, pivoting=pivoting):
                    return tridiax.solve_block_tridiagonal(lower, diag, upper, rhs, axis=axis,
                                                           pivoting=pivoting)

                seconds, compile_s, compiled = timed(solve, *arrays, repeats=args.repeats)
                error = sample_error(compiled(*arrays), arrays, axis)
                rows.append((f"tridiax pivot={pivoting}", seconds, compile_s, error))
                if pivoting:
                    def loss(*arrays, solve=solve):
                        return jnp.sum(jnp.sin(solve(*arrays)))

                    grad_s, grad_c, _ = timed(jax.grad(loss, (0, 1, 2, 3)), *arrays,
                                              repeats=max(args.repeats // 2, 2))
                    rows.append(("  fwd+grad", grad_s, grad_c, float("nan")))
            first = batch_first(arrays, axis)
            if not args.skip_banded:
                ab = to_band(*first[:3], k)
                b = jnp.asarray(first[3].reshape(batch, n * k))
                w = 2 * k - 1

                def banded(ab, b):
                    return tridiax.solve_banded((w, w), ab, b, pivoting=True)

                seconds, compile_s, compiled = timed(banded, ab, b, repeats=args.repeats)
                x = np.asarray(compiled(ab, b)).reshape(batch, n, k)
                if axis == 0:
                    x = np.moveaxis(x, 0, 1)
                rows.append((f"solve_banded ({w}, {w})", seconds, compile_s,
                             sample_error(x, arrays, axis)))
                del ab, b
            count = min(args.dense_systems, batch)
            sub = [jnp.asarray(v[:count]) for v in first]

            def dense_solve(lower, diag, upper, rhs):
                a = dense(lower, diag, upper)
                return jnp.linalg.solve(a, rhs.reshape(count, n * k, 1))[..., 0]

            dense_s, dense_c, _ = timed(dense_solve, *sub, repeats=3)
            rows.append((f"dense LU (x{batch // count})", dense_s * batch / count, dense_c,
                         float("nan")))
            for name, seconds, compile_s, error in rows:
                print(f"{k:>3} {layout:<16}{name:<24}{seconds * 1e3:>10.2f}"
                      f"{seconds / floor_s:>9.2f}{compile_s:>11.2f}{cell(error, '>10.1e')}")


if __name__ == "__main__":
    main()
