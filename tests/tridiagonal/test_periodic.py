"""Periodic solves on cyclic matrices that broke the textbook Sherman-Morrison split.

gamma = -diag[0] made T' singular on a zero diag[0] (every system NaN, condition number 9.3)
and inaccurate on a tiny one. The split now comes from all of row 0 (`_periodic.split`), and
`pivoting=True` eliminates T' with row interchanges. Checked against dense solves on every
backend, dtype, both kinds, the transposed solve (gradients) and the factorization.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import RTOL, backends, dense_numpy

import tridiax
from tridiax._tridiagonal.api import solve


def cyclic_cases(dtype, n=9):
    """Systems along the last axis: (lower, diag, upper, rhs) with awkward first rows."""
    rng = np.random.default_rng(n)
    cases = {}
    for name, d0, corner in [("zero diag[0]", 0.0, 1.0), ("tiny diag[0]", 1e-30, 1.0),
                             ("zero corners", 4.0, 0.0), ("tiny corners", 4.0, 1e-30),
                             ("zero diag[0] and corners", 0.0, 0.0)]:
        lower = rng.uniform(-1, 1, (4, n))
        upper = rng.uniform(-1, 1, (4, n))
        diag = 3 + rng.uniform(0, 1, (4, n))
        diag[:, 0] = d0
        lower[:, 0] = corner * rng.uniform(0.5, 1, 4)
        upper[:, -1] = corner * rng.uniform(0.5, 1, 4)
        upper[:, 0] = rng.uniform(0.5, 1, 4)  # row 0 keeps a nonzero entry: nonsingular
        rhs = rng.standard_normal((4, n))
        if np.issubdtype(dtype, np.complexfloating):
            lower, diag, upper, rhs = (v * (1 + 0.5j) for v in (lower, diag, upper, rhs))
        cases[name] = [v.astype(dtype) for v in (lower, diag, upper, rhs)]
    return cases


def reference(lower, diag, upper, rhs):
    a = dense_numpy(lower, diag, upper, periodic=True)
    return np.linalg.solve(a, rhs[..., None].astype(a.dtype))[..., 0], np.linalg.cond(a)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("pivoting", [False, True])
def test_awkward_first_rows_against_dense(dtype, pivoting):
    for name, (lower, diag, upper, rhs) in cyclic_cases(dtype).items():
        expected, cond = reference(lower, diag, upper, rhs)
        assert np.max(cond) < 1e3, name  # well conditioned: any failure is the method's
        tolerance = max(RTOL[np.dtype(dtype)], 20 * np.max(cond) * np.finfo(dtype).eps)
        for backend in backends(dtype):
            x = solve(lower, diag, upper, rhs, axis=-1, backend=backend, periodic=True,
                      pivoting=pivoting)
            err = np.max(np.abs(np.asarray(x) - expected)) / np.max(np.abs(expected))
            assert err < tolerance, (name, backend, err)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_the_issue_matrix_and_its_transpose(dtype):
    # diag[0] = 0 made every system NaN; the gradient runs the transposed solve.
    lower, diag, upper, rhs = (jnp.asarray(v) for v in cyclic_cases(dtype)["zero diag[0]"])
    expected, _ = reference(*(np.asarray(v) for v in (lower, diag, upper, rhs)))
    x = tridiax.solve_periodic_tridiagonal(lower, diag, upper, rhs, check=True)
    np.testing.assert_allclose(x, expected, rtol=1e-11)
    a = jnp.asarray(dense_numpy(lower, diag, upper, periodic=True))

    def ours(rhs, pivoting):
        return tridiax.solve_periodic_tridiagonal(lower, diag, upper, rhs, pivoting=pivoting)

    g = jnp.cos(jnp.arange(rhs.size).reshape(rhs.shape)).astype(rhs.dtype)
    for pivoting in (False, True):
        _, vjp = jax.vjp(lambda b: ours(b, pivoting), rhs)
        want = jnp.linalg.solve(jnp.swapaxes(a, -1, -2), g[..., None])[..., 0]
        np.testing.assert_allclose(vjp(g)[0], want, rtol=1e-10)
    grads = jax.grad(lambda d: jnp.sum(jnp.abs(tridiax.solve_periodic_tridiagonal(
        lower, d, upper, rhs, pivoting=True)) ** 2))(diag)
    dense_grads = jax.grad(lambda d: jnp.sum(jnp.abs(jnp.linalg.solve(
        a + jnp.einsum("si,ij->sij", d - diag, jnp.eye(diag.shape[-1])), rhs[..., None])) ** 2))(
        diag)
    np.testing.assert_allclose(grads, dense_grads, rtol=1e-9)


@pytest.mark.parametrize("name", ["zero diag[0]", "tiny diag[0]", "zero corners"])
def test_factorization_uses_the_same_split(name):
    lower, diag, upper, rhs = cyclic_cases(np.float64)[name]
    expected, _ = reference(lower, diag, upper, rhs)
    factored = tridiax.Tridiagonal(lower, diag, upper, periodic=True).factor()
    np.testing.assert_allclose(factored.solve(rhs), expected, rtol=1e-11)


def test_pivoting_solves_what_the_unpivoted_periodic_solve_cannot():
    # Row 1 = (0, 0, upper[1], 0, ...): a zero pivot in T' without row interchanges.
    lower, diag, upper, rhs = cyclic_cases(np.float64)["zero corners"]
    lower, diag = lower.copy(), diag.copy()
    diag[:, 1] = lower[:, 1] = 0.0
    expected, cond = reference(lower, diag, upper, rhs)
    assert np.max(cond) < 1e3
    assert not np.all(np.isfinite(tridiax.solve_periodic_tridiagonal(lower, diag, upper, rhs)))
    with pytest.raises(tridiax.BreakdownError, match="Pass pivoting=True"):
        tridiax.solve_periodic_tridiagonal(lower, diag, upper, rhs, check=True)
    # The advice applies to the call it was given for: the periodic solve takes pivoting=True.
    for backend in backends(np.float64):
        x = solve(lower, diag, upper, rhs, axis=-1, backend=backend, periodic=True,
                  pivoting=True, check=True)
        np.testing.assert_allclose(x, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(
        tridiax.Tridiagonal(lower, diag, upper, periodic=True).solve(rhs, pivoting=True),
        expected, rtol=1e-10, atol=1e-12)


def test_a_cyclic_shift_is_reported_with_what_to_do():
    # lower = 1, diag = upper = 0: x[i-1] = b[i], condition number 1, but every split leaves a
    # singular tridiagonal part, pivoted or not: inf/NaN, which check=True reports.
    n = 5
    b = np.arange(1.0, n + 1)
    args = (np.ones(n), np.zeros(n), np.zeros(n), b)
    with pytest.raises(tridiax.BreakdownError, match=r"cyclic shift: solve those systems densely"):
        tridiax.solve_periodic_tridiagonal(*args, pivoting=True, check=True)
    np.testing.assert_allclose(np.linalg.solve(dense_numpy(*args[:3], periodic=True), b),
                               np.roll(b, -1))
