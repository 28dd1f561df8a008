"""Property-based tests (hypothesis): random shapes, axes, broadcasting, dtypes and matrices.

Each property runs a bounded number of examples in the default run (CI); the same properties
run with many more examples behind the `large` marker:

    python -m pytest -q tests/inputs/test_properties.py -m large
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import backends, numpy_loop
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tridiax import verify
from tridiax._banded.api import solve as solve_banded
from tridiax._block.api import solve as solve_block
from tridiax._recurrence.api import recurrence
from tridiax._tridiagonal.api import solve

CI_EXAMPLES, LARGE_EXAMPLES = 50, 500
MAX_VALUES = 60_000  # per example: keeps a large run to minutes
DTYPES = (np.float32, np.float64, np.complex64, np.complex128)


def property_tests(prop, ci_examples=CI_EXAMPLES):
    """The property as two tests: a bounded one, and a long one marked `large`."""

    def make(examples, derandomize):
        return settings(max_examples=examples, deadline=None, derandomize=derandomize,
                        suppress_health_check=[HealthCheck.too_slow])(given(st.data())(prop))

    return make(ci_examples, True), pytest.mark.large(make(LARGE_EXAMPLES, False))


@st.composite
def layouts(draw, max_n=2000):
    """(shape, axis, operand shapes for 4 operands) with 1 to 4 dimensions, a solve axis of
    1 to max_n rows and batch sizes 1 to 9 (rarely a multiple of a block)."""
    ndim = draw(st.integers(1, 4))
    axis = draw(st.integers(-ndim, ndim - 1))
    n = draw(st.one_of(st.integers(1, 8), st.integers(1, max_n)))
    shape = [draw(st.integers(1, 9)) for _ in range(ndim)]
    shape[axis] = n
    while math.prod(shape) > MAX_VALUES:
        k = max((i for i in range(ndim) if i != axis % ndim), key=lambda i: shape[i], default=None)
        if k is None or shape[k] == 1:
            shape[axis] = max(1, MAX_VALUES // max(1, math.prod(shape) // shape[axis]))
        else:
            shape[k] = max(1, shape[k] // 2)
    shape = tuple(shape)

    def operand_shape(may_drop):
        # Broadcasting: any dimension may be 1, and a band's leading dimensions may be missing
        # (the rhs keeps every dimension, so a non-negative axis stays in range).
        kept = [s if draw(st.booleans()) else 1 for s in shape]
        drop = draw(st.integers(0, ndim - 1)) if may_drop and draw(st.booleans()) else 0
        return tuple(kept[drop:])

    return shape, axis, [operand_shape(k < 3) for k in range(4)]


def draw_array(rng, shape, dtype):
    x = rng.uniform(-1, 1, shape)
    if np.issubdtype(dtype, np.complexfloating):
        x = x + 1j * rng.uniform(-1, 1, shape)
    return x


def _solve_property(data):
    # Matrices: diagonally dominant; random non-dominant (every band uniform in [-1, 1]; their
    # conditioning grows exponentially with N, so N <= 100); 1-D Helmholtz (-1, 2 - (kh)^2, -1)
    # with kh in [1, 1.5] per system: indefinite, the case pivoting exists for.
    matrix = data.draw(st.sampled_from(["dominant", "random", "helmholtz"]), label="matrix")
    shape, axis, shapes = data.draw(layouts(max_n=100 if matrix == "random" else 2000),
                                    label="layout")
    dtype = np.dtype(data.draw(st.sampled_from(DTYPES), label="dtype"))
    backend = data.draw(st.sampled_from(backends(dtype)), label="backend")
    dominant = matrix == "dominant"
    pivoting = data.draw(st.booleans(), label="pivoting") if dominant else True
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    lower, diag, upper, rhs = (draw_array(rng, s, dtype) for s in shapes)
    if dominant:  # |diag| >= 2.5 > |lower| + |upper| in every row, whatever broadcasts
        diag = diag + 3 * np.where(np.real(diag) >= 0, 1, -1)
    elif matrix == "helmholtz":
        lower, upper = -np.ones(shapes[0]), -np.ones(shapes[2])
        constant = tuple(1 if k == len(shapes[1]) + axis % len(shape) - len(shape) else size
                         for k, size in enumerate(shapes[1]))
        diag = 2 - rng.uniform(1, 1.5, constant) ** 2
    args = [np.asarray(a).astype(dtype) for a in (lower, diag, upper, rhs)]
    expected_shape = np.broadcast_shapes(*(a.shape for a in args))
    reference = verify.reference_solve(*args, axis=axis)
    # A nearly singular draw: no precision can be asked of it (its solution may not even be
    # representable in float32).
    assume(np.max(np.abs(reference)) < 1e12 * max(np.max(np.abs(args[3])), 1e-30))
    if backend == "pallas_interpret" and expected_shape[axis] > 300:
        backend = "xla"  # interpret mode steps row by row in Python-level ops: slow for big N
    try:
        x = solve(*(jnp.asarray(a) for a in args), axis=axis, backend=backend, pivoting=pivoting)
    except ValueError as err:
        # A band of lower rank whose size also matches the solve axis is refused rather than
        # guessed (README, "Shapes and axis"): only that refusal is a valid outcome here.
        ambiguous = any(len(s) < len(shape) and n > 1 and n in s
                        for s, n in ((s, expected_shape[axis]) for s in shapes[:3]))
        assert ambiguous and "does not guess which was meant" in str(err), err
        assume(False)
    assert x.shape == expected_shape and x.dtype == dtype
    x = np.asarray(x)
    n, eps = expected_shape[axis], np.finfo(dtype).eps
    backward = verify.relative_residual(*args[:3], x, args[3], axis=axis)
    assert np.all(backward < 20 * max(n, 2) * eps), np.max(backward)
    if dominant:  # well conditioned (cond <= 5): the forward error is small too
        error = np.max(np.abs(x - reference)) / max(np.max(np.abs(reference)), 1e-30)
        assert error < 100 * max(n, 2) * eps


def _banded_property(data):
    # Bands of widths 0..4 below and above, dominant (with or without pivoting) or random
    # (pivoting; N <= 100: conditioning grows with N); a band's shape broadcasts like a
    # tridiagonal band's, b keeps every dimension.
    l, u = data.draw(st.integers(0, 4), label="l"), data.draw(st.integers(0, 4), label="u")
    dominant = data.draw(st.booleans(), label="dominant")
    shape, axis, shapes = data.draw(layouts(max_n=600 if dominant else 100), label="layout")
    dtype = np.dtype(data.draw(st.sampled_from(DTYPES), label="dtype"))
    backend = data.draw(st.sampled_from(backends(dtype)), label="backend")
    pivoting = data.draw(st.booleans(), label="pivoting") if dominant else True
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    band_shape, b_shape = shapes[1], shapes[3]
    ab = draw_array(rng, (l + u + 1,) + band_shape, dtype)
    if dominant:
        ab[u] = ab[u] + (l + u + 1.5) * np.where(np.real(ab[u]) >= 0, 1, -1)
    ab, b = ab.astype(dtype), draw_array(rng, b_shape, dtype).astype(dtype)
    full = np.broadcast_shapes(band_shape, b_shape)
    try:
        reference = verify.reference_solve_banded((l, u), ab, b, axis=axis)
    except ValueError:
        assume(False)  # a (bands, N) ab is one matrix along `axis`: its N must fit there
    assume(np.all(np.isfinite(reference)))
    assume(np.max(np.abs(reference)) < 1e10 * max(np.max(np.abs(b)), 1e-30))
    if backend == "pallas_interpret" and full[axis] > 200:
        backend = "xla"
    try:
        x = solve_banded((l, u), jnp.asarray(ab), jnp.asarray(b), axis=axis, backend=backend,
                         pivoting=pivoting)
    except ValueError as err:
        assert "does not guess which was meant" in str(err) or "fit" in str(err), err
        assume(False)
    assert x.shape == reference.shape and x.dtype == dtype
    x = np.moveaxis(np.broadcast_to(np.asarray(x, np.complex128), full), axis, -1)
    bands = np.moveaxis(np.broadcast_to(ab.reshape(
        (l + u + 1,) + (1,) * (len(full) - len(band_shape)) + band_shape),
        (l + u + 1,) + full), axis + 1 if axis >= 0 else axis, -1).astype(np.complex128)
    n, eps = full[axis], np.finfo(dtype).eps
    product, row_sums = np.zeros_like(x), np.zeros(x.shape)
    for k in range(l + u + 1):  # (A x)[i] += ab[k, j] x[j] with i = j + k - u
        s = k - u
        if abs(s) >= n:
            continue
        lo_j, hi_j = max(0, -s), min(n, n - s)
        product[..., lo_j + s:hi_j + s] += bands[k][..., lo_j:hi_j] * x[..., lo_j:hi_j]
        row_sums[..., lo_j + s:hi_j + s] += np.abs(bands[k][..., lo_j:hi_j])
    rhs = np.moveaxis(np.broadcast_to(b, full), axis, -1)
    inf = lambda v: np.max(np.abs(v), axis=-1)  # noqa: E731
    backward = inf(product - rhs) / np.maximum(inf(row_sums) * inf(x) + inf(rhs), 1e-300)
    assert np.all(backward < 50 * max(n, 2) * eps), np.max(backward)
    if dominant:
        error = np.max(np.abs(np.moveaxis(x, -1, axis) - reference)) / max(
            np.max(np.abs(reference)), 1e-30)
        assert error < 200 * max(n, 2) * eps


def _recurrence_property(data):
    shape, axis, shapes = data.draw(layouts(max_n=1000), label="layout")
    dtype = np.dtype(data.draw(st.sampled_from(DTYPES), label="dtype"))
    backend = data.draw(st.sampled_from(backends(dtype)), label="backend")
    reverse = data.draw(st.booleans(), label="reverse")
    complex_ = np.issubdtype(dtype, np.complexfloating)
    relu = data.draw(st.booleans(), label="relu") and not complex_
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    a = draw_array(rng, shapes[0], dtype) / (np.sqrt(2) if complex_ else 1)  # |a| <= 1
    x = draw_array(rng, shapes[3], dtype)  # full rank: `axis` is in range
    a, x = np.asarray(a).astype(dtype), np.asarray(x).astype(dtype)
    full = np.broadcast_shapes(a.shape, x.shape)
    state = full[: axis % len(full)] + full[axis % len(full) + 1:]
    initial = rng.uniform(-1, 1, state).astype(dtype) if data.draw(st.booleans()) else None
    if backend == "pallas_interpret" and full[axis] > 300:
        backend = "xla"
    activation = (lambda v: np.maximum(v, 0)) if relu else (lambda v: v)
    h = recurrence(jnp.asarray(a), jnp.asarray(x), axis=axis, reverse=reverse, initial=initial,
                   activation=jax.nn.relu if relu else None, backend=backend)
    expected = numpy_loop(a, x, axis=axis % len(full), reverse=reverse, initial=initial,
                          activation=activation)
    assert h.shape == full and h.dtype == dtype
    scale = max(np.max(np.abs(expected)), 1.0)
    # |a| <= 1: rounding errors do not grow; each step adds a few eps.
    tolerance = 10 * max(full[axis], 2) * np.finfo(dtype).eps
    assert np.max(np.abs(np.asarray(h) - expected)) / scale < tolerance


test_solve_property, test_solve_property_large = property_tests(_solve_property)
test_recurrence_property, test_recurrence_property_large = property_tests(_recurrence_property)
test_banded_property, test_banded_property_large = property_tests(_banded_property)


def _block_property(data):
    # Blocks of size 1..4, block diagonally dominant (with or without pivoting) or random
    # (pivoting; N <= 30), each block array with its own broadcast shape; rhs (..., k, m).
    k = data.draw(st.integers(1, 4), label="k")
    m = data.draw(st.integers(1, 3), label="m")
    dominant = data.draw(st.booleans(), label="dominant")
    shape, axis, shapes = data.draw(layouts(max_n=200 if dominant else 30), label="layout")
    dtype = np.dtype(data.draw(st.sampled_from(DTYPES), label="dtype"))
    backend = data.draw(st.sampled_from(backends(dtype)), label="backend")
    pivoting = data.draw(st.booleans(), label="pivoting") if dominant else True
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    lower, diag, upper = (draw_array(rng, s + (k, k), dtype) for s in shapes[:3])
    if dominant:
        diag = diag + 3 * k * np.eye(k)
    rhs = draw_array(rng, shapes[3] + (k, m), dtype)
    arrays = [v.astype(dtype) for v in (lower, diag, upper, rhs)]
    reference = verify.reference_solve_block_tridiagonal(*arrays, axis=axis)
    assume(np.all(np.isfinite(reference)))
    assume(np.max(np.abs(reference)) < 1e6 * max(np.max(np.abs(rhs)), 1e-30))
    if backend == "pallas_interpret" and shape[axis] > 50:
        backend = "xla"
    try:
        x = solve_block(*(jnp.asarray(v) for v in arrays), axis=axis, pivoting=pivoting,
                        backend=backend)
    except ValueError as err:  # rank-less blocks against an (..., k, k) rhs: both readings fit
        assert "does not guess" in str(err), err
        assume(False)
    assert x.shape == reference.shape and x.dtype == dtype
    scale = np.max(np.abs(reference))
    error = np.max(np.abs(np.asarray(x, np.complex128) - reference)) / scale
    # Backward-stable elimination of a system whose condition number the assumptions bound.
    assert error < 1e4 * k * np.finfo(dtype).eps * (1 if dominant else 100), error


# Fewer examples in CI: every example compiles a new shape of a k x k elimination.
test_block_property, test_block_property_large = property_tests(_block_property, ci_examples=15)
