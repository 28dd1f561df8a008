"""solve_block_tridiagonal and solveh_block_tridiagonal against SciPy (tridiax.verify) and dense
JAX solves: sizes, axes, dtypes, broadcasting, several right-hand sides, pivoting, breakdowns,
gradients, jvp, vmap and the errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import RTOL, assert_close, backends, equations, program_shape
from jax.test_util import check_grads

import tridiax
from tridiax._block import api as _block
from tridiax._block.primitive import block_solve_p
from tridiax.verify import reference_solve_block_tridiagonal

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


def random_blocks(systems, k, dtype=np.float64, *, seed=0, dominant=True, m=None,
                  shapes=None):
    """lower, diag, upper (systems + (k, k)) with NaN in lower[0] and upper[N-1] along the
    last systems axis, and rhs (systems + (k,) or + (k, m)). `dominant`: block diagonally
    dominant, so every kind is accurate."""
    rng = np.random.default_rng(seed)
    complex_ = np.issubdtype(dtype, np.complexfloating)

    def draw(shape):
        v = rng.uniform(-1, 1, shape)
        return v + 1j * rng.uniform(-1, 1, shape) if complex_ else v

    shapes = shapes or {}
    lower, diag, upper = (draw(shapes.get(n, systems) + (k, k)) for n in ("lower", "diag",
                                                                          "upper"))
    if dominant:
        diag = diag + 3 * k * np.eye(k)
    rhs = draw(shapes.get("rhs", systems) + ((k,) if m is None else (k, m)))
    return [v.astype(dtype) for v in (lower, diag, upper, rhs)]


def with_nan_ends(lower, upper, axis=-1):
    """lower[0] and upper[N-1] (never read) set to NaN along `axis` of the systems."""
    lower, upper = np.array(lower), np.array(upper)
    axis = axis % (lower.ndim - 2)
    index = [slice(None)] * lower.ndim
    index[axis] = 0
    lower[tuple(index)] = np.nan
    index[axis] = -1
    upper[tuple(index)] = np.nan
    return lower, upper


def dense_matrices(lower, diag, upper):
    """(..., N k, N k) matrices (jnp) of blocks (..., N, k, k) along the axis before the blocks."""
    n, k = diag.shape[-3], diag.shape[-1]
    shape = jnp.broadcast_shapes(lower.shape, diag.shape, upper.shape)[:-3]
    out = jnp.zeros(shape + (n * k, n * k), jnp.result_type(lower, diag, upper))
    for i in range(n):
        rows = slice(i * k, (i + 1) * k)
        out = out.at[..., rows, rows].set(jnp.broadcast_to(diag[..., i, :, :], shape + (k, k)))
        if i > 0:
            out = out.at[..., rows, (i - 1) * k:i * k].set(
                jnp.broadcast_to(lower[..., i, :, :], shape + (k, k)))
        if i < n - 1:
            out = out.at[..., rows, (i + 1) * k:(i + 2) * k].set(
                jnp.broadcast_to(upper[..., i, :, :], shape + (k, k)))
    return out


def dense_solve(lower, diag, upper, rhs):
    """x of (..., N, k) right-hand sides, blocks along the axis before the blocks (jnp)."""
    a = dense_matrices(lower, diag, upper)
    n, k = diag.shape[-3], diag.shape[-1]
    b = rhs.reshape(rhs.shape[:-2] + (n * k, 1))
    return jnp.linalg.solve(a, jnp.broadcast_to(b, a.shape[:-2] + b.shape[-2:]))[..., 0].reshape(
        a.shape[:-2] + (n, k))


SIZES = [(k, n) for k in (1, 2, 3, 4, 8) for n in (1, 2, 3, 7)] + [(16, 1), (16, 5)]
# Interpret mode compiles the Pallas kernel's unrolled k x k elimination slowly (k = 8 takes
# 20-40 s): it runs k <= 4 here, and tests/block/test_block_pallas.py covers k = 8.
CASES = [(backend, k, n) for backend in backends(op="block") for k, n in SIZES
         if backend != "pallas_interpret" or k <= 4]


@pytest.mark.parametrize(("backend", "k", "n"), CASES)
@pytest.mark.parametrize("pivoting", [True, False])
def test_matches_scipy_for_every_block_size(backend, k, n, pivoting):
    lower, diag, upper, rhs = random_blocks((3, n), k, seed=k * 10 + n)
    expected = reference_solve_block_tridiagonal(lower, diag, upper, rhs)
    lower, upper = with_nan_ends(lower, upper)
    x = _block.solve(lower, diag, upper, rhs, pivoting=pivoting, backend=backend)
    assert x.shape == (3, n, k)
    assert_close(x, expected, np.float64, factor=10)


@pytest.mark.parametrize("backend", backends(op="block"))
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_every_axis(backend, axis):
    systems = [2, 3, 4]
    systems[axis] = 6
    lower, diag, upper, rhs = random_blocks(tuple(systems), 3, seed=abs(axis), m=2)
    expected = reference_solve_block_tridiagonal(lower, diag, upper, rhs, axis=axis)
    lower, upper = with_nan_ends(lower, upper, axis)
    x = _block.solve(lower, diag, upper, rhs, axis=axis, pivoting=True, backend=backend)
    assert x.shape == tuple(systems) + (3, 2)
    assert_close(x, expected, np.float64, factor=10)


@pytest.mark.parametrize("dtype", DTYPES + [np.float16, jnp.bfloat16])
@pytest.mark.parametrize("pivoting", [True, False])
def test_dtypes(dtype, pivoting):
    for backend in backends(dtype, op="block"):
        lower, diag, upper, rhs = random_blocks((5, 9), 3, np.float64 if np.dtype(dtype).kind
                                                != "c" else np.complex128, seed=3)
        cast = [np.asarray(v).astype(dtype) for v in (lower, diag, upper, rhs)]
        # The reference solves the rounded inputs, in float64.
        expected = reference_solve_block_tridiagonal(*(np.asarray(v).astype(
            np.complex128 if np.dtype(dtype).kind == "c" else np.float64) for v in cast))
        x = _block.solve(*cast, pivoting=pivoting, backend=backend)
        assert x.dtype == np.dtype(dtype), backend
        assert_close(x, expected, dtype, factor=20)


@pytest.mark.parametrize("backend", backends(op="block"))
def test_public_function_defaults_to_pivoting(backend):
    del backend
    rng = np.random.default_rng(5)
    k, n = 3, 6
    # Diagonal blocks with a zero (1, 1) entry: elimination without swaps divides by zero.
    diag = rng.uniform(-1, 1, (n, k, k)) + 4 * np.eye(k)
    diag[:, 0, 0] = 0.0
    lower, upper = (0.1 * rng.uniform(-1, 1, (n, k, k)) for _ in range(2))
    rhs = rng.uniform(-1, 1, (n, k))
    expected = reference_solve_block_tridiagonal(lower, diag, upper, rhs)
    x = tridiax.solve_block_tridiagonal(lower, diag, upper, rhs)
    assert_close(x, expected, np.float64, factor=10)
    unpivoted = tridiax.solve_block_tridiagonal(lower, diag, upper, rhs, pivoting=False)
    assert not np.all(np.isfinite(unpivoted))
    with pytest.raises(tridiax.BreakdownError, match="1 of 1 block-tridiagonal systems failed"):
        tridiax.solve_block_tridiagonal(lower, diag, upper, rhs, pivoting=False, check=True)


@pytest.mark.parametrize("backend", backends(op="block"))
@pytest.mark.parametrize("pivoting", [True, False])
def test_singular_block_stays_in_its_system(backend, pivoting):
    lower, diag, upper, rhs = random_blocks((4, 5), 2, seed=7)
    diag[2, 3] = 0.0  # system 2: a zero block on the diagonal, no coupling around it
    lower[2, 3] = upper[2, 3] = lower[2, 4] = upper[2, 2] = 0.0
    x = np.asarray(_block.solve(lower, diag, upper, rhs, pivoting=pivoting, backend=backend))
    assert not np.all(np.isfinite(x[2]))
    good = [0, 1, 3]
    expected = reference_solve_block_tridiagonal(lower[good], diag[good], upper[good],
                                                 rhs[good])
    assert_close(x[good], expected, np.float64, factor=10)
    with pytest.raises(tridiax.BreakdownError, match="1 of 4 block-tridiagonal"):
        _block.solve(lower, diag, upper, rhs, pivoting=pivoting, backend=backend, check=True)


def test_check_passes_good_systems_and_works_under_jit():
    lower, diag, upper, rhs = random_blocks((4, 6), 3, seed=2)
    x = tridiax.solve_block_tridiagonal(lower, diag, upper, rhs, check=True)
    np.testing.assert_allclose(x, tridiax.solve_block_tridiagonal(lower, diag, upper, rhs))
    diag[1] = 0.0
    lower[1] = upper[1] = 0.0
    f = jax.jit(lambda d: tridiax.solve_block_tridiagonal(lower, d, upper, rhs, check=True))
    with pytest.raises(Exception, match="1 of 4 block-tridiagonal systems failed"):
        jax.block_until_ready(f(diag))


@pytest.mark.parametrize("backend", backends(op="block"))
def test_broadcast_blocks_and_shared_matrix(backend):
    k, n = 2, 7
    lower, diag, upper, _ = random_blocks((n,), k, seed=11)
    rhs = np.random.default_rng(12).uniform(-1, 1, (5, n, k))
    # One matrix for 5 right-hand sides: (N, k, k) blocks against (5, N, k).
    x = _block.solve(lower, diag, upper, rhs, pivoting=True, backend=backend)
    shared = reference_solve_block_tridiagonal(*(np.broadcast_to(v, (5, n, k, k)) for v in
                                                 (lower, diag, upper)), rhs)
    assert_close(x, shared, np.float64, factor=10)
    # Blocks constant along the rows (size 1 on the axis) and blocks of different ranks.
    x = _block.solve(lower[:1], diag, upper[None, :1], rhs, pivoting=True, backend=backend)
    expected = reference_solve_block_tridiagonal(
        np.broadcast_to(lower[:1], (5, n, k, k)), np.broadcast_to(diag, (5, n, k, k)),
        np.broadcast_to(upper[:1], (5, n, k, k)), rhs)
    assert_close(x, expected, np.float64, factor=10)
    # The same matrix as m = 5 right-hand sides: (N, k, 5).
    columns = np.moveaxis(rhs, 0, -1)
    x = _block.solve(lower, diag, upper, columns, pivoting=True, backend=backend)
    assert x.shape == (n, k, 5)
    np.testing.assert_allclose(np.moveaxis(np.asarray(x), -1, 0), shared, atol=1e-12)


def test_rhs_reading():
    k, n = 2, 5
    lower, diag, upper, _ = random_blocks((3, n), k)
    rng = np.random.default_rng(0)
    vectors = rng.uniform(-1, 1, (3, n, k))
    matrices = rng.uniform(-1, 1, (3, n, k, 4))
    assert tridiax.solve_block_tridiagonal(lower, diag, upper, vectors).shape == (3, n, k)
    assert tridiax.solve_block_tridiagonal(lower, diag, upper, matrices).shape == (3, n, k, 4)
    # (3, n, k, k): both readings fit the shape; the blocks' rank picks (..., N, k, m).
    square = rng.uniform(-1, 1, (3, n, k, k))
    x = tridiax.solve_block_tridiagonal(lower, diag, upper, square)
    expected = reference_solve_block_tridiagonal(lower, diag, upper, square)
    assert x.shape == (3, n, k, k)
    assert_close(x, expected, np.float64, factor=10)
    # Blocks (k, k) (no row axis) against (k, k, k): rank 0 decides nothing -> refused.
    with pytest.raises(ValueError, match="does not guess"):
        tridiax.solve_block_tridiagonal(diag[0, 0], diag[0, 0], diag[0, 0],
                                        rng.uniform(-1, 1, (k, k, k)))
    with pytest.raises(ValueError, match=r"does not fit blocks of size k = 2"):
        tridiax.solve_block_tridiagonal(lower, diag, upper, rng.uniform(-1, 1, (3, n, 3)))


def test_k_one_is_the_tridiagonal_solve():
    lower, diag, upper, rhs = random_blocks((4, 9), 1, seed=4)
    x = tridiax.solve_block_tridiagonal(lower, diag, upper, rhs)
    y = tridiax.solve_tridiagonal(lower[..., 0, 0], diag[..., 0, 0], upper[..., 0, 0],
                                  rhs[..., 0], pivoting=True)
    np.testing.assert_allclose(x[..., 0], y, rtol=1e-12)


@pytest.mark.parametrize(("backend", "k"), [(b, k) for b in backends(op="block") for k in (1, 2, 3, 5)
                                            if b != "pallas_interpret" or k <= 3])
def test_hermitian_positive_definite(backend, k):
    rng = np.random.default_rng(k)
    n, b = 6, 3
    lower = rng.uniform(-1, 1, (b, n, k, k)) + 1j * rng.uniform(-1, 1, (b, n, k, k))
    g = rng.uniform(-1, 1, (b, n, k, k)) + 1j * rng.uniform(-1, 1, (b, n, k, k))
    diag = g @ np.conj(np.swapaxes(g, -1, -2)) + 3 * k * np.eye(k)
    rhs = rng.uniform(-1, 1, (b, n, k)) + 0j
    upper = np.zeros_like(lower)
    upper[:, :-1] = np.conj(np.swapaxes(lower[:, 1:], -1, -2))
    expected = reference_solve_block_tridiagonal(lower, diag, upper, rhs)
    lower_nan = lower.copy()
    lower_nan[:, 0] = np.nan
    x = _block.solve(lower_nan, diag, None, rhs, hermitian=True, backend=backend)
    assert_close(x, expected, np.complex128, factor=10)
    # Indefinite in system 1 only: NaN there, the others untouched.
    diag[1, 2] = -diag[1, 2]
    x = np.asarray(_block.solve(lower, diag, None, rhs, hermitian=True, backend=backend))
    assert np.all(np.isnan(x[1])) and np.all(np.isfinite(x[[0, 2]]))
    assert_close(x[[0, 2]], expected[[0, 2]], np.complex128, factor=10)
    with pytest.raises(tridiax.BreakdownError, match="not Hermitian positive definite"):
        tridiax.solveh_block_tridiagonal(lower, diag, rhs, check=True)


@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("pivoting", [True, False])
def test_gradients_match_dense(axis, pivoting):
    k, n, b = 3, 5, 2
    lower, diag, upper, rhs = random_blocks((b, n), k, seed=9)
    diag = diag[:1]  # shared by both systems: its cotangent sums over them

    def move(v):  # (b, n, ...) -> (n, b, ...) for systems along axis 0
        return jnp.moveaxis(v, 1, 0) if axis == 0 else v

    def ours(lo, d, up, r):
        x = tridiax.solve_block_tridiagonal(move(lo), move(d), move(up), move(r), axis=axis,
                                            pivoting=pivoting)
        x = move(x)
        return jnp.sum(jnp.sin(x) * jnp.arange(x.size).reshape(x.shape))

    def dense(lo, d, up, r):
        x = dense_solve(jnp.where(jnp.arange(n)[:, None, None] > 0, lo, 0), d,
                        jnp.where(jnp.arange(n)[:, None, None] < n - 1, up, 0), r)
        return jnp.sum(jnp.sin(x) * jnp.arange(x.size).reshape(x.shape))

    args = (lower, diag, upper, rhs)
    for ours_grad, dense_grad in zip(jax.grad(ours, argnums=(0, 1, 2, 3))(*args),
                                     jax.grad(dense, argnums=(0, 1, 2, 3))(*args), strict=True):
        assert ours_grad.shape == dense_grad.shape
        np.testing.assert_allclose(ours_grad, dense_grad, rtol=1e-9, atol=1e-10)


def test_hermitian_gradient_counts_both_blocks():
    k, n = 2, 4
    rng = np.random.default_rng(3)
    lower = rng.uniform(-1, 1, (n, k, k))
    diag = np.broadcast_to(5 * np.eye(k), (n, k, k))
    rhs = rng.uniform(-1, 1, (n, k))

    def ours(lo):
        return jnp.sum(tridiax.solveh_block_tridiagonal(lo, diag, rhs) ** 3)

    def dense(lo):
        up = jnp.concatenate([jnp.swapaxes(lo[1:], -1, -2), jnp.zeros((1, k, k))])
        lo = lo.at[0].set(0)
        return jnp.sum(dense_solve(lo, diag, up, rhs) ** 3)

    np.testing.assert_allclose(jax.grad(ours)(lower), jax.grad(dense)(lower), rtol=1e-10,
                               atol=1e-12)


def test_jvp_and_second_order():
    lower, diag, upper, rhs = random_blocks((2, 4), 2, seed=13)

    def f(lo, d, up, r):
        return tridiax.solve_block_tridiagonal(lo, d, up, r)

    check_grads(f, (lower, diag, upper, rhs), order=2, modes=("fwd", "rev"),
                              atol=1e-6, rtol=1e-6)
    tangents = [np.random.default_rng(s).uniform(-1, 1, v.shape)
                for s, v in enumerate((lower, diag, upper, rhs))]
    _, out = jax.jvp(f, (lower, diag, upper, rhs), tuple(tangents))
    eps = 1e-6
    plus = f(*(v + eps * t for v, t in zip((lower, diag, upper, rhs), tangents, strict=True)))
    minus = f(*(v - eps * t for v, t in zip((lower, diag, upper, rhs), tangents, strict=True)))
    np.testing.assert_allclose(out, (plus - minus) / (2 * eps), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("in_axes", [(0, 0, 0, 0), (1, 1, 1, 1), (None, 0, None, 0),
                                     (None, None, None, 2), (3, None, None, None),
                                     (None, None, None, 4)])
def test_vmap_matches_a_loop(in_axes):
    # Mapped dimensions among the systems' dimensions cost no transposes; one among the block
    # dimensions (the last two cases) is moved to the front first.
    k, n, size = 2, 6, 4
    base = random_blocks((3, n), k, seed=1, m=2)
    rng = np.random.default_rng(2)
    args = [v if a is None else np.stack([v + 0.1 * rng.uniform(-1, 1, v.shape)
                                          for _ in range(size)], axis=a)
            for v, a in zip(base, in_axes, strict=True)]

    def f(lo, d, up, r):
        return tridiax.solve_block_tridiagonal(lo, d, up, r)

    # The result keeps the mapped dimension where the rhs had it (no transpose of the output).
    out_axes = in_axes[3] if in_axes[3] is not None and in_axes[3] < 3 else 0
    mapped = jax.vmap(f, in_axes=in_axes, out_axes=out_axes)
    expected = np.stack([np.asarray(f(*(v if a is None else np.take(v, j, axis=a)
                                        for v, a in zip(args, in_axes, strict=True))))
                         for j in range(size)], axis=out_axes)
    np.testing.assert_allclose(mapped(*args), expected, rtol=1e-12, atol=1e-13)
    jaxpr = jax.make_jaxpr(mapped)(*args)
    assert len(equations(jaxpr, block_solve_p.name)) == 1
    if all(a is None or a < 3 for a in in_axes):
        assert equations(jaxpr, "transpose") == []


@pytest.mark.parametrize("platform", [None, "cuda"])
def test_compile_time_does_not_grow_with_n(platform):
    # The N loop is never unrolled: the lowered program (a Triton kernel's IR included) is the
    # same for N = 8 and 8000 up to the numbers in it, on this machine's device and on a GPU.
    programs = []
    for n in (8, 8000):
        lower, diag, upper, rhs = (jax.ShapeDtypeStruct((n, 2, 2), np.float32),) * 3 + (
            jax.ShapeDtypeStruct((n, 2), np.float32),)
        traced = jax.jit(tridiax.solve_block_tridiagonal).trace(lower, diag, upper, rhs)
        lowered = traced.lower(lowering_platforms=(platform,) if platform else None)
        programs.append(program_shape(lowered))
    assert programs[0] == programs[1]


@pytest.mark.parametrize(("args", "error", "match"), [
    (((4, 2, 3), (4, 2, 2), (4, 2, 2), (4, 2)), ValueError, "square blocks"),
    (((4, 2, 2), (4, 3, 3), (4, 3, 3), (4, 3)), ValueError, "differ in size"),
    (((4, 2, 2), (4, 2, 2), (4, 2, 2), (5, 2)), ValueError, "does not fit"),
    (((4, 2, 2), (4, 2, 2), (4, 2, 2), (4,)), ValueError, "does not fit"),
    (((2,), (4, 2, 2), (4, 2, 2), (4, 2)), ValueError, "square blocks"),
])
def test_errors_name_the_argument(args, error, match):
    arrays = [np.ones(s, np.float32) for s in args]
    with pytest.raises(error, match=match):
        tridiax.solve_block_tridiagonal(*arrays)


def test_more_errors():
    ones = np.ones((4, 2, 2), np.float32)
    with pytest.raises(TypeError, match="diag has dtype int32"):
        tridiax.solve_block_tridiagonal(ones, ones.astype(np.int32), ones, np.ones((4, 2)))
    with pytest.raises(ValueError, match="out of range"):
        tridiax.solve_block_tridiagonal(ones, ones, ones, np.ones((4, 2)), axis=3)
    with pytest.raises(TypeError, match="pivoting must be True or False"):
        tridiax.solve_block_tridiagonal(ones, ones, ones, np.ones((4, 2)), pivoting="yes")
    with pytest.raises(ValueError, match="backend='native'|backend=.*cannot run"):
        _block.solve(ones, ones, ones, np.ones((4, 2)), backend="mosaic_gpu")


def test_tolerance_table_covers_the_dtypes():
    assert all(np.dtype(d) in RTOL for d in DTYPES)


def test_large_blocks_leave_the_triton_kernel_for_xla():
    # The Triton kernel keeps k x k blocks in registers: past PALLAS_BLOCK_LIMIT it spills.
    from tridiax._core.backend import PALLAS_BLOCK_LIMIT, default_backend, default_block_backend

    for dtype, limit in ((np.float32, PALLAS_BLOCK_LIMIT[0]),
                         (np.complex64, PALLAS_BLOCK_LIMIT[1])):
        gpu = default_backend("cuda", dtype)
        assert default_block_backend("cuda", dtype, limit) == gpu
        assert default_block_backend("cuda", dtype, limit + 1) == "xla"
        assert default_block_backend("cpu", dtype, 16) == default_backend("cpu", dtype)
