"""One meaning of `axis` everywhere: every entry point, every layout, the same answer.

The same 12 systems of N = 6 rows (12 sequences of T = 6 steps) are laid out with the
system axis at each position of a 3-d array, with full bands and with bands shared by every
system, and solved by every entry point; each answer, moved back, must equal one
reference. Then the shapes that admit two readings must be refused, by every entry point.
"""

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
