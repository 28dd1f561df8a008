"""The Pallas Mosaic TPU banded kernel, `_banded/pallas_tpu.py`, in TPU interpret mode (TPU
semantics on CPU, VMEM starting as NaNs) and, for systems longer than TPU_SEMANTICS_ROWS, in
Pallas's HLO interpreter.

`TestPallasTpuInterpret` runs the banded kernel contract (banded_contract.py) on it in
float32, half precision and complex64 (the TPU kernels' dtypes), against scipy.linalg.solve_banded and the
XLA formulation it follows step for step: every bandwidth, kind and orientation, short systems,
every broadcast of the bands in every layout of the kernel (`_pallas/tpu.py`), and systems of
several chunks, whose steps read the previous chunk's rows from the halo (the bands in
float32 stages, or SMEM scalars for a matrix shared by every system). Each case compiles a
program of its own, so the cases are fewer than the native kernel's. The plain tests check
what only this kernel has: its VMEM plan, the streamed kernels for systems too long for it,
and XLA's loop under a budget too small even for those. The
kernel compiled for a TPU without one: tests/tpu/test_tpu_compile.py.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from banded_contract import (
    KINDS,
    SHORT,
    BandedKernelContract,
    assert_close,
    check,
    compiled,
    condition,
    problem,
    xla_solve,
)

from tridiax._banded import pallas_tpu as _tpu_banded
from tridiax._pallas import tpu as _tpu

pytestmark = pytest.mark.skipif(not _tpu.available(), reason="this JAX has no Pallas TPU backend")

BANDS = [(0, 0), (1, 1), (2, 2), (3, 1), (0, 3), (2, 0)]


# The kernel in TPU interpret mode (TPU semantics: DMAs, VMEM starting as NaNs), which costs a
# host callback per load and store (a system of 300 rows takes half a minute), and in Pallas's
# HLO interpreter (the same kernel as an XLA program for the CPU: a compile of a few seconds).
# The contract's systems longer than TPU_SEMANTICS_ROWS run in the latter;
# test_several_chunks_with_tpu_semantics keeps systems of several chunks (the halo) in the
# former.
TPU_SEMANTICS_ROWS = 64
tpu_semantics_solve = compiled(_tpu_banded.solve_pnq, interpret=_tpu.interpret_params())
hlo_solve = compiled(_tpu_banded.solve_pnq, interpret=True)


def tpu_solve(ab, b, **options):
    solve = tpu_semantics_solve if b.shape[1] <= TPU_SEMANTICS_ROWS else hlo_solve
    return solve(ab, b, **options)


class TestPallasTpuInterpret(BandedKernelContract):
    DTYPE = np.float32
    COMPLEX = False
    # Every band and kind at N = 33, alternating orientations; shorter systems for two bands.
    SYSTEMS = ([(l, u, kind, 33, (n + m) % 2 == 1) for n, (l, u) in enumerate(BANDS)
                for m, kind in enumerate(KINDS)]
               + [(l, u, kind, n, t) for l, u in [(2, 2), (3, 1)] for n, kind, t in SHORT])
    TWIN_SYSTEMS = SYSTEMS[::3]
    # Each layout: "sublanes" of several chunks (the halo; a shared matrix in SMEM), "lanes" and
    # "transposed" (batch-first systems), every broadcast of the bands.
    LAYOUTS = [(2, 1, "banded_pivoted", True, (13, 300, 5), np.float32),
               (1, 2, "banded", False, (2, 40, 1030), np.float32),
               (3, 1, "banded_hermitian", True, (129, 40, 1), np.float32)]
    # and complex64 as float32 parts, several chunks: the halo of staged bands and of SMEM
    # scalars, each part's
    TWIN_LAYOUTS = LAYOUTS[:1] + [(2, 1, "banded_pivoted", False, (9, 300, 3), np.complex64)]
    TWIN_BROADCASTS = ("1N1", "PN1")
    # Half precision, with "lanes" of several chunks, and a wide band (8, 8).
    DTYPES = [(2, 2, "banded_pivoted", True, (1, 300, 1030), jnp.bfloat16),
              (1, 1, "banded", False, (3, 33, 19), np.float16),
              (8, 8, "banded_pivoted", False, (3, 40, 19), np.float32),
              (1, 3, "banded_pivoted", True, (1, 40, 1030), np.complex64),
              (2, 2, "banded_hermitian", False, (130, 33, 1), np.complex64),
              (0, 2, "banded", True, (3, 7, 19), np.complex64)]
    TWIN_DTYPES = DTYPES[:1] + DTYPES[3:4]
    INDEFINITE = [(l, t, (3, 33, 19), np.float32) for l in (0, 2) for t in (False, True)]
    ZERO_SIZES = [(0, 7, 5), (3, 7, 0)]

    test_nan_in_the_pivot_column_spoils_its_system_alone = None  # complex128

    def test_real_bands_with_complex_rhs(self):
        """Real bands, a complex64 right-hand side: the bands are read as one part."""
        l, u, kind = 1, 2, "banded_pivoted"
        ab, _, clean = problem(l, u, kind, (2, 7, 19), dtype=np.float32, seed=6)
        _, b, _ = problem(l, u, kind, (2, 7, 19), dtype=np.complex64, seed=8)
        got = self.solve(ab, b, l=l, u=u, kind=kind, transposed=True)
        assert got.dtype == np.complex64
        check(got, clean, b, l, u, True)

    def solve(self, ab, b, **options):
        return tpu_solve(ab, b, **options)

    def batch(self, n):
        return [(2, n, 19)]

    def twin_batch(self, n):
        return [(2, n, 19)]


def test_vmem_plan_narrows_the_row_tile_and_falls_back_for_long_systems(monkeypatch):
    """U's rows of a whole system stay in VMEM: longer systems get row tiles of fewer
    sublanes, and systems too long for any run XLA's loop; both agree with scipy."""
    l, u, kind = 2, 1, "banded_pivoted"
    ab, b, clean = problem(l, u, kind, (1, 260, 1024), dtype=np.float32, seed=2)
    options = dict(l=l, u=u, kind=kind, transposed=False, out_dtype=np.float32)
    wide = _tpu_banded._plan(1, 260, 1024, ab, b, np.float32, l=l, u=u, kind=kind,
                             transposed=False)
    assert wide.chunks == 3
    monkeypatch.setattr(_tpu, "VMEM_BUDGET", 3 << 20)
    narrow = _tpu_banded._plan(1, 260, 1024, ab, b, np.float32, l=l, u=u, kind=kind,
                               transposed=False)
    assert narrow is not None and narrow.s < wide.s
    check(np.asarray(_tpu_banded.solve_pnq(jnp.asarray(ab), jnp.asarray(b), **options,
                                           interpret=True)), clean, b, l, u, False)
    monkeypatch.setattr(_tpu, "VMEM_BUDGET", 1 << 16)
    assert not _tpu_banded.fits(ab.shape, 1, 260, 1024, np.float32, l=l, u=u, kind=kind)
    assert _tpu_banded._plan(1, 260, 1024, ab, b, np.float32, l=l, u=u, kind=kind, transposed=False,
                             streamed=True) is None
    check(np.asarray(_tpu_banded.solve_pnq(jnp.asarray(ab), jnp.asarray(b), **options)), clean, b,
          l, u, False)


@pytest.mark.parametrize("ab_shape", [None, (1, 300, 1)], ids=["staged-bands", "one-matrix"])
def test_several_chunks_with_tpu_semantics(ab_shape):
    """Systems of several chunks in TPU interpret mode, each step of a chunk after the first
    reading the previous chunk's rows from the halo: of the bands' float32 stages, or of the SMEM scalars
    of a matrix shared by every system; against scipy."""
    l, u, kind = 2, 1, "banded_pivoted"
    ab, b, clean = problem(l, u, kind, (13, 300, 5), ab_shape, dtype=np.float32, seed=4)
    assert _tpu_banded._plan(13, 300, 5, jnp.asarray(ab), jnp.asarray(b), np.float32, l=l, u=u,
                             kind=kind, transposed=True).chunks > 1
    check(tpu_semantics_solve(ab, b, l=l, u=u, kind=kind, transposed=True), clean, b, l, u, True)


# (l, u, kind, (P, N, Q), ab's shape (None: full), dtype, transposed, stored): chunks of 128
# rows; every layout ("lanes", "sublanes" with the halo, "transposed" batch-first systems);
# a last chunk of one row (257); the work arrays spilling into a chunk past the last (383 + D
# = 4 > 3 * 128); a wide band; a matrix shared by every system (SMEM scalars and their halo);
# complex64 and bfloat16; a Hermitian matrix given as its lower triangle.
STREAMED = [(2, 1, "banded_pivoted", (1, 300, 130), None, np.float32, True, None),
            (2, 1, "banded_pivoted", (13, 300, 5), None, np.float32, True, None),
            (3, 1, "banded_hermitian", (129, 1000, 1), None, np.float32, True, None),
            (1, 3, "banded_pivoted", (1, 257, 130), None, np.complex64, True, None),
            (2, 2, "banded_pivoted", (1, 383, 130), None, jnp.bfloat16, False, None),
            (8, 8, "banded_pivoted", (3, 300, 19), None, np.float32, False, None),
            (1, 2, "banded", (2, 300, 1030), (1, 300, 1), np.float32, False, None),
            (2, 2, "banded_hermitian", (3, 300, 19), None, np.complex64, True, "lower")]


@pytest.mark.parametrize("l, u, kind, shape, ab_shape, dtype, transposed, stored", STREAMED)
def test_systems_too_long_for_vmem_stream_u_and_y(l, u, kind, shape, ab_shape, dtype, transposed, stored,
                                                  monkeypatch):
    """Under a VMEM budget too small for U's rows of the whole system, two kernels run (the
    forward elimination writing the kept rows of U and y to HBM, D = l + u rows down, the back
    substitution reading them last chunk first), not XLA's loop: against scipy and the XLA
    formulation."""
    ab, b, clean = problem(l, u, kind, shape, ab_shape, dtype=dtype, seed=l + 2 * u)
    P, N, Q = shape
    options = dict(l=l, u=u, kind=kind, transposed=transposed)
    want = xla_solve(ab, b, **options)
    if stored is not None:
        ab = ab[u:] if stored == "lower" else ab[:u + 1]
    arrays = jnp.asarray(ab), jnp.asarray(b)
    budget = next(s for s in (int(1.1 ** e) for e in range(200, 100, -1))
                  if _tpu_banded._plan(P, N, Q, *arrays, dtype, **options, budget=s) is None)
    g = _tpu_banded._plan(P, N, Q, *arrays, dtype, **options, budget=budget, streamed=True)
    assert g is not None and g.chunks > 2
    monkeypatch.setattr(_tpu, "VMEM_BUDGET", budget)

    def refuse(*args, **kwargs):
        raise AssertionError("XLA's loop ran")

    monkeypatch.setattr(_tpu_banded._xla, "solve_pnq", refuse)
    got = np.asarray(_tpu_banded.solve_pnq(*arrays, **options, out_dtype=dtype, stored=stored,
                                           interpret=_tpu.interpret_params()))
    check(got, clean, b, l, u, transposed)
    assert_close(got, want, dtype, condition(clean, l, u, b.shape, transposed))


def test_invalid():
    options = dict(l=1, u=1, kind="banded", transposed=False, out_dtype=np.float32)
    with pytest.raises(ValueError, match="kind"):
        _tpu_banded.solve_pnq(jnp.ones((3, 1, 5, 1)), jnp.ones((1, 5, 1)), **{**options, "kind": "lu"})
    with pytest.raises(ValueError, match="ab must be"):
        _tpu_banded.solve_pnq(jnp.ones((2, 1, 5, 1)), jnp.ones((1, 5, 1)), **options)


@pytest.mark.parametrize("stored", ["upper", "lower"])
@pytest.mark.parametrize("u, shape, ab_shape, transposed, dtype", [
    (2, (13, 300, 5), None, True, np.float32),        # sublanes, two chunks: mirrored reads from the halo
    (1, (2, 40, 1030), (1, 40, 1), False, np.float32),  # lanes, one matrix for every system: SMEM scalars
    (3, (129, 40, 1), (129, 1, 1), True, np.float32),   # transposed, bands constant along N: tiles
    (2, (3, 2, 19), None, False, np.float32),          # shorter than the band
    (2, (3, 33, 19), None, True, np.complex64),        # conjugated mirror images, a real diagonal
    (1, (2, 40, 1030), (1, 40, 1), False, np.complex64),
])
def test_hermitian_matrix_given_as_one_triangle(stored, u, shape, ab_shape, transposed, dtype):
    """solveh_banded's layout (`stored`): the u + 1 bands of one triangle, the other
    triangle's entries read as the conjugates of their mirror images in the kernel and the
    diagonal's imaginary part ignored, against scipy on the whole matrix, for every way the
    bands reach the kernel."""
    ab, b, clean = problem(u, u, "banded_hermitian", shape, ab_shape, dtype=dtype, seed=5)
    if np.iscomplexobj(ab):  # what a Hermitian matrix's diagonal holds beside its real part is unread
        ab[u] += 1j * np.random.default_rng(6).uniform(-1, 1, ab[u].shape).astype(np.float32)
    triangle = ab[:u + 1] if stored == "upper" else ab[u:]
    x = tpu_solve(triangle, b, l=u, u=u, kind="banded_hermitian", transposed=transposed, stored=stored)
    check(x, clean, b, u, u, transposed)


def test_a_stored_triangle_is_a_hermitian_matrix():
    options = dict(l=1, u=1, transposed=False, out_dtype=np.float32)
    with pytest.raises(ValueError, match="Hermitian"):
        _tpu_banded.solve_pnq(jnp.ones((2, 1, 5, 1)), jnp.ones((1, 5, 1)), kind="banded", stored="upper", **options)
    with pytest.raises(ValueError, match="ab must be"):
        _tpu_banded.solve_pnq(jnp.ones((3, 1, 5, 1)), jnp.ones((1, 5, 1)), kind="banded_hermitian",
                              stored="lower", **options)
