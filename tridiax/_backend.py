"""Which implementation runs where: the one place that chooses a backend.

| name               | what runs                                          | default for                 |
|--------------------|----------------------------------------------------|-----------------------------|
| "native"           | C++ kernels `_kernels/cpu_kernels.cc` (XLA FFI)    | CPU (recurrences: identity, |
|                    |                                                    | relu and tanh activations)  |
| "xla"              | fori_loop formulations `_kernels/_xla_*.py`        | CPU without a C++ compiler, |
|                    |                                                    | other activations, TPU,     |
|                    |                                                    | complex on GPU              |
| "pallas_triton"    | Pallas kernels `_kernels/_pallas_*.py` via Triton  | CUDA and ROCm GPUs          |
| "pallas_interpret" | the same Pallas kernels in interpret mode (tests)  | never                       |

All four run the same algorithms with the same conventions and agree to rounding.
Mosaic GPU and Mosaic TPU kernels slot in here as further names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from . import _planner

BACKENDS: tuple[str, ...] = ("native", "xla", "pallas_triton", "pallas_interpret")


def default_backend(platform: str, dtype, *, activation=None, op: str = "thomas") -> str:
    """The backend used on `platform` ("cpu", "cuda", "rocm", "tpu") for `dtype`.

    `op` is "thomas" (tridiagonal solves) or "recurrence" (linear recurrences, IndRNN); the
    native CPU recurrence knows identity, relu and tanh, other activations run the XLA loop.
    """
    if platform == "cpu":
        from ._kernels import _native

        if op == "recurrence" and not _native.supports_recurrence(activation, dtype):
            return "xla"
        return "native" if _native.available() else "xla"
    if platform in ("cuda", "rocm") and not jnp.issubdtype(dtype, jnp.complexfloating):
        # Triton has no complex types; complex systems take the XLA formulation on GPU.
        return "pallas_triton"
    return "xla"


def supports(backend: str, dtype) -> bool:
    """Whether `backend` solves systems of `dtype` (Pallas kernels have no complex types)."""
    return not (backend.startswith("pallas") and jnp.issubdtype(dtype, jnp.complexfloating))


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
    if chunk and kind is not None and kind not in _planner.CHUNKED_KINDS:
        raise ValueError(
            "chunk applies to unpivoted solves: pivoted, pivoted periodic and factored solves "
            f"sweep each system whole (got chunk={chunk!r} for a {kind} solve); pass chunk=None.")
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


def check_backend(backend: str | None, dtype, *, activation=None) -> None:
    """Raise ValueError for a backend override that cannot run this dtype (or activation)."""
    if backend is None:
        return
    if backend not in BACKENDS:
        raise ValueError(f"backend must be None or one of {BACKENDS}, got {backend!r}.")
    if not supports(backend, dtype):
        raise ValueError(f"backend {backend!r} does not support {jnp.dtype(dtype)}; use 'xla'.")
    if backend == "native" and activation is not None:
        from ._kernels import _native

        if not _native.supports_recurrence(activation, dtype):
            raise ValueError("the native recurrence runs identity, relu and tanh (real dtypes), "
                             f"not {activation!r}; use backend='xla'.")


def _triton_params(tiles):
    # jax >= 0.10 picks Mosaic GPU for Pallas on GPU unless Triton's CompilerParams are passed
    # explicitly.
    from jax.experimental.pallas import triton as plgpu

    return plgpu.CompilerParams(num_warps=tiles.num_warps, num_stages=1)


class Kernels(NamedTuple):
    """A backend's kernels over (P|1, N|1, Q|1) operands (None where it has none):

    - `solve(l, d, u, b, *, transposed, out_dtype, kind, tiling)`: the tridiagonal kinds;
    - `chunk_ends`, `chunk_solve`: the partition method's sweeps (`_chunked.py`);
    - `factor(l, d, u, *, out_dtype, tiling)`: the factors of A = L D V;
    - `recurrence(a, x, h0, *, reverse, shifted, activation, final_only, out_dtype, tiling,
      chunk=0, gate=None)` and `recurrence_ends`: recurrences and their chunked sweep.

    `tiling` is the planner's tile choice (`_planner.Plan.tiling`)."""

    solve: Callable
    chunk_ends: Callable | None
    chunk_solve: Callable | None
    factor: Callable
    recurrence: Callable
    recurrence_ends: Callable | None


def _ignoring_tiling(fn):
    """`fn` (a kernel that tiles for itself) called with the planner's `tiling` dropped. Chunked
    and gated runs reach it only through `_composed_chunks`, which splits them or refuses."""

    def call(*args, tiling=None, **kwargs):
        del tiling
        return fn(*args, **kwargs)

    return call


def kernels(backend: str) -> Kernels:
    """The kernels of `backend` (see BACKENDS)."""
    from ._kernels import (
        _composed_chunks,
        _native,
        _pallas_recurrence,
        _pallas_thomas,
        _pallas_tiles,
        _xla_recurrence,
        _xla_thomas,
    )

    if backend == "native":
        return Kernels(_native.solve_pnq, _native.chunk_ends_pnq, _native.chunk_solve_pnq,
                       _native.factor_pnq, _native.recurrence_pnq, _native.recurrence_ends_pnq)
    if backend == "xla":
        solve = _ignoring_tiling(_xla_thomas.solve_pnq)
        # The chunk sweeps composed from the plain kernels (`_composed_chunks.py`).
        chunks = _composed_chunks.composed(solve, _ignoring_tiling(_xla_recurrence.recurrence_pnq))
        return Kernels(solve, chunks["chunk_ends"], chunks["chunk_solve"],
                       _ignoring_tiling(_xla_thomas.factor_pnq), chunks["recurrence"],
                       chunks["recurrence_ends"])
    if backend not in ("pallas_interpret", "pallas_triton"):
        raise ValueError(f"unknown backend {backend!r}")
    options = ({"interpret": True} if backend == "pallas_interpret"
               else {"compiler_params": _triton_params})

    def pallas(fn):
        def call(*args, tiling=None, **kwargs):
            tiles = {} if tiling is None else {"tiles": _pallas_tiles.Tiles.of_block(*tiling)}
            return fn(*args, **options, **tiles, **kwargs)

        return call

    solve = pallas(_pallas_thomas.solve_pnq)
    chunks = _composed_chunks.composed(solve, pallas(_pallas_recurrence.recurrence_pnq),
                                       stack=backend != "pallas_triton")
    return Kernels(solve, chunks["chunk_ends"], chunks["chunk_solve"],
                   _ignoring_tiling(_xla_thomas.factor_pnq), chunks["recurrence"],
                   chunks["recurrence_ends"])
