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

import functools

import jax.numpy as jnp
import numpy as np

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


def kernel(op: str, backend: str, *, block: tuple[int, int] | None = None):
    """The function running `op` ("thomas" or "recurrence") on (P|1, N|1, Q|1) operands.

    Every backend's module names its entry points alike: `solve_pnq` for the Thomas
    algorithm, `recurrence_pnq` for recurrences. `block`, a (bp, bq) tile of systems per
    program, applies to the Pallas kernels; the others choose their own tiling.
    """
    from ._kernels import (
        _native,
        _pallas_recurrence,
        _pallas_thomas,
        _pallas_tiles,
        _xla_recurrence,
        _xla_thomas,
    )

    entry = {"thomas": "solve_pnq", "recurrence": "recurrence_pnq"}[op]
    pallas = {"thomas": _pallas_thomas, "recurrence": _pallas_recurrence}[op]
    if backend == "native":
        return getattr(_native, entry)
    if backend == "xla":
        return getattr({"thomas": _xla_thomas, "recurrence": _xla_recurrence}[op], entry)
    tiles = {} if block is None else {"tiles": _pallas_tiles.Tiles.of_block(*block)}
    if backend == "pallas_interpret":
        return functools.partial(getattr(pallas, entry), interpret=True, **tiles)
    if backend == "pallas_triton":
        return functools.partial(getattr(pallas, entry), compiler_params=_triton_params, **tiles)
    raise ValueError(f"unknown backend {backend!r}")
