"""The C++ CPU kernels (a source per kind of kernel, ffi.cc the handlers): built on first use,
registered as XLA FFI targets.

The library is compiled once per machine, source and jax version with the system C++
compiler against the headers jaxlib ships (`jax.ffi.include_dir()`), and cached in
$TRIDIAX_CACHE_DIR (default ~/.cache/tridiax); the build logs a line to the "tridiax" logger
(shown by default) as it starts, with where and what it will cost here (`_build_estimate`),
and one when it is done, with the time it took. Where no compiler is found or the build fails,
`available()` is False and the CPU falls back to the XLA formulation, with one warning that
says why; set TRIDIAX_NATIVE=0 to skip the native kernel altogether.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from .._core.dtypes import compute_dtype
from .._core.layout import broadcast_shape
from .._core.planner import cpu_cache_bytes

_HERE = pathlib.Path(__file__).parent
# One translation unit per kind of kernel, and ffi.cc, which only declares the FFI handlers.
_SOURCES = tuple(_HERE / name for name in (
    "solve.cc", "chunks.cc", "factor.cc", "recurrence.cc", "banded.cc", "block.cc", "ffi.cc"))
_SOURCE = _SOURCES[0]
_BLOCK_SOURCE = _HERE / "block.cc"
# The headers the sources include: every one is hashed into the library's cache key.
_HEADERS = tuple(sorted(_HERE.glob("*.h")))
_LOG = logging.getLogger("tridiax")
# FFI target names and the C++ symbols behind them.
_TARGETS = {
    "tridiax_thomas_cpu": "TridiaxThomasCpu",
    "tridiax_chunk_ends_cpu": "TridiaxChunkEndsCpu",
    "tridiax_chunk_solve_cpu": "TridiaxChunkSolveCpu",
    "tridiax_factor_cpu": "TridiaxFactorCpu",
    "tridiax_band_cotangents_cpu": "TridiaxBandCotangentsCpu",
    "tridiax_recurrence_cpu": "TridiaxRecurrenceCpu",
    "tridiax_recurrence_ends_cpu": "TridiaxRecurrenceEndsCpu",
    "tridiax_banded_cpu": "TridiaxBandedCpu",
    "tridiax_block_cpu": "TridiaxBlockCpu",
}


# -march=native: the library is cached per CPU (the key includes its feature flags).
_FLAGS = ("-O3", "-march=native", "-std=c++17", "-fPIC")
# -ffp-contract=off: no multiply-add is fused into one rounding, so every code path (vector
# loops, scalar tails, tiles of any width) rounds each operation as the sequential sweep
# written out does, and a system gets the same answer, bit for bit, in any batch or layout.
# The block kernel fuses them (=fast) as XLA's CPU compiler does, so that its block
# eliminations round as the XLA formulation's, bit for bit. TRIDIAX_FP_CONTRACT_OFF tells the
# headers whose arithmetic must not be contracted (sweeps.h) that they may be included.
_CONTRACTION = {_BLOCK_SOURCE: ("-ffp-contract=fast",)}


def _source_flags(source: pathlib.Path) -> tuple[str, ...]:
    return (*_FLAGS,
            *_CONTRACTION.get(source, ("-ffp-contract=off", "-DTRIDIAX_FP_CONTRACT_OFF")))


def _cpu_flags() -> str:
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    return next((line for line in text.splitlines() if line.startswith("flags")), "")


@functools.cache
def _vector_math_library() -> str | None:
    """glibc's vector math library (libmvec, glibc >= 2.35: the float64 tanh of IndRNN), by the
    name the linker takes (`libmvec.so.1`), or None where there is none."""
    if platform.system() != "Linux":
        return None
    return ctypes.util.find_library("mvec")


def _compile(compiler: str, out: pathlib.Path, *, vector_math: str | None) -> None:
    # The sources compile side by side (each takes a while), then link into one library.
    extra = ["-I", jax.ffi.include_dir(), *(["-DTRIDIAX_LIBMVEC"] if vector_math else [])]
    objects = [out.with_name(f"{out.name}.{source.stem}.o") for source in _SOURCES]
    jobs = [subprocess.Popen([compiler, *_source_flags(source), *extra, "-c", str(source),
                              "-o", str(obj)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
            for source, obj in zip(_SOURCES, objects)]
    for job, (stdout, stderr) in [(job, job.communicate()) for job in jobs]:
        if job.returncode:
            raise subprocess.CalledProcessError(job.returncode, job.args, stdout, stderr)
    cmd = [compiler, "-shared", *map(str, objects), "-o", str(out), "-lpthread",
           *([f"-l:{vector_math}"] if vector_math else [])]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def _build(compiler: str, out: pathlib.Path) -> None:
    """Build with libmvec where there is one; where that build fails, without it."""
    vector_math = _vector_math_library()
    if vector_math:
        try:
            return _compile(compiler, out, vector_math=vector_math)
        except subprocess.CalledProcessError as err:
            _LOG.warning("tridiax: building with glibc's %s failed (%s); building without it "
                         "(float64 tanh IndRNNs then take libm's scalar tanh)", vector_math,
                         (err.stderr or "").strip()[:200] or f"exit status {err.returncode}")
    _compile(compiler, out, vector_math=None)


# What compiling one source costs one core, low and high: the build notice's estimate.
_SOURCE_SECONDS = (30, 50)


def _build_estimate(cores: int | None = None) -> str:
    """What the build costs on `cores` cores (default: those this process may run on), for
    the notice: the sources compile side by side, so each core compiles ceil(sources /
    cores) of them in turn."""
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # no sched_getaffinity outside Linux
            cores = os.cpu_count() or 1
    cores, sources = max(1, cores), len(_SOURCES)
    rounds = -(-sources // cores)
    low, high = (rounds * seconds for seconds in _SOURCE_SECONDS)
    return (f"{sources} C++ source{'s' if sources > 1 else ''} on {cores} "
            f"core{'s' if cores > 1 else ''}: about {low}-{high} s")


@functools.cache
def _library_path() -> pathlib.Path:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX or install g++)")
    key = hashlib.sha256(
        b"\0".join([*(path.read_bytes() for path in (*_SOURCES, *_HEADERS)),
                    jax.__version__.encode(), _cpu_flags().encode(), compiler.encode(),
                    *(" ".join(_source_flags(source)).encode() for source in _SOURCES),
                    str(_vector_math_library()).encode()])
    ).hexdigest()[:16]
    cache = pathlib.Path(os.environ.get("TRIDIAX_CACHE_DIR", "~/.cache/tridiax")).expanduser()
    path = cache / f"cpu_kernels-{key}.so"
    if not path.exists():
        _LOG.warning(
            "tridiax: building the native CPU kernel, once per machine, compiler and jax version "
            "(%s), into %s (TRIDIAX_CACHE_DIR); silence this with "
            "logging.getLogger('tridiax').setLevel(logging.ERROR)", _build_estimate(), path)
        start = time.perf_counter()
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            built = pathlib.Path(tmp) / path.name
            try:
                _build(compiler, built)
            except subprocess.CalledProcessError as err:
                output = (err.stderr or err.stdout or "").strip() or "(no output)"
                raise RuntimeError(f"building the kernels with {compiler} failed (exit status "
                                   f"{err.returncode}):\n{output}") from None
            os.replace(built, path)  # atomic: concurrent builders race harmlessly
        _LOG.warning("tridiax: built the native CPU kernel in %.0f s", time.perf_counter() - start)
    return path


@functools.cache
def scan_rows(itemsize: int) -> int:
    """Rows of a real element of `itemsize` bytes that the kernel scans per vector register in
    contiguous lanes (lanes.h, VectorOps): 16 float32 with AVX-512; 0 where the kernel
    is not built or was built without the scans."""
    if not available():
        return 0
    function = ctypes.cdll.LoadLibrary(str(_library_path())).TridiaxScanRows
    function.restype = ctypes.c_int64
    function.argtypes = [ctypes.c_int64]
    return int(function(itemsize))


@functools.cache
def vector_math() -> bool:
    """Whether the built kernel takes float64 tanh from glibc's vector math library (libmvec);
    False where the kernel is not built, or was built without it."""
    if not available():
        return False
    function = ctypes.cdll.LoadLibrary(str(_library_path())).TridiaxVectorMath
    function.restype = ctypes.c_int64
    return bool(function())


@functools.cache
def unavailable_reason() -> str | None:
    """Why the native CPU kernel cannot run (None: it is built and registered; builds it on first
    call): TRIDIAX_NATIVE=0, no compiler, or the compiler's error."""
    if os.environ.get("TRIDIAX_NATIVE", "1") == "0":
        return "TRIDIAX_NATIVE=0 turns it off"
    try:
        library = ctypes.cdll.LoadLibrary(str(_library_path()))
        for target, symbol in _TARGETS.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)),
                                        platform="cpu")
    except (OSError, RuntimeError) as err:
        return str(err)
    return None


def library_path() -> pathlib.Path | None:
    """Where the built library is cached (None: not built)."""
    return None if unavailable_reason() else _library_path()


@functools.cache
def available() -> bool:
    """Whether the native CPU kernel is built and registered (builds it on first call)."""
    reason = unavailable_reason()
    if reason is not None and os.environ.get("TRIDIAX_NATIVE", "1") != "0":
        warnings.warn(
            f"tridiax: the native CPU kernel is unavailable ({reason}); using the slower XLA "
            "formulation on CPU (python -m tridiax --info says more).",
            RuntimeWarning,
            stacklevel=2,
        )
    return reason is None


_KINDS = {"thomas": 0, "factored": 1, "periodic": 2, "pivoted": 3}
_LANES = {"q": 0, "p": 1, "c": 2, "cq": 3}


def _require():
    if not available():
        raise RuntimeError("the native CPU kernel is unavailable; use backend='xla'.")


def _tile_attrs(tiling, *, scan: bool = False) -> dict:
    """The planner's tile choice (`_planner.CpuTiling`) as FFI attributes; `scan`: with the
    classes of tiles whose rows it holds in vector registers, for the kernels that can."""
    attrs = dict(lanes=np.int64(_LANES[tiling.lanes]), width=np.int64(tiling.width))
    return dict(attrs, scan=np.int64(tiling.scan)) if scan else attrs


def _cast(operands, out_dtype):
    cdt = compute_dtype(out_dtype)
    return [x.astype(cdt) for x in operands], cdt


def solve_pnq(l, d, u, b, *, transposed: bool, out_dtype, kind: str = "thomas", tiling):
    """Solve along axis 1 of (P|1, N|1, Q|1) operands with the C++ kernel; returns (P, N, Q).

    `kind` is "thomas", "factored", "periodic" or "pivoted", as in `_pallas_thomas.solve_pnq`;
    `tiling` the planner's `CpuTiling`. float16/bfloat16 operands are converted to float32
    (the kernel computes in float32 or wider) and the result rounded back once.
    """
    _require()
    operands, cdt = _cast((l, d, u, b), out_dtype)
    shape = broadcast_shape(*operands)
    call = jax.ffi.ffi_call("tridiax_thomas_cpu", jax.ShapeDtypeStruct(shape, cdt))
    return call(*operands, transposed=transposed, kind=np.int64(_KINDS[kind]),
                **_tile_attrs(tiling)).astype(out_dtype)


def chunk_ends_pnq(l, d, u, b, *, transposed: bool, periodic: bool, chunk: int, tiling,
                   pivoting: bool = False):
    """The partition method's first sweep (`_long_systems/chunked.py`): ten (P, C, Q) arrays, the
    contributions of each chunk of `chunk` rows to the reduced system (chunks.cc, `Mode`),
    in the compute dtype. `pivoting`: each chunk eliminated with partial pivoting."""
    _require()
    shape = broadcast_shape(l, d, u, b)
    P, N, Q = shape
    out = jax.ShapeDtypeStruct((P, -(-N // chunk), Q), b.dtype)
    call = jax.ffi.ffi_call("tridiax_chunk_ends_cpu", (out,) * 10)
    return call(l, d, u, b, transposed=transposed, periodic=periodic, pivoting=pivoting,
                chunk=np.int64(chunk), **_tile_attrs(tiling, scan=True))


def chunk_solve_pnq(l, d, u, b, separators, *, transposed: bool, periodic: bool, chunk: int,
                    tiling, pivoting: bool = False):
    """The partition method's last sweep: every chunk's rows, its separators (P, C, Q) known
    (`pivoting`: each chunk with partial pivoting)."""
    _require()
    shape = broadcast_shape(l, d, u, b)
    call = jax.ffi.ffi_call("tridiax_chunk_solve_cpu", jax.ShapeDtypeStruct(shape, b.dtype))
    return call(l, d, u, b, separators, transposed=transposed, periodic=periodic,
                pivoting=pivoting, chunk=np.int64(chunk), **_tile_attrs(tiling, scan=True))


def factor_pnq(l, d, u, *, out_dtype, tiling):
    """The factors (l, m, c') of A = L D V along axis 1 of (P|1, N|1, Q|1) bands (see
    `_xla_thomas.factor_sweep`); three (P, N, Q) arrays."""
    _require()
    operands, cdt = _cast((l, d, u), out_dtype)
    out = jax.ShapeDtypeStruct(broadcast_shape(*operands), cdt)
    call = jax.ffi.ffi_call("tridiax_factor_cpu", (out,) * 3)
    return tuple(f.astype(out_dtype) for f in call(*operands, **_tile_attrs(tiling)))


BAND_COTANGENT_DTYPES = (np.float32, np.float64, np.complex64, np.complex128)


def band_cotangents_pnq(g, x, *, transposed: bool, periodic: bool, present):
    """The band cotangents of a solve's gradient along axis 1 of (P, N, Q) arrays `g` (b_bar)
    and `x` (the solution) in one pass (`_tridiagonal/band_product.py` states them): a tuple (lower, diag,
    upper), each (P, N, Q), or None where `present` is False. Dtypes BAND_COTANGENT_DTYPES."""
    _require()
    if g.shape != x.shape or g.ndim != 3 or g.dtype != x.dtype:
        raise ValueError(f"b_bar {g.shape} {g.dtype} and x {x.shape} {x.dtype} must be one "
                         "(P, N, Q) shape and dtype")
    # A band not asked for gets a one-element result, which the kernel leaves alone.
    outs = tuple(jax.ShapeDtypeStruct(g.shape if want else (1, 1, 1), g.dtype)
                 for want in present)
    call = jax.ffi.ffi_call("tridiax_band_cotangents_cpu", outs)
    results = call(g, x, transposed=bool(transposed), periodic=bool(periodic))
    return tuple(r if want else None for r, want in zip(results, present))


def _activation_code(activation) -> int | None:
    """The kernel's code for a built-in activation; None for one it does not know."""
    codes = {None: 0, jax.nn.relu: 1, jnp.tanh: 2}
    try:
        return codes.get(activation)
    except TypeError:  # unhashable callable
        return None


def supports_recurrence(activation, dtype) -> bool:
    """Whether the C++ recurrence runs this activation (identity, relu, tanh) and dtype."""
    code = _activation_code(activation)
    return code is not None and (code == 0 or not jnp.issubdtype(dtype, jnp.complexfloating))


def _gate(gate, cdt):
    """The gate operand and its slope code: (the states, 1 relu / 2 tanh), or a dummy."""
    if gate is None:
        return jnp.zeros((1, 1, 1), cdt), np.int64(0)
    states, activation = gate
    return states.astype(cdt), np.int64(_activation_code(activation))


def recurrence_pnq(a, x, h0, *, reverse: bool, shifted: bool, activation, final_only: bool,
                   out_dtype, tiling, chunk: int = 0, gate=None):
    """Run along axis 1 of (P|1, T|1, Q|1) operands with the C++ kernel (see _xla_recurrence).

    With `chunk`, h0 is (P, C, Q): the state entering each chunk of `chunk` steps. `gate`, if
    given, is (states, activation): the linear recurrence h = slope(states) * (c h + x) that
    a nonlinear recurrence's derivatives run (`_recurrence/primitive.py`)."""
    if chunk and final_only:  # every chunk would write its final state to the one slot
        raise ValueError("a chunked run returns every step; its final state comes from the "
                         "carry fold (_chunked.recurrence)")
    _require()
    (a, x, h0), cdt = _cast((a, x, h0), out_dtype)
    gate_operand, slope = _gate(gate, cdt)
    P, T, Q = broadcast_shape(a, x, gate_operand, h0[:, :1])
    shape = (P, 1 if final_only else T, Q)
    call = jax.ffi.ffi_call("tridiax_recurrence_cpu", jax.ShapeDtypeStruct(shape, cdt))
    return call(a, x, h0, gate_operand, reverse=reverse, shifted=shifted,
                activation=np.int64(_activation_code(activation)), gate=slope,
                final_only=final_only, chunk=np.int64(chunk),
                **_tile_attrs(tiling, scan=True)).astype(out_dtype)


def recurrence_ends_pnq(a, x, *, reverse: bool, shifted: bool, chunk: int, tiling, gate=None):
    """Each chunk of `chunk` steps run from a zero state: (decay, final), two (P, C, Q) arrays:
    the product of the chunk's coefficients and its final state (`_long_systems/chunked.py`)."""
    _require()
    gate_operand, slope = _gate(gate, x.dtype)
    P, T, Q = broadcast_shape(a, x, gate_operand)
    out = jax.ShapeDtypeStruct((P, -(-T // chunk), Q), x.dtype)
    call = jax.ffi.ffi_call("tridiax_recurrence_ends_cpu", (out, out))
    return call(a, x, gate_operand, reverse=reverse, shifted=shifted, gate=slope,
                chunk=np.int64(chunk), **_tile_attrs(tiling, scan=True))


_BANDED_KINDS = {"banded": 0, "banded_pivoted": 1, "banded_hermitian": 2}


def banded_pnq(ab, b, *, l: int, u: int, kind: str, transposed: bool, out_dtype):
    """Solve A x = b (A^T x = b when `transposed`) along axis 1 with the C++ banded kernel
    (banded.cc), exactly as `_xla_banded.solve_pnq`: `ab` (l + u + 1, P|1, N|1, Q|1) in
    scipy's band layout along axis 2 (a size-1 axis is broadcast, never copied), `b` (P, N, Q);
    `kind` "banded", "banded_pivoted" or "banded_hermitian". Returns x, (P, N, Q) of
    `out_dtype`; float16/bfloat16 are solved in float32 and rounded once."""
    _require()
    if kind not in _BANDED_KINDS:
        raise ValueError(f"unknown banded kind {kind!r}; expected one of {tuple(_BANDED_KINDS)}")
    l, u = int(l), int(u)
    P, N, Q = b.shape
    if l < 0 or u < 0 or ab.ndim != 4 or ab.shape[0] != l + u + 1 or any(
            a not in (1, n) for a, n in zip(ab.shape[1:], (P, N, Q))):
        raise ValueError(f"ab of shape {ab.shape} does not hold l + u + 1 = {l + u + 1} bands "
                         f"broadcasting against b of shape {b.shape}")
    (ab, b), cdt = _cast((ab, b), out_dtype)
    call = jax.ffi.ffi_call("tridiax_banded_cpu", jax.ShapeDtypeStruct((P, N, Q), cdt))
    return call(ab, b, l=np.int64(l), u=np.int64(u), kind=np.int64(_BANDED_KINDS[kind]),
                transposed=bool(transposed)).astype(out_dtype)


_BLOCK_KINDS = {"block": 0, "block_pivoted": 1, "block_hermitian": 2}


def block_pnq(lower, diag, upper, b, *, kind: str, transposed: bool, out_dtype):
    """Solve A x = b (A^T x = b when `transposed`, no conjugate) along axis 1 with the C++
    block-tridiagonal kernel (block.cc), the block Thomas algorithm of
    `_xla_block.solve_pnq`: `lower`, `diag`, `upper` (P|1, N|1, Q|1, k, k), block row i reading
    lower[i] x[i-1] + diag[i] x[i] + upper[i] x[i+1] (a size-1 axis is broadcast, never copied;
    lower[0] and upper[N-1] are never read), `b` (P, N, Q, k, m); `kind` "block",
    "block_pivoted" (partial pivoting inside each diagonal block) or "block_hermitian".
    Returns x, (P, N, Q, k, m) of `out_dtype`; float16/bfloat16 are solved in float32 and
    rounded once."""
    _require()
    if kind not in _BLOCK_KINDS:
        raise ValueError(f"unknown block kind {kind!r}; expected one of {tuple(_BLOCK_KINDS)}")
    if b.ndim != 5:
        raise ValueError(f"b of shape {b.shape} is not (P, N, Q, k, m)")
    P, N, Q, k, _ = b.shape
    for name, a in (("lower", lower), ("diag", diag), ("upper", upper)):
        if a.ndim != 5 or a.shape[3:] != (k, k) or any(
                s not in (1, n) for s, n in zip(a.shape[:3], (P, N, Q))):
            raise ValueError(f"{name} of shape {a.shape} is not (P|1, N|1, Q|1, k, k) = "
                             f"({P}|1, {N}|1, {Q}|1, {k}, {k}) for b of shape {b.shape}")
    (lower, diag, upper, b), cdt = _cast((lower, diag, upper, b), out_dtype)
    call = jax.ffi.ffi_call("tridiax_block_cpu", jax.ShapeDtypeStruct(b.shape, cdt))
    return call(lower, diag, upper, b, kind=np.int64(_BLOCK_KINDS[kind]),
                transposed=bool(transposed), cache=np.int64(cpu_cache_bytes())).astype(out_dtype)
