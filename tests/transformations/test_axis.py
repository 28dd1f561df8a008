"""One meaning of `axis` everywhere: every entry point, every layout, the same answer.

The same 12 systems of N = 6 rows (12 sequences of T = 6 steps) are laid out with the
system axis at each position of a 3-d array, with full bands and with bands shared by every
system, and solved by every entry point; each answer, moved back, must equal one
reference. Then the shapes that admit two readings must be refused, by every entry point.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest
from helpers import dense_numpy, numpy_loop, random_bands

import tridiax
from tridiax import verify

N, BATCH = 6, (3, 4)
# Canonical layout: (3, 4, N), systems along the last axis.
BANDS = random_bands(BATCH + (N,), np.float64, seed=42)
SHARED = [b[:1, :1] for b in BANDS[:3]]  # one matrix for all 12 systems: (1, 1, N)


def layout(x, position):
    """A canonical (3, 4, N|1) array with its system axis moved to `position`."""
    return np.moveaxis(np.asarray(x), -1, position)


def canonical(x, position):
    return np.moveaxis(np.asarray(x), position, -1)


def reference(bands, periodic=False):
    return verify.reference_solve(*bands, BANDS[3], axis=-1, periodic=periodic)


def dense_mv(bands, x, periodic=False):
    return np.einsum("...ij,...j->...i", dense_numpy(*bands, periodic=periodic), x)


def entry_points(bands, rhs, axis, periodic):
    """Every way tridiax solves the systems along `axis` of `rhs` with these bands."""
    def op(**kw):
        return tridiax.Tridiagonal(*bands, axis=axis, periodic=periodic, **kw)

    yield "solve function", (tridiax.solve_periodic_tridiagonal if periodic
                             else tridiax.solve_tridiagonal)(*bands, rhs, axis=axis)
    yield "pivoted", (tridiax.solve_periodic_tridiagonal if periodic
                      else tridiax.solve_tridiagonal)(*bands, rhs, axis=axis, pivoting=True)
    yield "Tridiagonal.solve", op().solve(rhs)
    yield "TDMA", tridiax.TDMA()(op(), rhs)
    yield "factor().solve", op().factor().solve(rhs)
    yield "jit(Tridiagonal.solve)", jax.jit(op().solve)(rhs)


@pytest.mark.parametrize("periodic", [False, True])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize("negative", [False, True])
def test_every_entry_point_in_every_layout(position, negative, shared, periodic):
    bands = SHARED if shared else BANDS[:3]
    expected = reference(bands, periodic)
    lay = [layout(b, position) for b in bands]
    rhs = layout(BANDS[3], position)
    axis = position - 3 if negative else position
    for name, x in entry_points(lay, rhs, axis, periodic):
        np.testing.assert_allclose(canonical(x, position), expected, rtol=1e-11, atol=1e-13,
                                   err_msg=name)
    a = tridiax.Tridiagonal(*lay, axis=axis, periodic=periodic)
    np.testing.assert_allclose(canonical(a.mv(rhs), position),
                               dense_mv(bands, BANDS[3], periodic), rtol=1e-12, atol=1e-13)
    # The transpose along the same axis: <A^T y, x> = <y, A x>.
    y = layout(np.cos(np.arange(rhs.size)).reshape(BANDS[3].shape), position)
    np.testing.assert_allclose(np.sum(a.T.mv(y) * rhs), np.sum(y * a.mv(rhs)), rtol=1e-12)


@pytest.mark.parametrize("position", [0, 1, 2])
def test_bands_with_fewer_dimensions_align_at_the_right(position):
    # One matrix for every system, given with only the dimensions from the axis on: (N, 1, ...).
    bands = [b[0, 0] for b in SHARED]  # (N,)
    lay = [np.reshape(b, (N,) + (1,) * (2 - position)) for b in bands]
    rhs = layout(BANDS[3], position)
    expected = reference(bands)
    for name, x in entry_points(lay, rhs, position - 3, False):
        np.testing.assert_allclose(canonical(x, position), expected, rtol=1e-11, err_msg=name)
    if position > 0:  # a non-negative axis counted in the bands, unambiguous here
        a = tridiax.Tridiagonal(*lay, axis=0)
        np.testing.assert_allclose(canonical(a.solve(rhs), position), expected, rtol=1e-11)


def test_lineax_solver_is_one_system_batched_by_vmap():
    lo, di, up, b = (jnp.asarray(v.reshape(-1, N)) for v in BANDS)

    def one(lo, di, up, b):
        op = lx.TridiagonalLinearOperator(di, lo[1:], up[:-1])
        return lx.linear_solve(op, b, solver=tridiax.lineax.TDMA()).value

    x = jax.vmap(one)(lo, di, up, b)
    np.testing.assert_allclose(x.reshape(BATCH + (N,)), reference(BANDS[:3]), rtol=1e-11)


@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize("reverse", [False, True])
def test_recurrences_in_every_layout(position, reverse):
    a, x = BANDS[0] * 0.9, BANDS[3]  # (3, 4, T) canonical
    a_shared = a[:1, :1]
    h0 = np.ones(BATCH)
    expected = numpy_loop(np.moveaxis(a, -1, 0), np.moveaxis(x, -1, 0), reverse=reverse,
                          initial=h0)
    expected = np.moveaxis(expected, 0, -1)
    lay_x = layout(x, position)
    for coefficient, want in ((a, expected),):
        lay_a = layout(coefficient, position)
        for axis in (position, position - 3):
            got = tridiax.linear_recurrence(lay_a, lay_x, axis=axis, reverse=reverse, initial=h0)
            np.testing.assert_allclose(canonical(got, position), want, rtol=1e-12)
            module = tridiax.LinearRecurrence(axis=axis, reverse=reverse)
            np.testing.assert_allclose(canonical(module(lay_a, lay_x, initial=h0), position),
                                       want, rtol=1e-12)
            last = tridiax.linear_recurrence(lay_a, lay_x, axis=axis, reverse=reverse,
                                             initial=h0, final_only=True)
            np.testing.assert_allclose(last, want[..., 0 if reverse else -1], rtol=1e-12)
    # Decays shared by the 12 sequences, and relu through indrnn, in the same layouts.
    shared_expected = np.moveaxis(numpy_loop(
        np.moveaxis(np.broadcast_to(a_shared, x.shape), -1, 0), np.moveaxis(x, -1, 0),
        reverse=reverse, initial=h0), 0, -1)
    got = tridiax.linear_recurrence(layout(a_shared, position), lay_x, axis=position,
                                    reverse=reverse, initial=h0)
    np.testing.assert_allclose(canonical(got, position), shared_expected, rtol=1e-12)
    relu = lambda v: np.maximum(v, 0)  # noqa: E731
    want = np.moveaxis(numpy_loop(np.moveaxis(a, -1, 0), np.moveaxis(x, -1, 0), activation=relu),
                       0, -1)
    got = tridiax.indrnn(layout(a, position), lay_x, axis=position)
    np.testing.assert_allclose(canonical(got, position), want, rtol=1e-12)


def test_indrnn_module_reads_its_weights_per_unit_whatever_the_length():
    # T == hidden_size: the module's weights (hidden,) must not be read along time.
    model = tridiax.IndRNN(input_size=2, hidden_size=5, key=jax.random.key(0))
    xs = np.random.default_rng(0).standard_normal((5, 2))
    z = xs @ np.asarray(model.weight_ih).T + np.asarray(model.bias)
    want = numpy_loop(np.asarray(model.weight_hh)[None], z, activation=lambda v: np.maximum(v, 0))
    np.testing.assert_allclose(model(xs), want, rtol=1e-6, atol=1e-7)


# --- shapes with two readings are refused, by every entry point ---------------------------

def test_operator_axis_of_the_issue_is_refused_not_solved_wrongly():
    # Bands (ny, 1) and u (4, ny, 5): solve_tridiagonal(..., axis=1) solves along ny. The
    # operator with axis=1 used to solve along the last axis of u with constant coefficients.
    ny = 7
    rng = np.random.default_rng(0)
    lo, up = rng.uniform(-1, 1, (2, ny, 1))
    di = 4 + rng.uniform(-1, 1, (ny, 1))
    u = rng.standard_normal((4, ny, 5))
    expected = verify.reference_solve(lo, di, up, u, axis=1)
    np.testing.assert_allclose(tridiax.solve_tridiagonal(lo, di, up, u, axis=1), expected,
                               rtol=1e-12)
    a = tridiax.Tridiagonal(lo, di, up, axis=1)
    for call in (lambda: a.solve(u), lambda: a.mv(u), lambda: tridiax.TDMA()(a, u),
                 lambda: a.factor().solve(u), lambda: jax.jit(a.solve)(u)):
        with pytest.raises(ValueError, match=r"axis=-1 to solve along axis 2 of .* or with "
                                             r"axis=-2 to solve along axis 1"):
            call()
    # Either fix gives the answer it names.
    np.testing.assert_allclose(tridiax.Tridiagonal(lo, di, up, axis=-2).solve(u), expected,
                               rtol=1e-12)
    np.testing.assert_allclose(tridiax.Tridiagonal(lo, di, up, axis=-1).solve(u),
                               verify.reference_solve(lo, di, up, u, axis=2), rtol=1e-12)


def test_one_dimensional_bands_along_axis_0_show_the_shape_to_use():
    n = 5
    bands = (-np.ones(n), 2 * np.ones(n), -np.ones(n))
    with pytest.raises(ValueError, match=r"lower, diag and upper have shape \(5,\).*axis 0.*"
                                         r"pass shape \(5, 1\) \(jnp.expand_dims\(lower, -1\)\)"):
        tridiax.solve_tridiagonal(*bands, np.ones((n, 3)), axis=0)
    x = tridiax.solve_tridiagonal(*(b[:, None] for b in bands), np.ones((n, 3)), axis=0)
    np.testing.assert_allclose(x, verify.reference_solve(*(b[:, None] for b in bands),
                                                         np.ones((n, 3)), axis=0), rtol=1e-13)


@pytest.mark.parametrize("entry", ["solve", "periodic", "operator", "factorization", "TDMA"])
def test_square_shapes_with_two_readings_are_refused(entry):
    # (n,) bands against (n, n) along axis 0: constant along the axis (NumPy) or lying along
    # it (scipy's and lax's habit)?
    n = 5
    band, full = np.full(n, 0.5), np.ones((n, n))
    calls = {
        "solve": lambda: tridiax.solve_tridiagonal(band, 3 + band, band, full, axis=0),
        "periodic": lambda: tridiax.solve_periodic_tridiagonal(band, 3 + band, band, full,
                                                               axis=0),
        "operator": lambda: tridiax.Tridiagonal(band, 3 + band, band, axis=0).solve(full),
        "factorization": lambda: tridiax.Tridiagonal(band, 3 + band, band, axis=0).factor()
        .solve(full),
        "TDMA": lambda: tridiax.TDMA(pivoting=True)(tridiax.Tridiagonal(band, 3 + band, band,
                                                                        axis=0), full),
    }
    with pytest.raises(ValueError, match=r"tridiax does not guess"):
        calls[entry]()


@pytest.mark.parametrize("entry", ["linear_recurrence", "indrnn", "LinearRecurrence"])
def test_recurrence_coefficients_of_one_dimension_are_per_feature_even_when_square(entry):
    # The benchmark shape of IndRNN, T = F: weights (F,) are per feature (NumPy's reading).
    a, x = np.linspace(0.1, 0.9, 6), np.cos(np.arange(36.0)).reshape(6, 6)
    relu = (lambda v: np.maximum(v, 0)) if entry == "indrnn" else (lambda v: v)
    calls = {"linear_recurrence": lambda: tridiax.linear_recurrence(a, x),
             "indrnn": lambda: tridiax.indrnn(a, x),
             "LinearRecurrence": lambda: tridiax.LinearRecurrence()(a, x)}
    np.testing.assert_allclose(calls[entry](), numpy_loop(a[None], x, activation=relu),
                               rtol=1e-13)
    with pytest.raises(ValueError, match=r"\(7,\) array lies along axis 1, where it does not "
                                         r"fit.*pass shape \(7, 1\)"):
        tridiax.linear_recurrence(np.full(7, 0.5), np.ones((7, 6)))  # per step: (T, 1)


def test_unambiguous_lower_rank_arrays_keep_numpy_rules():
    # Per-feature decays (F,) against (T, F) with T != F: constant in time, as documented.
    a, x = np.full(3, 0.5), np.ones((7, 3))
    np.testing.assert_allclose(tridiax.linear_recurrence(a, x), numpy_loop(a[None], x),
                               rtol=1e-13)
    # Bands (B,) against (N, B), axis 0, B != N: coefficients constant along each system.
    lo, di, up = np.full(4, -1.0), np.arange(3.0, 7.0), np.full(4, -1.0)
    rhs = np.ones((6, 4))
    expected = verify.reference_solve(lo[None], di[None], up[None], rhs, axis=0)
    np.testing.assert_allclose(tridiax.solve_tridiagonal(lo, di, up, rhs, axis=0), expected,
                               rtol=1e-13)


# --- from a review: operators under vmap, mv broadcasting, band-like arguments -------------

@pytest.mark.parametrize("periodic", [False, True])
def test_vmap_over_an_operator_follows_its_axis(periodic):
    # B = 3 systems of N = 5 rows along axis 0; vmap over the systems (a dimension after the
    # axis) once solved along the wrong dimension of the right-hand side.
    lo, di, up, _ = random_bands((5, 3), seed=3)
    rhs = np.random.default_rng(3).standard_normal((4, 5, 3))
    for axis in (0, -2):
        a = tridiax.Tridiagonal(lo, di, up, axis=axis, periodic=periodic)
        expected = a.solve(rhs)
        x = jax.vmap(lambda a, b: a.solve(b), in_axes=(1, 2), out_axes=2)(a, rhs)
        np.testing.assert_allclose(x, expected, rtol=1e-12)
        y = jax.vmap(lambda a, b: a.mv(b), in_axes=(1, 2), out_axes=2)(a, x)
        np.testing.assert_allclose(y, rhs, rtol=1e-11, atol=1e-12)
        f = jax.vmap(lambda a, b: a.factor().solve(b), in_axes=(1, 2), out_axes=2)(a, rhs)
        np.testing.assert_allclose(f, expected, rtol=1e-12)
        # An operator made inside vmap, used outside: the axis follows its dimension.
        made = jax.vmap(lambda l, d, u: tridiax.Tridiagonal(l, d, u, axis=axis + 1 if axis < 0
                                                            else 0, periodic=periodic),
                        in_axes=1, out_axes=1)(lo, di, up)
        np.testing.assert_allclose(made.solve(rhs), expected, rtol=1e-12)
    with pytest.raises(ValueError, match="vmap over the operator's own axis"):
        jax.vmap(lambda a, b: a.solve(b), in_axes=(0, 1))(
            tridiax.Tridiagonal(lo, di, up, axis=0), rhs)
    square = tridiax.Tridiagonal(*(np.ones((3, 3, 3)) * v for v in (1.0, 4.0, 1.0)), axis=1)
    with pytest.raises(ValueError, match="more than one dimension of that shape could be the axis"):
        jax.vmap(lambda a: a.mv(np.ones((3, 3))), in_axes=0)(square)


def test_mv_of_an_array_constant_along_the_axis():
    op = tridiax.Tridiagonal(-1.0, 2 + jnp.arange(4.0), -1.0)
    np.testing.assert_allclose(op.mv(jnp.ones(1)), op.as_matrix() @ np.ones(4))
    np.testing.assert_allclose(op.mv(1.0), op.as_matrix() @ np.ones(4))
    ops = tridiax.Tridiagonal(-np.ones((4, 1)), 2 * np.ones((4, 1)), -np.ones((4, 1)), axis=0)
    np.testing.assert_allclose(ops.mv(np.ones((1, 3))), ops.mv(np.ones((4, 3))))


def test_band_like_arguments_follow_the_bands_rule():
    lo, di, up = (b[:, :1] for b in random_bands((4, 4), seed=5)[:3])  # one (4, 1) matrix
    rhs = np.random.default_rng(5).standard_normal((4, 4))
    a = tridiax.Tridiagonal(lo, di, up, axis=0)
    v = np.arange(1.0, 5.0)
    with pytest.raises(ValueError, match="does not guess"):  # (4,) against (4, 1): both fit
        a.shift_diagonal(v)
    shifted = a.shift_diagonal(v[:, None])  # per-row shifts of the shared matrix
    np.testing.assert_allclose(shifted.solve(rhs), np.linalg.solve(
        dense_numpy(lo[:, 0], di[:, 0], up[:, 0]) + np.diag(v), rhs), rtol=1e-12)
    with pytest.raises(ValueError, match="does not guess"):
        a.scale(v)
    np.testing.assert_allclose((np.ones((4, 1)) * a).as_matrix(), a.as_matrix())


@pytest.mark.parametrize("where", ["jit", "vmap"])
def test_jitting_a_method_of_an_operator_made_of_tracers(where):
    # What the Tridiagonal docstring recommends there: equinox.filter_jit of the method.
    lo, di, up, rhs = (jnp.asarray(v) for v in random_bands((3, 6), seed=6))
    expected = tridiax.solve_tridiagonal(lo, di, up, rhs)
    if where == "jit":
        x = jax.jit(lambda d: eqx.filter_jit(tridiax.Tridiagonal(lo, d, up).solve)(rhs))(di)
    else:
        ops = tridiax.Tridiagonal(lo, di, up)
        x = jax.vmap(lambda a, b: eqx.filter_jit(a.solve)(b))(ops, rhs)
    np.testing.assert_allclose(x, expected, rtol=1e-12)


def test_python_ints_are_weakly_typed_like_in_jax():
    rhs = jnp.ones(4, jnp.float32)
    x = tridiax.solve_tridiagonal(-1, 4, -1, rhs)
    assert x.dtype == jnp.float32
    np.testing.assert_allclose(x, tridiax.verify.reference_solve(-1.0, 4.0, -1.0, rhs), rtol=1e-6)
    np.testing.assert_allclose(tridiax.Tridiagonal(-1, 4 + 0 * rhs, -1.0).solve(rhs), x)
    np.testing.assert_allclose(tridiax.linear_recurrence(1, rhs), np.cumsum(rhs))
    with pytest.raises(TypeError, match="^rhs has dtype int32"):  # integer arrays are not
        tridiax.solve_tridiagonal(-1, 4, -1, np.zeros(4, np.int32) + 1)


def test_broadcast_errors_name_the_axis_that_fits():
    with pytest.raises(ValueError, match=r"If the systems lie along axis 0 \(length 5\), pass "
                                         r"axis=0 and give the 1-D arrays shape \(5, 1\)"):
        tridiax.solve_tridiagonal(np.ones(5), np.ones(5), np.ones(5), np.ones((5, 3)))
    with pytest.raises(ValueError, match="x has shape"):  # inputs, unlike decays, are refused
        tridiax.linear_recurrence(np.ones((6, 1)), np.ones(6))
