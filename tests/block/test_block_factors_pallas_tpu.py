"""The block-tridiagonal factorization and factored-solve kernels,
`_block/pallas_tpu_factors.py`, on CPU, the primitives that run them on a TPU
(`_block/primitive.py`) under vmap and reverse mode, and `BlockTridiagonal.factor()` through
the public API with those kernels preferred.

The factors are XLA's (`_xla_block.factor_pnq`, the same elimination step for step): they must
agree with them, the pivots exactly. The solves, A x = b and A^T x = b from those factors, are
held to scipy's solution of the assembled matrices, within the error of XLA's factored solve
in the same dtype (the plain sweep). The cases cover each arrangement of the operands (block
entries inside rows, their columns first, rows inside entries), systems over two chunks,
batch-first systems (taken along lanes), blocks broadcast (one matrix for every system: its
factors SMEM scalars to the solves; blocks constant along N: row tiles), k = 1, 3 and 5,
systems of 1, 2 and 3 block rows, every kind, float32, bfloat16 and complex64. Three cases
run in TPU interpret mode (TPU semantics, VMEM starting as NaNs: `TPU_SEMANTICS`), the others
in Pallas's HLO interpreter (the same kernel, a fraction of the time). The kernels compiled for a
TPU without one: tests/tpu/test_tpu_compile.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from block_contract import dense, problem, reference, residual
from helpers import check_factor_primitives, count_factor_kernel_runs

import tridiax
from tridiax._block import pallas_tpu_factors as _tpu_factors
from tridiax._block import xla as _xla_block
from tridiax._block.primitive import block_factor_p, block_factored_solve_p
from tridiax._core import backend as _backend
from tridiax._pallas import tpu as _tpu

pytestmark = pytest.mark.skipif(not _tpu.available(), reason="this JAX has no Pallas TPU backend")

# (kind, (P, N, Q), k, m, broadcast of the blocks or None, dtype), in three groups, each a test
# function whose first case runs in the fast tier and CI.
LAYOUTS = [
    ("block_pivoted", (3, 33, 5), 2, 3, None, np.float32),  # b's columns first
    ("block_pivoted", (2, 300, 130), 2, 1, None, np.float32),  # entries inside rows, 2 chunks
    ("block", (129, 300, 1), 3, 2, None, np.float32),  # batch-first, rows inside entries
    ("block_pivoted", (3, 40, 5), 2, 1, ("1N1", "1N1", "1N1"), np.float32),  # one matrix
    ("block", (3, 40, 5), 2, 1, ("P1Q", "PNQ", "PNQ"), np.float32),  # lower constant along N
]
SHAPES = [
    ("block_pivoted", (2, 1, 5), 2, 1, None, np.float32),
    ("block_pivoted", (2, 2, 5), 3, 1, None, np.float32),
    ("block", (2, 3, 5), 1, 1, None, np.float32),
    ("block_hermitian", (3, 7, 5), 2, 2, None, np.float32),
    ("block_pivoted", (3, 9, 4), 5, 1, None, np.float32),
]
DTYPES = [
    ("block_pivoted", (3, 9, 5), 2, 1, None, np.complex64),
    ("block_pivoted", (2, 17, 19), 3, 1, None, jnp.bfloat16),  # staged rows, x in place
    ("block", (21, 7, 1), 3, 2, None, np.complex64),
]
# Cases run in TPU interpret mode (the others in the HLO interpreter): a one-row system and
# complex64 (the first cases of their groups: CI runs them), and two chunks.
TPU_SEMANTICS = (SHAPES[0], DTYPES[0], LAYOUTS[1])


def _id(case):
    kind, shape, k, m, broadcast, dtype = case
    where = "-".join(broadcast) if broadcast else "full"
    return f"{kind}-{'x'.join(map(str, shape))}-k{k}-m{m}-{where}-{np.dtype(dtype).name}"


def _compute(dtype):
    return np.complex64 if np.issubdtype(np.dtype(dtype), np.complexfloating) else np.float32


@functools.cache
def _factor(kind, dtype, kernel):
    """XLA's factorization, or the kernel's (in TPU interpret mode when `kernel` is "tpu",
    Pallas's HLO interpreter when "hlo")."""
    options = dict(kind=kind, out_dtype=_compute(dtype))
    if not kernel:
        return jax.jit(functools.partial(_xla_block.factor_pnq, **options))
    interpret = _tpu.interpret_params() if kernel == "tpu" else True
    return jax.jit(functools.partial(_tpu_factors.factor_pnq, interpret=interpret, **options))


@functools.cache
def _factored_solve(transposed, dtype, kernel):
    options = dict(transposed=transposed, out_dtype=dtype)
    if not kernel:
        return jax.jit(functools.partial(_xla_block.factored_solve_pnq, **options))
    interpret = _tpu.interpret_params() if kernel == "tpu" else True
    return jax.jit(functools.partial(_tpu_factors.factored_solve_pnq, interpret=interpret,
                                     **options))


def _error(x, want):
    """Largest error of each system (P, Q), relative to its largest value."""
    x = np.asarray(x).astype(want.dtype)
    error = np.max(np.abs(x - want), axis=(1, 3, 4))
    return error / np.maximum(np.max(np.abs(want), axis=(1, 3, 4)), 1e-30)


@pytest.mark.parametrize("case", LAYOUTS, ids=_id)
def test_every_layout(case):
    _check_factors_and_solves(case, "tpu" if case in TPU_SEMANTICS else "hlo")


@pytest.mark.parametrize("case", SHAPES, ids=_id)
def test_short_systems_every_kind_and_block_size(case):
    _check_factors_and_solves(case, "tpu" if case in TPU_SEMANTICS else "hlo")


@pytest.mark.parametrize("case", DTYPES, ids=_id)
def test_complex_and_half_precision(case):
    _check_factors_and_solves(case, "tpu" if case in TPU_SEMANTICS else "hlo")


def _check_factors_and_solves(case, kernel):
    """The factors equal XLA's (the pivots exactly); A x = b and A^T x = b from them are held to
    scipy's solution within 1.5x the error of XLA's factored solve in the same dtype."""
    kind, shape, k, m, broadcast, dtype = case
    (lower, diag, upper, b), clean = problem(kind, shape, k, m, broadcast, dtype=dtype,
                                             seed=sum(shape) + k)
    lower, diag, upper, b = (jnp.asarray(x) for x in (lower, diag, upper, b))
    got = _factor(kind, dtype, kernel)(lower, diag, upper)
    want = _factor(kind, dtype, None)(lower, diag, upper)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
    for g, w in (got[0], want[0]), (got[2], want[2]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=1e-6)
    eps = float(jnp.finfo(dtype).eps)
    for transposed in (False, True):
        exact = reference(clean, np.asarray(b), transposed)
        x = _factored_solve(transposed, dtype, kernel)(*got, lower, b)
        sweep = _factored_solve(transposed, dtype, None)(*want, lower, b)
        assert x.shape == b.shape and x.dtype == b.dtype
        error, allowed = _error(x, exact), 1.5 * _error(sweep, exact) + 4 * eps
        assert np.all(error <= allowed), (transposed, float(np.max(error / allowed)))


def _problem(shape=(2, 40, 3), k=2):
    (lower, diag, upper, b), _ = problem("block_pivoted", shape, k, 2, dtype=np.float32, seed=3)
    return [jnp.asarray(np.nan_to_num(x)) for x in (lower, diag, upper)], jnp.asarray(b)


def _factor_and_solve(backend, blocks, b, *, axis=1):
    # the primitives take the systems' dimensions before the two block dimensions: (P, N, Q)
    factors = block_factor_p.bind(*blocks, axis=axis, kind="block_pivoted", backend=backend)

    def solve(b):
        return block_factored_solve_p.bind(*factors, blocks[0], b, axis=axis, transposed=False,
                                           backend=backend)

    x, vjp = jax.vjp(solve, b)
    return factors, x, vjp(jnp.cos(x))[0]  # the cotangent: one transposed factored solve


def test_primitives_run_the_kernels_under_reverse_mode_and_vmap(monkeypatch):
    """The primitives on the interpreted TPU backend, with a cotangent and under vmap
    (`check_factor_primitives`)."""
    runs = count_factor_kernel_runs(monkeypatch, _tpu_factors)
    blocks, b = _problem()
    check_factor_primitives(_factor_and_solve, blocks, b, runs)


def test_factored_solves_too_long_for_vmem_stream_y(monkeypatch):
    """The factorization keeps no system in VMEM: its VMEM does not grow with N. A factored
    solve keeps y (z) of every system: where no row tile holds it, two kernels run, y going
    through HBM, with XLA's results (batch-first systems, three chunks); under a budget too
    small even for those and for the factorization, XLA's loops run, with the same results."""
    launched, call = [], _tpu.call

    def counted_call(*args, **options):
        launched.append(options["name"])
        return call(*args, **options)

    monkeypatch.setattr(_tpu, "call", counted_call)
    kind, shape, k, m = "block", (130, 300, 1), 3, 2
    (lower, diag, upper, b), clean = problem(kind, shape, k, m, dtype=np.float32, seed=5)
    lower, diag, upper, b = (jnp.asarray(x) for x in (lower, diag, upper, b))
    want = _xla_block.factor_pnq(lower, diag, upper, kind=kind, out_dtype=np.float32)
    for budget, factor_kernels, kernels in ((3 << 20, 1, ("forward", "backward")),
                                            (1 << 19, 0, ())):
        monkeypatch.setattr(_tpu, "VMEM_BUDGET", budget)
        launched.clear()
        factors = _tpu_factors.factor_pnq(lower, diag, upper, kind=kind, out_dtype=np.float32,
                                          interpret=True)
        assert len(launched) == factor_kernels
        for g, w in zip(factors, want, strict=True):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
        for transposed in (False, True):
            launched.clear()
            x = _tpu_factors.factored_solve_pnq(*factors, lower, b, transposed=transposed,
                                                out_dtype=np.float32, interpret=True)
            assert tuple(name.split("_")[-2] for name in launched) == kernels
            np.testing.assert_array_equal(np.asarray(x), np.asarray(_xla_block.factored_solve_pnq(
                *want, lower, b, transposed=transposed, out_dtype=np.float32)))
            assert residual(clean, np.asarray(b), np.asarray(x), transposed) < 1e-4


def test_an_operators_factorization_runs_the_kernels_through_the_public_api(monkeypatch):
    """`BlockTridiagonal.factor()`, `.solve` and `.T.solve` as a user calls them, with the TPU
    kernels preferred as on a TPU (here in Pallas's HLO interpreter), block rows along axis 0
    of three systems: A x = b and A^T x = b against dense solves, the gradient w.r.t. the
    blocks and b against the adjoint of a dense solve in float64, and each kernel (the
    factorization, both factored solves) ran."""
    kind, n, k, systems = "block_pivoted", 20, 2, 3
    (lower, diag, upper, b), clean = problem(kind, (1, n, systems), k, dtype=np.float32, seed=11)
    # (N, 3, k, k) blocks, b (N, 3, k): the systems after the block rows
    lower, diag, upper, b = (np.nan_to_num(x[0]) for x in (lower, diag, upper, b))
    b = b[..., 0]
    runs = count_factor_kernel_runs(monkeypatch, _tpu_factors)
    monkeypatch.setitem(_backend.PREFERENCE, "cpu", ("pallas_tpu_interpret", "xla"))

    matrices = dense(*clean, n)[0]  # (3, N k, N k)
    b_systems = np.moveaxis(b, 1, 0).reshape(systems, n * k).astype(np.float64)
    factor = jax.jit(lambda *blocks: tridiax.BlockTridiagonal(*blocks, axis=0).factor())
    factors = factor(*(jnp.asarray(x) for x in (lower, diag, upper)))
    for f, a in ((factors, matrices), (factors.T, np.swapaxes(matrices, 1, 2))):
        x = np.asarray(jax.jit(lambda f, b: f.solve(b))(f, jnp.asarray(b)))
        want = np.linalg.solve(a, b_systems[..., None])[..., 0]
        np.testing.assert_allclose(np.moveaxis(x, 1, 0).reshape(systems, n * k), want,
                                   rtol=1e-4, atol=1e-5 * np.abs(want).max())

    weights = np.random.default_rng(2).standard_normal(b.shape)

    def loss(lower, diag, upper, b):
        x = tridiax.BlockTridiagonal(lower, diag, upper, axis=0).factor().solve(b)
        return jnp.sum(weights.astype(np.float32) * x)

    # the adjoint in float64: dL/db = A^-T w, dL/dA = -(A^-T w) x^T, read at each block
    w_systems = np.moveaxis(weights, 1, 0).reshape(systems, n * k)
    adjoint = np.linalg.solve(np.swapaxes(matrices, 1, 2), w_systems[..., None])[..., 0]
    x = np.linalg.solve(matrices, b_systems[..., None])[..., 0]
    grad_a = -adjoint[:, :, None] * x[:, None, :]  # (3, N k, N k)

    def block(i, j):  # block (i, j) of every system's gradient, (3, k, k)
        return grad_a[:, i * k:(i + 1) * k, j * k:(j + 1) * k]

    zero = np.zeros((systems, k, k))
    want_blocks = [np.stack([block(i, i - 1) if i else zero for i in range(n)]),
                   np.stack([block(i, i) for i in range(n)]),
                   np.stack([block(i, i + 1) if i < n - 1 else zero for i in range(n)])]
    want_b = np.moveaxis(adjoint.reshape(systems, n, k), 0, 1)
    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(
        *(jnp.asarray(x) for x in (lower, diag, upper, b)))
    for g, w in zip(got, (*want_blocks, want_b), strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=1e-3,
                                   atol=1e-4 * np.abs(w).max())
    assert runs["factor_pnq", None] >= 2
    assert runs["factored_solve_pnq", False] >= 2 and runs["factored_solve_pnq", True] >= 2
