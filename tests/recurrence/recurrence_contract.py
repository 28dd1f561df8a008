"""What every backend of linear_recurrence and indrnn must do, as test classes each backend's
module subclasses (`class TestNative(RecurrenceContract): backend = "native"`), and the
references they are held to.

`RecurrenceContract` holds the tests of a backend's recurrence: against a NumPy loop at
lengths and widths around a kernel's blocks, forward and reversed, from a given initial state,
the whole sequence and its last state alone; along every axis; in every dtype the backend
runs; with the decays broadcast; IndRNN with the activations the backend runs; and gradients
(forward and reverse mode, the decays shared over time) against those of a loop of jnp
operations. `PallasRecurrenceContract` adds what the Pallas Triton kernels (compiled or
interpreted) must also do: refuse an activation on complex values, which they split into real
and imaginary parts.

A backend runs where `helpers.backends()` lists it: elsewhere its class is not collected, and
each test's dtypes are those the backend runs; a test over no dtypes runs in the widest real
dtype the backend runs (`wide`: float64, or float32 where the backend has no float64). Not
collected by pytest itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import BackendContract, assert_close, numpy_loop, over_dtypes
from jax.test_util import check_grads

import tridiax
from tridiax._recurrence.api import recurrence

ACTIVATIONS = {
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
    "identity": lambda v: v,
    "custom": lambda v: v / (1 + jnp.abs(v)),
}
NUMPY_ACTIVATIONS = {
    "relu": lambda v: np.maximum(v, 0),
    "tanh": np.tanh,
    "identity": lambda v: v,
    "custom": lambda v: v / (1 + np.abs(v)),
}


def jax_loop(a, x, initial, reverse=False, activation=lambda v: v):
    """Differentiable reference along axis 0: a Python loop of jnp ops (short sequences only)."""
    a = jnp.broadcast_to(a, x.shape)
    h, out = initial, []
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    for t in steps:
        h = activation(a[t] * h + x[t])
        out.append(h)
    return jnp.stack(out[::-1] if reverse else out)


def problem(shape, dtype=np.float64, seed=0, a_shape=None):
    """Decays in [0.3, 1) (complex ones rotated a little) and standard normal inputs."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.3, 1.0, a_shape or shape)
    x = rng.standard_normal(shape)
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        a = a * np.exp(0.3j * rng.standard_normal(a.shape))
        x = x + 1j * rng.standard_normal(shape)
    return a.astype(dtype), x.astype(dtype)


def indrnn_problem(T, F):
    """Recurrent weights in [-1, 1), inputs and an initial state, for IndRNN."""
    rng = np.random.default_rng(T + F)
    return rng.uniform(-1, 1, F), rng.standard_normal((T, F)), rng.standard_normal(F)


class RecurrenceContract(BackendContract):
    """The tests every backend's recurrence passes; a subclass sets `backend`."""

    # The activations of ACTIVATIONS this backend runs IndRNN with.
    activations: tuple[str, ...] = tuple(ACTIVATIONS)

    def pytest_generate_tests(self, metafunc):
        """The cases that depend on the backend: `dtype` over the test's `over_dtypes` this
        backend runs; `activation_name` over the activations it runs."""
        super().pytest_generate_tests(metafunc)
        if "activation_name" in metafunc.fixturenames:
            metafunc.parametrize("activation_name", self.activations)

    @pytest.mark.parametrize("T", [1, 15, 63, 300])
    @pytest.mark.parametrize("F", [1, 7, 129])
    @pytest.mark.parametrize("reverse", [False, True])
    def test_matches_numpy_loop(self, T, F, reverse):
        a, x = problem((T, F), self.wide, seed=T * F)
        h0 = np.random.default_rng(1).standard_normal(F).astype(self.wide)
        h = recurrence(a, x, reverse=reverse, initial=h0, backend=self.backend)
        assert h.shape == (T, F)
        assert_close(h, numpy_loop(a, x, reverse=reverse, initial=h0), self.wide)
        last = recurrence(a, x, reverse=reverse, initial=h0, final_only=True, backend=self.backend)
        assert last.shape == (F,)
        assert_close(last, numpy_loop(a, x, reverse=reverse, initial=h0)[0 if reverse else -1],
                     self.wide)

    @pytest.mark.parametrize("shape,axis", [((4, 9, 3), 0), ((4, 9, 3), 1), ((4, 9, 3), -1),
                                            ((2, 3, 17, 5), 2)])
    def test_every_axis_final_only_and_initial(self, shape, axis):
        a, x = problem(shape, self.wide, seed=3)
        state = shape[:axis % len(shape)] + shape[axis % len(shape) + 1:]
        h0 = np.random.default_rng(4).standard_normal(state).astype(self.wide)
        h = recurrence(a, x, axis=axis, initial=h0, backend=self.backend)
        expected = numpy_loop(a, x, axis=axis, initial=h0)
        assert_close(h, expected, self.wide)
        last = recurrence(a, x, axis=axis, initial=h0, final_only=True, backend=self.backend)
        assert last.shape == state
        assert_close(last, np.take(expected, -1, axis=axis), self.wide)

    @over_dtypes(np.float32, np.float64, np.complex64, np.complex128, jnp.float16, jnp.bfloat16)
    def test_dtypes(self, dtype):
        complex_ = np.issubdtype(np.dtype(dtype), np.complexfloating)
        a, x = problem((40, 33), np.complex128 if complex_ else np.float64, seed=5)
        a, x = jnp.asarray(a, dtype), jnp.asarray(x, dtype)
        h = recurrence(a, x, backend=self.backend)
        assert h.dtype == dtype
        wide = np.complex128 if complex_ else np.float64
        exact = numpy_loop(np.asarray(a, wide), np.asarray(x, wide))
        assert_close(h, exact, dtype, factor=5)

    @pytest.mark.parametrize("a_shape", [(7,), (1, 7), (30, 1), (1, 1)])
    def test_decay_broadcasts(self, a_shape):
        a, x = problem((30, 7), self.wide, seed=6, a_shape=a_shape)
        h = recurrence(a, x, backend=self.backend)
        assert h.shape == (30, 7)
        assert_close(h, numpy_loop(a, x), self.wide)

    @pytest.mark.parametrize("T,F", [(1, 1), (15, 7), (63, 129)])
    def test_indrnn_matches_numpy_loop(self, activation_name, T, F):
        w, z, h0 = (v.astype(self.wide) for v in indrnn_problem(T, F))
        activation = ACTIVATIONS[activation_name]
        h = recurrence(w, z, initial=h0, activation=activation, backend=self.backend)
        expected = numpy_loop(w, z, initial=h0, activation=NUMPY_ACTIVATIONS[activation_name])
        assert_close(h, expected, self.wide)
        assert_close(tridiax.indrnn(w, z, activation=activation, initial=h0), h, self.wide)

    @pytest.mark.parametrize("activation", [None, "tanh", "relu"])
    @pytest.mark.parametrize("reverse", [False, True])
    @pytest.mark.parametrize("final_only", [False, True])
    def test_gradients_match_loop(self, activation, reverse, final_only):
        if activation is not None and reverse:
            return  # indrnn runs forward only
        act = ACTIVATIONS[activation] if activation else None
        a, x = (jnp.asarray(v) for v in problem((9, 4), self.wide, seed=7))
        h0 = jnp.asarray(np.random.default_rng(8).standard_normal(4), self.wide)

        def ours(a, x, h0):
            return recurrence(a, x, reverse=reverse, initial=h0, final_only=final_only,
                              activation=act, backend=self.backend)

        def loop(a, x, h0):
            h = jax_loop(a, x, h0, reverse=reverse, activation=act or (lambda v: v))
            return h[0 if reverse else -1][None] if final_only else h

        def loss(f):
            return lambda *args: jnp.sum(jnp.sin(f(*args)) * jnp.arange(
                1, f(*args).size + 1).reshape(f(*args).shape))

        grads = jax.grad(loss(ours), argnums=(0, 1, 2))(a, x, h0)
        expected = jax.grad(loss(loop), argnums=(0, 1, 2))(a, x, h0)
        for g, e in zip(grads, expected, strict=True):
            assert_close(g, e, self.wide, factor=10)
        if activation != "relu":  # relu has a kink: finite differences are unreliable there
            # In float32 a finite difference of JAX's default step (1e-4) loses about
            # eps32 / 1e-4 ~ 1e-3 to rounding, near check_grads' float32 tolerance (2e-3): it
            # takes a longer step there (the tolerance stays check_grads' own).
            check_grads(ours, (a, x, h0), order=2, modes=("fwd", "rev"),
                        eps=1e-3 if np.dtype(self.wide) == np.float32 else None)

    def test_gradient_of_shared_decay_and_jvp(self):
        # (F,) shared over time
        a = jnp.asarray(np.random.default_rng(9).uniform(0.3, 0.9, 5), self.wide)
        x = jnp.asarray(np.random.default_rng(10).standard_normal((12, 5)), self.wide)
        f = lambda a, x: recurrence(a, x, backend=self.backend)  # noqa: E731
        g = lambda a, x: jax_loop(a, x, jnp.zeros(5))  # noqa: E731
        ga = jax.grad(lambda a: jnp.sum(f(a, x) ** 2))(a)
        assert ga.shape == (5,)
        assert_close(ga, jax.grad(lambda a: jnp.sum(g(a, x) ** 2))(a), self.wide, factor=10)
        tangents = (jnp.ones(5, self.wide), jnp.ones((12, 5), self.wide))
        assert_close(jax.jvp(f, (a, x), tangents)[1], jax.jvp(g, (a, x), tangents)[1],
                     self.wide)

    @pytest.mark.parametrize("reverse", [False, True])
    def test_vmapped_decay_gradient_of_a_loss_linear_in_the_states(self, reverse):
        # vmap over x of a loss linear in h: the states are batched, their cotangent w is not
        rng = np.random.default_rng(11)
        a = jnp.asarray(rng.uniform(0.3, 0.9, 5), self.wide)
        xs = jnp.asarray(rng.standard_normal((3, 9, 5)), self.wide)
        w = jnp.asarray(rng.standard_normal((9, 5)), self.wide)

        def gradient(f):
            loss = lambda a, x: jnp.sum(w * f(a, x))  # noqa: E731
            return jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(None, 0))(a, xs)

        got = gradient(lambda a, x: recurrence(a, x, reverse=reverse, backend=self.backend))
        want = gradient(lambda a, x: jax_loop(a, x, jnp.zeros(5, self.wide), reverse=reverse))
        for g, e in zip(got, want, strict=True):
            assert g.shape == e.shape
            assert_close(g, e, self.wide, factor=10)


class PallasRecurrenceContract(RecurrenceContract):
    """The contract, and what the Pallas Triton kernels (compiled or interpreted) must also
    do."""

    @over_dtypes(np.complex64, np.complex128)
    def test_refuses_an_activation_on_complex_values(self, dtype):
        # Complex values are split into real and imaginary parts in the kernel: no user
        # activation on them.
        with pytest.raises(ValueError, match="without an activation"):
            recurrence(*problem((5, 3), dtype), backend=self.backend, activation=jnp.tanh)
