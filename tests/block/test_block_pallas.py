"""The Pallas (Triton) block-tridiagonal kernel, `_block/pallas_triton.py`.

On CPU the kernel runs in interpret mode and must give what dense NumPy solves of the assembled
matrices and the XLA formulation (`_xla_block.solve_pnq`) give, for every kind, transposed or
not, with a ragged last tile, broadcast blocks and NaN in the blocks outside the matrix
(lower[0], upper[N-1]). Interpret mode pads ragged tiles and would hide a missing mask, so GPU
readiness is checked on the kernel lowered for CUDA (every Triton load and store of a ragged tile
masked, broadcast blocks read in place) and, in the last block, compiled for an H100 without a
GPU (`gpu_aot`): registers, spills and blocks per launch.

The interpret-mode programs are compiled by XLA:CPU at optimization level 0 and without its
fusion emitters: a third of the compile time of the default, which dominates these tests (the
kernel body is unrolled over the k x k entries). For the same reason the largest blocks (k = 8)
run unpivoted here; the pivoted kind is checked up to k = 4 (its code does not depend on k).
"""

from __future__ import annotations

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import compile_unoptimized, triton_kernels

from tridiax._block import pallas_triton as _pallas_block
from tridiax._block import xla as _xla_block
from tridiax._pallas.tiles import Tiles

P, Q = 2, 5  # Q = 5 is not a multiple of the default tile (8 or more): the tile is ragged

# Errors per system, relative to its largest |x|, in units of eps * cond(A): against the XLA
# formulation (the same operations, up to complex division and fused rounding) and a dense
# LAPACK solve of the assembled matrix (another order of operations).
TOL_XLA, TOL_DENSE = 10, 20


def _compiled(fn, *args):
    compiled = compile_unoptimized(fn, *(jnp.asarray(a) for a in args),
                                   xla_cpu_use_fusion_emitters=False)
    return lambda *a: np.asarray(compiled(*(jnp.asarray(x) for x in a)))


def pallas(*operands, **options):
    fn = functools.partial(_pallas_block.solve_pnq, interpret=True, **options)
    return _compiled(fn, *operands)(*operands)


def xla(*operands, **options):
    return _compiled(functools.partial(_xla_block.solve_pnq, **options), *operands)(*operands)


# --- problems and references ----------------------------------------------------------------


def problem(k, N, m, dtype, kind, *, seed=0, shapes=None, P_=P, Q_=Q):
    """lower, diag, upper (P|1, N|1, Q|1, k, k) and b (P, N, Q, k, m); `shapes` maps "lower",
    "diag", "upper" to broadcast (P|1, N|1, Q|1) shapes. lower[:, 0] and upper[:, N-1] are NaN
    (where the operand is not broadcast along N).

    "block": diagonal blocks 3k I + noise (block diagonally dominant); "block_pivoted": 3k J +
    noise, J the exchange matrix, so that elimination without row swaps meets small pivots;
    "block_hermitian": Hermitian positive definite (lower[i] = upper[i-1]^H, diagonal blocks
    H + H^H + 3k I)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    shapes = {"lower": (P_, N, Q_), "diag": (P_, N, Q_), "upper": (P_, N, Q_), **(shapes or {})}

    def draw(shape):
        x = rng.uniform(-1, 1, shape)
        return x + 1j * rng.uniform(-1, 1, shape) if dtype.kind == "c" else x

    upper = draw(shapes["upper"] + (k, k))
    diag = draw(shapes["diag"] + (k, k))
    if kind == "block_hermitian":
        assert shapes["lower"] == shapes["upper"]
        lower = np.conj(np.swapaxes(np.roll(upper, 1, axis=1), -1, -2))
        diag = diag + np.conj(np.swapaxes(diag, -1, -2)) + 3 * k * np.eye(k)
    else:
        lower = draw(shapes["lower"] + (k, k))
        diag = diag + 3 * k * (np.eye(k)[::-1] if kind == "block_pivoted" else np.eye(k))
    if lower.shape[1] == N > 0:
        lower[:, 0] = np.nan
    if upper.shape[1] == N > 0:
        upper[:, -1] = np.nan
    b = draw((P_, N, Q_, k, m))
    return [x.astype(dtype) for x in (lower, diag, upper, b)]


def dense(lower, diag, upper, N):
    """(P, Q, N k, N k) matrices of the blocks (lower[0] and upper[N-1] left out)."""
    lower, diag, upper = (np.nan_to_num(x, nan=0.0) for x in (lower, diag, upper))
    P_, _, Q_, k, _ = np.broadcast_shapes(lower.shape, diag.shape, upper.shape)
    a = np.zeros((P_, Q_, N * k, N * k), np.result_type(lower, diag, upper, np.float64))

    def at(x, i):  # block i of every system, (P, Q, k, k)
        return np.broadcast_to(x[:, min(i, x.shape[1] - 1)], (P_, Q_, k, k))

    for i in range(N):
        rows = slice(i * k, (i + 1) * k)
        a[:, :, rows, rows] = at(diag, i)
        if i > 0:
            a[:, :, rows, (i - 1) * k:i * k] = at(lower, i)
        if i < N - 1:
            a[:, :, rows, (i + 1) * k:(i + 2) * k] = at(upper, i)
    return a


def dense_solve(lower, diag, upper, b, transposed):
    """x (P, N, Q, k, m) by np.linalg.solve of the assembled (transposed) matrices, and cond(A)
    of every system (P, Q)."""
    P_, N, Q_, k, m = b.shape
    a = dense(lower, diag, upper, N)
    if transposed:
        a = np.swapaxes(a, -1, -2)
    rhs = np.moveaxis(b, 2, 1).reshape(P_, Q_, N * k, m)
    x = np.linalg.solve(a, rhs).reshape(P_, Q_, N, k, m)
    return np.moveaxis(x, 1, 2), np.linalg.cond(a)


def assert_close(actual, expected, tol, cond):
    """|actual - expected| <= tol * eps * cond * max|expected| in every system (P, ·, Q)."""
    assert actual.shape == expected.shape
    assert np.all(np.isfinite(actual)), "non-finite values"
    eps = np.finfo(actual.dtype).eps
    axes = (1, 3, 4)
    scale = np.maximum(np.max(np.abs(expected), axis=axes), 1e-30)
    err = np.max(np.abs(actual - expected), axis=axes) / scale / (eps * np.maximum(cond, 1))
    assert err.max() <= tol, f"error {err.max():.1f} eps * cond > {tol} eps * cond"


def check(k, N, m, dtype, kind, transposed, *, tiles=None, **problem_options):
    operands = problem(k, N, m, dtype, kind, **problem_options)
    options = dict(kind=kind, transposed=transposed, out_dtype=np.dtype(dtype))
    x = pallas(*operands, tiles=tiles, **options)
    assert x.dtype == np.dtype(dtype) and x.shape == operands[3].shape
    ref, cond = dense_solve(*operands, transposed)
    assert_close(x, xla(*operands, **options), TOL_XLA, cond)
    assert_close(x, ref, TOL_DENSE, cond)


# --- interpret mode against dense solves and the XLA formulation ------------------------------

F32, F64, C64 = np.float32, np.float64, np.complex64
CASES = [  # k, N, m, dtype, kind, transposed: every k, N, m, dtype and kind, both orientations
    # (k = 8 once: its interpret-mode program alone takes seconds to compile)
    (1, 33, 1, F64, "block", False),
    (1, 5, 2, C64, "block_pivoted", True),
    (1, 2, 1, F32, "block_hermitian", False),
    (2, 33, 2, F64, "block_pivoted", False),
    (2, 1, 1, C64, "block_hermitian", True),
    (2, 5, 1, F32, "block", True),
    (3, 33, 1, F64, "block_hermitian", False),
    (3, 2, 2, F64, "block_pivoted", True),
    (3, 5, 2, C64, "block", False),
    (4, 5, 2, F32, "block_pivoted", True),
    (4, 33, 1, F64, "block", True),
    (4, 2, 1, C64, "block_hermitian", False),
    (8, 5, 2, F32, "block_hermitian", True),
]


@pytest.mark.parametrize("k,N,m,dtype,kind,transposed", CASES)
def test_matches_dense_and_xla(k, N, m, dtype, kind, transposed):
    check(k, N, m, dtype, kind, transposed, seed=k + N)


@pytest.mark.parametrize("k,kind,shapes", [
    (2, "block_pivoted", {"lower": (1, 7, Q), "diag": (P, 1, 1), "upper": (P, 7, 1)}),
    (3, "block_hermitian", {"lower": (1, 1, 1), "diag": (1, 7, Q), "upper": (1, 1, 1)}),
])
def test_broadcast_blocks(k, kind, shapes):
    # Blocks broadcast along P, N and/or Q are read in place; the references see them whole.
    check(k, 7, 2, np.float64, kind, True, shapes=shapes, seed=3)


@pytest.mark.parametrize("tiles", [(2, 4), (1, 1)])
def test_ragged_tiles_along_p_and_q(tiles):
    # P = 3, Q = 6: ragged tiles along both axes (and 1x1 tiles, none ragged); k = 2 loads each
    # block at once, k = 3 (9 entries, not a power of two) in two pieces (8 + 1).
    tiles = Tiles.of_block(*tiles)
    check(2, 5, 2, np.complex64, "block_pivoted", False, tiles=tiles, P_=3, Q_=6)
    check(3, 5, 1, np.float64, "block", True, tiles=tiles, P_=3, Q_=6)


def test_pivoting_is_needed_and_done():
    # Diagonal blocks with a zero in the corner: without row swaps the first pivot is 0.
    k, N = 3, 5
    lower, diag, upper, b = problem(k, N, 2, np.float64, "block_pivoted", seed=4)
    diag[:, :, :, 0, 0] = 0
    options = dict(transposed=False, out_dtype=np.float64)
    x = pallas(lower, diag, upper, b, kind="block_pivoted", **options)
    ref, cond = dense_solve(lower, diag, upper, b, False)
    assert_close(x, ref, TOL_DENSE, cond)
    assert not np.isfinite(pallas(lower, diag, upper, b, kind="block", **options)).any()


@pytest.mark.parametrize("kind", ["block", "block_pivoted"])
def test_singular_block_stays_in_its_system(kind):
    # System (1, 3) has a singular first diagonal block (S = diag[0]): it breaks down (inf or
    # NaN), and no other system does.
    k, N = 2, 5
    lower, diag, upper, b = problem(k, N, 1, np.float64, kind, seed=5)
    diag[1, 0, 3] = [[1, 2], [2, 4]]
    options = dict(kind=kind, transposed=False, out_dtype=np.float64)
    x = pallas(lower, diag, upper, b, **options)
    bad = ~np.isfinite(x)
    assert bad[1, :, 3].any() and not np.delete(bad[1], 3, axis=1).any() and not bad[0].any()
    ref, cond = dense_solve(lower, diag, upper, b, False)
    keep = np.ones((P, Q), bool)
    keep[1, 3] = False
    for p, q in zip(*np.nonzero(keep), strict=True):
        assert_close(x[p:p + 1, :, q:q + 1], ref[p:p + 1, :, q:q + 1], TOL_DENSE,
                     cond[p:p + 1, q:q + 1])


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
def test_indefinite_hermitian_gives_nan_in_that_system_only(dtype):
    k, N = 2, 7
    lower, diag, upper, b = problem(k, N, 2, dtype, "block_hermitian", seed=6)
    diag[1, 4, 3] = -diag[1, 4, 3]  # system (1, 3): a negative pivot at block row 4
    options = dict(kind="block_hermitian", transposed=False, out_dtype=np.dtype(dtype))
    x = pallas(lower, diag, upper, b, **options)
    bad = np.isnan(x)
    np.testing.assert_array_equal(bad, np.isnan(xla(lower, diag, upper, b, **options)))
    assert bad[1, :, 3].all() and bad.sum() == N * k * 2
    # The same matrix solved with pivoting has no NaN: only the Hermitian kind refuses it.
    options["kind"] = "block_pivoted"
    assert np.isfinite(pallas(lower, diag, upper, b, **options)).all()


def test_half_precision_output_and_real_blocks_with_complex_rhs():
    # bfloat16: eliminated in float32 (y in a float32 work output), x rounded once.
    operands = problem(2, 5, 2, np.float32, "block_pivoted", seed=7)
    options = dict(kind="block_pivoted", transposed=True, out_dtype=jnp.bfloat16)
    x, ref = pallas(*operands, **options), xla(*operands, **options)
    assert x.dtype == jnp.bfloat16
    scale = np.abs(ref.astype(np.float32)).max()
    assert np.abs(x.astype(np.float32) - ref.astype(np.float32)).max() <= 2 ** -8 * scale
    # Real blocks, complex right-hand sides: the blocks are promoted in the kernel.
    lower, diag, upper, _ = problem(2, 5, 1, np.float64, "block", seed=8)
    b = problem(2, 5, 1, np.complex128, "block", seed=9)[3]
    options = dict(kind="block", transposed=False, out_dtype=np.complex128)
    x = pallas(lower, diag, upper, b, **options)
    ref, cond = dense_solve(lower, diag, upper, b, False)
    assert_close(x, ref, TOL_DENSE, cond)


def test_empty_and_invalid():
    blocks = jnp.ones((2, 0, 3, 2, 2))
    options = dict(kind="block", transposed=False, out_dtype=np.float64)
    assert _pallas_block.solve_pnq(blocks, blocks, blocks, jnp.ones((2, 0, 3, 2, 1)),
                                   **options).shape == (2, 0, 3, 2, 1)
    blocks, b = jnp.ones((1, 5, 1, 2, 2)), jnp.ones((1, 5, 1, 2, 1))
    with pytest.raises(ValueError, match="kind"):
        _pallas_block.solve_pnq(blocks, blocks, blocks, b, **{**options, "kind": "lu"})
    with pytest.raises(ValueError, match="diag must be"):
        _pallas_block.solve_pnq(blocks, jnp.ones((1, 5, 1, 3, 3)), blocks, b, **options)


def test_default_tiles():
    # Two systems per thread (64-system tiles) for k = 1, one (32) for larger blocks.
    assert _pallas_block.default_tiles(4, 1000, k=1) == Tiles.of_block(1, 64)
    assert _pallas_block.default_tiles(4, 1000, k=2) == Tiles.of_block(1, 32)
    assert _pallas_block.default_tiles(100, 1, k=8) == Tiles.of_block(32, 1)


# --- GPU readiness on any machine: the kernel lowered for CUDA ------------------------------


def _triton_params(tiles):
    from tridiax._core.backend import _triton_params

    return _triton_params(tiles)


def _lower_cuda(k, kind, transposed, block_shape, b_shape, dtype, m=2):
    def f(lower, diag, upper, b):
        return _pallas_block.solve_pnq(lower, diag, upper, b, kind=kind, transposed=transposed,
                                       out_dtype=b.dtype, compiler_params=_triton_params)

    specs = [jax.ShapeDtypeStruct((*block_shape, k, k), dtype)] * 3 + [
        jax.ShapeDtypeStruct((*b_shape, k, m), dtype)]
    return jax.jit(f).trace(*specs).lower(lowering_platforms=("cuda",))


def _loads_stores(ir):
    return [line for line in ir.splitlines() if re.search(r"\btt\.(load|store)\b", line)]


def _unmasked(ir):
    """Loads/stores without a mask operand, except those of a (·, 1, 1) tile (an operand
    broadcast along P and Q: its only system, always in bounds)."""
    return [a for a in _loads_stores(ir)
            if re.search(r"tt\.load %\w+ :|tt\.store %\w+, %\w+ :", a)
            and not re.search(r"tensor<(\d+x)*1x1x!tt\.ptr", a)]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.complex64])
@pytest.mark.parametrize("k", [2, 3])
def test_cuda_lowering_masks_every_access_of_a_ragged_tile(k, dtype):
    # 1000 systems along Q: ragged tiles. The N block rows are walked by two loops (scf.for),
    # not unrolled, and each block row is loaded and stored whole (k = 2), or in two pieces of
    # 8 + 1 entries (k = 3): per part (2 for complex), 4 operands are loaded and E and y stored
    # in the forward loop, E and y loaded and x stored in the backward one (Pallas lowers a
    # masked store as a swap: a load, dead, and the store).
    for kind, transposed in (("block_pivoted", False), ("block_hermitian", True)):
        irs = [triton_kernels(_lower_cuda(k, kind, transposed, (3, n, 1000), (3, n, 1000),
                                          dtype))[0] for n in (7, 100)]
        for ir in irs:
            assert _loads_stores(ir) and ir.count("scf.for") == 2
            assert not _unmasked(ir), _unmasked(ir)
        pieces = {2: 1, 3: 2}[k]  # of k*k = 4 (9) and of k*m = 4 (6) entries
        parts = 2 if dtype == jnp.complex64 else 1
        assert len(_loads_stores(irs[0])) == len(_loads_stores(irs[1])) == 12 * pieces * parts


@pytest.mark.parametrize("block_shape", [(1, 100, 1), (1, 1, 1), (3, 1, 1000)])
def test_cuda_lowering_reads_broadcast_blocks_in_place(block_shape):
    lowered = _lower_cuda(2, "block_pivoted", False, block_shape, (3, 100, 1000), jnp.float32)
    assert "stablehlo.broadcast_in_dim" not in lowered.as_text()
    (ir,) = triton_kernels(lowered)
    assert not _unmasked(ir), _unmasked(ir)



@pytest.mark.parametrize("k, m, triton", [(8, 1, False), (8, 8, False), (2, 8, True), (6, 1, True)])
def test_cuda_default_backend_follows_the_block_size(k, m, triton):
    # Blocks larger than PALLAS_BLOCK_LIMIT run XLA's loop on a GPU, whatever m is (the choice
    # once read m, the last size of b, for k).
    import tridiax

    specs = [jax.ShapeDtypeStruct((50, 7, k, k), jnp.float32)] * 3 + [
        jax.ShapeDtypeStruct((50, 7, k, m), jnp.float32)]
    lowered = jax.jit(lambda *a: tridiax.solve_block_tridiagonal(*a, axis=0)).trace(
        *specs).lower(lowering_platforms=("cuda",))
    assert bool(triton_kernels(lowered)) == triton

# --- GPU readiness: deviceless compile for an H100 (tests/support/gpu_aot.py) -------------------------
# Skipped without the CUDA plugin (`python tests/support/gpu_aot.py --install`) unless
# TRIDIAX_REQUIRE_GPU_AOT is set, as in test_gpu_compile.py. Each case compiles the kernel alone
# on (P, N, Q) = (2, 1000, 132 * 32 + 100) with m = 2: a ragged last tile (every access masked)
# and at least one block per SM. k = 8 compiles in 10-30 s per kind (k = 2, 4: about 1 s) and
# spills a little in float32 (more in float64 and complex): the test compiles it unpivoted only;
# `python tests/block/test_block_pallas.py [dtype]` prints every k and kind.

SMS = 132
AOT_SHAPE = (2, 1000, SMS * 32 + 100)


def aot_entry(kind, transposed):
    """The kernel as the Triton backend calls it, for `gpu_aot` ("test_block_pallas:aot_entry(...)")."""
    def f(lower, diag, upper, b):
        return _pallas_block.solve_pnq(lower, diag, upper, b, kind=kind, transposed=transposed,
                                       out_dtype=b.dtype, compiler_params=_triton_params)

    return f


def aot_reports(dtype: str, cases):
    """gpu_aot's reports of the kernel for each (k, kind, transposed) of `cases`."""
    from gpu_aot import compile_reports

    requests = {(k, kind, t): (f"test_block_pallas:aot_entry({kind!r}, {t})",
                               [((*AOT_SHAPE, k, k), dtype)] * 3 + [((*AOT_SHAPE, k, 2), dtype)])
                for k, kind, t in cases}
    reports = compile_reports({f"k={k} {kind} transposed={t} {dtype}": request
                               for (k, kind, t), request in requests.items()},
                              x64=dtype in ("float64", "complex128"))
    return dict(zip(requests, reports.values(), strict=True))


def test_h100_compile():
    from gpu_aot import unavailable_reason

    if reason := unavailable_reason():
        if os.environ.get("TRIDIAX_REQUIRE_GPU_AOT", "") not in ("", "0"):
            pytest.fail(f"TRIDIAX_REQUIRE_GPU_AOT is set but deviceless GPU compilation cannot run: {reason}")
        pytest.skip(reason)
    cases = [(k, kind, False) for k in (2, 4) for kind in _xla_block.KINDS]
    reports = aot_reports("float32", [*cases, (4, "block_pivoted", True), (8, "block", False)])
    problems = []
    for (k, kind, t), r in reports.items():
        if r.error:
            problems.append(f"k={k} {kind} transposed={t}:\n{r.error}")
            continue
        kernels = [x for x in r.kernels if x.origin == "pallas_triton"]
        if len(kernels) != 1 or kernels[0].registers is None or kernels[0].arch != "sm_90a":
            problems.append(f"k={k} {kind}: expected one Pallas kernel for sm_90a: {r.kernels}")
            continue
        (kernel,) = kernels
        print(f"k={k} {kind} transposed={t}: {kernel}")
        if k <= 4 and (kernel.spill_store_bytes or kernel.spill_load_bytes):
            problems.append(f"k={k} {kind} transposed={t}: spills registers: {kernel}")
        if kernel.blocks < SMS:
            problems.append(f"k={k} {kind}: fewer than {SMS} blocks: {kernel}")
    assert not problems, "\n".join(problems)


if __name__ == "__main__":  # every k and kind: python tests/block/test_block_pallas.py [dtype [k,k,...]]
    import sys

    dtype = sys.argv[1] if len(sys.argv) > 1 else "float32"
    ks = [int(k) for k in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 2, 4, 8]
    for (k, kind, t), r in aot_reports(dtype, [(k, kind, False) for k in ks
                                               for kind in _xla_block.KINDS]).items():
        pallas = [str(x) for x in r.kernels if x.origin == "pallas_triton"]
        others = len(r.kernels) - len(pallas)  # the layout copies around the kernel
        print(f"k={k} {kind} {dtype} ({r.compile_seconds:.0f} s): "
              + (r.error or "; ".join(pallas) + f"; and {others} XLA kernels"))
