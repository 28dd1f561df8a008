"""`linear_recurrence` and `indrnn`: check and arrange the inputs, then bind `recurrence_p`."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from . import _backend
from ._dtypes import is_supported
from ._recurrence_primitive import recurrence_p
from ._solve import prepare_operands


def _prepare(coefficient, x, initial, names, axis):
    (a, x), axis = prepare_operands((coefficient, x), names, axis)
    shape = np.broadcast_shapes(a.shape, x.shape)
    state_shape = shape[:axis] + shape[axis + 1 :]
    if initial is None:
        h0 = jnp.zeros((1,) * len(shape), x.dtype)
    else:
        try:
            h0 = jnp.asarray(initial)
        except TypeError as err:
            raise TypeError(f"initial must be an array, got {type(initial).__name__}: {err}") from None
        if not is_supported(h0.dtype):
            raise TypeError(f"initial has dtype {h0.dtype}; it must be floating-point or complex.")
        if h0.ndim > len(state_shape) or not _broadcasts(h0.shape, state_shape):
            raise ValueError(
                f"initial has shape {h0.shape}, which does not broadcast to the state shape "
                f"{state_shape} (the shape {shape} without axis {axis})."
            )
        h0 = jnp.expand_dims(h0.reshape((1,) * (len(state_shape) - h0.ndim) + h0.shape), axis)
    dtype = jnp.result_type(a.dtype, x.dtype, h0.dtype)
    return a.astype(dtype), x.astype(dtype), h0.astype(dtype), axis


def _broadcasts(shape, target) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == tuple(target)
    except ValueError:
        return False


def recurrence(a, x, *, axis=0, reverse=False, initial=None, final_only=False, activation=None,
               backend=None, names=("a", "x")):
    """The shared entry point of linear_recurrence and indrnn, with a backend override."""
    a, x, h0, axis = _prepare(a, x, initial, names, axis)
    _backend.check_backend(backend, x.dtype, activation=activation)
    return recurrence_p.bind(a, x, h0, axis=axis, reverse=bool(reverse), shifted=False,
                             activation=activation, final_only=bool(final_only), backend=backend)


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
    h = recurrence(a, x, axis=axis, reverse=reverse, initial=initial, final_only=final_only)
    return jnp.squeeze(h, axis) if final_only else h


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
