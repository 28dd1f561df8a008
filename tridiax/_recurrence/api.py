"""`linear_recurrence` and `indrnn`: check and arrange the inputs, then bind `recurrence_p`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from .._core import backend as _backend
from .._core import dispatch as _dispatch
from .._core.inputs import check_dtype, conform, plan_of, read, result_dtype
from .primitive import recurrence_p


def recurrence(a, x, *, axis=0, reverse=False, initial=None, final_only=False, activation=None,
               backend=None, names=("a", "x")):
    """The shared entry point of linear_recurrence and indrnn, with a backend override. With
    `final_only`, the last state with `axis` removed."""
    values, signatures = read(names, (a, x))
    p = plan_of(signatures, names, axis, along="time steps")
    state_shape = p.shape[:p.axis] + p.shape[p.axis + 1:]
    if initial is not None:
        (initial,), (initial_signature,) = read(("initial",), (initial,))
        check_dtype("initial", *initial_signature[1:])
        if np.ndim(initial) > len(state_shape) or not _broadcasts(np.shape(initial), state_shape):
            raise ValueError(
                f"initial has shape {np.shape(initial)}, which does not broadcast to the state "
                f"shape {state_shape} (the shape {p.shape} without axis {p.axis})."
            )
        p = dataclasses.replace(p, dtype=result_dtype([((), p.dtype, False),
                                                       initial_signature]))
    _backend.check_backend(backend, p.dtype, activation=activation, op="recurrence")
    call = (p, bool(reverse), bool(final_only), activation, backend, initial is not None)
    return _dispatch.run(_compute, call, *values, *([] if initial is None else [initial]))


def _compute(call, a, x, *initial):
    p, reverse, final_only, activation, backend, _ = call
    a, x = conform((a, x), p)
    if initial:
        (h0,) = initial
        state_ndim = p.ndim - 1
        h0 = jnp.asarray(h0).astype(p.dtype)
        h0 = jnp.expand_dims(h0.reshape((1,) * (state_ndim - h0.ndim) + h0.shape), p.axis)
    else:
        h0 = jnp.zeros((1,) * p.ndim, p.dtype)
    h = recurrence_p.bind(a, x, h0, axis=p.axis, reverse=reverse, shifted=False,
                          activation=activation, final_only=final_only, backend=backend, chunk=None)
    return jnp.squeeze(h, p.axis) if final_only else h


def _broadcasts(shape, target) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == tuple(target)
    except ValueError:
        return False


def linear_recurrence(a: ArrayLike, x: ArrayLike, *, axis: int = 0, reverse: bool = False,
                      initial: ArrayLike | None = None, final_only: bool = False) -> Array:
    r"""The elementwise linear recurrence $h_t = a_t h_{t-1} + x_t$ along `axis`.

    **Arguments:**

    - `a`: the decays, broadcasting against `x` under NumPy rules: a per-feature constant of
      shape `(F,)` against `x` of shape `(T, F)` is read, never copied T times.
    - `x`: the inputs, `(..., T, ...)` with time along `axis`.
    - `axis`: the time axis (negative counts from the end).
    - `reverse`: run from the end, $h_t = a_t h_{t+1} + x_t$.
    - `initial`: $h_{-1}$ (or $h_T$ when reversed), broadcasting to the state shape (the
      result's shape without `axis`); zeros by default.
    - `final_only`: return only the last state, without materialising the sequence.

    **Returns:** the states $h$ with the broadcast shape of `a` and `x`, or, when `final_only`,
    the last state with `axis` removed.

    Gradients w.r.t. `a`, `x` and `initial` run the reverse-time recurrence
    $\bar h_t = g_t + a_{t+1} \bar h_{t+1}$ with the same kernel; jvp, vmap and second order work.
    Equivalent to a loop `h = a[t] * h + x[t]`.
    """
    return recurrence(a, x, axis=axis, reverse=reverse, initial=initial, final_only=final_only)


def indrnn(weight_hh: ArrayLike, z: ArrayLike, *, axis: int = 0,
           activation: Callable[[Array], Array] = jax.nn.relu,
           initial: ArrayLike | None = None) -> Array:
    r"""The IndRNN recurrence $h_t = \sigma(w \odot h_{t-1} + z_t)$ along `axis`, in one kernel.

    **Arguments:**

    - `weight_hh`: the recurrent weights, broadcasting against `z` (shape `(F,)` against
      `z` of shape `(T, F)`).
    - `z`: the input projections `W_ih x_t + b`, time along `axis`.
    - `activation`: an elementwise function (relu, tanh, identity, your own). The backward
      pass takes the derivative of relu and tanh from the stored outputs, and of any other
      activation at the pre-activations recomputed from the stored states.
    - `initial`: $h_{-1}$, broadcasting to the state shape; zeros by default.

    **Returns:** the states, with the broadcast shape of `weight_hh` and `z`.
    """
    if not callable(activation):
        raise TypeError(f"activation must be an elementwise function, got {activation!r}.")
    return recurrence(weight_hh, z, axis=axis, initial=initial, activation=activation,
                      names=("weight_hh", "z"))
