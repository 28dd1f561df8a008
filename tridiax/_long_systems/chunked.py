"""Long systems on one device: the partition method over chunks of rows, and chunked recurrences.

When there are too few systems to keep a device busy (or, on CPU, one system's work rows would
not fit in cache), the planner (`_core/planner.py`) splits every system into chunks of m rows and
solves all chunks of all systems as one batch. Three steps, each a kernel sweep or small work:

1. **Ends** (one read of the bands): chunk c of rows [c*m, c*m + n] keeps its last row n as a
   *separator* s_c and eliminates its interior rows 0..n-1, T, for three right-hand sides at
   once: y = T^{-1} b and the spikes v = T^{-1}(alpha e_1), w = T^{-1}(omega e_n), where alpha
   couples row 0 to the previous separator and omega row n-1 to s_c. The interior is then
   x = y - v x[s_{c-1}] - w x[s_c]. Substituting its first and last rows into the separator
   rows leaves a tridiagonal system in the separators (the Schur complement), whose row s_c
   takes its lower band, diagonal and right-hand side from chunk c and the rest from chunk
   c+1, written by the kernel chunk by chunk (`ends` below). The reduced diagonal has two
   forms. Directly, d - sub w_last - beta v_first subtracts terms of size 1 to a small number
   on weakly dominant matrices (a Poisson problem's reduced diagonal is 2/(m+1)), and the
   spikes' rounding, grown along the chunk, costs the separators digits. From the reduced
   row's sum, which the sweep gets from a fourth right-hand side, the interior rows' sums r:
   with yr = T^{-1} r = 1 + v + w, row s_c sums to (sub + d - sub yr_last) +
   beta (1 - yr_first), and yr is small where r is. Each row takes the sums where yr is
   SUMS_MARGIN times smaller than the direct form's spikes (w_last and v_first): on weakly
   dominant matrices; the direct difference elsewhere, where T^{-1} is large and r is not
   (matrices solved with pivoting).
2. **Reduced system**: one row per chunk, solved by the same planner and the same kernels
   (chunked again while it is long: the recursion is over the reduced size, a few levels
   deep). A periodic system's reduced system is periodic: its first chunk couples to the
   last separator, row N-1.
3. **Fix-up** (a second read of the bands, one write of x): every interior solved again with
   its two separators known, moved to the right-hand sides of its end rows.

Memory traffic: the bands and right-hand side are read twice and x written once (9 array
passes against the floor's 5), and the work rows of a chunk stay in cache. Every chunk is
eliminated on its own, so without pivoting the method needs every interior T to be
nonsingular: true for diagonally dominant matrices (and symmetric positive definite ones),
whose principal submatrices and Schur complements inherit the property.

A linear recurrence h[t] = c[t] h[t-1] + x[t] is chunked the same way: every chunk runs from a
zero state to its final state s_c while the kernel multiplies its coefficients into D_c (one
read of a and x); the states entering the chunks follow from the linear recurrence
h_in[c+1] = D_c h_in[c] + s_c over the chunks (chunked again when long); then every chunk runs
again from its entering state (a second read, one write). A final state alone needs no third
step.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import Array, lax

from .._core import planner as _planner
from .._core.dtypes import compute_dtype
from .._core.layout import rows_at

# The reduced diagonal is formed from the reduced row's sums where their spikes (yr at the
# chunk ends) are this many times smaller than the direct form's (w_last, v_first): on weakly
# dominant matrices yr is tiny or zero; on matrices far from dominant (pivoted solves) a
# small yr may be a cancellation of large terms, whose rounding its size does not show.
# chunks.cc (kSumsMargin) weighs the kernels' scores the same.
SUMS_MARGIN = 16


def _next_chunk(v: Array, periodic: bool) -> Array:
    """v[c+1] along axis 1 of (P, C, Q) (the first chunk's after the last when periodic, zero
    otherwise)."""
    C = v.shape[1]
    rest = lax.slice_in_dim(v, 1, C, axis=1)
    last = lax.slice_in_dim(v, 0, 1, axis=1) if periodic else jnp.zeros_like(v[:, :1])
    return lax.concatenate([rest, last], 1)


def solve(kernels, l, d, u, b, *, plan: _planner.Plan, transposed: bool, kind: str,
          replan) -> Array:
    """x of the (P|1, N|1, Q|1) systems of `kind` ("thomas", "periodic" or "pivoted"), chunked
    by `plan.chunk` rows, in the compute dtype; the reduced system is of the same kind.

    `kernels` holds the backend's `chunk_ends`, `chunk_solve` and `solve` (`_core/backend.py`);
    `replan(P, C, Q)` plans the reduced system (its own chunking and tiles). "pivoted": every
    chunk, and the reduced system, eliminated with partial pivoting (see `solve_any`)."""
    periodic = kind == "periodic"
    flags = dict(transposed=transposed, periodic=periodic, pivoting=kind == "pivoted",
                 chunk=plan.chunk, tiling=plan.tiling)
    (lower, diag1, sum1, rhs1, score1,
     diag2, sum2, upper, rhs2, score2) = kernels.chunk_ends(l, d, u, b, **flags)
    upper = _next_chunk(upper, periodic)
    # The reduced diagonal from the reduced row's sum where yr is SUMS_MARGIN times smaller
    # than the spikes at its ends (weakly dominant matrices, where the direct difference
    # cancels), else directly (step 1).
    direct = diag1 + _next_chunk(diag2, periodic)
    by_sums = ((sum1 + _next_chunk(sum2, periodic)) - lower) - upper
    score = jnp.real(score1 + _next_chunk(score2, periodic))
    diag = jnp.where(score < 0, by_sums, direct)
    rhs = rhs1 + _next_chunk(rhs2, periodic)
    P, C, Q = rhs.shape
    separators = solve_any(kernels, lower, diag, upper, rhs, plan=replan(P, C, Q),
                           transposed=False, kind=kind, out_dtype=rhs.dtype, replan=replan)
    return kernels.chunk_solve(l, d, u, b, separators, **flags)


# The largest backward error, in units of the compute dtype's epsilon, that a chunked pivoted
# solve may return (`separator_backward_error`); above it, or NaN, the systems are solved
# again whole. The bound leaves room above the sequential sweep's own backward error (LAPACK's
# order), which is not a few epsilons everywhere either: on long indefinite systems (1-D
# Helmholtz, `benchmarks/bench_pivoting.py --long`) it reaches hundreds in float32.
PIVOTED_BACKWARD_ERROR = 256


def separator_backward_error(l, d, u, b, x, *, chunk: int, transposed: bool) -> Array:
    """A bound on the normwise backward error of the chunked answer x of A x = b (A^T x = b
    when `transposed`) along axis 1 of (P|1, N|1, Q|1) operands, from its separator rows
    alone: per system, (P|1, 1, Q|1); NaN where x is not finite there or in row 0.

    Each chunk's interior is solved by Gaussian elimination with partial pivoting with its
    separators moved to the right-hand side, which is backward stable for those rows whatever
    the separators: their residual is within a small multiple of epsilon times ||A|| ||x||
    (+ ||b||) as long as x is finite. A chunk that is singular or ill-conditioned spoils its
    spikes, hence the reduced system and the separators; that shows in the residuals of the
    separator rows (or as infinities and NaN there, as the spikes of a zero pivot are). So the
    largest separator residual over ||A|| ||x|| + ||b|| bounds the answer's normwise backward
    error (Rigal and Gaches) wherever it exceeds the interiors' rounding. The norms are taken
    over the separator rows and their neighbours only, lower bounds of the true norms, so the
    bound errs on the side of solving again. It reads C rows per system instead of the N
    that a full residual would (a reduction over all rows would read every operand again).
    What it cannot see: a value that overflows inside an interior's back substitution and
    reaches neither row 0 nor a separator's neighbour (the substitution carries it towards the
    chunk's first row, which is a separator's neighbour in every chunk but the first: row 0
    is checked for that one)."""
    N = x.shape[1]
    starts = np.arange(0, N, chunk)
    seps = np.minimum(starts + chunk, N) - 1
    after = np.minimum(seps + 1, N - 1)  # row N-1 has no row after it: its sup term is dropped
    has_after = (seps + 1 < N)[None, :, None]
    x_at = rows_at(x, seps)
    x_before, x_after = rows_at(x, seps - 1), jnp.where(has_after, rows_at(x, after), 0)
    if transposed:  # A^T: sub_s = upper_{s-1}, sup_s = lower_{s+1}
        sub, sup = rows_at(u, seps - 1), rows_at(l, after)
    else:
        sub, sup = rows_at(l, seps), rows_at(u, seps)
    sup = jnp.where(has_after, sup, 0)
    dia, rhs = rows_at(d, seps), rows_at(b, seps)
    def per_system(v):
        return jnp.max(v, axis=1, keepdims=True)

    worst = per_system(jnp.abs(rhs - (sub * x_before + dia * x_at + sup * x_after)))
    norm_a = per_system(jnp.abs(sub) + jnp.abs(dia) + jnp.abs(sup))
    norm_x = per_system(jnp.maximum(jnp.maximum(jnp.abs(x_before), jnp.abs(x_at)),
                                    jnp.abs(x_after)))
    # worst / max(||A|| ||x||, ||b||), at most twice worst / (||A|| ||x|| + ||b||), formed
    # without the product: ||A|| ||x|| overflowing to inf would have passed any residual.
    eta = jnp.minimum(worst / norm_a / norm_x, worst / per_system(jnp.abs(rhs)))
    eta = jnp.where(worst == 0, jnp.zeros_like(eta), eta)
    # Row 0 of the first chunk is no separator's neighbour: an overflow in that chunk's back
    # substitution, which runs towards row 0 and reaches no separator, shows there.
    return jnp.where(jnp.isfinite(lax.slice_in_dim(x, 0, 1, axis=1)), eta, jnp.nan)


def solve_any(kernels, l, d, u, b, *, plan, transposed: bool, kind: str, out_dtype,
              replan, whole=None) -> Array:
    """A solve by `plan`, returned in `out_dtype`: chunked (recursively; the sweeps work in the
    compute dtype) or by the kernel kind directly.

    A chunked pivoted solve pivots inside each chunk and in the reduced system, which is
    backward stable when the chunks' interiors are well conditioned but not otherwise (a chunk
    may be singular in a nonsingular matrix). With `whole` (the plan of the systems unchunked)
    its answer is checked (`separator_backward_error`): where the backward error exceeds
    PIVOTED_BACKWARD_ERROR epsilons, or is NaN, every system is solved again by the sequential
    pivoted sweep (LAPACK's gtsv order), so that the answer is backward stable either way."""
    if plan.chunk:
        cdt = compute_dtype(out_dtype)
        l, d, u, b = (v.astype(cdt) for v in (l, d, u, b))
        x = solve(kernels, l, d, u, b, plan=plan, transposed=transposed, kind=kind,
                  replan=replan)
        if kind == "pivoted" and whole is not None:
            eta = separator_backward_error(l, d, u, b, x, chunk=plan.chunk,
                                           transposed=transposed)
            failed = ~jnp.all(eta <= PIVOTED_BACKWARD_ERROR * jnp.finfo(cdt).eps)

            def sequential(state):
                return jnp.asarray(False), kernels.solve(
                    l, d, u, b, transposed=transposed, out_dtype=cdt, kind=kind,
                    tiling=whole.tiling)

            # A loop that runs at most once keeps x in its buffer; lax.cond would copy it into
            # the conditional's output.
            _, x = lax.while_loop(lambda state: state[0], sequential, (failed, x))
        return x.astype(out_dtype)
    return kernels.solve(l, d, u, b, transposed=transposed, out_dtype=out_dtype, kind=kind,
                         tiling=plan.tiling)


def recurrence(kernels, a, x, h0, *, plan: _planner.Plan, reverse: bool, shifted: bool,
               final_only: bool, gate, replan) -> Array:
    """h of the linear recurrence over (P|1, T|1, Q|1) operands (h0: (P|1, 1, Q|1)), chunked
    by `plan.chunk` steps (see the module docstring); `gate` as `_native.recurrence_pnq`."""
    m = plan.chunk
    decay, final = kernels.recurrence_ends(a, x, reverse=reverse, shifted=shifted, chunk=m,
                                           tiling=plan.tiling, gate=gate)
    P, C, Q = final.shape
    h0 = jnp.broadcast_to(h0.astype(final.dtype), (P, 1, Q))
    # States after each chunk, in scan order: H[c] = D_c H[c-1] + s_c from H[-1] = h0.
    after = recurrence_any(kernels, decay, final, h0, plan=replan(P, C, Q), reverse=reverse,
                           shifted=False, final_only=final_only, gate=None, replan=replan)
    if final_only:
        return after
    # The state entering each chunk: h0 for the first in scan order, else its neighbour's.
    if reverse:
        entering = lax.concatenate([lax.slice_in_dim(after, 1, C, axis=1), h0], 1)
    else:
        entering = lax.concatenate([h0, lax.slice_in_dim(after, 0, C - 1, axis=1)], 1)
    return kernels.recurrence(a, x, entering, reverse=reverse, shifted=shifted, activation=None,
                              final_only=False, out_dtype=x.dtype, tiling=plan.tiling, chunk=m,
                              gate=gate)


def recurrence_any(kernels, a, x, h0, *, plan, reverse: bool, shifted: bool, final_only: bool,
                   gate, replan, activation=None) -> Array:
    """A recurrence by `plan`: chunked (linear only) or by the kernel directly."""
    if plan.chunk:
        return recurrence(kernels, a, x, h0, plan=plan, reverse=reverse, shifted=shifted,
                          final_only=final_only, gate=gate, replan=replan)
    return kernels.recurrence(a, x, h0, reverse=reverse, shifted=shifted, activation=activation,
                              final_only=final_only, out_dtype=x.dtype, tiling=plan.tiling,
                              gate=gate)
