"""2-D diffusion u_t = u_xx + u_yy by Peaceman–Rachford ADI, on one (nx, ny) array.

    python examples/adi_2d.py [--quick] [--out figures/]

Each step is two half steps on the unit square with u = 0 on the boundary:

    (I - dt/2 Dxx) u*    = (I + dt/2 Dyy) u      solve along axis 0 (every column at once)
    (I - dt/2 Dyy) u_new = (I + dt/2 Dxx) u*     solve along axis 1 (every row at once)

tridiax solves along axis 0 and then axis 1 of the same array, with no transposes. The result
is checked against the exact evolution of the same discrete scheme, computed with a type-I
discrete sine transform (scipy.fft.dstn diagonalises both difference operators). The same
scheme written the usual way, transposing so that every solve runs along the last axis (with
tridiax) or along the second-to-last axis (jax.lax.linalg.tridiagonal_solve), is timed beside it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import scipy.fft
from _common import best_time, parse_args, save_figure

import tridiax


def second_difference(n: int, axis: int) -> tridiax.Tridiagonal:
    """Dirichlet second difference on n interior points of [0, 1], along `axis` of a 2-D array."""
    h = 1 / (n + 1)
    off = jnp.full((n, 1) if axis == 0 else (1, n), 1 / h**2)  # shared by every column / row
    return tridiax.Tridiagonal(off, -2 * off, off, axis=axis)


def peaceman_rachford(u, dt, steps, solve_x, solve_y):
    """`steps` ADI steps; solve_x / solve_y apply (I - dt/2 D)^-1 along x / y."""
    dxx = second_difference(u.shape[0], axis=0).scale(dt / 2).shift_diagonal(1.0)
    dyy = second_difference(u.shape[1], axis=1).scale(dt / 2).shift_diagonal(1.0)

    def step(u, _):
        half = solve_x(dyy.mv(u))
        return solve_y(dxx.mv(half)), None

    return jax.lax.scan(step, u, None, length=steps)[0]


def in_place(nx, ny, dt):
    """tridiax along axis 0, then along axis 1: no data moves."""
    ax = second_difference(nx, axis=0).scale(-dt / 2).shift_diagonal(1.0)
    ay = second_difference(ny, axis=1).scale(-dt / 2).shift_diagonal(1.0)
    return ax.solve, ay.solve


def transposed(nx, ny, dt):
    """tridiax along the last axis only: the x solve transposes there and back."""
    ax = second_difference(nx, axis=1).scale(-dt / 2).shift_diagonal(1.0)
    ay = second_difference(ny, axis=1).scale(-dt / 2).shift_diagonal(1.0)
    return (lambda b: ax.solve(b.T).T), ay.solve


def lax_transposed(nx, ny, dt):
    """jax.lax.linalg.tridiagonal_solve solves along axis -2: the y solve transposes."""
    def bands(n):
        h = 1 / (n + 1)
        off = jnp.full((n,), -dt / 2 / h**2)
        return off.at[0].set(0.0), jnp.full((n,), 1 + dt / h**2), off.at[-1].set(0.0)

    bx, by = bands(nx), bands(ny)
    return (lambda b: jax.lax.linalg.tridiagonal_solve(*bx, b),
            lambda b: jax.lax.linalg.tridiagonal_solve(*by, b.T).T)


def dst_reference(u0: np.ndarray, dt: float, steps: int) -> np.ndarray:
    """The same discrete scheme, solved exactly in the sine basis."""
    (nx, ny), half = u0.shape, dt / 2

    def eigenvalues(n):
        h = 1 / (n + 1)
        return -4 / h**2 * np.sin(np.arange(1, n + 1) * np.pi * h / 2) ** 2

    ax, ay = half * eigenvalues(nx)[:, None], half * eigenvalues(ny)[None, :]
    growth = (1 + ax) * (1 + ay) / ((1 - ax) * (1 - ay))
    return scipy.fft.idstn(scipy.fft.dstn(u0, type=1) * growth**steps, type=1)


def initial_condition(nx, ny):
    x = np.arange(1, nx + 1)[:, None] / (nx + 1)
    y = np.arange(1, ny + 1)[None, :] / (ny + 1)
    return (np.exp(-((x - 0.3) ** 2 + (y - 0.6) ** 2) / 0.01)
            + 0.5 * np.exp(-((x - 0.7) ** 2 + 2 * (y - 0.3) ** 2) / 0.02))


def main():
    args = parse_args(__doc__)
    jax.config.update("jax_enable_x64", True)
    nx, ny = (96, 80) if args.quick else (1024, 768)  # nx != ny: an axis mix-up cannot pass
    dt, steps = 2e-4, 50
    u0 = initial_condition(nx, ny)
    print(f"Peaceman-Rachford ADI on a {nx} x {ny} grid, dt = {dt}, {steps} steps "
          f"(t = {dt * steps:g}), float64")

    u = np.asarray(jax.jit(lambda u: peaceman_rachford(u, dt, steps, *in_place(nx, ny, dt)))(u0))
    reference = dst_reference(u0, dt, steps)
    error = np.max(np.abs(u - reference)) / np.max(np.abs(reference))
    print(f"max |u - DST reference| / max |reference| = {error:.1e}")
    assert error < 1e-11, "ADI result differs from the sine-transform reference"

    print(f"time per ADI step (best of 5 after a warm-up; {jax.devices()[0].platform}):")
    timings = {}
    for name, solvers in (("tridiax, axis 0 then axis 1", in_place),
                          ("tridiax, last axis + transposes", transposed),
                          ("jax.lax.linalg.tridiagonal_solve + transposes", lax_transposed)):
        run = jax.jit(lambda u, s=solvers: peaceman_rachford(u, dt, steps, *s(nx, ny, dt)))
        compile_and_run, best = best_time(run, jnp.asarray(u0))
        other = np.asarray(run(jnp.asarray(u0)))
        assert np.max(np.abs(other - u)) < 1e-11 * np.max(np.abs(u)), f"{name} differs"
        timings[name] = best / steps
        print(f"  {name:<47} {1e3 * timings[name]:8.3f} ms "
              f"(first call, with compilation: {compile_and_run:.2f} s)")
    base = timings["tridiax, axis 0 then axis 1"]
    for name, t in list(timings.items())[1:]:
        print(f"  {name} / tridiax in place: {t / base:.2f}x")

    def draw(figure):
        panels = figure.subplots(1, 3)
        for ax, field, title in zip(panels, (u0, u, u - reference),
                                    ("u at t = 0", f"ADI, t = {dt * steps:g}",
                                     "ADI - DST reference"), strict=True):
            image = ax.imshow(field.T, origin="lower", extent=(0, 1, 0, 1), cmap="viridis")
            ax.set(title=title, xlabel="x (axis 0)", ylabel="y (axis 1)")
            figure.colorbar(image, ax=ax, shrink=0.8)

    save_figure(args.out, "adi_2d.png", draw, size=(12, 3.6))


if __name__ == "__main__":
    main()
