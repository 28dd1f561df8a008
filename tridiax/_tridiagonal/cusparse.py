"""Few long systems on NVIDIA GPUs: cuSPARSE's gtsv2 through `lax.linalg.tridiagonal_solve`.

Where the systems are few and long, too few to give every GPU thread a system of its own,
cuSPARSE's batched cyclic reduction beats the partition method composed around the Pallas
Triton kernel (the H100 measurements are in benchmarks/data/gpu_h100.json). The planner
(`_core/planner.py`, `gpu_library`) sends the plain solves of that regime here; the Pallas
kernels keep the rest (many systems, and the other kinds).

What cuSPARSE runs (jaxlib's gtsv2 handler): one system, or one matrix for several columns,
is gtsv2 (Gaussian elimination with partial pivoting in blocks); several systems of one
column each are gtsv2StridedBatch (cyclic reduction without pivoting: stable for diagonally
dominant matrices, the condition the partition method it replaces needs as well). So (P, N, Q)
views become: one matrix, P = 1 -> bands (1, N) and right-hand sides (1, N, Q); otherwise one
system per row -> bands and right-hand sides (P*Q, N), by an XLA transpose where Q > 1.

Differentiation stays tridiax's (`_tridiagonal/primitive.py`): this is only the forward and the transposed
solve. Half-precision operands are solved in float32.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array, lax

from .._core.along_axis import shift
from .._core.dtypes import compute_dtype
from .._core.layout import broadcast_shape


def solve_pnq(l, d, u, b, *, transposed: bool, out_dtype) -> Array:
    """x with sub[i] x[i-1] + d[i] x[i] + sup[i] x[i+1] = b[i] along axis 1 of (P|1, N|1, Q|1)
    operands (sub = l, sup = u; transposed: sub[i] = u[i-1], sup[i] = l[i+1]); l[:, 0] and
    u[:, N-1] are never read. Returns (P, N, Q) in `out_dtype`."""
    P, N, Q = broadcast_shape(l, d, u, b)
    cdt = compute_dtype(out_dtype)
    l, d, u = (jnp.broadcast_to(x, (x.shape[0], N, x.shape[2])).astype(cdt) for x in (l, d, u))
    b = b.astype(cdt)
    if transposed:
        l, u = shift(u, 1, axis=1), shift(l, -1, axis=1)
    one_matrix = P == 1 and all(x.shape[2] == 1 for x in (l, d, u))
    if one_matrix:
        bands = [x[:, :, 0] for x in (l, d, u)]
        rhs = jnp.broadcast_to(b, (1, N, Q))
    else:
        bands = [jnp.broadcast_to(x, (P, N, Q)).transpose(0, 2, 1).reshape(P * Q, N)
                 for x in (l, d, u)]
        rhs = jnp.broadcast_to(b, (P, N, Q)).transpose(0, 2, 1).reshape(P * Q, N, 1)
    lower, diag, upper = bands
    # gtsv2 reads lower[0] and upper[N-1] as zeros: whatever the caller left there is not ours.
    lower = lower.at[:, 0].set(0)
    upper = upper.at[:, N - 1].set(0)
    x = lax.linalg.tridiagonal_solve(lower, diag, upper, rhs)
    if not one_matrix:
        x = x.reshape(P, Q, N).transpose(0, 2, 1)
    return x.astype(out_dtype)
