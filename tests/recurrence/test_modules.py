"""Equinox modules: IndRNN and LinearRecurrence."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close
from recurrence_contract import jax_loop

import tridiax


def test_indrnn_fields_shapes_and_reference():
    model = tridiax.IndRNN(3, 8, activation=jnp.tanh, key=jax.random.key(0))
    assert model.weight_ih.shape == (8, 3)
    assert model.weight_hh.shape == (8,)
    assert model.bias.shape == (8,)
    xs = jax.random.normal(jax.random.key(1), (25, 3))
    h = model(xs)
    assert h.shape == (25, 8)
    z = xs @ model.weight_ih.T + model.bias
    assert_close(h, jax_loop(model.weight_hh, z, jnp.zeros(8), activation=jnp.tanh), np.float32)
    h0 = jnp.ones(8)
    assert_close(model(xs, h0), jax_loop(model.weight_hh, z, h0, activation=jnp.tanh), np.float32)


def test_indrnn_vmap_grad_jit_and_no_transposes():
    model = tridiax.IndRNN(4, 16, key=jax.random.key(2))
    xs = jax.random.normal(jax.random.key(3), (5, 30, 4))

    def loss(m):
        return jnp.mean(jax.vmap(m)(xs) ** 2)

    def reference_loss(m):
        z = jnp.einsum("bti,hi->bth", xs, m.weight_ih) + m.bias
        h = jax.vmap(lambda zb: jax_loop(m.weight_hh, zb, jnp.zeros(16), activation=jax.nn.relu))(z)
        return jnp.mean(h**2)

    grads = eqx.filter_jit(eqx.filter_grad(loss))(model)
    expected = eqx.filter_grad(reference_loss)(model)
    for name in ("weight_ih", "weight_hh", "bias"):
        assert_close(getattr(grads, name), getattr(expected, name), np.float32, factor=10)
    for platforms in (("cpu",), ("cuda",)):
        text = jax.jit(jax.vmap(model)).trace(xs).lower(lowering_platforms=platforms).as_text()
        assert "stablehlo.transpose" not in text


def test_indrnn_bad_input():
    with pytest.raises(ValueError, match="must be positive"):
        tridiax.IndRNN(0, 3, key=jax.random.key(0))
    model = tridiax.IndRNN(3, 4, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"xs must have shape \(T, 3\), got \(5, 2\)"):
        model(jnp.ones((5, 2)))


def test_linear_recurrence_module():
    module = tridiax.LinearRecurrence(axis=1, reverse=True)
    a = jnp.full((2, 6, 3), 0.5)
    x = jnp.ones((2, 6, 3))
    h = module(a, x)
    expected = tridiax.linear_recurrence(a, x, axis=1, reverse=True)
    assert_close(h, expected, np.float32)
    assert_close(module(a, x, final_only=True), expected[:, 0], np.float32)
    # The settings are static: the module passes through jit as a pytree with no leaves.
    assert jax.tree_util.tree_leaves(module) == []
    assert_close(eqx.filter_jit(lambda m, a, x: m(a, x))(module, a, x), expected, np.float32)
