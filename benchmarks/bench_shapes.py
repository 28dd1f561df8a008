"""Every shape against the memory floor: many short systems, few long ones, one very long one.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/bench_shapes.py [--dtype float32 float64]
        [--quick] [--only SUBSTRING ...] [--skip-lax] [--json FILE]

For each shape (many short systems in both layouts, few long ones, one very long one, and
recurrences of many, few and one long sequence) it checks tridiax
against an independent reference on a sample of systems (tridiax.verify.reference_solve, i.e.
scipy's banded LAPACK solver; float64 jax.lax.associative_scan for recurrences), then times,
as the minimum of repeats after a warm-up, with compile time reported separately:

- tridiax forward, and forward+grad (the gradient of sum(x**2) w.r.t. every input);
- floor: one fused XLA elementwise op that reads as many arrays as the forward call and
  writes one (a*b + c*d for a solve, a*x + x for a recurrence): the memory floor;
- lax: jax.lax.linalg.tridiagonal_solve (last axis only, so the (N, B) layout pays the
  transposes a user would), or jax.lax.associative_scan for recurrences; forward and
  forward+grad.

Every ratio is taken from timings in this one run. --json writes the table as data (one row
per method and pass: tridiax, floor, lax or associative_scan, each forward and fwd+grad, with
`ratio` to the forward floor; see benchmarks/_timing.py), which benchmarks/plot.py draws.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from _timing import add_json_option, machine, row, write_rows  # benchmarks/ is on sys.path

import tridiax
from tridiax import verify

# (label, shape, axis, op): op "solve" (tridiagonal) or "recurrence" (linear recurrence).
SHAPES = [
    ("(N, B) = (100, 100 000)", (100, 100_000), 0, "solve"),
    ("(B, N) = (100 000, 100)", (100_000, 100), -1, "solve"),
    ("(N, B) = (10 000, 1 000)", (10_000, 1_000), 0, "solve"),
    ("(N, B) = (100 000, 64)", (100_000, 64), 0, "solve"),
    ("(N, B) = (1 000 000, 64)", (1_000_000, 64), 0, "solve"),
    ("(N, B) = (1 000 000, 128)", (1_000_000, 128), 0, "solve"),
    ("(N, B) = (1 000 000, 4)", (1_000_000, 4), 0, "solve"),
    ("(B, N) = (64, 1 000 000)", (64, 1_000_000), -1, "solve"),
    ("one system, N = 10 000 000", (10_000_000,), 0, "solve"),
    ("recurrence (T, F) = (1 000, 100 000)", (1_000, 100_000), 0, "recurrence"),
    ("recurrence (F, T) = (64, 1 000 000)", (64, 1_000_000), -1, "recurrence"),
    ("recurrence (T, F) = (10 000 000, 1)", (10_000_000, 1), 0, "recurrence"),
    ("recurrence (T, F) = (1 000 000, 4)", (1_000_000, 4), 0, "recurrence"),
]
# --quick: the same layouts, 100x smaller (a smoke run of the script itself).
QUICK = {
    (100, 100_000): (100, 1_000), (100_000, 100): (1_000, 100), (10_000, 1_000): (1_000, 100),
    (100_000, 64): (10_000, 8), (1_000_000, 64): (10_000, 64), (1_000_000, 128): (10_000, 16),
    (64, 1_000_000): (8, 10_000), (10_000_000,): (100_000,), (1_000, 100_000): (100, 1_000),
    (10_000_000, 1): (100_000, 1), (1_000_000, 4): (10_000, 4),
}


@dataclasses.dataclass
class Row:
    label: str
    dtype: str
    tridiax_ms: float
    floor_ms: float
    grad_ms: float
    lax_ms: float = float("nan")
    lax_grad_ms: float = float("nan")
    compile_s: float = float("nan")
    error: float = float("nan")
    # Where they were measured (for the data file): the arrays' shape, axis and operation, and
    # the compile times of the other columns.
    shape: tuple = ()
    axis: int = 0
    op: str = "solve"
    floor_compile_s: float = float("nan")
    grad_compile_s: float = float("nan")
    lax_compile_s: float = float("nan")
    lax_grad_compile_s: float = float("nan")

    @property
    def vs_floor(self):
        return self.tridiax_ms / self.floor_ms

    @property
    def lax_vs_tridiax(self):
        return self.lax_ms / self.tridiax_ms

    @property
    def grad_vs_fwd(self):
        return self.grad_ms / self.tridiax_ms


def time_best(fn, args, budget_s=3.0, max_repeats=30):
    """(best seconds, compile seconds): jit, compile, warm up, then the minimum of repeats
    (as many as fit in `budget_s`, at least 3)."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    first = time.perf_counter() - t0
    best = first
    for _ in range(int(min(max_repeats, max(3, budget_s / max(first, 1e-6))))):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        best = min(best, time.perf_counter() - t0)
    return best, compile_s, compiled


def solve_problem(shape, axis, dtype, seed=0):
    rng = np.random.default_rng(seed)
    lower, upper = rng.uniform(-1, 1, shape), rng.uniform(-1, 1, shape)
    diag = 3 + rng.uniform(0, 1, shape)
    rhs = rng.standard_normal(shape)
    return [jnp.asarray(a, dtype) for a in (lower, diag, upper, rhs)]


def recurrence_problem(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.5, 0.999, shape)
    x = rng.standard_normal(shape)
    return [jnp.asarray(v, dtype) for v in (a, x)]


def lax_solve(axis):
    def f(lower, diag, upper, rhs):
        if axis == 0 and rhs.ndim > 1:
            lower, diag, upper, rhs = (a.T for a in (lower, diag, upper, rhs))
        x = jax.lax.linalg.tridiagonal_solve(lower, diag, upper, rhs[..., None])[..., 0]
        return x.T if axis == 0 and rhs.ndim > 1 else x

    return f


def scan_recurrence(axis):
    def f(a, x):
        def combine(left, right):
            return left[0] * right[0], right[0] * left[1] + right[1]

        return jax.lax.associative_scan(combine, (a, x), axis=axis)[1]

    return f


def with_grad(f):
    def g(*args):
        return jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=tuple(range(len(args))))(*args)

    return g


def sample(arrays, axis, count=8):
    """A few systems (all of them if there are few) as NumPy arrays, systems along `axis`."""
    shape = arrays[0].shape
    if len(shape) == 1:
        return [np.asarray(a) for a in arrays]
    other = 1 - axis % 2
    idx = np.unique(np.linspace(0, shape[other] - 1, count).astype(int))
    return [np.asarray(jnp.take(a, idx, axis=other)) for a in arrays]


def relative_error(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(x - ref)) / np.max(np.abs(ref)))


def run_shape(label, shape, axis, op, dtype, skip_lax):
    if op == "solve":
        data = solve_problem(shape, axis, dtype)
        fwd = lambda *a: tridiax.solve_tridiagonal(*a, axis=axis)  # noqa: E731
        floor = lambda l, d, u, b: l * d + u * b  # noqa: E731
        baseline = lax_solve(axis)
    else:
        data = recurrence_problem(shape, dtype)
        fwd = lambda a, x: tridiax.linear_recurrence(a, x, axis=axis)  # noqa: E731
        floor = lambda a, x: a * x + x  # noqa: E731
        baseline = scan_recurrence(axis)
    t, compile_s, compiled = time_best(fwd, data)
    x = compiled(*data)
    if op == "solve":
        picked = sample([*data, x], axis)
        error = relative_error(picked[4], verify.reference_solve(*picked[:4], axis=axis))
    else:
        with jax.enable_x64(True):
            ref = scan_recurrence(axis)(*(jnp.asarray(np.asarray(v), jnp.float64) for v in data))
        error = relative_error(x, ref)
    del x
    t_floor, floor_compile_s, _ = time_best(floor, data)
    t_grad, grad_compile_s, grad = time_best(with_grad(fwd), data)
    result = Row(label, jnp.dtype(dtype).name, t * 1e3, t_floor * 1e3, t_grad * 1e3,
                 compile_s=compile_s, error=error, shape=tuple(shape), axis=axis, op=op,
                 floor_compile_s=floor_compile_s, grad_compile_s=grad_compile_s)
    if not skip_lax:
        t_lax, result.lax_compile_s, _ = time_best(baseline, data)
        result.lax_ms = t_lax * 1e3
        t_lax_grad, result.lax_grad_compile_s, lax_grad = time_best(with_grad(baseline), data)
        result.lax_grad_ms = t_lax_grad * 1e3
        # The two gradients agree (a check of tridiax's gradient against lax's).
        ours, theirs = grad(*data), lax_grad(*data)
        result.error = max(result.error, max(relative_error(g, h) for g, h in zip(ours, theirs)))
    return result


def data_rows(r):
    """The data file's rows of one Row: tridiax, the floor and lax (associative_scan for a
    recurrence), forward and fwd+grad, each with its ratio to the forward floor."""
    baseline = "lax" if r.op == "solve" else "associative_scan"
    common = dict(table="shapes", case=r.label, shape=list(r.shape), axis=r.axis, dtype=r.dtype,
                  ratio_to="floor", op=r.op)
    measured = [("tridiax", False, r.tridiax_ms, r.compile_s, r.error),
                ("floor", False, r.floor_ms, r.floor_compile_s, float("nan")),
                ("tridiax", True, r.grad_ms, r.grad_compile_s, float("nan")),
                (baseline, False, r.lax_ms, r.lax_compile_s, float("nan")),
                (baseline, True, r.lax_grad_ms, r.lax_grad_compile_s, float("nan"))]
    return [row(method=method, grad=grad, ms=ms, compile_s=compile_s, error=error,
                ratio=ms / r.floor_ms, **common)
            for method, grad, ms, compile_s, error in measured if ms == ms]  # NaN: not run


def fmt(value, spec):
    return format(value, spec) if value == value else "—"


def print_header():
    print("| data | dtype | tridiax ms | floor ms | tridiax / floor | lax or scan ms | "
          "lax / tridiax | fwd+grad ms | fwd+grad / fwd | lax fwd+grad ms | compile s | err |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def print_rows(rows):
    for r in rows:
        print(f"| {r.label} | {r.dtype} | {fmt(r.tridiax_ms, '.2f')} | {fmt(r.floor_ms, '.2f')} | "
              f"{fmt(r.vs_floor, '.2f')}x | {fmt(r.lax_ms, '.1f')} | {fmt(r.lax_vs_tridiax, '.1f')}x | "
              f"{fmt(r.grad_ms, '.1f')} | {fmt(r.grad_vs_fwd, '.2f')}x | {fmt(r.lax_grad_ms, '.1f')} | "
              f"{fmt(r.compile_s, '.2f')} | {fmt(r.error, '.0e')} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", nargs="+", default=["float32", "float64"])
    parser.add_argument("--quick", action="store_true", help="100x smaller shapes")
    parser.add_argument("--only", nargs="+", default=None,
                        help="only rows whose label contains one of these")
    parser.add_argument("--skip-lax", action="store_true")
    add_json_option(parser)
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", True)  # float64 rows; float32 rows pass float32 arrays
    print(f"machine: {machine()}")
    print_header()
    rows = []
    for dtype in args.dtype:
        for label, shape, axis, op in SHAPES:
            if args.only and not any(text in label for text in args.only):
                continue
            shape = QUICK.get(shape, shape) if args.quick else shape
            if args.quick:
                label = f"{label} [quick: {shape}]"
            result = run_shape(label, shape, axis, op, jnp.dtype(dtype), args.skip_lax)
            rows.append(result)
            print_rows([result])
    if args.json:
        write_rows(args.json, [d for r in rows for d in data_rows(r)], {"args": vars(args)})


if __name__ == "__main__":
    main()
