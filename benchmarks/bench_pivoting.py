"""Partial pivoting: its accuracy against scipy and its cost beside the unpivoted solve.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/bench_pivoting.py [--batch 100000] [--n 100]
    python benchmarks/bench_pivoting.py --accuracy      # only the accuracy table (README)
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/bench_pivoting.py --long
    (either one with --json FILE: also write the tables as data)

Accuracy: for float32 and float64, N = 10, 1000 and 100000 (batches of 1000, 100 and 4
systems along the last axis), diagonally dominant (|diag| in [2, 3], off-diagonals in [-1, 1]),
random non-dominant (every band uniform in [-1, 1]) and 1-D Helmholtz (indefinite) matrices,
with and without pivoting: the
largest relative error ||x - x_scipy||_inf / ||x_scipy||_inf over the systems, where x_scipy is
scipy.linalg.solve_banded (LAPACK gbsv, partial pivoting) in float64 on the same (rounded)
inputs, and the largest normwise backward error ||b - Ax|| / (||A|| ||x|| + ||b||).

Cost: tridiax.solve_tridiagonal with pivoting=True beside pivoting=False, (N, B) along axis 0
and (B, N) along the last axis, float32 and float64, minimum of --repeats after a warm-up,
compile time separately; the ratio is measured side by side in one run.

Long (--long): few long systems with pivoting=True, split into checked pivoted chunks by the
planner beside one sequential sweep per system (`tridiax.TDMA(pivoting=True, chunk=0)`), the
unpivoted solve and the memory floor (a*b + c*d), random and Helmholtz matrices, with the
normwise backward error of each pivoted answer.

--json writes the tables as data (tables "accuracy", with `error` and `backward_error`, and
"cost"; see benchmarks/_timing.py).
"""

from __future__ import annotations

import argparse

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _timing import add_json_option, cell, machine, row, timed, write_rows  # noqa: E402  (on sys.path)

import tridiax  # noqa: E402
from tridiax import verify  # noqa: E402

SIZES = ((10, 1000), (1000, 100), (100_000, 4))  # (N, systems)


def matrices(n, systems, kind, seed=0):
    """"dominant", "random" (every band uniform in [-1, 1]) or "helmholtz": the 1-D Helmholtz
    operator -u'' - k^2 u, rows (-1, 2 - (kh)^2, -1), kh uniform in [1, 1.5] per system
    (indefinite: the unpivoted pivots wander through zero)."""
    rng = np.random.default_rng(seed)
    lower, upper, rhs = (rng.uniform(-1, 1, (systems, n)) for _ in range(3))
    diag = rng.uniform(-1, 1, (systems, n))
    if kind == "dominant":
        diag = np.sign(diag) * (2 + np.abs(diag))
    elif kind == "helmholtz":
        lower, upper = -np.ones((systems, n)), -np.ones((systems, n))
        diag = np.broadcast_to(2 - rng.uniform(1, 1.5, (systems, 1)) ** 2, (systems, n))
    return lower, diag, upper, rhs


def accuracy_table(rows):
    print("max relative error against scipy.linalg.solve_banded (max backward error), "
          "systems along the last axis")
    print(f"{'dtype':>8} {'N':>7} {'matrix':>10} {'no pivoting':>22} {'pivoting=True':>22}")
    for dtype in (np.float32, np.float64):
        for n, systems in SIZES:
            for kind in ("dominant", "random", "helmholtz"):
                args = [a.astype(dtype) for a in matrices(n, systems, kind)]
                wide = [a.astype(np.float64) for a in args]
                reference = verify.reference_solve(*wide, axis=-1)
                cells = []
                for pivoting in (False, True):
                    x = np.asarray(tridiax.solve_tridiagonal(*(jnp.asarray(a) for a in args),
                                                             pivoting=pivoting), np.float64)
                    with np.errstate(invalid="ignore"):
                        forward = np.max(np.abs(x - reference), axis=-1) / np.max(
                            np.abs(reference), axis=-1)
                        backward = verify.relative_residual(*wide[:3], x, wide[3], axis=-1)
                    worst = lambda v: np.inf if not np.all(np.isfinite(v)) else np.max(v)  # noqa: E731
                    cells.append(f"{worst(forward):9.1e} ({worst(backward):7.1e})")
                    rows.append(row("accuracy", f"N={n}, {kind}", f"tridiax pivoting={pivoting}",
                                    shape=(systems, n), axis=-1, dtype=np.dtype(dtype).name,
                                    error=worst(forward), backward_error=worst(backward),
                                    pivoting=pivoting, matrix=kind))
                print(f"{np.dtype(dtype).name:>8} {n:>7} {kind:>10} {cells[0]:>22} {cells[1]:>22}")


def cost_table(batch, n, repeats, rows):
    print(f"\ntime of one solve, {batch} systems of N = {n} (min of {repeats}; machine: "
          f"{machine()})")
    print(f"{'dtype':>8} {'layout':>16} {'no pivoting':>12} {'pivoting':>12} {'ratio':>7} "
          f"{'compile (s)':>12}")
    for dtype in (np.float32, np.float64):
        for axis in (0, -1):
            lower, diag, upper, rhs = matrices(n, batch, "dominant")
            args = [jnp.asarray(a.T if axis == 0 else a, dtype) for a in (lower, diag, upper, rhs)]
            times, compiles = [], []
            for pivoting in (False, True):
                def fn(*a, pivoting=pivoting):
                    return tridiax.solve_tridiagonal(*a, axis=axis, pivoting=pivoting)

                best, compile_s, compiled = timed(fn, *args, repeats=repeats)
                sample = [a[:, :50] if axis == 0 else a[:50] for a in args]
                x = np.asarray(compiled(*args))
                x = x[:, :50] if axis == 0 else x[:50]
                ref = verify.reference_solve(*(np.asarray(a) for a in sample), axis=axis)
                assert np.max(np.abs(x - ref)) <= 1e-4 * np.max(np.abs(ref)), "wrong result"
                times.append(best)
                compiles.append(compile_s)
            layout = f"({n}, {batch}) ax0" if axis == 0 else f"({batch}, {n}) ax-1"
            for pivoting, best, compile_s in zip((False, True), times, compiles):
                rows.append(row("cost", layout, f"tridiax pivoting={pivoting}",
                                shape=args[3].shape, axis=axis, dtype=np.dtype(dtype).name,
                                ms=best * 1e3, compile_s=compile_s, ratio=best / times[0],
                                ratio_to="tridiax pivoting=False", pivoting=pivoting))
            print(f"{np.dtype(dtype).name:>8} {layout:>16} {cell(1e3 * times[0], '>9.2f')} ms "
                  f"{cell(1e3 * times[1], '>9.2f')} ms {times[1] / times[0]:>6.2f}x "
                  f"{compiles[0]:>5.2f}/{compiles[1]:.2f}")


LONG_SHAPES = (((10_000_000,), 0), ((1_000_000, 4), 0), ((4, 1_000_000), -1))


def long_table(repeats, rows):
    print(f"\nfew long systems, pivoting=True: chunked (planner) against one sequential sweep "
          f"(min of {repeats}; machine: {machine()})")
    print(f"{'dtype':>8} {'data':>22} {'matrix':>10} {'floor':>9} {'unpivoted':>10} "
          f"{'sequential':>11} {'chunked':>9} {'speed-up':>8} {'backward error (seq, chunked)':>30}")
    for dtype in (np.float32, np.float64):
        for shape, axis in LONG_SHAPES:
            n = shape[axis]
            systems = int(np.prod(shape)) // n
            for kind in ("random", "helmholtz"):
                bands = [np.moveaxis(a, -1, axis).reshape(shape)
                         for a in matrices(n, systems, kind)]
                args = [jnp.asarray(a, dtype) for a in bands]
                wide = [np.asarray(a, np.float64) for a in args]

                def solver(**kw):
                    def fn(l, d, u, b):
                        return tridiax.TDMA(**kw)(tridiax.Tridiagonal(l, d, u, axis=axis), b)
                    return fn

                cases = {"floor": lambda l, d, u, b: l * d + u * b,
                         "unpivoted": solver(),
                         "sequential": solver(pivoting=True, chunk=0),
                         "chunked": solver(pivoting=True)}
                ms, errors = {}, {}
                for name, fn in cases.items():
                    best, compile_s, compiled = timed(fn, *args, repeats=repeats)
                    ms[name] = best * 1e3
                    if name in ("sequential", "chunked"):
                        x = np.asarray(compiled(*args), np.float64)
                        errors[name] = float(np.max(verify.relative_residual(
                            *wide[:3], x, wide[3], axis=axis)))
                    rows.append(row("long", f"{shape} axis {axis}, {kind}", f"tridiax {name}",
                                    shape=shape, axis=axis, dtype=np.dtype(dtype).name,
                                    ms=ms[name], compile_s=compile_s, matrix=kind,
                                    backward_error=errors.get(name, float("nan"))))
                print(f"{np.dtype(dtype).name:>8} {str(shape) + ' ax' + str(axis):>22} {kind:>10} "
                      f"{ms['floor']:>6.2f} ms {ms['unpivoted']:>7.2f} ms "
                      f"{ms['sequential']:>8.2f} ms {ms['chunked']:>6.2f} ms "
                      f"{ms['sequential'] / ms['chunked']:>7.1f}x "
                      f"{errors['sequential']:>14.1e} {errors['chunked']:>14.1e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--accuracy", action="store_true", help="only the accuracy table")
    parser.add_argument("--long", action="store_true",
                        help="only the table of few long pivoted systems (chunked)")
    add_json_option(parser)
    args = parser.parse_args()
    rows = []  # the tables as data, for --json
    if args.long:
        long_table(args.repeats, rows)
        if args.json:
            write_rows(args.json, rows, {"args": vars(args)})
        return
    accuracy_table(rows)
    if not args.accuracy:
        cost_table(args.batch, args.n, args.repeats, rows)
    if args.json:
        write_rows(args.json, rows, {"args": vars(args)})


if __name__ == "__main__":
    main()
