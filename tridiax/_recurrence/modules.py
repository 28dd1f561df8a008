"""Equinox modules for the recurrences: LinearRecurrence and IndRNN."""

from __future__ import annotations

import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import Array

from .api import indrnn, linear_recurrence


class LinearRecurrence(eqx.Module):
    """h[t] = a[t]*h[t-1] + x[t] along `axis` (see `tridiax.linear_recurrence`).

    `LinearRecurrence(axis=0, reverse=False)(a, x, initial=None, final_only=False)`: `axis`
    is a dimension of the broadcast shape of `a` and `x`, as for every tridiax call
    ([Shapes and axis](../guides/tridiagonal.md#shapes-and-axis)).
    """

    axis: int = eqx.field(static=True, default=0)
    reverse: bool = eqx.field(static=True, default=False)

    def __call__(self, a, x, initial=None, *, final_only: bool = False) -> Array:
        return linear_recurrence(a, x, axis=self.axis, reverse=self.reverse, initial=initial,
                                 final_only=final_only)


class IndRNN(eqx.Module):
    r"""Independently recurrent layer: $h_t = \sigma(W_{ih} x_t + b + w_{hh} \odot h_{t-1})$.

    **Fields:** `weight_ih` (hidden_size, input_size), `weight_hh` (hidden_size,),
    `bias` (hidden_size,), `activation` (static).

    `__call__(xs, initial=None)` maps `xs` of shape (T, input_size) to (T, hidden_size): one
    matmul for the input projection, one kernel for the recurrence. Batch with `jax.vmap`.
    """

    weight_ih: Array
    weight_hh: Array
    bias: Array
    activation: Callable[[Array], Array] = eqx.field(static=True)

    def __init__(self, input_size: int, hidden_size: int, *,
                 activation: Callable[[Array], Array] = jax.nn.relu, key: Array):
        if input_size < 1 or hidden_size < 1:
            raise ValueError(f"input_size and hidden_size must be positive, got {input_size}, "
                             f"{hidden_size}.")
        ih_key, hh_key = jax.random.split(key)
        bound = 1 / math.sqrt(input_size)
        self.weight_ih = jax.random.uniform(ih_key, (hidden_size, input_size), minval=-bound,
                                            maxval=bound)
        # Recurrent weights in (0, 1): every unit forgets, none explodes (IndRNN paper, sec. 3).
        self.weight_hh = jax.random.uniform(hh_key, (hidden_size,), minval=0.0, maxval=1.0)
        self.bias = jnp.zeros((hidden_size,))
        self.activation = activation

    def __call__(self, xs: Array, initial: Array | None = None) -> Array:
        hidden, inputs = self.weight_ih.shape
        if jnp.ndim(xs) != 2 or jnp.shape(xs)[1] != inputs:
            raise ValueError(f"xs must have shape (T, {inputs}), got {jnp.shape(xs)}; use "
                             "jax.vmap for a batch of sequences.")
        # Contract the input dimension of both operands directly: no transpose op, even of W.
        z = jax.lax.dot_general(xs, self.weight_ih, (((1,), (1,)), ((), ()))) + self.bias
        # weight_hh as (1, hidden): per unit, constant in time, whatever T is (`_core/inputs.py`).
        return indrnn(self.weight_hh[None, :], z, axis=0, activation=self.activation,
                      initial=initial)
