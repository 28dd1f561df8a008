"""The Mosaic GPU kernels (`tridiax/_pallas/mosaic_gpu.py`), proven without a GPU.

1. In JAX's Mosaic GPU interpreter (private, jax >= 0.10.2; it simulates shared memory,
   barriers and TMA copies on CPU): against float64 references, on ragged shapes in both
   layouts, broadcast operands, transposed solves, recurrences in both directions.
2. Compiled for an H100 (sm_90a) without a GPU through the public entry points with
   backend="mosaic_gpu", gradients included: every call launches its Mosaic GPU kernels,
   within the shared memory of an SM, with a block for every SM on wide problems.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gpu_aot import compile_reports
from helpers import RTOL, factors_by_loop, numpy_loop, random_bands
from test_gpu_compile import SMS, WIDE, _errors, _require_harness

from tridiax import verify
from tridiax._core import backend as _backend
from tridiax._core import jax_private as _jax_private
from tridiax._pallas import mosaic_gpu as _mosaic_gpu
from tridiax._recurrence import xla as _xla_recurrence
from tridiax._tridiagonal import xla as _xla_thomas

H100_SHARED_MEMORY = 227 * 1024  # bytes one block may use

INTERPRETER = _mosaic_gpu.interpret_params() if _jax_private.pallas_mosaic_gpu() else None
needs_interpreter = pytest.mark.skipif(
    INTERPRETER is None, reason=f"jax {jax.__version__} has no Mosaic GPU interpreter")


def _reference(lower, diag, upper, rhs, transposed):
    P, N, Q = np.broadcast_shapes(*(a.shape for a in (lower, diag, upper, rhs)))
    full = [np.broadcast_to(a, (P, N, Q)).astype(np.float64) for a in (lower, diag, upper, rhs)]
    lower, diag, upper, rhs = full
    if transposed:  # the bands of A^T
        lower, upper = (np.concatenate([np.zeros_like(upper[:, :1]), upper[:, :-1]], 1),
                        np.concatenate([lower[:, 1:], np.zeros_like(lower[:, :1])], 1))
    return verify.reference_solve(lower, diag, upper, rhs, axis=1)


# (P, N, Q) shapes: ragged rows (not a multiple of 16) and columns (not of 128, nor of 4),
# one row, batch-first data (Q = 1, systems along P), and a second tile of columns.
SOLVE_SHAPES = [(1, 1, 3), (1, 2, 5), (1, 37, 200), (3, 17, 9), (40, 21, 1), (1, 16, 257)]


@needs_interpreter
@pytest.mark.parametrize("shape", SOLVE_SHAPES)
@pytest.mark.parametrize("transposed", [False, True])
def test_thomas_kernel_in_the_interpreter(shape, transposed):
    lower, diag, upper, rhs = random_bands(shape, seed=sum(shape))
    lower[:, 0], upper[:, -1] = np.nan, np.nan  # outside the matrix: never read into x
    if transposed:
        lower[:, 0], upper[:, -1] = 0.5, 0.5  # A^T reads them; A's corners stay unread
    args = [jnp.asarray(a, jnp.float32) for a in (lower, diag, upper, rhs)]
    x = _mosaic_gpu.solve_pnq(*args, transposed=transposed, out_dtype=jnp.float32,
                              interpret=INTERPRETER)
    assert x.shape == shape and x.dtype == jnp.float32
    ref = _reference(*(np.asarray(a) for a in args), transposed)
    np.testing.assert_allclose(x, ref, rtol=0, atol=RTOL[np.dtype(np.float32)] * np.abs(ref).max())


@needs_interpreter
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_thomas_kernel_shared_matrix_and_half_precision(dtype):
    # One matrix (1, N, 1) for 6 x 130 right-hand sides: broadcast operands.
    shapes = [(1, 23, 1)] * 3 + [(6, 23, 130)]
    args = [jnp.asarray(a, dtype) for a in random_bands(None, seed=5, shapes=shapes)]
    x = _mosaic_gpu.solve_pnq(*args, transposed=False, out_dtype=dtype, interpret=INTERPRETER)
    assert x.shape == (6, 23, 130) and x.dtype == dtype
    ref = _reference(*(np.asarray(a, np.float64) for a in args), False)
    np.testing.assert_allclose(np.asarray(x, np.float64), ref, rtol=0,
                               atol=RTOL[np.dtype(dtype)] * np.abs(ref).max())


@needs_interpreter
@pytest.mark.parametrize("shape", [(1, 1, 3), (1, 40, 33), (3, 70, 1), (2, 33, 130)])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shifted", [False, True])
def test_recurrence_kernel_in_the_interpreter(shape, reverse, shifted):
    rng = np.random.default_rng(sum(shape) + reverse)
    a = rng.uniform(0.3, 1.0, shape)
    x = rng.standard_normal(shape)
    h0 = rng.standard_normal((shape[0], 1, shape[2]))
    h = _mosaic_gpu.recurrence_pnq(
        *(jnp.asarray(v, jnp.float32) for v in (a, x, h0)), reverse=reverse, shifted=shifted,
        activation=None, final_only=False, out_dtype=jnp.float32, interpret=INTERPRETER)
    coefficient = a
    if shifted:  # the coefficient of step t is a at the previous step, zero at the first
        coefficient = np.roll(a, -1 if reverse else 1, axis=1)
        coefficient[:, -1 if reverse else 0] = 0
    ref = numpy_loop(coefficient, x, axis=1, reverse=reverse, initial=h0[:, 0])
    np.testing.assert_allclose(h, ref, rtol=0, atol=2e-5 * np.abs(ref).max())
    last = _mosaic_gpu.recurrence_pnq(
        *(jnp.asarray(v, jnp.float32) for v in (a, x, h0)), reverse=reverse, shifted=shifted,
        activation=None, final_only=True, out_dtype=jnp.float32, interpret=INTERPRETER)
    np.testing.assert_allclose(last, ref[:, :1] if reverse else ref[:, -1:], rtol=0,
                               atol=2e-5 * np.abs(ref).max())


@needs_interpreter
@pytest.mark.parametrize("kind", ["periodic", "pivoted", "factored"])
@pytest.mark.parametrize("shape", [(1, 7, 5), (2, 33, 130), (6, 4, 1)])
@pytest.mark.parametrize("transposed", [False, True])
def test_other_kinds_in_the_interpreter(kind, shape, transposed):
    # The Triton kernel bodies over a warpgroup's 128 columns (WarpgroupRows). Pivoted kinds get
    # matrices that need row swaps.
    rng = np.random.default_rng(sum(shape) + len(kind))
    lower, diag, upper, rhs = (rng.uniform(-1, 1, shape) for _ in range(4))
    if "pivoted" not in kind:
        diag = diag + 3
    args = [jnp.asarray(a, jnp.float32) for a in (lower, diag, upper, rhs)]
    lower, diag, upper, rhs = (np.asarray(a, np.float64) for a in args)
    if kind == "factored":
        factors = _xla_thomas.factor_pnq(*args[:3], out_dtype=jnp.float32)
        args = [*factors, args[3]]
    x = _mosaic_gpu.solve_pnq(*args, transposed=transposed, out_dtype=jnp.float32, kind=kind,
                              interpret=INTERPRETER)
    if kind == "periodic":  # corners lower[0] = A[0, N-1], upper[N-1] = A[N-1, 0]
        if transposed:
            lower, upper = np.roll(upper, 1, axis=1), np.roll(lower, -1, axis=1)
        ref = verify.reference_solve(lower, diag, upper, rhs, axis=1, periodic=True)
    else:
        ref = _reference(lower, diag, upper, rhs, transposed)
    assert x.shape == shape
    np.testing.assert_allclose(x, ref, rtol=0, atol=1e-4 * np.abs(ref).max())


@needs_interpreter
@pytest.mark.parametrize("shape,band_shape", [((1, 1, 1), None), ((1, 2, 5), None),
                                              ((1, 7, 5), None), ((2, 33, 130), None),
                                              ((6, 4, 1), None), ((3, 9, 5), (1, 9, 1))])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_factor_in_the_interpreter(shape, band_shape, dtype):
    # The factorization's kernel (the Triton factor body over WarpgroupRows), against the
    # elimination written out row by row; then the factored kernel solves with its factors.
    # `band_shape`: the lower band shared by every system.
    rng = np.random.default_rng(sum(shape))
    lower, diag, upper, rhs = (jnp.asarray(rng.uniform(-1, 1, s), jnp.float32)
                               for s in (band_shape or shape, shape, shape, shape))
    diag = diag + 3
    factors = _mosaic_gpu.factor_pnq(lower, diag, upper, out_dtype=dtype, interpret=INTERPRETER)
    tol = 1e-6 if dtype == jnp.float32 else 1e-2
    for got, expected in zip(factors, factors_by_loop(lower, diag, upper, 1), strict=True):
        assert got.shape == shape and got.dtype == dtype
        np.testing.assert_allclose(np.asarray(got, np.float64), expected.real, rtol=tol,
                                   atol=tol)
    factors = [f.astype(jnp.float32) for f in factors]
    x = _mosaic_gpu.solve_pnq(*factors, rhs, transposed=False, out_dtype=jnp.float32,
                              kind="factored", interpret=INTERPRETER)
    ref = verify.reference_solve(*(np.asarray(v, np.float64) for v in (lower, diag, upper, rhs)),
                                 axis=1)
    np.testing.assert_allclose(x, ref, rtol=0, atol=10 * tol * np.abs(ref).max())


@needs_interpreter
@pytest.mark.parametrize("activation", [jax.nn.relu, jnp.tanh])
@pytest.mark.parametrize("shape", [(1, 40, 33), (3, 20, 1)])
@pytest.mark.parametrize("reverse", [False, True])
def test_indrnn_recurrence_in_the_interpreter(activation, shape, reverse):
    rng = np.random.default_rng(sum(shape))
    a, x = rng.uniform(0.3, 1.0, shape), rng.standard_normal(shape)
    h0 = rng.standard_normal((shape[0], 1, shape[2]))
    for final_only in (False, True):
        h = _mosaic_gpu.recurrence_pnq(
            *(jnp.asarray(v, jnp.float32) for v in (a, x, h0)), reverse=reverse, shifted=False,
            activation=activation, final_only=final_only, out_dtype=jnp.float32,
            interpret=INTERPRETER)
        ref = numpy_loop(a, x, axis=1, reverse=reverse, initial=h0[:, 0],
                         activation=np.tanh if activation is jnp.tanh else lambda v: np.maximum(v, 0))
        if final_only:
            ref = ref[:, :1] if reverse else ref[:, -1:]
        np.testing.assert_allclose(h, ref, rtol=0, atol=2e-5 * np.abs(ref).max())


def test_what_the_kernels_do_not_run_goes_to_the_xla_loop():
    assert _mosaic_gpu.runs(jnp.float32) and _mosaic_gpu.runs(jnp.bfloat16)
    assert _mosaic_gpu.runs(jnp.float32, activation=jax.nn.relu)
    assert not _mosaic_gpu.runs(jnp.float32, gate=(None, jax.nn.relu))

    @jax.custom_jvp
    def custom(v):  # Mosaic GPU lowers no custom_jvp call: this one runs the XLA loop
        return jnp.maximum(v, 0.1 * v)

    custom.defjvp(lambda primals, tangents: (custom(primals[0]), tangents[0]))
    assert not _mosaic_gpu.runs(jnp.float32, activation=custom)
    a, x = jnp.full((1, 5, 3), 0.5), jnp.ones((1, 5, 3))
    kwargs = dict(reverse=False, shifted=False, activation=custom, final_only=False,
                  out_dtype=jnp.float32)
    np.testing.assert_array_equal(  # not interpreted: the XLA loop ran
        _mosaic_gpu.recurrence_pnq(a, x, jnp.zeros((1, 1, 3)), **kwargs),
        _xla_recurrence.recurrence_pnq(a, x, jnp.zeros((1, 1, 3)), **kwargs))
    for dtype in (jnp.float64, jnp.complex64):
        reason = _backend.unavailable("mosaic_gpu", jnp.dtype(dtype), platform="cuda")
        assert reason is not None and "no " in reason
    assert "NVIDIA" in _backend.unavailable("mosaic_gpu", jnp.dtype(jnp.float32), platform="rocm")
    assert _backend.default_backend("cuda", jnp.float32) != "mosaic_gpu"  # opt-in until measured


# --- deviceless compile for an H100 -----------------------------------------------------------

ROWS = 1000
MOSAIC_ENTRY_POINTS = {
    "solve": ("tridiax._tridiagonal.api:lambda *a: solve(*a, axis={axis}, backend='mosaic_gpu')", 4),
    "solve / grad": ("tridiax._tridiagonal.api:__import__('jax').grad(lambda *a: (solve(*a, axis={axis}, "
                     "backend='mosaic_gpu') ** 2).sum(), argnums=(0, 1, 2, 3))", 4),
    "linear_recurrence": ("tridiax._recurrence.api:lambda a, x: recurrence(a, x, axis={axis}, "
                          "backend='mosaic_gpu')", 2),
    "linear_recurrence reverse / grad": (
        "tridiax._recurrence.api:__import__('jax').grad(lambda a, x: (recurrence(a, x, axis={axis}, "
        "reverse=True, backend='mosaic_gpu') ** 2).sum(), argnums=(0, 1))", 2),
    **{f"{name} / grad": (
        "tridiax._tridiagonal.api:__import__('jax').grad(lambda *a: (solve(*a, axis={axis}, "
        f"{flags}, backend='mosaic_gpu') ** 2).sum(), argnums=(0, 1, 2, 3))", 4)
       for name, flags in (("periodic", "periodic=True"), ("pivoted", "pivoting=True"),
                           ("periodic pivoted", "periodic=True, pivoting=True"))},
    "factored solve": ("tridiax:lambda l, d, u, b: TDMA(backend='mosaic_gpu').factor("
                       "Tridiagonal(l, d, u, axis={axis})).solve(b)", 4),
    "indrnn / grad": ("tridiax._recurrence.api:__import__('jax').grad(lambda a, x: (recurrence(a, x, "
                      "axis={axis}, activation=__import__('jax').nn.relu, backend='mosaic_gpu') "
                      "** 2).sum(), argnums=(0, 1))", 2),
}


def _mosaic_cases(systems, dtype="float32"):
    cases = {}
    for name, (expression, arity) in MOSAIC_ENTRY_POINTS.items():
        for axis in (0, -1):
            shape = (ROWS, systems) if axis == 0 else (systems, ROWS)
            cases[f"{name} axis={axis} {shape} {dtype}"] = (expression.format(axis=axis),
                                                            [(shape, dtype)] * arity)
    return cases


def test_mosaic_gpu_entry_points_compile_for_an_h100():
    _require_harness()
    ragged_rows = {  # batch-first rows not a multiple of 4 (TMA's 16-byte rule): padded
        "solve axis=-1 ragged rows": ("tridiax._tridiagonal.api:lambda *a: solve(*a, axis=-1, "
                                      "backend='mosaic_gpu')", [((WIDE + 100, ROWS + 1), "float32")] * 4)}
    reports = compile_reports({**_mosaic_cases(WIDE), **_mosaic_cases(WIDE + 100, "bfloat16"),
                               **ragged_rows})
    assert not _errors(reports), _errors(reports)
    problems = []
    for case, r in reports.items():
        mosaic = [k for k in r.kernels if k.origin == "mosaic_gpu"]
        if not mosaic:
            problems.append(f"{case}: no Mosaic GPU kernel: {[str(k) for k in r.kernels]}")
        for k in mosaic:
            if k.threads_per_block != 128 or k.shared_memory_bytes > H100_SHARED_MEMORY:
                problems.append(f"{case}: {k}")
            if k.shared_memory_bytes == 0 and case.startswith(("solve ", "linear_recurrence")):
                problems.append(f"{case}: the TMA kernel did not run: {k}")
        # Batch-first data is read in boxes of 128 systems' rows: no transpose around it.
        if "axis=-1" in case and case.startswith(("solve ", "linear_recurrence ")):
            problems += [f"{case}: transposes: {k}" for k in r.kernels if "transpose" in k.name]
            # Blocks of 128 systems (columns of the (N, B) layout, or rows of the (B, N) one):
            # wide problems fill every SM.
            if k.blocks < SMS:
                problems.append(f"{case}: fewer than {SMS} blocks: {k}")
        for k in r.kernels:
            if k.origin == "xla" and (k.spill_store_bytes or k.spill_load_bytes):
                problems.append(f"{case}: spills: {k}")
    assert not problems, "\n".join(problems)


def test_mosaic_gpu_kernels_do_not_depend_on_jax_lowering_semantics_default():
    # jax 0.11 made warpgroup semantics the default, under which these kernels do not lower
    # (a column of a shared-memory box; a scalar broadcast in the pivoted kinds' selects): they
    # choose lane semantics themselves. Compiled here with jax 0.11's default imposed.
    _require_harness()
    module = "mosaic_warpgroup_default"
    grad = "__import__('jax').grad(lambda *a: ({call} ** 2).sum(), argnums={argnums})"
    calls = {
        "solve axis=-1": ("solve(*a, axis=-1, backend='mosaic_gpu')", 4),
        "pivoted axis=0": ("solve(*a, axis=0, pivoting=True, backend='mosaic_gpu')", 4),
        "linear_recurrence axis=-1": ("recurrence(*a, axis=-1, backend='mosaic_gpu')", 2),
        "indrnn axis=0": ("recurrence(*a, axis=0, activation=__import__('jax').nn.relu, "
                          "backend='mosaic_gpu')", 2),
    }
    cases = {}
    for name, (call, arity) in calls.items():
        shape = (WIDE, ROWS) if name.endswith("-1") else (ROWS, WIDE)
        cases[f"{name} / grad"] = (
            f"{module}:" + grad.format(call=call, argnums=tuple(range(arity))),
            [(shape, "float32")] * arity)
    reports = compile_reports(cases)
    assert not _errors(reports), _errors(reports)
    for case, r in reports.items():
        assert any(k.origin == "mosaic_gpu" for k in r.kernels), (case, [str(k) for k in r.kernels])
