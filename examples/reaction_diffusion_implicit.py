"""Turing patterns in the Brusselator, stepped implicitly with 2 x 2 block-tridiagonal solves.

    python examples/reaction_diffusion_implicit.py [--quick] [--out figures/]

Two species on [0, L] with zero-flux ends,

    u_t = DU u_xx + A - (b + 1) u + u^2 v,    v_t = DV v_xx + b u - u^2 v,

whose uniform state (u, v) = (A, b / A) turns unstable to stripes (a Turing instability) when
b > b_c = (1 + A sqrt(DU / DV))^2, while staying stable to oscillations (b < 1 + A^2).

Linearly implicit (Rosenbrock) Euler, on N cells of width h: with w = (u, v) at every cell,

    (I - dt J(w_n)) (w_{n+1} - w_n) = dt f(w_n),   J = the Jacobian of f (diffusion + reaction),

first order in dt and stable at any step: the diffusion (the stiff part, eigenvalues down to
-4 DV / h^2) is implicit, the reaction linearised about the current state. The matrix is block
tridiagonal along the grid with 2 x 2 blocks: the reaction Jacobian couples the two species in
each cell (diag), diffusion couples neighbouring cells (lower, upper: diagonal blocks). It is
not symmetric, so every step is one `tridiax.solve_block_tridiagonal(lower, diag, upper, rhs)`
(pivoting inside the blocks), for several values of b at once: diag of shape (B, N, 2, 2), the
constant lower and upper (N, 2, 2) broadcast against it, rhs (B, N, 2).

Prints: one step against a dense `scipy.linalg.solve` of the assembled 2N x 2N system; the
error at t = 1 against a 16x finer step, falling at first order as dt halves; and, from the
uniform state plus 1e-3 noise, the pattern amplitude max |u - A| over time for each b: below
b_c the noise dies out, above it stripes grow and saturate, with about the spacing of the
fastest-growing linear mode.
"""

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
from _common import parse_args, save_figure

import tridiax

A, DU, DV = 3.0, 1.0, 10.0
B_VALUES = (3.0, 3.5, 4.0, 4.5, 5.0)
B_CRITICAL = (1 + A * np.sqrt(DU / DV)) ** 2


def solve_blocks(lower, diag, upper, rhs):
    """One block-tridiagonal solve along the grid (axis -1 of the batch-and-row dims)."""
    return tridiax.solve_block_tridiagonal(lower, diag, upper, rhs)


def rates(w, b):
    """f(w) without diffusion, and its Jacobian: w (..., N, 2), b (..., 1)."""
    u, v = w[..., 0], w[..., 1]
    reaction = jnp.stack([A - (b + 1) * u + u * u * v, b * u - u * u * v], -1)
    jacobian = jnp.stack([jnp.stack([-(b + 1) + 2 * u * v, u * u], -1),
                          jnp.stack([b - 2 * u * v, -u * u], -1)], -2)
    return reaction, jacobian


def laplacian(w, h):
    """Second difference along the grid (axis -2) with zero-flux ends (cell-centred)."""
    padded = jnp.concatenate([w[..., :1, :], w, w[..., -1:, :]], -2)  # ghosts copy the ends
    return (padded[..., 2:, :] - 2 * w + padded[..., :-2, :]) / h**2


def step_system(w, b, dt, h):
    """The blocks and right-hand side of one linearly implicit Euler step for the increment."""
    n = w.shape[-2]
    diffusion = jnp.asarray([DU, DV]) / h**2
    reaction, jacobian = rates(w, b)
    rhs = dt * (reaction + laplacian(w, h) * jnp.asarray([DU, DV]))
    # J[i, i] = reaction Jacobian - (2 or 1 at the zero-flux ends) diag(DU, DV) / h^2
    neighbours = jnp.full((n, 1), 2.0).at[0].set(1.0).at[-1].set(1.0)
    diag = jnp.eye(2) - dt * (jacobian - jnp.eye(2) * (neighbours * diffusion)[..., None])
    off = jnp.broadcast_to(jnp.eye(2) * (-dt * diffusion), (n, 2, 2))  # lower = upper
    return off, diag, off, rhs


def implicit_step(w, b, dt, h):
    return w + solve_blocks(*step_system(w, b, dt, h))


def run(w0, b, dt, h, steps, snapshots=1):
    """`snapshots` states (snapshots, B, N, 2), `steps // snapshots` steps apart, after w0."""

    def chunk(w, _):
        w = jax.lax.fori_loop(0, steps // snapshots, lambda _, w: implicit_step(w, b, dt, h), w)
        return w, w

    return jax.lax.scan(chunk, w0, None, length=snapshots)[1]


def dense_matrix(lower, diag, upper):
    """The assembled 2N x 2N matrix of one system (blocks (N, 2, 2))."""
    n, k = diag.shape[0], diag.shape[-1]
    a = np.zeros((n, k, n, k))
    for i in range(n):
        a[i, :, i] = diag[i]
        if i > 0:
            a[i, :, i - 1] = lower[i]
        if i < n - 1:
            a[i, :, i + 1] = upper[i]
    return a.reshape(n * k, n * k)


def fastest_mode(b, length, h):
    """The growth rate and wavelength of the fastest-growing cosine mode of the linearisation
    about the uniform state (the zero-flux modes cos(pi m x / L), the grid's eigenvalues)."""
    m = np.arange(1, int(length / h))
    k2 = (2 / h * np.sin(np.pi * m / (2 * length / h))) ** 2  # -(discrete Laplacian eigenvalue)
    growth = np.array([np.max(np.linalg.eigvals(np.array([[b - 1 - DU * q, A * A],
                                                          [-b, -A * A - DV * q]])).real)
                       for q in k2])
    best = np.argmax(growth)
    return growth[best], 2 * length / m[best]


def main():
    args = parse_args(__doc__)
    jax.config.update("jax_enable_x64", True)
    length = 64.0
    n, dt, t_final = (128, 0.1, 150.0) if args.quick else (512, 0.05, 200.0)
    h = length / n
    x = (np.arange(n) + 0.5) * h
    b = jnp.asarray(B_VALUES)[:, None]  # (B, 1): one system per value of b
    print(f"Brusselator, A = {A}, DU = {DU}, DV = {DV}: Turing threshold b_c = {B_CRITICAL:.3f}; "
          f"{len(B_VALUES)} values of b at once, {n} cells on [0, {length:g}]")
    print(f"2 x 2 blocks: diag {(len(B_VALUES), n, 2, 2)}, lower/upper {(n, 2, 2)}, "
          f"rhs {(len(B_VALUES), n, 2)}; dt = {dt} "
          f"(explicit Euler would need dt < h^2 / (2 DV) = {h**2 / (2 * DV):.4f})")

    # 1. One implicit step against a dense solve of the same 2N x 2N system.
    rng = np.random.default_rng(0)
    w = jnp.stack([jnp.broadcast_to(A + 0.5 * np.sin(2 * np.pi * x / length * 3)
                                    + 0.1 * rng.standard_normal(n), (len(B_VALUES), n)),
                   b[:, :1] / A + 0.3 * np.cos(2 * np.pi * x / length * 5)
                   + 0.1 * rng.standard_normal(n)], -1)  # (B, N, 2), away from uniform
    lower, diag, upper, rhs = step_system(w, b, dt, h)
    increment = np.asarray(jax.jit(solve_blocks)(lower, diag, upper, rhs))
    worst = 0.0
    for j in range(len(B_VALUES)):
        reference = scipy.linalg.solve(dense_matrix(np.asarray(lower), np.asarray(diag[j]),
                                                    np.asarray(upper)),
                                       np.asarray(rhs[j]).reshape(-1)).reshape(n, 2)
        worst = max(worst, np.max(np.abs(increment[j] - reference)) / np.max(np.abs(reference)))
    print(f"1. one implicit step, every b: max |increment - scipy.linalg.solve| / max |increment| "
          f"= {worst:.1e}")
    assert worst < 1e-12, "the block solve disagrees with the dense solve"

    # 2. First-order convergence in dt, to t = 1 from the smooth state above.
    steps_list = (10, 20, 40, 80)
    march = jax.jit(run, static_argnums=(4, 5))
    reference = march(w, b, 1.0 / (16 * steps_list[-1]), h, 16 * steps_list[-1])[-1]
    print("2. error at t = 1 against dt / 16 (max over the cells and the values of b):")
    print(f"{'dt':>10} {'max error':>12} {'order':>6}")
    errors = []
    for steps in steps_list:
        errors.append(float(jnp.max(jnp.abs(march(w, b, 1.0 / steps, h, steps)[-1] - reference))))
        order = f"{np.log2(errors[-2] / errors[-1]):6.3f}" if len(errors) > 1 else ""
        print(f"{1 / steps:>10.4f} {errors[-1]:>12.3e} {order:>6}")
    order = np.log2(errors[-2] / errors[-1])
    print(f"observed order in dt: {order:.3f} (expected 1)")
    assert abs(order - 1) < 0.15, "not first order"

    # 3. Pattern formation from the uniform state plus noise.
    steps, snapshots = int(round(t_final / dt)), 100  # snapshots divides steps
    w0 = jnp.stack([A + 1e-3 * rng.standard_normal((len(B_VALUES), n)),
                    b / A + 1e-3 * rng.standard_normal((len(B_VALUES), n))], -1)
    states = np.asarray(march(w0, b, dt, h, steps, snapshots))  # (snapshots, B, N, 2)
    times = np.arange(1, snapshots + 1) * (steps // snapshots) * dt
    amplitude = np.max(np.abs(states[..., 0] - A), axis=-1)  # (snapshots, B)
    initial = np.max(np.abs(np.asarray(w0[..., 0]) - A), axis=-1)
    print(f"3. {steps} implicit steps to t = {t_final:g}: amplitude max |u - A|; growth rate and "
          f"wavelength of the fastest-growing linear mode; stripes (maxima of u) and their spacing")
    half = snapshots // 2 - 1  # t_final / 2
    print(f"{'b':>6} {'growth rate':>14} {'t = 0':>10} {f't = {times[half]:g}':>10} "
          f"{f't = {times[-1]:g}':>10} {'stripes':>8} {'spacing':>8} {'fastest wavelength':>19}")
    for j, bj in enumerate(B_VALUES):
        growth, wavelength = fastest_mode(bj, length, h)
        u = states[-1, j, :, 0]
        peaks = int(np.sum((u[1:-1] > u[:-2]) & (u[1:-1] > u[2:]) & (u[1:-1] > A)))
        spacing = f"{length / peaks:8.2f}" if amplitude[-1, j] > 0.1 else f"{'-':>8}"
        stripes = peaks if amplitude[-1, j] > 0.1 else 0
        print(f"{bj:>6.2f} {growth:>14.3f} {initial[j]:>10.1e} {amplitude[half, j]:>10.1e} "
              f"{amplitude[-1, j]:>10.1e} {stripes:>8d} {spacing} {wavelength:>19.2f}")
        if bj < B_CRITICAL:
            assert amplitude[-1, j] < initial[j], f"b = {bj}: the noise did not die out"
        else:
            assert amplitude[-1, j] > 0.5, f"b = {bj}: no pattern formed"
    print(f"below b_c = {B_CRITICAL:.3f} the noise dies out; above it stripes grow from 1e-3 "
          f"and saturate")

    shown = B_VALUES.index(4.0)  # the one nearest the threshold: the slowest to grow
    print(f"figure: u(x, t) for b = {B_VALUES[shown]}, the final u for every b, and the amplitude "
          f"against t")

    def draw(figure):
        left, middle, right = figure.subplots(1, 3)
        image = left.imshow(states[:, shown, :, 0], aspect="auto", origin="lower",
                            extent=(0, length, 0, times[-1]), cmap="viridis")
        figure.colorbar(image, ax=left, label="u")
        left.set(xlabel="x", ylabel="t", title=f"u(x, t), b = {B_VALUES[shown]}")
        for j, bj in enumerate(B_VALUES):
            middle.plot(x, states[-1, j, :, 0], label=f"b = {bj}")
            right.semilogy(np.concatenate([[0], times]),
                           np.concatenate([[initial[j]], amplitude[:, j]]), label=f"b = {bj}")
        middle.set(xlabel="x", ylabel="u", title=f"u at t = {times[-1]:g}", xlim=(0, length / 2))
        middle.legend(fontsize=7)
        right.set(xlabel="t", ylabel="max |u - A|",
                  title=f"amplitude (b_c = {B_CRITICAL:.2f})")
        right.legend(fontsize=7)

    save_figure(args.out, "reaction_diffusion_implicit.png", draw, size=(12, 3.6))


if __name__ == "__main__":
    main()
