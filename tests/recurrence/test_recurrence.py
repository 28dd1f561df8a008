"""linear_recurrence and indrnn whatever the backend: the default backend against
lax.associative_scan; IndRNN's tanh to a few units in the last place over its whole range,
special values included, and in every lane of a ragged vector; the gradient is one reverse
recurrence; vmap moves no data; and the errors a caller gets for operands that do not fit.
Each backend's own tests are in test_recurrence_<backend>.py (the contract all of them pass,
in recurrence_contract.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, equations, numpy_loop
from recurrence_contract import problem

import tridiax
from tridiax._recurrence.api import recurrence


def test_matches_associative_scan():
    a, x = problem((300, 50), np.float32, seed=2)

    def combine(left, right):
        return left[0] * right[0], right[0] * left[1] + right[1]

    expected = jax.lax.associative_scan(combine, (jnp.asarray(a), jnp.asarray(x)))[1]
    assert_close(tridiax.linear_recurrence(a, x), expected, np.float32, factor=5)


@pytest.mark.parametrize("dtype,ulps", [(np.float32, 8), (np.float64, 4)])
def test_indrnn_tanh_is_accurate_everywhere(dtype, ulps):
    # With w = 0 every step is tanh(z): the kernel's tanh (a rational approximation in float32,
    # glibc's vector tanh or libm's in float64) against NumPy's, in units in the last place,
    # over [-12, 12] (both sides of the clamp at 7.9), tiny values, zero, infinities and NaN.
    grid = np.concatenate([np.linspace(-12, 12, 20_001), np.geomspace(1e-30, 1e-2, 500),
                           -np.geomspace(1e-30, 1e-2, 500), [0.0, -0.0, 3e-4, 5e-4]])
    z = grid.astype(dtype).reshape(-1, 1) * np.ones((1, 19), dtype)  # 19 lanes: a ragged vector
    h = np.asarray(tridiax.indrnn(np.zeros((19, 1), dtype), z.T, axis=-1, activation=jnp.tanh)).T
    expected = np.tanh(z.astype(np.float64))
    spacing = np.spacing(np.maximum(np.abs(expected), np.finfo(dtype).tiny).astype(dtype))
    assert np.max(np.abs(h - expected) / spacing) <= ulps
    special = np.array([[np.inf, -np.inf, np.nan]], dtype)
    out = np.asarray(tridiax.indrnn(np.zeros(1, dtype), special.T, activation=jnp.tanh)).ravel()
    assert out[0] == 1 and out[1] == -1 and np.isnan(out[2])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,axis", [((40, 37), 0), ((37, 40), -1), ((30, 3, 21), 0)])
def test_indrnn_tanh_every_lane(dtype, shape, axis):
    # The native kernel takes tanh a vector of lanes at a time (glibc's libmvec where it is
    # linked) and the lanes past the last whole vector one by one: widths not a multiple of the
    # vector, features along either axis, against the loop in float64.
    rng = np.random.default_rng(len(shape))
    features = np.delete(np.array(shape), axis % len(shape))
    w = rng.uniform(-1, 1, tuple(features)).astype(dtype)
    z = (3 * rng.standard_normal(shape)).astype(dtype)
    w_along = np.expand_dims(w, axis)
    h = tridiax.indrnn(w_along, z, axis=axis, activation=jnp.tanh)
    expected = numpy_loop(np.broadcast_to(w_along, shape).astype(np.float64),
                          z.astype(np.float64), axis=axis, activation=np.tanh)
    assert h.dtype == dtype
    assert_close(h, expected, dtype)


def test_backward_is_one_reverse_recurrence():
    a, x = jnp.ones((8, 3)), jnp.ones((8, 3))
    jaxpr = jax.make_jaxpr(jax.grad(lambda a, x: jnp.sum(tridiax.linear_recurrence(a, x)),
                                    argnums=(0, 1)))(a, x)
    calls = [e.params for e in equations(jaxpr, "tridiax_recurrence")]
    assert [(p["reverse"], p["shifted"]) for p in calls] == [(False, False), (True, True)]


@pytest.mark.parametrize("in_axes", [0, 1, (None, 1), (1, None)])
def test_vmap_matches_loop_and_moves_no_data(in_axes):
    a, x = (jnp.asarray(v) for v in problem((6, 4, 5), seed=11))
    axes = in_axes if isinstance(in_axes, tuple) else (in_axes, in_axes)
    bax = next(ax for ax in axes if ax is not None)
    a = a if axes[0] is not None else jnp.take(a, 0, axis=bax)
    x = x if axes[1] is not None else jnp.take(x, 0, axis=bax)
    f = jax.vmap(lambda a, x: tridiax.linear_recurrence(a, x, axis=0), in_axes=in_axes,
                 out_axes=bax)
    out = f(a, x)
    a_full, x_full = jnp.broadcast_arrays(*(jnp.expand_dims(v, bax) if ax is None else v
                                            for v, ax in zip((a, x), axes, strict=True)))
    assert_close(out, numpy_loop(a_full, x_full, axis=1 if bax == 0 else 0), np.float64)
    assert "stablehlo.transpose" not in jax.jit(f).lower(a, x).as_text()


def test_errors():
    x = jnp.ones((5, 3))
    with pytest.raises(ValueError, match=r"do not broadcast.*a\(4,\).*x\(5, 3\)"):
        tridiax.linear_recurrence(jnp.ones(4), x)
    with pytest.raises(ValueError, match=r"initial has shape \(5,\).*state shape \(3,\)"):
        tridiax.linear_recurrence(jnp.ones(3), x, initial=jnp.ones(5))
    with pytest.raises(ValueError, match=r"initial has shape \(2, 3\)"):
        tridiax.linear_recurrence(jnp.ones(3), x, initial=jnp.ones((2, 3)))
    with pytest.raises(TypeError, match="^x has dtype int32"):
        tridiax.linear_recurrence(jnp.ones(3), jnp.ones((5, 3), jnp.int32))
    with pytest.raises(TypeError, match="^initial has dtype int32"):
        tridiax.linear_recurrence(jnp.ones(3), x, initial=jnp.ones(3, jnp.int32))
    with pytest.raises(ValueError, match=r"axis 0 has size 0"):
        tridiax.linear_recurrence(jnp.ones(3), jnp.ones((0, 3)))
    with pytest.raises(ValueError, match="axis=2 is out of range"):
        tridiax.linear_recurrence(jnp.ones(3), x, axis=2)
    with pytest.raises(TypeError, match="^weight_hh has dtype bool"):
        tridiax.indrnn(jnp.ones(3, bool), x)
    with pytest.raises(TypeError, match="activation must be an elementwise function"):
        tridiax.indrnn(jnp.ones(3), x, activation="relu")
    with pytest.raises(ValueError, match="native recurrence runs identity, relu and tanh"):
        recurrence(jnp.ones(3), x, activation=jax.nn.gelu, backend="native")
