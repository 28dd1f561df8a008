"""linear_recurrence and indrnn against a NumPy loop and lax.associative_scan, every backend."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, backends, equations, numpy_loop
from jax.test_util import check_grads

import tridiax
from tridiax._recurrence.api import recurrence

RECURRENCE_BACKENDS = backends()


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
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.3, 1.0, a_shape or shape)
    x = rng.standard_normal(shape)
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        a = a * np.exp(0.3j * rng.standard_normal(a.shape))
        x = x + 1j * rng.standard_normal(shape)
    return a.astype(dtype), x.astype(dtype)


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
@pytest.mark.parametrize("T", [1, 15, 63, 300])
@pytest.mark.parametrize("F", [1, 7, 129])
@pytest.mark.parametrize("reverse", [False, True])
def test_matches_numpy_loop(backend, T, F, reverse):
    a, x = problem((T, F), seed=T * F)
    h0 = np.random.default_rng(1).standard_normal(F)
    h = recurrence(a, x, reverse=reverse, initial=h0, backend=backend)
    assert h.shape == (T, F)
    assert_close(h, numpy_loop(a, x, reverse=reverse, initial=h0), np.float64)
    last = recurrence(a, x, reverse=reverse, initial=h0, final_only=True, backend=backend)
    assert last.shape == (F,)
    assert_close(last, numpy_loop(a, x, reverse=reverse, initial=h0)[0 if reverse else -1],
                 np.float64)


def test_matches_associative_scan():
    a, x = problem((300, 50), np.float32, seed=2)

    def combine(left, right):
        return left[0] * right[0], right[0] * left[1] + right[1]

    expected = jax.lax.associative_scan(combine, (jnp.asarray(a), jnp.asarray(x)))[1]
    assert_close(tridiax.linear_recurrence(a, x), expected, np.float32, factor=5)


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
@pytest.mark.parametrize("shape,axis", [((4, 9, 3), 0), ((4, 9, 3), 1), ((4, 9, 3), -1),
                                        ((2, 3, 17, 5), 2)])
def test_every_axis_final_only_and_initial(backend, shape, axis):
    a, x = problem(shape, seed=3)
    state = shape[:axis % len(shape)] + shape[axis % len(shape) + 1:]
    h0 = np.random.default_rng(4).standard_normal(state)
    h = recurrence(a, x, axis=axis, initial=h0, backend=backend)
    expected = numpy_loop(a, x, axis=axis, initial=h0)
    assert_close(h, expected, np.float64)
    last = tridiax.linear_recurrence(a, x, axis=axis, initial=h0, final_only=True)
    assert last.shape == state
    assert_close(last, np.take(expected, -1, axis=axis), np.float64)


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128,
                                   jnp.float16, jnp.bfloat16])
def test_dtypes(backend, dtype):
    if backend.startswith("pallas") and np.issubdtype(np.dtype(dtype), np.complexfloating):
        # Split into real and imaginary parts in the kernel: no user activation on them.
        with pytest.raises(ValueError, match="without an activation"):
            recurrence(*problem((5, 3), dtype), backend=backend, activation=jnp.tanh)
    a, x = problem((40, 33), np.complex128 if np.issubdtype(np.dtype(dtype), np.complexfloating)
                   else np.float64, seed=5)
    a, x = jnp.asarray(a, dtype), jnp.asarray(x, dtype)
    h = recurrence(a, x, backend=backend)
    assert h.dtype == dtype
    exact = numpy_loop(np.asarray(a, np.complex128 if np.iscomplexobj(a) else np.float64),
                       np.asarray(x, np.complex128 if np.iscomplexobj(x) else np.float64))
    assert_close(h, exact, dtype, factor=5)


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
@pytest.mark.parametrize("a_shape", [(7,), (1, 7), (30, 1), (1, 1)])
def test_decay_broadcasts(backend, a_shape):
    a, x = problem((30, 7), seed=6, a_shape=a_shape)
    h = recurrence(a, x, backend=backend)
    assert h.shape == (30, 7)
    assert_close(h, numpy_loop(a, x), np.float64)


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


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
@pytest.mark.parametrize("name", list(ACTIVATIONS))
@pytest.mark.parametrize("T,F", [(1, 1), (15, 7), (63, 129)])
def test_indrnn_matches_numpy_loop(backend, name, T, F):
    rng = np.random.default_rng(T + F)
    w = rng.uniform(-1, 1, F)
    z = rng.standard_normal((T, F))
    h0 = rng.standard_normal(F)
    if backend == "native" and name in ("custom", "identity"):  # not built-in functions
        with pytest.raises(ValueError, match="native recurrence runs identity, relu and tanh"):
            recurrence(w, z, initial=h0, activation=ACTIVATIONS[name], backend=backend)
        backend = "xla"  # what the default picks for a user's function on CPU
    h = recurrence(w, z, initial=h0, activation=ACTIVATIONS[name], backend=backend)
    assert_close(h, numpy_loop(w, z, initial=h0, activation=NUMPY_ACTIVATIONS[name]), np.float64)
    h_public = tridiax.indrnn(w, z, activation=ACTIVATIONS[name], initial=h0)
    assert_close(h_public, h, np.float64)


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


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
@pytest.mark.parametrize("activation", [None, "tanh", "relu"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("final_only", [False, True])
def test_gradients_match_loop(backend, activation, reverse, final_only):
    if activation is not None and reverse:
        return  # indrnn runs forward only
    act = ACTIVATIONS[activation] if activation else None
    a, x = (jnp.asarray(v) for v in problem((9, 4), seed=7))
    h0 = jnp.asarray(np.random.default_rng(8).standard_normal(4))

    def ours(a, x, h0):
        return recurrence(a, x, reverse=reverse, initial=h0, final_only=final_only,
                          activation=act, backend=backend)

    def loop(a, x, h0):
        h = jax_loop(a, x, h0, reverse=reverse, activation=act or (lambda v: v))
        return h[0 if reverse else -1][None] if final_only else h

    def loss(f):
        return lambda *args: jnp.sum(jnp.sin(f(*args)) * jnp.arange(1, f(*args).size + 1).reshape(
            f(*args).shape))

    grads = jax.grad(loss(ours), argnums=(0, 1, 2))(a, x, h0)
    expected = jax.grad(loss(loop), argnums=(0, 1, 2))(a, x, h0)
    for g, e in zip(grads, expected, strict=True):
        assert_close(g, e, np.float64, factor=10)
    if activation != "relu":  # relu has a kink: finite differences are unreliable there
        check_grads(ours, (a, x, h0), order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_gradient_of_shared_decay_and_jvp(backend):
    a = jnp.asarray(np.random.default_rng(9).uniform(0.3, 0.9, 5))  # (F,) shared over time
    x = jnp.asarray(np.random.default_rng(10).standard_normal((12, 5)))
    f = lambda a, x: recurrence(a, x, backend=backend)  # noqa: E731
    g = lambda a, x: jax_loop(a, x, jnp.zeros(5))  # noqa: E731
    ga = jax.grad(lambda a: jnp.sum(f(a, x) ** 2))(a)
    assert ga.shape == (5,)
    assert_close(ga, jax.grad(lambda a: jnp.sum(g(a, x) ** 2))(a), np.float64, factor=10)
    tangents = (jnp.ones(5), jnp.ones((12, 5)))
    assert_close(jax.jvp(f, (a, x), tangents)[1], jax.jvp(g, (a, x), tangents)[1], np.float64)


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


# ---------------------------------------------------------------------------------------------
# The native kernel's scan of contiguous steps (Q == 1: batch-first sequences and the chunks of
# one long sequence), called directly, against a NumPy loop of its exact semantics: shifted
# coefficients, gate slopes, chunks entered from given states, chunk ends from a zero state.


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
    from tridiax._core import planner as _planner
    from tridiax._native import ffi as _native

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


@pytest.mark.skipif("native" not in backends(), reason="the native kernel is not built here")
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("T,chunk", [(1, 0), (15, 0), (16, 0), (17, 0), (33, 0), (300, 0),
                                     (300, 37), (301, 64), (300, 300)])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("shifted", [False, True], ids=["plain", "shifted"])
@pytest.mark.parametrize("gate", [None, "relu", "tanh"])
@pytest.mark.parametrize("a_rows", ["per_step", "shared_by_lanes", "one_per_lane"])
def test_native_scan_of_contiguous_steps(dtype, T, chunk, reverse, shifted, gate, a_rows):
    from tridiax._core.planner import CpuTiling

    P = 3
    a_shape = {"per_step": (P, T, 1), "shared_by_lanes": (1, T, 1), "one_per_lane": (P, 1, 1)}
    tilings = [CpuTiling("p", 32)] + ([CpuTiling("c", 32)] if chunk else [])
    check_native_scan(dtype, (P, T, 1), a_shape[a_rows], chunk, reverse, shifted, gate, tilings,
                      seed=T + chunk)


# Rows of Q = 2, 4, 8 values along axis 0 (an (N, 4) field): the kernel scans all Q lanes of a
# tile together, Q values a step (ScanLanes), every operand such rows, one row broadcast, one
# value, or `a` shared by the lanes (one value a step, spread over them). Lengths below, at and
# past one vector of steps, and chunks with a short last one.
@pytest.mark.skipif("native" not in backends(), reason="the native kernel is not built here")
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("Q", [2, 4, 8])
@pytest.mark.parametrize("T,chunk", [(3, 0), (9, 0), (300, 37), (301, 64)])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("gate", [None, "tanh"])
@pytest.mark.parametrize("a_rows", ["per_step", "one_row", "shared_by_q", "one_value"])
def test_native_scan_of_rows_of_a_few_lanes(dtype, Q, T, chunk, reverse, gate, a_rows):
    from tridiax._core.planner import CpuTiling

    P = 2
    a_shape = {"per_step": (P, T, Q), "one_row": (P, 1, Q), "shared_by_q": (P, T, 1),
               "one_value": (1, 1, 1)}
    for shifted in (False, True):
        check_native_scan(dtype, (P, T, Q), a_shape[a_rows], chunk, reverse, shifted, gate,
                          [CpuTiling("q", Q)], seed=T + chunk + Q)


# The same grouped scans with x, the gate's states and h0 broadcast rather than `a`: one row
# along T, one value a step shared by the Q lanes, one value, and h0 shared by the P rows and
# the Q lanes (each read through its own strides).
@pytest.mark.skipif("native" not in backends(), reason="the native kernel is not built here")
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("Q", [2, 4, 8])
@pytest.mark.parametrize("T,chunk", [(9, 0), (301, 64)])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("layout", ["x_one_row", "x_shared_by_q", "x_one_value",
                                    "gate_shared_by_q", "gate_one_row", "h0_shared"])
def test_native_scan_of_rows_of_a_few_lanes_broadcast(dtype, Q, T, chunk, reverse, layout):
    from tridiax._core.planner import CpuTiling

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
