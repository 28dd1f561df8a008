"""Factor once, solve many; and the periodic solve, beside tridiax.solve_tridiagonal.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/bench_factor.py [--batch 100000] [--n 100]
        [--json FILE]

For the (N, B) layout with axis=0 and the (B, N) layout with axis=-1, and for per-system bands
(each system its own matrix) and one shared matrix (bands (N, 1) / (1, N), the constant-
coefficient time-stepping case), it checks each method against tridiax.verify on a sample of
systems, then times (minimum of --repeats after a warm-up; compile time separately):
- solve: tridiax.solve_tridiagonal;
- factored: TridiagonalFactorization.solve, the factors made once beforehand (not timed in it);
- factor: Tridiagonal.factor() itself, paid once;
- periodic: tridiax.solve_periodic_tridiagonal with the same bands (corners included);
- pivoted and periodic pivoted: the same two with pivoting=True.
Ratios are solve time / method time, measured side by side in this one run. --json writes the
table as data (table "factor", one row per method; there ratio = method time / the time of
`ratio_to`, the inverse of the printed solve / factored; see benchmarks/_timing.py).
"""

from __future__ import annotations

import argparse

import jax.numpy as jnp
import numpy as np
from _timing import add_json_option, machine, row, timed, write_rows  # benchmarks/ on sys.path

import tridiax
from tridiax import verify


def bands(n, batch, axis, shared, seed=0):
    rng = np.random.default_rng(seed)
    shape = (n, batch) if axis == 0 else (batch, n)
    bshape = ((n, 1) if axis == 0 else (1, n)) if shared else shape
    lo, up = rng.uniform(-1, 1, bshape), rng.uniform(-1, 1, bshape)
    di = 3 + rng.uniform(0, 1, bshape)
    rhs = rng.standard_normal(shape)
    return [jnp.asarray(a, jnp.float32) for a in (lo, di, up, rhs)]


def sample_error(x, args, axis, periodic=False, sample=50):
    idx = np.linspace(0, x.shape[1 - axis % 2] - 1, sample).astype(int)

    def take(a):
        a = np.asarray(a)
        if a.shape[1 - axis % 2] == 1:
            return a
        return a[:, idx] if axis == 0 else a[idx]

    ref = verify.reference_solve(*(take(a) for a in args), axis=axis, periodic=periodic)
    return float(np.max(np.abs(take(x) - ref)) / np.max(np.abs(ref)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=10)
    add_json_option(parser)
    args = parser.parse_args()
    rows = []  # the table as data, for --json
    print(f"machine: {machine()}; float32, {args.batch} systems of N = {args.n}, "
          f"min of {args.repeats}")
    header = (f"{'layout':>14} {'matrix':>10} {'solve ms':>9} {'factored ms':>12} {'ratio':>6} "
              f"{'factor ms':>10} {'periodic ms':>12} {'p/solve':>8} {'pivoted ms':>11} "
              f"{'periodic piv ms':>16} {'pp/piv':>7} {'max rel err':>12}")
    print(header)
    for axis, layout in ((0, "(N, B) axis 0"), (-1, "(B, N) axis -1")):
        for shared in (False, True):
            lo, di, up, rhs = bands(args.n, args.batch, axis, shared)
            op = tridiax.Tridiagonal(lo, di, up, axis=axis)
            t_solve, c_solve, solve = timed(lambda *a: tridiax.solve_tridiagonal(*a, axis=axis),
                                            lo, di, up, rhs, repeats=args.repeats)
            t_factor, c_factor, factor = timed(lambda o: o.factor(), op,
                                               repeats=max(1, args.repeats // 3))
            fact = factor(op)
            t_fact, c_fact, fsolve = timed(lambda f, b: f.solve(b), fact, rhs, repeats=args.repeats)
            t_per, c_per, periodic = timed(
                lambda *a: tridiax.solve_periodic_tridiagonal(*a, axis=axis), lo, di, up, rhs,
                repeats=args.repeats)
            t_piv, c_piv, _ = timed(
                lambda *a: tridiax.solve_tridiagonal(*a, axis=axis, pivoting=True), lo, di, up,
                rhs, repeats=args.repeats)
            t_pp, c_pp, periodic_pivoted = timed(
                lambda *a: tridiax.solve_periodic_tridiagonal(*a, axis=axis, pivoting=True), lo,
                di, up, rhs, repeats=args.repeats)
            data = (lo, di, up, rhs)
            errors = {"solve": sample_error(solve(*data), data, axis),
                      "factored solve": sample_error(fsolve(fact, rhs), data, axis),
                      "periodic": sample_error(periodic(*data), data, axis, True),
                      "periodic pivoted": sample_error(periodic_pivoted(*data), data, axis, True)}
            err = max(errors.values())
            print(f"{layout:>14} {'shared' if shared else 'per-system':>10} {t_solve * 1e3:9.1f} "
                  f"{t_fact * 1e3:12.1f} {t_solve / t_fact:6.2f} {t_factor * 1e3:10.1f} "
                  f"{t_per * 1e3:12.1f} {t_per / t_solve:8.2f} {t_piv * 1e3:11.1f} "
                  f"{t_pp * 1e3:16.1f} {t_pp / t_piv:7.2f} {err:12.1e}")
            matrix = "shared" if shared else "per-system"
            for method, seconds, compile_s, base, t_base in (
                    ("solve", t_solve, c_solve, "solve", t_solve),
                    ("factored solve", t_fact, c_fact, "solve", t_solve),
                    ("factor", t_factor, c_factor, "solve", t_solve),
                    ("periodic", t_per, c_per, "solve", t_solve),
                    ("pivoted", t_piv, c_piv, "solve", t_solve),
                    ("periodic pivoted", t_pp, c_pp, "pivoted", t_piv)):
                rows.append(row("factor", f"{layout}, {matrix}", method, shape=rhs.shape,
                                axis=axis, dtype="float32", ms=seconds * 1e3, compile_s=compile_s,
                                error=errors.get(method), ratio=seconds / t_base, ratio_to=base,
                                matrix=matrix))
    if args.json:
        write_rows(args.json, rows, {"args": vars(args)})


if __name__ == "__main__":
    main()
