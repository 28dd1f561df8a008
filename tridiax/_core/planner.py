"""The planner: how each solve, factorization and recurrence runs on its device, in one place.

Kernels receive decisions, they do not make them. The decisions, one small function each (the
side-by-side measurements behind their thresholds are data, benchmarks/data/planner.json; a
comment names its entry in quotes):

- **Chunking** (`solve_chunk`, `recurrence_chunk`): whether the rows (steps) of each system
  are split into chunks solved as one batch by the partition method (`_long_systems/chunked.py`), and how
  long a chunk is. A solve is chunked when its systems cannot keep the device busy (CPU: fewer
  systems than the cores times the vector lanes; GPU: fewer than its SMs can hold; TPU: fewer
  than one (8, 128) row tile) or when one tile's work rows would not fit in
  the core's cache (CPU) or its VMEM (TPU). A linear recurrence is chunked only for
  parallelism (its sweep keeps no work rows), and never on a TPU, whose kernel runs a chunk as
  eight runs side by side where the batch leaves sublanes idle. The reduced system of a
  chunked solve (one row per chunk) is planned again the same way: chunking recurses while it
  pays.
- **Layout and library** (`gpu_columns`, `gpu_library`): on GPU, whether batch-first systems
  are moved to columns for the Pallas kernels, and whether few long plain systems go to
  cuSPARSE instead.
- **Tiles** (`cpu_tiling`, `gpu_tiles`): how many systems (lanes) one program or one C++ tile
  sweeps together, and along which dimension of the (P, C, Q) lanes.
- **Rows in vector registers** (`recurrence_scans`, `chunk_runs`): which of the C++ tiles hold
  consecutive rows of a lane in one vector (recurrences scanned, the Thomas chunks' rows read
  as runs) rather than sweeping a row of lanes at a time; the kernels do as `CpuTiling.scan`
  says, or fail the call.

What stays sequential: factored solves and nonlinear (IndRNN) recurrences are never chunked,
pivoted solves only while their systems leave vector lanes idle (docs/guides/long-systems.md);
the planner says so with `chunkable` and `solve_chunk`. A user overrides the chunk length with
`chunk=` (`tridiax.TDMA(chunk=...)`): 0 never chunks, an integer asks for chunks of about that
many rows.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib

import jax.numpy as jnp
import numpy as np

from .._native import build as _native_build
from .dtypes import compute_dtype

# Kernel kinds whose chunked form exists: the partition method without pivoting, and with
# partial pivoting inside each chunk and in the reduced system, its answer checked
# (`_chunked.solve_any`).
CHUNKED_KINDS = ("thomas", "periodic", "pivoted")
# Backends whose long systems the planner splits on its own: the native kernel's fused chunk
# sweeps, on GPUs the sweeps composed around the plain Pallas kernels
# (`_long_systems/composed_chunks.py`), on TPUs kernels of their own where they apply
# (`_tridiagonal/pallas_tpu_chunks.py`), the composed sweeps elsewhere (compiled for sm_90a
# and a TPU v5e by tests/gpu/ and tests/tpu/). Every backend runs a chunk the user asks for.
TPU_BACKENDS = ("pallas_tpu", "pallas_tpu_interpret")
CHUNKED_BACKENDS = ("native", "pallas_triton", *TPU_BACKENDS)
# Streaming multiprocessors of the GPU the Pallas plan fills (an H100 SXM). Fewer systems
# than GPU_WIDE (two 64-system programs per SM) of at least GPU_MIN_ROWS rows are chunked,
# into GPU_LANES lanes (systems times chunks: four programs per SM); shorter systems run
# whole, one launch (a call of a few thousand rows costs about its launch anyway).
GPU_SMS = 132
GPU_WIDE = GPU_SMS * 128
GPU_LANES = GPU_SMS * 64 * 4
GPU_MIN_ROWS = 4096
# A GPU reads global memory in sectors of this many bytes: a row of a Pallas tile narrower than
# a sector along Q (batch-first data: Q = 1) fetches a sector per system for a few bytes of it.
GPU_SECTOR_BYTES = 32
# TPU: systems too few to fill one (8, 128) row tile (TPU_TILE_SYSTEMS) are chunked, unless
# short, into chunks of at most TPU_MAX_CHUNK rows and enough lanes (systems times chunks) for
# eight grid steps of full row tiles (TPU_LANES), so that Pallas's pipeline overlaps each step's
# copies with the previous one's sweep.
TPU_TILE_SYSTEMS = 8 * 128
TPU_LANES = 8 * TPU_TILE_SYSTEMS
TPU_MAX_CHUNK = 4096
TPU_MIN_CHUNKED_LANES = 128
# A TPU stores an array's last two dimensions in tiles of 8 rows (16 for 16-bit types): chunks
# of a multiple of this many rows make the chunk view (N, Q) -> (C, m, Q) a bitcast, where other
# lengths make XLA copy every operand into a padded layout.
TPU_CHUNK_ROWS = 16
# One system's chunks on a TPU: its 1-D arrays lie in tiles of 1024 values, so their (C, 128)
# view moves nothing, and the kernels read it as C batch-first systems, one a lane.
TPU_SYSTEM_CHUNK = 128
# Shortest chunk worth its boundary work; a system shorter than two of them is never split.
MIN_CHUNK = 16
# The widest part of a row one chunk tile reads (bytes): rows up to this long are read whole.
CHUNK_ROW_BYTES = 16384
# Fewer values than this run on one core anyway (threads.h, RunTiles): never chunked.
MIN_CHUNKED_WORK = 1 << 16
# Vectors of systems per tile where batch-first float32 systems go by tiles of rows
# (`_rows_by_tiles`): four chains of divisions in flight, the fastest on AVX2 and AVX-512
# (measurements: benchmarks/data/planner.json, "rows_tile_vectors").
ROWS_TILE_VECTORS = 4


@dataclasses.dataclass(frozen=True)
class CpuTiling:
    """A C++ tile: `width` lanes along `lanes` ("q": contiguous systems; "p": systems N*Q
    values apart; "c": chunks of one system; "cq": all Q systems of width / Q chunks, whose
    rows of Q values are read as one run each). Every lane of a solve is swept row after row,
    whatever the tile: the tile decides only how rows are moved, never the order of operations.
    `scan`: a bit per class of tile (`tile_classes`) whose rows are held in vector registers
    (`recurrence_scans`, `chunk_runs`); 0 for kernels that have no such choice."""

    lanes: str
    width: int
    scan: int = 0


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one kernel launch runs: `chunk` rows per chunk (0: whole systems) and the backend's
    tile choice (`CpuTiling` for "native", a Pallas (bp, bq) block or None otherwise)."""

    chunk: int = 0
    tiling: object = None


# ---------------------------------------------------------------------------------------------
# What this machine has.


@functools.cache
def cpu_cores() -> int:
    """Cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


@functools.cache
def cpu_vector_bytes() -> int:
    """Width of the vectors the native kernel is built for (-march=native): 64 with AVX-512,
    32 with AVX2, 16 otherwise."""
    try:
        flags = next((line for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), "").split()
    except OSError:  # pragma: no cover - not Linux
        return 16
    return 64 if "avx512f" in flags else 32 if "avx2" in flags else 16


def _cache_size(index: str) -> int | None:
    """Bytes of cpu0's cache `index` ("index2": L2, "index3": L3) per sysfs; None if unknown."""
    try:
        text = pathlib.Path(f"/sys/devices/system/cpu/cpu0/cache/{index}/size").read_text()
    except OSError:
        return None
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(text.rstrip("KM")) * scale


@functools.cache
def cpu_cache_bytes() -> int:
    """The cache one core's tile should fit in: half its L2 (the rest streams operands)."""
    for index in ("index2", "index3"):
        value = _cache_size(index)
        if value is not None:
            return max(1 << 18, value // 2)
    return 1 << 19


@functools.cache
def cpu_last_cache_bytes() -> int:
    """The last-level cache (L3, shared by the cores; L2 where there is no L3)."""
    for index in ("index3", "index2"):
        value = _cache_size(index)
        if value is not None:
            return value
    return 1 << 20


def vector_lanes(dtype) -> int:
    """Values of the compute dtype per vector register (at least 1)."""
    return max(1, cpu_vector_bytes() // jnp.dtype(compute_dtype(dtype)).itemsize)


# ---------------------------------------------------------------------------------------------
# Chunking.


def chunkable(kind: str, backend: str) -> bool:
    """Whether the planner splits solves of this kernel kind on this backend on its own."""
    return kind in CHUNKED_KINDS and backend in CHUNKED_BACKENDS


def _dividing(n: int, target: int, *, periodic: bool, align: int = 1) -> int:
    """A valid chunk length dividing n in [target/2, target], a multiple of `align` (no padded
    last chunk for the composed sweeps, and on a TPU no relayout), else the valid one nearest
    below target (a multiple of `align` if that one is valid)."""
    for m in range(min(target, n), max(1, target // 2), -1):
        if m % align == 0 and n % m == 0 and valid_chunk(n, m, periodic=periodic) == m:
            return m
    if align > 1 and target >= 2 * align:
        aligned = target - target % align
        if valid_chunk(n, aligned, periodic=periodic) == aligned:
            return aligned
    return valid_chunk(n, target, periodic=periodic)


def valid_chunk(n: int, chunk: int, *, periodic: bool = False) -> int:
    """The chunk length nearest below `chunk` (at least 2) that the partition method can use
    for n rows: every chunk then has an interior row before its separator (n % chunk != 1)
    and a periodic system has at least 3 separators. 0 when none fits."""
    for m in range(min(chunk, n), 1, -1):
        count = -(-n // m)
        if n % m != 1 and count >= (3 if periodic else 2):
            return m
    return 0


def _scan_rows(dtype) -> int:
    """Values of the compute dtype the native kernel scans per vector register (16 float32
    with AVX-512); 0 for complex dtypes, or where the built kernel has no scans."""
    cdt = jnp.dtype(compute_dtype(dtype))
    if jnp.issubdtype(cdt, jnp.complexfloating):
        return 0
    return _native_build.scan_rows(cdt.itemsize)  # what it was built with (AVX2, compiler)


def _rows_by_tiles(P: int, N: int, dtype) -> bool:
    """Whether P batch-first real systems of N rows go by tiles of ROWS_TILE_VECTORS vectors of
    systems (rows moved by 8x8 transposes) rather than the strided tiles of two vectors: more
    chains of divisions in flight, while every core still gets a whole tile and a tile's two
    work rows stay in its cache."""
    cdt = jnp.dtype(compute_dtype(dtype))
    if jnp.issubdtype(cdt, jnp.complexfloating):
        return False
    width = ROWS_TILE_VECTORS * vector_lanes(dtype)
    return P >= cpu_cores() * width and 2 * N * width * cdt.itemsize <= cpu_cache_bytes()


def scanned_lanes(Q: int, dtype) -> bool:
    """Whether the native kernel can scan lanes Q values apart inside vector registers (linear
    recurrences: recurrence.cc, ScanLanes), or move a chunk's rows of Q values as runs of one
    vector (Thomas chunks: EndsOfRuns, SolveOfRuns): real lanes whose rows are contiguous
    (Q == 1), or rows of Q values, Q dividing a vector, all Q lanes of a tile together
    (`cpu_tiling` gives such tiles where there are few systems)."""
    rows = _scan_rows(dtype)
    return rows > 0 and (Q == 1 or (Q < rows and rows % Q == 0))


def solve_chunk(P: int, N: int, Q: int, dtype, *, kind: str, backend: str,
                platform: str, chunk: int | None = None) -> int:
    """Rows per chunk for a solve of (P, N, Q) (0: whole systems). `chunk`: the user's
    override (None: decide; 0: never; m: about m rows)."""
    periodic = kind == "periodic"
    if chunk is not None and chunk > 0 and kind in CHUNKED_KINDS:
        return valid_chunk(N, max(int(chunk), 2), periodic=periodic)
    if not chunkable(kind, backend) or N < 2 * MIN_CHUNK or chunk == 0:
        return 0
    systems = P * Q
    itemsize = jnp.dtype(compute_dtype(dtype)).itemsize
    if backend in TPU_BACKENDS:  # on a TPU, or interpreted anywhere (tests)
        from .._tridiagonal import pallas_tpu as _tpu_thomas

        fits = _tpu_thomas.fits(P, N, Q, dtype, kind=kind, budget=_tpu_budget())
        # A row tile of systems or more runs whole: in one kernel where it fits VMEM, else in
        # the two streamed sweeps (their work rows through HBM: 9 array passes, 13 pivoted),
        # every lane of the tile busy as in chunks, at the bytes of the partition method's own
        # kernels (9 passes, `_tridiagonal/pallas_tpu_chunks.py`), with one sweep fewer and no
        # check of pivoted chunks' answer.
        if systems >= TPU_TILE_SYSTEMS or (fits and N < 2 * TPU_MAX_CHUNK // 8):
            return 0
        # One system goes in chunks of TPU_SYSTEM_CHUNK rows, one chunk a lane: the (C, 128)
        # view of its 1-D arrays is how a TPU stores them, and the partition method's own
        # kernels take it (`_tridiagonal/pallas_tpu_chunks.py`: unpivoted, m dividing N).
        # Not periodic systems: XLA lays the (1, C, 1) arrays of their periodic reduced system
        # out row-major, each padded to 128 lanes ("tpu_one_periodic_system_whole").
        if (P == Q == 1 and kind == "thomas" and N % TPU_SYSTEM_CHUNK == 0
                and valid_chunk(N, TPU_SYSTEM_CHUNK) == TPU_SYSTEM_CHUNK):
            return TPU_SYSTEM_CHUNK
        # The composed sweeps' XLA work on (P, C, m, Q) arrays pads a Q narrower than a tile's
        # 128 lanes to 128 ("tpu_chunks_need_lanes"): such systems run whole (streamed when
        # too long for VMEM); batch-first ones' chunk view would be a copy of every operand.
        if Q < TPU_MIN_CHUNKED_LANES:
            return 0
        target = int(np.clip(N * systems // TPU_LANES, 2 * MIN_CHUNK, TPU_MAX_CHUNK))
    elif platform == "cpu":
        if systems * N < MIN_CHUNKED_WORK:
            return 0
        # Pivoted sweeps are a chain of compares, selects and a division per row: whole systems
        # once they fill two vectors of lanes per core, even where their work rows spill
        # ("pivoted_whole_when_wide").
        if kind == "pivoted" and systems >= cpu_cores() * 2 * vector_lanes(dtype):
            return 0
        tiling = cpu_tiling(P, 1, Q, N, dtype, columns=2)
        wide = systems >= cpu_cores() * 2 * vector_lanes(dtype)
        fits = 2 * N * tiling.width * itemsize <= cpu_cache_bytes()
        if wide and fits:
            return 0
        # Chunk tiles take whole rows (cpu_tiling), and chunks are as long as the cache holds
        # their work rows (3 columns) at that width, but at least 112 rows: shorter ones cost
        # more in boundary work than their cache misses do ("min_chunk_rows").
        work = _chunk_work_rows(kind)
        width = cpu_tiling(P, N // MIN_CHUNK, Q, 1, dtype, columns=work,  # the most chunks
                           pivoted=kind == "pivoted").width
        target = 2 * cpu_cache_bytes() // (work * width * itemsize)
        target = int(np.clip(1 << int(np.log2(max(target, 1))), 128, 4096))
        # Off a power of two: chunks 2^k values apart would map to one set of the L1 cache.
        target -= 16
    else:
        # GPU: enough lanes (systems times chunks) to fill every SM several times over.
        if systems >= GPU_WIDE or N < GPU_MIN_ROWS:
            return 0
        target = int(np.clip(N * systems // GPU_LANES, MIN_CHUNK, 1024))
    if N < 2 * target:
        target = max(MIN_CHUNK, N // 2)
    # The composed GPU sweeps pad a short last chunk: there, a length dividing N if one is near.
    if backend in TPU_BACKENDS:
        return _dividing(N, target, periodic=periodic, align=TPU_CHUNK_ROWS)
    pick = valid_chunk if platform == "cpu" else _dividing
    return pick(N, target, periodic=periodic)


def recurrence_chunk(P: int, T: int, Q: int, dtype, *, linear: bool, backend: str,
                     platform: str, chunk: int | None = None, gated: bool = False) -> int:
    """Steps per chunk for a recurrence over (P, T, Q) (0: whole sequences). Chunking re-reads
    the inputs once (5 array passes instead of 3), so only a lack of parallelism pays for it.
    `gated`: the kernel also reads a gate's states (a fourth array)."""
    if linear and chunk is not None and chunk > 0:
        return max(2, min(int(chunk), T))
    if not linear or backend not in CHUNKED_BACKENDS or T < 2 * MIN_CHUNK or chunk == 0:
        return 0
    lanes = P * Q
    if platform == "cpu" and backend not in TPU_BACKENDS:
        if lanes * T < MIN_CHUNKED_WORK:
            return 0
        # One sequence of contiguous steps, or one group of rows of a few lanes, is scanned
        # inside vector registers (`scanned_lanes`): one pass on one core beats the
        # chunks' two passes on every core while its arrays (three, four with a gate) fit in
        # the last-level cache ("recurrence_scanned_whole").
        itemsize = jnp.dtype(compute_dtype(dtype)).itemsize
        if (P == 1 and backend == "native" and scanned_lanes(Q, dtype)
                and (4 if gated else 3) * T * Q * itemsize <= cpu_last_cache_bytes()):
            return 0
        needed = cpu_cores() * 2 * vector_lanes(dtype)
        if lanes >= needed:
            return 0
        # Enough chunks for every core's tiles, several times over; long enough that a
        # chunk's boundary work is negligible.
        count = -(-needed * 8 // lanes)
        return max(min(T, 256), T // count)
    if backend in TPU_BACKENDS:
        # Never chunked: the recurrence keeps no rows in VMEM, and a batch that does not fill
        # a row tile runs each chunk as eight runs side by side inside the kernel (one sublane
        # each, `_recurrence/pallas_tpu.py`, `segmented`): one read of each array, where chunks
        # composed around the kernel read them twice.
        return 0
    if lanes >= GPU_WIDE or T < GPU_MIN_ROWS:
        return 0
    # GPU: the lanes of every SM, from chunks of at least 64 steps (m dividing T if it can).
    target = max(64, T * lanes // GPU_LANES)
    if T < 2 * target:
        return 0
    for m in range(target, target // 2, -1):
        if T % m == 0:
            return m
    return target


def _tpu_budget() -> int:
    """The VMEM bytes the TPU kernels plan for on the chip being compiled for."""
    from .._pallas import tpu as _tpu

    return _tpu.vmem().budget


# ---------------------------------------------------------------------------------------------
# Layout.


# Plain solves of at most this many systems, of at least GPU_MIN_ROWS rows each, go to
# cuSPARSE on NVIDIA GPUs (`_tridiagonal/cusparse.py`, which has the measurements).
GPU_LIBRARY_SYSTEMS = 1024


def gpu_library(P: int, N: int, Q: int, *, kind: str, platform: str, backend, chunk=None,
                block=None) -> bool:
    """Whether a solve of (P, N, Q) systems runs cuSPARSE's gtsv2 instead of the Pallas
    kernels: plain solves of few long systems on CUDA, where the backend, the chunking and the
    tiles are left to tridiax (`backend`: the user's, None for the default)."""
    return (platform == "cuda" and backend is None and kind == "thomas" and chunk is None
            and block is None and P * Q <= GPU_LIBRARY_SYSTEMS and N >= GPU_MIN_ROWS)


def gpu_columns(P: int, Q: int, dtype, *, backend: str, block=None, kind: str | None = None,
                N: int = 2) -> bool:
    """Whether the Pallas GPU kernels solve (P, N, Q) systems moved to columns, (1, N, P*Q),
    by XLA transposes (`_layout.to_columns`): where a row of Q values is narrower than a memory
    sector, so that reading a tile's row row by row would fetch a sector per system: the
    transposes cost a fraction of what the sectors would (benchmarks/data/planner.json,
    "gpu_columns"). Plain solves and linear recurrences of contiguous rows (Q = 1) are read in
    place by tiles of rows instead (`_pallas/row_tiles.py`): `kind` is the solve's kernel kind,
    "recurrence", or None (factorizations), and `N` the rows (steps). A tile the user gives
    (`block`) is kept in their layout; interpret mode (backend "pallas_interpret") follows the Triton
    kernels' plan, so that CPU tests run it."""
    if backend not in ("pallas_triton", "pallas_interpret") or block is not None or P == 1:
        return False
    from .._pallas import row_tiles as _pallas_rows

    cdt = compute_dtype(dtype)
    if kind == "recurrence" and _pallas_rows.recurrence_applies(P, N, Q, cdt):
        return False
    if kind is not None and _pallas_rows.applies(P, N, Q, cdt, kind=kind):
        return False
    return Q * jnp.dtype(cdt).itemsize < GPU_SECTOR_BYTES


# ---------------------------------------------------------------------------------------------
# Tiles.


def cpu_tiling(P: int, C: int, Q: int, rows: int, dtype, *, columns: int = 2,
               pivoted: bool = False) -> CpuTiling:
    """The C++ kernel's tile for P x C x Q lanes of `rows` rows, keeping `columns` work rows
    per lane: contiguous lanes along Q when Q fills a vector, or when a few of them (Q > 1)
    are chunked or too few systems to share out along P; else strided lanes (along P, or
    along the chunks when there are few systems) in blocks of up to two vectors, no wider than
    each core's share. `pivoted`: chunks of pivoted solves."""
    L = vector_lanes(dtype)
    itemsize = jnp.dtype(compute_dtype(dtype)).itemsize
    cores = cpu_cores()
    if Q == 1 and C == 1 and columns == 2 and not pivoted and _rows_by_tiles(P, rows, dtype):
        return CpuTiling("p", ROWS_TILE_VECTORS * L)
    if Q >= L and columns == 0:
        # No work rows (recurrences, the factorization): a tile keeps one row of state, so the
        # widest tiles that give every core one, each row read as one long stream
        # ("state_tiles").
        width = -(-Q // max(1, -(-cores // (P * C))))
        return CpuTiling("q", max(8, -(-width // 8) * 8))
    if Q >= L:
        # Whole systems: as many as keep the work rows in cache (at least a cache line of
        # them), up to 512. Chunks: whole rows (_chunk_tile_width).
        if C == 1:
            width = int(np.clip(cpu_cache_bytes() // max(1, columns * rows * itemsize),
                                64 // itemsize, 512))
        else:
            width = _chunk_tile_width(Q, itemsize)
        width = min(width, -(-Q // 8) * 8)
        if P * C * -(-Q // width) < cores:  # split Q over the cores
            width = max(64 // itemsize, -(-Q // cores))
        width = max(8, width - width % 8)
        return CpuTiling("q", width)
    runs = Q * itemsize in (8, 16) or (Q * itemsize == 32 and not pivoted
                                       and scanned_lanes(Q, dtype))
    if Q > 1 and C > 1 and columns and runs:
        # Chunks of solves whose rows are a few values (an (N, 4) field along axis 0, float32):
        # a tile takes every Q lane of a vector's worth of chunks, each chunk's row of Q values
        # one run (8 or 16 bytes, one move), so each row's divisions run a vector at a time.
        # One chunk's Q lanes a tile wait on one chain of divisions per row, and tiles of 32
        # chunks of one q gathered each value on its own. Runs of other lengths go value by
        # value, except for Thomas chunks whose runs the kernel loads straight into a vector (Q
        # dividing it: chunks.cc, EndsOfRuns); recurrences (no division) keep their rows in
        # place ("runs_of_rows").
        chunks = min(-(-L // Q), max(1, -(-P * C // cores)))
        return CpuTiling("cq", chunks * Q)
    if Q > 1 and (C > 1 or -(-P // cores) < Q):
        # Other chunked rows of a few values, and whole systems a few values apart too few to
        # give each core Q of them (pivoted, factored, `factor()`): a tile takes one chunk's
        # (system's) Q lanes, read in place: tiles of chunks of one q would re-read each line
        # for every one of the Q lanes ("one_chunk_per_tile").
        return CpuTiling("q", Q)
    # Strided lanes: two vectors (latency of the division chain hidden, few streams). Chunks
    # of one system lie next to each other: their streams share pages, so chunked sweeps
    # take their lanes along the chunks.
    width = max(8, 2 * L)
    # Along the chunks only when they fill tiles (or there are fewer systems than chunks):
    # many systems of a few chunks each take their lanes along P.
    lanes = "c" if C > 1 and C >= min(width, P) else "p"
    if lanes == "c" and (itemsize == 8 or (itemsize == 4 and columns and not pivoted)):
        # Chunks of one system: a cache line of lanes (8 float64, 16 float32 values), each
        # lane's block of rows one line, half the streams of two AVX-512 vectors (with AVX2,
        # two vectors are these lanes). Float32 recurrences (no work rows: columns == 0) keep
        # two vectors, and so do pivoted chunks ("chunk_lanes_a_cache_line").
        width = 64 // itemsize
    # No wider than each core's share of the lanes, in whole groups of 8 where there are 8:
    # the kernel keeps `columns` work rows of the tile's width however many of them hold a
    # system, and too few systems would make one tile, for one core. Fewer than 8 lanes run
    # scalar ("lanes_per_core_share").
    available = C if lanes == "c" else P
    share = max(1, -(-available // cores))
    if available >= 8:
        share = -(-share // 8) * 8
    return CpuTiling(lanes, min(width, share))


def _chunk_work_rows(kind: str) -> int:
    """Work rows per lane of the chunk sweeps: c', y', z' (pivoted: 1/pivot, U1, U2, y')."""
    return 4 if kind == "pivoted" else 3


def _chunk_tile_width(Q: int, itemsize: int) -> int:
    """Lanes of a chunk tile along Q: whole rows (one read stream per band per chunk) up to
    CHUNK_ROW_BYTES, longer rows in equal parts, whole cache lines: reading part of each row is
    slower (benchmarks/data/planner.json, "chunk_row_bytes")."""
    parts = -(-Q * itemsize // CHUNK_ROW_BYTES)
    return -(-Q // (parts * 8)) * 8


# ---------------------------------------------------------------------------------------------
# Rows in vector registers.


def tile_classes(P: int, N: int, Q: int, chunk: int, tiling: CpuTiling) -> dict:
    """The C++ kernel's tiles of P x C x Q lanes of N rows, in chunks of `chunk` rows (0: whole
    systems), as `tiling` lays them out (tiles.h, Geometry, which this mirrors): {class: (lanes,
    width, rows)} for every class that has tiles. A class is 2 * short + narrow: whether its
    tiles hold the short last chunk, and whether they are the last, narrower block of lanes
    along their dimension; every tile of a class has the same lanes, width and rows."""
    W = max(1, tiling.width)
    m = min(chunk, N) if chunk > 0 else N
    C = -(-N // m)
    lanes = tiling.lanes
    if lanes == "cq" and (C == 1 or W < Q):
        lanes = "q"  # Geometry: CQ tiles of one chunk, or narrower than a row, are Q tiles
    last = N - (C - 1) * m  # rows of the last chunk (m when it is full)
    counts = {"p": P, "q": Q}
    classes = {}

    def add(lanes, count, unit, full_width, rows_of_class):
        """Tiles of `count` lanes (chunks for "c" and "cq") in blocks of `unit`, each of
        `full_width` lanes when whole."""
        widths = ([full_width] if count >= unit else []) + (
            [count % unit * full_width // unit] if count % unit else [])
        for rows in rows_of_class:
            for width in widths:
                classes[2 * (rows != m) + (width != full_width)] = (lanes, width, rows)

    rows = [m] + ([last] if last != m else [])
    if lanes in ("c", "cq"):
        main = C if last == m else C - 1  # the full chunks; the last short one goes apart
        unit = W // Q if lanes == "cq" else W
        add(lanes, main, unit, unit * (Q if lanes == "cq" else 1), [m])
        if last != m:
            tail = "p" if P >= Q else "q"
            add(tail, counts[tail], W, W, [last])
    else:
        add(lanes, counts[lanes], W, W, rows)
    return classes


def _groupable(Q: int, rows: int) -> bool:
    """Whether rows of Q values share a vector of `rows` values (lanes.h, Groupable)."""
    return 1 < Q < rows and rows % Q == 0


def _scan_bits(classes: dict, scans) -> int:
    return sum(1 << cls for cls, tile in classes.items() if scans(*tile))


def recurrence_scans(P: int, T: int, Q: int, dtype, *, chunk: int, tiling: CpuTiling,
                     linear: bool = True) -> int:
    """Which classes of a linear recurrence's C++ tiles (`tile_classes`) are scanned inside
    vector registers (recurrence.cc, ScanLanes), as `CpuTiling.scan`: tiles of contiguous
    steps (Q == 1) at least a vector long, and tiles of all Q lanes of rows of a few values (Q
    dividing a vector) at least a vector of such rows long. Nonlinear recurrences (an
    activation), complex dtypes and kernels built without the scans: none."""
    L = _scan_rows(dtype)
    if not linear or L == 0:
        return 0

    def scans(lanes, width, rows):
        if Q == 1:
            return rows >= L
        return _groupable(Q, L) and lanes == "q" and width == Q and rows >= L // Q

    return _scan_bits(tile_classes(P, T, Q, chunk, tiling), scans)


def chunk_runs(P: int, N: int, Q: int, dtype, *, chunk: int, tiling: CpuTiling,
               pivoted: bool) -> int:
    """Which classes of the partition method's C++ chunk tiles (`tile_classes`) read each row
    straight into one vector, a run of Q values per chunk, with their state in registers
    (chunks.cc, EndsOfRuns and SolveOfRuns), as `CpuTiling.scan`: unpivoted real chunks in CQ
    tiles of exactly one vector of lanes, Q dividing it."""
    L = _scan_rows(dtype)
    if pivoted or L == 0 or not chunk:
        return 0

    def runs(lanes, width, rows):
        return lanes == "cq" and _groupable(Q, L) and width == L

    return _scan_bits(tile_classes(P, N, Q, chunk, tiling), runs)


def solve_plan(backend: str, platform: str, P: int, N: int, Q: int, dtype, *, kind: str,
               chunk: int | None = None, block=None) -> Plan:
    """The plan of one solve of (P, N, Q) systems."""
    m = solve_chunk(P, N, Q, dtype, kind=kind, backend=backend, platform=platform, chunk=chunk)
    C = -(-N // m) if m else 1
    rows = m or N
    columns = _chunk_work_rows(kind) if m else {"thomas": 2, "factored": 1, "periodic": 3,
                                                 "pivoted": 4}.get(kind, 2)
    tiling = _tiling(backend, P, C, Q, rows, dtype, columns=columns, block=block,
                     pivoted=kind == "pivoted")
    if backend == "native" and m:
        tiling = dataclasses.replace(tiling, scan=chunk_runs(
            P, N, Q, dtype, chunk=m, tiling=tiling, pivoted=kind == "pivoted"))
    return Plan(m, tiling)


def recurrence_plan(backend: str, platform: str, P: int, T: int, Q: int, dtype, *, linear: bool,
                    chunk: int | None = None, block=None, gated: bool = False) -> Plan:
    """The plan of one recurrence over (P, T, Q) (`gated`: with a gate's states read in the
    kernel)."""
    m = recurrence_chunk(P, T, Q, dtype, linear=linear, backend=backend, platform=platform,
                         chunk=chunk, gated=gated)
    C = -(-T // m) if m else 1
    tiling = _tiling(backend, P, C, Q, m or T, dtype, columns=0, block=block)
    if backend == "native":
        tiling = dataclasses.replace(tiling, scan=recurrence_scans(
            P, T, Q, dtype, chunk=m, tiling=tiling, linear=linear))
    return Plan(m, tiling)


def factor_plan(backend: str, P: int, N: int, Q: int, dtype, *, block=None) -> Plan:
    """The plan of one factorization (never chunked: each row is written as it is formed)."""
    return Plan(0, _tiling(backend, P, 1, Q, N, dtype, columns=0, block=block))


def _tiling(backend, P, C, Q, rows, dtype, *, columns, block=None, pivoted=False):
    if backend == "native":
        return cpu_tiling(P, C, Q, rows, dtype, columns=columns, pivoted=pivoted)
    if backend.startswith("pallas"):
        return block
    return None
