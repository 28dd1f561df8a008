"""Sweeps by tiles of rows (`_pallas/row_tiles.py`), in Pallas's interpret mode: the plain
solve and linear recurrences give the same answer, bit for bit, as the row kernels they
replace (the same operations in the same order), in both orientations (batch-first systems
read in place; the (N, B) layout k rows at a time), and are as accurate as the sequential
sweep, at every awkward size (2-3 rows, a tile, a tile plus one, systems not filling a
program), transposed, reversed, shifted, with broadcast operands, in every real dtype; through
the public functions with gradients; the planner reads batch-first systems in place (no
transposes), and the Triton IR masks every access that can run past the arrays.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, numpy_loop, random_bands, triton_kernels

import tridiax
from tridiax import verify
from tridiax._core import planner as _planner
from tridiax._pallas import row_tiles as _pallas_rows
from tridiax._pallas.tiles import Tiles
from tridiax._recurrence import pallas_triton as _pallas_recurrence
from tridiax._recurrence.api import recurrence
from tridiax._tridiagonal import pallas_triton as _pallas_thomas
from tridiax._tridiagonal.api import solve

# (systems, rows): 2 and 3 rows (tiles of 2), a tile and a tile plus one (the last tile
# overlapping the one before), 33 systems (a program's 32 and one more), many tiles.
SIZES = [(2, 2), (3, 3), (33, 16), (7, 17), (5, 100), (64, 8)]
DTYPES = ["float32", "float64", "bfloat16"]


def _bands(P, N, dtype, seed=0, shapes=None):
    shapes = shapes or [(P, N, 1)] * 4
    return [jnp.asarray(x, dtype) for x in random_bands((P, N, 1), np.float64, seed=seed,
                                                        shapes=shapes)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("P, N", SIZES)
def test_rows_kernel_is_the_row_kernel_bitwise(P, N, transposed, dtype):
    l, d, u, b = _bands(P, N, dtype, seed=P * 100 + N)
    assert _pallas_rows.applies(P, N, 1, jnp.dtype(dtype), kind="thomas")
    kw = dict(transposed=transposed, out_dtype=jnp.dtype(dtype), interpret=True)
    tiles = _pallas_rows.solve_pnq(l, d, u, b, **kw)
    rows = _pallas_thomas.solve_pnq(l, d, u, b, tiles=Tiles.default(P, 1), **kw)
    assert tiles.shape == (P, N, 1) and tiles.dtype == jnp.dtype(dtype)
    np.testing.assert_array_equal(np.asarray(tiles, np.float64), np.asarray(rows, np.float64))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("P, N", [(3, 3), (33, 16), (5, 100)])
def test_rows_kernel_against_the_sequential_sweep(P, N, transposed, dtype):
    l, d, u, b = (np.asarray(x) for x in _bands(P, N, dtype, seed=N))
    x = _pallas_rows.solve_pnq(*map(jnp.asarray, (l, d, u, b)), transposed=transposed,
                               out_dtype=np.dtype(dtype), interpret=True)
    if transposed:  # the transposed matrix's bands: sub[i] = u[i-1], sup[i] = l[i+1]
        l, u = np.roll(u, 1, axis=1), np.roll(l, -1, axis=1)
    reference = verify.sequential_solve(l, d, u, b, axis=1, dtype=np.dtype(dtype))
    exact = verify.sequential_solve(l, d, u, b, axis=1, dtype=np.longdouble)
    sweep_error = np.max(np.abs(reference - exact)) / np.max(np.abs(exact))
    error = np.max(np.abs(np.asarray(x, np.longdouble) - exact)) / np.max(np.abs(exact))
    assert error <= max(2 * sweep_error, np.finfo(dtype).eps), (error, sweep_error)


@pytest.mark.parametrize("transposed", [False, True])
def test_broadcast_operands(transposed):
    P, N = 19, 37
    shapes = [(1, N, 1), (P, 1, 1), (P, N, 1), (P, N, 1)]
    l, d, u, b = _bands(P, N, "float32", seed=3, shapes=shapes)
    kw = dict(transposed=transposed, out_dtype=jnp.dtype("float32"), interpret=True)
    x = _pallas_rows.solve_pnq(l, d, u, b, **kw)
    full = [jnp.broadcast_to(v, (P, N, 1)) for v in (l, d, u, b)]
    np.testing.assert_array_equal(x, _pallas_thomas.solve_pnq(*full, tiles=Tiles.default(P, 1),
                                                              **kw))


def test_rows_outside_the_matrix_are_never_read():
    # lower[0] and upper[N-1] lie outside the matrix: inf there must not reach the answer.
    P, N = 5, 21
    l, d, u, b = _bands(P, N, "float32", seed=4)
    l, u = l.at[:, 0].set(jnp.inf), u.at[:, -1].set(jnp.nan)
    x = _pallas_rows.solve_pnq(l, d, u, b, transposed=False, out_dtype=jnp.dtype("float32"),
                               interpret=True)
    expected = verify.sequential_solve(*(np.asarray(v) for v in (l, d, u, b)), axis=1,
                                       dtype=np.float64)
    assert np.all(np.isfinite(x))
    assert_close(x, expected, np.dtype("float32"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_public_solve_and_gradients(dtype):
    """The (B, N) layout solved along its last axis goes through this kernel in interpret
    mode; the answer and every band's gradient match a dense solve."""
    B, N = 37, 23
    lower, diag, upper, rhs = (jnp.asarray(x, dtype) for x in random_bands((B, N), seed=7))

    def loss(*bands):
        return jnp.sum(solve(*bands, axis=-1, backend="pallas_interpret").astype(jnp.float32) ** 2)

    def dense_loss(*bands):
        lo, di, up, r = (v.astype(jnp.float32) for v in bands)
        A = (di[:, :, None] * jnp.eye(N) + lo[:, :, None] * jnp.eye(N, k=-1)
             + up[:, :, None] * jnp.eye(N, k=1))  # row i: lower[i], diag[i], upper[i]
        return jnp.sum(jnp.linalg.solve(A, r[..., None])[..., 0] ** 2)

    x = solve(lower, diag, upper, rhs, axis=-1, backend="pallas_interpret")
    x_ref = verify.reference_solve(*(np.asarray(v, np.float64) for v in (lower, diag, upper, rhs)),
                                   axis=-1)
    assert_close(x, x_ref, jnp.dtype(dtype))
    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(lower, diag, upper, rhs)
    dense = jax.grad(dense_loss, argnums=(0, 1, 2, 3))(lower, diag, upper, rhs)
    for g, e in zip(grads, dense, strict=True):
        assert_close(np.asarray(g, np.float32), e, jnp.dtype(dtype), factor=4)


def test_planner_reads_batch_first_plain_systems_in_place():
    kw = dict(backend="pallas_interpret", N=100)
    assert not _planner.gpu_columns(1000, 1, jnp.float32, kind="thomas", **kw)
    for kind in ("pivoted", "periodic", "factored"):  # the row kernel's kinds: columns
        assert _planner.gpu_columns(1000, 1, jnp.float32, kind=kind, **kw)
    assert _planner.gpu_columns(1000, 1, jnp.float32, **kw)  # recurrences, factorizations
    assert _planner.gpu_columns(1000, 1, jnp.complex64, kind="thomas", **kw)
    assert not _planner.gpu_columns(1000, 1, jnp.float32, kind="thomas", backend="xla", N=100)


def test_cuda_lowering_masks_what_can_run_past():
    """Lowered for CUDA: the (B, N) solve is one tiles-of-rows kernel and no transposes; its
    accesses are (systems, rows) tiles, masked where the systems do not fill the last program
    (37 systems, tiles of 32) and unmasked where they do (64)."""
    for B, masked in ((37, True), (64, False)):
        specs = [jax.ShapeDtypeStruct((B, 50), jnp.float32)] * 4
        lowered = jax.jit(lambda *a: tridiax.solve_tridiagonal(*a, axis=-1)).trace(
            *specs).lower(lowering_platforms=("cuda",))
        assert "transpose" not in lowered.as_text()
        [kernel] = triton_kernels(lowered)
        loads = re.findall(r"tt\.load (%[^\n]*?) : tensor<(\d+)x(\d+)x", kernel)
        assert loads and all((int(p), int(k)) in ((32, 16), (32, 1)) for _, p, k in loads)
        stores = re.findall(r"tt\.store (%\w+), (%\w+)(, %\w+)? :", kernel)
        assert stores and all(mask for _, _, mask in stores)  # the last tile's rows: masked
        # Loads of the operands (a store's own load of what it replaces aside).
        stored = {ptr for ptr, _, _ in stores}
        operands = [args for args, _, _ in loads if args.split(",")[0] not in stored]
        assert operands and all(("," in args) == masked for args in operands)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("P, N, Q", [(1, 2, 64), (1, 17, 100), (2, 33, 64), (1, 100, 130)])
def test_tiles_of_rows_along_q_are_the_row_kernel_bitwise(P, N, Q, transposed, dtype):
    """The (N, B) layout: tiles of k rows of 64 systems side by side (ragged 100 and 130)."""
    l, d, u, b = (jnp.asarray(x, dtype) for x in random_bands((P, N, Q), seed=N + Q))
    assert _pallas_rows.orientation(P, N, Q, jnp.dtype(dtype)) == "q"
    kw = dict(transposed=transposed, out_dtype=jnp.dtype(dtype), interpret=True)
    np.testing.assert_array_equal(
        _pallas_thomas.solve_pnq(l, d, u, b, **kw),
        _pallas_thomas.solve_pnq(l, d, u, b, tiles=Tiles.default(P, Q), **kw))


@pytest.mark.parametrize("P, T, Q", [(5, 2, 1), (33, 17, 1), (1, 40, 1), (1, 3, 64),
                                     (2, 37, 100)])
@pytest.mark.parametrize("reverse, shifted, final_only, activation", [
    (False, False, False, None), (True, True, False, None), (False, True, True, jnp.tanh),
    (True, False, True, jnp.tanh)])
def test_recurrence_tiles_are_the_row_kernel_bitwise(P, T, Q, reverse, shifted, final_only,
                                                     activation):
    rng = np.random.default_rng(P * T * Q)
    a = jnp.asarray(rng.uniform(0.5, 1, (P, T, Q)), jnp.float32)
    x = jnp.asarray(rng.standard_normal((P, T, Q)), jnp.float32)
    h0 = jnp.asarray(rng.standard_normal((P, 1, Q)), jnp.float32)
    assert _pallas_rows.recurrence_applies(P, T, Q, jnp.dtype("float32"))
    kw = dict(reverse=reverse, shifted=shifted, activation=activation, final_only=final_only,
              out_dtype=jnp.dtype("float32"), interpret=True)
    h = _pallas_recurrence.recurrence_pnq(a, x, h0, **kw)
    np.testing.assert_array_equal(
        h, _pallas_recurrence.recurrence_pnq(a, x, h0, tiles=Tiles.default(P, Q), **kw))


@pytest.mark.parametrize("shape, axis", [((37, 50), -1), ((50, 70), 0)])
def test_public_recurrence_and_gradients(shape, axis):
    """Batch-first (37 sequences of 50 steps, in place) and the (T, F) layout (70 features:
    a ragged tile of 64): the linear recurrence against a NumPy loop, its gradients against
    those of lax.scan."""
    rng = np.random.default_rng(11)
    a = jnp.asarray(rng.uniform(0.5, 1, shape), jnp.float32)
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    h = recurrence(a, x, axis=axis, backend="pallas_interpret")
    expected = numpy_loop(np.asarray(a, np.float64), np.asarray(x, np.float64), axis=axis)
    assert_close(h, expected, np.dtype("float32"))

    def scan(a, x):
        a_t, x_t = jnp.moveaxis(a, axis, 0), jnp.moveaxis(x, axis, 0)
        _, hs = jax.lax.scan(lambda c, ax: (ax[0] * c + ax[1],) * 2, jnp.zeros_like(x_t[0]),
                             (a_t, x_t))
        return jnp.moveaxis(hs, 0, axis)

    def loss(f):
        return lambda a, x: jnp.sum(jnp.sin(f(a, x)))

    grads = jax.grad(loss(lambda a, x: recurrence(a, x, axis=axis, backend="pallas_interpret")),
                     argnums=(0, 1))(a, x)
    expected = jax.grad(loss(scan), argnums=(0, 1))(a, x)
    for g, e in zip(grads, expected, strict=True):
        assert_close(g, np.asarray(e), np.dtype("float32"), factor=4)
