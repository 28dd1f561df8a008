"""Chunked solves with partial pivoting: every chunk and the reduced system eliminated with row
interchanges, the answer's backward error checked at the separator rows, and the sequential
pivoted sweep where that check fails (`tridiax/_long_systems/chunked.py`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import RTOL

import tridiax
from tridiax import verify
from tridiax._core import planner as _planner
from tridiax._long_systems import chunked as _chunked
from tridiax._tridiagonal.api import solve

DTYPES = (np.float32, np.float64, np.complex64, np.complex128)
RNG = np.random.default_rng(29)


def indefinite_bands(shape, dtype, rng=RNG):
    """Bands with entries uniform in [-1, 1]: far from diagonally dominant, so that elimination
    without pivoting meets small pivots and partial pivoting swaps rows often."""
    def draw():
        v = rng.uniform(-1, 1, shape)
        if np.issubdtype(dtype, np.complexfloating):
            v = v + 1j * rng.uniform(-1, 1, shape)
        return np.asarray(v, dtype)

    return [draw() for _ in range(4)]


def rel_err(x, ref):
    x, ref = np.asarray(x), np.asarray(ref)
    return np.max(np.abs(x - ref)) / np.max(np.abs(ref))


def normwise_backward_error(l, d, u, b, x, axis):
    """The largest ||b - A x|| / (||A|| ||x|| + ||b||) over the systems, by NumPy in float64
    (`tridiax.verify`), the reference for the kernel's separator bound."""
    return np.max(verify.relative_residual(l, d, u, x, b, axis=axis))


def disable_the_check(monkeypatch):
    """Every chunked pivoted answer accepted (plans and checks are made when a call compiles)."""
    monkeypatch.setattr(_chunked, "separator_backward_error", lambda *a, **k: jnp.zeros(()))
    jax.clear_caches()


def epsilon(dtype):
    return np.finfo(dtype).eps


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
# (1002,) in chunks of 8 ends in a chunk of 2 rows, (8,) in chunks of 2 has only those: a
# one-row interior, whose right-hand side takes both separators.
@pytest.mark.parametrize("shape,axis,chunk", [((1002,), 0, 8), ((517, 3), 0, 16),
                                              ((2, 1001), -1, 32), ((3, 64, 2), 1, 5),
                                              ((8,), 0, 2)])
def test_chunked_pivoted_solve_is_backward_stable_and_matches_reference(monkeypatch, shape,
                                                                        axis, chunk, dtype):
    """Short chunks (2 to 32 rows, a short last one) of random indefinite bands: each chunk
    well conditioned enough that the chunked sweeps alone, their check disabled, are backward
    stable; then the checked route gives a backward stable answer too."""
    l, d, u, b = indefinite_bands(shape, dtype)
    ref = verify.reference_solve(l, d, u, b, axis=axis)
    x = solve(l, d, u, b, axis=axis, pivoting=True, chunk=chunk)
    assert np.asarray(x).dtype == dtype
    assert normwise_backward_error(l, d, u, b, x, axis) < 16 * epsilon(dtype)
    # Forward error: what the conditioning of these random matrices allows the reference too.
    assert rel_err(x, ref) < 1e4 * RTOL[np.dtype(dtype)]
    disable_the_check(monkeypatch)
    unchecked = solve(l, d, u, b, axis=axis, pivoting=True, chunk=chunk)
    assert normwise_backward_error(l, d, u, b, unchecked, axis) < 64 * epsilon(dtype)
    jax.clear_caches()


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_chunks_run_without_the_fallback_on_well_conditioned_chunks(monkeypatch, dtype):
    """With the check disabled, the chunked sweeps alone give the answer: for short chunks of
    random indefinite bands (well conditioned) it is as accurate as the sequential sweep."""
    disable_the_check(monkeypatch)
    l, d, u, b = indefinite_bands((2, 4001), dtype)
    x = solve(l, d, u, b, axis=1, pivoting=True, chunk=24)
    whole = solve(l, d, u, b, axis=1, pivoting=True, chunk=0)
    assert not np.array_equal(np.asarray(x), np.asarray(whole))  # a different elimination order
    assert normwise_backward_error(l, d, u, b, x, 1) < 16 * epsilon(dtype)
    jax.clear_caches()


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_singular_chunks_fall_back_to_the_sequential_sweep(monkeypatch, dtype):
    """Zero diagonal, unit off-diagonals, N even: nonsingular, but every chunk's interior of an
    odd number of rows is singular. The separators come out infinite or NaN, the check sends
    the systems to the sequential sweep, and the answer is exact (x alternates); with the
    check disabled the chunked answer is not finite, so the fallback is what makes it right."""
    n = 1000
    l, u = np.ones(n, dtype), np.ones(n, dtype)
    d = np.zeros(n, dtype)
    b = np.asarray(np.arange(n), dtype)
    ref = verify.reference_solve(l, d, u, b)
    x = solve(l, d, u, b, pivoting=True, chunk=16)  # interiors of 15 rows
    assert rel_err(x, ref) < RTOL[np.dtype(dtype)]
    disable_the_check(monkeypatch)
    unchecked = np.asarray(solve(l, d, u, b, pivoting=True, chunk=16))
    assert not np.all(np.isfinite(unchecked)) or rel_err(unchecked, ref) > 1e-2
    jax.clear_caches()


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.complex128], ids=lambda d: np.dtype(d).name)
def test_separator_backward_error_matches_numpy(transposed, dtype):
    """The check's bound against the formula in NumPy at the separator rows (the last row of
    each chunk of 7, and row N-1): the residual over ||A|| ||x|| + ||b||, the row sums of |A|
    and the largest |x| and |b| over those rows and their neighbours."""
    P, N, Q, m = 2, 40, 3, 7
    l, d, u, b = indefinite_bands((P, N, Q), dtype)
    x = indefinite_bands((P, N, Q), dtype)[0]
    got = np.asarray(_chunked.separator_backward_error(
        *(jnp.asarray(v) for v in (l, d, u, b, x)), chunk=m, transposed=transposed))
    A = np.zeros((P, Q, N, N), np.complex128)
    i = np.arange(N)
    for p in range(P):
        for q in range(Q):
            A[p, q, i, i] = d[p, :, q]
            A[p, q, i[1:], i[1:] - 1] = l[p, 1:, q]
            A[p, q, i[:-1], i[:-1] + 1] = u[p, :-1, q]
    if transposed:
        A = np.swapaxes(A, -1, -2)
    seps = np.array([6, 13, 20, 27, 34, 39])
    near = np.unique(np.clip(np.concatenate([seps - 1, seps, seps + 1]), 0, N - 1))
    want = np.zeros((P, 1, Q))
    for p in range(P):
        for q in range(Q):
            xs = x[p, :, q].astype(np.complex128)
            residual = np.max(np.abs(b[p, seps, q] - A[p, q, seps] @ xs))
            norm_a = np.max(np.abs(A[p, q, seps]).sum(-1))
            want[p, 0, q] = residual / (norm_a * np.max(np.abs(xs[near]))
                                        + np.max(np.abs(b[p, seps, q])))
    # Bounded by max(||A|| ||x||, ||b||) rather than their sum: within a factor of 2 above it.
    assert np.all(got >= want * (1 - 1e-5)) and np.all(got <= 2 * want * (1 + 1e-5))
    # A non-finite first row (no separator's neighbour) is reported as NaN.
    x[0, 0, 1] = np.inf
    got = np.asarray(_chunked.separator_backward_error(
        *(jnp.asarray(v) for v in (l, d, u, b, x)), chunk=m, transposed=transposed))
    assert np.isnan(got[0, 0, 1]) and np.isfinite(np.delete(got.ravel(), 1)).all()


def test_gradients_of_chunked_pivoted_solves_match_the_sequential_sweep():
    """The gradient runs the transposed chunked pivoted solve (and its check)."""
    l, d, u, b = indefinite_bands((3, 2001), np.float64)

    def loss(l, d, u, b, chunk):
        return jnp.sum(jnp.sin(solve(l, d, u, b, axis=1, pivoting=True, chunk=chunk)))

    grads = jax.grad(loss, argnums=(0, 1, 2, 3))
    for got, want in zip(grads(l, d, u, b, 32), grads(l, d, u, b, 0), strict=True):
        assert rel_err(got, want) < 1e-7


@pytest.mark.parametrize("backend", ["xla", "pallas_interpret"])
def test_composed_backends_chunk_pivoted_solves(backend):
    """The chunk sweeps composed from a backend's plain pivoted kernel (GPU, XLA), with the
    separator rows made identity rows so that no interchange reaches them."""
    l, d, u, b = indefinite_bands((2, 203), np.float64)
    d[:, 20::7] = 0.0  # zero diagonals, some on separator rows
    ref = verify.reference_solve(l, d, u, b, axis=1)
    x = solve(l, d, u, b, axis=1, pivoting=True, chunk=10, backend=backend)
    assert normwise_backward_error(l, d, u, b, x, 1) < 16 * epsilon(np.float64)
    assert rel_err(x, ref) < 1e-9


def test_periodic_pivoted_and_the_tdma_module_take_chunks():
    l, d, u, b = indefinite_bands((3001,), np.float64)
    for periodic in (False, True):
        ref = verify.reference_solve(l, d, u, b, periodic=periodic)
        x = solve(l, d, u, b, periodic=periodic, pivoting=True, chunk=50)
        assert rel_err(x, ref) < 1e-9, periodic
        op = tridiax.Tridiagonal(l, d, u, periodic=periodic)
        assert rel_err(tridiax.TDMA(pivoting=True, chunk=50)(op, b), ref) < 1e-9, periodic


def test_planner_chunks_pivoted_solves_only_while_lanes_are_idle():
    plan = dict(kind="pivoted", backend="native", platform="cpu")
    lanes = _planner.cpu_cores() * 2 * _planner.vector_lanes(np.float32)
    assert _planner.solve_chunk(1, 10**7, 1, np.float32, **plan) > 0
    assert _planner.solve_chunk(max(1, lanes // 4), 10**6, 1, np.float32, **plan) > 0
    assert _planner.solve_chunk(lanes, 10**6, 1, np.float32, **plan) == 0
    # Chunk tiles keep four work rows per lane (1/pivot, U1, U2, y').
    assert _planner.solve_plan("native", "cpu", 1, 10**7, 1, np.float32, kind="pivoted").chunk
