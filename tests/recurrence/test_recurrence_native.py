"""linear_recurrence and indrnn on the native backend (the C++ kernels through XLA FFI, CPU):
the contract every backend passes (recurrence_contract.py), with IndRNN's built-in
activations (relu and tanh; a user's function is refused, and the default then picks a backend
that runs it); and the kernel's scan of contiguous steps (batch-first sequences and the chunks
of one long sequence; rows of a few lanes scanned together), called directly, against a NumPy
loop of its exact semantics: shifted coefficients, gate slopes, chunks entered from given
states, chunk ends from a zero state, in every tiling, with every operand broadcast."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, dtype_id, numpy_loop
from recurrence_contract import ACTIVATIONS, NUMPY_ACTIVATIONS, RecurrenceContract, indrnn_problem

import tridiax
from tridiax._core import planner as _planner
from tridiax._core.planner import CpuTiling
from tridiax._native import ffi as _native
from tridiax._recurrence.api import recurrence


def kernel_loop(a, x, h0, *, reverse, shifted, gate, chunk):
    """h of (P, T, Q) operands by the C++ kernel's definition, chunk by chunk (h0: (P, C, Q)),
    and each chunk's (product of coefficients, final state) from a zero state; every lane of
    a step at once."""
    P, T, Q = x.shape
    m = chunk or T
    C = -(-T // m)
    h = np.zeros(x.shape)
    decay, final = np.ones((P, C, Q)), np.zeros((P, C, Q))
    for p in range(P):
        for c in range(C):
            steps = range(c * m, min(T, (c + 1) * m))
            state, zero_state = h0[p, c].copy(), np.zeros(Q)
            for t in (reversed(steps) if reverse else steps):
                s = (t + 1 if reverse else t - 1) if shifted else t
                coef = a[p, s] if 0 <= s < T else np.zeros(Q)
                value = x[p, t]
                if gate is not None:
                    g = gate[0][p, t]
                    slope = (g > 0).astype(float) if gate[1] == "relu" else 1 - g * g
                    coef, value = coef * slope, value * slope
                state = coef * state + value
                zero_state = coef * zero_state + value
                decay[p, c] *= coef
                h[p, t] = state
            final[p, c] = zero_state
    return h, decay, final


def check_native_scan(dtype, shape, a_shape, chunk, reverse, shifted, gate, tilings, seed,
                      x_shape=None, gate_shape=None, h0_shape=None):
    """The kernel's runs (and chunk ends) of (P, T, Q) operands, `a` of `a_shape` broadcast
    (and x, the gate's states and h0 of their shapes, each of the full shape if not given), in
    each tiling, against kernel_loop."""
    rng = np.random.default_rng(seed)
    P, T, Q = shape
    C = -(-T // (chunk or T))

    def draw(low, high, drawn_shape, full):
        """Values of `drawn_shape` (`full` if None), broadcast to `full` for the loop."""
        size = drawn_shape or full
        values = rng.standard_normal(size) if low is None else rng.uniform(low, high, size)
        return np.broadcast_to(values, full)

    def given(v, drawn_shape):
        """What the kernel takes: the values as drawn, size-1 axes broadcast in place."""
        return jnp.asarray(np.asarray(v)[tuple(slice(n) for n in drawn_shape or v.shape)], dtype)

    a = draw(0.5, 1.0, a_shape, shape)
    x = draw(None, None, x_shape, shape)
    h0 = draw(None, None, h0_shape, (P, C, Q))
    states = None if gate is None else (draw(-0.9, 0.9, gate_shape, shape), gate)
    want, want_decay, want_final = kernel_loop(a, x, h0, reverse=reverse, shifted=shifted,
                                               gate=states, chunk=chunk)
    kernel_gate = None if gate is None else (given(states[0], gate_shape),
                                             getattr(jax.nn, gate, jnp.tanh))
    a_in, x_in, h0_in = given(a, a_shape), given(x, x_shape), given(h0, h0_shape)
    for tiles in tilings:
        # The planner's choice of the tiles scanned in vector registers, for these tiles.
        tiling = dataclasses.replace(tiles, scan=_planner.recurrence_scans(
            P, T, Q, dtype, chunk=chunk, tiling=tiles))
        got = _native.recurrence_pnq(a_in, x_in, h0_in, reverse=reverse, shifted=shifted,
                                     activation=None, final_only=False, out_dtype=dtype,
                                     tiling=tiling, chunk=chunk, gate=kernel_gate)
        assert_close(got, want, dtype)
        if chunk:
            decay, final = _native.recurrence_ends_pnq(a_in, x_in, reverse=reverse,
                                                       shifted=shifted, chunk=chunk,
                                                       tiling=tiling, gate=kernel_gate)
            assert_close(decay, want_decay, dtype)
            assert_close(final, want_final, dtype)
        else:
            final = _native.recurrence_pnq(a_in, x_in, h0_in, reverse=reverse,
                                           shifted=shifted, activation=None, final_only=True,
                                           out_dtype=dtype, tiling=tiling, gate=kernel_gate)
            assert_close(final[:, 0], want[:, 0 if reverse else -1], dtype)


class TestNative(RecurrenceContract):
    backend = "native"
    activations = ("relu", "tanh")

    @pytest.mark.parametrize("user_function", ["identity", "custom"])
    @pytest.mark.parametrize("T,F", [(1, 1), (15, 7), (63, 129)])
    def test_indrnn_refuses_a_user_function(self, user_function, T, F):
        w, z, h0 = indrnn_problem(T, F)
        activation = ACTIVATIONS[user_function]
        with pytest.raises(ValueError, match="native recurrence runs identity, relu and tanh"):
            recurrence(w, z, initial=h0, activation=activation, backend=self.backend)
        # The default picks another backend for a user's function.
        expected = numpy_loop(w, z, initial=h0, activation=NUMPY_ACTIVATIONS[user_function])
        assert_close(tridiax.indrnn(w, z, activation=activation, initial=h0), expected,
                     np.float64)

    @pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=dtype_id)
    @pytest.mark.parametrize("T,chunk", [(1, 0), (15, 0), (16, 0), (17, 0), (33, 0), (300, 0),
                                         (300, 37), (301, 64), (300, 300)])
    @pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
    @pytest.mark.parametrize("shifted", [False, True], ids=["plain", "shifted"])
    @pytest.mark.parametrize("gate", [None, "relu", "tanh"])
    @pytest.mark.parametrize("a_rows", ["per_step", "shared_by_lanes", "one_per_lane"])
    def test_native_scan_of_contiguous_steps(self, dtype, T, chunk, reverse, shifted, gate,
                                             a_rows):
        P = 3
        a_shape = {"per_step": (P, T, 1), "shared_by_lanes": (1, T, 1),
                   "one_per_lane": (P, 1, 1)}
        tilings = [CpuTiling("p", 32)] + ([CpuTiling("c", 32)] if chunk else [])
        check_native_scan(dtype, (P, T, 1), a_shape[a_rows], chunk, reverse, shifted, gate,
                          tilings, seed=T + chunk)

    # Rows of Q = 2, 4, 8 values along axis 0 (an (N, 4) field): the kernel scans all Q lanes
    # of a tile together, Q values a step (ScanLanes), every operand such rows, one row
    # broadcast, one value, or `a` shared by the lanes (one value a step, spread over them).
    # Lengths below, at and past one vector of steps, and chunks with a short last one.
    @pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=dtype_id)
    @pytest.mark.parametrize("Q", [2, 4, 8])
    @pytest.mark.parametrize("T,chunk", [(3, 0), (9, 0), (300, 37), (301, 64)])
    @pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
    @pytest.mark.parametrize("gate", [None, "tanh"])
    @pytest.mark.parametrize("a_rows", ["per_step", "one_row", "shared_by_q", "one_value"])
    def test_native_scan_of_rows_of_a_few_lanes(self, dtype, Q, T, chunk, reverse, gate, a_rows):
        P = 2
        a_shape = {"per_step": (P, T, Q), "one_row": (P, 1, Q), "shared_by_q": (P, T, 1),
                   "one_value": (1, 1, 1)}
        for shifted in (False, True):
            check_native_scan(dtype, (P, T, Q), a_shape[a_rows], chunk, reverse, shifted, gate,
                              [CpuTiling("q", Q)], seed=T + chunk + Q)

    # The same grouped scans with x, the gate's states and h0 broadcast rather than `a`: one
    # row along T, one value a step shared by the Q lanes, one value, and h0 shared by the P
    # rows and the Q lanes (each read through its own strides).
    @pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=dtype_id)
    @pytest.mark.parametrize("Q", [2, 4, 8])
    @pytest.mark.parametrize("T,chunk", [(9, 0), (301, 64)])
    @pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
    @pytest.mark.parametrize("layout", ["x_one_row", "x_shared_by_q", "x_one_value",
                                        "gate_shared_by_q", "gate_one_row", "h0_shared"])
    def test_native_scan_of_rows_of_a_few_lanes_broadcast(self, dtype, Q, T, chunk, reverse,
                                                          layout):
        P = 2
        C = -(-T // (chunk or T))
        x_shape = {"x_one_row": (P, 1, Q), "x_shared_by_q": (P, T, 1),
                   "x_one_value": (1, 1, 1)}.get(layout)
        gate_shape = {"gate_shared_by_q": (P, T, 1), "gate_one_row": (1, 1, Q)}.get(layout)
        h0_shape = (1, C, 1) if layout == "h0_shared" else None
        gate = "tanh" if gate_shape else None
        for shifted in (False, True):
            check_native_scan(dtype, (P, T, Q), (P, T, Q), chunk, reverse, shifted, gate,
                              [CpuTiling("q", Q)], seed=T + chunk + Q, x_shape=x_shape,
                              gate_shape=gate_shape, h0_shape=h0_shape)
