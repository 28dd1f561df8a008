"""Packed ragged batches: systems (and sequences) of different lengths as one long array.

    python examples/packed_ragged.py [--quick] [--out figures/]

One implicit-Euler step of u_t = kappa u_xx for rods of different lengths (Dirichlet ends),
packed end to end along one axis: row i of rod r sits at offset[r] + i. Cutting the coupling
between neighbours (lower = 0 at each rod's first row, upper = 0 at its last) makes the packed
matrix block diagonal, so ONE call of `tridiax.solve_tridiagonal` solves every rod, with no
padding. tridiax's planner sees one long system and splits it into chunks solved in parallel
(the partition method; chunk boundaries may fall anywhere, inside a rod or on its ends).
Checked rod by rod against scipy.linalg.solve_banded, and timed against the padded layout
(every rod padded with identity rows to the longest, a (longest, rods) batch along axis 0).

Packed sequences work the same way for recurrences: a = 0 at each sequence's first step
restarts the state there; an exponential moving average over sequences of different lengths
is checked against a NumPy loop per sequence.
"""

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
from _common import best_time, parse_args, save_figure

import tridiax


def packed_rods(lengths: np.ndarray, kappa_dt: float):
    """The bands of I - kappa dt D2 for rods of `lengths` interior points, packed, with each
    rod's first and last row cut from its neighbours; offsets of the rods' first rows."""
    n = int(lengths.sum())
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    h = 1.0 / (np.repeat(lengths, lengths) + 1)  # each rod spans [0, 1]
    off = -kappa_dt / h**2
    lower, upper = off.copy(), off.copy()
    lower[offsets] = 0.0
    upper[offsets + lengths - 1] = 0.0
    diag = 1.0 - 2.0 * off
    return (lower, diag, upper), offsets, n


def main():
    args = parse_args(__doc__)
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(0)
    rods = 200 if args.quick else 2000
    longest = 2000 if args.quick else 20_000
    lengths = rng.integers(1, longest + 1, rods)
    lengths[:3] = (1, 2, 3)  # the awkward sizes too
    (lower, diag, upper), offsets, n = packed_rods(lengths, kappa_dt=1e-4)
    x_grid = np.concatenate([np.arange(1, m + 1) / (m + 1) for m in lengths])
    u0 = np.sin(np.pi * x_grid) + 0.3 * rng.standard_normal(n)

    solve = jax.jit(lambda lo, d, up, b: tridiax.solve_tridiagonal(lo, d, up, b))
    bands = [jnp.asarray(v) for v in (lower, diag, upper, u0)]
    u1 = np.asarray(solve(*bands))
    error = 0.0
    for r, (start, m) in enumerate(zip(offsets, lengths, strict=True)):
        rows = slice(start, start + m)
        ab = np.zeros((3, m))
        ab[0, 1:], ab[1], ab[2, :-1] = upper[rows][:-1], diag[rows], lower[rows][1:]
        ref = scipy.linalg.solve_banded((1, 1), ab, u0[rows])
        error = max(error, np.max(np.abs(u1[rows] - ref)) / np.max(np.abs(ref)))
        if args.quick is False and r >= 200:  # the first 200 rods are plenty at full size
            break
    print(f"{rods} rods of 1..{longest} points, {n} rows packed into one array")
    print(f"max |x - scipy| / |x| over the rods checked = {error:.1e}")
    # The longest rods' matrices have condition numbers near 1e5: a few 1e-12 is rounding.
    if error > 1e-10:
        raise SystemExit("packed solve disagrees with scipy")

    # The padded layout: a (longest, rods) batch along axis 0, identity rows past each rod.
    pad = lengths.max()
    mask = np.arange(pad)[:, None] < lengths[None, :]
    padded = []
    for v, fill in ((lower, 0.0), (diag, 1.0), (upper, 0.0), (u0, 0.0)):
        out = np.full((pad, rods), fill)
        out.T[mask.T] = v
        padded.append(jnp.asarray(out))
    solve0 = jax.jit(lambda lo, d, up, b: tridiax.solve_tridiagonal(lo, d, up, b, axis=0))
    x_padded = np.asarray(solve0(*padded)).T[mask.T]
    print(f"max |packed - padded| / |x| = {np.max(np.abs(x_padded - u1)) / np.max(np.abs(u1)):.1e}")
    _, packed_time = best_time(solve, *bands)
    _, padded_time = best_time(solve0, *padded)
    print(f"packed: {packed_time * 1e3:.2f} ms for {n} rows; padded: {padded_time * 1e3:.2f} ms "
          f"for {pad * rods} rows ({pad * rods / n:.1f}x the rows, "
          f"{padded_time / packed_time:.1f}x the time)")

    # Packed sequences: an exponential moving average restarted at each sequence's start.
    decay = np.full(n, 0.9)
    decay[offsets] = 0.0
    signal = rng.standard_normal(n)
    ema = np.asarray(tridiax.linear_recurrence(decay, 0.1 * signal))
    ema_error = 0.0
    for start, m in list(zip(offsets, lengths, strict=True))[:200]:
        h, ref = 0.0, np.empty(m)
        for t in range(m):
            h = 0.9 * h + 0.1 * signal[start + t] if t else 0.1 * signal[start]
            ref[t] = h
        ema_error = max(ema_error, np.max(np.abs(ema[start:start + m] - ref)))
    print(f"packed sequences: max |ema - loop| = {ema_error:.1e}")
    if ema_error > 1e-12:
        raise SystemExit("packed recurrence disagrees with the loop")

    def draw(figure):
        ax = figure.add_subplot(1, 1, 1)
        for r in np.argsort(lengths)[-3:]:
            rows = slice(offsets[r], offsets[r] + lengths[r])
            ax.plot(x_grid[rows], u1[rows], lw=0.8, label=f"rod of {lengths[r]} points")
        ax.set_xlabel("x")
        ax.set_ylabel("u after one implicit step")
        ax.legend()

    save_figure(args.out, "packed_ragged.png", draw)


if __name__ == "__main__":
    main()
