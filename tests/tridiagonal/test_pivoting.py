"""pivoting=True (partial pivoting, as LAPACK's gtsv) and check=True (breakdown reporting)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, backends, dense_solve, random_bands
from jax.test_util import check_grads

import tridiax
from tridiax import verify
from tridiax._tridiagonal.api import solve

SHAPES_AXES = [((1,), 0), ((2,), 0), ((3,), -1), ((7, 3), 0), ((3, 7), -1), ((4, 37, 5), 1),
               ((4, 6, 37), 2), ((2, 3, 4, 9), -2)]


def backward_error(args, x, axis):
    lower, diag, upper, rhs = args
    return verify.relative_residual(lower, diag, upper, np.asarray(x), rhs, axis=axis)


def zero_diagonal(shape, axis, dtype=np.float64, seed=0):
    """Bands with diag = 0 (and rhs): the Thomas algorithm divides by zero at the first row,
    yet for even N the matrix is nonsingular (its determinant is a product of -l*u pairs)."""
    lower, _, upper, rhs = random_bands(shape, dtype, seed=seed, dominant=False)
    return lower, np.zeros(shape, dtype), upper, rhs


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("shape,axis", SHAPES_AXES)
def test_pivoted_matches_scipy_on_non_dominant_matrices(backend, shape, axis):
    args = random_bands(shape, np.float64, seed=len(shape) - axis, dominant=False)
    x = solve(*args, axis=axis, backend=backend, pivoting=True)
    assert x.shape == shape
    assert_close(x, verify.reference_solve(*args, axis=axis), np.float64, factor=100)
    # Backward error of order eps * N, like gtsv (solve_banded).
    assert np.max(backward_error(args, x, axis)) < 10 * shape[axis] * 2.2e-16


@pytest.mark.parametrize(
    "backend,dtype",
    [(b, t) for t in (np.float32, np.float64, np.complex64, np.complex128) for b in backends(t)])
@pytest.mark.parametrize("axis", [0, -1])
def test_pivoted_dtypes(backend, dtype, axis):
    args = random_bands((24, 31), dtype, seed=7, dominant=False)
    x = solve(*(jnp.asarray(a) for a in args), axis=axis, backend=backend, pivoting=True)
    assert x.dtype == np.dtype(dtype)
    eps = np.finfo(dtype).eps
    assert np.max(backward_error(args, x, axis)) < 10 * 31 * eps


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_pivoted_half_precision_eliminates_in_float32(backend, dtype):
    args = [jnp.asarray(a, dtype) for a in zero_diagonal((16, 5), 0, seed=2)]
    x = solve(*args, axis=0, backend=backend, pivoting=True)
    assert x.dtype == dtype
    exact = verify.reference_solve(*(np.asarray(a, np.float64) for a in args), axis=0)
    assert_close(np.asarray(x, np.float64), exact, dtype, factor=5)


@pytest.mark.parametrize("backend", backends())
def test_pivoting_solves_what_thomas_cannot(backend):
    args = zero_diagonal((8, 40), 0, seed=1)
    reference = verify.reference_solve(*args, axis=0)
    assert np.all(np.isfinite(reference))
    thomas = np.asarray(solve(*args, axis=0, backend=backend))
    assert not np.any(np.isfinite(thomas))  # 0/0 at the first pivot: every system non-finite
    assert_close(solve(*args, axis=0, backend=backend, pivoting=True), reference, np.float64)


@pytest.mark.parametrize("backend", backends())
def test_pivoting_gives_accuracy_thomas_loses(backend):
    # A tiny (not zero) first pivot: Thomas returns finite values with no correct digit.
    lower, diag, upper, rhs = random_bands((40, 50), np.float64, seed=4)
    diag[0] = 1e-14
    thomas = solve(lower, diag, upper, rhs, axis=0, backend=backend)
    pivoted = solve(lower, diag, upper, rhs, axis=0, backend=backend, pivoting=True)
    args = (lower, diag, upper, rhs)
    assert np.all(np.isfinite(np.asarray(thomas)))
    assert np.max(backward_error(args, thomas, 0)) > 1e-6
    assert np.max(backward_error(args, pivoted, 0)) < 1e-14


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("pivoting", [False, True])
def test_ignored_corners_stay_ignored_when_pivoting(backend, pivoting):
    lower, diag, upper, rhs = random_bands((6, 9), np.float64, seed=3, dominant=not pivoting)
    x = solve(lower, diag, upper, rhs, axis=-1, backend=backend, pivoting=pivoting)
    lower[:, 0], upper[:, -1] = np.nan, np.inf
    y = solve(lower, diag, upper, rhs, axis=-1, backend=backend, pivoting=pivoting)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("backend", backends())
def test_pivoted_broadcast_bands(backend):
    lower, diag, upper, _ = random_bands((30, 1), np.float64, seed=5, dominant=False)
    rhs = np.random.default_rng(0).standard_normal((30, 17))
    x = solve(lower, diag, upper, rhs, axis=0, backend=backend, pivoting=True)
    assert_close(x, verify.reference_solve(lower, diag, upper, rhs, axis=0), np.float64, 100)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_pivoted_gradients_match_dense(backend, axis):
    args = [jnp.asarray(a) for a in random_bands((5, 6, 7), np.float64, seed=11, dominant=False)]
    weights = jnp.asarray(np.random.default_rng(1).standard_normal((5, 6, 7)))

    def loss(solver):
        return lambda *a: jnp.sum(weights * jnp.sin(solver(*a)))

    ours = jax.grad(loss(lambda *a: solve(*a, axis=axis, backend=backend, pivoting=True)),
                    argnums=(0, 1, 2, 3))(*args)
    dense = jax.grad(loss(lambda *a: dense_solve(*a, axis)), argnums=(0, 1, 2, 3))(*args)
    for g, r in zip(ours, dense, strict=True):
        assert_close(g, r, np.float64, factor=1000)


@pytest.mark.parametrize("backend", backends())
def test_pivoted_second_order(backend):
    args = [jnp.asarray(a) for a in random_bands((6, 4), np.float64, seed=12, dominant=False)]
    check_grads(lambda *a: solve(*a, axis=0, backend=backend, pivoting=True), args, order=2,
                modes=("fwd", "rev"), atol=1e-5, rtol=1e-5, eps=1e-6)


def test_pivoted_vmap_and_modules():
    args = [jnp.asarray(a) for a in random_bands((3, 8, 10), np.float64, seed=13, dominant=False)]
    reference = verify.reference_solve(*args, axis=-1)
    batched = jax.vmap(lambda *a: tridiax.solve_tridiagonal(*a, pivoting=True))(*args)
    assert_close(batched, reference, np.float64, factor=100)
    op = tridiax.Tridiagonal(*args[:3])
    assert_close(op.solve(args[3], pivoting=True), reference, np.float64, factor=100)
    assert_close(tridiax.TDMA(pivoting=True)(op, args[3]), reference, np.float64, factor=100)
    assert_close(eqx.filter_jit(tridiax.TDMA(pivoting=True))(op, args[3]), reference,
                 np.float64, factor=100)


def test_pivoted_lineax():
    lx = pytest.importorskip("lineax")
    lower, diag, upper, rhs = zero_diagonal((10,), 0, seed=6)
    op = lx.TridiagonalLinearOperator(jnp.asarray(diag), jnp.asarray(lower[1:]),
                                      jnp.asarray(upper[:-1]))
    sol = lx.linear_solve(op, jnp.asarray(rhs), solver=tridiax.lineax.TDMA(pivoting=True))
    assert_close(sol.value, verify.reference_solve(lower, diag, upper, rhs, axis=0), np.float64)
    unpivoted = lx.linear_solve(op, jnp.asarray(rhs), solver=tridiax.lineax.TDMA(), throw=False)
    assert unpivoted.result == lx.RESULTS.singular


# --- check=True -----------------------------------------------------------------------------


def _failing(systems=5, bad=(1, 3), n=6):
    """`systems` systems along the last axis; those in `bad` have a zero diagonal."""
    lower, diag, upper, rhs = random_bands((systems, n), np.float64, seed=8)
    diag[list(bad)] = 0.0
    return lower, diag, upper, rhs


@pytest.mark.parametrize("wrap", ["eager", "jax.jit", "eqx.filter_jit"])
def test_check_counts_the_failed_systems(wrap):
    args = _failing()

    def f(*a):
        return tridiax.solve_tridiagonal(*a, check=True)

    f = {"eager": f, "jax.jit": jax.jit(f), "eqx.filter_jit": eqx.filter_jit(f)}[wrap]
    with pytest.raises(Exception, match=r"2 of 5 tridiagonal systems failed") as info:
        jax.block_until_ready(f(*args))
    assert "pivoting=True" in str(info.value)


def test_check_passes_good_systems_and_pivoted_ones():
    args = _failing()
    good = [a[[0, 2, 4]] for a in args]
    x = eqx.filter_jit(lambda *a: tridiax.solve_tridiagonal(*a, check=True))(*good)
    assert_close(x, verify.reference_solve(*good, axis=-1), np.float64)
    x = tridiax.solve_tridiagonal(*args, pivoting=True, check=True)
    assert_close(x, verify.reference_solve(*args, axis=-1), np.float64)


def test_check_catches_a_finite_wrong_answer():
    lower, diag, upper, rhs = random_bands((3, 40), np.float64, seed=4)
    diag[1, 0] = 1e-14  # tiny first pivot in system 1: finite but wrong without pivoting
    assert np.all(np.isfinite(np.asarray(tridiax.solve_tridiagonal(lower, diag, upper, rhs))))
    with pytest.raises(Exception, match=r"1 of 3 tridiagonal systems failed"):
        tridiax.solve_tridiagonal(lower, diag, upper, rhs, check=True)


def test_check_with_pivoting_reports_singular_matrices():
    lower, diag, upper, rhs = random_bands((4, 5), np.float64, seed=9)
    lower[2], diag[2], upper[2] = 0.0, 0.0, 0.0  # singular whatever the pivoting
    with pytest.raises(Exception, match=r"1 of 4 .*pivoted, so those matrices are singular"):
        tridiax.solve_tridiagonal(lower, diag, upper, rhs, pivoting=True, check=True)


def test_check_under_vmap_grad_and_modules():
    args = [jnp.asarray(a) for a in _failing()]
    with pytest.raises(Exception, match=r"tridiagonal systems failed"):
        jax.vmap(lambda *a: tridiax.solve_tridiagonal(*a, check=True))(*args)
    with pytest.raises(Exception, match=r"tridiagonal systems failed"):
        jax.grad(lambda d: jnp.sum(tridiax.solve_tridiagonal(args[0], d, *args[2:],
                                                             check=True)))(args[1])
    op = tridiax.Tridiagonal(*args[:3])
    with pytest.raises(Exception, match=r"2 of 5 tridiagonal systems failed"):
        op.solve(args[3], check=True)
    good = [a[jnp.array([0, 2])] for a in args]
    g = jax.grad(lambda d: jnp.sum(tridiax.solve_tridiagonal(good[0], d, *good[2:],
                                                             check=True)))(good[1])
    reference = jax.grad(lambda d: jnp.sum(dense_solve(good[0], d, *good[2:], -1)))(good[1])
    assert_close(g, reference, np.float64)


@pytest.mark.parametrize("wrap", [jax.jit, eqx.filter_jit])
def test_check_fires_under_jit_of_grad(wrap):
    # The solution's value is never used by the gradient: the check rides on the cotangent.
    lower, diag, upper, rhs = (jnp.asarray(a) for a in _failing())
    loss = lambda b: jnp.sum(tridiax.solve_tridiagonal(lower, diag, upper, b, check=True))  # noqa: E731
    with pytest.raises(Exception, match=r"2 of 5 tridiagonal systems failed"):
        jax.block_until_ready(wrap(jax.grad(loss))(rhs))
    good = [a[jnp.array([0, 2])] for a in (lower, diag, upper, rhs)]
    loss = lambda d: jnp.sum(tridiax.solve_tridiagonal(good[0], d, *good[2:], check=True))  # noqa: E731
    reference = jax.grad(lambda d: jnp.sum(dense_solve(good[0], d, *good[2:], -1)))(good[1])
    assert_close(wrap(jax.grad(loss))(good[1]), reference, np.float64)


def test_check_in_forward_mode():
    lower, diag, upper, rhs = (jnp.asarray(a) for a in _failing())
    solve_checked = lambda b: tridiax.solve_tridiagonal(lower, diag, upper, b, check=True)  # noqa: E731
    with pytest.raises(Exception, match=r"2 of 5 tridiagonal systems failed"):
        jax.block_until_ready(jax.jit(lambda b: jax.jvp(solve_checked, (b,), (b,))[1])(rhs))
    good = [a[jnp.array([0, 2])] for a in (lower, diag, upper, rhs)]
    f = lambda b: tridiax.solve_tridiagonal(*good[:3], b, check=True)  # noqa: E731
    _, tangent = jax.jvp(f, (good[3],), (jnp.ones_like(good[3]),))
    assert_close(tangent, dense_solve(*good[:3], jnp.ones_like(good[3]), -1), np.float64)


def test_check_periodic():
    lower, diag, upper, rhs = random_bands((3, 7), np.float64, seed=10)
    x = tridiax.solve_periodic_tridiagonal(lower, diag, upper, rhs, check=True)
    assert_close(x, verify.reference_solve(lower, diag, upper, rhs, axis=-1, periodic=True),
                 np.float64)
    diag[0, 0] = 0.0  # once a breakdown of Sherman-Morrison (gamma = -diag[0]); now solved
    x = tridiax.solve_periodic_tridiagonal(lower, diag, upper, rhs, check=True)
    assert_close(x, verify.reference_solve(lower, diag, upper, rhs, axis=-1, periodic=True),
                 np.float64)
    diag[1, 1] = lower[1, 1] = 0.0  # row 1 of system 1 is (0, 0, upper, 0, ...): a zero pivot
    with pytest.raises(tridiax.BreakdownError,
                       match=r"1 of 3 periodic tridiagonal systems failed.*Pass pivoting=True"):
        tridiax.solve_periodic_tridiagonal(lower, diag, upper, rhs, check=True)
    x = tridiax.solve_periodic_tridiagonal(lower, diag, upper, rhs, check=True, pivoting=True)
    assert_close(x, verify.reference_solve(lower, diag, upper, rhs, axis=-1, periodic=True),
                 np.float64, factor=100)


def test_without_check_a_breakdown_stays_in_its_system():
    args = _failing()
    x = np.asarray(tridiax.solve_tridiagonal(*args))
    bad = ~np.all(np.isfinite(x), axis=-1)
    np.testing.assert_array_equal(bad, [False, True, False, True, False])
    good = [a[[0, 2, 4]] for a in args]
    np.testing.assert_array_equal(x[[0, 2, 4]], np.asarray(tridiax.solve_tridiagonal(*good)))


def test_pivoting_settings_errors():
    args = random_bands((5,), np.float64)
    with pytest.raises(TypeError, match="pivoting must be True or False"):
        tridiax.solve_tridiagonal(*args, pivoting="yes")
    with pytest.raises(TypeError, match="check must be True or False"):
        tridiax.TDMA(check=1)
    with pytest.raises(ValueError, match="unpivoted factorization without a check"):
        tridiax.TDMA(pivoting=True).factor(tridiax.Tridiagonal(*args[:3]))


def test_breakdown_message_is_built_on_demand():
    from tridiax._core.check import BreakdownMessages

    messages = BreakdownMessages(10**9, 1e-8, False)
    assert len(messages) == 10**9 + 1
    assert messages[12345].startswith("tridiax: 12345 of 1000000000 tridiagonal systems failed")
    assert hash(messages) == hash(BreakdownMessages(10**9, 1e-8, False))

