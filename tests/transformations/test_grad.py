"""Gradients by implicit differentiation: against a dense jnp.linalg.solve and finite differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, backends, dense_solve, equations, random_bands
from jax.test_util import check_grads

from tridiax._tridiagonal.api import solve

CASES = [((1, 3), 0), ((2, 3), 0), ((5, 4), 0), ((4, 5), -1), ((3, 5, 2), 1), ((6,), 0)]


def _loss(f):
    # A nonlinear scalar of the solution, so every entry of x matters differently.
    return lambda *a: jnp.sum(jnp.sin(f(*a)) * jnp.arange(1, f(*a).size + 1).reshape(f(*a).shape))


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("shape,axis", CASES)
def test_grad_all_inputs_matches_dense(backend, shape, axis):
    args = [jnp.asarray(a) for a in random_bands(shape, np.float64, seed=sum(shape))]
    grads = jax.grad(_loss(lambda *a: solve(*a, axis=axis, backend=backend)),
                     argnums=(0, 1, 2, 3))(*args)
    expected = jax.grad(_loss(lambda *a: dense_solve(*a, axis)), argnums=(0, 1, 2, 3))(*args)
    for g, e in zip(grads, expected, strict=True):
        assert g.shape == e.shape
        assert_close(g, e, np.float64, factor=10)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("shape,axis", [((5, 3), 0), ((3, 4, 5), -1)])
def test_finite_differences_first_and_second_order(backend, shape, axis):
    args = [jnp.asarray(a) for a in random_bands(shape, np.float64, seed=1)]
    f = lambda *a: solve(*a, axis=axis, backend=backend)  # noqa: E731
    check_grads(f, args, order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("backend", backends(np.complex128))
def test_complex_gradients(backend):
    args = [jnp.asarray(a) for a in random_bands((5, 3), np.complex128, seed=2)]
    f = lambda *a: solve(*a, axis=0, backend=backend)  # noqa: E731
    check_grads(f, args, order=1, modes=("fwd", "rev"))


@pytest.mark.parametrize("backend", backends())
def test_jvp_jacfwd_jacrev_hvp(backend):
    args = [jnp.asarray(a) for a in random_bands((4, 3), np.float64, seed=3)]
    f = lambda *a: solve(*a, axis=0, backend=backend)  # noqa: E731
    g = lambda *a: dense_solve(*a, 0)  # noqa: E731
    tangents = [jnp.asarray(t) for t in random_bands((4, 3), np.float64, seed=4)]
    x, dx = jax.jvp(f, args, tangents)
    x_ref, dx_ref = jax.jvp(g, args, tangents)
    assert_close(x, x_ref, np.float64)
    assert_close(dx, dx_ref, np.float64, factor=10)
    for jac in (jax.jacfwd, jax.jacrev):
        for j, j_ref in zip(jac(f, argnums=(0, 1, 2, 3))(*args),
                            jac(g, argnums=(0, 1, 2, 3))(*args), strict=True):
            assert_close(j, j_ref, np.float64, factor=10)

    def hvp(fun):
        scalar = lambda d: jnp.sum(fun(args[0], d, args[2], args[3]) ** 3)  # noqa: E731
        return jax.jvp(jax.grad(scalar), (args[1],), (tangents[1],))[1]

    assert_close(hvp(f), hvp(g), np.float64, factor=100)


@pytest.mark.parametrize("backend", backends())
def test_broadcast_operands_get_summed_cotangents(backend):
    # One matrix (N, 1) for 6 columns, constant lower band (1, 1): cotangents keep those shapes.
    shapes = ((1, 1), (5, 1), (5, 1), (5, 6))
    args = [jnp.asarray(a) for a in random_bands(None, np.float64, seed=5, shapes=shapes)]
    grads = jax.grad(_loss(lambda *a: solve(*a, axis=0, backend=backend)),
                     argnums=(0, 1, 2, 3))(*args)
    expected = jax.grad(_loss(lambda *a: dense_solve(*a, 0)), argnums=(0, 1, 2, 3))(*args)
    for g, e, s in zip(grads, expected, shapes, strict=True):
        assert g.shape == s
        assert_close(g, e, np.float64, factor=10)


@pytest.mark.parametrize("backend", backends(np.float32))
def test_float32_gradients(backend):
    args = [jnp.asarray(a) for a in random_bands((30, 17), np.float32, seed=6)]
    grads = jax.grad(lambda *a: jnp.sum(solve(*a, axis=1, backend=backend) ** 2),
                     argnums=(0, 1, 2, 3))(*args)
    args64 = [a.astype(jnp.float64) for a in args]
    expected = jax.grad(lambda *a: jnp.sum(dense_solve(*a, 1) ** 2), argnums=(0, 1, 2, 3))(*args64)
    for g, e in zip(grads, expected, strict=True):
        assert g.dtype == jnp.float32
        assert_close(g, e, np.float32, factor=10)


def test_reverse_mode_is_one_transposed_solve():
    # Residuals: x and the bands; the backward pass is exactly one more (transposed) solve.
    args = [jnp.ones((8, 3))] * 4
    jaxpr = jax.make_jaxpr(jax.grad(lambda *a: jnp.sum(solve(*a, axis=0)), argnums=(0, 1, 2, 3)))(
        *args)
    solves = equations(jaxpr, "tridiax_tridiagonal_solve")
    assert [e.params["transposed"] for e in solves] == [False, True]
