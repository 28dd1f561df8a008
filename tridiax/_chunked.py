"""Long systems on one device: the partition method over chunks of rows, and chunked recurrences.

When there are too few systems to keep a device busy (or, on CPU, one system's work rows would
not fit in cache), the planner (`_planner.py`) splits every system into chunks of m rows and
solves all chunks of all systems as one batch. Three steps, each a kernel sweep or small work:

1. **Ends** (one read of the bands): chunk c of rows [c*m, c*m + n] keeps its last row n as a
   *separator* s_c and eliminates its interior rows 0..n-1, T, for three right-hand sides at
   once: y = T^{-1} b and the spikes v = T^{-1}(alpha e_1), w = T^{-1}(omega e_n), where alpha
   couples row 0 to the previous separator and omega row n-1 to s_c. The interior is then
   x = y - v x[s_{c-1}] - w x[s_c]. Substituting its first and last rows into the separator
   rows leaves a tridiagonal system in the separators (the Schur complement), whose row s_c
   takes its lower band, diagonal and right-hand side from chunk c and the rest from chunk
   c+1: six numbers per chunk, written by the kernel (`ends` below).
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
from jax import Array, lax

from . import _planner
from ._dtypes import compute_dtype


def _next_chunk(v: Array, periodic: bool) -> Array:
    """v[c+1] along axis 1 of (P, C, Q) (the first chunk's after the last when periodic, zero
    otherwise)."""
    C = v.shape[1]
    rest = lax.slice_in_dim(v, 1, C, axis=1)
    last = lax.slice_in_dim(v, 0, 1, axis=1) if periodic else jnp.zeros_like(v[:, :1])
    return lax.concatenate([rest, last], 1)


def solve(kernels, l, d, u, b, *, plan: _planner.Plan, transposed: bool, periodic: bool,
          replan) -> Array:
    """x of the (P|1, N|1, Q|1) systems, chunked by `plan.chunk` rows, in the compute dtype.

    `kernels` holds the backend's `chunk_ends`, `chunk_solve` and `solve` (`_backend.py`);
    `replan(P, C, Q)` plans the reduced system (its own chunking and tiles)."""
    m = plan.chunk
    lower, diag1, rhs1, diag2, upper, rhs2 = kernels.chunk_ends(
        l, d, u, b, transposed=transposed, periodic=periodic, chunk=m, tiling=plan.tiling)
    diag = diag1 + _next_chunk(diag2, periodic)
    upper = _next_chunk(upper, periodic)
    rhs = rhs1 + _next_chunk(rhs2, periodic)
    P, C, Q = rhs.shape
    separators = solve_any(kernels, lower, diag, upper, rhs, plan=replan(P, C, Q),
                           transposed=False, kind="periodic" if periodic else "thomas",
                           out_dtype=rhs.dtype, replan=replan)
    return kernels.chunk_solve(l, d, u, b, separators, transposed=transposed, periodic=periodic,
                               chunk=m, tiling=plan.tiling)


def solve_any(kernels, l, d, u, b, *, plan, transposed: bool, kind: str, out_dtype,
              replan) -> Array:
    """A solve by `plan`, returned in `out_dtype`: chunked (recursively; the sweeps work in the
    compute dtype) or by the kernel kind directly."""
    if plan.chunk:
        cdt = compute_dtype(out_dtype)
        l, d, u, b = (v.astype(cdt) for v in (l, d, u, b))
        x = solve(kernels, l, d, u, b, plan=plan, transposed=transposed,
                  periodic=kind == "periodic", replan=replan)
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
    extra = {} if gate is None else {"gate": gate}
    return kernels.recurrence(a, x, h0, reverse=reverse, shifted=shifted, activation=activation,
                              final_only=final_only, out_dtype=x.dtype, tiling=plan.tiling,
                              **extra)
