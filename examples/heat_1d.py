"""Crank–Nicolson for the 1-D heat equation u_t = u_xx on [0, 1], u = 0 at both ends.

    python examples/heat_1d.py [--quick] [--out figures/]

A batch of initial conditions u0 = sin(pi x) + a sin(3 pi x) (one per column, solved along
axis 0) is stepped to t = 0.1 at three resolutions with dt proportional to h. Each step is
(I - dt/2 D2) u_new = (I + dt/2 D2) u: the left operator is factored once with
`tridiax.Tridiagonal(...).factor()` and every step reuses its pivots. Prints the maximum error
against the analytic solution exp(-pi^2 t) sin(pi x) + a exp(-9 pi^2 t) sin(3 pi x) and the
observed order of convergence, which is 2.
"""

import jax
import jax.numpy as jnp
import numpy as np
from _common import parse_args, save_figure

import tridiax

T_FINAL = 0.1


def crank_nicolson(u0: jax.Array, h: float, steps: int) -> jax.Array:
    """u0 of shape (n, batch) on the interior points x = h, 2h, ..., 1 - h; returns u(T_FINAL)."""
    n = u0.shape[0]
    dt = T_FINAL / steps
    off = jnp.full((n, 1), 1 / h**2)
    laplacian = tridiax.Tridiagonal(off, -2 * off, off, axis=0)  # (n, 1): shared by the batch
    implicit = laplacian.scale(-dt / 2).shift_diagonal(1.0).factor()  # I - dt/2 D2, once
    explicit = laplacian.scale(dt / 2).shift_diagonal(1.0)  # I + dt/2 D2

    def step(u, _):
        return implicit.solve(explicit.mv(u)), None

    u, _ = jax.lax.scan(step, u0, None, length=steps)
    return u


def exact(x: np.ndarray, amplitudes: np.ndarray, t: float) -> np.ndarray:
    return (np.exp(-np.pi**2 * t) * np.sin(np.pi * x)[:, None]
            + amplitudes[None, :] * np.exp(-9 * np.pi**2 * t) * np.sin(3 * np.pi * x)[:, None])


def main():
    args = parse_args(__doc__)
    jax.config.update("jax_enable_x64", True)
    cells = (32, 64, 128) if args.quick else (256, 512, 1024)
    batch = 16 if args.quick else 1000
    amplitudes = np.linspace(-1, 1, batch)
    run = jax.jit(crank_nicolson, static_argnums=(1, 2))

    print(f"Crank-Nicolson, {batch} initial conditions, t = {T_FINAL}, dt = {T_FINAL} h")
    print(f"{'points':>7} {'h':>10} {'steps':>6} {'max error':>11} {'order':>6}")
    errors, profiles = [], []
    for m in cells:
        h = 1 / m
        x = np.arange(1, m) * h
        u = np.asarray(run(jnp.asarray(exact(x, amplitudes, 0.0)), h, m))  # m steps: dt = 0.1 h
        errors.append(np.max(np.abs(u - exact(x, amplitudes, T_FINAL))))
        profiles.append((x, u[:, -1]))
        order = f"{np.log2(errors[-2] / errors[-1]):6.3f}" if len(errors) > 1 else ""
        print(f"{m - 1:>7} {h:>10.3e} {m:>6} {errors[-1]:>11.3e} {order:>6}")

    observed = np.log2(errors[-2] / errors[-1])
    print(f"observed order of convergence: {observed:.3f} (expected 2)")
    assert abs(observed - 2) < 0.1, f"order {observed:.3f} is not 2"

    def draw(figure):
        left, right = figure.subplots(1, 2)
        x_fine = np.linspace(0, 1, 400)
        left.plot(x_fine, exact(x_fine, amplitudes[-1:], 0.0)[:, 0], "k:", label="t = 0")
        left.plot(x_fine, exact(x_fine, amplitudes[-1:], T_FINAL)[:, 0], "k-",
                  label=f"exact, t = {T_FINAL}")
        x, u = profiles[0]
        left.plot(x, u, "o", ms=3, markevery=max(1, len(x) // 40),
                  label=f"Crank-Nicolson, {len(x)} points")
        left.set(xlabel="x", ylabel="u", title="one of the initial conditions")
        left.legend()
        h = 1 / np.asarray(cells)
        right.loglog(h, errors, "o-", label="max error")
        right.loglog(h, errors[0] * (h / h[0]) ** 2, "k--", label="slope 2")
        right.set(xlabel="h", ylabel="max |u - exact|", title=f"order {observed:.2f}")
        right.legend()

    save_figure(args.out, "heat_1d.png", draw)


if __name__ == "__main__":
    main()
