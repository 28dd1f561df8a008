"""The calls into the C++ CPU kernels (`build.py` builds and registers them): operands in the
(P, N, Q) view, the planner's decisions (tiles, chunks, the tiles that hold rows in vector
registers, the cache a block tile fits in) passed on as FFI attributes, results out. Nothing
here decides: what the kernels do is the planner's (`_core/planner.py`) and the caller's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._core.dtypes import compute_dtype
from .._core.layout import broadcast_shape
from . import build

_KINDS = {"thomas": 0, "factored": 1, "periodic": 2, "pivoted": 3}
_LANES = {"q": 0, "p": 1, "c": 2, "cq": 3}


def _require():
    if not build.available():
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


def block_pnq(lower, diag, upper, b, *, kind: str, transposed: bool, out_dtype, cache: int):
    """Solve A x = b (A^T x = b when `transposed`, no conjugate) along axis 1 with the C++
    block-tridiagonal kernel (block.cc), the block Thomas algorithm of
    `_xla_block.solve_pnq`: `lower`, `diag`, `upper` (P|1, N|1, Q|1, k, k), block row i reading
    lower[i] x[i-1] + diag[i] x[i] + upper[i] x[i+1] (a size-1 axis is broadcast, never copied;
    lower[0] and upper[N-1] are never read), `b` (P, N, Q, k, m); `kind` "block",
    "block_pivoted" (partial pivoting inside each diagonal block) or "block_hermitian".
    Returns x, (P, N, Q, k, m) of `out_dtype`; float16/bfloat16 are solved in float32 and
    rounded once. `cache`: the bytes of a core's cache a tile's work should fit in (the
    planner's `cpu_cache_bytes`)."""
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
                transposed=bool(transposed), cache=np.int64(cache)).astype(out_dtype)
