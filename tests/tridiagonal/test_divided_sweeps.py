"""The XLA, Pallas and Mosaic GPU sweeps divide by their pivots, in the order of
`verify.sequential_solve`.

Multiplying by a rounded reciprocal of each pivot instead (1/p, then u*(1/p) and
(b - a y')*(1/p)) repeats one rounding error on every row of a constant-coefficient system: an
implicit heat step (I - r D2, r = 50, N = 256) lost 7-8x the dividing sweep's accuracy in
float32 and 2x in float64, in every kind (thomas, pivoted, periodic, factored). Here each
backend's error must stay within 1.5x the sequential sweep's in the same precision, against
that sweep in a wider one. On a GPU, Triton compiles a float32 `/` to an approximate quotient
(PTX div.full.f32): the Triton kernels divide with div.rn.f32, checked in the lowered IR.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import triton_kernels

import tridiax
from tridiax import verify
from tridiax._core import jax_private as _jax_private
from tridiax._core.split_complex import SplitComplex, divide, reciprocal
from tridiax._pallas import mosaic_gpu as _mosaic_gpu
from tridiax._tridiagonal.api import solve
from tridiax._tridiagonal.factorization import factor

BACKENDS = ("xla", "pallas_interpret")
KINDS = ("thomas", "pivoted", "periodic", "periodic pivoted", "factored", "periodic factored")
# Worst error ratio to the dividing sweep; a reciprocal of the pivot gave 7-8x (float32) and
# 2.05-2.3x (float64) on these systems, dividing 0.7-1.15x.
BOUND = 1.5
R, N, SYSTEMS = 50.0, 256, 4

WIDE = {np.dtype(np.float32): np.float64, np.dtype(np.float64): np.longdouble}


def _heat_step(dtype, axis, *, seed=0):
    """Bands and right-hand side of SYSTEMS implicit heat steps of N rows along `axis`."""
    shape = (N, SYSTEMS) if axis == 0 else (SYSTEMS, N)
    rhs = np.random.default_rng(seed).uniform(-1, 1, shape)
    return [np.asarray(v, dtype) for v in (np.full(shape, -R), np.full(shape, 1 + 2 * R),
                                           np.full(shape, -R), rhs)]


def _error(x, truth):
    x = np.asarray(x).astype(truth.dtype)
    return float(np.linalg.norm((x - truth).ravel()) / np.linalg.norm(truth.ravel()))


def _solve(backend, kind, lower, diag, upper, rhs, axis):
    periodic, pivoting = "periodic" in kind, "pivoted" in kind
    if "factored" in kind:
        bands = [jnp.asarray(v) for v in (lower, diag, upper)]
        return factor(*bands, axis=axis, periodic=periodic, backend=backend).solve(rhs)
    return solve(lower, diag, upper, rhs, axis=axis, backend=backend, periodic=periodic,
                 pivoting=pivoting, chunk=0)


def _needs_wider(dtype):
    if np.finfo(WIDE[np.dtype(dtype)]).eps >= np.finfo(dtype).eps:
        pytest.skip("NumPy's long double is no wider than float64 here")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("axis", [0, -1])
def test_heat_step_is_as_accurate_as_the_dividing_sweep(backend, kind, dtype, axis):
    _needs_wider(dtype)
    lower, diag, upper, rhs = _heat_step(dtype, axis)
    x = np.asarray(_solve(backend, kind, lower, diag, upper, rhs, axis))
    assert x.dtype == dtype
    options = dict(axis=axis, periodic="periodic" in kind, pivoting="pivoted" in kind)
    sweep = verify.sequential_solve(lower, diag, upper, rhs, dtype=dtype, **options)
    truth = verify.sequential_solve(lower, diag, upper, rhs, dtype=WIDE[np.dtype(dtype)],
                                    **options)
    assert _error(x, truth) <= BOUND * _error(sweep, truth), (_error(x, truth),
                                                              _error(sweep, truth))


@pytest.mark.parametrize("axis", [0, -1])
def test_backends_agree_bitwise_on_cpu(axis):
    # The same operations in the same order, compiled by XLA:CPU either way.
    lower, diag, upper, rhs = _heat_step(np.float32, axis, seed=1)
    rhs = rhs + np.float32(1e-3) * np.arange(rhs.size, dtype=np.float32).reshape(rhs.shape)
    for kind in KINDS:
        xla, pallas = (np.asarray(_solve(b, kind, lower, diag, upper, rhs, axis))
                       for b in BACKENDS)
        np.testing.assert_array_equal(pallas, xla, err_msg=kind)


INTERPRETER = _mosaic_gpu.interpret_params() if _jax_private.pallas_mosaic_gpu() else None


@pytest.mark.skipif(INTERPRETER is None, reason=f"jax {jax.__version__} has no Mosaic GPU "
                    "interpreter")
def test_mosaic_gpu_thomas_kernel_divides():
    # The TMA-pipelined kernel of the plain solve, in the Mosaic GPU interpreter: (1, N, Q).
    lower, diag, upper, rhs = (v.T[None] for v in _heat_step(np.float32, -1))
    x = _mosaic_gpu.solve_pnq(*(jnp.asarray(v) for v in (lower, diag, upper, rhs)),
                              transposed=False, out_dtype=jnp.float32, interpret=INTERPRETER)
    sweep = verify.sequential_solve(lower, diag, upper, rhs, axis=1)
    truth = verify.sequential_solve(lower, diag, upper, rhs, axis=1, dtype=np.float64)
    assert _error(x, truth) <= BOUND * _error(sweep, truth)


def _split(z):
    return SplitComplex(jnp.real(z), jnp.imag(z))


def _joined(s):
    return np.asarray(s.re) + 1j * np.asarray(s.im)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_split_complex_division_is_xlas(dtype):
    # Smith's algorithm dividing by the scaled modulus, as XLA divides complex numbers: the
    # Pallas kernels (complex values split into parts) and the XLA loop agree bitwise.
    rng = np.random.default_rng(0)
    n = 4096

    def draw():
        scale = 10.0 ** rng.uniform(-8, 8, (2, n))
        return (rng.standard_normal(n) * scale[0] + 1j * rng.standard_normal(n) * scale[1])

    x, y = draw().astype(dtype), draw().astype(dtype)
    y[:8] = np.array([1, -1, 1j, -1j, 2 + 2j, -3 - 3j, 1e-30 + 1j, 4], dtype)  # ties, axes
    expected = np.asarray(jax.jit(lambda a, b: a / b)(x, y))
    quotient = _joined(jax.jit(lambda a, b: divide(_split(a), _split(b)))(x, y))
    by_real = _joined(jax.jit(lambda a, b: divide(jnp.real(a), _split(b)))(x, y))
    expected_real = np.asarray(jax.jit(lambda a, b: jnp.real(a) / b)(x, y))
    via_reciprocal = _joined(jax.jit(lambda a, b: _split(a) * reciprocal(_split(b)))(x, y))
    np.testing.assert_array_equal(quotient, expected)
    np.testing.assert_array_equal(by_real, expected_real)
    # Dividing rounds less than multiplying by a rounded reciprocal.
    exact = (x.astype(np.clongdouble) / y.astype(np.clongdouble))

    def error(q):
        return np.mean(np.abs(q - exact) / np.abs(exact))

    assert error(quotient) < error(via_reciprocal)


CUDA_ENTRY_POINTS = {
    "plain": lambda *a: tridiax.solve_tridiagonal(*a, axis=0),
    "pivoting": lambda *a: tridiax.solve_tridiagonal(*a, axis=0, pivoting=True),
    "periodic": lambda *a: tridiax.solve_periodic_tridiagonal(*a, axis=0),
    "factored solve": lambda l, d, u, b: tridiax.Tridiagonal(l, d, u, axis=0).factor().solve(b),
}


@pytest.mark.skipif(_jax_private.pallas_triton() is None,
                    reason=f"jax {jax.__version__} has no Pallas Triton backend")
@pytest.mark.parametrize("name", list(CUDA_ENTRY_POINTS))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.complex64, jnp.float64])
def test_triton_kernels_divide_correctly_rounded(name, dtype):
    # Triton lowers a float32 `/` for CUDA to div.full.f32 (up to 2 ulp); the kernels divide
    # with div.rn.f32 instead. float64 `/` is div.rn.f64 already.
    args = [jnp.ones((100, 1000), dtype)] * 4
    lowered = jax.jit(CUDA_ENTRY_POINTS[name]).trace(*args).lower(lowering_platforms=("cuda",))
    kernels = "\n".join(triton_kernels(lowered))  # a factored solve's kernel divides nothing
    float32_divisions = re.findall(r"arith\.divf [^\n]*: (?:tensor<[^>]*x)?f32\b", kernels)
    assert not float32_divisions, float32_divisions
    assert ("div.rn.f32" in kernels) == (dtype != jnp.float64)
    assert ("arith.divf" in kernels) == (dtype == jnp.float64)
