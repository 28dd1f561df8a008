"""Tridiagonal, TDMA, TridiagonalFactorization and periodic solves against dense and SciPy
references, on every backend of this machine."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, backends, factors_by_loop, random_bands
from helpers import dense_numpy as dense
from jax.test_util import check_grads

import tridiax
from tridiax import verify


def dense_solve(lower, diag, upper, rhs, axis, periodic):
    arrays = np.broadcast_arrays(lower, diag, upper, rhs)
    a = dense(*arrays[:3], axis, periodic)
    b = np.moveaxis(arrays[3], axis, -1)
    return np.moveaxis(np.linalg.solve(a, b[..., None])[..., 0], -1, axis)


CASES = [((1,), 0), ((2,), 0), ((3,), 0), ((5, 7), 0), ((5, 7), 1), ((7, 5), -1),
         ((3, 9, 4), 1), ((33, 3), 0), ((3, 33), -1), ((2, 3, 4, 5), 2)]


# --- Tridiagonal ------------------------------------------------------------------------

@pytest.mark.parametrize("shape,axis,periodic", [(s, a, False) for s, a in CASES]
                         + [(s, a, True) for s, a in CASES if s[a] >= 3])
def test_operator_matches_dense(shape, axis, periodic):
    lo, di, up, x = random_bands(shape, seed=1)
    op = tridiax.Tridiagonal(lo, di, up, axis=axis, periodic=periodic)
    a = dense(lo, di, up, axis, periodic)
    np.testing.assert_allclose(op.as_matrix(), a, rtol=1e-15)
    np.testing.assert_allclose(op.T.as_matrix(), np.swapaxes(a, -1, -2), rtol=1e-15)
    xm = np.moveaxis(x, axis, -1)
    np.testing.assert_allclose(np.moveaxis(op.mv(x), axis, -1), (a @ xm[..., None])[..., 0],
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(op.solve(x), dense_solve(lo, di, up, x, axis, periodic), rtol=1e-10,
                               atol=1e-12)


def test_operator_algebra_without_new_off_diagonals():
    lo, di, up, x = random_bands((6, 4), seed=2)
    op = tridiax.Tridiagonal(lo, di, up, axis=0)
    a = dense(lo, di, up, 0, False)
    eye = np.eye(6)
    np.testing.assert_allclose((-0.1 * op).shift_diagonal(1.0).as_matrix(), eye - 0.1 * a, rtol=1e-14)
    np.testing.assert_allclose((op * 2).as_matrix(), 2 * a)
    np.testing.assert_allclose((-op).as_matrix(), -a)
    np.testing.assert_allclose((op + op.T).as_matrix(), a + np.swapaxes(a, -1, -2), rtol=1e-14)
    np.testing.assert_allclose((op - op).as_matrix(), 0 * a)
    shifted = op.shift_diagonal(3.0)
    assert shifted.lower is op.lower and shifted.upper is op.upper  # no copies of the off-diagonals


def test_constant_bands_and_extra_batch_dimensions():
    # Bands (1,) constant along the system and (N,) for one matrix; rhs with leading batches.
    n = 9
    op = tridiax.Tridiagonal(jnp.array([-1.0]), jnp.array([2.5]), jnp.array([-1.0]))
    rhs = np.random.default_rng(3).standard_normal((4, 2, n))
    lo, di, up = (np.full(n, v) for v in (-1.0, 2.5, -1.0))
    np.testing.assert_allclose(op.solve(rhs), dense_solve(lo, di, up, rhs, -1, False), rtol=1e-12)
    np.testing.assert_allclose(op.mv(rhs), np.einsum("ij,abj->abi", dense(lo, di, up, -1, False), rhs),
                               rtol=1e-12)
    with pytest.raises(ValueError, match="made for N = 1"):
        op.factor().solve(rhs)  # constant bands carry no N: say so rather than solve wrongly


def test_operator_is_a_pytree_through_jit_vmap_grad():
    lo, di, up, b = random_bands((8, 5), seed=4)
    op = tridiax.Tridiagonal(lo, di, up, axis=0)
    assert len(jax.tree.leaves(op)) == 3
    np.testing.assert_allclose(jax.jit(lambda o, b: o.solve(b))(op, b), op.solve(b), rtol=1e-13)
    ops = jax.vmap(lambda l, d, u: tridiax.Tridiagonal(l, d, u, axis=0), in_axes=1)(lo, di, up)
    xs = jax.vmap(lambda o, b: o.solve(b), in_axes=(0, 1), out_axes=1)(ops, b)
    np.testing.assert_allclose(xs, op.solve(b), rtol=1e-13)
    g = jax.grad(lambda o: jnp.sum(o.solve(b) ** 2))(op)
    g_ref = jax.grad(lambda o: jnp.sum(jnp.linalg.solve(o.as_matrix(), b.T[..., None]) ** 2))(op)
    for name in ("lower", "diag", "upper"):
        ref = getattr(g_ref, name)
        if name == "lower":
            ref = ref.at[0].set(0)
        if name == "upper":
            ref = ref.at[-1].set(0)
        np.testing.assert_allclose(getattr(g, name), ref, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("bad,match", [
    (dict(lower=np.ones(4), diag=np.ones(5), upper=np.ones(5)), "do not broadcast"),
    (dict(lower=np.ones(5, int), diag=np.ones(5), upper=np.ones(5)), "lower has dtype int"),
    (dict(lower=np.ones(5), diag=np.ones(5), upper=np.ones(5), axis=1), "out of range"),
    (dict(lower=np.ones(2), diag=np.ones(2), upper=np.ones(2), periodic=True), "N >= 3"),
    (dict(lower=object(), diag=np.ones(2), upper=np.ones(2)), "lower must be an array"),
])
def test_operator_checks_its_bands(bad, match):
    args = {k: bad.pop(k) for k in ("lower", "diag", "upper")}
    with pytest.raises((ValueError, TypeError), match=match):
        tridiax.Tridiagonal(args["lower"], args["diag"], args["upper"], **bad)


# --- TDMA -------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("periodic", [False, True])
def test_tdma_backends_and_block_sizes(backend, periodic):
    lo, di, up, b = random_bands((37, 5), np.float32, seed=5)
    op = tridiax.Tridiagonal(lo, di, up, axis=0, periodic=periodic)
    expected = verify.reference_solve(lo, di, up, b, axis=0, periodic=periodic)
    assert_close(tridiax.TDMA(backend=backend)(op, b), expected, np.float32)
    if backend.startswith("pallas"):
        # A (2, 4) tile over 5 columns: ragged, masked.
        assert_close(tridiax.TDMA(backend=backend, block=(1, 4))(op, b), expected, np.float32)
        assert_close(tridiax.TDMA(backend=backend, block=(2, 2))(op, b[None].repeat(3, 0)),
                     np.broadcast_to(expected, (3,) + expected.shape), np.float32)


def test_tdma_is_leafless_and_static():
    solver = tridiax.TDMA(backend="xla", block=(1, 32))
    assert jax.tree.leaves(solver) == []
    lo, di, up, b = random_bands((6,), seed=6)
    f = eqx.filter_jit(lambda s, o, b: s(o, b))
    np.testing.assert_allclose(f(solver, tridiax.Tridiagonal(lo, di, up), b),
                               dense_solve(lo, di, up, b, -1, False), rtol=1e-12)


@pytest.mark.parametrize("kwargs,match", [(dict(backend="cuda"), "backend must be"),
                                          (dict(block=(3, 4)), "powers of two"),
                                          (dict(block=8), "pair")])
def test_tdma_checks_its_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tridiax.TDMA(**kwargs)


def test_tdma_rejects_other_operators():
    with pytest.raises(TypeError, match=r"lineax.linear_solve\(operator, vector, solver=tridiax.TDMA\(\)\)"):
        tridiax.TDMA()(jnp.eye(3), jnp.ones(3))


# --- factorization ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("shape,axis", CASES)
def test_factorization_matches_scipy(shape, axis, dtype):
    lo, di, up, b = random_bands(shape, dtype, seed=7)
    expected = verify.reference_solve(lo, di, up, b, axis=axis)
    for backend in backends(dtype):
        fact = tridiax.TDMA(backend=backend).factor(tridiax.Tridiagonal(lo, di, up, axis=axis))
        assert_close(fact.solve(b), expected, dtype)
        # the same factors, many right-hand sides at once (an extra leading batch); the axis
        # counted from the end, which means the same dimension in bands and right-hand side
        fact = tridiax.TDMA(backend=backend).factor(
            tridiax.Tridiagonal(lo, di, up, axis=axis - len(shape) if axis >= 0 else axis))
        many = np.stack([b, 2 * b])
        assert_close(fact.solve(many), np.stack([expected, 2 * expected]), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, jnp.bfloat16],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape,axis,shapes", [
    *((s, a, None) for s, a in CASES),
    ((9, 70), 0, [(9, 1), (9, 70), (1, 70)]),  # bands broadcast along the systems
    ((70, 9), -1, [(1, 9), (70, 9), (70, 1)]),  # batch-first (moved to columns on GPU)
    # Contiguous rows (rows moved by transposes on CPU, N not a multiple of their blocks): one
    # long system, and batch-first bands shared by the systems or constant along them.
    ((1001,), 0, None),
    ((5, 101), -1, [(1, 101), (5, 101), (5, 1)]),
])
@pytest.mark.parametrize("block", [None, (1, 8), (2, 2)])
def test_factorization_kernels_match_a_loop(shape, axis, shapes, dtype, block):
    # Every backend's factor kernel (Pallas: ragged tiles with every access masked when a
    # block is given), against the elimination written out row by row.
    lo, di, up, _ = random_bands(shape, np.float64, seed=13, shapes=shapes and shapes + [shape])
    cast = [jnp.asarray(v, dtype) for v in (lo, di, up)]
    if np.issubdtype(dtype, np.complexfloating):
        cast[0] = cast[0] * (1 + 0.5j)
    expected = factors_by_loop(*cast, axis)
    tol = {np.dtype(jnp.bfloat16): 3e-2, np.dtype(np.float64): 1e-13}.get(np.dtype(dtype), 3e-6)
    for backend in backends(dtype):
        if block is not None and not backend.startswith("pallas"):
            continue
        fact = tridiax.TDMA(backend=backend, block=block).factor(
            tridiax.Tridiagonal(*cast, axis=axis))
        got = (fact.lower_factor, fact.inverse_pivots, fact.upper_factor)
        for name, g, e in zip(("l", "m", "c'"), got, expected, strict=True):
            assert g.dtype == dtype and g.shape == e.shape, (backend, name, g.dtype, g.shape)
            np.testing.assert_allclose(np.asarray(g, np.complex128), e, rtol=tol,
                                       atol=tol * np.abs(e).max(), err_msg=f"{backend} {name}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
@pytest.mark.parametrize("shape,axis", [((3,), 0), ((4,), 0), ((5, 7), 0), ((7, 5), -1), ((3, 9, 4), 1),
                                        ((200, 3), 0)])
def test_periodic_matches_reference(shape, axis, dtype):
    lo, di, up, b = random_bands(shape, dtype, seed=8)
    expected = verify.reference_solve(lo, di, up, b, axis=axis, periodic=True)
    np.testing.assert_allclose(expected, dense_solve(lo, di, up, b, axis, True), rtol=1e-10, atol=1e-12)
    for backend in backends(dtype):
        from tridiax._tridiagonal.api import solve

        assert_close(solve(lo, di, up, b, axis=axis, backend=backend, periodic=True), expected, dtype)
        op = tridiax.Tridiagonal(lo, di, up, axis=axis, periodic=True)
        assert_close(tridiax.TDMA(backend=backend).factor(op).solve(b), expected, dtype)
    assert_close(tridiax.solve_periodic_tridiagonal(lo, di, up, b, axis=axis), expected, dtype)


def test_periodic_broadcast_bands_and_half_precision():
    n = 12
    b = np.random.default_rng(9).standard_normal((n, 6))
    lo, di, up = np.full((1, 1), -1.0), np.full((n, 1), 3.0), np.linspace(-1, -0.5, n)[:, None]
    expected = verify.reference_solve(lo, di, up, b, axis=0, periodic=True)
    np.testing.assert_allclose(tridiax.solve_periodic_tridiagonal(lo, di, up, b, axis=0), expected,
                               rtol=1e-12)
    for dtype in (jnp.float16, jnp.bfloat16):
        x = tridiax.solve_periodic_tridiagonal(*(jnp.asarray(v, dtype) for v in (lo, di, up, b)), axis=0)
        assert x.dtype == dtype
        assert_close(x, expected, np.dtype(dtype))


def test_periodic_needs_three_rows():
    with pytest.raises(ValueError, match="N >= 3"):
        tridiax.solve_periodic_tridiagonal(np.ones(2), np.ones(2), np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match="N >= 3"):
        verify.reference_solve(np.ones(2), np.ones(2), np.ones(2), np.ones(2), periodic=True)


@pytest.mark.parametrize("periodic", [False, True])
@pytest.mark.parametrize("factored", [False, True])
def test_gradients_match_dense(periodic, factored):
    lo, di, up, b = (jnp.asarray(v) for v in random_bands((6, 3), seed=10))

    def ours(lo, di, up, b):
        op = tridiax.Tridiagonal(lo, di, up, axis=0, periodic=periodic)
        return op.factor().solve(b) if factored else op.solve(b)

    def ref(lo, di, up, b):
        n = di.shape[0]
        i = jnp.arange(n)
        m = jnp.zeros((3, n, n), lo.dtype)
        m = m.at[:, i, i].set(di.T)
        m = m.at[:, i[1:], i[:-1]].set(lo.T[:, 1:])
        m = m.at[:, i[:-1], i[1:]].set(up.T[:, :-1])
        if periodic:
            m = m.at[:, 0, n - 1].add(lo.T[:, 0]).at[:, n - 1, 0].add(up.T[:, n - 1])
        return jnp.linalg.solve(m, b.T[..., None])[..., 0].T

    args = (lo, di, up, b)
    loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))  # noqa: E731
    g = jax.grad(loss(ours), argnums=(0, 1, 2, 3))(*args)
    g_ref = jax.grad(loss(ref), argnums=(0, 1, 2, 3))(*args)
    for got, want in zip(g, g_ref, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    tangents = tuple(jnp.cos(jnp.arange(v.size).reshape(v.shape)) for v in args)
    np.testing.assert_allclose(jax.jvp(ours, args, tangents)[1], jax.jvp(ref, args, tangents)[1],
                               rtol=1e-9, atol=1e-12)
    check_grads(ours, args, order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("shape,axis", [((5, 0), 0), ((0, 5), -1), ((0, 5, 3), 1)])
@pytest.mark.parametrize("periodic", [False, True])
def test_factorization_of_no_systems(shape, axis, periodic):
    for backend in backends():
        op = tridiax.Tridiagonal(*(jnp.ones(shape) for _ in range(3)), axis=axis,
                                 periodic=periodic)
        fact = tridiax.TDMA(backend=backend).factor(op)
        assert fact.inverse_pivots.shape == shape, backend
        assert fact.solve(jnp.ones(shape)).shape == shape, backend


def test_factorization_under_vmap_and_jit():
    lo, di, up, b = random_bands((7, 5, 4), seed=11)
    facts = jax.vmap(lambda l, d, u: tridiax.Tridiagonal(l, d, u, axis=0).factor(), in_axes=2)(lo, di, up)
    xs = jax.jit(jax.vmap(lambda f, b: f.solve(b), in_axes=(0, 2), out_axes=2))(facts, b)
    assert_close(xs, verify.reference_solve(lo, di, up, b, axis=0), np.float64)


def test_factorization_reads_stored_factors_only():
    # The solve lowers to one kernel reading the factors: no pivot recomputation, no loop.
    lo, di, up, b = (jnp.asarray(v) for v in random_bands((50, 8), seed=12))
    fact = tridiax.Tridiagonal(lo, di, up, axis=0).factor()
    text = jax.jit(lambda f, b: f.solve(b)).lower(fact, b).as_text()
    assert "while" not in text and "divide" not in text
    m = np.asarray(fact.inverse_pivots)
    # the stored pivots are the Thomas pivots: m[0] = 1/d[0], m[1] = 1/(d[1] - l[1] u[0] / d[0])
    np.testing.assert_allclose(m[0], 1 / di[0])
    np.testing.assert_allclose(m[1], 1 / (di[1] - lo[1] * up[0] / di[0]))


def test_factorization_rhs_size_mismatch():
    fact = tridiax.Tridiagonal(np.ones(5), 3 * np.ones(5), np.ones(5)).factor()
    with pytest.raises(ValueError, match=r"do not broadcast.*rhs\(6,\)"):
        fact.solve(np.ones(6))


# --- jax.jit of bound methods -----------------------------------------------------------

@pytest.mark.parametrize("periodic", [False, True])
def test_jax_jit_of_bound_methods(periodic):
    lo, di, up, b = (jnp.asarray(v) for v in random_bands((7, 3), seed=13))
    op = tridiax.Tridiagonal(lo, di, up, axis=0, periodic=periodic)
    fact = op.factor()
    np.testing.assert_allclose(jax.jit(op.solve)(b), op.solve(b), rtol=1e-14)
    np.testing.assert_allclose(jax.jit(op.mv)(b), op.mv(b), rtol=1e-14)
    np.testing.assert_allclose(jax.jit(op.as_matrix)(), op.as_matrix())
    np.testing.assert_allclose(jax.jit(op.factor)().solve(b), fact.solve(b), rtol=1e-14)
    np.testing.assert_allclose(jax.jit(fact.solve)(b), fact.solve(b), rtol=1e-14)
    np.testing.assert_allclose(jax.jit(op.T.mv)(b), op.T.mv(b), rtol=1e-14)
    np.testing.assert_allclose(eqx.filter_jit(op.solve)(b), op.solve(b), rtol=1e-14)
    # Operators of one shape but other values are not confused by jit's cache.
    other = tridiax.Tridiagonal(lo, 2 * di, up, axis=0, periodic=periodic)
    assert hash(other) == hash(op) and not bool(other == op)
    np.testing.assert_allclose(jax.jit(other.solve)(b), other.solve(b), rtol=1e-14)
    assert not np.allclose(jax.jit(other.solve)(b), jax.jit(op.solve)(b))
