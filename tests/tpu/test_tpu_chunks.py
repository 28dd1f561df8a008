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
from helpers import PDE_SYSTEMS, PERIODIC_SYSTEMS, pde_bands, pde_rhs, relative_error

from tridiax import verify
from tridiax._core import planner as _planner
from tridiax._core.backend import Kernels
from tridiax._long_systems import chunked as _chunked
from tridiax._long_systems import composed_chunks as _composed
from tridiax._pallas import tpu as _tpu
from tridiax._tridiagonal import pallas_tpu as tpu_thomas
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


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("shape, m", [((1, 48, 130), 16), ((3, 64, 1), 32)], ids=["lanes", "one-lane"])
def test_the_entries_outside_the_matrix_may_hold_anything(shape, m, transposed):
    """l[0] and u[N-1] lie outside the matrix: infinite and NaN there, both sweeps give what
    they give with zeros (the first chunk's row 0 reads its l[0] in the kernels, and the last
    chunk's separator row its u)."""
    rng = np.random.default_rng(7)
    l, d, u, b = (np.asarray(v, F32) for v in _dominant(rng, _full(*shape), F32))
    l[:, 0], u[:, -1] = 0.0, 0.0
    wild_l, wild_u = l.copy(), u.copy()
    wild_l[:, 0], wild_u[:, -1] = np.inf, np.nan
    separators = jnp.asarray(_draw(rng, (shape[0], shape[1] // m, shape[2]), F32), F32)
    flags = dict(transposed=transposed, periodic=False, chunk=m, tiling=None)
    ends, solve = _kernel_sweeps()
    for want, got in ((ends(l, d, u, b, **flags), ends(wild_l, d, wild_u, b, **flags)),
                      ((solve(l, d, u, b, separators, **flags),),
                       (solve(wild_l, d, wild_u, b, separators, **flags),))):
        for w, g in zip(want, got, strict=True):
            assert np.all(np.isfinite(np.asarray(g)))
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


# The most that the chunked answer's error may exceed the float32 sequential sweep's (both
# against the sweep in float64), as tests/tridiagonal/test_accuracy.py holds every backend.
SWEEP_FACTOR = 4.0


# Every system, and the transposed solve (the gradient's) of the nearly singular ones.
PDE_CASES = ([(system, False) for system in (*PDE_SYSTEMS, *PERIODIC_SYSTEMS)]
             + [(system, True) for system in ("poisson_shifted", "heat_1e4", "ring_shifted")])


@pytest.mark.parametrize("system, transposed", PDE_CASES, ids=[f"{s}-t{t:d}" for s, t in PDE_CASES])
def test_chunked_solves_are_near_the_sweep_on_pde_systems(system, transposed):
    """x of the partition method through the kernels (the reduced system by XLA's loop) on
    the systems PDE users solve, 1024 rows in chunks of 64: within SWEEP_FACTOR of the float32
    sequential sweep's error (heat steps and nearly singular Poisson problems are where a
    reduced diagonal formed carelessly loses digits that the sweep keeps)."""
    P, N, Q, m = 1, 1024, 3, 64
    complex_ = system == "schrodinger"
    dtype, wide = (C64, np.complex128) if complex_ else (F32, np.float64)
    periodic = system.startswith("ring_")
    lower, diag, upper = (np.moveaxis(v, 0, -1)[None] for v in pde_bands(system, N, Q))
    rhs = pde_rhs((P, N, Q), dtype)
    bands = [jnp.asarray(v.astype(dtype)) for v in (lower, diag, upper)] + [jnp.asarray(rhs)]
    ends, solve = _kernel_sweeps()
    kernels = Kernels(_xla_solve, ends, solve, None, None, None, None, None)
    got = _chunked.solve(kernels, *bands, plan=_planner.Plan(chunk=m), transposed=transposed,
                         kind="periodic" if periodic else "thomas",
                         replan=lambda *shape: _planner.Plan())
    lower, diag, upper, rhs = (np.asarray(v) for v in bands)
    if transposed:  # the bands of A^T
        lower, upper = np.roll(upper, 1, axis=1), np.roll(lower, -1, axis=1)
    exact, sweep = (verify.sequential_solve(lower, diag, upper, rhs, axis=1, dtype=t, periodic=periodic)
                    for t in (wide, dtype))
    error, sweep_error = relative_error(got, exact), relative_error(sweep, exact)
    assert error <= SWEEP_FACTOR * sweep_error, (error, sweep_error)


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


def test_chunks_too_long_for_one_launch_of_the_solve_run_the_composed_solve(monkeypatch):
    """In a VMEM budget that holds the ends sweep (which keeps no rows) but not a chunk's work
    rows, the last sweep is the composed one (`solve_pnq(separators=...)` returns None rather
    than streaming), and its answer is the kernels' own to rounding; separators are for the
    plain kind only."""
    rng = np.random.default_rng(4)
    bands = [jnp.asarray(v, F32) for v in _dominant(rng, _full(1, 512, 130), F32)]
    separators = jnp.asarray(_draw(rng, (1, 2, 130), F32), F32)
    flags = dict(transposed=True, periodic=False, chunk=256, tiling=None)
    ends, solve = _kernel_sweeps()
    want = solve(*bands, separators, **flags)
    monkeypatch.setattr(_tpu, "VMEM_BUDGET", 768 << 10)
    calls = []

    def composed(*args, **kwargs):
        calls.append(kwargs["chunk"])
        return _reference_solve(*args, **kwargs)

    ends(*bands, **flags)  # refuses the composed sweep: it fits
    got = tpu_chunks.chunk_solve_pnq(*bands, separators, **flags, interpret=_tpu.interpret_params(),
                                     composed=composed)
    assert calls == [256]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(want))))
    with pytest.raises(ValueError, match="'thomas' kind"):
        tpu_thomas.solve_pnq(*bands, transposed=False, out_dtype=F32, kind="periodic",
                             separators=[separators[:, :1]] * 2)
