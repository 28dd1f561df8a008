"""The C++ CPU kernels (cpu_kernels.cc): built on first use, registered as XLA FFI targets.

The library is compiled once per machine, source and jax version with the system C++
compiler against the headers jaxlib ships (`jax.ffi.include_dir()`), and cached in
$TRIDIAX_CACHE_DIR (default ~/.cache/tridiax); the build logs one line to the "tridiax"
logger (shown by default) saying so and where. Where no compiler is found or the build fails,
`available()` is False and the CPU falls back to the XLA formulation, with one warning that
says why; set TRIDIAX_NATIVE=0 to skip the native kernel altogether.
"""

from __future__ import annotations

import ctypes
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

from .._dtypes import compute_dtype
from .._layout import broadcast_shape

_SOURCE = pathlib.Path(__file__).with_name("cpu_kernels.cc")
_LOG = logging.getLogger("tridiax")
_THOMAS = "tridiax_thomas_cpu"
_RECURRENCE = "tridiax_recurrence_cpu"


def _cpu_flags() -> str:
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    return next((line for line in text.splitlines() if line.startswith("flags")), "")


def _compile(compiler: str, out: pathlib.Path) -> None:
    # -march=native: the library is cached per CPU (the key includes its feature flags).
    cmd = [compiler, "-O3", "-march=native", "-std=c++17", "-shared", "-fPIC",
           "-I", jax.ffi.include_dir(), str(_SOURCE), "-o", str(out), "-lpthread"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@functools.cache
def _library_path() -> pathlib.Path:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX or install g++)")
    key = hashlib.sha256(
        b"\0".join([_SOURCE.read_bytes(), jax.__version__.encode(), _cpu_flags().encode(),
                    compiler.encode()])
    ).hexdigest()[:16]
    cache = pathlib.Path(os.environ.get("TRIDIAX_CACHE_DIR", "~/.cache/tridiax")).expanduser()
    path = cache / f"cpu_kernels-{key}.so"
    if not path.exists():
        _LOG.warning(
            "tridiax: building the native CPU kernel, once per machine, compiler and jax version "
            "(about 10 s), into %s (TRIDIAX_CACHE_DIR); silence this with "
            "logging.getLogger('tridiax').setLevel(logging.ERROR)", path)
        start = time.perf_counter()
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            built = pathlib.Path(tmp) / path.name
            try:
                _compile(compiler, built)
            except subprocess.CalledProcessError as err:
                raise RuntimeError(f"building {_SOURCE.name} failed:\n{err.stderr}") from None
            os.replace(built, path)  # atomic: concurrent builders race harmlessly
        _LOG.info("tridiax: built %s in %.1f s", path.name, time.perf_counter() - start)
    return path


@functools.cache
def available() -> bool:
    """Whether the native CPU kernel is built and registered (builds it on first call)."""
    if os.environ.get("TRIDIAX_NATIVE", "1") == "0":
        return False
    try:
        library = ctypes.cdll.LoadLibrary(str(_library_path()))
        for target, symbol in ((_THOMAS, library.TridiaxThomasCpu),
                               (_RECURRENCE, library.TridiaxRecurrenceCpu)):
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(symbol), platform="cpu")
    except (OSError, RuntimeError) as err:
        warnings.warn(
            f"tridiax: the native CPU kernel is unavailable ({err}); using the slower XLA "
            "formulation on CPU.",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    return True


_KINDS = {"thomas": 0, "factored": 1, "periodic": 2, "pivoted": 3}


def solve_pnq(l, d, u, b, *, transposed: bool, out_dtype, kind: str = "thomas"):
    """Solve along axis 1 of (P|1, N|1, Q|1) operands with the C++ kernel; returns (P, N, Q).

    `kind` is "thomas", "factored", "periodic" or "pivoted", as in `_pallas_thomas.solve_pnq`.

    float16/bfloat16 operands are converted to float32 (the kernel computes in float32 or
    wider) and the result rounded back once.
    """
    if not available():
        raise RuntimeError("the native CPU kernel is unavailable; use backend='xla'.")
    cdt = compute_dtype(out_dtype)
    operands = [x.astype(cdt) for x in (l, d, u, b)]
    shape = broadcast_shape(*operands)
    call = jax.ffi.ffi_call(_THOMAS, jax.ShapeDtypeStruct(shape, cdt))
    return call(*operands, transposed=transposed, kind=np.int64(_KINDS[kind])).astype(out_dtype)


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


def recurrence_pnq(a, x, h0, *, reverse: bool, shifted: bool, activation, final_only: bool,
                   out_dtype):
    """Run along axis 1 of (P|1, T|1, Q|1) operands with the C++ kernel (see _xla_recurrence)."""
    if not available():
        raise RuntimeError("the native CPU kernel is unavailable; use backend='xla'.")
    cdt = compute_dtype(out_dtype)
    operands = [v.astype(cdt) for v in (a, x, h0)]
    P, T, Q = broadcast_shape(*operands)  # h0 has T = 1
    shape = (P, 1 if final_only else T, Q)
    call = jax.ffi.ffi_call(_RECURRENCE, jax.ShapeDtypeStruct(shape, cdt))
    return call(*operands, reverse=reverse, shifted=shifted,
                activation=np.int64(_activation_code(activation)),
                final_only=final_only).astype(out_dtype)
