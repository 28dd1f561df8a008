"""Euler–Bernoulli beams u'''' = f on [0, 1]: pentadiagonal systems, second-order convergence.

    python examples/beam_pentadiagonal.py [--quick] [--out figures/]

Two beams with manufactured solutions (the loads f = u'''' come from differentiating u four
times with jax.grad, not from the scheme):

    simply supported (u = u'' = 0 at both ends): u = sin(pi x) + x^5 - 10/3 x^3 + 7/3 x
    clamped          (u = u'  = 0 at both ends): u = sin(pi x)^2 exp(x)

The 5-point stencil (1, -4, 6, -4, 1) / h^4 on the interior points x_i = i h with ghost values
u_{-1} = -u_1 (simply supported) or u_{-1} = u_1 (clamped) gives a pentadiagonal symmetric
positive definite matrix whose first and last diagonal entries are 5 or 7 instead of 6. Both
beams are ONE `tridiax.solve_banded((2, 2), ab, b)` call (ab of shape (5, 2, n): a matrix per
beam, broadcast against b of shape (2, n)), and again with `tridiax.solveh_banded` (the upper
triangle, shape (3, 2, n): the matrices are SPD). Prints both against
`scipy.linalg.solve_banded` (relative; they agree to rounding, which grows like the condition
number, ~ n^4: past about a thousand points in float64 rounding overtakes the O(h^2) truncation
error), the maximum error against the exact solution at each resolution and the observed order
of convergence, which is 2. Then times 2 x 2000 beams at once (b of shape (2, n, 2000)).
"""

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
from _common import best_time, parse_args, save_figure

import tridiax

BEAMS = ("simply supported", "clamped")
GHOST = {"simply supported": -1.0, "clamped": 1.0}  # u_{-1} = GHOST * u_1


def exact(beam: str, x):
    if beam == "simply supported":
        return jnp.sin(jnp.pi * x) + x**5 - 10 / 3 * x**3 + 7 / 3 * x
    return jnp.sin(jnp.pi * x) ** 2 * jnp.exp(x)


def load(beam: str, x):
    """f = u'''' by differentiating the exact solution four times."""
    d4 = jax.grad(jax.grad(jax.grad(jax.grad(lambda s: exact(beam, s)))))
    return jax.vmap(d4)(x)


def beam_bands(n: int, h: float):
    """The pentadiagonal matrices of both beams in scipy's layouts: solve_banded's ab
    (5, 2, n), ab[2 + i - j, j] = A[i, j], and solveh_banded's upper form (3, 2, n)."""
    ones = np.ones((len(BEAMS), n))
    diag = 6 * ones
    for k, beam in enumerate(BEAMS):  # the ghost value folds into the first and last rows
        diag[k, [0, -1]] += GHOST[beam]
    full = np.stack([ones, -4 * ones, diag, -4 * ones, ones]) / h**4  # rows u+i-j = 0..4
    return full, full[:3]


def main():
    args = parse_args(__doc__)
    jax.config.update("jax_enable_x64", True)
    sizes = (31, 63, 127) if args.quick else (31, 63, 127, 255, 511)
    solve = jax.jit(lambda ab, b: tridiax.solve_banded((2, 2), ab, b))
    solveh = jax.jit(lambda ab, b: tridiax.solveh_banded(ab, b))

    print("u'''' = f on [0, 1], 5-point stencil, both beams in one call (ab of shape (5, 2, n))")
    header = "".join(f"{beam + ' error':>24} {'order':>6}" for beam in BEAMS)
    print(f"{'n':>6} {'h':>10}{header}  {'|banded - scipy|':>16} {'|solveh - banded|':>17}")
    errors, solutions = [], []
    for n in sizes:
        h = 1 / (n + 1)
        x = np.arange(1, n + 1) * h
        ab, ab_upper = beam_bands(n, h)
        b = np.stack([np.asarray(load(beam, jnp.asarray(x))) for beam in BEAMS])  # (2, n)
        u = np.asarray(solve(jnp.asarray(ab), jnp.asarray(b)))
        u_h = np.asarray(solveh(jnp.asarray(ab_upper), jnp.asarray(b)))
        reference = np.stack([scipy.linalg.solve_banded((2, 2), ab[:, k], b[k])
                              for k in range(len(BEAMS))])
        scale = np.max(np.abs(reference))
        vs_scipy = np.max(np.abs(u - reference)) / scale
        vs_banded = np.max(np.abs(u_h - u)) / scale
        # Rounding: the matrix's condition number is about 16 (n + 1)^4 / pi^4, and three
        # direct solvers agree to eps times that (relative), no better.
        condition = 16 * (n + 1) ** 4 / np.pi**4
        assert max(vs_scipy, vs_banded) < np.finfo(np.float64).eps * condition, (vs_scipy, vs_banded)
        truth = np.stack([np.asarray(exact(beam, jnp.asarray(x))) for beam in BEAMS])
        errors.append(np.max(np.abs(u - truth), axis=1))
        solutions.append((x, u))
        row = ""
        for k in range(len(BEAMS)):
            order = f"{np.log2(errors[-2][k] / errors[-1][k]):6.3f}" if len(errors) > 1 else ""
            row += f"{errors[-1][k]:>24.3e} {order:>6}"
        print(f"{n:>6} {h:>10.3e}{row}  {vs_scipy:>16.1e} {vs_banded:>17.1e}")

    errors = np.asarray(errors)
    orders = np.log2(errors[-2] / errors[-1])
    for beam, order in zip(BEAMS, orders, strict=True):
        print(f"observed order of convergence, {beam}: {order:.3f} (expected 2)")
        assert abs(order - 2) < 0.1, f"{beam}: order {order:.3f} is not 2"

    # Many beams at once: the same two matrices for 2000 loads each, b of shape (2, n, 2000)
    # along axis 1 (ab's (5, 2, n) broadcasts as (5, 2, n, 1)).
    n, loads = sizes[-1], 200 if args.quick else 2000
    ab, ab_upper = beam_bands(n, 1 / (n + 1))
    b = jax.random.normal(jax.random.key(0), (len(BEAMS), n, loads))
    ab_many, ab_upper_many = jnp.asarray(ab)[..., None], jnp.asarray(ab_upper)[..., None]
    many = jax.jit(lambda ab, b: tridiax.solve_banded((2, 2), ab, b, axis=1))
    many_h = jax.jit(lambda ab, b: tridiax.solveh_banded(ab, b, axis=1))
    for name, fn, bands in (("solve_banded", many, ab_many), ("solveh_banded", many_h, ab_upper_many)):
        _, best = best_time(fn, bands, b)
        print(f"{name}: {len(BEAMS) * loads} beams of {n} points in {1e3 * best:.1f} ms (best of 5)")

    def draw(figure):
        left, right = figure.subplots(1, 2)
        x_fine = np.linspace(0, 1, 400)
        x, u = solutions[0]
        for k, beam in enumerate(BEAMS):
            line, = left.plot(x_fine, exact(beam, jnp.asarray(x_fine)), "-", label=f"{beam}, exact")
            left.plot(x, u[k], "o", ms=3, color=line.get_color(), markevery=max(1, len(x) // 30),
                      label=f"{beam}, {len(x)} points")
        left.set(xlabel="x", ylabel="u", title="deflection")
        left.legend(fontsize=8)
        h = 1 / (np.asarray(sizes) + 1)
        for k, beam in enumerate(BEAMS):
            right.loglog(h, errors[:, k], "o-", label=f"{beam} (order {orders[k]:.2f})")
        right.loglog(h, errors[0, 0] * (h / h[0]) ** 2, "k--", label="slope 2")
        right.set(xlabel="h", ylabel="max |u - exact|", title="error")
        right.xaxis.set_minor_formatter("")  # no crowded minor-tick labels
        right.legend(fontsize=8)

    save_figure(args.out, "beam_pentadiagonal.png", draw)


if __name__ == "__main__":
    main()
