"""Implicit Euler for u_t = u_xx on a batch of rods; gradient of the final energy.

    python examples/implicit_diffusion.py [--quick] [--out DIR] [--n 128] [--rods 4096] [--steps 50]

Every step solves (I - r*D2) u_new = u for all rods at once, with one matrix of shape (N, 1)
shared by every rod (never copied). Prints the error of the last step against
scipy.linalg.solve_banded, the decay of the energy, and the gradient of the final energy
with respect to the diagonal, checked against a finite difference.
"""

import jax
import jax.numpy as jnp
import numpy as np
from _common import parse_args, save_figure

import tridiax


def simulate(diag, lower, upper, u0, steps):
    def step(u, _):
        u = tridiax.solve_tridiagonal(lower, diag, upper, u, axis=0)
        return u, jnp.sum(u**2)

    return jax.lax.scan(step, u0, None, length=steps)


def main():
    def add_sizes(parser):
        parser.add_argument("--n", type=int, default=None, help="points per rod (default 128)")
        parser.add_argument("--rods", type=int, default=None, help="number of rods (default 4096)")
        parser.add_argument("--steps", type=int, default=None, help="implicit steps (default 50)")

    args = parse_args(__doc__, add_sizes)
    jax.config.update("jax_enable_x64", True)
    n = args.n or (32 if args.quick else 128)
    rods = args.rods or (64 if args.quick else 4096)
    steps = args.steps or (10 if args.quick else 50)

    r = 0.5
    x = np.linspace(0, 1, n)
    phases = np.random.default_rng(0).uniform(0, 1, rods)
    u0 = jnp.asarray(np.sin(np.pi * x)[:, None] * (1 + phases[None, :]))
    lower = upper = jnp.full((n, 1), -r)
    diag = jnp.full((n, 1), 1 + 2 * r)

    one = tridiax.solve_tridiagonal(lower, diag, upper, u0, axis=0)
    ref = tridiax.verify.reference_solve(lower, diag, upper, u0, axis=0)
    print(f"one step, {rods} rods of {n} points: max |x - scipy| = "
          f"{np.max(np.abs(np.asarray(one) - ref)):.1e}")

    energy = lambda d: jnp.sum(simulate(d, lower, upper, u0, steps)[0] ** 2)  # noqa: E731
    final, energies = simulate(diag, lower, upper, u0, steps)
    e0, e1 = float(jnp.sum(u0**2)), float(energy(diag))
    print(f"energy: {e0:.4e} at t=0 -> {e1:.4e} after {steps} implicit steps")
    assert np.all(np.diff(np.asarray(energies)) < 0), "the energy must decay at every step"

    grad = jax.grad(energy)(diag)
    k, h = n // 2, 1e-6
    fd = (float(energy(diag.at[k, 0].add(h))) - float(energy(diag.at[k, 0].add(-h)))) / (2 * h)
    print(f"d energy / d diag[{k}]: implicit differentiation {float(grad[k, 0]):.6e}, "
          f"finite difference {fd:.6e}")
    assert np.isclose(float(grad[k, 0]), fd, rtol=1e-5), "gradient check failed"

    def draw(figure):
        left, right = figure.subplots(1, 2)
        for j in range(min(rods, 4)):
            left.plot(x, u0[:, j], color=f"C{j}", alpha=0.4)
            left.plot(x, final[:, j], color=f"C{j}")
        left.set(xlabel="x", ylabel="u", title=f"4 of {rods} rods: t = 0 (faint), after {steps} steps")
        right.semilogy(np.arange(1, steps + 1), energies)
        right.set(xlabel="step", ylabel="energy (all rods)", title="energy decays every step")

    save_figure(args.out, "implicit_diffusion.png", draw)


if __name__ == "__main__":
    main()
