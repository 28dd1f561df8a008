"""What every backend of solve_tridiagonal must do, as test classes each backend's module
subclasses (`class TestNative(SolveContract): backend = "native"`).

`SolveContract` holds the tests of a backend's solve: against scipy.linalg.solve_banded
(tridiax.verify) along every axis, in every dtype the backend runs, in half precision
(accumulated in float32), with broadcast operands, batches that are no multiple of a kernel's
block, long systems (along either axis), lower[0] and upper[-1] ignored (gradient included),
a zero pivot or a non-finite input confined to its own system, and batch-first systems (rows
contiguous) at sizes around the vector length, broadcast, transposed and far from diagonally
dominant. `PallasSolveContract` adds what the Pallas Triton kernels (compiled, or in
interpret mode) must also do: cut a user's tile to the systems there are, and solve complex
systems as real and imaginary parts.

A backend runs where `helpers.backends()` lists it: elsewhere its class is not collected (no
test is reported for it, skipped or otherwise), and each test's dtypes are those the backend
runs (`runs`), so a backend without complex or 64-bit types has no case for them; a test over
no dtypes runs in the widest real dtype the backend runs (`wide`: float64, or float32 where the
backend has no float64). A backend chooses its own batch-first paths and sizes
(`batch_first_paths`, `batch_first_sizes`).

Not collected by pytest itself (its name does not match test_*.py, and its classes' names do
not start with Test).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import RTOL, BackendContract, assert_close, dense_numpy, over_dtypes, random_bands

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

# Sizes around the vector length (8 or 16 rows) and the native kernel's transposes' blocks (16
# rows), for the backends whose batch-first path depends on them.
BATCH_FIRST_SIZES = (8, 15, 16, 17, 31, 32, 33, 100, 1001)


class SolveContract(BackendContract):
    """The tests every backend's solve_tridiagonal passes; a subclass sets `backend`."""

    # Batch-first systems (the last axis): the planner's paths this backend's kernel has
    # (`_planner._rows_by_tiles` forced: "strided" tiles of up to two vectors of systems,
    # "tiles" of four vectors), and the numbers of rows it is tried at.
    batch_first_paths: tuple[str, ...] = ("strided",)
    batch_first_sizes: tuple[int, ...] = (15, 33, 1001)

    def pytest_generate_tests(self, metafunc):
        """The cases that depend on the backend: `dtype` over the test's `over_dtypes` this
        backend runs; `path, n` over its batch-first paths and sizes; `n` alone over the
        sizes."""
        super().pytest_generate_tests(metafunc)
        if "path" in metafunc.fixturenames:
            metafunc.parametrize("path, n", [(p, n) for p in self.batch_first_paths
                                             for n in self.batch_first_sizes])
        elif "n" in metafunc.fixturenames:
            metafunc.parametrize("n", self.batch_first_sizes)

    @pytest.mark.parametrize("shape,axis", SHAPES_AXES)
    def test_matches_scipy_every_axis(self, shape, axis):
        args = random_bands(shape, self.wide, seed=len(shape) + axis)
        x = solve(*args, axis=axis, backend=self.backend)
        assert x.shape == shape and x.dtype == self.wide
        assert_close(x, verify.reference_solve(*args, axis=axis), self.wide)

    @over_dtypes(np.float32, np.float64, np.complex64, np.complex128)
    @pytest.mark.parametrize("axis", [0, 1, -1])
    def test_dtypes(self, dtype, axis):
        shape = (9, 37, 6)
        args = random_bands(shape, dtype, seed=3)
        x = solve(*(jnp.asarray(a) for a in args), axis=axis, backend=self.backend)
        assert x.dtype == np.dtype(dtype)
        assert_close(x, verify.reference_solve(*args, axis=axis), dtype)

    @over_dtypes(jnp.float16, jnp.bfloat16)
    def test_half_precision_accumulates_in_float32(self, dtype):
        # Rounding the inputs to half precision is the only error: the elimination runs in
        # float32, so the result matches the float64 solve of the rounded inputs to half
        # precision.
        args = [jnp.asarray(a, dtype) for a in random_bands((40, 33), np.float64, seed=5)]
        x = solve(*args, axis=0, backend=self.backend)
        assert x.dtype == dtype
        exact = verify.reference_solve(*(np.asarray(a, np.float64) for a in args), axis=0)
        assert_close(x, exact, dtype)
        x32 = solve(*(a.astype(jnp.float32) for a in args), axis=0, backend=self.backend)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(x32.astype(dtype)))

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
    def test_broadcasting(self, shapes, axis):
        args = random_bands(None, self.wide, seed=7, shapes=shapes)
        x = solve(*args, axis=axis, backend=self.backend)
        assert x.shape == np.broadcast_shapes(*shapes)
        assert_close(x, verify.reference_solve(*args, axis=axis), self.wide)

    @pytest.mark.parametrize("batch", [1, 2, 3, 127, 129, 300])
    @pytest.mark.parametrize("axis", [0, -1])
    def test_batch_not_a_multiple_of_a_block(self, batch, axis):
        shape = (11, batch) if axis == 0 else (batch, 11)
        args = random_bands(shape, np.float32, seed=batch)
        x = solve(*args, axis=axis, backend=self.backend)
        assert_close(x, verify.reference_solve(*args, axis=axis), np.float32)

    def test_long_systems(self):
        args = random_bands((2000, 3), self.wide, seed=11)
        x = solve(*args, axis=0, backend=self.backend)
        assert_close(x, verify.reference_solve(*args, axis=0), self.wide)
        # A backward error of about 45 eps (1e-14 in float64).
        bound = 1e-14 * np.finfo(self.wide).eps / np.finfo(np.float64).eps
        assert verify.relative_residual(*args[:3], x, args[3], axis=0).max() < bound

    @over_dtypes(np.float32, np.float64, np.complex128)
    @pytest.mark.parametrize("kind", ["thomas", "pivoted", "periodic"])
    def test_long_systems_along_a_leading_axis(self, dtype, kind):
        # N = 20 000 rows of 40 systems: the native kernel's per-tile scratch cannot stay in
        # cache, so it takes tiles of whole cache lines split over the cores (40 = 32 + a
        # ragged 8, or 16 + 16 + 8), which once fell to one system per tile.
        args = random_bands((20_000, 40), dtype, seed=12)
        sample = np.arange(0, 40, 7)
        periodic = kind == "periodic"
        x = solve(*args, axis=0, backend=self.backend, periodic=periodic,
                  pivoting=kind == "pivoted")
        # The residual through the operator's matrix-vector product (no kernel involved).
        residual = tridiax.Tridiagonal(*args[:3], axis=0, periodic=periodic).mv(x) - args[3]
        assert np.max(np.abs(residual)) < 50 * RTOL[np.dtype(dtype)] * np.max(np.abs(args[3]))
        if not periodic:  # scipy's banded solver, on a sample of the systems
            expected = verify.reference_solve(*(a[:, sample] for a in args), axis=0)
            assert_close(np.asarray(x)[:, sample], expected, dtype, factor=10)

    def test_ignores_lower_first_and_upper_last(self):
        backend = self.backend
        lower, diag, upper, rhs = random_bands((6, 4), self.wide, seed=2)
        expected = solve(lower, diag, upper, rhs, axis=0, backend=backend)
        lower[0], upper[-1] = np.nan, np.inf
        x = solve(lower, diag, upper, rhs, axis=0, backend=backend)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(expected))
        # The gradient ignores them too (and is finite).
        grads = jax.grad(lambda *a: jnp.sum(solve(*a, axis=0, backend=backend)),
                         argnums=(0, 1, 2, 3))(*(jnp.asarray(a) for a in (lower, diag, upper, rhs)))
        for g in grads:
            assert np.all(np.isfinite(g))
        assert grads[0][0].tolist() == [0.0] * 4 and grads[2][-1].tolist() == [0.0] * 4

    def test_zero_pivot_only_affects_its_system(self):
        lower, diag, upper, rhs = random_bands((5, 6), self.wide, seed=4)
        diag[0, 2] = 0.0  # first pivot of system (column) 2 is zero
        diag[3, 4] = lower[3, 4] * upper[2, 4] / diag[2, 4]  # a later pivot is (nearly) zero
        x = np.asarray(solve(lower, diag, upper, rhs, axis=0, backend=self.backend))
        assert not np.all(np.isfinite(x[:, 2]))
        ok = [0, 1, 3, 5]
        ref = verify.reference_solve(*(a[:, ok] for a in (lower, diag, upper, rhs)), axis=0)
        assert_close(x[:, ok], ref, self.wide)

    def test_nonfinite_input_stays_in_its_system(self):
        lower, diag, upper, rhs = random_bands((7, 5), self.wide, seed=8)
        rhs[3, 1] = np.nan
        x = np.asarray(solve(lower, diag, upper, rhs, axis=0, backend=self.backend))
        assert np.all(np.isnan(x[:, 1]))
        ok = [0, 2, 3, 4]
        ref = verify.reference_solve(*(a[:, ok] for a in (lower, diag, upper, rhs)), axis=0)
        assert_close(x[:, ok], ref, self.wide)

    # Batch-first systems (rows contiguous, the last axis): every path and size the backend
    # has (a whole tile and 5 systems of another), operands broadcast along either axis, the
    # transposed solve (the gradient w.r.t. rhs is A^{-T} x_bar), and matrices far from
    # diagonally dominant (pivots near 0).
    @over_dtypes(np.float32, np.float64)
    @pytest.mark.parametrize("shared", ["none", "lower_by_all", "diag_per_system",
                                        "upper_scalar"])
    def test_batch_first_rows_every_size_broadcast_and_transposed(self, path, n, dtype, shared,
                                                                  monkeypatch):
        monkeypatch.setattr(_planner, "_rows_by_tiles", lambda P, N, dtype: path == "tiles")
        P = (5 if path == "strided"
             else _planner.ROWS_TILE_VECTORS * _planner.vector_lanes(dtype) + 5)
        shapes = [(P, n)] * 4
        shapes[{"none": 0, "lower_by_all": 0, "diag_per_system": 1, "upper_scalar": 2}[shared]] = {
            "none": (P, n), "lower_by_all": (1, n), "diag_per_system": (P, 1),
            "upper_scalar": (1, 1),
        }[shared]
        bands = random_bands((P, n), np.float64, seed=n, shapes=shapes)
        bands[1] = bands[1] * 1e3 if shared == "none" else bands[1]  # large entries: rescaled
        args = [jnp.asarray(a, dtype) for a in bands]
        if shared == "none":  # lower[0] and upper[-1] are ignored whatever they hold
            args[0] = args[0].at[:, 0].set(jnp.nan)
            args[2] = args[2].at[:, -1].set(jnp.inf)
        x, vjp = jax.vjp(lambda *v: solve(*v, axis=-1, backend=self.backend), *args)
        assert_close(x, verify.reference_solve(*bands, axis=-1), dtype)
        cotangent = np.random.default_rng(n).standard_normal((P, n))
        matrices = dense_numpy(*bands[:3], axis=-1)
        want = np.linalg.solve(np.swapaxes(matrices, -1, -2), cotangent[..., None])[..., 0]
        assert_close(vjp(jnp.asarray(cotangent, dtype))[3], want, dtype)

    # Factored solves of batch-first systems: every size, factors shared by every system or of
    # one system each, and the transposed solve behind the gradient w.r.t. rhs.
    @over_dtypes(np.float32, np.float64)
    @pytest.mark.parametrize("shared", [False, True], ids=["per_system", "shared"])
    def test_batch_first_factored_every_size_and_transposed(self, n, dtype, shared):
        P = 5
        bands = random_bands((P, n), np.float64, seed=n + 1)
        if shared:
            bands[:3] = [v[:1] for v in bands[:3]]
        lower, diag, upper, rhs = (jnp.asarray(a, dtype) for a in bands)
        factors = tridiax.TDMA(backend=self.backend).factor(tridiax.Tridiagonal(lower, diag, upper))
        x, vjp = jax.vjp(factors.solve, rhs)
        assert_close(x, verify.reference_solve(*bands, axis=-1), dtype)
        cotangent = np.random.default_rng(n).standard_normal((P, n))
        matrices = np.broadcast_to(dense_numpy(*bands[:3], axis=-1), (P, n, n))
        want = np.linalg.solve(np.swapaxes(matrices, -1, -2), cotangent[..., None])[..., 0]
        assert_close(vjp(jnp.asarray(cotangent, dtype))[0], want, dtype)

    def test_batch_first_rows_not_dominant_match_the_row_sweep(self):
        # Symmetric positive definite but not diagonally dominant, and an indefinite matrix
        # whose leading minors stay away from zero: Thomas without pivoting works; so must
        # every tile.
        rng = np.random.default_rng(7)
        n = 200
        lower = rng.uniform(-1, 1, (4, n))
        upper = np.roll(lower, -1, axis=-1)
        diag = np.abs(lower) + np.abs(upper) - 0.3 + rng.uniform(0, 0.1, (4, n)) + 1.0
        diag[2] = np.where(np.arange(n) % 2 == 0, 4.0, -4.0)
        rhs = rng.standard_normal((4, n))
        bands = [v.astype(self.wide) for v in (lower, diag, upper, rhs)]
        got = solve(*(jnp.asarray(v) for v in bands), axis=-1, backend=self.backend)
        assert got.dtype == self.wide
        want = verify.reference_solve(*bands, axis=-1)
        assert_close(got, want, self.wide, factor=100)


class PallasSolveContract(SolveContract):
    """The contract, and what the Pallas Triton kernels (compiled or interpreted) must also
    do."""

    @pytest.mark.parametrize("shape,axis", [((1,), 0), ((5,), 0), ((11, 3), 0), ((3, 11), -1),
                                            ((2, 7, 1), 1)])
    @pytest.mark.parametrize("kind", [{}, {"pivoting": True}, {"periodic": True}])
    def test_a_block_wider_than_the_systems_is_cut_to_them(self, shape, axis, kind):
        # A user's tile larger than the batch on either side (here 4 x 64 over 1 to 3
        # systems) is cut to the systems there are; it used to fail on a store's shape.
        if kind.get("periodic") and shape[axis] < 3:
            return
        args = random_bands(shape, np.float32, seed=len(shape))
        x = solve(*args, axis=axis, backend=self.backend, block=(4, 64), **kind)
        expected = verify.reference_solve(*args, axis=axis, periodic=kind.get("periodic", False))
        assert_close(x, expected, np.float32)

    @over_dtypes(np.complex64, np.complex128)
    @pytest.mark.parametrize("kind", [{}, {"pivoting": True}, {"periodic": True},
                                      {"periodic": True, "pivoting": True}])
    def test_solves_complex_systems_as_real_and_imaginary_parts(self, dtype, kind):
        # Complex values travel through the kernels as real and imaginary parts (Triton has
        # no complex type). Not dominant, so the pivoted kinds swap rows; P and Q ragged.
        args = random_bands((5, 11, 3), dtype, seed=21, dominant="pivoting" not in kind)
        x = solve(*args, axis=1, backend=self.backend, **kind)
        periodic = {"periodic": True} if "periodic" in kind else {}
        assert_close(x, verify.reference_solve(*args, axis=1, **periodic), dtype)
        # The default picks a backend that supports it, on every platform.
        public = tridiax.solve_periodic_tridiagonal if periodic else tridiax.solve_tridiagonal
        assert_close(public(*args, axis=1, pivoting="pivoting" in kind),
                     verify.reference_solve(*args, axis=1, **periodic), dtype)
