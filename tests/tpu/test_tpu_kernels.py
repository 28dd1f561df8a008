"""The Pallas TPU kernels run in TPU interpret mode (TPU semantics on CPU, VMEM starting as
NaNs), against independent references: `tridiax.verify.sequential_solve` (the sweep of every
kind in NumPy, every operation rounded in float32) for solves, NumPy loops for the factors
and recurrences.

Every case names the layout it exercises (`_pallas/tpu.py`) and checks the kernel chose it;
ragged sizes cover N = 1, 2, 3, odd N, chunks whose last one holds a single row, groups of
systems that overhang P or Q by one system, and both dtypes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tridiax import verify
from tridiax._pallas import tpu as _tpu
from tridiax._recurrence import pallas_tpu as tpu_recurrence
from tridiax._tridiagonal import pallas_tpu as tpu_thomas

pytestmark = pytest.mark.skipif(not _tpu.available(), reason="this JAX has no Pallas TPU backend")

F32, BF16 = np.dtype(np.float32), jnp.dtype(jnp.bfloat16)

# (layout, P, N, Q, dtype, transposed)
# The first case of each list (the fast tier's) is the most demanding: several chunks, the
# last one ragged, half precision, the transposed (reversed, shifted) sweep.
SOLVE_CASES = [
    ("lanes", 1, 300, 1200, BF16, True),  # two chunks, the last one ragged
    ("lanes", 2, 37, 1030, F32, False),
    ("lanes", 3, 1, 128, F32, True),  # N = 1
    ("sublanes", 13, 37, 5, F32, True),
    ("sublanes", 9, 2, 129, BF16, False),  # N = 2; a last group of one lane along Q
    ("sublanes", 9, 513, 3, F32, False),  # three chunks, the last one a single row
    ("transposed", 1, 513, 1, F32, False),  # one system: a group of 128 lanes, 127 idle
    ("transposed", 5, 3, 1, BF16, True),  # N = 3
    ("transposed", 300, 37, 1, F32, False),
    ("transposed", 129, 257, 1, BF16, True),  # two chunks (last: one row), 129 systems
    ("transposed", 1030, 5, 1, F32, True),
]


def _ids(cases):
    return [f"{c[0]}-{'x'.join(map(str, c[1:4]))}-{np.dtype(c[4]).name}-{c[5:]}" for c in cases]


def _draw(rng, shape, dtype):
    return jnp.asarray(rng.uniform(-1, 1, shape)).astype(dtype)


def _bands(rng, shapes, dtype):
    """lower, diag, upper, rhs of these shapes: diagonally dominant, with the entries outside
    the matrices (lower[0], upper[N-1]) NaN and inf, which the solve must ignore."""
    lower, upper, rhs = (_draw(rng, s, dtype) for s in (shapes[0], shapes[2], shapes[3]))
    diag = _draw(rng, shapes[1], dtype)
    diag = diag + 3 * jnp.where(diag >= 0, 1, -1).astype(dtype)
    if shapes[0][1] > 1:
        lower = lower.at[:, 0].set(jnp.nan)
    if shapes[2][1] > 1:
        upper = upper.at[:, -1].set(jnp.inf)
    return lower, diag, upper, rhs


def _transposed_bands(lower, upper):
    """The bands of A^T (along axis 1): lower'[i] = upper[i-1], upper'[i] = lower[i+1]."""
    return jnp.roll(upper, 1, axis=1), jnp.roll(lower, -1, axis=1)


def _reference_solve(lower, diag, upper, rhs, *, transposed, dtype):
    """The float32 Thomas sweep of NumPy on the operands' values, rounded to `dtype` once."""
    if transposed:
        lower, upper = _transposed_bands(lower, upper)
    ops = [np.asarray(v.astype(jnp.float32)) for v in (lower, diag, upper, rhs)]
    x = verify.sequential_solve(*ops, axis=1, dtype=np.float32)
    return np.asarray(jnp.asarray(x).astype(dtype).astype(jnp.float32))


def _close(got, want, dtype):
    """Agreement to a few roundings of the output dtype, relative to the solution's size."""
    got = np.asarray(jnp.asarray(got).astype(jnp.float32))
    assert np.all(np.isfinite(got)), "non-finite values in the kernel's result"
    scale = np.max(np.abs(want)) + 1e-30
    tolerance = 2.0 ** -7 if jnp.dtype(dtype) == BF16 else 1e-5
    error = np.max(np.abs(got - want)) / scale
    assert error <= tolerance, f"relative error {error:.3g} > {tolerance:.3g}"


@pytest.mark.parametrize("case", SOLVE_CASES, ids=_ids(SOLVE_CASES))
def test_solve_every_layout_and_ragged_size(case):
    layout, P, N, Q, dtype, transposed = case
    assert _tpu.choose_layout(P, Q) == layout
    rng = np.random.default_rng(P * 1000 + N)
    ops = _bands(rng, [(P, N, Q)] * 4, dtype)
    x = tpu_thomas.solve_pnq(*ops, transposed=transposed, out_dtype=dtype,
                             interpret=_tpu.interpret_params())
    assert x.shape == (P, N, Q) and x.dtype == dtype
    _close(x, _reference_solve(*ops, transposed=transposed, dtype=dtype), dtype)


# (operand shapes of lower, diag, upper, rhs) against a full right-hand side: one matrix for
# every system (SMEM scalars), a diagonal constant along N (a tile), bands shared along P
# (read by lanes in place, or broadcast first), bands constant along Q.
BROADCAST_CASES = [
    [(1, 37, 1), (1, 37, 1), (1, 37, 1), (2, 37, 1030)],
    [(1, 37, 1), (13, 1, 5), (1, 37, 1), (13, 37, 5)],
    [(1, 300, 1), (1, 300, 1), (300, 300, 1), (300, 300, 1)],
    [(3, 40, 256), (1, 40, 256), (3, 1, 1), (3, 40, 256)],
    [(2, 37, 1), (2, 37, 1030), (2, 37, 1), (2, 37, 1030)],
    [(1, 37, 5), (13, 37, 1), (13, 37, 5), (13, 37, 5)],
]


@pytest.mark.parametrize("shapes", BROADCAST_CASES, ids=lambda s: "-".join("x".join(map(str, t)) for t in s))
def test_solve_broadcast_operands(shapes):
    rng = np.random.default_rng(7)
    ops = _bands(rng, shapes, F32)
    full = np.broadcast_shapes(*shapes)
    x = tpu_thomas.solve_pnq(*ops, transposed=False, out_dtype=F32, interpret=_tpu.interpret_params())
    assert x.shape == full
    ops = [jnp.broadcast_to(v, full) for v in ops]
    _close(x, _reference_solve(*ops, transposed=False, dtype=F32), F32)


def test_narrow_row_tiles_and_the_fallback_for_long_systems(monkeypatch):
    """Systems whose eliminated rows fill the VMEM budget get row tiles of fewer sublanes; too
    long for any, XLA's loop solves them."""
    rng = np.random.default_rng(3)
    P, N, Q = 1, 260, 1024
    ops = _bands(rng, [(P, N, Q)] * 4, F32)
    want = _reference_solve(*ops, transposed=False, dtype=F32)
    wide = tpu_thomas._plan(P, N, Q, ops, F32)
    assert wide.s == 8 and wide.chunks == 3  # chunks of 128 rows, the last of 4
    monkeypatch.setattr(_tpu, "VMEM_BUDGET", 3 << 20)
    narrow = tpu_thomas._plan(P, N, Q, ops, F32)
    assert narrow is not None and narrow.s < 8
    x = tpu_thomas.solve_pnq(*ops, transposed=False, out_dtype=F32, interpret=_tpu.interpret_params())
    _close(x, want, F32)
    monkeypatch.setattr(_tpu, "VMEM_BUDGET", 1 << 16)
    assert not tpu_thomas.fits(P, N, Q, F32)
    x = tpu_thomas.solve_pnq(*ops, transposed=False, out_dtype=F32, interpret=_tpu.interpret_params())
    _close(x, want, F32)
    corners = [ops[0].at[:, 0].set(0.5), ops[1], ops[2].at[:, -1].set(-0.25), ops[3]]
    for kind in ("pivoted", "periodic_pivoted"):  # the pivoted kinds' fallbacks too
        assert not tpu_thomas.fits(P, N, Q, F32, kind=kind)
        x = tpu_thomas.solve_pnq(*corners, transposed=True, out_dtype=F32, kind=kind)
        _as_accurate_as_the_sweep(x, corners, kind=kind, transposed=True, dtype=F32)


# (kind, layout, P, N, Q, dtype, transposed): every kind beside "thomas" (above), each in every
# layout, with several chunks (the last one ragged, or a single row), N = 1, 2, 3, half
# precision and the transposed solve.
KIND_CASES = [
    ("pivoted", "lanes", 1, 300, 1200, BF16, True),
    ("pivoted", "sublanes", 13, 37, 5, F32, False),
    ("pivoted", "sublanes", 9, 513, 3, F32, True),
    ("pivoted", "transposed", 1, 513, 1, F32, True),
    ("pivoted", "transposed", 129, 257, 1, F32, False),
    ("pivoted", "lanes", 3, 1, 128, F32, True),
    ("pivoted", "sublanes", 9, 2, 129, F32, True),
    ("periodic", "lanes", 1, 300, 1200, F32, True),
    ("periodic", "sublanes", 13, 37, 5, BF16, False),
    ("periodic", "sublanes", 9, 300, 3, F32, True),
    ("periodic", "transposed", 1, 513, 1, F32, True),
    ("periodic", "transposed", 129, 257, 1, F32, False),
    ("periodic", "transposed", 5, 3, 1, F32, True),
    ("periodic_pivoted", "lanes", 1, 300, 1200, F32, False),
    ("periodic_pivoted", "sublanes", 13, 37, 5, F32, True),
    ("periodic_pivoted", "transposed", 129, 257, 1, BF16, True),
    ("periodic_pivoted", "sublanes", 9, 300, 3, F32, False),
    ("periodic_pivoted", "transposed", 5, 3, 1, F32, False),
]


def _sweep(bands, *, kind, transposed, dtype):
    """`verify.sequential_solve` of the operands' values, broadcast (the bands of A^T when
    `transposed`), in `dtype` (float32 or complex64: the sweep every kernel runs; float64 or
    complex128: the exact answer)."""
    shape = np.broadcast_shapes(*(v.shape for v in bands))
    lower, diag, upper, rhs = (
        np.broadcast_to(np.asarray(v if jnp.iscomplexobj(v) else v.astype(jnp.float32)), shape)
        .astype(dtype) for v in bands)
    if transposed:
        lower, upper = np.roll(upper, 1, axis=1), np.roll(lower, -1, axis=1)
    return verify.sequential_solve(lower, diag, upper, rhs, axis=1, dtype=dtype,
                                   periodic="periodic" in kind, pivoting="pivoted" in kind)


def _as_accurate_as_the_sweep(got, bands, *, kind, transposed, dtype, factor=4):
    """The kernel's error against the exact answer is within `factor` times that of the float32
    sequential sweep (rounded to `dtype`), system by system at its worst: the pivoted kinds
    run on matrices far from diagonally dominant, whose errors are set by their conditioning.
    Complex systems: the complex64 sweep, against complex128."""
    single, wide = ((np.complex64, np.complex128) if jnp.issubdtype(dtype, jnp.complexfloating)
                    else (np.float32, np.float64))
    exact = _sweep(bands, kind=kind, transposed=transposed, dtype=wide)
    sweep = np.asarray(jnp.asarray(_sweep(bands, kind=kind, transposed=transposed,
                                          dtype=single)).astype(dtype).astype(single))
    got = np.asarray(jnp.asarray(got).astype(single))
    assert np.all(np.isfinite(got)), "non-finite values in the kernel's result"
    scale = np.max(np.abs(exact), axis=1) + 1e-30
    errors = [np.max(np.max(np.abs(x - exact), axis=1) / scale) for x in (got, sweep)]
    eps = float(jnp.finfo(dtype).eps)
    assert errors[0] <= factor * errors[1] + 4 * eps, f"error {errors[0]:.3g}, the sweep's {errors[1]:.3g}"


@pytest.mark.parametrize("case", KIND_CASES, ids=[f"{c[0]}-{i}" for c, i in
                                                  zip(KIND_CASES, _ids([c[1:] for c in KIND_CASES]), strict=True)])
def test_every_kind_every_layout(case):
    kind, layout, P, N, Q, dtype, transposed = case
    assert _tpu.choose_layout(P, Q) == layout
    rng = np.random.default_rng(P * 1000 + N)
    bands = list(_bands(rng, [(P, N, Q)] * 4, dtype))
    if "periodic" in kind:  # the corners are read: draw them
        bands[0] = bands[0].at[:, 0].set(_draw(rng, (P, Q), dtype))
        bands[2] = bands[2].at[:, -1].set(_draw(rng, (P, Q), dtype))
    if "pivoted" in kind:  # far from dominant: rows are swapped
        bands[1] = _draw(rng, (P, N, Q), dtype)
    x = tpu_thomas.solve_pnq(*bands, transposed=transposed, out_dtype=dtype, kind=kind,
                             interpret=_tpu.interpret_params())
    assert x.shape == (P, N, Q) and x.dtype == dtype
    _as_accurate_as_the_sweep(x, bands, kind=kind, transposed=transposed, dtype=dtype)


# (kind, layout, P, N, Q, transposed, shapes): complex64 systems, as float32 real and imaginary
# parts, every kind in each layout, with several chunks and broadcast operands (`shapes` of
# lower, diag, upper: a matrix shared by every system in SMEM, a diagonal constant along N).
C64 = np.dtype(np.complex64)
COMPLEX_CASES = [
    ("thomas", "lanes", 1, 300, 1200, True, None),
    ("thomas", "sublanes", 13, 37, 5, False, [(1, 37, 1), (13, 1, 5), (1, 37, 1)]),
    ("pivoted", "transposed", 129, 257, 1, False, None),
    ("pivoted", "sublanes", 9, 2, 129, True, None),
    ("periodic", "lanes", 2, 37, 1030, True, [(1, 37, 1)] * 3),
    ("periodic", "transposed", 5, 3, 1, False, None),
    ("periodic_pivoted", "sublanes", 9, 300, 3, True, None),
    ("periodic_pivoted", "lanes", 3, 3, 128, False, None),
]


def _complex(rng, shape):
    return jnp.asarray(rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape), C64)


@pytest.mark.parametrize("case", COMPLEX_CASES, ids=[f"{c[0]}-{c[1]}-{'x'.join(map(str, c[2:5]))}-{c[5]}"
                                                     for c in COMPLEX_CASES])
def test_complex_every_kind(case):
    """Complex64 solves: within a few times the float32-parts sweep's error
    (`verify.sequential_solve` in complex64) of the exact answer (complex128)."""
    kind, layout, P, N, Q, transposed, shapes = case
    assert _tpu.choose_layout(P, Q) == layout
    rng = np.random.default_rng(N + Q)
    shapes = shapes or [(P, N, Q)] * 3
    lower, diag, upper = (_complex(rng, s) for s in shapes)
    if "pivoted" not in kind:
        diag = diag + 3 * jnp.where(diag.real >= 0, 1, -1)
    rhs = _complex(rng, (P, N, Q))
    x = tpu_thomas.solve_pnq(lower, diag, upper, rhs, transposed=transposed, out_dtype=C64,
                             kind=kind, interpret=_tpu.interpret_params())
    assert x.shape == (P, N, Q) and x.dtype == C64
    _as_accurate_as_the_sweep(x, (lower, diag, upper, rhs), kind=kind, transposed=transposed,
                              dtype=C64)


def _numpy_factors(lower, diag, upper):
    """(l, m, c') of A = L D V along axis 1 in float32 NumPy (`_xla.factor_sweep` states them)."""
    lower, diag, upper = (np.asarray(v.astype(jnp.float32)) for v in (lower, diag, upper))
    shape = np.broadcast_shapes(lower.shape, diag.shape, upper.shape)
    lower, diag, upper = (np.broadcast_to(v, shape) for v in (lower, diag, upper))
    factors = np.zeros((3, *shape), np.float32)
    p_prev = c_prev = None
    for i in range(shape[1]):
        p = diag[:, i] if i == 0 else diag[:, i] - lower[:, i] * c_prev
        c = upper[:, i] / p if i < shape[1] - 1 else np.zeros_like(p)
        factors[0, :, i] = 0 if i == 0 else lower[:, i] / p_prev
        factors[1, :, i], factors[2, :, i] = 1 / p, c
        p_prev, c_prev = p, c
    return factors


@pytest.mark.parametrize("case", SOLVE_CASES[:8], ids=_ids(SOLVE_CASES[:8]))
def test_factor_and_the_factored_solve_every_layout(case):
    """The factors against a NumPy loop; the factored solve (A^T's too) of float32 factors
    against the sweep of the bands they came from."""
    layout, P, N, Q, dtype, transposed = case
    rng = np.random.default_rng(P * 1000 + N + 1)
    bands = _bands(rng, [(P, N, Q)] * 4, dtype)
    factors = tpu_thomas.factor_pnq(*bands[:3], out_dtype=dtype, interpret=_tpu.interpret_params())
    for got, want in zip(factors, _numpy_factors(*bands[:3]), strict=True):
        assert got.shape == (P, N, Q) and got.dtype == dtype
        _close(got, np.asarray(jnp.asarray(want).astype(dtype).astype(jnp.float32)), dtype)
    factors = tpu_thomas.factor_pnq(*bands[:3], out_dtype=F32, interpret=_tpu.interpret_params())
    x = tpu_thomas.solve_pnq(*factors, bands[3], transposed=transposed, out_dtype=dtype,
                             kind="factored", interpret=_tpu.interpret_params())
    _close(x, _reference_solve(*bands, transposed=transposed, dtype=dtype), dtype)


# The slopes of the activations that gate, from their output (relu: 0 or 1, tanh: 1 - h^2).
SLOPES = {jax.nn.relu: lambda h: (h > 0).astype(np.float32), jnp.tanh: lambda h: 1 - h * h}


def _reference_recurrence(a, x, h0, *, reverse, shifted, activation, final_only, gate=None):
    """h[t] = act(c[t]*h[t-1] + x[t]) along axis 1 in float32 NumPy (c[t] = a[t], or a at the
    previous step's index and zero at the first step when `shifted`); with `gate` (states,
    activation), h[t] = slope(states[t]) * (c[t]*h[t-1] + x[t])."""
    a, x, h0 = (np.asarray(v.astype(jnp.float32)) for v in (a, x, h0))
    shape = np.broadcast_shapes(a.shape, x.shape, h0.shape)
    a, x = np.broadcast_to(a, shape), np.broadcast_to(x, shape)
    act = {None: lambda v: v, jax.nn.relu: lambda v: np.maximum(v, 0), jnp.tanh: np.tanh}[activation]
    if gate is not None:
        states, slope = np.broadcast_to(np.asarray(gate[0].astype(jnp.float32)), shape), SLOPES[gate[1]]
        act = None
    T = shape[1]
    steps = range(T - 1, -1, -1) if reverse else range(T)
    h = np.broadcast_to(h0[:, 0], (shape[0], shape[2])).astype(np.float32)
    out = np.zeros(shape, np.float32)
    previous = None
    for t in steps:
        c = a[:, t] if not shifted else (np.zeros_like(a[:, t]) if previous is None else a[:, previous])
        h = (act(c * h + x[:, t]) if act else slope(states[:, t]) * (c * h + x[:, t])).astype(np.float32)
        out[:, t] = h
        previous = t
    return h[:, None] if final_only else out


# (layout, P, T, Q, dtype, reverse, shifted, final_only, activation)
RECURRENCE_CASES = [
    ("lanes", 1, 300, 1200, BF16, True, True, False, None),  # two chunks, reversed
    ("lanes", 2, 37, 1030, F32, False, False, False, None),
    ("lanes", 3, 1, 128, F32, False, True, False, None),  # T = 1, shifted: h = x
    ("sublanes", 13, 37, 5, F32, True, False, True, None),  # final state only
    ("sublanes", 9, 2, 129, BF16, False, False, False, jax.nn.relu),
    ("sublanes", 9, 513, 3, F32, True, True, False, None),  # three chunks, the last one row
    ("transposed", 1, 513, 1, F32, True, True, False, None),  # one sequence
    ("transposed", 300, 37, 1, F32, False, False, False, jnp.tanh),
    ("transposed", 129, 257, 1, BF16, False, True, True, None),
    ("transposed", 1030, 3, 1, F32, True, False, False, jax.nn.relu),
]


@pytest.mark.parametrize("case", RECURRENCE_CASES,
                         ids=[f"{c[0]}-{'x'.join(map(str, c[1:4]))}-{np.dtype(c[4]).name}-{c[5:8]}"
                              f"-{getattr(c[8], '__name__', c[8])}" for c in RECURRENCE_CASES])
def test_recurrence_every_layout_and_flag(case):
    layout, P, T, Q, dtype, reverse, shifted, final_only, activation = case
    assert _tpu.choose_layout(P, Q) == layout
    rng = np.random.default_rng(P * 1000 + T)
    a, x = _draw(rng, (P, T, Q), dtype), _draw(rng, (P, T, Q), dtype)
    h0 = _draw(rng, (P, 1, Q), dtype)
    flags = dict(reverse=reverse, shifted=shifted, activation=activation, final_only=final_only)
    h = tpu_recurrence.recurrence_pnq(a, x, h0, out_dtype=dtype, interpret=_tpu.interpret_params(),
                                      **flags)
    want = _reference_recurrence(a, x, h0, **flags)
    assert h.shape == want.shape and h.dtype == dtype
    _close(h, np.asarray(jnp.asarray(want).astype(dtype).astype(jnp.float32)), dtype)


@pytest.mark.parametrize("shapes", [
    [(1, 1, 1030), (2, 37, 1030), (2, 1, 1)],  # decays per feature (a tile), h0 per system
    [(1, 37, 1), (13, 37, 5), (1, 1, 5)],  # decays per step shared by every system (SMEM)
    [(300, 1, 1), (300, 37, 1), (1, 1, 1)],
], ids=["tile-decay", "scalar-decay", "transposed-tile-decay"])
def test_recurrence_broadcast_operands(shapes):
    rng = np.random.default_rng(11)
    a, x, h0 = (_draw(rng, s, F32) for s in shapes)
    flags = dict(reverse=False, shifted=True, activation=None, final_only=False)
    h = tpu_recurrence.recurrence_pnq(a, x, h0, out_dtype=F32, interpret=_tpu.interpret_params(),
                                      **flags)
    _close(h, _reference_recurrence(a, x, h0, **flags), F32)


# (layout, P, T, Q, dtype, reverse, shifted, final_only, gate, a's shape (as SEGMENT_CASES)): the
# gated recurrences a relu or tanh recurrence's derivatives run (shifted and reversed: its
# gradient's), in every layout, over several chunks (300, 513 steps), one step, in full row tiles
# (the first) and in row tiles of one sublane (the last three, and others of fewer than 1024
# sequences: eight runs side by side, the gate in each run's steps).
GATED_CASES = [
    ("lanes", 1, 300, 1200, F32, True, True, False, jnp.tanh, "full"),
    ("lanes", 2, 37, 1030, BF16, False, False, False, jax.nn.relu, "tile"),
    ("lanes", 3, 1, 128, F32, False, True, False, jax.nn.relu, "full"),
    ("sublanes", 9, 513, 3, F32, True, True, False, jax.nn.relu, "full"),
    ("sublanes", 13, 37, 5, BF16, False, False, True, jnp.tanh, "full"),
    ("transposed", 300, 37, 1, F32, False, False, False, jnp.tanh, "tile"),
    ("transposed", 129, 257, 1, BF16, True, True, False, jnp.tanh, "full"),
    ("sublanes", 1, 700, 5, F32, True, False, False, jnp.tanh, "scalar"),  # reversed, unshifted
    ("lanes", 2, 1001, 128, F32, False, True, False, jax.nn.relu, "full"),
    ("lanes", 1, 1001, 128, F32, True, True, False, jnp.tanh, "full"),
    ("transposed", 1, 517, 1, F32, False, False, False, jax.nn.relu, "full"),
    ("sublanes", 1, 300, 3, F32, True, True, True, jnp.tanh, "full"),
]


@pytest.mark.parametrize("case", GATED_CASES,
                         ids=[f"{c[0]}-{'x'.join(map(str, c[1:4]))}-{np.dtype(c[4]).name}-{c[5:8]}"
                              f"-{c[8].__name__}-{c[9]}" for c in GATED_CASES])
def test_gated_recurrence_every_layout(case):
    """The slope computed from the states in the sweep multiplies each step (`gate`): against
    NumPy's loop of h = slope(states) * (c h + x)."""
    layout, P, T, Q, dtype, reverse, shifted, final_only, activation, decay = case
    assert _tpu.choose_layout(P, Q) == layout
    g = tpu_recurrence._plan(P, T, Q, [jax.ShapeDtypeStruct((P, T, Q), jnp.float32)] * 3, dtype, final_only,
                             linear=True)
    if case in GATED_CASES[-3:]:
        assert tpu_recurrence.segmented(g, None)
    if case == GATED_CASES[0]:  # full row tiles: one run
        assert not tpu_recurrence.segmented(g, None)
    rng = np.random.default_rng(P * 1000 + T + 7)
    a = _draw(rng, {"full": (P, T, Q), "tile": (P, 1, Q), "scalar": (1, T, 1)}[decay], dtype)
    x, h0, states = _draw(rng, (P, T, Q), dtype), _draw(rng, (P, 1, Q), dtype), _draw(rng, (P, T, Q), dtype)
    flags = dict(reverse=reverse, shifted=shifted, activation=None, final_only=final_only)
    h = tpu_recurrence.recurrence_pnq(a, x, h0, out_dtype=dtype, interpret=_tpu.interpret_params(),
                                      gate=(states, activation), **flags)
    want = _reference_recurrence(a, x, h0, gate=(states, activation), **flags)
    assert h.shape == want.shape and h.dtype == dtype
    _close(h, np.asarray(jnp.asarray(want).astype(dtype).astype(jnp.float32)), dtype)


def _entering_states(h, h0, reverse):
    """The state entering each step of a (P, T, Q) run: h[t-1] (h[t+1] when `reverse`), h0
    at the first step."""
    h0 = np.broadcast_to(np.asarray(h0, np.float32), (h.shape[0], 1, h.shape[2]))
    if reverse:
        return np.concatenate([h[:, 1:], h0], axis=1)
    return np.concatenate([h0, h[:, :-1]], axis=1)


@pytest.mark.parametrize("gated", [True, False], ids=["gated", "linear"])
@pytest.mark.parametrize("case", GATED_CASES,
                         ids=[f"{c[0]}-{'x'.join(map(str, c[1:4]))}-{np.dtype(c[4]).name}-{c[5:8]}"
                              f"-{c[8].__name__}-{c[9]}" for c in GATED_CASES])
def test_sums_of_entering_states_times_the_states(case, gated):
    """`sums`: the sum over the steps of the state entering each step times that step's
    states, formed in the sweep (with a gate, from the rows it reads for the slope), against
    NumPy's loop; h is unchanged."""
    layout, P, T, Q, dtype, reverse, shifted, final_only, activation, decay = case
    rng = np.random.default_rng(P * 1000 + T + 11)
    a = _draw(rng, {"full": (P, T, Q), "tile": (P, 1, Q), "scalar": (1, T, 1)}[decay], dtype)
    x, h0, states = _draw(rng, (P, T, Q), dtype), _draw(rng, (P, 1, Q), dtype), _draw(rng, (P, T, Q), dtype)
    flags = dict(reverse=reverse, shifted=shifted, activation=None)
    gate = (states, activation) if gated else None
    h, total = tpu_recurrence.recurrence_pnq(a, x, h0, out_dtype=dtype, interpret=_tpu.interpret_params(),
                                             gate=gate, sums=states, final_only=final_only, **flags)
    sequence = _reference_recurrence(a, x, h0, gate=gate, final_only=False, **flags)
    products = _entering_states(sequence, h0.astype(jnp.float32), reverse) * np.asarray(
        states.astype(jnp.float32))
    assert total.shape == (P, 1, Q) and total.dtype == jnp.float32
    _close(total, products.sum(axis=1, keepdims=True), dtype)
    want = sequence[:, -1:] if final_only and not reverse else sequence[:, :1] if final_only else sequence
    _close(h, np.asarray(jnp.asarray(want).astype(dtype).astype(jnp.float32)), dtype)


def test_sums_take_real_linear_recurrences_and_a_gates_own_states():
    a = x = states = jnp.ones((1, 8, 128), jnp.float32)
    h0 = jnp.zeros((1, 1, 128), jnp.float32)
    flags = dict(reverse=False, shifted=False, final_only=False, interpret=_tpu.interpret_params())
    for activation, dtype in [(jnp.tanh, F32), (None, jnp.complex64)]:
        with pytest.raises(ValueError, match="sums products with the states of real linear"):
            tpu_recurrence.recurrence_pnq(a, x, h0, activation=activation, out_dtype=dtype, sums=states,
                                          **flags)
    with pytest.raises(ValueError, match="with the gate's states only"):
        tpu_recurrence.recurrence_pnq(a, x, h0, activation=None, out_dtype=F32, gate=(states, jnp.tanh),
                                      sums=states + 1, **flags)


def test_a_gate_takes_real_linear_recurrences_of_relu_or_tanh_only():
    a = x = states = jnp.ones((1, 8, 128), jnp.float32)
    h0 = jnp.zeros((1, 1, 128), jnp.float32)
    flags = dict(reverse=False, shifted=False, final_only=False, interpret=_tpu.interpret_params())
    for activation, gate, dtype in [(None, jax.nn.sigmoid, F32), (jnp.tanh, jnp.tanh, F32),
                                    (None, jnp.tanh, jnp.complex64)]:
        with pytest.raises(ValueError, match="gates real linear recurrences"):
            tpu_recurrence.recurrence_pnq(a, x, h0, activation=activation, out_dtype=dtype,
                                          gate=(states, gate), **flags)


# (layout, P, T, Q, reverse, shifted, final_only, a complex): complex64 recurrences (an LRU's
# diagonal state), as float32 parts; a real decay against complex inputs keeps one part.
COMPLEX_RECURRENCE_CASES = [
    ("lanes", 1, 300, 1200, True, True, False, True),  # two chunks, reversed
    ("sublanes", 13, 37, 5, False, False, True, True),  # final state only
    ("sublanes", 9, 513, 3, False, True, False, False),  # three chunks, a real decay
    ("transposed", 129, 257, 1, True, False, False, True),
]


@pytest.mark.parametrize("case", COMPLEX_RECURRENCE_CASES,
                         ids=[f"{c[0]}-{'x'.join(map(str, c[1:4]))}-{c[4:]}" for c in COMPLEX_RECURRENCE_CASES])
def test_complex_recurrence(case):
    layout, P, T, Q, reverse, shifted, final_only, a_complex = case
    assert _tpu.choose_layout(P, Q) == layout
    rng = np.random.default_rng(T)
    radius = jnp.asarray(rng.uniform(0.5, 0.999, (P, T, Q)), jnp.float32)
    a = radius * jnp.exp(1j * jnp.asarray(rng.uniform(-np.pi, np.pi, (P, T, Q)), jnp.float32)) \
        if a_complex else radius
    x, h0 = _complex(rng, (P, T, Q)), _complex(rng, (P, 1, Q))
    flags = dict(reverse=reverse, shifted=shifted, final_only=final_only)
    h = tpu_recurrence.recurrence_pnq(a, x, h0, activation=None, out_dtype=C64,
                                      interpret=_tpu.interpret_params(), **flags)
    assert h.dtype == C64 and h.shape == ((P, 1, Q) if final_only else (P, T, Q))
    a, x, h0 = (np.asarray(v).astype(np.complex128) for v in (a, x, h0))
    want = np.zeros((P, T, Q), np.complex128)  # NumPy's loop, in complex128
    state, previous = h0[:, 0], None
    for t in (range(T - 1, -1, -1) if reverse else range(T)):
        c = a[:, t] if not shifted else (0 if previous is None else a[:, previous])
        state = c * state + x[:, t]
        want[:, t], previous = state, t
    want = state[:, None] if final_only else want
    error = np.max(np.abs(np.asarray(h) - want)) / np.max(np.abs(want))
    assert error < 1e-5, error


def _loop_recurrence(a, x, h0, *, dtype, reverse, shifted, final_only):
    """The linear recurrence of `_reference_recurrence`, NumPy's loop in `dtype` (float32 or
    complex64: the sequential loop; float64 or complex128: the exact answer)."""
    a, x, h0 = (np.asarray(jnp.asarray(v).astype(jnp.complex64 if jnp.iscomplexobj(v) else jnp.float32))
                .astype(dtype) for v in (a, x, h0))
    shape = np.broadcast_shapes(a.shape, x.shape, h0.shape)
    a, x = np.broadcast_to(a, shape), np.broadcast_to(x, shape)
    state, previous, out = np.broadcast_to(h0[:, 0], (shape[0], shape[2])), None, np.zeros(shape, dtype)
    for t in (range(shape[1] - 1, -1, -1) if reverse else range(shape[1])):
        c = a[:, t] if not shifted else (np.zeros((), dtype) if previous is None else a[:, previous])
        state = (c * state + x[:, t]).astype(dtype)
        out[:, t], previous = state, t
    return state[:, None] if final_only else out


# (layout, P, T, Q, dtype, reverse, shifted, final_only, a's shape ("full", "tile": one decay a
# system, "scalar": one a step for every system)): linear recurrences of fewer sequences than
# a vector register holds, in row tiles of one sublane, run as eight runs of steps side by
# side: several chunks of 256 steps, the last ragged (1001: 233 steps, not a multiple of
# eight; 517: five, fewer than the runs; 3 steps in all), every layout that has such tiles,
# both directions, shifted, final states only.
SEGMENT_CASES = [
    ("lanes", 1, 1001, 128, F32, False, False, False, "full"),
    ("lanes", 2, 1001, 128, F32, True, True, False, "full"),
    ("transposed", 1, 517, 1, F32, False, True, False, "full"),
    ("transposed", 100, 517, 1, BF16, True, False, False, "full"),
    ("transposed", 3, 3, 1, F32, True, True, False, "full"),
    ("sublanes", 1, 1003, 4, F32, True, True, True, "full"),
    ("sublanes", 1, 300, 3, C64, False, True, False, "full"),
    ("transposed", 1, 517, 1, C64, True, False, False, "full"),
    ("lanes", 1, 700, 128, F32, False, True, False, "tile"),
    ("sublanes", 1, 700, 5, F32, True, True, False, "scalar"),
    # fewer sequences than a register holds, more than 128: groups of 128 (one sublane each)
    ("lanes", 2, 600, 300, F32, True, True, False, "full"),
    ("transposed", 300, 517, 1, C64, False, False, False, "full"),
]


@pytest.mark.parametrize("case", SEGMENT_CASES, ids=[f"{c[0]}-{'x'.join(map(str, c[1:4]))}-{np.dtype(c[4]).name}"
                                                     f"-{c[5:9]}" for c in SEGMENT_CASES])
def test_recurrences_of_one_sublane_run_as_eight_runs_side_by_side(case):
    """Against the exact (float64) recurrence, as accurate as NumPy's float32 sequential loop
    (within a few times its error): coefficients near one in size, so that errors carry far.
    Breaking the runs' entering states (the combination of the runs' ends) or a shifted
    run's first coefficient fails this."""
    layout, P, T, Q, dtype, reverse, shifted, final_only, decay = case
    assert _tpu.choose_layout(P, Q) == layout
    g = tpu_recurrence._plan(P, T, Q, [jax.ShapeDtypeStruct((P, T, Q), jnp.float32)] * 2, F32, final_only,
                             linear=True)
    assert tpu_recurrence.segmented(g, None)
    rng = np.random.default_rng(T + P)
    a_shape = {"full": (P, T, Q), "tile": (P, 1, Q), "scalar": (1, T, 1)}[decay]
    size = rng.uniform(0.95, 1.0, a_shape) * rng.choice([-1, 1], a_shape)
    if dtype == C64:
        a = jnp.asarray(size * np.exp(1j * rng.uniform(-np.pi, np.pi, a_shape)), C64)
        x, h0 = _complex(rng, (P, T, Q)), _complex(rng, (P, 1, Q))
    else:
        a = jnp.asarray(size).astype(dtype)
        x, h0 = _draw(rng, (P, T, Q), dtype), _draw(rng, (P, 1, Q), dtype)
    flags = dict(reverse=reverse, shifted=shifted, final_only=final_only)
    h = tpu_recurrence.recurrence_pnq(a, x, h0, activation=None, out_dtype=dtype,
                                      interpret=_tpu.interpret_params(), **flags)
    assert h.shape == ((P, 1, Q) if final_only else (P, T, Q)) and h.dtype == dtype
    single, wide = (np.complex64, np.complex128) if dtype == C64 else (np.float32, np.float64)
    exact = _loop_recurrence(a, x, h0, dtype=wide, **flags)
    sweep = np.asarray(jnp.asarray(_loop_recurrence(a, x, h0, dtype=single, **flags)).astype(dtype)).astype(wide)
    got = np.asarray(h).astype(wide)
    errors = [np.max(np.abs(v - exact)) / np.max(np.abs(exact)) for v in (got, sweep)]
    eps = float(jnp.finfo(dtype).eps)
    assert errors[0] <= 4 * errors[1] + 4 * eps, f"error {errors[0]:.3g}, the sequential loop's {errors[1]:.3g}"


# (kind, layout, P, N, Q, dtype, transposed, VMEM budget): systems too long for VMEM whose work
# rows stream through HBM: two launches, several chunks (the last one ragged).
STREAMED_CASES = [
    ("thomas", "lanes", 1, 900, 130, BF16, True, 3 << 19),
    ("thomas", "transposed", 3, 900, 1, F32, False, 3 << 19),
    ("thomas", "sublanes", 9, 300, 3, C64, True, 2 << 20),
    ("factored", "lanes", 2, 900, 129, F32, False, 3 << 19),
    ("factored", "transposed", 5, 900, 1, BF16, True, 3 << 19),
    ("periodic", "lanes", 1, 900, 130, F32, True, 3 << 19),
    ("periodic", "transposed", 3, 901, 1, BF16, False, 3 << 19),
    ("periodic", "sublanes", 9, 300, 3, C64, False, 2 << 20),
    ("periodic", "transposed", 2, 700, 1, C64, True, 4 << 20),
    # pivoted: U's rows written two rows down, the last two in a tail; last chunks of one
    # row (1025 = 8 * 128 + 1) and two rows
    ("pivoted", "lanes", 1, 1025, 130, F32, False, 3 << 19),
    ("pivoted", "lanes", 1, 1026, 130, BF16, True, 3 << 19),
    ("pivoted", "transposed", 3, 901, 1, F32, True, 2 << 20),
    ("pivoted", "sublanes", 9, 300, 3, C64, False, 11 << 18),
    ("periodic_pivoted", "lanes", 1, 1025, 130, F32, True, 3 << 19),
    ("periodic_pivoted", "transposed", 3, 1026, 1, BF16, False, 2 << 20),
    ("periodic_pivoted", "sublanes", 9, 300, 3, C64, True, 3 << 20),
]


def _streamed_only(monkeypatch, case):
    """The VMEM budget of a streamed `case` (kind, layout, P, N, Q, dtype, transposed, budget),
    too small for the one-launch kernel, and XLA's loop refused."""
    kind, layout, P, N, Q, dtype, _, budget = case
    assert _tpu.choose_layout(P, Q) == layout
    monkeypatch.setattr(_tpu, "VMEM_BUDGET", budget)
    assert not tpu_thomas.fits(P, N, Q, dtype, kind=kind)

    def refuse(*args, **kwargs):
        raise AssertionError("XLA's loop ran")

    monkeypatch.setattr(tpu_thomas, "_xla_loop", refuse)


# Implicit periodic diffusion with large steps (l = u = -r, d = 1 + 2r): weakly dominant
# systems, on which row 0 of y and z summed plainly during the forward sweep lost digits (4-6
# times the sweep's error) that the back substitution keeps.
DIFFUSION_CASES = [
    ("periodic", "lanes", 1, 300, 130, F32, False, 1 << 20),
    ("periodic_pivoted", "lanes", 1, 300, 130, F32, True, 3 << 19),
    ("periodic", "transposed", 2, 700, 1, C64, False, 4 << 20),
]


@pytest.mark.parametrize("r", [1e2, 1e4])
@pytest.mark.parametrize("case", DIFFUSION_CASES, ids=[f"{c[0]}-{c[1]}-{np.dtype(c[5]).name}-{c[6]}"
                                                       for c in DIFFUSION_CASES])
def test_streamed_periodic_solves_keep_the_sweeps_accuracy_on_implicit_diffusion(case, r, monkeypatch):
    """A streamed periodic solve forms f from row 0 of y and z summed during the forward sweep;
    on implicit diffusion its error stays within 1.5 times the sequential sweep's."""
    kind, layout, P, N, Q, dtype, transposed, budget = case
    _streamed_only(monkeypatch, case)
    rng = np.random.default_rng(N)
    step = r * (1 + 0.1j) if dtype == C64 else r
    off = jnp.full((P, N, Q), -step, dtype)
    diag = jnp.asarray(1 + 2 * step + 0.01 * rng.random((P, N, Q)), dtype)
    rhs = jnp.asarray(rng.standard_normal((P, N, Q)), dtype)
    bands = [off, diag, off, rhs]
    x = tpu_thomas.solve_pnq(*bands, transposed=transposed, out_dtype=dtype, kind=kind,
                             interpret=_tpu.interpret_params())
    _as_accurate_as_the_sweep(x, bands, kind=kind, transposed=transposed, dtype=dtype, factor=1.5)


@pytest.mark.parametrize("case", STREAMED_CASES, ids=[f"{c[0]}-{c[1]}-{'x'.join(map(str, c[2:5]))}"
                                                      f"-{np.dtype(c[5]).name}-{c[6]}" for c in STREAMED_CASES])
def test_systems_too_long_for_vmem_stream_their_work_rows(case, monkeypatch):
    """Solves too long for VMEM run two kernels (the forward sweep writing c' and y', or U's
    rows, to HBM, the back substitution reading them), not XLA's loop: against the NumPy
    sweep (the complex case against complex128), factored solves with the kernel's factors,
    periodic and pivoted ones (z' streamed too, x = y - f z written by the back substitution)
    as accurate as the sequential sweep of their kind."""
    kind, layout, P, N, Q, dtype, transposed, budget = case
    _streamed_only(monkeypatch, case)
    rng = np.random.default_rng(N + P)
    params = _tpu.interpret_params()
    if kind in ("periodic", "pivoted", "periodic_pivoted"):
        if dtype == C64:
            bands = [_complex(rng, (P, N, Q)) for _ in range(4)]
            bands[1] = bands[1] + (0 if "pivoted" in kind else 3)
        else:
            bands = list(_bands(rng, [(P, N, Q)] * 4, dtype))
            bands[0] = bands[0].at[:, 0].set(_draw(rng, (P, Q), dtype))  # the corners are read
            bands[2] = bands[2].at[:, -1].set(_draw(rng, (P, Q), dtype))
            if "pivoted" in kind:  # far from dominant: rows are swapped
                bands[1] = _draw(rng, (P, N, Q), dtype)
        x = tpu_thomas.solve_pnq(*bands, transposed=transposed, out_dtype=dtype, kind=kind,
                                 interpret=params)
        assert x.shape == (P, N, Q) and x.dtype == dtype
        _as_accurate_as_the_sweep(x, bands, kind=kind, transposed=transposed, dtype=dtype)
        return
    if dtype == C64:
        lower, diag, upper, rhs = (_complex(rng, (P, N, Q)) for _ in range(4))
        diag = diag + 3
        x = tpu_thomas.solve_pnq(lower, diag, upper, rhs, transposed=transposed, out_dtype=C64,
                                 interpret=params)
        exact = _sweep((lower, diag, upper, rhs), kind=kind, transposed=transposed,
                       dtype=np.complex128)
        assert np.max(np.abs(np.asarray(x) - exact)) <= 1e-5 * np.max(np.abs(exact))
        return
    bands = _bands(rng, [(P, N, Q)] * 4, dtype)
    operands = bands
    if kind == "factored":
        operands = (*tpu_thomas.factor_pnq(*bands[:3], out_dtype=F32, interpret=params), bands[3])
    x = tpu_thomas.solve_pnq(*operands, transposed=transposed, out_dtype=dtype, kind=kind,
                             interpret=params)
    assert x.shape == (P, N, Q) and x.dtype == dtype
    _close(x, _reference_solve(*bands, transposed=transposed, dtype=dtype), dtype)
