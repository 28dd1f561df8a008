"""tridiax.verify itself, against dense NumPy solves (so the reference is checked too)."""

import numpy as np
import pytest
from helpers import random_bands

from tridiax import verify


def _dense(lower, diag, upper):
    return np.diag(diag) + np.diag(lower[1:], -1) + np.diag(upper[:-1], 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
@pytest.mark.parametrize("shape,axis", [((6,), 0), ((6, 3), 0), ((3, 6), -1), ((2, 6, 3), 1)])
def test_reference_solve_matches_dense(dtype, shape, axis):
    args = random_bands(shape, dtype, seed=1, dominant=False)
    x = verify.reference_solve(*args, axis=axis)
    assert x.shape == shape
    assert x.dtype == (np.complex128 if np.iscomplexobj(args[0]) else np.float64)
    moved = [np.moveaxis(np.asarray(a, np.complex128), axis, -1).reshape(-1, shape[axis])
             for a in (*args, x)]
    for lo, di, up, b, xs in zip(*moved, strict=True):
        np.testing.assert_allclose(xs, np.linalg.solve(_dense(lo, di, up), b), rtol=1e-9,
                                   atol=1e-9)


def test_relative_residual():
    lower, diag, upper, rhs = random_bands((8, 4), np.float64, seed=2)
    x = verify.reference_solve(lower, diag, upper, rhs, axis=0)
    res = verify.relative_residual(lower, diag, upper, x, rhs, axis=0)
    assert res.shape == (4,)
    assert np.all(res < 1e-15)
    x[3, 2] += 1e-3
    res = verify.relative_residual(lower, diag, upper, x, rhs, axis=0)
    assert res[2] > 1e-5 and np.all(np.delete(res, 2) < 1e-15)
    lower[0], upper[-1] = np.nan, np.nan  # ignored entries
    assert np.all(np.isfinite(verify.relative_residual(lower, diag, upper, x, rhs, axis=0)))
