"""Per-call cost of small solves: tridiax against jax.lax.linalg.tridiagonal_solve.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/bench_small.py [--repeats 7]
        [--sizes 10x10 100x32 1000x32] [--json FILE]

Users who solve small systems inside a time loop pay the cost of a call, not of memory. For
B systems of N rows in lax's own layout ((B, N), systems along the last axis, lax given its
(B, N, 1) right-hand side ready-made), three ways of calling, each side by side in this run:
- eager: the function called from Python, one call after another (dispatch included);
- jit: a jitted function of the four arrays, called from Python;
- scan: 100 solves inside one jitted lax.scan, per solve (what a time-stepping loop pays).
lax's CPU solver is LAPACK's gtsv, which pivots: tridiax is timed without and with pivoting.
Each figure is the minimum over --repeats of the mean over a batch of calls, after a warm-up.
--json writes the table as data (table "small", one row per size, call and method, `ms` per
solve (the table prints microseconds), `ratio` to lax: the inverse of the printed lax /
tridiax; see benchmarks/_timing.py).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from _timing import add_json_option, machine, row, write_rows  # benchmarks/ is on sys.path

import tridiax

SIZES = ((10, 10), (100, 32), (1000, 32))  # (B systems, N rows)
STEPS = 100


def per_call(fn, args, calls: int, repeats: int) -> float:
    """Seconds per call: the minimum over `repeats` of the mean of `calls` calls."""
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sizes", nargs="+", default=[f"{b}x{n}" for b, n in SIZES],
                        metavar="BxN", help="B systems of N rows (default: %(default)s)")
    add_json_option(parser)
    args = parser.parse_args()
    data = []  # the table as data, for --json

    def record(batch, n, call, t_lax, t_ours, t_piv):
        for method, seconds in (("lax", t_lax), ("tridiax", t_ours),
                                ("tridiax pivoting=True", t_piv)):
            data.append(row("small", f"{batch}x{n}, {call}", method, shape=(batch, n), axis=-1,
                            dtype="float32", ms=seconds * 1e3, ratio=seconds / t_lax,
                            ratio_to="lax", call=call))

    print(f"machine: {machine()}; float32, min of {args.repeats}")
    print(f"{'B x N':<10}{'call':<7}{'lax us':>9}{'tridiax us':>12}{'pivoted us':>12}"
          f"{'lax / tridiax':>15}{'lax / pivoted':>15}")
    for batch, n in (tuple(int(v) for v in size.split("x")) for size in args.sizes):
        rng = np.random.default_rng(0)
        lower, upper, rhs = (jnp.asarray(rng.uniform(-1, 1, (batch, n)), jnp.float32)
                             for _ in range(3))
        diag = jnp.asarray(3 + rng.uniform(0, 1, (batch, n)), jnp.float32)
        rhs3 = rhs[..., None]

        def ours(*a, pivoting=False):
            return tridiax.solve_tridiagonal(*a, pivoting=pivoting)

        def theirs(lo, di, up, b3):
            return jax.lax.linalg.tridiagonal_solve(lo, di, up, b3)

        def ours_pivoted(*a):
            return ours(*a, pivoting=True)

        x = ours(lower, diag, upper, rhs)
        np.testing.assert_allclose(x, theirs(lower, diag, upper, rhs3)[..., 0], rtol=1e-4,
                                   atol=1e-5)

        def scanned(solve, b):
            def step(b, _):
                return solve(lower, diag, upper, b), None

            return jax.lax.scan(step, b, None, length=STEPS)[0]

        calls = max(20, 20_000 // (batch * n) * 10)
        rows = {
            "eager": (theirs, ours, ours_pivoted, calls),
            "jit": (jax.jit(theirs), jax.jit(ours), jax.jit(ours_pivoted), calls),
        }
        for call, (f_lax, f_ours, f_piv, k) in rows.items():
            t_lax = per_call(f_lax, (lower, diag, upper, rhs3), k, args.repeats)
            t_ours = per_call(f_ours, (lower, diag, upper, rhs), k, args.repeats)
            t_piv = per_call(f_piv, (lower, diag, upper, rhs), k, args.repeats)
            print(f"{f'{batch}x{n}':<10}{call:<7}{t_lax * 1e6:>9.1f}{t_ours * 1e6:>12.1f}"
                  f"{t_piv * 1e6:>12.1f}{t_lax / t_ours:>14.2f}x{t_lax / t_piv:>14.2f}x")
            record(batch, n, call, t_lax, t_ours, t_piv)
        scan_lax = jax.jit(lambda b3: scanned(theirs, b3))
        scan_ours = jax.jit(lambda b: scanned(ours, b))
        scan_piv = jax.jit(lambda b: scanned(ours_pivoted, b))
        k = max(2, calls // STEPS)
        t_lax = per_call(scan_lax, (rhs3,), k, args.repeats) / STEPS
        t_ours = per_call(scan_ours, (rhs,), k, args.repeats) / STEPS
        t_piv = per_call(scan_piv, (rhs,), k, args.repeats) / STEPS
        print(f"{f'{batch}x{n}':<10}{'scan':<7}{t_lax * 1e6:>9.1f}{t_ours * 1e6:>12.1f}"
              f"{t_piv * 1e6:>12.1f}{t_lax / t_ours:>14.2f}x{t_lax / t_piv:>14.2f}x")
        record(batch, n, "scan", t_lax, t_ours, t_piv)
    if args.json:
        write_rows(args.json, data, {"args": vars(args)})


if __name__ == "__main__":
    main()
