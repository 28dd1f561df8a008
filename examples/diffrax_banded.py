"""A stiff PDE in diffrax with a banded Newton solve: Swift–Hohenberg by the method of lines.

    python examples/diffrax_banded.py [--quick] [--out figures/] [--steps S]

    u_t = r u - (1 + d_xx)^2 u - u^3    on [0, L], u = u_xx = 0 at both ends,

with r = 0.3 and L = 32 pi. The 5-point stencil on N interior points makes the right-hand
side's Jacobian pentadiagonal, r - (I + D2)^2 - 3 diag(u^2), with eigenvalues down to about
-16 / h^4 (stiff). diffrax's Kvaerno5 (an L-stable ESDIRK method) solves each implicit stage by
`optimistix.Newton`, once with `linear_solver=tridiax.lineax.Banded(2, 2)` (the band read with
5 JVPs, an O(N) banded LU) and once with lineax's default dense solver (the Jacobian
materialised with N JVPs, an O(N^3) LU). Prints

1. an adaptive run (PID step-size control) to t = 40 with both linear solvers: the number of
   steps and the largest difference between the two solutions;
2. time per step, after compilation, with a fixed step for N = 256 ... 4096 (dense only up to
   1024: its cost grows like N^3, seconds per step there), and the slope of log time against log N: about 1
   for the banded solve, 2 to 3 for the dense one.
"""

import numpy as np
from _common import best_time, parse_args, save_figure

R, LENGTH = 0.3, 32 * np.pi


def add_arguments(parser):
    parser.add_argument("--steps", type=int, default=None,
                        help="fixed steps per timed run (default 10, 3 with --quick)")


def vector_field(t, u, args):
    """r u - (1 + D2)^2 u - u^3 with ghost values u_{-1} = -u_1 (u = u_xx = 0 at the ends)."""
    import jax.numpy as jnp

    h = LENGTH / (u.shape[0] + 1)
    p = jnp.concatenate([-u[:1], jnp.zeros(1, u.dtype), u, jnp.zeros(1, u.dtype), -u[-1:]])
    d2 = (p[1:-3] - 2 * p[2:-2] + p[3:-1]) / h**2
    d4 = (p[:-4] - 4 * p[1:-3] + 6 * p[2:-2] - 4 * p[3:-1] + p[4:]) / h**4
    return (R - 1) * u - 2 * d2 - d4 - u**3


def initial_condition(n: int):
    """A localised roll pattern in the middle of the domain, which spreads to fill it."""
    x = np.arange(1, n + 1) * LENGTH / (n + 1)
    return 0.5 * np.cos(x) * np.exp(-(((x - LENGTH / 2) / (LENGTH / 10)) ** 2))


def make_solve(linear_solver, *, t1, dt=None, saveat_ts=None):
    """A jitted u0 -> diffrax solution: Kvaerno5 with Newton on every implicit stage, adaptive
    (dt None) or `round(t1 / dt)` fixed steps."""
    import diffrax
    import equinox as eqx
    import optimistix as optx

    newton = optx.Newton(rtol=1e-8, atol=1e-8) if linear_solver is None else optx.Newton(
        rtol=1e-8, atol=1e-8, linear_solver=linear_solver)
    solver = diffrax.Kvaerno5(root_finder=newton)
    if dt is None:
        controller, dt0 = diffrax.PIDController(rtol=1e-6, atol=1e-8), 1e-3
    else:
        controller, dt0 = diffrax.ConstantStepSize(), dt
    saveat = diffrax.SaveAt(ts=saveat_ts) if saveat_ts is not None else diffrax.SaveAt(t1=True)

    @eqx.filter_jit
    def solve(u0):
        return diffrax.diffeqsolve(diffrax.ODETerm(vector_field), solver, t0=0.0, t1=t1, dt0=dt0,
                                   y0=u0, saveat=saveat, stepsize_controller=controller,
                                   max_steps=100_000)

    return solve


def main():
    args = parse_args(__doc__, add_arguments)
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    from tridiax.lineax import Banded

    banded = Banded(2, 2)

    # 1. Same answer: adaptive steps, banded against dense.
    n_check, t_final = (128, 10.0) if args.quick else (256, 40.0)
    ts = np.linspace(0, t_final, 41)
    u0 = jnp.asarray(initial_condition(n_check))
    runs = {name: make_solve(solver, t1=t_final, saveat_ts=jnp.asarray(ts))(u0)
            for name, solver in (("banded", banded), ("dense", None))}
    difference = float(jnp.max(jnp.abs(runs["banded"].ys - runs["dense"].ys)))
    scale = float(jnp.max(jnp.abs(runs["dense"].ys)))
    print(f"Swift-Hohenberg, r = {R}, L = 32 pi, Kvaerno5 + optimistix.Newton, adaptive steps "
          f"(rtol 1e-6), N = {n_check}, t = 0 .. {t_final:g}")
    for name, sol in runs.items():
        print(f"  {name:>6}: {int(sol.stats['num_accepted_steps'])} accepted steps, "
              f"{int(sol.stats['num_rejected_steps'])} rejected, max |u(t)| = "
              f"{float(jnp.max(jnp.abs(sol.ys[-1]))):.4f}")
    print(f"max |u_banded - u_dense| over the saved times = {difference:.1e} "
          f"(relative {difference / scale:.1e})")
    assert difference / scale < 1e-6, difference
    assert int(runs["banded"].stats["num_accepted_steps"]) == int(
        runs["dense"].stats["num_accepted_steps"])

    # 2. Time per step, fixed steps.
    steps = args.steps or (3 if args.quick else 10)
    dt = 0.05
    sizes = (64, 128, 256) if args.quick else (256, 512, 1024, 2048, 4096)
    dense_up_to = 256 if args.quick else 1024
    print(f"time per Kvaerno5 step ({steps} steps of dt = {dt}, best of 5 after compilation; "
          f"{jax.devices()[0].platform}, float64):")
    print(f"{'N':>6} {'banded ms/step':>15} {'dense ms/step':>14} {'dense/banded':>13} "
          f"{'max |banded - dense|':>21}")
    timings = {"banded": [], "dense": []}
    for n in sizes:
        u0 = jnp.asarray(initial_condition(n))
        row, finals = {}, {}
        for name, solver in (("banded", banded), ("dense", None)):
            if name == "dense" and n > dense_up_to:
                continue
            solve = make_solve(solver, t1=steps * dt, dt=dt)
            _, best = best_time(solve, u0, repeats=5)
            finals[name] = solve(u0).ys[-1]
            row[name] = best / steps
            timings[name].append((n, best / steps))
        dense = f"{1e3 * row['dense']:14.2f}" if "dense" in row else f"{'-':>14}"
        ratio = f"{row['dense'] / row['banded']:12.1f}x" if "dense" in row else f"{'-':>13}"
        diff = (f"{float(jnp.max(jnp.abs(finals['banded'] - finals['dense']))):21.1e}"
                if "dense" in finals else f"{'-':>21}")
        print(f"{n:>6} {1e3 * row['banded']:15.2f} {dense} {ratio} {diff}")
        if "dense" in finals:
            assert float(jnp.max(jnp.abs(finals["banded"] - finals["dense"]))) < 1e-8

    slopes = {}
    for name, points in timings.items():
        n, t = np.log(np.asarray(points)).T
        slopes[name] = np.polyfit(n, t, 1)[0]
    print(f"slope of log(time per step) against log N, N = {sizes[0]} .. {sizes[-1]}: "
          f"banded {slopes['banded']:.2f}, dense (to {dense_up_to}) {slopes['dense']:.2f}")

    def draw(figure):
        left, right = figure.subplots(1, 2)
        x = np.arange(1, n_check + 1) * LENGTH / (n_check + 1)
        image = left.pcolormesh(x, ts, np.asarray(runs["banded"].ys), cmap="RdBu_r",
                                shading="auto")
        figure.colorbar(image, ax=left, label="u")
        left.set(xlabel="x", ylabel="t", title=f"Swift-Hohenberg, N = {n_check} (banded Newton)")
        for name, marker in (("banded", "o-"), ("dense", "s-")):
            n, t = np.asarray(timings[name]).T
            right.loglog(n, 1e3 * t, marker, label=f"{name} (slope {slopes[name]:.2f})")
        n0, t0 = timings["banded"][0]
        n_all = np.asarray(sizes, float)
        right.loglog(n_all, 1e3 * t0 * n_all / n0, "k--", lw=1, label="slope 1")
        right.set(xlabel="N", ylabel="ms per step", title="Kvaerno5 step, Newton linear solve")
        right.xaxis.set_minor_formatter("")  # no crowded minor-tick labels
        right.legend(fontsize=8)

    save_figure(args.out, "diffrax_banded.png", draw)


if __name__ == "__main__":
    main()
