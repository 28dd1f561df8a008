"""Which implementation runs where: the one place that chooses a backend.

| name               | what runs                                            | runs on                     |
|--------------------|------------------------------------------------------|-----------------------------|
| "native"           | C++ kernels `_native/*.cc` (XLA FFI)                 | CPU with a C++ compiler     |
|                    |                                                      | (recurrences: identity,     |
|                    |                                                      | relu and tanh activations)  |
| "pallas_triton"    | Pallas kernels `<family>/pallas_triton.py`, Triton   | CUDA and ROCm GPUs, while   |
|                    |                                                      | JAX has the Triton backend  |
| "xla"              | fori_loop formulations `<family>/xla.py`             | everywhere                  |
| "mosaic_gpu"       | Pallas Mosaic GPU kernels `_pallas/mosaic_gpu.py`    | NVIDIA Hopper (sm_90+),     |
|                    | (every kind and recurrence, real 16/32-bit)          | when asked for: not yet     |
|                    |                                                      | measured against Triton     |
| "pallas_interpret" | the Pallas kernels in interpret mode (tests)         | anywhere, when asked for    |
| "pallas_tpu"       | Pallas Mosaic TPU kernels `<family>/pallas_tpu.py`   | TPUs; float32, bfloat16 and |
|                    | (every tridiagonal kind, the factorization,          | float16 (computed in        |
|                    | recurrences: identity, relu, tanh; banded and block  | float32); complex64 (as     |
|                    | solves)                                              | float32 parts)              |
| "pallas_tpu_       | the Pallas TPU kernels, interpreted (tests)          | anywhere, when asked for    |
|  interpret"        |                                                      |                             |

The Mosaic GPU kernels are tested on CPU by calling them in JAX's Mosaic GPU interpreter
(`_pallas/mosaic_gpu.py`, `interpret=`); that interpreter's callbacks cannot run inside a
primitive's lowering, so it is not a backend of the public functions. The Pallas TPU kernels are
tested on CPU in TPU interpret mode (called directly) and through the public functions as
"pallas_tpu_interpret" (Pallas's HLO interpreter, which a lowering can hold), and compiled for
TPUs without one (tests/tpu/).

Each platform tries its backends in order (`PREFERENCE`) and takes the first that can run
the call (`unavailable` says why one cannot: the dtype, the activation, this JAX, the build),
so a JAX without the Triton backend, or a machine without a compiler, falls through to the
next instead of failing. All of them run the same algorithms with the same conventions and
agree to rounding. A user's `backend=` override is checked the same way and refused with the
reason.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import jax_private as _jax_private
from . import planner as _planner

BACKENDS: tuple[str, ...] = ("native", "xla", "pallas_triton", "pallas_interpret", "mosaic_gpu",
                             "pallas_tpu", "pallas_tpu_interpret")

# Backends each platform tries, best first; "xla" runs everything, everywhere. "mosaic_gpu"
# joins the CUDA list once a GPU has measured it at least as fast as Triton (run
# benchmarks/gpu_report.py); until then it runs when asked for.
PREFERENCE: dict[str, tuple[str, ...]] = {
    "cpu": ("native", "xla"),
    "cuda": ("pallas_triton", "xla"),
    "rocm": ("pallas_triton", "xla"),
    "tpu": ("pallas_tpu", "xla"),
}
GPU_PLATFORMS = ("cuda", "rocm")


def device_platform(device) -> str:
    """The platform name lowerings are registered under ("cpu", "cuda", "rocm", "tpu") for a
    jax Device. `device.platform` says "gpu" for CUDA and ROCm devices alike; the device's
    client says which."""
    if device.platform != "gpu":
        return device.platform
    client = getattr(device, "client", None)
    name = getattr(client, "platform", "")
    if name in GPU_PLATFORMS:
        return name
    return "rocm" if "rocm" in str(getattr(client, "platform_version", "")).lower() else "cuda"


def unavailable(backend: str, dtype, *, platform: str | None = None, op: str = "thomas",
                activation=None) -> str | None:
    """Why `backend` cannot run this call on `platform` (None: it can; platform None: any).

    `op` is "thomas" (tridiagonal solves), "recurrence" (linear recurrences, IndRNN), "banded"
    or "block"."""
    if backend not in BACKENDS:
        return f"unknown backend {backend!r}; choose one of {BACKENDS}"
    if backend == "native":
        from .._native import build as _native_build
        from .._native import ffi as _native

        if platform not in (None, "cpu"):
            return "the native kernels run on CPU"
        if op == "recurrence" and not _native.supports_recurrence(activation, dtype):
            return ("the native recurrence runs identity, relu and tanh (real dtypes), not "
                    f"{activation!r}")
        if not _native_build.available():
            return "the native CPU kernel is unavailable (python -m tridiax --info says why)"
    if backend in _planner.TPU_BACKENDS:
        return _tpu_unavailable(backend, dtype, platform=platform, op=op, activation=activation)
    if (backend.startswith("pallas") and jnp.issubdtype(dtype, jnp.complexfloating)
            and activation is not None):
        # Complex values are split into real and imaginary parts inside the kernels
        # (`_core/split_complex.py`), which a user's activation cannot take.
        return f"the Pallas kernels run {jnp.dtype(dtype)} recurrences without an activation"
    if backend == "pallas_triton":
        if platform not in (None, *GPU_PLATFORMS):
            return "Triton runs on CUDA and ROCm GPUs"
        if _jax_private.pallas_triton() is None:
            return f"jax {jax.__version__} has no Pallas Triton backend"
        if platform == "cuda" and (capability := _cuda_capability()) is not None \
                and capability < 8.0:
            return f"Pallas Triton needs sm_80 or later; this GPU is sm_{capability:.1f}"
    if backend == "mosaic_gpu":
        if platform not in (None, "cuda"):
            return "Mosaic GPU runs on NVIDIA GPUs (Hopper and later)"
        if (capability := _cuda_capability()) is not None and capability < 9.0:
            return f"Mosaic GPU needs Hopper (sm_90) or later; this GPU is sm_{capability:.1f}"
        if _jax_private.pallas_mosaic_gpu() is None:
            return f"jax {jax.__version__} has no Pallas Mosaic GPU backend (or absl-py is missing)"
        if not jnp.issubdtype(dtype, jnp.floating) or jnp.dtype(dtype).itemsize > 4:
            return f"Mosaic GPU has no {jnp.dtype(dtype)}"
    return None


def _tpu_unavailable(backend: str, dtype, *, platform, op, activation) -> str | None:
    """Why the Pallas TPU kernels cannot run this call (`unavailable`)."""
    from .._pallas import tpu as _tpu
    from .._recurrence import pallas_tpu as _tpu_recurrence

    if backend == "pallas_tpu" and platform not in (None, "tpu"):
        return "the Pallas TPU kernels run on TPUs"
    if not _tpu.available():
        return f"jax {jax.__version__} has no Pallas Mosaic TPU backend"
    if (reason := _tpu.unavailable_dtype(dtype)) is not None:
        return reason
    if op == "recurrence" and not _tpu_recurrence.supports(activation):
        return f"the Pallas TPU recurrence runs identity, relu and tanh, not {activation!r}"
    if op == "recurrence" and activation is not None and jnp.issubdtype(dtype, jnp.complexfloating):
        return f"the Pallas TPU recurrence runs {jnp.dtype(dtype)} recurrences without an activation"
    return None


@functools.cache
def _cuda_capability() -> float | None:
    """The compute capability of this process's first CUDA device (None: none, or unknown)."""
    try:
        return float(jax.devices("cuda")[0].compute_capability)
    except (RuntimeError, ValueError, AttributeError, IndexError, TypeError):
        return None


def default_backend(platform: str, dtype, *, activation=None, op: str = "thomas") -> str:
    """The first backend of `platform`'s PREFERENCE that can run this call."""
    for backend in PREFERENCE.get(platform, ()):
        if unavailable(backend, dtype, platform=platform, op=op, activation=activation) is None:
            return backend
    return "xla"


# Largest block size the Pallas Triton block kernel takes by default (real, complex): its
# k x k blocks live in registers, which larger blocks exhaust (they spill, and ptxas takes
# minutes: tests/block/test_block_pallas.py compiles each k for an H100); larger k run XLA's loop.
PALLAS_BLOCK_LIMIT = (6, 4)
# Largest block size the Pallas TPU block kernel takes by default: its k x k blocks are unrolled
# into k^3 row-tile operations per row (tests/tpu/test_tpu_compile.py compiles each k for a v5e).
TPU_BLOCK_LIMIT = 8


def default_block_backend(platform: str, dtype, k: int) -> str:
    """`default_backend` for a block-tridiagonal solve with k x k blocks."""
    backend = default_backend(platform, dtype, op="block")
    complex_ = jnp.issubdtype(dtype, jnp.complexfloating)
    if backend == "pallas_triton" and k > PALLAS_BLOCK_LIMIT[complex_]:
        return "xla"
    if backend == "pallas_tpu" and k > TPU_BLOCK_LIMIT:
        return "xla"
    return backend


def check_block(block) -> tuple[int, int] | None:
    """`block` as a (bp, bq) pair of powers of two, or None; ValueError otherwise."""
    if block is None:
        return None
    try:
        bp, bq = (int(b) for b in block)
    except (TypeError, ValueError):
        raise ValueError(f"block must be None or a pair (bp, bq) of ints, got {block!r}.") from None
    for b in (bp, bq):
        if b < 1 or b & (b - 1):
            raise ValueError(f"block sizes must be powers of two (Triton tiles), got {block!r}.")
    return bp, bq


def check_chunk(chunk, kind: str | None = None) -> int | None:
    """`chunk` (rows per chunk of a long system: None lets the planner decide, 0 never
    chunks) as an int or None; ValueError otherwise, and for a kind that is never chunked."""
    if chunk is None:
        return None
    if isinstance(chunk, bool) or not isinstance(chunk, int | np.integer) or chunk < 0 or chunk == 1:
        raise ValueError(f"chunk must be None, 0 or an int >= 2 (rows per chunk), got {chunk!r}.")
    if chunk and kind is not None and kind not in (*_planner.CHUNKED_KINDS, "periodic_pivoted"):
        raise ValueError(
            "chunk applies to solves from the bands: factored solves sweep each system whole "
            f"(got chunk={chunk!r} for a {kind} solve); pass chunk=None.")
    return int(chunk)


def check_solver_settings(backend: str | None, block, **flags: bool) -> None:
    """The checks of a solver module's static settings (tridiax.TDMA, tridiax.lineax.TDMA):
    backend, block, and flags such as pivoting=..., check=... that must be booleans."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be None or one of {BACKENDS}, got {backend!r}.")
    check_block(block)
    check_flags(**flags)


def check_flags(**flags) -> None:
    """Raise TypeError for a setting such as pivoting=... that is not a boolean."""
    for name, flag in flags.items():
        if not isinstance(flag, bool | np.bool_):
            raise TypeError(f"{name} must be True or False, got {flag!r}.")


def check_backend(backend: str | None, dtype, *, activation=None, op: str | None = None) -> None:
    """Raise ValueError, with the reason, for a backend override that cannot run this dtype
    (or activation) on this JAX and machine. `op`: as `unavailable` (None: "recurrence" where
    an activation is given, else "thomas")."""
    if backend is None:
        return
    if backend not in BACKENDS:
        raise ValueError(f"backend must be None or one of {BACKENDS}, got {backend!r}.")
    if op is None:
        op = "thomas" if activation is None else "recurrence"
    reason = unavailable(backend, dtype, op=op, activation=activation)
    if reason is not None:
        raise ValueError(f"backend={backend!r} cannot run this call: {reason}; use 'xla' "
                         "(runs everything) or None (the best available).")


def _triton_params(tiles):
    # jax >= 0.10 picks Mosaic GPU for Pallas on GPU unless Triton's CompilerParams are passed
    # explicitly.
    return _jax_private.pallas_triton().CompilerParams(num_warps=tiles.num_warps, num_stages=1)


class Kernels(NamedTuple):
    """A backend's kernels over (P|1, N|1, Q|1) operands (None where it has none):

    - `solve(l, d, u, b, *, transposed, out_dtype, kind, tiling)`: the tridiagonal kinds;
    - `chunk_ends`, `chunk_solve`: the partition method's sweeps (`_long_systems/chunked.py`);
    - `factor(l, d, u, *, out_dtype, tiling)`: the factors of A = L D V;
    - `recurrence(a, x, h0, *, reverse, shifted, activation, final_only, out_dtype, tiling,
      chunk=0, gate=None, sums=None)` and `recurrence_ends`: recurrences and their chunked
      sweep (`sums`: the TPU kernel's only);
    - `banded(ab, b, *, l, u, kind, transposed, out_dtype)`: banded solves over
      ((l + u + 1), P|1, N|1, Q|1) bands (`_banded/xla.py` states the algorithm);
    - `block(lower, diag, upper, b, *, kind, transposed, out_dtype)`: block-tridiagonal
      solves over (P|1, N|1, Q|1, k, k) blocks (`_block/xla.py` states the algorithm).

    `tiling` is the planner's tile choice (`_planner.Plan.tiling`)."""

    solve: Callable
    chunk_ends: Callable | None
    chunk_solve: Callable | None
    factor: Callable
    recurrence: Callable
    recurrence_ends: Callable | None
    banded: Callable
    block: Callable


def _ignoring_tiling(fn):
    """`fn` (a kernel that tiles for itself) called with the planner's `tiling` dropped. Chunked
    runs reach it only through `_composed_chunks`, which splits them."""

    def call(*args, tiling=None, **kwargs):
        del tiling
        return fn(*args, **kwargs)

    return call


def _without_states(recurrence):
    """A recurrence kernel that reads no states, taking `gate=None` and `sums=None` as the TPU
    kernel does and refusing others: the recurrence primitive materializes the slope of a gate
    (the native kernel has gates too) and forms the sums after the run for every other kernel,
    so neither reaches them."""

    def call(*args, gate=None, sums=None, **kwargs):
        if gate is not None:
            raise NotImplementedError("this backend's recurrence kernel runs no gate: the slope "
                                      "is materialized before it")
        if sums is not None:
            raise NotImplementedError("this backend's recurrence kernel forms no sums: they are "
                                      "formed after it")
        return recurrence(*args, **kwargs)

    return call


def factorization_kernels(backend: str, family: str):
    """(factor_pnq, factored_solve_pnq) of a family's factorizations ("_banded", "_block"):
    its Pallas TPU kernels (`pallas_tpu_factors`) on the TPU backends, interpreted by Pallas's
    HLO interpreter for "pallas_tpu_interpret", as the other TPU kernels' backend is; else
    XLA's loops (`xla`), which every other backend's factorizations run."""
    if backend not in _planner.TPU_BACKENDS:
        module = importlib.import_module(f"tridiax.{family}.xla")
        return module.factor_pnq, module.factored_solve_pnq
    module = importlib.import_module(f"tridiax.{family}.pallas_tpu_factors")
    interpret = True if backend == "pallas_tpu_interpret" else None
    return (functools.partial(module.factor_pnq, interpret=interpret),
            functools.partial(module.factored_solve_pnq, interpret=interpret))


def kernels(backend: str) -> Kernels:
    """The kernels of `backend` (see BACKENDS). Mosaic GPU has no banded or block kernel and
    runs XLA's."""
    from .._banded import pallas_triton as _pallas_banded
    from .._banded import xla as _xla_banded
    from .._block import pallas_triton as _pallas_block
    from .._block import xla as _xla_block
    from .._long_systems import composed_chunks as _composed_chunks
    from .._native import ffi as _native
    from .._pallas import tiles as _pallas_tiles
    from .._recurrence import pallas_triton as _pallas_recurrence
    from .._recurrence import xla as _xla_recurrence
    from .._tridiagonal import pallas_triton as _pallas_thomas
    from .._tridiagonal import xla as _xla_thomas

    if backend == "native":
        return Kernels(_native.solve_pnq, _native.chunk_ends_pnq, _native.chunk_solve_pnq,
                       _native.factor_pnq, _native.recurrence_pnq, _native.recurrence_ends_pnq,
                       _native.banded_pnq,
                       # the planner's cache size, which the block kernel's tiles fit in
                       functools.partial(_native.block_pnq, cache=_planner.cpu_cache_bytes()))

    def composed(solve, recurrence, factor, banded, block, *, stack=True):
        # The chunk sweeps composed from the plain kernels (`_long_systems/composed_chunks.py`).
        chunks = _composed_chunks.composed(solve, recurrence, stack=stack)
        return Kernels(solve, chunks["chunk_ends"], chunks["chunk_solve"], factor,
                       chunks["recurrence"], chunks["recurrence_ends"], banded, block)

    if backend == "xla":
        return composed(_ignoring_tiling(_xla_thomas.solve_pnq),
                        _without_states(_ignoring_tiling(_xla_recurrence.recurrence_pnq)),
                        _ignoring_tiling(_xla_thomas.factor_pnq),
                        _xla_banded.solve_pnq, _xla_block.solve_pnq)
    if backend == "mosaic_gpu":
        from .._pallas import mosaic_gpu as _mosaic_gpu

        return composed(_ignoring_tiling(_mosaic_gpu.solve_pnq),
                        _without_states(_ignoring_tiling(_mosaic_gpu.recurrence_pnq)),
                        _ignoring_tiling(_mosaic_gpu.factor_pnq),
                        _xla_banded.solve_pnq, _xla_block.solve_pnq)
    if backend in _planner.TPU_BACKENDS:
        return _tpu_kernels(backend, composed)
    if backend not in ("pallas_interpret", "pallas_triton"):
        raise ValueError(f"unknown backend {backend!r}")
    options = ({"interpret": True} if backend == "pallas_interpret"
               else {"compiler_params": _triton_params})

    def pallas(fn):
        def call(*args, tiling=None, **kwargs):
            tiles = {} if tiling is None else {"tiles": _pallas_tiles.Tiles.of_block(*tiling)}
            return fn(*args, **options, **tiles, **kwargs)

        return call

    return composed(pallas(_pallas_thomas.solve_pnq), _without_states(pallas(_pallas_recurrence.recurrence_pnq)),
                    pallas(_pallas_thomas.factor_pnq),
                    functools.partial(_pallas_banded.solve_pnq, **options),
                    functools.partial(_pallas_block.solve_pnq, **options),
                    stack=backend != "pallas_triton")


def _tpu_kernels(backend: str, composed) -> Kernels:
    """The Pallas TPU kernels: every tridiagonal kind (transposed too), the factorization,
    the recurrences, banded and block-tridiagonal solves."""
    from .._banded import pallas_tpu as _tpu_banded
    from .._block import pallas_tpu as _tpu_block
    from .._recurrence import pallas_tpu as _tpu_recurrence
    from .._tridiagonal import pallas_tpu as _tpu_thomas
    from .._tridiagonal import pallas_tpu_chunks as _tpu_chunks

    # TPU interpret mode (`pltpu.InterpretParams`) runs through ordered callbacks, which a
    # primitive's lowering cannot hold: the backend runs Pallas's HLO interpreter instead, and
    # tests/tpu/ runs the kernels in TPU interpret mode directly.
    interpret = True if backend == "pallas_tpu_interpret" else None

    def solve(l, d, u, b, *, transposed, out_dtype, kind="thomas", tiling=None):
        del tiling
        return _tpu_thomas.solve_pnq(l, d, u, b, transposed=transposed, out_dtype=out_dtype,
                                     kind=kind, interpret=interpret)

    def factor(l, d, u, *, out_dtype, tiling=None):
        del tiling
        return _tpu_thomas.factor_pnq(l, d, u, out_dtype=out_dtype, interpret=interpret)

    def recurrence(a, x, h0, *, tiling=None, **kwargs):
        del tiling
        return _tpu_recurrence.recurrence_pnq(a, x, h0, interpret=interpret, **kwargs)

    def banded(ab, b, **kwargs):
        return _tpu_banded.solve_pnq(ab, b, interpret=interpret, **kwargs)

    def block(lower, diag, upper, b, **kwargs):
        return _tpu_block.solve_pnq(lower, diag, upper, b, interpret=interpret, **kwargs)

    # The partition method's sweeps as kernels of their own, the composed ones where those do
    # not apply (`_tridiagonal/pallas_tpu_chunks.py`).
    kernels = composed(solve, recurrence, factor, banded, block)
    return kernels._replace(
        chunk_ends=functools.partial(_tpu_chunks.chunk_ends_pnq, interpret=interpret,
                                     composed=kernels.chunk_ends),
        chunk_solve=functools.partial(_tpu_chunks.chunk_solve_pnq, interpret=interpret,
                                      composed=kernels.chunk_solve))
