"""Differentiable physics: recover a diffusivity profile kappa(x) from the final states of heat flow.

    python examples/inverse_diffusivity.py [--quick] [--out figures/]

Forward model: u_t = (kappa(x) u_x)_x on [0, 1] with u = 0 at both ends, 200 implicit Euler
steps of (I - dt L(kappa)) u_new = u, for a batch of initial conditions (one per column, solved
along axis 0 with one (n, 1) matrix shared by the batch). The matrix is factored once per forward
pass (`tridiax.Tridiagonal(...).factor()`) and each of the 200 steps reuses the pivots.

Inverse problem: from noisy observations of the final states only, find kappa (one value per cell
face, kappa = exp(theta)) by gradient descent (Adam) on the misfit plus a small smoothness
penalty. The gradient goes back through all 200 steps by implicit differentiation: each step's
reverse pass is one transposed solve, with no sweep differentiated and nothing stored but the
states. Prints the falling loss and the error of the recovered profile.
"""

import jax
import jax.numpy as jnp
import numpy as np
from _common import adam, parse_args, save_figure

import tridiax

STEPS, T_FINAL, NOISE = 200, 0.02, 0.01


def true_diffusivity(x):
    return 0.6 + 0.3 * np.tanh((x - 0.55) / 0.06) + 0.5 * np.exp(-(((x - 0.25) / 0.08) ** 2))


def final_states(theta: jax.Array, u0: jax.Array) -> jax.Array:
    """u(T_FINAL) for initial states u0 (n, batch); theta (n + 1,) = log kappa at the faces."""
    n = u0.shape[0]
    dt, h = T_FINAL / STEPS, 1 / (n + 1)
    face = (dt / h**2) * jnp.exp(theta)[:, None]  # (n + 1, 1): shared by every column
    # (I - dt L) with L u[i] = (kappa[i+1] (u[i+1] - u[i]) - kappa[i] (u[i] - u[i-1])) / h^2
    implicit = tridiax.Tridiagonal(-face[:-1], 1 + face[:-1] + face[1:], -face[1:], axis=0)
    factors = implicit.factor()

    def step(u, _):
        return factors.solve(u), None

    return jax.lax.scan(step, u0, None, length=STEPS)[0]


def main():
    args = parse_args(__doc__)
    jax.config.update("jax_enable_x64", True)
    n, batch, iterations = (48, 24, 150) if args.quick else (256, 128, 300)
    x = np.arange(1, n + 1) / (n + 1)
    faces = np.arange(n + 1) / (n + 1) + 0.5 / (n + 1)
    kappa_true = true_diffusivity(faces)

    # Initial states: bumps of several widths at positions spread over the rod.
    rng = np.random.default_rng(0)
    centres, widths = rng.uniform(0.05, 0.95, batch), rng.uniform(0.03, 0.15, batch)
    u0 = jnp.asarray(np.exp(-(((x[:, None] - centres) / widths) ** 2)))
    clean = final_states(jnp.log(jnp.asarray(kappa_true)), u0)
    observed = clean + NOISE * float(jnp.max(clean)) * rng.standard_normal(clean.shape)

    smoothness = 3e-7 * n**2  # penalises the integral of theta'(x)^2, whatever the grid

    def loss(theta):
        misfit = jnp.mean((final_states(theta, u0) - observed) ** 2) / jnp.mean(observed**2)
        return misfit + smoothness * jnp.mean(jnp.diff(theta) ** 2)

    init, update = adam(learning_rate=0.03)

    @jax.jit
    def descend(theta, state):
        value, gradient = jax.value_and_grad(loss)(theta)
        return value, *update(gradient, state, theta)

    def profile_error(theta):
        return float(np.linalg.norm(np.exp(theta) - kappa_true) / np.linalg.norm(kappa_true))

    print(f"{n} cells, {batch} initial conditions, {STEPS} implicit steps to t = {T_FINAL}, "
          f"{NOISE:.0%} noise; Adam, {iterations} iterations")
    history = []

    def report(k, loss, theta):
        history.append(loss)
        if k == 1 or k % (iterations // 10) == 0:
            print(f"  iteration {k:5d}  loss {loss:.3e}  profile error {profile_error(theta):.3f}")

    theta0 = jnp.zeros(n + 1)  # initial guess kappa = 1 everywhere
    # The gradient through 200 implicit steps, against a central difference of the loss.
    k, step = n // 3, 1e-6
    gradient = jax.jit(jax.grad(loss))(theta0)[k]
    bump, value_of = jnp.zeros(n + 1).at[k].set(step), jax.jit(loss)
    difference = (value_of(theta0 + bump) - value_of(theta0 - bump)) / (2 * step)
    print(f"d loss / d theta[{k}]: implicit differentiation {gradient:.6e}, "
          f"finite difference {difference:.6e}")
    assert abs(gradient - difference) < 1e-5 * abs(difference), "gradient check failed"

    theta, state = theta0, init(theta0)
    for iteration in range(1, iterations + 1):
        value, theta, state = descend(theta, state)
        report(iteration, float(value), theta)
    final_loss = float(value_of(theta))
    noise_floor = NOISE**2 * float(jnp.max(clean)) ** 2 / float(jnp.mean(observed**2))
    print(f"loss: {history[0]:.3e} -> {final_loss:.3e} (noise alone gives about {noise_floor:.1e})")
    print(f"profile error ||kappa - kappa_true|| / ||kappa_true||: {profile_error(theta0):.3f} "
          f"(initial guess) -> {profile_error(theta):.3f}")
    assert final_loss < 0.05 * history[0], "the loss did not fall"
    assert profile_error(theta) < 0.5 * profile_error(theta0), "the profile was not recovered"

    def draw(figure):
        left, right = figure.subplots(1, 2)
        left.plot(faces, kappa_true, "k-", label="true")
        left.plot(faces, np.exp(theta0), "k:", label="initial guess")
        left.plot(faces, np.exp(np.asarray(theta)), "C1-", label="recovered")
        left.set(xlabel="x", ylabel="kappa", title="diffusivity")
        left.legend()
        right.semilogy(np.arange(1, len(history) + 1), history)
        right.axhline(noise_floor, color="k", ls=":", label="noise level")
        right.set(xlabel="Adam iteration", ylabel="loss", title="loss through 200 implicit steps")
        right.legend()

    save_figure(args.out, "inverse_diffusivity.png", draw)


if __name__ == "__main__":
    main()
