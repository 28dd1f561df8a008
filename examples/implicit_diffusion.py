"""Implicit Euler for u_t = u_xx on a batch of rods; gradient of the final energy.

    python examples/implicit_diffusion.py [--n 128] [--rods 4096] [--steps 50]

Every step solves (I - r*D2) u_new = u for all rods at once, with one matrix of shape (N, 1)
shared by every rod (never copied). Prints the error of the last step against
scipy.linalg.solve_banded, the decay of the energy, and the gradient of the final energy
with respect to the diagonal, checked against a finite difference.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import tridiax


def simulate(diag, lower, upper, u0, steps):
    def step(u, _):
        return tridiax.solve_tridiagonal(lower, diag, upper, u, axis=0), None

    u, _ = jax.lax.scan(step, u0, None, length=steps)
    return u


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=128, help="points per rod (default 128)")
    parser.add_argument("--rods", type=int, default=4096, help="number of rods (default 4096)")
    parser.add_argument("--steps", type=int, default=50, help="implicit steps (default 50)")
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", True)

    n, r = args.n, 0.5
    x = np.linspace(0, 1, n)
    phases = np.random.default_rng(0).uniform(0, 1, args.rods)
    u0 = jnp.asarray(np.sin(np.pi * x)[:, None] * (1 + phases[None, :]))
    lower = upper = jnp.full((n, 1), -r)
    diag = jnp.full((n, 1), 1 + 2 * r)

    one = tridiax.solve_tridiagonal(lower, diag, upper, u0, axis=0)
    ref = tridiax.verify.reference_solve(lower, diag, upper, u0, axis=0)
    print(f"one step, {args.rods} rods of {n} points: max |x - scipy| = "
          f"{np.max(np.abs(np.asarray(one) - ref)):.1e}")

    energy = lambda d: jnp.sum(simulate(d, lower, upper, u0, args.steps) ** 2)  # noqa: E731
    e0, e1 = float(jnp.sum(u0**2)), float(energy(diag))
    print(f"energy: {e0:.4e} at t=0 -> {e1:.4e} after {args.steps} implicit steps")

    grad = jax.grad(energy)(diag)
    k, h = n // 2, 1e-6
    bumped = diag.at[k, 0].add(h)
    fd = (float(energy(bumped)) - float(energy(diag.at[k, 0].add(-h)))) / (2 * h)
    print(f"d energy / d diag[{k}]: implicit differentiation {float(grad[k, 0]):.6e}, "
          f"finite difference {fd:.6e}")
    assert np.isclose(float(grad[k, 0]), fd, rtol=1e-5), "gradient check failed"


if __name__ == "__main__":
    main()
