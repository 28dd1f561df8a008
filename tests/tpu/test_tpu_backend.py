"""The pallas_tpu backend: where it runs and why not, the public functions and their gradients
through it on CPU ("pallas_tpu_interpret": the same kernels in Pallas's HLO interpreter), and
how its grids move data (every input block read once, every output block written once)."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from helpers import dense_solve

import tridiax
from tridiax import verify
from tridiax._banded.api import solve as banded_solve
from tridiax._block import api as _block_api
from tridiax._block import pallas_tpu as tpu_block
from tridiax._block.api import solve as block_solve
from tridiax._core import backend as _backend
from tridiax._core import planner as _planner
from tridiax._long_systems import composed_chunks as _composed_chunks
from tridiax._pallas import tpu as _tpu
from tridiax._recurrence import pallas_tpu as tpu_recurrence
from tridiax._recurrence.api import recurrence
from tridiax._tridiagonal import pallas_tpu as tpu_thomas
from tridiax._tridiagonal.api import solve

pytestmark = pytest.mark.skipif(not _tpu.available(), reason="this JAX has no Pallas TPU backend")

BACKEND = "pallas_tpu_interpret"


def test_tpus_prefer_the_pallas_kernels_and_say_why_not():
    assert _backend.PREFERENCE["tpu"] == ("pallas_tpu", "xla")
    assert _backend.default_backend("tpu", jnp.float32) == "pallas_tpu"
    assert _backend.default_backend("tpu", jnp.bfloat16) == "pallas_tpu"
    assert _backend.default_backend("tpu", jnp.float64) == "xla"
    assert _backend.default_backend("tpu", jnp.complex64) == "pallas_tpu"
    assert _backend.default_backend("tpu", jnp.complex128) == "xla"
    assert _backend.default_backend("tpu", jnp.complex64, op="recurrence") == "pallas_tpu"
    assert "without an activation" in _backend.unavailable("pallas_tpu", jnp.complex64, platform="tpu",
                                                           op="recurrence", activation=jnp.tanh)
    assert _backend.default_block_backend("tpu", jnp.complex64, 3) == "pallas_tpu"
    # complex64 as float32 parts, in every kernel
    assert _backend.default_backend("tpu", jnp.complex64, op="banded") == "pallas_tpu"
    assert _backend.default_backend("tpu", jnp.float32, op="recurrence",
                                    activation=jax.nn.relu) == "pallas_tpu"
    assert _backend.default_backend("tpu", jnp.float32, op="recurrence",
                                    activation=jax.nn.gelu) == "xla"
    assert "run on TPUs" in _backend.unavailable("pallas_tpu", jnp.float32, platform="cpu")
    assert "float64" in _backend.unavailable("pallas_tpu", jnp.float64, platform="tpu")
    assert "complex128" in _backend.unavailable("pallas_tpu", jnp.complex128, platform="tpu")
    assert "gelu" in _backend.unavailable("pallas_tpu", jnp.float32, platform="tpu",
                                          op="recurrence", activation=jax.nn.gelu)
    assert _backend.unavailable(BACKEND, jnp.float32, platform="cpu") is None
    with pytest.raises(ValueError, match="float64"):
        solve(*[np.ones(4)] * 4, backend=BACKEND)


def _bands(shape, seed=0):
    rng = np.random.default_rng(seed)
    lower, upper, rhs = (rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(3))
    diag = (rng.uniform(2, 3, shape) * rng.choice([-1, 1], shape)).astype(np.float32)
    return lower, diag, upper, rhs


@pytest.mark.parametrize("axis", [1, 0, -1])
def test_solve_along_every_axis(axis):
    ops = _bands((5, 40, 6))
    x = solve(*ops, axis=axis, backend=BACKEND)
    want = verify.reference_solve(*ops, axis=axis)
    np.testing.assert_allclose(x, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


def test_solve_gradients_match_a_dense_solve():
    ops = [jnp.asarray(v) for v in _bands((3, 20))]
    weights = jnp.asarray(np.random.default_rng(1).uniform(-1, 1, (3, 20)), jnp.float32)

    def loss(fn):
        return lambda *a: jnp.sum(weights * jnp.sin(fn(*a)))

    got = jax.grad(loss(lambda *a: solve(*a, axis=-1, backend=BACKEND)), argnums=(0, 1, 2, 3))(*ops)
    want = jax.grad(loss(lambda *a: dense_solve(*a, -1)), argnums=(0, 1, 2, 3))(*ops)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())


def _like_xla(solve_with, ops, exact, weights):
    """`solve_with(backend)` on the TPU kernels against XLA's loop: its error against `exact`
    within four times the loop's (plus 1e-6 of the answer's size), and the gradients of
    sum(weights * sin(x)) w.r.t. every operand equal to the loop's, to 1e-3."""
    x, sweep = solve_with(BACKEND)(*ops), solve_with("xla")(*ops)
    assert x.dtype == sweep.dtype
    assert np.abs(x - exact).max() <= 4 * np.abs(sweep - exact).max() + 1e-6 * np.abs(exact).max()

    def loss(backend):
        return lambda *a: jnp.sum(weights * jnp.abs(jnp.sin(solve_with(backend)(*a))) ** 2)

    argnums = tuple(range(len(ops)))
    got = jax.grad(loss(BACKEND), argnums=argnums)(*ops)
    want = jax.grad(loss("xla"), argnums=argnums)(*ops)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3 * np.abs(w).max())


KINDS = {"pivoted": dict(pivoting=True), "periodic": dict(periodic=True),
         "periodic_pivoted": dict(periodic=True, pivoting=True)}


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_and_its_gradients_along_every_axis(kind, axis):
    """Pivoted and periodic solves and their gradients through the TPU kernels, against XLA's
    loops (the sequential sweeps, in float32 too) and scipy (float64)."""
    lower, diag, upper, rhs = _bands((5, 40, 6), seed=3)
    if "pivoted" in kind:  # far from dominant: rows are swapped
        diag = np.random.default_rng(4).uniform(-1, 1, diag.shape).astype(np.float32)
    ops = [jnp.asarray(v) for v in (lower, diag, upper, rhs)]
    weights = jnp.asarray(np.random.default_rng(5).uniform(-1, 1, rhs.shape), jnp.float32)
    exact = verify.reference_solve(*(np.asarray(v, np.float64) for v in ops), axis=axis,
                                   periodic="periodic" in kind)
    _like_xla(lambda backend: functools.partial(solve, axis=axis, backend=backend, **KINDS[kind]),
              ops, exact, weights)


@pytest.mark.parametrize("kind", ["thomas", *KINDS])
def test_complex_solves_and_their_gradients(kind):
    """Complex64 solves of every kind through the TPU kernels (as float32 parts), and their
    gradients (the transposed solve, not conjugated): against XLA's loop and scipy."""
    rng = np.random.default_rng(11)
    shape = (3, 30, 5)
    lower, diag, upper, rhs = (jnp.asarray(rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape),
                                           jnp.complex64) for _ in range(4))
    if "pivoted" not in kind:
        diag = diag + 3
    ops = (lower, diag, upper, rhs)
    exact = verify.reference_solve(*(np.asarray(v, np.complex128) for v in ops), axis=1,
                                   periodic="periodic" in kind)
    weights = jnp.asarray(rng.uniform(-1, 1, shape), jnp.float32)
    _like_xla(lambda backend: functools.partial(solve, axis=1, backend=backend, **KINDS.get(kind, {})),
              ops, exact, weights)


def test_factorization_solves_through_the_tpu_kernels():
    """Tridiagonal.factor() on the TPU backend: the factors match XLA's, its solves (and the
    gradient w.r.t. rhs, a transposed factored solve) match the dense solve."""
    ops = [jnp.asarray(v) for v in _bands((4, 33, 7), seed=6)]
    matrix = tridiax.Tridiagonal(*ops[:3], axis=1)
    factors = tridiax.TDMA(backend=BACKEND).factor(matrix)
    reference = tridiax.TDMA(backend="xla").factor(matrix)
    for name in ("lower_factor", "inverse_pivots", "upper_factor"):
        np.testing.assert_allclose(getattr(factors, name), getattr(reference, name), rtol=1e-6,
                                   atol=1e-6)
    dense = jnp.moveaxis(dense_solve(*(jnp.moveaxis(v, 1, -1) for v in ops), -1), -1, 1)
    x, vjp = jax.vjp(factors.solve, ops[3])
    np.testing.assert_allclose(x, dense, rtol=2e-5, atol=2e-5 * np.abs(dense).max())
    cotangent = jnp.ones_like(x)
    (got,) = vjp(cotangent)
    (want,) = jax.vjp(reference.solve, ops[3])[1](cotangent)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("pivoting", [False, True], ids=["banded", "banded_pivoted"])
def test_banded_solves_and_their_gradients_along_every_axis(pivoting, axis):
    """solve_banded through the TPU kernel (the band cotangents come from XLA's product, the
    rest from a transposed solve): against scipy and XLA's loop."""
    rng = np.random.default_rng(8)
    shape = (5, 40, 6)
    ab = rng.uniform(-1, 1, (4, *shape)).astype(np.float32)
    ab[1] += 4 * np.sign(ab[1])  # the diagonal of (l, u) = (2, 1)
    b = rng.uniform(-1, 1, shape).astype(np.float32)
    ab, b = jnp.asarray(np.moveaxis(ab, 2, axis % 3 + 1)), jnp.asarray(np.moveaxis(b, 1, axis))

    def loss(backend):
        return lambda ab, b: jnp.sum(jnp.sin(banded_solve((2, 1), ab, b, axis=axis,
                                                          pivoting=pivoting, backend=backend)))

    x = banded_solve((2, 1), ab, b, axis=axis, pivoting=pivoting, backend=BACKEND)
    want = verify.reference_solve_banded((2, 1), np.asarray(ab, np.float64), np.asarray(b, np.float64),
                                         axis=axis)
    np.testing.assert_allclose(x, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    got = jax.grad(loss(BACKEND), argnums=(0, 1))(ab, b)
    reference = jax.grad(loss("xla"), argnums=(0, 1))(ab, b)
    for g, w in zip(got, reference, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("lower", [False, True], ids=["upper", "lower"])
def test_hermitian_banded_solves_and_their_gradients_along_every_axis(lower, axis):
    """solveh_banded through the TPU kernel, which reads the other triangle's entries from the
    stored one: against scipy.linalg.solveh_banded (float64) and XLA's loop, and the gradient
    w.r.t. the stored bands (each off-diagonal entry standing for two of A) equal to the
    loop's, whose bands XLA mirrors."""
    rng = np.random.default_rng(11)
    shape, u = (5, 40, 6), 2
    ab = rng.uniform(-1, 1, (u + 1, *shape)).astype(np.float32)
    ab[0 if lower else u] = 4 * u + 1 + np.abs(ab[0 if lower else u])  # diagonally dominant
    b = rng.uniform(-1, 1, shape).astype(np.float32)
    want = np.stack([np.stack([scipy.linalg.solveh_banded(ab[:, p, :, q].astype(np.float64), b[p, :, q],
                                                          lower=lower) for q in range(shape[2])], axis=-1)
                     for p in range(shape[0])])
    ab, b = jnp.asarray(np.moveaxis(ab, 2, axis % 3 + 1)), jnp.asarray(np.moveaxis(b, 1, axis))
    want = np.moveaxis(want, 1, axis)

    def solveh(backend):
        return lambda ab, b: banded_solve(None, ab, b, axis=axis, hermitian="lower" if lower else "upper",
                                          backend=backend)

    np.testing.assert_allclose(solveh(BACKEND)(ab, b), want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    got, reference = (jax.grad(lambda ab, b: jnp.sum(jnp.sin(solveh(backend)(ab, b))), argnums=(0, 1))(ab, b)
                      for backend in (BACKEND, "xla"))
    for g, w in zip(got, reference, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())


@pytest.mark.parametrize("hermitian", [None, "upper", "lower"])
def test_complex_banded_solves_and_their_gradients(hermitian):
    """Complex64 banded solves through the TPU kernel (as float32 parts): solve_banded with
    pivoting, and solveh_banded, whose kernel conjugates the mirrored triangle; against scipy
    and XLA's loop, with gradients."""
    rng = np.random.default_rng(12)
    shape, (l, u) = (3, 30, 5), (2, 2)
    bands = 3 if hermitian else l + u + 1
    ab = (rng.uniform(-1, 1, (bands, *shape)) + 1j * rng.uniform(-1, 1, (bands, *shape))).astype(np.complex64)
    if hermitian:
        ab[0 if hermitian == "lower" else 2] += 8
    b = (rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape)).astype(np.complex64)
    if hermitian:
        exact = np.stack([np.stack([scipy.linalg.solveh_banded(ab[:, p, :, q].astype(np.complex128), b[p, :, q],
                                                               lower=hermitian == "lower")
                                    for q in range(shape[2])], axis=-1) for p in range(shape[0])])
    else:
        exact = verify.reference_solve_banded((l, u), ab.astype(np.complex128), b.astype(np.complex128), axis=1)
    weights = jnp.asarray(rng.uniform(-1, 1, shape), jnp.float32)
    _like_xla(lambda backend: functools.partial(banded_solve, None if hermitian else (l, u), axis=1,
                                                pivoting=not hermitian, hermitian=hermitian, backend=backend),
              (jnp.asarray(ab), jnp.asarray(b)), exact, weights)


def test_the_planner_chunks_what_would_leave_a_tensorcore_idle_or_not_fit_vmem():
    """Fewer systems than one (8, 128) row tile holds are split into chunks until they fill
    eight grid steps of such tiles (and, when too long for VMEM, into chunks that fit). Batches
    of a row tile or more run whole (streamed when too long for VMEM), and so do short systems
    and systems narrower than 128 lanes along Q (the composed sweeps would pad them).
    Recurrences are never chunked (`test_few_long_recurrences_run_whole_as_runs_side_by_side`)."""
    def chunk(P, N, Q, kind="thomas"):
        return _planner.solve_chunk(P, N, Q, jnp.float32, kind=kind, backend="pallas_tpu",
                                    platform="tpu")

    assert chunk(8192, 1000, 1) == 0 and chunk(1, 1000, 4) == 0  # wide; short
    assert tpu_thomas.fits(1, 2000, 1024, jnp.float32) and chunk(1, 2000, 1024) == 0  # a row tile
    # chunks of whole (16, 128) tiles, so that the chunk view is a bitcast; of those, one that
    # divides N where one is near the target (no padded last chunk), as for 100 000 rows
    # (1250 divides it too, but would make XLA relayout every operand)
    m = chunk(1, 3000, 128)
    assert m % _planner.TPU_CHUNK_ROWS == 0 and 3000 // m >= 50
    m = chunk(1, 100000, 128)
    assert m % _planner.TPU_CHUNK_ROWS == 0 and 100000 % m == 0 and 100000 // m >= 50
    assert chunk(1, 3000, 4) == 0 and chunk(4, 3000, 1) == 0
    # too long for VMEM: a full row tile streams its work rows through HBM (two sweeps);
    # half a row tile is chunked, into chunks that fit
    assert not tpu_thomas.fits(1, 60000, 1024, jnp.float32)
    assert all(chunk(1, 60000, 1024, kind=kind) == 0 for kind in ("thomas", "periodic", "pivoted"))
    for kind in ("thomas", "pivoted"):
        m = chunk(1, 60000, 512, kind=kind)
        assert 0 < m <= _planner.TPU_MAX_CHUNK and tpu_thomas.fits(60000 // m, m, 512, jnp.float32, kind=kind)
    assert chunk(1, 3000, 4, kind="factored") == 0  # never chunked
    for P, T, Q in [(8192, 1000, 1), (1, 60000, 1024), (1, 100000, 128), (1, 100000, 256)]:
        assert _planner.recurrence_chunk(P, T, Q, jnp.float32, linear=True, backend="pallas_tpu",
                                         platform="tpu") == 0


@pytest.mark.parametrize("kind", ["thomas", *KINDS])
def test_few_long_systems_are_solved_in_chunks(kind):
    """128 systems of 3000 rows through the partition method (the chunk sweeps composed around
    the TPU kernels): against scipy, and the gradient w.r.t. rhs against XLA's loop."""
    options = KINDS.get(kind, {})
    ops = [jnp.asarray(v) for v in _bands((3000, 128), seed=9)]
    assert _planner.solve_chunk(1, 3000, 128, jnp.float32, kind=kind.replace("periodic_pivoted", "pivoted"),
                                backend=BACKEND, platform="cpu") > 0
    x = solve(*ops, axis=0, backend=BACKEND, **options)
    want = verify.reference_solve(*(np.asarray(v, np.float64) for v in ops), axis=0,
                                  periodic="periodic" in kind)
    np.testing.assert_allclose(x, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    cotangent = jnp.asarray(np.random.default_rng(10).uniform(-1, 1, (3000, 128)), jnp.float32)
    got = jax.vjp(lambda b: solve(*ops[:3], b, axis=0, backend=BACKEND, **options), ops[3])[1](cotangent)
    ref = jax.vjp(lambda b: solve(*ops[:3], b, axis=0, backend="xla", **options), ops[3])[1](cotangent)
    np.testing.assert_allclose(got[0], ref[0], rtol=2e-5, atol=2e-5 * np.abs(ref[0]).max())


@pytest.mark.parametrize("periodic", [False, True])
def test_one_long_system_is_solved_in_chunks_of_a_lane_each(periodic, monkeypatch):
    """One system of 2048 rows (a 1-D array) in chunks of 128 rows, one a lane, through the
    partition method's own kernels (never the composed sweeps): against scipy, and the
    gradients w.r.t. every band against XLA's loop. The planner chunks only the plain kind so
    (not pivoted or periodic systems, nor lengths that are no multiple of 128); a periodic
    system in such chunks, asked for, runs the same kernels."""
    N = 2048
    assert _planner.solve_chunk(1, N, 1, jnp.float32, kind="thomas", backend=BACKEND, platform="cpu") == 128
    for kind in ("pivoted", "periodic"):
        assert _planner.solve_chunk(1, N, 1, jnp.float32, kind=kind, backend=BACKEND, platform="cpu") == 0
    assert _planner.solve_chunk(1, N + 64, 1, jnp.float32, kind="thomas", backend=BACKEND,
                                platform="cpu") == 0

    def refuse(*args, **kwargs):
        raise AssertionError("the composed sweeps ran")

    monkeypatch.setattr(_composed_chunks, "chunk_ends_pnq", refuse)
    monkeypatch.setattr(_composed_chunks, "chunk_solve_pnq", refuse)
    ops = [jnp.asarray(v) for v in _bands((N,), seed=21)]
    exact = verify.reference_solve(*(np.asarray(v, np.float64) for v in ops), axis=0, periodic=periodic)
    weights = jnp.asarray(np.random.default_rng(22).uniform(-1, 1, N), jnp.float32)

    def solve_with(backend):  # XLA's loop whole
        chunk = 128 if periodic and backend == BACKEND else None
        return functools.partial(solve, axis=0, backend=backend, periodic=periodic, chunk=chunk)

    _like_xla(solve_with, ops, exact, weights)


def test_a_row_tile_of_systems_too_long_for_vmem_streams_its_work_rows(monkeypatch):
    """1024 systems (a full row tile) too long for the VMEM budget: not chunked but solved by
    the two streamed sweeps, forward and (the transposed solve) in the gradient: against
    scipy, and the gradient w.r.t. rhs against XLA's loop."""
    monkeypatch.setattr(_tpu, "VMEM_BUDGET", 1 << 19)
    N, B = 600, 1024
    assert not tpu_thomas.fits(1, N, B, jnp.float32)
    assert _planner.solve_chunk(1, N, B, jnp.float32, kind="thomas", backend=BACKEND, platform="cpu") == 0
    calls, streamed = [], tpu_thomas._streamed_solve

    def spy(*args, **kwargs):
        calls.append(kwargs["transposed"])
        return streamed(*args, **kwargs)

    monkeypatch.setattr(tpu_thomas, "_streamed_solve", spy)
    ops = [jnp.asarray(v) for v in _bands((N, B), seed=12)]
    x = solve(*ops, axis=0, backend=BACKEND)
    want = verify.reference_solve(*(np.asarray(v, np.float64) for v in ops), axis=0)
    np.testing.assert_allclose(x, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    cotangent = jnp.asarray(np.random.default_rng(13).uniform(-1, 1, (N, B)), jnp.float32)
    got = jax.vjp(lambda b: solve(*ops[:3], b, axis=0, backend=BACKEND), ops[3])[1](cotangent)
    ref = jax.vjp(lambda b: solve(*ops[:3], b, axis=0, backend="xla"), ops[3])[1](cotangent)
    np.testing.assert_allclose(got[0], ref[0], rtol=2e-5, atol=2e-5 * np.abs(ref[0]).max())
    assert calls == [False, False, True]


def test_few_long_recurrences_run_whole_as_runs_side_by_side():
    """A TPU never splits a recurrence into chunks: fewer sequences than a row tile holds run
    in row tiles of one sublane, each chunk as eight runs side by side (`segmented`)."""
    rng = np.random.default_rng(11)
    a, x = (jnp.asarray(rng.uniform(-1, 1, (2000, 256)), jnp.float32) for _ in range(2))
    for P, Q in [(1, 256), (1, 128), (3, 1), (300, 1), (1, 4)]:
        assert _planner.recurrence_chunk(P, 2000, Q, jnp.float32, linear=True, backend=BACKEND,
                                         platform="cpu") == 0
    g = tpu_recurrence._plan(1, 2000, 256, [a[None], x[None]], jnp.float32, False, linear=True)
    assert g.s == 1 and g.groups == (1, 2) and tpu_recurrence.segmented(g, None)
    h = recurrence(a, x, axis=0, backend=BACKEND)
    np.testing.assert_allclose(h, _scan(a, x, axis=0), rtol=1e-5, atol=1e-5)


def _scan(a, x, *, axis, reverse=False, activation=lambda v: v, initial=None, final_only=False):
    """An independent reference: lax.scan over the time axis."""
    a, x = (jnp.moveaxis(jnp.broadcast_to(v, np.broadcast_shapes(a.shape, x.shape)), axis, 0)
            for v in (a, x))

    def step(h, ax):
        h = activation(ax[0] * h + ax[1])
        return h, h

    h0 = jnp.zeros_like(x[0]) if initial is None else jnp.broadcast_to(initial, x[0].shape)
    last, h = jax.lax.scan(step, h0, (a, x), reverse=reverse)
    return last if final_only else jnp.moveaxis(h, 0, axis)


@pytest.mark.parametrize("activation", [None, jax.nn.relu, jnp.tanh], ids=["linear", "relu", "tanh"])
def test_recurrence_and_its_gradients(activation):
    rng = np.random.default_rng(2)
    a = jnp.asarray(rng.uniform(-1, 1, (30, 7)), jnp.float32)
    x = jnp.asarray(rng.uniform(-1, 1, (30, 7)), jnp.float32)
    def reference(a, x):
        return _scan(a, x, axis=0, activation=activation or (lambda v: v))

    def ours(a, x):
        return recurrence(a, x, axis=0, activation=activation, backend=BACKEND)

    np.testing.assert_allclose(ours(a, x), reference(a, x), rtol=1e-5, atol=1e-6)
    got = jax.grad(lambda *v: jnp.sum(jnp.cos(ours(*v))), argnums=(0, 1))(a, x)
    want = jax.grad(lambda *v: jnp.sum(jnp.cos(reference(*v))), argnums=(0, 1))(a, x)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _kernel_calls(monkeypatch):
    """(gate, whether it formed sums) of every call of the TPU recurrence kernel from now on
    (gate None: ungated), in order."""
    calls = []
    kernel = tpu_recurrence.recurrence_pnq

    def spy(*args, gate=None, sums=None, **kwargs):
        calls.append((gate, sums is not None))
        return kernel(*args, gate=gate, sums=sums, **kwargs)

    monkeypatch.setattr(tpu_recurrence, "recurrence_pnq", spy)
    return calls


@pytest.mark.parametrize("activation", [jax.nn.relu, jnp.tanh], ids=["relu", "tanh"])
@pytest.mark.parametrize("shape,axis", [((40, 1030), 0), ((300, 37), 1), ((3, 50, 6), 1)])
def test_indrnn_gradients_gate_the_kernel(activation, shape, axis, monkeypatch):
    """IndRNN's gradients (a weight per feature, and per step too): the reversed recurrence is
    gated in the TPU kernel (the slope from the stored states, `gate`), never materialized, and
    with a weight per feature it also sums the weight's cotangent (`sums`); against XLA's
    loop, in every layout (lanes, batch-first, sublanes)."""
    calls = _kernel_calls(monkeypatch)
    rng = np.random.default_rng(sum(shape))
    x = jnp.asarray(rng.uniform(-1, 1, shape), jnp.float32)
    features = [1] * len(shape)
    features[-1 if axis == 0 else 0] = shape[-1 if axis == 0 else 0]
    for weight_shape in (tuple(features), shape):
        weight = jnp.asarray(rng.uniform(-1, 1, weight_shape), jnp.float32)

        def loss(w, z, backend):
            return jnp.sum(jnp.cos(recurrence(w, z, axis=axis, activation=activation, backend=backend)))

        def reference(w, z):
            return jnp.sum(jnp.cos(_scan(w, z, axis=axis, activation=activation)))

        calls.clear()
        got = jax.grad(loss, argnums=(0, 1))(weight, x, BACKEND)
        # the forward, then the gradient's reversed recurrence
        assert [g is not None and g[1] is activation for g, _ in calls] == [False, True]
        assert [sums for _, sums in calls] == [False, weight_shape == tuple(features)]
        want = jax.grad(reference, argnums=(0, 1))(weight, x)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * np.abs(w).max())


@pytest.mark.parametrize("reverse,final_only", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("shape,axis", [((40, 1030), 0), ((300, 37), 1), ((3, 50, 6), 1)])
def test_decays_constant_in_time_and_their_gradients(shape, axis, reverse, final_only, monkeypatch):
    """A linear recurrence with a decay per sequence: its gradient goes through the tangent
    and sums primitives, whose linear reversed run sums the decay's cotangent in the kernel (a
    split time axis adds up each device's sum, `sharding_cases.py`); against lax.scan,
    reversed and final state only, in every layout; under vmap, and to second order (a
    Hessian-vector product through the sums' JVP)."""
    calls = _kernel_calls(monkeypatch)
    rng = np.random.default_rng(sum(shape) + reverse + 2 * final_only)
    x = jnp.asarray(rng.uniform(-1, 1, shape), jnp.float32)
    decay_shape = [1] * len(shape)
    decay_shape[-1 if axis == 0 else 0] = shape[-1 if axis == 0 else 0]
    a = jnp.asarray(rng.uniform(0.5, 0.99, decay_shape), jnp.float32)
    h0 = jnp.asarray(rng.uniform(-1, 1, shape[:axis] + shape[axis + 1:]), jnp.float32)

    def loss(a, x, h0, backend):
        h = recurrence(a, x, axis=axis, reverse=reverse, final_only=final_only, initial=h0,
                       backend=backend)
        return jnp.sum(jnp.sin(h))

    def reference(a, x, h0):
        return jnp.sum(jnp.sin(_scan(a, x, axis=axis, reverse=reverse, initial=h0, final_only=final_only)))

    got = jax.grad(loss, argnums=(0, 1, 2))(a, x, h0, BACKEND)
    assert [sums for _, sums in calls] == [False, True]
    want = jax.grad(reference, argnums=(0, 1, 2))(a, x, h0)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * np.abs(w).max())
    if final_only or reverse:
        return
    batched = jax.vmap(jax.grad(loss), in_axes=(None, 0, None, None))(a, jnp.stack([x, -x]), h0, BACKEND)
    np.testing.assert_allclose(batched[0], got[0], rtol=1e-4, atol=1e-5 * np.abs(got[0]).max())
    direction = jnp.asarray(rng.uniform(-1, 1, decay_shape), jnp.float32)

    want = jax.jvp(lambda a: jax.grad(reference)(a, x, h0), (a,), (direction,))[1]
    got = jax.jvp(lambda a: jax.grad(loss)(a, x, h0, BACKEND), (a,), (direction,))[1]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * np.abs(want).max())


def test_a_chunked_gated_recurrence_materializes_its_slope(monkeypatch):
    """Chunks (asked for: a TPU recurrence never chunks by itself) run the composed chunk
    sweeps, which take no gate: the slope products are formed by XLA instead, with the same
    values."""
    from tridiax._recurrence.primitive import gated_recurrence_p

    calls = _kernel_calls(monkeypatch)
    rng = np.random.default_rng(5)
    a, x, states = (jnp.asarray(rng.uniform(-1, 1, (100, 130)), jnp.float32) for _ in range(3))
    h0 = jnp.zeros((1, 130), jnp.float32)

    def run(backend, chunk):
        return gated_recurrence_p.bind(a, x, h0, states, axis=0, reverse=True, shifted=True, gate=jnp.tanh,
                                       final_only=False, backend=backend, chunk=chunk)

    want = run("xla", None)
    for chunk, gated in [(16, False), (0, True)]:
        calls.clear()
        np.testing.assert_allclose(run(BACKEND, chunk), want, rtol=1e-5, atol=1e-6)
        assert calls and all((g is not None) == gated for g, _ in calls), (chunk, calls)


@pytest.mark.parametrize("axis", [0, -1])
def test_complex_recurrence_and_its_gradients(axis):
    """An LRU-style complex64 recurrence (complex decays, complex inputs) through the TPU
    kernel, as float32 parts, and its gradients (the reversed recurrence): against lax.scan in
    complex64."""
    rng = np.random.default_rng(12)
    shape = (40, 9) if axis == 0 else (9, 40)
    a = jnp.asarray(rng.uniform(0.5, 0.99, shape) * np.exp(1j * rng.uniform(-3, 3, shape)), jnp.complex64)
    x = jnp.asarray(rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape), jnp.complex64)

    def ours(a, x):
        return recurrence(a, x, axis=axis, backend=BACKEND)

    h = ours(a, x)
    assert h.dtype == jnp.complex64
    np.testing.assert_allclose(h, _scan(a, x, axis=axis), rtol=1e-5, atol=1e-5)
    got = jax.grad(lambda *v: jnp.sum(jnp.abs(ours(*v)) ** 2), argnums=(0, 1))(a, x)
    want = jax.grad(lambda *v: jnp.sum(jnp.abs(_scan(*v, axis=axis)) ** 2), argnums=(0, 1))(a, x)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())


def test_reversed_recurrence_with_decays_per_feature():
    rng = np.random.default_rng(4)
    a = jnp.asarray(rng.uniform(-1, 1, (7,)), jnp.float32)
    x = jnp.asarray(rng.uniform(-1, 1, (3, 30, 7)), jnp.float32)
    h = recurrence(a, x, axis=1, reverse=True, backend=BACKEND)
    np.testing.assert_allclose(h, _scan(a, x, axis=1, reverse=True), rtol=1e-5, atol=1e-6)


def test_operands_in_their_physical_order(monkeypatch):
    """Where the TPU stores an array column-major (its default layout), the kernels take it
    transposed (a bitcast there) and solve along the moved axis: the same answers."""
    monkeypatch.setattr(_tpu, "default_minor_to_major",
                        lambda shape, dtype: tuple(range(len(shape))))  # reversed dimensions
    ops = _bands((6, 33))
    for axis, periodic in itertools.product((0, 1), (False, True)):
        x = solve(*ops, axis=axis, backend=BACKEND, periodic=periodic, pivoting=periodic)
        want = verify.reference_solve(*ops, axis=axis, periodic=periodic)
        np.testing.assert_allclose(x, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    moved, axis, back = _tpu.in_physical_order([jnp.zeros((6, 33, 2)), jnp.zeros((1, 33, 1))], 1,
                                               jnp.float32)
    assert [v.shape for v in moved] == [(2, 33, 6), (1, 33, 1)] and axis == 1
    assert back(jnp.zeros((2, 33, 6))).shape == (6, 33, 2)
    a, x = (jnp.asarray(v) for v in _bands((6, 33))[:2])
    h = recurrence(a, x, axis=1, backend=BACKEND)
    np.testing.assert_allclose(h, _scan(a, x, axis=1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("k, pivoting", [(2, True), (3, False)])
def test_block_solves_and_their_gradients_along_every_axis(k, pivoting, axis):
    """solve_block_tridiagonal through the TPU kernel (the block cotangents come from XLA's
    product, the rest from a transposed solve): against dense solves (float64) and XLA's loop,
    batch-first (axis -1: the systems swapped onto lanes) and batched along both sides."""
    rng = np.random.default_rng(9)
    shape = (5, 30, 6)
    lower, diag, upper = (rng.uniform(-1, 1, (*shape, k, k)).astype(np.float32) for _ in range(3))
    diag += (4 * k) * np.eye(k, dtype=np.float32)
    if pivoting:
        lower, diag, upper = (x[..., ::-1, :].copy() for x in (lower, diag, upper))
    rhs = rng.uniform(-1, 1, (*shape, k)).astype(np.float32)
    ops = [jnp.asarray(np.moveaxis(x, 1, axis % 3)) for x in (lower, diag, upper)]
    ops.append(jnp.asarray(np.moveaxis(rhs, 1, axis % 3)))
    weights = jnp.asarray(rng.uniform(-1, 1, ops[3].shape), jnp.float32)
    exact = verify.reference_solve_block_tridiagonal(*(np.asarray(v, np.float64) for v in ops), axis=axis)
    _like_xla(lambda backend: functools.partial(block_solve, axis=axis, pivoting=pivoting, backend=backend),
              ops, exact, weights)


@pytest.mark.parametrize("axis", [0, -1])
def test_hermitian_block_solves_and_their_gradients(axis):
    """solveh_block_tridiagonal through the TPU kernel, which reads the upper blocks from the
    lower ones (lower[i+1]^T): against dense solves and XLA's loop, with gradients w.r.t. both
    operands' blocks (lower standing for two blocks each) and rhs."""
    rng = np.random.default_rng(10)
    k, shape = 3, (4, 25, 6)
    lower = rng.uniform(-1, 1, (*shape, k, k)).astype(np.float32)
    diag = rng.uniform(-1, 1, (*shape, k, k)).astype(np.float32)
    diag = (diag + np.swapaxes(diag, -1, -2)) / 2 + 4 * k * np.eye(k, dtype=np.float32)
    rhs = rng.uniform(-1, 1, (*shape, k)).astype(np.float32)
    ops = [jnp.asarray(np.moveaxis(x, 1, axis % 3)) for x in (lower, diag, rhs)]
    weights = jnp.asarray(rng.uniform(-1, 1, ops[2].shape), jnp.float32)

    upper = _block_api.hermitian_upper(ops[0], axis)  # lower[i+1]^T, exact in float32
    exact = verify.reference_solve_block_tridiagonal(
        *(np.asarray(v, np.float64) for v in (ops[0], ops[1], upper, ops[2])), axis=axis)
    _like_xla(lambda backend: lambda l, d, b: block_solve(l, d, None, b, axis=axis, hermitian=True,
                                                          backend=backend), ops, exact, weights)


class _Recorded(Exception):
    pass


def _blocks_moved(monkeypatch, run):
    """Call `run()` with `_tpu.call` recording its grid and block specs instead of launching:
    for each input and output, how many blocks Pallas's pipeline moves (one per change of its
    block index along the grid, walked in order) and how many distinct blocks it touches."""
    seen = {}

    def record(kernel, g, inputs, in_specs, out_shapes, out_specs, scratch, *, steps, **_):
        seen.update(grid=(*g.groups, steps), specs=list(in_specs) + list(out_specs),
                    outputs=len(out_specs))
        raise _Recorded

    monkeypatch.setattr(_tpu, "call", record)
    with pytest.raises(_Recorded):
        run()
    moved = []
    for spec in seen["specs"]:
        indices = [tuple(int(i) for i in spec.index_map(*point))
                   for point in itertools.product(*map(range, seen["grid"]))]
        changes = 1 + sum(a != b for a, b in itertools.pairwise(indices))
        moved.append((changes, len(set(indices))))
    return moved, seen["outputs"]


@pytest.mark.parametrize("shape", [(2, 700, 1030), (300, 600, 1), (13, 300, 5)],
                         ids=["lanes", "transposed", "sublanes"])
def test_every_block_moves_once(shape, monkeypatch):
    """The solve's grid walks each group's chunks forward then backward (and forward again,
    periodic kinds): its inputs stay on the last chunk while x is written, and x on the chunk
    it writes first while the inputs are read. The factorization's grid walks them once."""
    ops = [jnp.zeros(shape, jnp.float32)] * 4
    for kind in tpu_thomas.KINDS:
        moved, outputs = _blocks_moved(monkeypatch, lambda: tpu_thomas.solve_pnq(
            *ops, transposed=False, out_dtype=jnp.float32, kind=kind))
        assert outputs == 1
        for changes, distinct in moved:
            assert changes == distinct, kind  # no block read (written) twice
    moved, outputs = _blocks_moved(monkeypatch, lambda: tpu_thomas.factor_pnq(
        *ops[:3], out_dtype=jnp.float32))
    assert outputs == 3
    for changes, distinct in moved:
        assert changes == distinct
    for reverse in (False, True):
        moved, _ = _blocks_moved(monkeypatch, lambda: tpu_recurrence.recurrence_pnq(
            ops[0], ops[1], ops[2][:, :1], reverse=reverse, shifted=False, activation=None,
            final_only=False, out_dtype=jnp.float32))
        for changes, distinct in moved:
            assert changes == distinct
    blocks, b = jnp.zeros((*shape, 2, 2), jnp.float32), jnp.zeros((*shape, 2, 1), jnp.float32)
    moved, _ = _blocks_moved(monkeypatch, lambda: tpu_block.solve_pnq(
        blocks, blocks, blocks, b, kind="block", transposed=False, out_dtype=jnp.float32))
    for changes, distinct in moved:
        assert changes == distinct


def test_info_says_what_a_tpu_would_run():
    """`python -m tridiax --info` on a machine without a TPU shows the TPU's backend table too:
    the Pallas TPU kernels for real 32-bit and half precision and complex64, XLA's loops for
    float64, complex128 and blocks larger than 8 x 8."""
    from tridiax import _info

    text = _info.report()
    table = text.split("backends on tpu, no TPU here")[1].split("why not the others")[0]
    rows = {line[:32].strip(): line[32:].split() for line in table.splitlines()[2:] if line.strip()}
    assert rows["solve_tridiagonal (every kind)"] == ["pallas_tpu", "xla", "pallas_tpu", "xla"]
    assert rows["linear_recurrence"] == ["pallas_tpu", "xla", "pallas_tpu", "xla"]
    assert rows["indrnn (tanh)"] == ["pallas_tpu", "xla", "xla", "xla"]
    assert rows["solve_banded"] == ["pallas_tpu", "xla", "pallas_tpu", "xla"]
    assert rows["solve_block_tridiagonal k=2"] == ["pallas_tpu", "xla", "pallas_tpu", "xla"]
    assert rows["solve_block_tridiagonal k=8"] == ["pallas_tpu", "xla", "pallas_tpu", "xla"]
    assert rows["indrnn (your activation)"] == ["xla"] * 4
    assert "blocks larger than 8 x 8" in table
