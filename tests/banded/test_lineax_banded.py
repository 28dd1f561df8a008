"""tridiax.lineax.Banded: any lineax operator with a banded matrix, its band read by coloured
products and solved by tridiax.solve_banded; checked against dense jnp.linalg.solve on the
operator's full matrix (jax.jacfwd / as_matrix), never against the band it extracted."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import tridiax
from tridiax.lineax import Banded

BANDS = [(1, 1), (2, 2), (3, 1), (0, 2), (2, 0)]
SIZES = [1, 2, 5, 40]
KINDS = ["matrix", "jacobian", "function"]
TOLERANCE = {jnp.float32: 2e-5, jnp.float64: 1e-12, jnp.complex128: 1e-12}


def _band_mask(n, l, u):
    i, j = np.indices((n, n))
    return (j - i <= u) & (i - j <= l)


def _banded(n, l, u, *, seed=0, dtype=np.float64, dominant=True):
    """A random (n, n) matrix with l sub- and u super-diagonals (zero elsewhere)."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (n, n))
    if np.issubdtype(dtype, np.complexfloating):
        a = a + 1j * rng.uniform(-1, 1, (n, n))
    a = np.where(_band_mask(n, l, u), a, 0)
    if dominant:
        a += (l + u + 1) * np.eye(n)
    return a.astype(dtype)


def _relative_error(x, reference):
    x, reference = np.asarray(x), np.asarray(reference)
    return np.max(np.abs(x - reference)) / max(np.max(np.abs(reference)), 1e-30)


def _nonlinear(y, matrix):
    """F(y) = A tanh(y) + y^3 / 3: its Jacobian A diag(sech^2 y) + diag(y^2) has A's band."""
    return matrix @ jnp.tanh(y) + y**3 / 3


def _operator(kind, matrix, y=None):
    """A lineax operator of the given kind whose matrix is banded like `matrix`, and that
    matrix computed independently (dense, by jax.jacfwd where it is a Jacobian)."""
    n = matrix.shape[0]
    if kind == "matrix":
        return lx.MatrixLinearOperator(matrix), matrix
    if kind == "function":
        structure = jax.ShapeDtypeStruct((n,), matrix.dtype)
        return lx.FunctionLinearOperator(lambda v: matrix @ v, structure), matrix
    assert kind == "jacobian"
    y = jnp.linspace(-1, 1, n, dtype=matrix.dtype) if y is None else y
    return (lx.JacobianLinearOperator(lambda y, args: _nonlinear(y, args), y, matrix),
            jax.jacfwd(_nonlinear)(y, matrix))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("l,u", BANDS)
def test_solve_matches_dense(l, u, n, kind, dtype):
    matrix = jnp.asarray(_banded(n, l, u, seed=10 * l + u + n, dtype=dtype))
    b = jnp.asarray(np.random.default_rng(n).standard_normal(n), dtype)
    operator, dense = _operator(kind, matrix)
    solution = lx.linear_solve(operator, b, solver=Banded(l, u))
    assert solution.result == lx.RESULTS.successful
    assert solution.value.dtype == dtype and solution.value.shape == (n,)
    reference = jnp.linalg.solve(dense.astype(jnp.float64), b.astype(jnp.float64))
    assert _relative_error(solution.value, reference) < TOLERANCE[dtype]


@pytest.mark.parametrize("n", [5, 40])
@pytest.mark.parametrize("l,u", BANDS)
def test_band_is_scipys_layout(l, u, n):
    """The state's band is ab[u + i - j, j] == A[i, j], read by coloured products."""
    matrix = _banded(n, l, u, seed=1)
    ab = np.zeros((l + u + 1, n))
    for i, j in zip(*np.nonzero(_band_mask(n, l, u)), strict=True):
        ab[u + i - j, j] = matrix[i, j]
    for kind in KINDS:
        operator, _ = _operator(kind, jnp.asarray(matrix), y=jnp.zeros(n))  # Jacobian = matrix
        state = Banded(l, u).init(operator, {})
        np.testing.assert_allclose(state.ab, ab, rtol=1e-15, atol=0, err_msg=kind)


@pytest.mark.parametrize("n", [1, 3, 40])
@pytest.mark.parametrize("l,u", BANDS)
def test_band_takes_l_plus_u_plus_1_products(l, u, n):
    """One product per colour (at most N), however large N is."""
    matrix = _banded(n, l, u, seed=2)
    calls = []

    def matvec(v):
        def host(v):
            calls.append(1)
            return (matrix @ np.asarray(v)).astype(np.float64)

        return jax.pure_callback(host, jax.ShapeDtypeStruct((n,), jnp.float64), v,
                                 vmap_method="sequential")

    operator = lx.FunctionLinearOperator(matvec, jax.ShapeDtypeStruct((n,), jnp.float64))
    state = Banded(l, u).init(operator, {})
    assert len(calls) == min(l + u + 1, n)
    b = np.arange(1.0, n + 1)
    x = lx.linear_solve(operator, b, solver=Banded(l, u), state=state).value
    np.testing.assert_allclose(x, np.linalg.solve(matrix, b), rtol=1e-12)


@pytest.mark.parametrize("l,u", BANDS)
def test_transpose_and_conj_states_are_those_of_the_transposed_operator(l, u):
    # lineax's contract: solver.transpose(init(A)) == init(A.T), solver.conj(init(A)) ==
    # init(conj(A)); the transposed solve runs tridiax.solve_banded on the band of A^T.
    n = 9
    matrix = jnp.asarray(_banded(n, l, u, seed=3, dtype=np.complex128))
    operator = lx.MatrixLinearOperator(matrix)
    solver = Banded(l, u)
    state = solver.init(operator, {})
    transposed, _ = solver.transpose(state, {})
    assert (transposed.l, transposed.u) == (u, l)
    np.testing.assert_array_equal(transposed.ab, Banded(u, l).init(operator.T, {}).ab)
    conjugated, _ = solver.conj(state, {})
    np.testing.assert_array_equal(conjugated.ab, Banded(l, u).init(lx.conj(operator), {}).ab)
    b = jnp.asarray(np.random.default_rng(3).standard_normal(n) + 1j)
    for st, dense in ((transposed, matrix.T), (conjugated, matrix.conj())):
        x, result, _ = solver.compute(st, b, {})
        assert result == lx.RESULTS.successful
        assert _relative_error(x, jnp.linalg.solve(dense, b)) < 1e-12


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("l,u", BANDS)
def test_gradients_match_dense(l, u, kind):
    """jax.grad through lx.linear_solve w.r.t. the operator's parameters (the matrix, and the
    linearisation point of a Jacobian) and the vector: lineax's implicit differentiation runs
    Banded's transposed solve."""
    n = 12
    matrix = jnp.asarray(_banded(n, l, u, seed=4))
    y = jnp.linspace(-1, 1, n)
    b = jnp.asarray(np.random.default_rng(4).standard_normal(n))

    def banded(matrix, y, b):
        operator, _ = _operator(kind, matrix, y)
        return lx.linear_solve(operator, b, solver=Banded(l, u)).value

    def dense(matrix, y, b):
        _, a = _operator(kind, matrix, y)
        return jnp.linalg.solve(a, b)

    loss = lambda solve: lambda *args: jnp.sum(jnp.sin(solve(*args)))  # noqa: E731
    argnums = (0, 1, 2) if kind == "jacobian" else (0, 2)
    got = jax.grad(loss(banded), argnums=argnums)(matrix, y, b)
    want = jax.grad(loss(dense), argnums=argnums)(matrix, y, b)
    for g, w in zip(got, want, strict=True):
        assert _relative_error(g, w) < 1e-10
    # and forward mode
    tangents = (jnp.ones_like(matrix) * _band_mask(n, l, u), jnp.cos(y), jnp.sin(b))
    _, got = jax.jvp(banded, (matrix, y, b), tangents)
    _, want = jax.jvp(dense, (matrix, y, b), tangents)
    assert _relative_error(got, want) < 1e-10


def test_gradients_in_float32():
    l, u, n = 2, 1, 20
    matrix = jnp.asarray(_banded(n, l, u, seed=5, dtype=np.float32))
    b = jnp.asarray(np.random.default_rng(5).standard_normal(n), jnp.float32)
    solve = lambda m: lx.linear_solve(lx.MatrixLinearOperator(m), b, solver=Banded(l, u)).value  # noqa: E731
    got = jax.grad(lambda m: jnp.sum(solve(m) ** 2))(matrix)
    want = jax.grad(lambda m: jnp.sum(jnp.linalg.solve(m, b) ** 2))(matrix.astype(jnp.float64))
    assert got.dtype == jnp.float32
    assert _relative_error(got, want) < 1e-4


@pytest.mark.parametrize("pivoting", [False, True])
def test_pivoting_option(pivoting):
    # Not diagonally dominant: A[0, 0] = 0 needs a row interchange; dominant matrices solve
    # either way.
    l, u, n = 2, 2, 30
    hard = _banded(n, l, u, seed=6, dominant=False)
    hard[0, 0] = 0.0
    easy = _banded(n, l, u, seed=6)
    b = np.random.default_rng(6).standard_normal(n)
    solver = Banded(l, u, pivoting=pivoting)
    x = lx.linear_solve(lx.MatrixLinearOperator(easy), b, solver=solver).value
    assert _relative_error(x, np.linalg.solve(easy, b)) < 1e-12
    solution = lx.linear_solve(lx.MatrixLinearOperator(hard), b, solver=solver, throw=False)
    if pivoting:
        assert solution.result == lx.RESULTS.successful
        assert _relative_error(solution.value, np.linalg.solve(hard, b)) < 1e-9
    else:  # a zero first pivot without interchanges: reported, not a wrong answer
        assert solution.result == lx.RESULTS.singular


def test_singular_matrix_is_reported():
    matrix = _banded(8, 1, 1, seed=7)
    matrix[:, 3] = 0.0  # a zero column: singular whatever the pivoting
    b = np.ones(8)
    solution = lx.linear_solve(lx.MatrixLinearOperator(matrix), b, solver=Banded(1, 1), throw=False)
    assert solution.result == lx.RESULTS.singular
    with pytest.raises(Exception, match="[Ss]ingular"):
        lx.linear_solve(lx.MatrixLinearOperator(matrix), b, solver=Banded(1, 1))


def test_check_option_raises():
    matrix = _banded(8, 1, 1, seed=8)
    matrix[0, 0] = 0.0
    with pytest.raises(Exception):
        jax.block_until_ready(lx.linear_solve(lx.MatrixLinearOperator(matrix), np.ones(8),
                                              solver=Banded(1, 1, pivoting=False, check=True),
                                              throw=False).value)


def test_complex_solve():
    l, u, n = 1, 2, 15
    matrix = _banded(n, l, u, seed=9, dtype=np.complex128)
    b = np.random.default_rng(9).standard_normal(n) * (1 - 2j)
    for kind in ("matrix", "function"):
        operator, _ = _operator(kind, jnp.asarray(matrix))
        x = lx.linear_solve(operator, jnp.asarray(b), solver=Banded(l, u)).value
        assert _relative_error(x, np.linalg.solve(matrix, b)) < 1e-12


def test_jit_and_vmap_over_operators():
    l, u, n, batch = 3, 1, 16, 4
    matrices = jnp.stack([jnp.asarray(_banded(n, l, u, seed=s)) for s in range(batch)])
    bs = jnp.asarray(np.random.default_rng(10).standard_normal((batch, n)))

    @jax.jit
    @jax.vmap
    def solve(matrix, b):
        operator, _ = _operator("jacobian", matrix, jnp.zeros(n))
        return lx.linear_solve(operator, b, solver=Banded(l, u)).value

    x = solve(matrices, bs)
    for k in range(batch):
        dense = jax.jacfwd(_nonlinear)(jnp.zeros(n), matrices[k])
        assert _relative_error(x[k], jnp.linalg.solve(dense, bs[k])) < 1e-12


def test_refuses_non_square_and_non_vector_operators():
    with pytest.raises(ValueError, match="square"):
        lx.linear_solve(lx.MatrixLinearOperator(jnp.ones((3, 4))), jnp.ones(3), solver=Banded(1, 1))
    pytree = jax.ShapeDtypeStruct((3,), jnp.float64), jax.ShapeDtypeStruct((2,), jnp.float64)
    operator = lx.FunctionLinearOperator(lambda v: v, pytree)
    with pytest.raises(ValueError, match="1-D vectors"):
        lx.linear_solve(operator, (jnp.ones(3), jnp.ones(2)), solver=Banded(1, 1))
    grid = jax.ShapeDtypeStruct((3, 3), jnp.float64)
    with pytest.raises(ValueError, match="1-D vectors"):
        lx.linear_solve(lx.FunctionLinearOperator(lambda v: 2 * v, grid), jnp.ones((3, 3)),
                        solver=Banded(1, 1))
    for bad in ((-1, 1), (1, 1.5), (True, 1)):
        with pytest.raises(ValueError, match="non-negative integer"):
            Banded(*bad)


def test_optimistix_newton_with_banded_linear_solver():
    optx = pytest.importorskip("optimistix")
    n = 60
    forcing = jnp.asarray(np.random.default_rng(11).uniform(0, 2, n))

    def residual(y, args):
        # A beam-like nonlinear system: the 5-point fourth difference (zero ghost values) plus
        # a cubic; its Jacobian is pentadiagonal, (l, u) = (2, 2).
        padded = jnp.pad(y, 2)
        d4 = padded[:-4] - 4 * padded[1:-3] + 6 * padded[2:-2] - 4 * padded[3:-1] + padded[4:]
        return d4 + y + y**3 - args

    def root(linear_solver):
        solver = optx.Newton(rtol=1e-12, atol=1e-12, linear_solver=linear_solver)
        return optx.root_find(residual, solver, jnp.zeros(n), forcing, max_steps=50)

    banded = root(Banded(2, 2))
    dense = root(lx.LU())
    assert banded.result == optx.RESULTS.successful
    assert np.max(np.abs(residual(banded.value, forcing))) < 1e-10
    assert np.max(np.abs(banded.value - dense.value)) < 1e-10
    assert np.max(np.abs(banded.value)) > 0.1  # a nontrivial solution
    assert isinstance(Banded(2, 2), lx.AbstractLinearSolver)
    assert tridiax.lineax.Banded is Banded
