"""The partition method's own TPU kernels (`tridiax/_tridiagonal/pallas_tpu_chunks.py`) in TPU
interpret mode: their two sweeps against the composed sweeps run in float64 by XLA's loop,
the chunked solve end to end against the exact answer within a few times the sequential
sweep's error (implicit diffusion and Poisson systems, where a careless reduced system loses
digits), and the cases they leave to the composed sweeps."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tridiax import verify
from tridiax._core import planner as _planner
from tridiax._core.backend import Kernels
from tridiax._long_systems import chunked as _chunked
from tridiax._long_systems import composed_chunks as _composed
from tridiax._pallas import tpu as _tpu
from tridiax._tridiagonal import pallas_tpu_chunks as tpu_chunks
from tridiax._tridiagonal import xla as _xla

pytestmark = pytest.mark.skipif(not _tpu.available(), reason="this JAX has no Pallas TPU backend")

F32, C64 = np.float32, np.complex64


def _xla_solve(*args, tiling=None, **kwargs):
    return _xla.solve_pnq(*args, **kwargs)


def _reference_ends(*args, **kwargs):
    return _composed.chunk_ends_pnq(_xla_solve, *args, **kwargs)


def _reference_solve(*args, **kwargs):
    return _composed.chunk_solve_pnq(_xla_solve, *args, **kwargs)


def _refuse(*args, **kwargs):
    raise AssertionError("the composed sweep ran")


def _kernel_sweeps():
    interpret = _tpu.interpret_params()
    return (functools.partial(tpu_chunks.chunk_ends_pnq, interpret=interpret, composed=_refuse),
            functools.partial(tpu_chunks.chunk_solve_pnq, interpret=interpret, composed=_refuse))


def _draw(rng, shape, dtype):
    v = rng.uniform(-1, 1, shape)
    if np.issubdtype(dtype, np.complexfloating):
        v = v + 1j * rng.uniform(-1, 1, shape)
    return v


def _dominant(rng, shapes, dtype):
    l, u, b = (_draw(rng, s, dtype) for s in (shapes[0], shapes[2], shapes[3]))
    d = (3 + rng.uniform(0, 1, shapes[1])) * rng.choice([-1, 1], shapes[1])
    return l, d, u, b


# (shapes of l, d, u, b, chunk, dtype, transposed, periodic): the three layouts of the chunk
# view (P*C, m, Q) ("lanes": Q >= 128; "sublanes"; "transposed": Q == 1), chunks of 2 rows,
# bands shared by every system or constant along the rows, complex64, bfloat16 bands.
def _full(P, N, Q):
    return [(P, N, Q)] * 4


SWEEP_CASES = [
    (_full(1, 48, 130), 16, F32, False, False),
    (_full(1, 48, 130), 16, F32, True, True),
    (_full(9, 33, 5), 11, F32, True, False),
    (_full(9, 33, 5), 3, F32, False, True),
    (_full(3, 64, 1), 32, F32, False, True),
    (_full(3, 64, 1), 2, F32, True, False),
    ([(1, 40, 1), (1, 40, 1), (1, 40, 1), (2, 40, 3)], 8, F32, True, True),
    ([(2, 1, 3), (2, 40, 3), (1, 1, 1), (2, 40, 3)], 10, F32, False, False),
    (_full(2, 24, 3), 8, C64, False, True),
    (_full(2, 24, 3), 6, C64, True, False),
    (_full(4, 32, 3), 16, jnp.bfloat16, True, True),
]


def _case_id(case):
    shapes, m, dtype, transposed, periodic = case
    return f"{'-'.join('x'.join(map(str, s)) for s in shapes)}-m{m}-{np.dtype(dtype).name}-t{transposed:d}p{periodic:d}"


@pytest.mark.parametrize("case", SWEEP_CASES, ids=[_case_id(c) for c in SWEEP_CASES])
def test_both_sweeps_match_the_composed_ones(case):
    """The ten reduced-system arrays and the final x, from the kernels in float32 (complex64),
    against the composed sweeps run by XLA's loop in float64 (complex128) on the same values."""
    shapes, m, dtype, transposed, periodic = case
    rng = np.random.default_rng(len(shapes[0]) + m)
    values = _dominant(rng, shapes, dtype)
    complex_ = np.issubdtype(dtype, np.complexfloating)
    compute, wide = (C64, np.complex128) if complex_ else (F32, np.float64)
    bands = [jnp.asarray(v, dtype) for v in values[:3]] + [jnp.asarray(values[3], compute)]
    exact = [jnp.asarray(np.asarray(v).astype(wide)) for v in bands]
    P, N, Q = np.broadcast_shapes(*shapes)
    separators = jnp.asarray(_draw(rng, (P, N // m, Q), dtype), compute)
    flags = dict(transposed=transposed, periodic=periodic, chunk=m, tiling=None)
    ends, solve = _kernel_sweeps()
    with jax.enable_x64(True):
        want_ends = [np.asarray(v) for v in _reference_ends(*exact, **flags)]
        want_x = np.asarray(_reference_solve(*exact, separators.astype(wide), **flags))
    got_ends = ends(*bands, **flags)
    got_x = solve(*bands, separators, **flags)
    rtol = 2e-6
    for name, got, want in zip(("lower", "diag1", "sum1", "rhs1", "score1", "diag2", "sum2",
                                "upper", "rhs2", "score2", "x"),
                               (*got_ends, got_x), (*want_ends, want_x), strict=True):
        assert got.dtype == compute and got.shape == want.shape, (name, got.dtype, got.shape)
        scale = max(float(np.max(np.abs(want))), 1e-30)
        np.testing.assert_allclose(np.asarray(got), want, rtol=rtol, atol=rtol * scale, err_msg=name)


def _diffusion(P, N, Q, r, rng):
    """Implicit diffusion with a step of r (l = u = -r, d = 1 + 2r, slightly perturbed): weakly
    diagonally dominant for large r, like Poisson's -1, 2, -1."""
    off = np.full((P, N, Q), -r)
    diag = 1 + 2 * r + 0.01 * rng.random((P, N, Q))
    return off, diag, off.copy(), rng.standard_normal((P, N, Q))


@pytest.mark.parametrize("periodic", [False, True])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("r", [1.0, 1e4])
def test_chunked_solves_keep_the_sweeps_accuracy_on_implicit_diffusion(r, transposed, periodic):
    """x of the partition method through the kernels (the reduced system by XLA's loop):
    within 2 times the float32 sequential sweep's error against the exact answer, system by
    system, where the reduced diagonal comes from the rows' sums."""
    P, N, Q, m = 2, 96, 3, 16
    rng = np.random.default_rng(int(r))
    values = _diffusion(P, N, Q, r, rng)
    bands = [jnp.asarray(v, F32) for v in values]
    ends, solve = _kernel_sweeps()
    kernels = Kernels(_xla_solve, ends, solve, None, None, None, None, None)
    kind = "periodic" if periodic else "thomas"
    got = np.asarray(_chunked.solve(kernels, *bands, plan=_planner.Plan(chunk=m), transposed=transposed,
                                    kind=kind, replan=lambda *shape: _planner.Plan()))
    lower, diag, upper, rhs = values
    if transposed:
        lower, upper = np.roll(upper, 1, axis=1), np.roll(lower, -1, axis=1)
    exact = verify.sequential_solve(lower, diag, upper, rhs, axis=1, dtype=np.float64, periodic=periodic)
    sweep = verify.sequential_solve(*(v.astype(F32) for v in (lower, diag, upper, rhs)), axis=1,
                                    dtype=F32, periodic=periodic)
    scale = np.max(np.abs(exact), axis=1)
    errors = [np.max(np.max(np.abs(x - exact), axis=1) / scale) for x in (got, sweep)]
    assert errors[0] <= 2 * errors[1] + 4 * np.finfo(F32).eps, errors


def test_pivoted_and_padded_chunks_run_the_composed_sweeps():
    """Pivoted chunks (their rows may swap with the separator's) and a last chunk shorter than
    the others (m not dividing N: the chunk view would copy every operand) go to the composed
    sweeps, with the arguments they were given."""
    rng = np.random.default_rng(3)
    bands = [jnp.asarray(v, F32) for v in _dominant(rng, _full(1, 40, 130), F32)]
    calls = []

    def composed(*args, **kwargs):
        calls.append(kwargs)
        return "composed"

    interpret = _tpu.interpret_params()
    for chunk, pivoting in ((8, True), (12, False)):
        flags = dict(transposed=False, periodic=False, chunk=chunk, tiling=None, pivoting=pivoting)
        assert tpu_chunks.chunk_ends_pnq(*bands, **flags, interpret=interpret, composed=composed) == "composed"
        separators = jnp.zeros((1, -(-40 // chunk), 130), F32)
        assert tpu_chunks.chunk_solve_pnq(*bands, separators, **flags, interpret=interpret,
                                          composed=composed) == "composed"
    assert [c["chunk"] for c in calls] == [8, 8, 12, 12]
    assert [c["pivoting"] for c in calls] == [True, True, False, False]
    with pytest.raises(ValueError, match="separators"):
        tpu_chunks.chunk_solve_pnq(*bands, jnp.zeros((1, 4, 130), F32), transposed=False,
                                   periodic=False, chunk=8, interpret=interpret, composed=composed)
