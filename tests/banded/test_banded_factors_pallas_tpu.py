"""The banded factorization and factored-solve kernels, `_banded/pallas_tpu_factors.py`, in TPU
interpret mode (TPU semantics on CPU, VMEM starting as NaNs), and the primitives that run them
on a TPU (`_banded/primitive.py`) under vmap and reverse mode, and `Banded.factor()` through
the public API with those kernels preferred.

The factors are XLA's (`_xla_banded.factor_pnq`, the same elimination step for step): they
must agree with them, the pivots exactly. The solves, A x = b and A^T x = b from those
factors, are held to scipy's solution of the same matrices, within the error of XLA's
factored solve in the same dtype (the plain sweep). The cases cover every layout of the
kernels, each over two chunks ("sublanes", whose elimination reads the halo; "lanes";
"transposed" batch-first systems), one matrix for every system (its factors SMEM scalars to
the solves), bands with no sub- or super-diagonals or neither (carries of no row tile),
systems of 1, 2 and 3 rows, float32, bfloat16 and complex64. The kernels
compiled for a TPU without one: tests/tpu/test_tpu_compile.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from banded_contract import bands, dense, problem, reference
from helpers import check_factor_primitives, count_factor_kernel_runs

import tridiax
from tridiax._banded import pallas_tpu_factors as _tpu_factors
from tridiax._banded import xla as _xla_banded
from tridiax._banded.primitive import banded_factor_p, banded_factored_solve_p
from tridiax._core import backend as _backend
from tridiax._pallas import tpu as _tpu

pytestmark = pytest.mark.skipif(not _tpu.available(), reason="this JAX has no Pallas TPU backend")

# (l, u, kind, (P, N, Q), ab's (P, N, Q) or None (full), dtype), in three groups, each a test
# function whose first case runs in the fast tier and CI: the layouts, the bands and sizes,
# the dtypes.
LAYOUTS = [
    (2, 1, "banded_pivoted", (3, 300, 5), None, np.float32),  # "sublanes", two chunks
    (1, 2, "banded", (2, 300, 130), None, np.float32),  # "lanes", two chunks
    (2, 2, "banded_pivoted", (129, 40, 1), None, np.float32),  # "transposed"
    (2, 1, "banded_pivoted", (129, 300, 1), None, np.float32),  # "transposed", two chunks
    # one matrix for every system: its factors are SMEM scalars to the factored solves
    (2, 1, "banded_pivoted", (3, 300, 5), (1, 300, 1), np.float32),
]
SHAPES = [
    (2, 2, "banded_pivoted", (2, 1, 5), None, np.float32),
    (2, 1, "banded_pivoted", (2, 2, 5), None, np.float32),
    (1, 2, "banded", (2, 3, 5), None, np.float32),
    (0, 2, "banded", (3, 7, 5), None, np.float32),
    (2, 0, "banded", (3, 33, 5), None, np.float32),  # U of one row: carries of no row tile
    (0, 0, "banded", (3, 7, 5), None, np.float32),
    (3, 0, "banded_pivoted", (3, 33, 5), None, np.float32),
]
DTYPES = [
    (2, 1, "banded_pivoted", (3, 40, 5), None, np.complex64),
    (1, 2, "banded_pivoted", (2, 40, 130), None, jnp.bfloat16),
    (2, 2, "banded_pivoted", (130, 33, 1), None, np.complex64),
]


def _id(case):
    l, u, kind, shape, ab, dtype = case
    return f"{l}-{u}-{kind}-{'x'.join(map(str, shape))}{'-one-matrix' if ab else ''}-{np.dtype(dtype).name}"


def _compute(dtype):
    return np.complex64 if np.issubdtype(np.dtype(dtype), np.complexfloating) else np.float32


@functools.cache
def _factor(l, u, kind, shape, dtype, kernel):
    fn = _tpu_factors.factor_pnq if kernel else _xla_banded.factor_pnq
    options = dict(l=l, u=u, kind=kind, shape=shape, out_dtype=_compute(dtype))
    if kernel:
        options["interpret"] = _tpu.interpret_params()
    return jax.jit(functools.partial(fn, **options))


@functools.cache
def _factored_solve(transposed, dtype, kernel):
    fn = _tpu_factors.factored_solve_pnq if kernel else _xla_banded.factored_solve_pnq
    options = dict(transposed=transposed, out_dtype=dtype)
    if kernel:
        options["interpret"] = _tpu.interpret_params()
    return jax.jit(functools.partial(fn, **options))


def _error(x, want):
    """Largest error of each system (P, Q), relative to its largest value."""
    x = np.asarray(x).astype(want.dtype)
    return np.max(np.abs(x - want), axis=1) / np.maximum(np.max(np.abs(want), axis=1), 1e-30)


@pytest.mark.parametrize("case", LAYOUTS, ids=_id)
def test_every_layout(case):
    _check_factors_and_solves(case)


@pytest.mark.parametrize("case", SHAPES, ids=_id)
def test_short_systems_and_every_band_shape(case):
    _check_factors_and_solves(case)


@pytest.mark.parametrize("case", DTYPES, ids=_id)
def test_complex_and_half_precision(case):
    _check_factors_and_solves(case)


def _check_factors_and_solves(case):
    """The factors equal XLA's (the pivots exactly); A x = b and A^T x = b from them are held to
    scipy's solution within 1.5x the error of XLA's factored solve in the same dtype."""
    l, u, kind, shape, ab_shape, dtype = case
    ab, b, clean = problem(l, u, kind, shape, ab_shape, dtype=dtype, seed=sum(shape) + l)
    ab, b = jnp.asarray(ab), jnp.asarray(b)
    band = ab.shape[1:]
    got = _factor(l, u, kind, band, dtype, True)(ab)
    want = _factor(l, u, kind, band, dtype, False)(ab)
    for g, w in zip(got[:2], want[:2], strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(got[2]), np.asarray(want[2]))
    eps = float(jnp.finfo(dtype).eps)
    for transposed in (False, True):
        exact = reference(clean, np.asarray(b), l, u, transposed)
        x = _factored_solve(transposed, dtype, True)(*got, b)
        sweep = _factored_solve(transposed, dtype, False)(*want, b)
        assert x.shape == b.shape and x.dtype == b.dtype
        error, allowed = _error(x, exact), 1.5 * _error(sweep, exact) + 4 * eps
        assert np.all(error <= allowed), (transposed, float(np.max(error / allowed)))


def _problem(shape=(2, 40, 3), l=2, u=1):
    ab, b, _ = problem(l, u, "banded_pivoted", shape, dtype=np.float32, seed=3)
    return jnp.asarray(np.nan_to_num(ab)), jnp.asarray(b)


def _factor_and_solve(backend, ab, b, *, axis=1):
    factors = banded_factor_p.bind(ab, l=2, u=1, axis=axis, kind="banded_pivoted", backend=backend)

    def solve(b):
        return banded_factored_solve_p.bind(*factors, b, axis=axis, transposed=False, backend=backend)

    x, vjp = jax.vjp(solve, b)
    return factors, x, vjp(jnp.cos(x))[0]  # the cotangent: one transposed factored solve


def test_primitives_run_the_kernels_under_reverse_mode_and_vmap(monkeypatch):
    """The primitives on the interpreted TPU backend, with a cotangent and under vmap
    (`check_factor_primitives`)."""
    runs = count_factor_kernel_runs(monkeypatch, _tpu_factors)
    ab, b = _problem()
    check_factor_primitives(_factor_and_solve, ab, b, runs)


def test_factors_too_long_for_vmem_run_xla_loops(monkeypatch):
    """The VMEM plan narrows the row tile for longer systems; where no row tile holds a
    system's factors, the factorization and its solves run XLA's loops, with the same
    results."""
    l, u, kind, shape = 2, 1, "banded_pivoted", (1, 300, 1024)
    ab, b, clean = problem(l, u, kind, shape, dtype=np.float32, seed=5)
    ab, b = jnp.asarray(ab), jnp.asarray(b)
    wide = _tpu_factors._factor_plan(*shape, ab, np.float32, l=l, u=u, kind=kind)
    monkeypatch.setattr(_tpu, "VMEM_BUDGET", 6 << 20)
    narrow = _tpu_factors._factor_plan(*shape, ab, np.float32, l=l, u=u, kind=kind)
    assert narrow is not None and narrow.s < wide.s
    monkeypatch.setattr(_tpu, "VMEM_BUDGET", 1 << 16)
    assert _tpu_factors._factor_plan(*shape, ab, np.float32, l=l, u=u, kind=kind) is None
    factors = _tpu_factors.factor_pnq(ab, l=l, u=u, kind=kind, shape=shape, out_dtype=np.float32)
    stacks = (factors[0], factors[1], factors[2][None])  # the pivots as a stack of one
    assert _tpu_factors._solve_plan(*shape, stacks, b, np.float32) is None
    want = _xla_banded.factor_pnq(ab, l=l, u=u, kind=kind, shape=shape, out_dtype=np.float32)
    for g, w in zip(factors, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    for transposed in (False, True):
        x = _tpu_factors.factored_solve_pnq(*factors, b, transposed=transposed, out_dtype=np.float32)
        exact = reference(clean, np.asarray(b), l, u, transposed)
        np.testing.assert_array_equal(
            np.asarray(x), np.asarray(_xla_banded.factored_solve_pnq(*want, b, transposed=transposed,
                                                                     out_dtype=np.float32)))
        assert np.max(_error(x, exact)) < 1e-3


def test_an_operators_factorization_runs_the_kernels_through_the_public_api(monkeypatch):
    """`Banded.factor()`, `.solve` and `.T.solve` as a user calls them, with the TPU kernels
    preferred as on a TPU (here in Pallas's HLO interpreter), systems along axis 0: A x = b and
    A^T x = b against dense solves, the gradient w.r.t. the bands and b against the adjoint of
    a dense solve in float64, and each kernel (the factorization, both factored solves) ran."""
    l, u, kind, n, systems = 2, 1, "banded_pivoted", 40, 3
    ab, b, clean = problem(l, u, kind, (1, n, systems), dtype=np.float32, seed=11)
    ab, b, clean = np.nan_to_num(ab[:, 0]), b[0], clean[:, 0]  # (K, N, 3), (N, 3)
    runs = count_factor_kernel_runs(monkeypatch, _tpu_factors)
    monkeypatch.setitem(_backend.PREFERENCE, "cpu", ("pallas_tpu_interpret", "xla"))

    matrices = dense(np.moveaxis(clean, -1, 1), l, u)  # (3, N, N)
    factors = jax.jit(lambda ab: tridiax.Banded(ab, (l, u), axis=0).factor())(jnp.asarray(ab))
    for f, a in ((factors, matrices), (factors.T, np.swapaxes(matrices, 1, 2))):
        x = np.asarray(jax.jit(lambda f, b: f.solve(b))(f, jnp.asarray(b)))
        want = np.linalg.solve(a, b.T.astype(np.float64)[..., None])[..., 0].T
        np.testing.assert_allclose(x, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())

    weights = np.random.default_rng(2).standard_normal((n, systems))

    def loss(ab, b):
        x = tridiax.Banded(ab, (l, u), axis=0).factor().solve(b)
        return jnp.sum(weights.astype(np.float32) * x)

    # the adjoint in float64: dL/db = A^-T w, dL/dA = -(A^-T w) x^T, on the bands (NaN outside)
    adjoint = np.linalg.solve(np.swapaxes(matrices, 1, 2), weights.T[..., None])[..., 0]
    x = np.linalg.solve(matrices, b.T.astype(np.float64)[..., None])[..., 0]
    want_ab = np.stack([bands(-np.outer(adjoint[q], x[q]), l, u) for q in range(systems)], -1)
    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(ab), jnp.asarray(b))
    for g, w in zip(got, (want_ab, adjoint.T), strict=True):
        g, inside = np.asarray(g, np.float64), np.isfinite(w)
        np.testing.assert_allclose(g[inside], w[inside], rtol=1e-3,
                                   atol=1e-4 * np.abs(w[inside]).max())
    assert runs["factor_pnq", None] >= 2
    assert runs["factored_solve_pnq", False] >= 2 and runs["factored_solve_pnq", True] >= 2
