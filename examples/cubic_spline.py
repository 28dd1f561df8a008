"""Natural and periodic cubic splines for a batch of curves, matching scipy's CubicSpline.

    python examples/cubic_spline.py [--quick] [--out figures/]

Every curve is sampled at the same non-uniform knots x[0] < ... < x[n-1] (one curve per row,
shape (curves, n)). The second derivatives M at the knots solve, for every curve at once,

    h[i-1] M[i-1] + 2 (h[i-1] + h[i]) M[i] + h[i] M[i+1] = 6 (s[i] - s[i-1]),

with h[i] = x[i+1] - x[i] and s[i] the slope of segment i. A natural spline adds M = 0 at both
ends (`tridiax.solve_tridiagonal`); a periodic one wraps the indices around
(`tridiax.solve_periodic_tridiagonal`, with lower[0] and upper[-1] the corner entries). The
bands have shape (n,) and are shared by every curve. Values and first derivatives at points
between the knots are compared with scipy.interpolate.CubicSpline in float64.
"""

import jax
import jax.numpy as jnp
import numpy as np
import scipy.interpolate
from _common import best_time, parse_args, save_figure

import tridiax


def natural_moments(x: jax.Array, y: jax.Array) -> jax.Array:
    """Second derivatives at the knots, M[0] = M[n-1] = 0; y of shape (..., n)."""
    h = jnp.diff(x)
    slopes = jnp.diff(y, axis=-1) / h
    one, zero = jnp.ones(1), jnp.zeros(1)
    lower = jnp.concatenate([zero, h[:-1], zero])  # rows 0 and n-1 read M = 0
    diag = jnp.concatenate([one, 2 * (h[:-1] + h[1:]), one])
    upper = jnp.concatenate([zero, h[1:], zero])
    rhs = jnp.pad(6 * jnp.diff(slopes, axis=-1), [(0, 0)] * (y.ndim - 1) + [(1, 1)])
    return tridiax.solve_tridiagonal(lower, diag, upper, rhs, axis=-1)


def periodic_moments(x: jax.Array, y: jax.Array) -> jax.Array:
    """Second derivatives at the knots of a periodic spline (y[..., 0] == y[..., -1])."""
    h = jnp.diff(x)  # n - 1 segments, n - 1 unknowns M[0], ..., M[n-2]
    slopes = jnp.diff(y, axis=-1) / h
    h_before = jnp.roll(h, 1)  # h[i-1], cyclically
    rhs = 6 * (slopes - jnp.roll(slopes, 1, axis=-1))
    moments = tridiax.solve_periodic_tridiagonal(h_before, 2 * (h_before + h), h, rhs, axis=-1)
    return jnp.concatenate([moments, moments[..., :1]], axis=-1)  # M[n-1] = M[0]


def evaluate(x, y, moments, t, derivative=0):
    """The spline (or its first derivative) at points t, for every curve: shape (..., len(t))."""
    i = jnp.clip(jnp.searchsorted(x, t, side="right") - 1, 0, x.shape[0] - 2)
    h = x[i + 1] - x[i]
    a, b = x[i + 1] - t, t - x[i]  # distances to the right and left knots
    m0, m1, y0, y1 = moments[..., i], moments[..., i + 1], y[..., i], y[..., i + 1]
    if derivative == 0:
        return ((m0 * a**3 + m1 * b**3) / (6 * h) + (y0 / h - m0 * h / 6) * a
                + (y1 / h - m1 * h / 6) * b)
    return (-m0 * a**2 + m1 * b**2) / (2 * h) + (y1 - y0) / h - (m1 - m0) * h / 6


def relative_error(ours, reference):
    return np.max(np.abs(ours - reference)) / np.max(np.abs(reference))


def main():
    args = parse_args(__doc__)
    jax.config.update("jax_enable_x64", True)
    curves, knots = (256, 100) if args.quick else (10_000, 1_000)
    rng = np.random.default_rng(0)
    spacing = 2 * np.pi / (knots - 1)  # one full period; interior knots jittered by up to 40%
    x = np.linspace(0, 2 * np.pi, knots) + spacing * rng.uniform(-0.4, 0.4, knots)
    x[0], x[-1] = 0.0, 2 * np.pi
    phase = rng.uniform(0, 2 * np.pi, (curves, 1))
    y_open = np.sin(3 * x + phase) + 0.1 * rng.standard_normal((curves, knots))
    y_periodic = np.sin(3 * x + phase) + 0.5 * np.cos(x - phase)
    y_periodic[:, -1] = y_periodic[:, 0]
    t = np.linspace(0, 2 * np.pi, 5 * knots + 3)
    print(f"{curves} curves of {knots} non-uniform knots, evaluated at {t.size} points, float64")

    spline = jax.jit(lambda x, y, t, kind: evaluate(x, y, kind(x, y), t), static_argnums=3)
    slope = jax.jit(lambda x, y, t, kind: evaluate(x, y, kind(x, y), t, 1), static_argnums=3)
    worst = 0.0
    values = {}
    for name, bc, kind, y in (("natural", "natural", natural_moments, y_open),
                              ("periodic", "periodic", periodic_moments, y_periodic)):
        reference = scipy.interpolate.CubicSpline(x, y, axis=1, bc_type=bc)
        ours = np.asarray(spline(x, y, t, kind))
        values[name] = (y, ours)
        value_error = relative_error(ours, reference(t))
        slope_error = relative_error(np.asarray(slope(x, y, t, kind)), reference(t, 1))
        worst = max(worst, value_error, slope_error)
        _, ours_s = best_time(lambda y, kind=kind: kind(jnp.asarray(x), y), jnp.asarray(y))
        _, scipy_s = best_time(lambda y: scipy.interpolate.CubicSpline(x, y, axis=1, bc_type=bc)
                               .c, y, repeats=3)
        print(f"{name:>8}: max |tridiax - scipy| / max |scipy|: values {value_error:.1e}, "
              f"first derivatives {slope_error:.1e}; fit {1e3 * ours_s:.2f} ms "
              f"(scipy CubicSpline {1e3 * scipy_s:.2f} ms)")
    print(f"largest difference from scipy.interpolate.CubicSpline: {worst:.1e}")
    assert worst < 1e-12, "the splines do not match scipy"

    def draw(figure):
        for panel, (name, (y, ours)) in zip(figure.subplots(1, 2), values.items(), strict=True):
            for c in range(3):
                line, = panel.plot(t, ours[c], lw=1)
                panel.plot(x, y[c], "o", ms=2.5, color=line.get_color())
            panel.set(title=f"{name} splines, 3 of {curves} curves (dots: knots)", xlabel="x")
            panel.set_xlim(0, 30 * spacing)  # the first 30 knot intervals

    save_figure(args.out, "cubic_spline.png", draw)


if __name__ == "__main__":
    main()
