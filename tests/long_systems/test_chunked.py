"""Long systems split into chunks (the partition method inside one device, `_long_systems/chunked.py`) and the
planner that decides it (`_core/planner.py`): answers against `tridiax.verify.reference_solve`, NumPy
loops and the unchunked kernel, gradients, the user's override, and packed ragged batches."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import RTOL, numpy_loop

import tridiax
from tridiax import verify
from tridiax._core import backend as _backend
from tridiax._core import planner as _planner
from tridiax._native import build as _native_build
from tridiax._native import ffi as _native
from tridiax._recurrence.primitive import recurrence_p
from tridiax._tridiagonal.api import solve

RNG = np.random.default_rng(13)
DTYPES = (np.float32, np.float64, np.complex64, np.complex128)


def dominant_bands(shape, dtype, rng=RNG):
    """Random bands of a diagonally dominant matrix (|d| >= 3 > |l| + |u|) and a rhs."""
    l, u, b = (rng.uniform(-1, 1, shape) for _ in range(3))
    d = 3 + rng.uniform(0, 1, shape)
    if np.issubdtype(dtype, np.complexfloating):
        l = l * np.exp(0.7j)
        b = b + 1j * rng.uniform(-1, 1, shape)
    return [np.asarray(v, dtype) for v in (l, d, u, b)]


def tolerance(dtype):
    return 5 * RTOL[np.dtype(dtype)]


def rel_err(x, ref):
    x, ref = np.asarray(x), np.asarray(ref)
    return np.max(np.abs(x - ref)) / np.max(np.abs(ref))


# ---------------------------------------------------------------------------------------------
# Solves.

# (40, 4100) along axis 0: chunk tiles of whole rows split in parts (cpu_tiling), the last
# part narrower than the others.
SHAPES = [((203, 9), 0), ((9, 203), -1), ((2, 1001), 1), ((777,), 0), ((3, 301, 5), 1),
          ((64, 130), 0), ((40, 4100), 0)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("periodic", [False, True], ids=["plain", "periodic"])
@pytest.mark.parametrize("shape,axis", SHAPES)
def test_chunked_solve_matches_reference_and_unchunked_kernel(shape, axis, periodic, dtype):
    bands = dominant_bands(shape, dtype)
    ref = verify.reference_solve(*bands, axis=axis, periodic=periodic)
    whole = np.asarray(solve(*bands, axis=axis, periodic=periodic, chunk=0))
    for chunk in (2, 3, 16, 50):
        x = np.asarray(solve(*bands, axis=axis, periodic=periodic, chunk=chunk))
        assert x.dtype == np.dtype(dtype)
        assert rel_err(x, ref) < tolerance(dtype), chunk
        assert rel_err(x, whole) < tolerance(dtype), chunk


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("periodic", [False, True], ids=["plain", "periodic"])
def test_chunked_gradients_match_unchunked(periodic, dtype):
    shape, axis = (301, 7), 0
    bands = [jnp.asarray(v) for v in dominant_bands(shape, dtype)]
    cotangent = jnp.asarray(RNG.standard_normal(shape), dtype)

    def grads(chunk):
        _, vjp = jax.vjp(lambda *a: solve(*a, axis=axis, periodic=periodic, chunk=chunk), *bands)
        return vjp(cotangent)

    for got, want in zip(grads(17), grads(0), strict=True):
        assert rel_err(got, want) < tolerance(dtype)
    # jvp too (forward mode runs the chunked solve of the tangent system).
    tangents = [jnp.asarray(RNG.standard_normal(shape), dtype) for _ in bands]
    jvp = [jax.jvp(lambda *a, c=c: solve(*a, axis=axis, periodic=periodic, chunk=c), bands,
                   tangents)[1] for c in (17, 0)]
    assert rel_err(*jvp) < tolerance(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("periodic", [False, True], ids=["plain", "periodic"])
@pytest.mark.parametrize("bands_shape", ["per_system", "shared", "constant"])
def test_chunks_of_contiguous_rows_solve_and_transposed_solve(bands_shape, periodic, dtype):
    """Chunks whose rows are contiguous (systems along the last axis): the solve and, through
    the gradient, the transposed solve, against scipy, with bands per system, shared by every
    system, or constant along the axis (read with stride 0), and a short last chunk (1001 =
    10 * 97 + 31) in tiles of its own."""
    shape, chunk = (3, 1001), 97
    l, d, u, b = dominant_bands(shape, dtype)
    if bands_shape == "shared":
        l, d, u = (v[:1] for v in (l, d, u))
    elif bands_shape == "constant":
        l, d, u = (v[:, :1] for v in (l, d, u))
    assert _planner.valid_chunk(shape[1], chunk, periodic=periodic) == chunk
    x = solve(l, d, u, b, axis=-1, periodic=periodic, chunk=chunk)
    assert rel_err(x, verify.reference_solve(l, d, u, b, periodic=periodic)) < tolerance(dtype)
    # The gradient w.r.t. b is A^{-T} g: A^T has lower[i] = upper[i-1], upper[i] = lower[i+1]
    # (the corners swapped the same way when periodic).
    g = RNG.standard_normal(shape).astype(dtype)
    _, vjp = jax.vjp(lambda b: solve(l, d, u, b, axis=-1, periodic=periodic, chunk=chunk), b)
    full = [np.broadcast_to(v, shape) for v in (l, d, u)]
    want = verify.reference_solve(np.roll(full[2], 1, -1), full[1], np.roll(full[0], -1, -1), g,
                                  periodic=periodic)
    assert rel_err(vjp(jnp.asarray(g))[0], want) < tolerance(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("periodic", [False, True], ids=["plain", "periodic"])
@pytest.mark.parametrize("Q", [2, 4, 8])
@pytest.mark.parametrize("bands_shape", ["per_system", "one_row", "one_value", "shared_by_q"])
def test_rows_of_a_few_lanes_solve_and_transposed_solve(bands_shape, Q, periodic, dtype):
    """(P, N, Q) along axis 1 with Q dividing a vector: the sweeps over chunks read a tile of
    one vector of lanes (L/Q chunks) straight into registers (chunks.cc, EndsOfRuns and
    SolveOfRuns; chunks of 97 and 91 rows, and of 2 and 3: one or two interior rows); a
    narrower last tile of long chunks (11 chunks of 91), the whole solve (chunk=0) and short
    chunks sweep the Q lanes of a chunk through RowReader's blocks; with the bands per
    system, one row broadcast along N, one value, or shared by the Q systems (one value a
    row: one matrix, Q right-hand sides); against scipy, and the
    transposed solve through the gradient. 1001 = 10 * 97 + 31: a short last chunk; 1000 rows
    in chunks of 2 (1001 has none); P = 2: tiles of each p's chunks."""
    for rows, chunk in ((1001, 97), (1001, 91), (1000, 2), (1001, 3), (1001, 0)):
        shape = (2, rows, Q)
        l, d, u, b = dominant_bands(shape, dtype)
        if bands_shape == "one_row":
            l, d, u = (v[:, :1] for v in (l, d, u))
        elif bands_shape == "one_value":
            l, d, u = (v[:1, :1, :1] for v in (l, d, u))
        elif bands_shape == "shared_by_q":
            l, d, u = (v[:, :, :1] for v in (l, d, u))
        assert not chunk or _planner.valid_chunk(rows, chunk, periodic=periodic) == chunk
        full = [np.broadcast_to(v, shape) for v in (l, d, u)]
        want = verify.reference_solve(*full, b, axis=1, periodic=periodic)
        g = RNG.standard_normal(shape).astype(dtype)
        want_t = verify.reference_solve(np.roll(full[2], 1, 1), full[1], np.roll(full[0], -1, 1),
                                        g, axis=1, periodic=periodic)
        x, vjp = jax.vjp(
            lambda b, c=chunk: solve(l, d, u, b, axis=1, periodic=periodic, chunk=c), b)
        assert rel_err(x, want) < tolerance(dtype), chunk
        assert rel_err(vjp(jnp.asarray(g))[0], want_t) < tolerance(dtype), chunk


@pytest.mark.parametrize("kind", ["thomas", "periodic", "pivoted", "periodic_pivoted"])
def test_every_kind_at_a_million_rows_matches_reference(kind):
    """One system of 10^6 rows through the planner (chunked where the kind allows it): the
    normwise backward error in float64 and float32, and the forward error against scipy. The
    pivoting=True matrices here are not diagonally dominant and their conditioning follows the
    draw: forward errors of 1e-12 to 3e-10 across seeds, where the backward error stays near
    1e-16; so the draw is the test's own, whichever tests ran before it."""
    n = 1_000_000
    periodic, pivoting = "periodic" in kind, "pivoted" in kind
    l, d, u, b = dominant_bands((n,), np.float64, rng=np.random.default_rng(1))
    if pivoting:  # not dominant: rows where pivoting swaps
        d = d * np.where(np.arange(n) % 5 == 0, 0.05, 1.0)
    ref = verify.reference_solve(l, d, u, b, periodic=periodic)
    public = tridiax.solve_periodic_tridiagonal if periodic else tridiax.solve_tridiagonal
    x = np.asarray(public(l, d, u, b, pivoting=pivoting))
    assert rel_err(x, ref) < (1e-8 if pivoting else 1e-10)
    assert backward_error(l, d, u, b, x, periodic) < 1e-14
    x32 = public(*(v.astype(np.float32) for v in (l, d, u, b)), pivoting=pivoting)
    assert backward_error(l, d, u, b, np.asarray(x32, np.float64), periodic) < 1e-6


def backward_error(l, d, u, b, x, periodic):
    """max |A x - b| / max(|l x[i-1]| + |d x| + |u x[i+1]| + |b|), in float64."""
    before, after = (np.roll(x, 1), np.roll(x, -1)) if periodic else (
        np.concatenate([[0], x[:-1]]), np.concatenate([x[1:], [0]]))
    residual = l * before + d * x + u * after - b
    scale = np.abs(l * before) + np.abs(d * x) + np.abs(u * after) + np.abs(b)
    return np.max(np.abs(residual)) / np.max(scale)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", ["thomas", "periodic", "pivoted", "periodic_pivoted"])
def test_few_narrow_systems_along_axis_0_match_reference(kind, dtype):
    """(N, 3) along axis 0, the planner's own route: chunks of 3 contiguous lanes for the
    chunked kinds, tiles of one system per core's share for the sequential ones; the
    gradient and a linear recurrence over the same layout too."""
    n, q = 40_000, 3
    periodic, pivoting = "periodic" in kind, "pivoted" in kind
    plan = _planner.solve_plan("native", "cpu", 1, n, q, dtype, kind=kind)
    assert (plan.chunk > 0) == (kind in _planner.CHUNKED_KINDS)
    if q < _planner.vector_lanes(dtype):  # not on 16-byte vectors (float64: 2 lanes)
        assert plan.tiling == _planner.CpuTiling("q", q)  # 12- and 24-byte rows: in place
    # Draws of the test's own: with the module's generator, the bands depended on the tests run
    # before this one in the same process.
    l, d, u, b = dominant_bands((n, q), dtype, rng=np.random.default_rng(5))
    if pivoting:  # rows where pivoting swaps
        d = d * np.where(np.arange(n) % 5 == 0, 0.05, 1.0)[:, None].astype(dtype)
    public = tridiax.solve_periodic_tridiagonal if periodic else tridiax.solve_tridiagonal
    x = public(l, d, u, b, axis=0, pivoting=pivoting)
    ref = verify.reference_solve(l, d, u, b, axis=0, periodic=periodic)
    if pivoting:
        # Far from dominant, these matrices can be ill-conditioned (forward errors of 2-7% in
        # float32 for some draws, against scipy's float64 solution), so what pivoting must keep
        # small is the backward error: 4e-8 in float32 for those draws.
        columns = [np.asarray(v, np.float64) for v in (l, d, u, b, x)]
        worst = max(backward_error(*(v[:, k] for v in columns), periodic) for k in range(q))
        assert worst < 20 * np.finfo(dtype).eps
    else:
        assert rel_err(x, ref) < tolerance(dtype)
    if kind != "thomas":
        return
    factored = tridiax.Tridiagonal(l, d, u, axis=0).factor().solve(b)  # never chunked
    assert rel_err(factored, ref) < tolerance(dtype)
    # The gradient w.r.t. the diagonal: -b_bar * x, b_bar = A^{-T} x_bar, by a dense-free
    # reference (the transposed system through verify).
    g = jax.grad(lambda d: jnp.sum(solve(l, d, u, b, axis=0) ** 2))(jnp.asarray(d))
    lt, ut = np.roll(u, 1, axis=0), np.roll(l, -1, axis=0)  # A^T's lower and upper bands
    b_bar = verify.reference_solve(lt, d, ut, 2 * ref, axis=0)
    assert rel_err(g, -b_bar * ref) < 10 * tolerance(dtype)
    a = RNG.uniform(0.5, 1.0, (n, q)).astype(dtype)
    h = tridiax.linear_recurrence(a, b, axis=0)
    assert _planner.recurrence_plan("native", "cpu", 1, n, q, dtype, linear=True).chunk > 0
    assert rel_err(h, numpy_loop(a, b, 0, False)) < tolerance(dtype)


# Every Q with each dtype, and every band layout with each dtype (8 cases, not all 24
# combinations: each recompiles every call, the plans being patched).
CQ_CASES = [(np.float32, 2, 3, "full"), (np.float32, 3, 2, "shared_along_q"),
            (np.float32, 4, 4, "constant_along_n"), (np.float32, 5, 1, "full"),
            (np.float64, 2, 3, "constant_along_n"), (np.float64, 3, 2, "full"),
            (np.float64, 4, 4, "shared_along_q"), (np.float64, 5, 1, "constant_along_n")]


@pytest.mark.parametrize("dtype,q,per_tile,bands", CQ_CASES,
                         ids=[f"{np.dtype(c[0]).name}-q{c[1]}-{c[3]}" for c in CQ_CASES])
def test_tiles_of_every_lane_of_a_few_chunks_match_reference(monkeypatch, bands, q, per_tile,
                                                             dtype):
    """CpuTiling("cq"): all Q lanes of `per_tile` chunks a tile, each chunk's row of Q values
    read and written as one run. The planner takes it for chunked solves whose rows are 8 or 16
    bytes; forced here on other Q and dtypes too (runs moved value by value), with a short last
    chunk and a last tile of fewer chunks (1003 rows in chunks of 16), P = 2 systems along axis
    1, bands broadcast along Q or along N, periodic and transposed (gradient) sweeps, the
    reduced systems, and recurrences forward and reverse, against references."""
    original = _planner.cpu_tiling

    def forced(P, C, Q, rows, dtype_, **kw):
        if Q > 1 and C > 1:
            return _planner.CpuTiling("cq", per_tile * Q)
        return original(P, C, Q, rows, dtype_, **kw)

    jax.clear_caches()  # plans are made when a call is compiled
    monkeypatch.setattr(_planner, "cpu_tiling", forced)
    P, N = 2, 1003
    l, d, u, b = dominant_bands((P, N, q), dtype)
    band_shape = {"full": (P, N, q), "shared_along_q": (P, N, 1),
                  "constant_along_n": (P, 1, q)}[bands]
    l, d, u = (v[tuple(slice(0, n) for n in band_shape)] for v in (l, d, u))
    full = [np.broadcast_to(v, (P, N, q)) for v in (l, d, u)]
    for periodic in (False, True):
        ref = verify.reference_solve(*full, b, axis=1, periodic=periodic)
        x = solve(l, d, u, b, axis=1, periodic=periodic, chunk=16)
        assert rel_err(x, ref) < tolerance(dtype), periodic
    # The gradient runs the transposed chunked solve: against the unchunked kernel's.
    def loss(d, b, chunk):
        return jnp.sum(solve(l, d, u, b, axis=1, chunk=chunk) ** 2)

    grads = jax.grad(loss, argnums=(0, 1))
    for got, want in zip(grads(d, b, 16), grads(d, b, 0), strict=True):
        assert rel_err(got, want) < 10 * tolerance(dtype)
    a = RNG.uniform(0.5, 1.0, band_shape).astype(dtype)
    for reverse in (False, True):
        h = bind_recurrence(jnp.asarray(a), jnp.asarray(b), jnp.zeros((P, q), dtype), 1,
                            reverse, 16)
        assert rel_err(h, numpy_loop(a, b, 1, reverse)) < tolerance(dtype), reverse
    jax.clear_caches()


def test_planner_chunks_few_long_systems_only(monkeypatch):
    # A 32 MiB last-level cache, whatever this machine's (a few rules below depend on it).
    monkeypatch.setattr(_planner, "cpu_last_cache_bytes", lambda: 32 << 20)
    plan = dict(kind="thomas", backend="native", platform="cpu")
    # One long system, a few long ones: chunked; many short ones: whole systems.
    assert _planner.solve_chunk(1, 1_000_000, 1, np.float32, **plan) > 0
    assert _planner.solve_chunk(1, 1_000_000, 64, np.float32, **plan) > 0
    assert _planner.solve_chunk(100, 100_000, 1, np.complex128, **plan) > 0
    assert _planner.solve_chunk(1, 100, 100_000, np.float32, **plan) == 0
    assert _planner.solve_chunk(100_000, 100, 1, np.float32, **plan) == 0
    # Batch-first systems are swept a tile of systems at a time, row by row (no solve is
    # scanned): whole while a tile's two work rows fit in a core's cache, chunked past it.
    assert _planner.solve_chunk(2000, 5000, 1, np.float32, **plan) > 0
    assert _planner.solve_chunk(100, 100_000, 1, np.float64, **plan) > 0
    assert _planner.solve_chunk(2000, 5000, 1, np.complex64, **plan) > 0
    # Rows of a few values: too few systems to fill the vectors, chunked once there is work.
    for Q in (3, 4):
        assert _planner.solve_chunk(1, 100_000, Q, np.float32, **plan) > 0
        assert _planner.solve_chunk(1, 100_000, Q, np.float32, **{**plan, "kind": "pivoted"}) > 0
    # Many systems of a few chunks each: tiles along the systems, not along 2-3 chunks.
    assert _planner.cpu_tiling(2000, 3, 1, 2000, np.complex64, columns=3).lanes == "p"
    assert _planner.cpu_tiling(64, 500, 1, 2000, np.float32, columns=3).lanes == "c"
    assert _planner.cpu_tiling(1, 500, 1, 2000, np.float32, columns=3).lanes == "c"
    # ... a cache line of chunks a tile for unpivoted solves (each lane's block of rows one
    # line), two vectors of them for pivoted float32 ones and for recurrences.
    for dtype in (np.float32, np.float64):
        assert _planner.cpu_tiling(1, 2450, 1, 4080, dtype, columns=3) == _planner.CpuTiling(
            "c", 64 // np.dtype(dtype).itemsize)
    two_vectors = max(8, 2 * _planner.vector_lanes(np.float32))
    assert _planner.cpu_tiling(1, 4900, 1, 2032, np.float32, columns=4, pivoted=True).width == (
        two_vectors)
    assert _planner.cpu_tiling(1, 4900, 1, 2032, np.float32, columns=0).width == two_vectors
    # Chunks of systems a few values apart: rows of 8 or 16 bytes of solves in tiles of all Q
    # lanes of a vector's worth of chunks, and rows of 32 bytes of unpivoted ones where Q
    # divides the scans' vector (their first sweep loads the runs straight into one); other
    # rows, pivoted 32-byte ones, and recurrences, one chunk's Q lanes.
    for dtype in (np.float32, np.float64):
        lanes = _planner.vector_lanes(dtype)
        itemsize = np.dtype(dtype).itemsize
        for Q in sorted({2, 3, 4, 8, lanes - 1} & set(range(2, lanes))):
            runs_of_32 = Q * itemsize == 32 and _planner.scanned_lanes(Q, dtype)
            for columns, rows, pivoted in ((3, 4080, False), (4, 4080, True), (0, 7812, False)):
                tiling = _planner.cpu_tiling(1, 245, Q, rows, dtype, columns=columns,
                                             pivoted=pivoted)
                if columns and (Q * itemsize in (8, 16) or (runs_of_32 and not pivoted)):
                    assert tiling == _planner.CpuTiling("cq", -(-lanes // Q) * Q), (Q, dtype)
                else:
                    assert tiling == _planner.CpuTiling("q", Q), (Q, dtype)
            # ... and whole ones, too few to give every core Q of them (pivoted, factored).
            tiling = _planner.cpu_tiling(1, 1, Q, 10**6, dtype, columns=4)
            assert tiling == _planner.CpuTiling("q", Q)
    # Strided tiles no wider than each core's share of the systems (the work rows of a tile
    # are as wide as it is, whatever number of its lanes hold a system), in groups of 8 lanes
    # where there are 8 (fewer run scalar).
    cores = _planner.cpu_cores()
    for P in (1, 2, 3, 5, 8, 12, 20, 33, 64, 1000):
        for kind_columns in (0, 4):
            width = _planner.cpu_tiling(P, 1, 1, 10**6, np.float32, columns=kind_columns).width
            share = -(-P // cores)
            if P < 8:
                assert 1 <= width <= share, (P, width)
            else:
                assert width % 8 == 0 and width < share + 8, (P, width)
    # Chunks of systems along Q: tiles of whole rows up to CHUNK_ROW_BYTES, else equal parts.
    for Q, dtype in ((1000, np.float32), (1001, np.float64), (4100, np.float32),
                     (100_000, np.complex128)):
        width = _planner.cpu_tiling(1, 90, Q, 112, dtype, columns=3).width
        parts = -(-Q // width)
        assert width % 8 == 0 and width * np.dtype(dtype).itemsize <= _planner.CHUNK_ROW_BYTES
        assert parts == -(-Q * np.dtype(dtype).itemsize // _planner.CHUNK_ROW_BYTES), Q
    # Too little work to share out, a kind that stays sequential, the user's 0.
    assert _planner.solve_chunk(1, 1000, 1, np.float32, **plan) == 0
    # Pivoted: chunked while the systems leave vector lanes idle, whole once they fill them.
    pivoted = {**plan, "kind": "pivoted"}
    lanes = _planner.cpu_cores() * 2 * _planner.vector_lanes(np.float32)
    assert _planner.solve_chunk(1, 10**6, 1, np.float32, **pivoted) > 0
    assert _planner.solve_chunk(lanes, 10**6, 1, np.float32, **pivoted) == 0
    assert _planner.solve_chunk(1, 10**6, lanes, np.float32, **pivoted) == 0
    assert _planner.solve_chunk(1, 10**6, 1, np.float32, **plan, chunk=0) == 0
    assert _planner.solve_chunk(1, 10**6, 1, np.float32, **plan, chunk=1000) == 1000
    # Recurrences: only a lack of parallelism chunks them.
    rec = dict(linear=True, backend="native", platform="cpu")
    assert _planner.recurrence_chunk(1, 10**7, 1, np.float32, **rec) > 0
    assert _planner.recurrence_chunk(1, 1000, 100_000, np.float32, **rec) == 0
    assert _planner.recurrence_chunk(1, 10**7, 1, np.float32, **{**rec, "linear": False}) == 0
    # One sequence (group of rows of a few lanes) scanned in registers: whole while its three
    # arrays fit in the last-level cache, chunked past it; lanes the scan does not group
    # (Q = 3) are chunked however little they are.
    fits = _planner.cpu_last_cache_bytes() // (3 * 4 * 4)
    assert _planner.recurrence_chunk(1, fits, 4, np.float32, **rec) == 0
    assert _planner.recurrence_chunk(1, 2 * fits, 4, np.float32, **rec) > 0
    assert _planner.recurrence_chunk(1, 4 * fits, 1, np.float32, **rec) == 0
    assert _planner.recurrence_chunk(1, fits, 3, np.float32, **rec) > 0
    assert _planner.recurrence_chunk(2, fits, 4, np.float32, **rec) > 0
    # A gate's states are a fourth array.
    assert _planner.recurrence_chunk(1, fits * 3 // 4, 4, np.float32, **rec, gated=True) == 0
    assert _planner.recurrence_chunk(1, fits, 4, np.float32, **rec, gated=True) > 0


def test_planner_batch_first_tiles():
    # Many short batch-first real systems go by tiles of ROWS_TILE_VECTORS vectors of systems,
    # whole, with 8-lane vectors and 16-lane ones alike; complex ones by strided tiles.
    plan = dict(kind="thomas", backend="native", platform="cpu")
    for dtype in (np.float32, np.float64):
        tiles = _planner.CpuTiling(
            "p", _planner.ROWS_TILE_VECTORS * _planner.vector_lanes(dtype))
        assert _planner.solve_plan("native", "cpu", 100_000, 100, 1, dtype,
                                   kind="thomas").tiling == tiles
        assert _planner.solve_chunk(100_000, 100, 1, dtype, **plan) == 0
        # Too few systems for a tile on every core: strided tiles, each core's share of the
        # systems rounded up to whole groups of 8 lanes.
        width = _planner.solve_plan("native", "cpu", 40, 100, 1, dtype, kind="thomas").tiling.width
        assert width % 8 == 0 and width < -(-40 // _planner.cpu_cores()) + 8
    complex_tiling = _planner.solve_plan("native", "cpu", 100_000, 100, 1, np.complex64,
                                         kind="thomas").tiling
    assert complex_tiling.width == max(8, 2 * _planner.vector_lanes(np.complex64))


def test_planner_says_which_classes_of_tiles_hold_rows_in_vector_registers(monkeypatch):
    # The kernels hold a lane's rows in vector registers where the plan says so
    # (`CpuTiling.scan`, a bit per class of tile), decided here as for a kernel whose vectors
    # hold 16 rows. One sequence of 1000 steps in chunks of 64: 15 full chunks in one tile of
    # lanes along the chunks (narrower than 16: class 1), the short last chunk of 40 steps
    # apart (class 3); both scanned, being at least a vector long.
    monkeypatch.setattr(_planner, "_scan_rows", lambda dtype: 16)
    tiling = _planner.CpuTiling("c", 16)
    assert _planner.tile_classes(1, 1000, 1, 64, tiling) == {1: ("c", 15, 64), 3: ("p", 1, 40)}
    scans = dict(chunk=64, tiling=tiling)
    assert _planner.recurrence_scans(1, 1000, 1, np.float32, **scans) == 0b1010
    assert _planner.recurrence_scans(1, 1000, 1, np.float32, **scans, linear=False) == 0
    # Chunks of 66: the last one, 10 steps, is swept.
    assert _planner.recurrence_scans(1, 1000, 1, np.float32, chunk=66, tiling=tiling) == 0b10
    # (1000, 4) along axis 0 in chunks of 64, tiles of all 4 lanes of 4 chunks: three whole
    # tiles of one vector read their rows as runs (class 0); the last, of 3 chunks, and the
    # short last chunk (lanes along Q) do not; nor does any pivoted tile.
    tiling = _planner.CpuTiling("cq", 16)
    assert _planner.tile_classes(1, 1000, 4, 64, tiling) == {
        0: ("cq", 16, 64), 1: ("cq", 12, 64), 3: ("q", 4, 40)}
    runs = dict(chunk=64, tiling=tiling)
    assert _planner.chunk_runs(1, 1000, 4, np.float32, **runs, pivoted=False) == 0b1
    assert _planner.chunk_runs(1, 1000, 4, np.float32, **runs, pivoted=True) == 0
    # The plans carry the decision to the kernels.
    plan = _planner.solve_plan("native", "cpu", 1, 1000, 4, np.float32, kind="thomas", chunk=64)
    assert plan.tiling.scan == _planner.chunk_runs(1, 1000, 4, np.float32, chunk=plan.chunk,
                                                   tiling=plan.tiling, pivoted=False)


@pytest.mark.skipif(not _native_build.available(), reason="the native CPU kernel is unavailable")
def test_native_kernels_refuse_rows_in_registers_they_cannot_hold():
    # A decision the kernel cannot carry out fails the call rather than being swept otherwise:
    # rows of 3 lanes do not divide a vector, and pivoted chunks and activations never scan.
    x = jnp.ones((1, 100, 3))
    scan = _planner.CpuTiling("q", 3, scan=1)
    with pytest.raises(jax.errors.JaxRuntimeError, match="scan"):
        _native.recurrence_pnq(0.5 * x, x, x[:, :1], reverse=False, shifted=False,
                               activation=None, final_only=False, out_dtype=x.dtype,
                               tiling=scan).block_until_ready()
    with pytest.raises(jax.errors.JaxRuntimeError, match="scan"):
        _native.chunk_ends_pnq(x, x + 3, x, x, transposed=False, periodic=False, chunk=10,
                               tiling=scan, pivoting=True)[0].block_until_ready()
    one = x[..., :1]
    with pytest.raises(jax.errors.JaxRuntimeError, match="scan"):
        _native.recurrence_pnq(0.5 * one, one, one[:, :1], reverse=False, shifted=False,
                               activation=jnp.tanh, final_only=False, out_dtype=x.dtype,
                               tiling=_planner.CpuTiling("p", 8, scan=1)).block_until_ready()


def test_gpu_plan_fills_the_sms_with_chunks_that_divide_n():
    plan = dict(kind="thomas", backend="pallas_triton", platform="cuda")
    m = _planner.solve_chunk(64, 10**6, 1, np.float32, **plan)
    assert m and 10**6 % m == 0  # no padded last chunk for the composed sweeps
    assert 64 * (10**6 // m) >= _planner.GPU_LANES
    assert _planner.solve_chunk(1, 1000, _planner.GPU_WIDE, np.float32, **plan) == 0
    # Pivoted too (each chunk pivoted, the answer checked); factored solves stay whole.
    assert _planner.solve_chunk(64, 10**6, 1, np.float32, **{**plan, "kind": "pivoted"}) > 0
    assert _planner.solve_chunk(64, 10**6, 1, np.float32, **{**plan, "kind": "factored"}) == 0
    r = _planner.recurrence_chunk(1, 10**6, 64, np.float32, linear=True,
                                  backend="pallas_triton", platform="cuda")
    assert r and 64 * (10**6 // r) >= _planner.GPU_LANES // 2
    # The same decisions never chunk on the XLA fallback unless asked.
    assert _planner.solve_chunk(64, 10**6, 1, np.float32, kind="thomas", backend="xla",
                                platform="cuda") == 0
    assert _planner.solve_chunk(64, 10**6, 1, np.float32, kind="thomas", backend="xla",
                                platform="cuda", chunk=500) == 500


@pytest.mark.parametrize("n", [32, 33, 34, 35, 100, 101, 1000])
@pytest.mark.parametrize("periodic", [False, True])
def test_valid_chunk_leaves_every_chunk_an_interior(n, periodic):
    for wanted in (2, 3, 4, 7, 16, 64):
        m = _planner.valid_chunk(n, wanted, periodic=periodic)
        count = -(-n // m) if m else 0
        if m:
            assert 2 <= m <= wanted and n % m != 1
            assert count >= (3 if periodic else 2)
        else:  # nothing fits: only when n is too short for the separators
            assert all(n % k == 1 or -(-n // k) < (3 if periodic else 2)
                       for k in range(2, min(wanted, n) + 1))


def test_tdma_chunk_override_and_its_errors():
    shape = (4001, 3)
    l, d, u, b = dominant_bands(shape, np.float64)
    op = tridiax.Tridiagonal(l, d, u, axis=0)
    ref = verify.reference_solve(l, d, u, b, axis=0)
    for chunk in (None, 0, 2, 500):
        assert rel_err(tridiax.TDMA(chunk=chunk)(op, b), ref) < 1e-12
    with pytest.raises(ValueError, match="chunk"):
        tridiax.TDMA(chunk=1)
    with pytest.raises(ValueError, match="chunk"):
        tridiax.TDMA(chunk=-3)
    with pytest.raises(ValueError, match="chunk"):
        tridiax.TDMA(chunk=2.5)
    assert rel_err(tridiax.TDMA(chunk=64, pivoting=True)(op, b), ref) < 1e-12
    with pytest.raises(ValueError, match="chunk"):
        tridiax.TDMA(chunk=64)(op.factor(), b)
    # A static field: jit sees it as part of the treedef, not a traced leaf.
    assert jax.tree.leaves(tridiax.TDMA(chunk=8)) == []
    assert rel_err(eqx.filter_jit(lambda s, o, r: s(o, r))(tridiax.TDMA(chunk=8), op, b),
                   ref) < 1e-12


def test_check_chunk_accepts_numpy_ints_and_names_the_kind():
    assert _backend.check_chunk(np.int64(12), "thomas") == 12
    assert _backend.check_chunk(None, "pivoted") is None
    assert _backend.check_chunk(0, "factored") == 0
    with pytest.raises(ValueError, match="factored"):
        _backend.check_chunk(8, "factored")
    with pytest.raises(ValueError, match="int"):
        _backend.check_chunk(True)


# ---------------------------------------------------------------------------------------------
# Recurrences.


def bind_recurrence(a, x, h0, axis, reverse, chunk, final_only=False):
    return recurrence_p.bind(a, x, jnp.expand_dims(h0, axis), axis=axis, reverse=reverse,
                             shifted=False, activation=None, final_only=final_only,
                             backend=None, chunk=chunk)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("shape,axis", [((203, 9), 0), ((9, 203), 1), ((3, 301, 5), 1),
                                        ((5000,), 0)])
def test_chunked_recurrence_matches_loop_and_unchunked(shape, axis, reverse, dtype):
    a = RNG.uniform(0.5, 1.0, shape)
    x = RNG.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        a, x = a * np.exp(0.1j), x + 1j
    h0 = RNG.standard_normal(shape[:axis] + shape[axis + 1:])
    ref = numpy_loop(a, x, axis, reverse, initial=h0)
    args = [jnp.asarray(v, dtype) for v in (a, x, h0)]
    cotangent = jnp.asarray(RNG.standard_normal(shape), dtype)
    whole, vjp_whole = jax.vjp(lambda *v: bind_recurrence(*v, axis, reverse, 0), *args)
    bars_whole = vjp_whole(cotangent)
    last = [slice(None)] * len(shape)
    last[axis] = slice(0, 1) if reverse else slice(-1, None)
    for chunk in (2, 7, 64):
        h, vjp = jax.vjp(lambda *v, c=chunk: bind_recurrence(*v, axis, reverse, c), *args)
        assert rel_err(h, ref) < tolerance(dtype)
        assert rel_err(h, whole) < tolerance(dtype)
        final = bind_recurrence(*args, axis, reverse, chunk, final_only=True)
        assert rel_err(final, ref[tuple(last)]) < tolerance(dtype)
        for got, want in zip(vjp(cotangent), bars_whole, strict=True):
            assert rel_err(got, want) < tolerance(dtype)


# ---------------------------------------------------------------------------------------------
# Packed ragged batches: one long system (sequence) through the chunked path.

LENGTHS = [1, 2, 3, 17, 64, 1000, 4999, 30000, 3, 2, 40000, 1, 50000]


def test_packed_ragged_systems_solve_as_one_long_system():
    """Systems of different lengths concatenated along the axis, with lower = 0 at each start
    and upper = 0 at each end, are one block-diagonal system: the planner chunks it."""
    n = sum(LENGTHS)
    starts = np.cumsum([0] + LENGTHS[:-1])
    ends = starts + np.array(LENGTHS) - 1
    l, d, u, b = dominant_bands((n,), np.float64)
    l[starts] = 0.0
    u[ends] = 0.0
    assert _planner.solve_chunk(1, n, 1, np.float64, kind="thomas", backend="native",
                                platform="cpu") > 0
    x = np.asarray(tridiax.solve_tridiagonal(l, d, u, b))
    for s, m in zip(starts, LENGTHS, strict=True):
        piece = slice(s, s + m)
        ref = verify.reference_solve(l[piece], d[piece], u[piece], b[piece])
        assert rel_err(x[piece], ref) < 1e-12
    # Chunk boundaries falling on and beside the system boundaries change nothing.
    for chunk in (2, 3, 1000, 4999):
        assert rel_err(solve(l, d, u, b, chunk=chunk), x) < 1e-12


def test_packed_sequences_run_as_one_long_recurrence(monkeypatch):
    """Sequences concatenated along time with a = 0 at each start restart from zero there.
    (These 6 MB would run whole, in one pass, from the last-level cache: the planner is told of
    a small one, so that they take the chunked path.)"""
    monkeypatch.setattr(_planner, "cpu_last_cache_bytes", lambda: 1 << 16)
    n = sum(LENGTHS)
    starts = np.cumsum([0] + LENGTHS[:-1])
    a = RNG.uniform(0.9, 1.0, (n, 2))
    x = RNG.standard_normal((n, 2))
    a[starts] = 0.0
    assert _planner.recurrence_chunk(1, n, 2, np.float64, linear=True, backend="native",
                                     platform="cpu") > 0
    h = np.asarray(tridiax.linear_recurrence(a, x))
    for s, m in zip(starts, LENGTHS, strict=True):
        piece = slice(s, s + m)
        ref = numpy_loop(a[piece], x[piece])
        assert rel_err(h[piece], ref) < 1e-12


def test_lineax_tdma_takes_the_chunk_override():
    lx = pytest.importorskip("lineax")
    from tridiax.lineax import TDMA

    l, d, u, b = dominant_bands((5001,), np.float64)
    op = lx.TridiagonalLinearOperator(jnp.asarray(d), jnp.asarray(l[1:]), jnp.asarray(u[:-1]))
    ref = verify.reference_solve(l, d, u, b)
    for solver in (TDMA(chunk=40), tridiax.TDMA(chunk=40), TDMA(chunk=0)):
        assert rel_err(lx.linear_solve(op, jnp.asarray(b), solver=solver).value, ref) < 1e-12
    assert rel_err(lx.linear_solve(op, jnp.asarray(b), solver=TDMA(chunk=40, pivoting=True)).value,
                   ref) < 1e-12
