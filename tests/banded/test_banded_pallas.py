"""The Pallas (Triton) banded kernel, `_banded/pallas_triton.py`.

On CPU the kernel runs in interpret mode and must give what the XLA formulation
(`_xla_banded.solve_pnq`) and scipy.linalg.solve_banded give, for every kind, transposed or not,
with a ragged last tile, broadcast bands and NaN in the entries of `ab` outside the matrix.
Interpret mode pads ragged tiles and would hide a missing mask, so GPU readiness is checked on
the kernel lowered for CUDA (every Triton load and store of a ragged tile masked, broadcast bands
read in place) and, in the last block, compiled for an H100 without a GPU (`gpu_aot`): no
register spills, and enough blocks for the device.

The interpret-mode programs are compiled by XLA:CPU at optimization level 0 (half the compile
time of the default, which dominates these tests; the results are the same to rounding).
"""

from __future__ import annotations

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from helpers import compile_unoptimized, triton_kernels

from tridiax._banded import pallas_triton as _pallas_banded
from tridiax._banded import xla as _xla_banded
from tridiax._pallas.tiles import Tiles

BANDS = [(0, 0), (1, 1), (2, 2), (3, 1), (0, 3), (2, 0)]
KINDS = _xla_banded.KINDS
LENGTHS = (1, 2, 3, 7, 33)
P, Q = 2, 70  # Q = 70 is not a multiple of any tile: the last block is ragged

# Errors per system, relative to its largest |x|, in units of eps * cond(A) (the forward error
# bound of a backward-stable solve): against the XLA formulation (the same operations, up to
# complex division and rounding of fused operations) and scipy's LAPACK gbsv (another order).
TOL_XLA, TOL_SCIPY = 10, 20


def _compiled(fn, *args):
    compiled = compile_unoptimized(fn, *args)
    return lambda *a: np.asarray(compiled(*(jnp.asarray(x) for x in a)))


def _run(fn, *args):
    return _compiled(fn, *(jnp.asarray(x) for x in args))(*args)


def pallas_compiled(ab, b, **options):
    """The interpret-mode kernel compiled for arrays like ab and b."""
    return _compiled(functools.partial(_pallas_banded.solve_pnq, interpret=True, **options),
                     jnp.asarray(ab), jnp.asarray(b))


def pallas(ab, b, **options):
    return pallas_compiled(ab, b, **options)(ab, b)


def xla(ab, b, **options):
    return _run(functools.partial(_xla_banded.solve_pnq, **options), ab, b)


# --- problems -----------------------------------------------------------------------------------


def to_dense(ab, l, u, shape):
    """(P, Q, N, N) matrices of bands ab (K, P|1, N|1, Q|1) in scipy's layout."""
    P_, N, Q_ = shape
    ab = np.broadcast_to(ab, (l + u + 1, P_, N, Q_))
    a = np.zeros((P_, Q_, N, N), ab.dtype)
    for i in range(N):
        for j in range(max(0, i - l), min(N, i + u + 1)):
            a[:, :, i, j] = ab[u + i - j, :, j, :]
    return a


def to_band(a, l, u):
    """scipy's layout (K, P, N, Q) of (P, Q, N, N) matrices; zero outside the matrix."""
    P_, Q_, N, _ = a.shape
    ab = np.zeros((l + u + 1, P_, N, Q_), a.dtype)
    for i in range(N):
        for j in range(max(0, i - l), min(N, i + u + 1)):
            ab[u + i - j, :, j, :] = a[:, :, i, j]
    return ab


def poison(ab, l, u):
    """ab with NaN in every entry outside the matrix (ab[k, :, j] is A[j + k - u, j])."""
    ab = ab.copy()
    N = ab.shape[2]
    for k in range(l + u + 1):
        for j in range(N):
            if not 0 <= j + k - u < N:
                ab[k, :, j, :] = np.nan
    return ab


def problem(l, u, N, dtype, kind, *, seed=0, ab_shape=None, P_=P, Q_=Q):
    """(ab, b): random bands of shape (K, *ab_shape) and right-hand sides (P, N, Q).

    Unpivoted kinds get matrices strictly diagonally dominant by their real part (positive
    pivots), Hermitian positive definite ones for the Hermitian kind with l == u; the pivoted
    kind random ones whose diagonal is often smaller than an entry below it (rows are
    interchanged), where the lower bandwidth lets pivoting happen."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    K = l + u + 1
    ab_shape = ab_shape or (P_, N, Q_)

    def draw(shape, low=0.0):
        x = rng.uniform(low, 1, shape) * rng.choice([-1, 1], shape)
        if dtype.kind == "c":
            x = x + 1j * rng.uniform(-1, 1, shape)
        return x

    ab = draw((K, *ab_shape))
    if kind == "banded_pivoted":
        ab[u] = draw(ab_shape, low=0.3)
    if kind == "banded_hermitian" and l == u and ab_shape == (P_, N, Q_):
        a = to_dense(ab, l, u, (P_, N, Q_))
        ab = to_band(a + np.conj(np.swapaxes(a, -1, -2)), l, u)
    if kind != "banded_pivoted" or min(l, u) == 0:  # no pivoting in one orientation: dominant
        ab[u] = ab[u].real + 3 * K  # any row: |diag| > 2K > sum of |off-diagonal| (<= 2 each)
    b = draw((P_, N, Q_))
    return ab.astype(dtype), b.astype(dtype)


def scipy_solve(ab, b, l, u, transposed):
    """x of every system by scipy.linalg.solve_banded (LAPACK gbsv, partial pivoting)."""
    P_, N, Q_ = b.shape
    if transposed:  # bands of A^T: bandwidths (u, l)
        a = to_dense(ab, l, u, b.shape)
        ab, (l, u) = to_band(np.swapaxes(a, -1, -2), u, l), (u, l)
    ab = np.broadcast_to(ab, (l + u + 1, P_, N, Q_))
    x = np.zeros(b.shape, np.result_type(ab, b))
    for p in range(P_):
        for q in range(Q_):
            x[p, :, q] = scipy.linalg.solve_banded((l, u), ab[:, p, :, q], b[p, :, q])
    return x


def condition(ab, l, u, shape, transposed=False):
    """cond(A) of every system, (P, Q) (the same for A^T)."""
    return np.linalg.cond(to_dense(np.asarray(ab, np.complex128), l, u, shape))


STATS = []


def assert_close(actual, expected, tol, cond=None):
    """|actual - expected| <= tol * eps * cond * max|expected| in every system (P, :, Q)."""
    assert actual.shape == expected.shape
    assert np.all(np.isfinite(actual)), "non-finite values"
    eps = np.finfo(actual.dtype).eps
    cond = np.ones((actual.shape[0], actual.shape[2])) if cond is None else cond
    scale = np.maximum(np.max(np.abs(expected), axis=1), 1e-30)
    err = np.max(np.abs(actual - expected.astype(actual.dtype)), axis=1) / scale / (eps * np.maximum(cond, 1))
    STATS.append(float(err.max()))
    assert err.max() <= tol, f"error {err.max():.1f} eps * cond > {tol} eps * cond"


def check(l, u, N, dtype, kind, transposed, *, tiles=None, **problem_options):
    """x of the kernel for a random problem (NaN in the entries of ab outside the matrix),
    checked against the XLA formulation and scipy (given zeros there)."""
    ab, b = problem(l, u, N, dtype, kind, **problem_options)
    options = dict(l=l, u=u, kind=kind, transposed=transposed, out_dtype=np.dtype(dtype))
    solve = pallas_compiled(ab, b, tiles=tiles, **options)
    x = solve(ab, b)
    assert x.dtype == np.dtype(dtype)
    if ab.shape[2] == N:  # entries outside the matrix are never used, NaN or not
        np.testing.assert_array_equal(solve(poison(ab, l, u), b), x)
    cond = condition(ab, l, u, b.shape)
    assert_close(x, xla(ab, b, **options), TOL_XLA, cond)
    assert_close(x, scipy_solve(ab, b, l, u, transposed), TOL_SCIPY, cond)
    if os.environ.get("BANDED_STATS"):  # calibration: append each check's errors to that file
        with open(os.environ["BANDED_STATS"], "a") as f:
            print(f"STATS {l} {u} {N} {np.dtype(dtype)} {kind} {transposed} cond {cond.max():.1e} "
              f"xla {STATS[-2]:.2f} scipy {STATS[-1]:.2f}", file=f)
    return x


# --- interpret mode against XLA and scipy ---------------------------------------------------------


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("l,u", BANDS)
def test_matches_xla_and_scipy(l, u, kind, transposed):
    # float64, N = 33, NaN in every unused corner of ab.
    check(l, u, 33, np.float64, kind, transposed, seed=l + 3 * u)


@pytest.mark.parametrize("N", LENGTHS[:-1])
@pytest.mark.parametrize("l,u", BANDS)
def test_short_systems(l, u, N):
    # Systems shorter than the band (N = 1, 2, 3) and a few rows longer, each length with
    # another kind and orientation.
    kind, transposed = {1: ("banded_pivoted", True), 2: ("banded", False), 3: ("banded_hermitian", True),
                        7: ("banded_pivoted", False)}[N]
    check(l, u, N, np.float64, kind, transposed, seed=N)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
@pytest.mark.parametrize("l,u", BANDS)
def test_single_precision_and_complex(l, u, dtype, kind):
    check(l, u, 33, dtype, kind, transposed=(l + u) % 2 == 1, seed=7)


@pytest.mark.parametrize("kind", KINDS)
def test_complex128(kind):
    check(2, 2, 33, np.complex128, kind, transposed=True, seed=3)
    check(3, 1, 7, np.complex128, kind, transposed=False, seed=4)


@pytest.mark.parametrize("ab_shape", [(1, 33, Q), (P, 33, 1), (1, 1, 1), (P, 1, Q)])
@pytest.mark.parametrize("l,u,kind", [(2, 2, "banded_pivoted"), (1, 1, "banded_hermitian")])
def test_broadcast_bands(l, u, kind, ab_shape):
    # ab broadcast along P, N and/or Q and read in place; the references see it materialised.
    dtype = np.complex64 if kind == "banded_hermitian" else np.float64
    check(l, u, 33, dtype, kind, transposed=True, ab_shape=ab_shape, seed=11)


@pytest.mark.parametrize("tiles", [(2, 16), (4, 8), (1, 1)])
def test_ragged_tiles_along_p_and_q(tiles):
    # P = 3, Q = 70: ragged tiles along both axes (and 1x1 tiles, none ragged).
    check(3, 1, 7, np.float64, "banded_pivoted", True, tiles=Tiles.of_block(*tiles), P_=3)
    check(1, 2, 7, np.complex64, "banded", False, tiles=Tiles.of_block(*tiles), P_=3)


def test_pivoting_ties_and_nan_in_the_pivot_column():
    # Column 0 of the first window holds 1, -1, 1j (|Re| + |Im| = 1 each: the first row is the
    # pivot, as in LAPACK and the XLA formulation); one system has a NaN in it, which is chosen
    # as the pivot (as jnp.argmax would) and makes that system NaN, and that system only.
    l, u, N = 2, 1, 7
    ab, b = problem(l, u, N, np.complex128, "banded_pivoted", seed=5, P_=1, Q_=4)
    a = to_dense(ab, l, u, (1, N, 4))
    a[:, :, :3, 0] = [1, -1, 1j]
    a[0, 3, 1, 0] = np.nan
    ab = to_band(a, l, u)
    options = dict(l=l, u=u, kind="banded_pivoted", transposed=False, out_dtype=np.complex128)
    x, ref = pallas(ab, b, **options), xla(ab, b, **options)
    np.testing.assert_array_equal(np.isnan(x), np.isnan(ref))
    assert np.isnan(x[0, :, 3]).all() and np.isfinite(x[..., :3]).all()
    cond = condition(ab[..., :3], l, u, (1, N, 3))
    assert_close(x[..., :3], ref[..., :3], TOL_XLA, cond)
    assert_close(x[..., :3], scipy_solve(ab[..., :3], b[..., :3], l, u, False), TOL_SCIPY, cond)


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
@pytest.mark.parametrize("l,u", [(0, 0), (2, 2), (1, 1)])
def test_indefinite_hermitian_gives_nan_in_that_system_only(l, u, dtype):
    N = 33
    ab, b = problem(l, u, N, dtype, "banded_hermitian", seed=2)
    ab[u, 1, 20, 5] = -ab[u, 1, 20, 5].real  # system (1, 5): a negative pivot at row 20
    options = dict(l=l, u=u, kind="banded_hermitian", transposed=False, out_dtype=np.dtype(dtype))
    x, ref = pallas(poison(ab, l, u), b, **options), xla(poison(ab, l, u), b, **options)
    bad = np.isnan(x)
    np.testing.assert_array_equal(bad, np.isnan(ref))
    if l == 0:  # diagonal: that row alone
        assert bad[1, 20, 5] and bad.sum() == 1
    else:
        assert bad[1, :, 5].all() and bad.sum() == N
    assert_close(np.where(bad, 0, x), np.where(bad, 0, ref), TOL_XLA)
    # The same matrix solved with pivoting has no NaN: only the Hermitian kind refuses it.
    assert np.isfinite(pallas(ab, b, **{**options, "kind": "banded_pivoted"})).all()


@pytest.mark.parametrize("out_dtype", [jnp.bfloat16, np.float16])
def test_half_precision_output(out_dtype):
    # Eliminated in float32 (y in a float32 work output of its own), x rounded once.
    l, u = 2, 2
    ab, b = problem(l, u, 33, np.float32, "banded_pivoted", seed=9)
    options = dict(l=l, u=u, kind="banded_pivoted", transposed=False, out_dtype=out_dtype)
    x, ref = pallas(poison(ab, l, u), b, **options), xla(poison(ab, l, u), b, **options)
    assert x.dtype == np.dtype(out_dtype)
    half_eps = float(jnp.finfo(out_dtype).eps)
    scale = np.abs(ref.astype(np.float32)).max()
    assert np.abs(x.astype(np.float32) - ref.astype(np.float32)).max() <= half_eps * scale
    exact = scipy_solve(ab.astype(np.float64), b.astype(np.float64), l, u, False)
    assert np.abs(x.astype(np.float64) - exact).max() <= half_eps * scale


def test_real_bands_with_complex_rhs():
    l, u = 1, 2
    ab, _ = problem(l, u, 7, np.float64, "banded_pivoted", seed=6)
    _, b = problem(l, u, 7, np.complex128, "banded_pivoted", seed=8)
    options = dict(l=l, u=u, kind="banded_pivoted", transposed=True, out_dtype=np.complex128)
    x = pallas(ab, b, **options)
    cond = condition(ab, l, u, b.shape)
    assert_close(x, xla(ab, b, **options), TOL_XLA, cond)
    assert_close(x, scipy_solve(ab, b, l, u, True), TOL_SCIPY, cond)


def test_empty_and_invalid():
    ab, b = np.ones((3, 2, 0, 4)), np.ones((2, 0, 4))
    options = dict(l=1, u=1, kind="banded", transposed=False, out_dtype=np.float64)
    assert _pallas_banded.solve_pnq(jnp.asarray(ab), jnp.asarray(b), **options).shape == (2, 0, 4)
    with pytest.raises(ValueError, match="kind"):
        _pallas_banded.solve_pnq(jnp.ones((3, 1, 5, 1)), jnp.ones((1, 5, 1)), **{**options, "kind": "lu"})
    with pytest.raises(ValueError, match="ab must be"):
        _pallas_banded.solve_pnq(jnp.ones((2, 1, 5, 1)), jnp.ones((1, 5, 1)), **options)


def test_default_tiles():
    # Two systems per thread (64-system tiles) for small windows, one (32) for larger ones.
    assert _pallas_banded.default_tiles(4, 1000, l=1, u=1, kind="banded", transposed=False,
                                        dtype=np.float32) == Tiles.of_block(1, 64)
    assert _pallas_banded.default_tiles(4, 1000, l=2, u=2, kind="banded", transposed=False,
                                        dtype=np.float32) == Tiles.of_block(1, 32)
    assert _pallas_banded.default_tiles(100, 1, l=1, u=1, kind="banded_pivoted", transposed=True,
                                        dtype=np.complex128) == Tiles.of_block(32, 1)


# --- GPU readiness on any machine: the kernel lowered for CUDA ------------------------------------


def _triton_params(tiles):
    from tridiax._core.backend import _triton_params

    return _triton_params(tiles)


def _lower_cuda(l, u, kind, transposed, ab_shape, b_shape, dtype):
    def f(ab, b):
        return _pallas_banded.solve_pnq(ab, b, l=l, u=u, kind=kind, transposed=transposed,
                                        out_dtype=b.dtype, compiler_params=_triton_params)

    specs = (jax.ShapeDtypeStruct((l + u + 1, *ab_shape), dtype), jax.ShapeDtypeStruct(b_shape, dtype))
    return jax.jit(f).trace(*specs).lower(lowering_platforms=("cuda",))


def _loads_stores(ir):
    return [line for line in ir.splitlines() if re.search(r"\btt\.(load|store)\b", line)]


def _unmasked(ir):
    """Loads/stores without a mask operand, except 1x1 ones (a broadcast operand's only value,
    always in bounds), as in test_gpu_lowering.py."""
    return [a for a in _loads_stores(ir)
            if re.search(r"tt\.load %\w+ :|tt\.store %\w+, %\w+ :", a) and "tensor<1x1x" not in a]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.complex64])
@pytest.mark.parametrize("l,u", BANDS)
def test_cuda_lowering_masks_every_access_of_a_ragged_tile(l, u, dtype):
    # 1000 systems along Q: ragged tiles. The N rows are walked by two loops (scf.for), not
    # unrolled: the kernel's loads and stores are as many for N = 7 as for N = 100.
    for kind, transposed in (("banded_pivoted", False), ("banded_hermitian", True)):
        irs = [triton_kernels(_lower_cuda(l, u, kind, transposed, (3, n, 1000), (3, n, 1000), dtype))[0]
               for n in (7, 100)]
        for ir in irs:
            assert _loads_stores(ir) and ir.count("scf.for") == 2
            assert not _unmasked(ir), _unmasked(ir)
        assert len(_loads_stores(irs[0])) == len(_loads_stores(irs[1]))


@pytest.mark.parametrize("ab_shape", [(1, 100, 1), (1, 1, 1), (3, 1, 1000), (1, 100, 1000)])
def test_cuda_lowering_reads_broadcast_bands_in_place(ab_shape):
    lowered = _lower_cuda(2, 1, "banded_pivoted", False, ab_shape, (3, 100, 1000), jnp.float32)
    text = lowered.as_text()
    assert "stablehlo.broadcast_in_dim" not in text and "stablehlo.transpose" not in text
    (ir,) = triton_kernels(lowered)
    assert not _unmasked(ir), _unmasked(ir)


# --- GPU readiness: deviceless compile for an H100 (tests/support/gpu_aot.py) -----------------------------
# Skipped without the CUDA plugin (`python tests/support/gpu_aot.py --install`) unless TRIDIAX_REQUIRE_GPU_AOT
# is set, as in test_gpu_compile.py. Each case compiles the kernel alone on (P, N, Q) = (2, 1000,
# 132 * 64 + 100): a ragged last tile (every access masked) and at least one block per SM.

SMS = 132
AOT_SHAPE = (2, 1000, SMS * 64 + 100)


def aot_entry(l, u, kind, transposed):
    """The kernel as the Triton backend calls it, for `gpu_aot` ("test_banded_pallas:aot_entry(...)")."""
    def f(ab, b):
        return _pallas_banded.solve_pnq(ab, b, l=l, u=u, kind=kind, transposed=transposed,
                                        out_dtype=b.dtype, compiler_params=_triton_params)

    return f


@functools.cache
def _aot_reports(dtype: str):
    from gpu_aot import compile_reports

    cases = {f"l={l} u={u} {kind} transposed={t} {dtype}":
             (f"test_banded_pallas:aot_entry({l}, {u}, {kind!r}, {t})",
              [((l + u + 1, *AOT_SHAPE), dtype), (AOT_SHAPE, dtype)])
             for l, u in BANDS for kind in KINDS for t in (False, True)}
    return compile_reports(cases, x64=dtype in ("float64", "complex128"))


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
def test_h100_compile_without_spills(dtype):
    from gpu_aot import unavailable_reason

    if reason := unavailable_reason():
        if os.environ.get("TRIDIAX_REQUIRE_GPU_AOT", "") not in ("", "0"):
            pytest.fail(f"TRIDIAX_REQUIRE_GPU_AOT is set but deviceless GPU compilation cannot run: {reason}")
        pytest.skip(reason)
    reports = _aot_reports(dtype)
    errors = {case: r.error for case, r in reports.items() if r.error}
    assert not errors, "\n\n".join(f"{case}:\n{e}" for case, e in errors.items())
    problems = []
    for case, r in reports.items():
        pallas_kernels = [k for k in r.kernels if k.origin == "pallas_triton"]
        if len(pallas_kernels) != 1:
            problems.append(f"{case}: expected one Pallas kernel, got {[str(k) for k in r.kernels]}")
        for k in pallas_kernels:
            if k.registers is None or k.arch != "sm_90a":
                problems.append(f"{case}: ptxas did not report the kernel for sm_90a: {k}")
            if k.spill_store_bytes or k.spill_load_bytes:
                problems.append(f"{case}: spills registers: {k}")
            if k.blocks < SMS:
                problems.append(f"{case}: fewer than {SMS} blocks: {k}")
    assert not problems, "\n".join(problems)


if __name__ == "__main__":  # print every kernel: python tests/banded/test_banded_pallas.py [dtype]
    import sys

    for case, r in _aot_reports(sys.argv[1] if len(sys.argv) > 1 else "float32").items():
        print(f"{case}: " + (r.error or "; ".join(str(k) for k in r.kernels)))
