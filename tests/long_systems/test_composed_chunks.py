"""The chunk sweeps composed from plain kernels (`tridiax/_long_systems/composed_chunks.py`) against
the native C++ chunk kernels they stand in for, and end to end through `_long_systems/chunked.py` against
SciPy, a dense solve and a NumPy loop, on the "xla" and "pallas_interpret" backends."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from tridiax._core import backend as _backend
from tridiax._core import planner as _planner
from tridiax._long_systems import chunked as _chunked
from tridiax._long_systems import composed_chunks as _composed_chunks
from tridiax._native import build as _native_build
from tridiax._native import ffi as _native

pytestmark = [
    pytest.mark.cpu_device,
    pytest.mark.skipif(not _native_build.available(), reason="needs the native kernels"),
]

BACKENDS = ("xla", "pallas_interpret")
DTYPES = (np.float32, np.float64)
RTOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}
SHAPES = [(1, 40, 1), (2, 37, 3), (3, 50, 1), (1, 33, 5)]
CHUNKS = (2, 3, 7, 16)
# (transposed, periodic) pairs; every (shape, chunk) runs two of them, all four appear.
FLAGS = [((False, False), (True, True)), ((True, False), (False, True))]
ENDS = ("lower", "diag1", "sum1", "rhs1", "score1", "diag2", "sum2", "upper", "rhs2", "score2")


def dtype_id(dtype):
    return np.dtype(dtype).name


def assert_matches(got, want, dtype, what):
    """Elementwise to rtol, with a floor of rtol times the array's largest value."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    rtol = RTOL[np.dtype(dtype)]
    scale = max(float(np.max(np.abs(want))), 1e-30)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=what)


def dominant(shapes, dtype, seed):
    """lower, diag, upper, rhs of the given (broadcast) shapes: |d| >= 3 > |l| + |u|."""
    rng = np.random.default_rng(seed)
    l, u, b = (rng.uniform(-1, 1, s) for s in (shapes[0], shapes[2], shapes[3]))
    d = (3 + rng.uniform(0, 1, shapes[1])) * rng.choice([-1, 1], shapes[1])
    return [jnp.asarray(v, dtype) for v in (l, d, u, b)]


def solve_cases():
    """(shape, chunk, transposed, periodic) over the valid chunk lengths of every shape."""
    out = []
    for shape in SHAPES:
        for m in CHUNKS:
            if _planner.valid_chunk(shape[1], m) != m:
                continue
            for transposed, periodic in FLAGS[len(out) // 2 % 2]:
                if periodic and _planner.valid_chunk(shape[1], m, periodic=True) != m:
                    periodic = False  # fewer than 3 chunks
                out.append((shape, m, transposed, periodic))
    return out


def native_tiling(P, N, Q, m, dtype, columns=3, linear=True):
    """The planner's tiles for the native chunk sweeps (columns=3, unpivoted) or a chunked
    recurrence (columns=0; `linear`: without an activation), with its choice of the tiles whose
    rows are held in vector registers."""
    tiling = _planner.cpu_tiling(P, -(-N // m), Q, m, dtype, columns=columns)
    if columns:
        scan = _planner.chunk_runs(P, N, Q, dtype, chunk=m, tiling=tiling, pivoted=False)
    else:
        scan = _planner.recurrence_scans(P, N, Q, dtype, chunk=m, tiling=tiling, linear=linear)
    return dataclasses.replace(tiling, scan=scan)


def compare_solve_sweeps(backend, shapes, m, transposed, periodic, dtype, seed):
    """chunk_ends and chunk_solve of `backend` against the native ones on one problem."""
    kernels = _backend.kernels(backend)
    l, d, u, b = dominant(shapes, dtype, seed)
    P, N, Q = np.broadcast_shapes(*shapes)
    C = -(-N // m)
    separators = jnp.asarray(np.random.default_rng(seed + 1).uniform(-1, 1, (P, C, Q)), dtype)
    flags = dict(transposed=transposed, periodic=periodic, chunk=m)

    @jax.jit
    def composed(l, d, u, b, separators):
        return (kernels.chunk_ends(l, d, u, b, **flags, tiling=None),
                kernels.chunk_solve(l, d, u, b, separators, **flags, tiling=None))

    tiling = native_tiling(P, N, Q, m, dtype)

    @jax.jit
    def native(l, d, u, b, separators):
        return (_native.chunk_ends_pnq(l, d, u, b, **flags, tiling=tiling),
                _native.chunk_solve_pnq(l, d, u, b, separators, **flags, tiling=tiling))

    (ends, x), (ends_ref, x_ref) = composed(l, d, u, b, separators), native(l, d, u, b, separators)
    case = f"{backend} {shapes} chunk={m} transposed={transposed} periodic={periodic}"
    for name, got, want in zip(ENDS, ends, ends_ref, strict=True):
        assert_matches(got, want, dtype, f"chunk_ends {name}: {case}")
    assert_matches(x, x_ref, dtype, f"chunk_solve: {case}")


# ---------------------------------------------------------------------------------------------
# Solve sweeps against the native kernels.


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", solve_cases(), ids=lambda c: f"{c[0]}-m{c[1]}-t{c[2]:d}p{c[3]:d}")
def test_solve_sweeps_match_native(case, backend, dtype):
    shape, m, transposed, periodic = case
    compare_solve_sweeps(backend, [shape] * 4, m, transposed, periodic, dtype, seed=m)


# Broadcast bands (lower, diag, upper, rhs shapes), in terms of (P, N, Q).
BROADCASTS = {
    "mixed": lambda P, N, Q: [(1, N, 1), (P, N, Q), (P, 1, Q), (P, N, Q)],
    "shared_over_q": lambda P, N, Q: [(P, N, 1), (P, N, 1), (P, N, 1), (P, N, Q)],
    "toeplitz": lambda P, N, Q: [(1, 1, 1), (1, 1, 1), (1, 1, 1), (P, N, Q)],
    "constant_rhs": lambda P, N, Q: [(P, N, Q), (1, 1, 1), (1, N, Q), (P, 1, Q)],
}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", sorted(BROADCASTS))
def test_solve_sweeps_with_broadcast_bands_match_native(pattern, backend, dtype):
    # (2, 37, 3) in chunks of 7 has a short last chunk (padding); (3, 50, 1) in chunks of 2 none.
    for (shape, m), flags in zip([((2, 37, 3), 7), ((3, 50, 1), 2)], FLAGS[0], strict=True):
        compare_solve_sweeps(backend, BROADCASTS[pattern](*shape), m, *flags, dtype, seed=3)


def count_solves(shapes, m):
    """Kernel calls chunk_ends and chunk_solve make (traced only)."""
    calls = []

    def solve(l, d, u, b, **kwargs):
        calls.append(b.shape)
        return jnp.zeros(np.broadcast_shapes(l.shape, d.shape, u.shape, b.shape), b.dtype)

    parts = _composed_chunks.composed(solve, None)
    operands = [jax.ShapeDtypeStruct(s, np.float32) for s in shapes]
    flags = dict(transposed=False, periodic=False, chunk=m, tiling=None)
    jax.eval_shape(functools.partial(parts["chunk_ends"], **flags), *operands)
    ends = len(calls)
    P, N, Q = np.broadcast_shapes(*shapes)
    separators = jax.ShapeDtypeStruct((P, -(-N // m), Q), np.float32)
    jax.eval_shape(functools.partial(parts["chunk_solve"], **flags), *operands, separators)
    return ends, len(calls) - ends


def test_ends_sweep_stacks_right_hand_sides_where_the_bands_broadcast():
    shape = (2, 37, 3)
    assert count_solves([shape] * 4, 7) == (4, 1)
    assert count_solves(BROADCASTS["shared_over_q"](*shape), 7) == (1, 1)
    assert count_solves(BROADCASTS["toeplitz"](3, 50, 1), 2) == (1, 1)


# ---------------------------------------------------------------------------------------------
# Recurrence sweeps against the native kernels.

# Operand shapes (a, x, h0 per chunk), in terms of (P, T, Q, C).
REC_OPERANDS = [
    lambda P, T, Q, C: [(P, T, Q), (P, T, Q), (P, C, Q)],
    lambda P, T, Q, C: [(1, T, 1), (P, T, Q), (1, C, 1)],
    lambda P, T, Q, C: [(P, 1, Q), (P, T, Q), (P, C, Q)],
    lambda P, T, Q, C: [(P, T, Q), (P, 1, Q), (P, C, 1)],
]
SCAN = [(False, False), (True, False), (False, True), (True, True)]  # (reverse, shifted)


def recurrence_cases():
    out = []
    for shape in SHAPES:
        for m in CHUNKS:
            i = len(out)  # every (scan, operands) pair once: a Latin square
            out.append((shape, m, *SCAN[i % 4], (i + i // 4) % 4))
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", recurrence_cases(),
                         ids=lambda c: f"{c[0]}-m{c[1]}-r{c[2]:d}s{c[3]:d}-ops{c[4]}")
def test_recurrence_sweeps_match_native(case, backend, dtype):
    shape, m, reverse, shifted, operands = case
    P, T, Q = shape
    C = -(-T // m)
    rng = np.random.default_rng(m)
    a_shape, x_shape, h_shape = REC_OPERANDS[operands](P, T, Q, C)
    a = jnp.asarray(rng.uniform(0.5, 1.1, a_shape) * rng.choice([-1, 1], a_shape), dtype)
    x = jnp.asarray(rng.uniform(-1, 1, x_shape), dtype)
    h0 = jnp.asarray(rng.uniform(-1, 1, h_shape), dtype)
    kernels = _backend.kernels(backend)
    flags = dict(reverse=reverse, shifted=shifted)
    run = dict(flags, activation=None, final_only=False, out_dtype=dtype, chunk=m)

    @jax.jit
    def composed(a, x, h0):
        return (kernels.recurrence_ends(a, x, **flags, chunk=m, tiling=None),
                kernels.recurrence(a, x, h0, **run, tiling=None))

    tiling = native_tiling(P, T, Q, m, dtype, columns=0)

    @jax.jit
    def native(a, x, h0):
        return (_native.recurrence_ends_pnq(a, x, **flags, chunk=m, tiling=tiling),
                _native.recurrence_pnq(a, x, h0, **run, tiling=tiling))

    ((decay, final), h), ((decay_ref, final_ref), h_ref) = composed(a, x, h0), native(a, x, h0)
    case = f"{backend} {shape} chunk={m} reverse={reverse} shifted={shifted} {a_shape} {x_shape}"
    assert_matches(decay, decay_ref, dtype, f"decay: {case}")
    assert_matches(final, final_ref, dtype, f"final: {case}")
    assert_matches(h, h_ref, dtype, f"run: {case}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_run_with_activation_and_unchunked_calls(backend):
    """An activation rides along the chunked run; chunk=0 is the plain kernel (with gate=None);
    gates and sums, with chunks or without, and final_only with chunks are refused."""
    P, T, Q, m = 2, 37, 3, 7
    C = -(-T // m)
    rng = np.random.default_rng(5)
    a, x = (jnp.asarray(rng.uniform(-1, 1, (P, T, Q))) for _ in range(2))
    h0 = jnp.asarray(rng.uniform(-1, 1, (P, C, Q)))
    kernels = _backend.kernels(backend)
    common = dict(reverse=True, shifted=True, activation=jnp.tanh, final_only=False,
                  out_dtype=np.float64)
    got = kernels.recurrence(a, x, h0, **common, tiling=None, chunk=m)
    want = _native.recurrence_pnq(a, x, h0, **common, chunk=m,
                                  tiling=native_tiling(P, T, Q, m, np.float64, columns=0,
                                                       linear=False))
    assert_matches(got, want, np.float64, "tanh run")
    plain = kernels.recurrence(a, x, h0[:, :1], **common, tiling=None, gate=None)
    tiling = _planner.cpu_tiling(P, 1, Q, T, np.float64, columns=0)
    want = _native.recurrence_pnq(a, x, h0[:, :1], **common, tiling=tiling)
    assert_matches(plain, want, np.float64, "plain run")
    with pytest.raises(NotImplementedError):
        kernels.recurrence_ends(a, x, reverse=False, shifted=False, chunk=m, tiling=None,
                                gate=(x, jax.nn.relu))
    with pytest.raises(NotImplementedError):
        kernels.recurrence(a, x, h0, **{**common, "final_only": True}, tiling=None, chunk=m)
    with pytest.raises(NotImplementedError, match="ungated"):
        kernels.recurrence(a, x, h0, **{**common, "activation": None}, tiling=None, chunk=m,
                           gate=(x, jax.nn.relu))
    with pytest.raises(NotImplementedError, match="without sums"):
        kernels.recurrence(a, x, h0, **{**common, "activation": None}, tiling=None, chunk=m,
                           sums=x)
    # This backend's plain kernel reads no states: it takes no gate (the primitive materializes
    # the slope for it) and forms no sums (the primitive forms them after it).
    with pytest.raises(NotImplementedError, match="runs no gate"):
        kernels.recurrence(a, x, h0[:, :1], **{**common, "activation": None}, tiling=None,
                           gate=(x, jax.nn.relu))
    with pytest.raises(NotImplementedError, match="forms no sums"):
        kernels.recurrence(a, x, h0[:, :1], **{**common, "activation": None}, tiling=None,
                           sums=x)


def test_invalid_chunk_is_refused():
    kernels = _backend.kernels("xla")
    l, d, u, b = dominant([(1, 37, 1)] * 4, np.float64, 0)
    with pytest.raises(ValueError, match="2 rows"):
        kernels.chunk_ends(l, d, u, b, transposed=False, periodic=False, chunk=4, tiling=None)


# ---------------------------------------------------------------------------------------------
# End to end through _long_systems/chunked.py.


def replan(periodic):
    """Plans of the reduced systems: chunked again (chunks of 3) while 8 rows or more."""

    def plan(P, C, Q):
        m = _planner.valid_chunk(C, 3, periodic=periodic) if C >= 8 else 0
        return _planner.Plan(m, None)

    return plan


def reference_solve(l, d, u, b, *, transposed, periodic):
    """x of every (p, :, q) system by scipy.linalg.solve_banded, or a dense solve when
    periodic, in float64."""
    l, d, u, b = (np.asarray(v, np.float64) for v in np.broadcast_arrays(l, d, u, b))
    P, N, Q = b.shape
    x = np.zeros_like(b)
    for p in range(P):
        for q in range(Q):
            lo, di, up, rhs = l[p, :, q], d[p, :, q], u[p, :, q], b[p, :, q]
            if periodic:
                a = np.diag(di) + np.diag(lo[1:], -1) + np.diag(up[:-1], 1)
                a[0, N - 1] += lo[0]
                a[N - 1, 0] += up[N - 1]
                x[p, :, q] = np.linalg.solve(a.T if transposed else a, rhs)
                continue
            if transposed:  # A^T: sub[i] = up[i-1], sup[i] = lo[i+1]
                lo, up = np.concatenate([[0], up[:-1]]), np.concatenate([lo[1:], [0]])
            banded = np.stack([np.concatenate([[0], up[:-1]]), di, np.concatenate([lo[1:], [0]])])
            x[p, :, q] = scipy.linalg.solve_banded((1, 1), banded, rhs)
    return x


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape,m,transposed,periodic", [
    ((1, 200, 1), 15, False, False),  # 14 chunks: the reduced system is chunked again
    ((2, 37, 3), 7, True, False),
    ((1, 95, 2), 8, False, True),  # 12 chunks: the periodic reduced system chunked again
    ((3, 50, 1), 3, True, True),
])
def test_chunked_solve_end_to_end_matches_scipy(shape, m, transposed, periodic, backend, dtype):
    kernels = _backend.kernels(backend)
    l, d, u, b = dominant([shape] * 4, dtype, seed=m)
    kind = "periodic" if periodic else "thomas"
    x = jax.jit(functools.partial(_chunked.solve_any, kernels, plan=_planner.Plan(m, None),
                                  transposed=transposed, kind=kind, out_dtype=dtype,
                                  replan=replan(periodic)))(l, d, u, b)
    want = reference_solve(l, d, u, b, transposed=transposed, periodic=periodic)
    assert x.dtype == np.dtype(dtype)
    err = np.max(np.abs(np.asarray(x, np.float64) - want)) / np.max(np.abs(want))
    assert err < 5 * RTOL[np.dtype(dtype)], err


def numpy_recurrence(a, x, h0, *, reverse, shifted):
    """h[t] = c[t] h[prev] + x[t] along axis 1 in float64, c[t] = a[t] or (shifted) a at the
    previous step's index, zero at the first step."""
    a, x = (np.asarray(v, np.float64) for v in np.broadcast_arrays(a, x))
    T = x.shape[1]
    h = np.broadcast_to(np.asarray(h0, np.float64)[:, 0], x[:, 0].shape)
    out = np.zeros_like(x)
    order = range(T - 1, -1, -1) if reverse else range(T)
    for k, t in enumerate(order):
        prev = t + 1 if reverse else t - 1
        c = a[:, t] if not shifted else (0.0 if k == 0 else a[:, prev])
        h = c * h + x[:, t]
        out[:, t] = h
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reverse,shifted", SCAN)
def test_chunked_recurrence_end_to_end_matches_numpy(reverse, shifted, backend):
    P, T, Q, m = 2, 101, 3, 8  # 13 chunks: the carry recurrence is chunked again
    rng = np.random.default_rng(7)
    a = jnp.asarray(rng.uniform(0.5, 1.05, (P, T, Q)))
    x = jnp.asarray(rng.uniform(-1, 1, (P, T, Q)))
    h0 = jnp.asarray(rng.uniform(-1, 1, (P, 1, Q)))
    kernels = _backend.kernels(backend)

    def plan(P, C, Q):
        return _planner.Plan(3 if C >= 8 else 0, None)

    h = jax.jit(functools.partial(
        _chunked.recurrence_any, kernels, plan=_planner.Plan(m, None), reverse=reverse,
        shifted=shifted, final_only=False, gate=None, replan=plan))(a, x, h0)
    want = numpy_recurrence(a, x, h0, reverse=reverse, shifted=shifted)
    assert np.max(np.abs(np.asarray(h) - want)) / np.max(np.abs(want)) < 1e-12
