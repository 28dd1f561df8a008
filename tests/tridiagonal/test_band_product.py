"""The band cotangents of a solve's gradient (tridiax/_tridiagonal/band_product.py): the native one-pass
kernel against a NumPy loop, and the gradients that use it against a dense solve."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, dense_solve, random_bands

import tridiax
from tridiax._core.backend import unavailable
from tridiax._tridiagonal.api import solve
from tridiax._tridiagonal.band_product import band_cotangents_p

pytestmark = [
    pytest.mark.cpu_device,
    pytest.mark.skipif(unavailable("native", np.float32, platform="cpu") is not None,
                       reason="the native CPU kernel is not built here"),
]

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
# (shape, axis): N = 1, 2, 3, odd, a middle axis, and more values per system than one tile of
# the kernel (16384) and not a multiple of it.
SHAPES = [((1, 4), 0), ((2, 3), 0), ((3, 5), -1), ((7, 3001), 0), ((4, 9, 2), 1), ((2, 20001), 1),
          ((5,), 0)]
PRESENT = [(True, True, True), (True, False, True), (False, True, False), (False, False, True)]


def numpy_cotangents(g, x, axis, transposed, periodic):
    """lower_bar[i] = -g[i] x[i-1], diag_bar = -g x, upper_bar[i] = -g[i] x[i+1] along `axis`
    (g and x swapped in lower and upper when transposed), row by row."""
    g, x = np.moveaxis(g, axis, 0), np.moveaxis(x, axis, 0)
    u, v = (x, g) if transposed else (g, x)
    n = g.shape[0]
    lower, diag, upper = np.zeros_like(g), -(g * x), np.zeros_like(g)
    for i in range(n):
        if i > 0:
            lower[i] = -(u[i] * v[i - 1])
        elif periodic and n > 1:
            lower[i] = -(u[i] * v[n - 1])
        if i < n - 1:
            upper[i] = -(u[i] * v[i + 1])
        elif periodic and n > 1:
            upper[i] = -(u[i] * v[0])
    return [np.moveaxis(c, 0, axis) for c in (lower, diag, upper)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis,transposed,periodic,backend", [
    (shape, axis, transposed, periodic, backend)
    for (shape, axis), (transposed, periodic), backend in itertools.product(
        SHAPES, itertools.product([False, True], repeat=2), ["native", "xla"])
    # XLA's formulation wraps a periodic system of one row onto itself; no periodic solve
    # takes fewer than three rows
    if backend == "native" or not periodic or shape[axis] > 1])
def test_cotangents_match_numpy(dtype, shape, axis, transposed, periodic, backend):
    """The native kernel, and XLA's formulation (`_cotangents`, one fusion on every other
    platform)."""
    rng = np.random.default_rng(sum(shape))
    g, x = rng.standard_normal(shape), rng.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        g, x = g + 1j * rng.standard_normal(shape), x - 1j * rng.standard_normal(shape)
    g, x = g.astype(dtype), x.astype(dtype)
    expected = numpy_cotangents(g, x, axis % len(shape), transposed, periodic)
    for present in PRESENT:
        fn = jax.jit(lambda g, x, present=present: band_cotangents_p.bind(
            g, x, axis=axis % len(shape), transposed=transposed, periodic=periodic,
            present=present, backend=backend))
        assert ("tridiax_band_cotangents_cpu" in fn.lower(g, x).as_text()) == (backend == "native")
        got = fn(g, x)
        assert len(got) == sum(present)
        for c, e in zip(got, [e for e, want in zip(expected, present) if want], strict=True):
            assert c.shape == shape and c.dtype == dtype
            np.testing.assert_allclose(np.asarray(c), e, rtol=1e-6 if dtype in (
                np.float32, np.complex64) else 1e-14, atol=0)


def _grad_program(fn, args):
    return jax.jit(jax.grad(fn, argnums=tuple(range(len(args))))).lower(*args).compile().as_text()


@pytest.mark.parametrize("periodic", [False, True])
@pytest.mark.parametrize("shape,axis", [((6, 5), 0), ((5, 7), -1), ((3, 6, 4), 1)])
def test_gradient_forms_band_cotangents_in_one_native_pass(periodic, shape, axis):
    args = [jnp.asarray(a) for a in random_bands(shape, np.float64, seed=len(shape))]

    def loss(*a, backend=None):
        return jnp.sum(jnp.sin(solve(*a, axis=axis, backend=backend, periodic=periodic)))

    program = _grad_program(loss, args)
    assert program.count('custom_call_target="tridiax_band_cotangents_cpu"') == 1
    # The XLA backend keeps XLA's loops (and the same values).
    assert "tridiax_band_cotangents_cpu" not in _grad_program(
        lambda *a: loss(*a, backend="xla"), args)
    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(*args)
    if periodic:
        expected = jax.grad(lambda *a: jnp.sum(jnp.sin(_dense_periodic(*a, axis))),
                            argnums=(0, 1, 2, 3))(*args)
    else:
        expected = jax.grad(lambda *a: jnp.sum(jnp.sin(dense_solve(*a, axis))),
                            argnums=(0, 1, 2, 3))(*args)
    for g, e in zip(grads, expected, strict=True):
        assert_close(g, e, np.float64, factor=10)


def _dense_periodic(lower, diag, upper, rhs, axis):
    lower, diag, upper, rhs = (jnp.moveaxis(jnp.broadcast_to(a, rhs.shape), axis, -1)
                               for a in (lower, diag, upper, rhs))
    n = rhs.shape[-1]
    a = (diag[..., :, None] * jnp.eye(n) + lower[..., :, None] * jnp.eye(n, k=-1)
         + upper[..., :, None] * jnp.eye(n, k=1))
    a = a.at[..., 0, n - 1].add(lower[..., 0]).at[..., n - 1, 0].add(upper[..., n - 1])
    return jnp.moveaxis(jnp.linalg.solve(a, rhs[..., None])[..., 0], -1, axis)


def test_full_and_broadcast_bands_in_one_gradient():
    # lower and upper per system (one native pass), diag shared by every column (summed by XLA).
    shapes = ((5, 6), (5, 1), (5, 6), (5, 6))
    args = [jnp.asarray(a) for a in random_bands(None, np.float64, seed=7, shapes=shapes)]
    loss = lambda *a: jnp.sum(jnp.cos(tridiax.solve_tridiagonal(*a, axis=0)))  # noqa: E731
    assert "tridiax_band_cotangents_cpu" in _grad_program(loss, args)
    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(*args)
    expected = jax.grad(lambda *a: jnp.sum(jnp.cos(dense_solve(*a, 0))),
                        argnums=(0, 1, 2, 3))(*args)
    for g, e, s in zip(grads, expected, shapes, strict=True):
        assert g.shape == s
        assert_close(g, e, np.float64, factor=10)


def test_some_bands_differentiated_vmapped_and_second_order():
    args = [jnp.asarray(a) for a in random_bands((3, 6, 4), np.float64, seed=8)]

    def loss(solve, lower, upper):  # lower and upper only; diag and rhs fixed
        return jnp.sum(solve(lower, args[1], upper, args[3]) ** 3)

    mine = lambda *a: tridiax.solve_tridiagonal(*a, axis=1)  # noqa: E731
    dense = lambda *a: dense_solve(*a, 1)  # noqa: E731
    for argnums in ((0,), (0, 1)):
        got = jax.vmap(jax.grad(lambda l, u: loss(mine, l, u), argnums=argnums))(args[0], args[2])
        want = jax.vmap(jax.grad(lambda l, u: loss(dense, l, u), argnums=argnums))(args[0], args[2])
        for g, e in zip(got, want, strict=True):
            assert_close(g, e, np.float64, factor=10)
    # Second order through the cotangents: a Hessian-vector product in the lower band.
    tangent = jnp.asarray(random_bands((3, 6, 4), np.float64, seed=9)[0])

    def hvp(solve):
        grad = jax.grad(lambda l: loss(solve, l, args[2]))
        return jax.jvp(grad, (args[0],), (tangent,))[1]

    assert_close(hvp(mine), hvp(dense), np.float64, factor=100)
