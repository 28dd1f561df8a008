"""The cuSPARSE route for few long systems on NVIDIA GPUs (`tridiax/_tridiagonal/cusparse.py`):
its layout (one matrix for many columns, or one system per row, by transposes) and band
conventions, run here through `lax.linalg.tridiagonal_solve`, which is LAPACK's gtsv on CPU
and cuSPARSE's gtsv2 on CUDA; against scipy (`tridiax.verify`). Which calls take it:
tests/gpu/test_gpu_lowering.py; that it compiles for an H100: tests/gpu/test_gpu_compile.py."""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import RTOL

from tridiax import verify
from tridiax._tridiagonal import cusparse as _cusparse

# (P, N, Q) operand shapes: one system; one matrix for 5 columns; systems along P (batch-first);
# bands varying over Q; bands broadcast every way; N = 1, 2, 3.
SHAPES = [
    [(1, 37, 1)] * 4,
    [(1, 37, 1)] * 3 + [(1, 37, 5)],
    [(4, 37, 1)] * 4,
    [(3, 37, 4)] * 4,
    [(1, 37, 4), (3, 1, 1), (1, 37, 1), (3, 37, 4)],
    [(1, 1, 1), (1, 37, 1), (1, 1, 1), (2, 37, 3)],
    [(2, 1, 3)] * 4,
    [(2, 2, 3)] * 4,
    [(1, 3, 1)] * 4,
]
DTYPES = [np.float32, np.float64, np.complex64, np.complex128, jnp.bfloat16]


def _operands(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    bands = []
    for k, shape in enumerate(shapes):
        v = rng.uniform(-1, 1, shape)
        if np.issubdtype(np.dtype(dtype), np.complexfloating):
            v = v + 1j * rng.uniform(-1, 1, shape)
        bands.append(v + (4 if k == 1 else 0))
    return bands


@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: str(s[-1]))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("transposed", [False, True])
def test_matches_scipy_in_every_layout(shapes, dtype, transposed, monkeypatch):
    # cuSPARSE asks for lower[0] = upper[N-1] = 0 (LAPACK here never reads them): checked on
    # what reaches lax.linalg.tridiagonal_solve.
    from jax import lax

    solve = lax.linalg.tridiagonal_solve

    def checked(dl, d, du, b):
        assert not np.asarray(dl[..., 0]).any() and not np.asarray(du[..., -1]).any()
        return solve(dl, d, du, b)

    monkeypatch.setattr(lax.linalg, "tridiagonal_solve", checked)
    lower, diag, upper, rhs = _operands(shapes, dtype, seed=len(shapes[-1]) + transposed)
    args = [jnp.asarray(v, dtype) for v in (lower, diag, upper, rhs)]
    lower, diag, upper, rhs = (np.asarray(a).astype(np.complex128 if np.iscomplexobj(a) else np.float64)
                               for a in args)
    P, N, Q = np.broadcast_shapes(*(a.shape for a in args))
    full = [np.broadcast_to(a, (P, N, Q)).copy() for a in (lower, diag, upper, rhs)]
    if transposed:  # the bands of A^T
        lo, up = full[0], full[2]
        full[0] = np.concatenate([np.zeros_like(up[:, :1]), up[:, :-1]], 1)
        full[2] = np.concatenate([lo[:, 1:], np.zeros_like(lo[:, :1])], 1)
    want = verify.reference_solve(*full, axis=1)
    if args[0].shape[1] == N and N > 1 and not transposed:  # never read: must not reach x
        args[0] = args[0].at[:, 0].set(jnp.nan)
        args[2] = args[2].at[:, N - 1].set(jnp.inf)
    got = _cusparse.solve_pnq(*args, transposed=transposed, out_dtype=args[3].dtype)
    assert got.shape == (P, N, Q) and got.dtype == args[3].dtype
    got = np.asarray(got.astype(jnp.complex128 if np.iscomplexobj(want) else jnp.float64))
    np.testing.assert_allclose(got, want, rtol=0,
                               atol=RTOL[np.dtype(dtype)] * max(1.0, np.abs(want).max()))
