"""solve_tridiagonal against scipy.linalg.solve_banded (tridiax.verify) on every backend."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import RTOL, assert_close, backends, dense_numpy, random_bands

import tridiax
from tridiax import verify
from tridiax._core import planner as _planner
from tridiax._tridiagonal.api import solve

SHAPES_AXES = [
    ((1,), 0),
    ((2,), 0),
    ((3,), -1),
    ((5, 1), 0),
    ((1, 5), -1),
    ((7, 3), 0),
    ((3, 7), -1),
    ((3, 7), 1),
    ((4, 6, 5), 0),
    ((4, 6, 5), 1),
    ((4, 6, 5), 2),
    ((4, 6, 5), -2),
    ((2, 3, 4, 5), 2),
]


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("shape,axis", SHAPES_AXES)
def test_matches_scipy_every_axis(backend, shape, axis):
    args = random_bands(shape, np.float64, seed=len(shape) + axis)
    x = solve(*args, axis=axis, backend=backend)
    assert x.shape == shape and x.dtype == jnp.float64
    assert_close(x, verify.reference_solve(*args, axis=axis), np.float64)


@pytest.mark.parametrize(
    "backend,dtype",
    [(b, t) for t in (np.float32, np.float64, np.complex64, np.complex128) for b in backends(t)],
)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_dtypes(backend, dtype, axis):
    shape = (9, 37, 6)
    args = random_bands(shape, dtype, seed=3)
    x = solve(*(jnp.asarray(a) for a in args), axis=axis, backend=backend)
    assert x.dtype == np.dtype(dtype)
    assert_close(x, verify.reference_solve(*args, axis=axis), dtype)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_accumulates_in_float32(backend, dtype):
    # Rounding the inputs to half precision is the only error: the elimination runs in
    # float32, so the result matches the float64 solve of the rounded inputs to half precision.
    args = [jnp.asarray(a, dtype) for a in random_bands((40, 33), np.float64, seed=5)]
    x = solve(*args, axis=0, backend=backend)
    assert x.dtype == dtype
    exact = verify.reference_solve(*(np.asarray(a, np.float64) for a in args), axis=0)
    assert_close(x, exact, dtype)
    x32 = solve(*(a.astype(jnp.float32) for a in args), axis=0, backend=backend)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(x32.astype(dtype)))


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize(
    "shapes,axis",
    [
        # One matrix shared by every column.
        (((8, 1), (8, 1), (8, 1), (8, 13)), 0),
        # One matrix shared by every row, systems along the last axis.
        (((8,), (8,), (8,), (13, 8)), -1),
        # Constant coefficients (size 1 along the solve axis).
        (((1, 1), (1, 13), (1, 1), (8, 13)), 0),
        # Bands vary over the batch, rhs shared.
        (((8, 13), (8, 13), (8, 13), (8, 1)), 0),
        # Mixed broadcasting inside one batch group (the view materialises that group).
        (((3, 1, 8), (1, 4, 8), (3, 4, 8), (1, 1, 8)), 2),
        (((3, 8, 1, 5), (1, 8, 4, 1), (3, 8, 4, 5), (3, 1, 4, 5)), 1),
    ],
)
def test_broadcasting(backend, shapes, axis):
    args = random_bands(None, np.float64, seed=7, shapes=shapes)
    x = solve(*args, axis=axis, backend=backend)
    assert x.shape == np.broadcast_shapes(*shapes)
    assert_close(x, verify.reference_solve(*args, axis=axis), np.float64)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("batch", [1, 2, 3, 127, 129, 300])
@pytest.mark.parametrize("axis", [0, -1])
def test_batch_not_a_multiple_of_a_block(backend, batch, axis):
    shape = (11, batch) if axis == 0 else (batch, 11)
    args = random_bands(shape, np.float32, seed=batch)
    x = solve(*args, axis=axis, backend=backend)
    assert_close(x, verify.reference_solve(*args, axis=axis), np.float32)


@pytest.mark.parametrize("shape,axis", [((1,), 0), ((5,), 0), ((11, 3), 0), ((3, 11), -1),
                                        ((2, 7, 1), 1)])
@pytest.mark.parametrize("kind", [{}, {"pivoting": True}, {"periodic": True}])
def test_a_block_wider_than_the_systems_is_cut_to_them(shape, axis, kind):
    # A user's Pallas tile larger than the batch on either side (here 4 x 64 over 1 to 3
    # systems) is cut to the systems there are; it used to fail on a store's shape.
    if kind.get("periodic") and shape[axis] < 3:
        return
    backend = "pallas_triton" if "pallas_triton" in backends() else "pallas_interpret"
    args = random_bands(shape, np.float32, seed=len(shape))
    x = solve(*args, axis=axis, backend=backend, block=(4, 64), **kind)
    expected = verify.reference_solve(*args, axis=axis, periodic=kind.get("periodic", False))
    assert_close(x, expected, np.float32)


@pytest.mark.parametrize("backend", backends())
def test_long_systems(backend):
    args = random_bands((2000, 3), np.float64, seed=11)
    x = solve(*args, axis=0, backend=backend)
    assert_close(x, verify.reference_solve(*args, axis=0), np.float64)
    assert verify.relative_residual(*args[:3], x, args[3], axis=0).max() < 1e-14


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
@pytest.mark.parametrize("kind", ["thomas", "pivoted", "periodic"])
def test_long_systems_along_a_leading_axis(dtype, kind):
    # N = 20 000 rows of 40 systems: the native kernel's per-tile scratch cannot stay in cache,
    # so it takes tiles of whole cache lines split over the cores (40 = 32 + a ragged 8, or
    # 16 + 16 + 8), which once fell to one system per tile.
    args = random_bands((20_000, 40), dtype, seed=12)
    sample = np.arange(0, 40, 7)
    for backend in backends(dtype):
        if backend == "pallas_interpret":
            continue  # one program per system column in interpret mode: minutes, no new path
        periodic = kind == "periodic"
        x = solve(*args, axis=0, backend=backend, periodic=periodic, pivoting=kind == "pivoted")
        # The residual through the operator's matrix-vector product (no kernel involved).
        residual = tridiax.Tridiagonal(*args[:3], axis=0, periodic=periodic).mv(x) - args[3]
        assert np.max(np.abs(residual)) < 50 * RTOL[np.dtype(dtype)] * np.max(np.abs(args[3]))
        if not periodic:  # scipy's banded solver, on a sample of the systems
            expected = verify.reference_solve(*(a[:, sample] for a in args), axis=0)
            assert_close(np.asarray(x)[:, sample], expected, dtype, factor=10)


@pytest.mark.parametrize("backend", backends())
def test_ignores_lower_first_and_upper_last(backend):
    lower, diag, upper, rhs = random_bands((6, 4), np.float64, seed=2)
    expected = solve(lower, diag, upper, rhs, axis=0, backend=backend)
    lower[0], upper[-1] = np.nan, np.inf
    x = solve(lower, diag, upper, rhs, axis=0, backend=backend)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(expected))
    # The gradient ignores them too (and is finite).
    grads = jax.grad(lambda *a: jnp.sum(solve(*a, axis=0, backend=backend)), argnums=(0, 1, 2, 3))(
        *(jnp.asarray(a) for a in (lower, diag, upper, rhs)))
    for g in grads:
        assert np.all(np.isfinite(g))
    assert grads[0][0].tolist() == [0.0] * 4 and grads[2][-1].tolist() == [0.0] * 4


@pytest.mark.parametrize("backend", backends())
def test_zero_pivot_only_affects_its_system(backend):
    lower, diag, upper, rhs = random_bands((5, 6), np.float64, seed=4)
    diag[0, 2] = 0.0  # first pivot of system (column) 2 is zero
    diag[3, 4] = lower[3, 4] * upper[2, 4] / diag[2, 4]  # a later pivot is (nearly) zero
    x = np.asarray(solve(lower, diag, upper, rhs, axis=0, backend=backend))
    assert not np.all(np.isfinite(x[:, 2]))
    ok = [0, 1, 3, 5]
    ref = verify.reference_solve(*(a[:, ok] for a in (lower, diag, upper, rhs)), axis=0)
    assert_close(x[:, ok], ref, np.float64)


@pytest.mark.parametrize("backend", backends())
def test_nonfinite_input_stays_in_its_system(backend):
    lower, diag, upper, rhs = random_bands((7, 5), np.float64, seed=8)
    rhs[3, 1] = np.nan
    x = np.asarray(solve(lower, diag, upper, rhs, axis=0, backend=backend))
    assert np.all(np.isnan(x[:, 1]))
    ok = [0, 2, 3, 4]
    ref = verify.reference_solve(*(a[:, ok] for a in (lower, diag, upper, rhs)), axis=0)
    assert_close(x[:, ok], ref, np.float64)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("kind", [{}, {"pivoting": True}, {"periodic": True},
                                  {"periodic": True, "pivoting": True}])
def test_pallas_kernels_solve_complex_systems(dtype, kind):
    # Complex values travel through the Pallas kernels as real and imaginary parts (Triton
    # has no complex type). Not dominant, so the pivoted kinds swap rows; P and Q ragged.
    args = random_bands((5, 11, 3), dtype, seed=21, dominant="pivoting" not in kind)
    x = solve(*args, axis=1, backend="pallas_interpret", **kind)
    periodic = {"periodic": True} if "periodic" in kind else {}
    assert_close(x, verify.reference_solve(*args, axis=1, **periodic), dtype)
    # The default picks a backend that supports it, on every platform.
    public = tridiax.solve_periodic_tridiagonal if periodic else tridiax.solve_tridiagonal
    assert_close(public(*args, axis=1, pivoting="pivoting" in kind),
                 verify.reference_solve(*args, axis=1, **periodic), dtype)


def test_backends_agree_to_rounding():
    args = [jnp.asarray(a) for a in random_bands((33, 70), np.float32, seed=9)]
    results = [np.asarray(solve(*args, axis=1, backend=b)) for b in backends()]
    for r in results[1:]:
        np.testing.assert_allclose(r, results[0], rtol=1e-5, atol=1e-6)


def test_public_function_under_jit_with_lists_and_numpy():
    lower, diag, upper, rhs = random_bands((4, 3), np.float64, seed=1)
    f = jax.jit(tridiax.solve_tridiagonal, static_argnames="axis")
    x = f(lower.tolist(), diag, jnp.asarray(upper), rhs, axis=0)
    assert_close(x, verify.reference_solve(lower, diag, upper, rhs, axis=0), np.float64)


def test_empty_batch():
    x = tridiax.solve_tridiagonal(jnp.ones((4, 0)), jnp.ones((4, 0)), jnp.ones((4, 0)),
                                  jnp.ones((4, 0)), axis=0)
    assert x.shape == (4, 0)


def _program_sizes(n, **settings):
    """Sizes of the lowered solve and its gradient for 4 systems of n rows along axis 0, with
    every number in the text replaced by one letter (shapes and chunk counts vary with n), and
    the total length of long string literals apart (a GPU kernel's serialized IR, whose
    encoding changes a little with the numbers in it)."""
    args = [jax.ShapeDtypeStruct((n, 4), jnp.float32)] * 4

    def f(*a):
        return solve(*a, axis=0, **settings)

    texts = (jax.jit(f).lower(*args).as_text(),
             jax.jit(jax.grad(lambda *a: jnp.sum(f(*a)), argnums=(0, 1, 2, 3))).lower(*args)
             .as_text())
    long_strings = re.compile(r'"[^"]{400,}"')
    return tuple((len(re.sub(r"\d+", "N", long_strings.sub('""', t))),
                  sum(map(len, long_strings.findall(t)))) for t in texts)


def test_compile_time_flat_in_n(monkeypatch):
    # Nothing is unrolled over N: whole systems lower to the same program for every N, up to
    # numbers. Chunked ones add a level of chunking as N grows (a few, on GPU: the reduced
    # system is chunked again while it is long), so 10x the rows may add a level, never the
    # 10x a loop unrolled over N would.
    programs = [_program_sizes(n, chunk=0) for n in (8, 64, 512, 4096)]
    assert len({tuple(text for text, _ in p) for p in programs}) == 1, programs
    for kernels in zip(*((k for _, k in p) for p in programs)):  # per program, across n
        assert max(kernels) <= 1.1 * min(kernels), programs
    # Chunked by the planner (told of a small last-level cache, in which (n, 4) would run
    # whole: `solve_chunk`).
    monkeypatch.setattr(_planner, "cpu_last_cache_bytes", lambda: 1 << 16)
    programs = [_program_sizes(n) for n in (50_000, 500_000, 5_000_000)]
    for smaller, larger in zip(programs, programs[1:]):
        for (text, kernels), (text10, kernels10) in zip(smaller, larger):
            assert text10 <= 2.5 * text and kernels10 <= 2.5 * max(kernels, 1), programs


# Batch-first systems (rows contiguous, the last axis): the native kernel sweeps tiles of
# systems row by row, their rows moved by 8x8 transposes: strided tiles of up to two vectors
# of systems, or, for many short systems (`_planner._rows_by_tiles`), tiles of four vectors.
# Both paths on every machine (the planner's choice forced; a whole tile and 5 systems of
# another), sizes around the vector length (8 or 16 rows) and the transposes' blocks (16
# rows), operands broadcast along either axis, the transposed solve (the gradient w.r.t. rhs is
# A^{-T} x_bar), and matrices that are far from diagonally dominant (pivots near 0). The paths
# and the sizes are the native kernel's; the other backends run one path (5 systems) at odd
# sizes.
BATCH_FIRST_SIZES = (8, 15, 16, 17, 31, 32, 33, 100, 1001)


def _batch_first_cases(paths):
    """(backend, path, n): every path and size for the native kernel, else one path, odd n."""
    return [(b, path, n) for b in backends()
            for path in (paths if b == "native" else paths[:1])
            for n in (BATCH_FIRST_SIZES if b == "native" else (15, 33, 1001))]


@pytest.mark.parametrize("backend, path, n", _batch_first_cases(("strided", "tiles")))
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shared", ["none", "lower_by_all", "diag_per_system", "upper_scalar"])
def test_batch_first_rows_every_size_broadcast_and_transposed(backend, path, n, dtype, shared,
                                                              monkeypatch):
    monkeypatch.setattr(_planner, "_rows_by_tiles", lambda P, N, dtype: path == "tiles")
    P = 5 if path == "strided" else _planner.ROWS_TILE_VECTORS * _planner.vector_lanes(dtype) + 5
    shapes = [(P, n)] * 4
    shapes[{"none": 0, "lower_by_all": 0, "diag_per_system": 1, "upper_scalar": 2}[shared]] = {
        "none": (P, n), "lower_by_all": (1, n), "diag_per_system": (P, 1), "upper_scalar": (1, 1),
    }[shared]
    bands = random_bands((P, n), np.float64, seed=n, shapes=shapes)
    bands[1] = bands[1] * 1e3 if shared == "none" else bands[1]  # large entries: rescaled
    args = [jnp.asarray(a, dtype) for a in bands]
    if shared == "none":  # lower[0] and upper[-1] are ignored whatever they hold
        args[0] = args[0].at[:, 0].set(jnp.nan)
        args[2] = args[2].at[:, -1].set(jnp.inf)
    x, vjp = jax.vjp(lambda *v: solve(*v, axis=-1, backend=backend), *args)
    assert_close(x, verify.reference_solve(*bands, axis=-1), dtype)
    cotangent = np.random.default_rng(n).standard_normal((P, n))
    matrices = dense_numpy(*bands[:3], axis=-1)
    want = np.linalg.solve(np.swapaxes(matrices, -1, -2), cotangent[..., None])[..., 0]
    assert_close(vjp(jnp.asarray(cotangent, dtype))[3], want, dtype)


# Factored solves of batch-first systems: every size around the vector length, factors shared
# by every system or of one system each, and the transposed solve behind the gradient w.r.t. rhs.
@pytest.mark.parametrize("backend, n", [(b, n) for b, _, n in _batch_first_cases(("strided",))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shared", [False, True], ids=["per_system", "shared"])
def test_batch_first_factored_every_size_and_transposed(backend, n, dtype, shared):
    P = 5
    bands = random_bands((P, n), np.float64, seed=n + 1)
    if shared:
        bands[:3] = [v[:1] for v in bands[:3]]
    lower, diag, upper, rhs = (jnp.asarray(a, dtype) for a in bands)
    factors = tridiax.TDMA(backend=backend).factor(tridiax.Tridiagonal(lower, diag, upper))
    x, vjp = jax.vjp(factors.solve, rhs)
    assert_close(x, verify.reference_solve(*bands, axis=-1), dtype)
    cotangent = np.random.default_rng(n).standard_normal((P, n))
    matrices = np.broadcast_to(dense_numpy(*bands[:3], axis=-1), (P, n, n))
    want = np.linalg.solve(np.swapaxes(matrices, -1, -2), cotangent[..., None])[..., 0]
    assert_close(vjp(jnp.asarray(cotangent, dtype))[0], want, dtype)


@pytest.mark.parametrize("backend", backends())
def test_batch_first_rows_not_dominant_match_the_row_sweep(backend):
    # Symmetric positive definite but not diagonally dominant, and an indefinite matrix whose
    # leading minors stay away from zero: Thomas without pivoting works; so must every tile.
    rng = np.random.default_rng(7)
    n = 200
    lower = rng.uniform(-1, 1, (4, n))
    upper = np.roll(lower, -1, axis=-1)
    diag = np.abs(lower) + np.abs(upper) - 0.3 + rng.uniform(0, 0.1, (4, n)) + 1.0
    diag[2] = np.where(np.arange(n) % 2 == 0, 4.0, -4.0)
    rhs = rng.standard_normal((4, n))
    got = solve(*(jnp.asarray(v) for v in (lower, diag, upper, rhs)), axis=-1, backend=backend)
    want = verify.reference_solve(lower, diag, upper, rhs, axis=-1)
    assert_close(got, want, np.float64, factor=100)
