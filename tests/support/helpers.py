"""Problem builders and independent references for the tests."""

from __future__ import annotations

import functools
import gc
import re

import jax
import jax.numpy as jnp
import numpy as np

CPU_BACKENDS = ("native", "xla", "pallas_interpret")
GPU_BACKENDS = ("pallas_triton", "mosaic_gpu", "xla")  # each where it runs the dtype


def backends(dtype=np.float64, op: str = "thomas") -> tuple[str, ...]:
    """Every backend that runs `op` in `dtype` on this machine's default device. The default
    is float64, the tests' data unless they say otherwise (on a GPU, Mosaic GPU runs only
    16- and 32-bit floats)."""
    from tridiax._core.backend import device_platform, unavailable

    platform = device_platform(jax.devices()[0])  # "cpu", "cuda", "rocm", ...
    found = GPU_BACKENDS if platform in ("cuda", "rocm") else CPU_BACKENDS
    return tuple(b for b in found if unavailable(b, np.dtype(dtype), platform=platform, op=op) is None)


# Tolerances relative to the solution's size, per dtype.
RTOL = {
    np.dtype(np.float16): 2e-2,
    np.dtype(jnp.bfloat16): 1e-1,
    np.dtype(np.float32): 2e-5,
    np.dtype(np.complex64): 2e-5,
    np.dtype(np.float64): 1e-12,
    np.dtype(np.complex128): 1e-12,
}


def random_bands(shape, dtype=np.float64, *, seed=0, dominant=True, shapes=None):
    """lower, diag, upper, rhs as NumPy arrays; `shapes` gives each its own (broadcast) shape."""
    rng = np.random.default_rng(seed)
    shapes = shapes or (shape,) * 4
    dtype = np.dtype(dtype)

    def draw(s):
        x = rng.uniform(-1, 1, s)
        if np.issubdtype(dtype, np.complexfloating):
            x = x + 1j * rng.uniform(-1, 1, s)
        return x

    lower, upper, rhs = draw(shapes[0]), draw(shapes[2]), draw(shapes[3])
    diag = draw(shapes[1])
    if dominant:
        diag = diag + 3 * np.where(np.real(diag) >= 0, 1, -1)
    return [np.asarray(a).astype(dtype) for a in (lower, diag, upper, rhs)]


def dense_matrix(lower, diag, upper):
    """(..., N, N) dense matrices from bands along the last axis (jnp, differentiable)."""
    n = diag.shape[-1]
    eye_sub = jnp.eye(n, k=-1, dtype=diag.dtype)
    eye_sup = jnp.eye(n, k=1, dtype=diag.dtype)
    # Row i: lower[i] at column i-1, upper[i] at column i+1.
    return (lower[..., :, None] * eye_sub + diag[..., :, None] * jnp.eye(n, dtype=diag.dtype)
            + upper[..., :, None] * eye_sup)


def dense_numpy(lower, diag, upper, axis=-1, periodic=False):
    """(batch..., N, N) matrices from bands along `axis`, built with NumPy indexing
    (independent of Tridiagonal.as_matrix); cyclic corners when `periodic`."""
    lo, di, up = (np.moveaxis(np.asarray(b), axis, -1) for b in np.broadcast_arrays(lower, diag, upper))
    n = di.shape[-1]
    a = np.zeros(di.shape + (n,), np.result_type(di, lo, up, np.float64))
    i = np.arange(n)
    a[..., i, i] = di
    a[..., i[1:], i[:-1]] = lo[..., 1:]
    a[..., i[:-1], i[1:]] = up[..., :-1]
    if periodic:
        a[..., 0, n - 1] += lo[..., 0]
        a[..., n - 1, 0] += up[..., n - 1]
    return a


def dense_solve(lower, diag, upper, rhs, axis):
    """Independent reference: jnp.linalg.solve on dense matrices (differentiable)."""
    arrays = jnp.broadcast_arrays(*(jnp.asarray(a) for a in (lower, diag, upper, rhs)))
    lower, diag, upper, rhs = (jnp.moveaxis(a, axis, -1) for a in arrays)
    a = dense_matrix(lower, diag, upper)
    x = jnp.linalg.solve(a, rhs[..., None])[..., 0]
    return jnp.moveaxis(x, -1, axis)


def numpy_loop(a, x, axis=0, reverse=False, initial=None, activation=lambda v: v):
    """Independent reference: a Python loop over time in float64/complex128 NumPy."""
    a, x = np.broadcast_arrays(np.asarray(a), np.asarray(x))
    a, x = np.moveaxis(a, axis, 0), np.moveaxis(x, axis, 0)
    dtype = np.result_type(a, x, np.float64)
    h = np.zeros(x.shape[1:], dtype) if initial is None else np.broadcast_to(initial, x.shape[1:])
    out = np.zeros(x.shape, dtype)
    for t in (range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])):
        h = activation(a[t] * h + x[t])
        out[t] = h
    return np.moveaxis(out, 0, axis)


# Caches of compiled programs (`program_cache`), emptied by `release_programs`.
_PROGRAM_CACHES = []


def program_cache(fn):
    """functools.cache for a function that returns compiled programs, emptied with JAX's own
    caches by `release_programs` (tests/conftest.py calls it as a worker's memory maps fill)."""
    cached = functools.cache(fn)
    _PROGRAM_CACHES.append(cached)
    return cached


def release_programs():
    """Drop every compiled program the tests hold: JAX's caches and the `program_cache`s. Each
    XLA:CPU executable keeps a few memory maps, and a process that reaches the kernel's limit
    (vm.max_map_count) crashes inside XLA's compiler."""
    for cache in _PROGRAM_CACHES:
        cache.cache_clear()
    jax.clear_caches()
    gc.collect()


def compile_unoptimized(fn, *args, **options):
    """jax.jit(fn) compiled for arrays like `args` at XLA's optimization level 0 (plus any
    other compiler `options`): a loop-heavy reference compiles in a fraction of the time, and
    runs as often as a test needs without compiling again."""
    return jax.jit(fn).lower(*args).compile(
        compiler_options={"xla_backend_optimization_level": 0, **options})


def wide(dtype):
    """The float64/complex128 dtype the references compute in."""
    return np.complex128 if np.issubdtype(np.dtype(dtype), np.complexfloating) else np.float64


def assert_close(actual, expected, dtype, factor=1.0):
    actual = np.asarray(actual, dtype=np.complex128 if np.iscomplexobj(actual) else np.float64)
    expected = np.asarray(expected)
    scale = max(np.max(np.abs(expected)), 1e-30)
    err = np.max(np.abs(actual - expected)) / scale if expected.size else 0.0
    assert err <= factor * RTOL[np.dtype(dtype)], f"relative error {err:.2e} for {dtype}"


def program_shape(lowered) -> str:
    """A lowered program's text, Triton kernels' IR decoded in place of their serialized
    payloads, with every number replaced by 0: what stays when only sizes change."""
    text = re.sub(r'ir = "(?:[^"\\]|\\.)*"', "ir = <kernel>", lowered.as_text())
    texts = [text, *triton_kernels(lowered)] if "triton" in text else [text]
    return re.sub(r"\d+", "0", "\n".join(texts))


def triton_kernels(lowered) -> list[str]:
    """Text of the Triton IR of every Pallas kernel in a module lowered for CUDA."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir
    from jax._src.lib.triton import dialect as tt_dialect

    blobs = []

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    if child.operation.name == "stablehlo.custom_call":
                        target = ir.StringAttr(child.attributes["call_target_name"]).value
                        if "triton" in target:
                            blobs.append(_triton_payload(child))
                    walk(child.operation)

    walk(lowered.compiler_ir("stablehlo").operation)
    texts = []
    for kind, blob in blobs:
        if kind == "text":
            texts.append(blob)
            continue
        context = jax_mlir.make_ir_context()
        tt_dialect.register_dialect(context)
        with context:
            texts.append(str(ir.Module.parse(blob)))
    return texts


def _triton_payload(op):
    """jaxlib <= 0.10.2 embeds the Triton module as bytecode ("ir"); later versions compile it
    at lowering time and embed a zlib-compressed proto holding the module's text ("opaque")."""
    import zlib

    from jax._src.lib.mlir import ir

    names = set(op.attributes)
    key = "mhlo.backend_config" if "mhlo.backend_config" in names else "backend_config"
    config = ir.DictAttr(op.attributes[key])
    if "ir" in config:
        return "bytecode", ir.StringAttr(config["ir"]).value_bytes
    payload = zlib.decompress(ir.StringAttr(config["opaque"]).value_bytes)
    return "text", payload.decode("latin-1")


def equations(jaxpr, primitive: str) -> list:
    """Every equation of `primitive` in a (closed) jaxpr, nested jaxprs (jit, scan, ...)
    included, in program order."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == primitive:
            found.append(eqn)
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    found.extend(equations(sub, primitive))
    return found


def factors_by_loop(lo, di, up, axis):
    """(l, m, c') of A = L D V by a Python loop over the rows, in float64 / complex128."""
    lo, di, up = (np.moveaxis(np.asarray(v, np.complex128), axis, 0)
                  for v in np.broadcast_arrays(lo, di, up))
    l, m, c = np.zeros_like(lo), np.zeros_like(lo), np.zeros_like(lo)
    for i in range(lo.shape[0]):
        m[i] = 1 / (di[i] - (lo[i] * c[i - 1] if i else 0))
        l[i] = lo[i] * m[i - 1] if i else 0
        c[i] = up[i] * m[i] if i < lo.shape[0] - 1 else 0
    return tuple(np.moveaxis(v, 0, axis) for v in (l, m, c))


# The systems PDE users solve, for the accuracy tests and benchmarks/bench_accuracy.py. Each
# gives (lower, diag, upper) of shape (batch, n), float64 (complex128 for "schrodinger").
PDE_SYSTEMS = ("poisson", "poisson_shifted", "heat_1", "heat_1e2", "heat_1e4", "upwind", "spline",
               "schrodinger")
PERIODIC_SYSTEMS = ("ring_heat_1e2", "ring_shifted", "ring_spline")


def pde_bands(name: str, n: int, batch: int = 1, *, seed: int = 0):
    """Bands of `batch` systems of n rows:

    - "poisson": the Dirichlet Laplacian (2, -1), condition ~ n^2;
    - "poisson_shifted": (2 + 1e-6, -1), nearly singular (condition ~ 4e6 for long systems);
    - "heat_<r>": an implicit Euler heat step I - r D2, (1 + 2r, -r);
    - "upwind": an implicit step of advection-diffusion u_t + u_x = 1e-2 u_xx on [0, 1], upwind
      differences, dt = 1e-2: a nonsymmetric M-matrix;
    - "spline": natural cubic spline knots with uneven spacings h in [0.01, 1] (a different
      draw per system): (h[i-1], 2 (h[i-1] + h[i]), h[i]);
    - "schrodinger": Crank-Nicolson for i u_t = -u_xx, (1 + 10i, -5i), complex;
    - periodic rings (corners lower[0], upper[n-1]): "ring_heat_1e2" (a heat step, r = 1e2),
      "ring_shifted" ((2 + 1e-4, -1), nearly singular), "ring_spline" (a periodic spline with
      uneven spacings).
    """
    rng = np.random.default_rng(seed)
    full = (batch, n)
    ring = name.startswith("ring_")
    base = name[len("ring_"):] if ring else name
    if base == "poisson":
        lower, diag = np.full(full, -1.0), np.full(full, 2.0)
        upper = lower.copy()
    elif base in ("poisson_shifted", "shifted"):
        lower, diag = np.full(full, -1.0), np.full(full, 2.0 + (1e-4 if ring else 1e-6))
        upper = lower.copy()
    elif base.startswith("heat_"):
        r = float(base[len("heat_"):])
        lower, diag = np.full(full, -r), np.full(full, 1 + 2 * r)
        upper = lower.copy()
    elif base == "upwind":
        h, dt, D, v = 1.0 / n, 1e-2, 1e-2, 1.0
        lower = np.full(full, -dt * (D / h**2 + v / h))
        upper = np.full(full, -dt * D / h**2)
        diag = 1 - lower - upper
    elif base == "spline":
        h = rng.uniform(0.01, 1.0, (batch, n + 1))
        if ring:
            h[:, n] = h[:, 0]  # the spacing that wraps around
        lower, upper = h[:, :-1].copy(), h[:, 1:].copy()
        diag = 2 * (h[:, :-1] + h[:, 1:])
    elif base == "schrodinger":
        lower, diag = np.full(full, -5j), np.full(full, 1 + 10j)
        upper = lower.copy()
    else:
        raise ValueError(f"unknown system {name!r}")
    return lower, diag, upper


def pde_rhs(shape, dtype, *, seed: int = 1):
    """A random right-hand side of `shape` (standard normal parts) in `dtype`."""
    rng = np.random.default_rng(seed)
    b = rng.standard_normal(shape)
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        b = b + 1j * rng.standard_normal(shape)
    return b.astype(dtype)


def truth_dtype(dtype):
    """A dtype whose sequential sweep is exact for errors measured in `dtype`: float64 for
    float32, NumPy's long double (80-bit on x86-64) for float64, and likewise for complex."""
    return {np.dtype(np.float32): np.float64, np.dtype(np.complex64): np.complex128,
            np.dtype(np.float64): np.longdouble,
            np.dtype(np.complex128): np.clongdouble}[np.dtype(dtype)]


def relative_error(x, truth) -> float:
    """||x - truth|| / ||truth|| over the whole array, in the truth's precision."""
    truth = np.asarray(truth)
    x = np.asarray(x).astype(truth.dtype)
    return float(np.linalg.norm((x - truth).ravel()) / np.linalg.norm(truth.ravel()))


def over_dtypes(*dtypes):
    """Runs a test of a `BackendContract` once for each of `dtypes` its class's backend runs,
    as its `dtype` argument."""

    def mark(test):
        test.dtypes = dtypes
        return test

    return mark


def dtype_id(dtype) -> str:
    """A dtype's name, for test ids."""
    return np.dtype(dtype).name


class BackendContract:
    """The base of a family's contract: the tests every backend passes, in a class each
    backend's test module subclasses, setting `backend`. A subclass whose backend does not run
    on this machine's default device (see `backends`) is not collected: pytest collects a class
    unless its `__test__` is false, so nothing is reported for it, skipped or otherwise. A test
    marked `over_dtypes` runs in each of those dtypes the backend runs (`runs`).

    `wide` is the widest real dtype the backend runs on this machine's default device:
    np.float64 where it runs float64, else np.float32 (Mosaic GPU on an NVIDIA GPU). A test
    not marked `over_dtypes` takes its data, its expected dtype and its tolerance in `wide`
    (its references may still compute in float64 from the rounded inputs), so that a backend
    without 64-bit types runs it in 32 bits; a test about float64 itself is marked
    `over_dtypes(np.float64)`. Set for each collected subclass, unless its body sets it."""

    backend: str
    wide: type = np.float64

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.__test__ = getattr(cls, "backend", None) in backends(np.float32)  # in any dtype
        if cls.__test__ and "wide" not in cls.__dict__:
            cls.wide = np.float64 if cls.runs(np.float64) else np.float32

    @classmethod
    def runs(cls, dtype) -> bool:
        """Whether this backend runs `dtype` on this machine's default device."""
        return cls.backend in backends(dtype)

    def pytest_generate_tests(self, metafunc):
        dtypes = getattr(metafunc.function, "dtypes", None)
        if dtypes is not None:
            metafunc.parametrize("dtype", [t for t in dtypes if self.runs(t)], ids=dtype_id)


def cases(argnames, attribute):
    """Parametrize a test of a `KernelContract` over `attribute`, a list of cases the backend's
    class holds (so that a slow backend can narrow them)."""
    def mark(test):
        test.cases = (argnames, attribute)
        return test

    return mark


def case_id(value):
    if isinstance(value, type | np.dtype):
        return np.dtype(value).name
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    return None


class KernelContract:
    """The base of a kernel's contract whose tests take their cases from class attributes
    (`cases`): each backend's subclass runs the cases it holds."""

    def pytest_generate_tests(self, metafunc):
        if spec := getattr(metafunc.function, "cases", None):
            argnames, attribute = spec
            metafunc.parametrize(argnames, getattr(self, attribute), ids=case_id)


def epsilons(dtype):
    """eps of `dtype` and of the dtype it is solved in (float32 for half precision)."""
    dtype = np.dtype(dtype)
    work = np.float32 if dtype.itemsize == 2 else dtype
    return float(jnp.finfo(dtype).eps), float(jnp.finfo(work).eps)


def assert_within_condition(got, want, dtype, cond, *, axes, factor):
    """In every system (the entries of `want` along `axes`): max |got - want| <= (eps + factor
    eps_work cond) max |want|, eps of `dtype`, eps_work of the dtype solved in, cond of each
    system (the shape left when `axes` are reduced)."""
    got = np.asarray(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.all(np.isfinite(got)), "non-finite entries"
    if not want.size:
        return
    got = got.astype(np.result_type(want, np.float64))
    eps, work = epsilons(dtype)
    scale = np.maximum(np.max(np.abs(want), axis=axes), np.finfo(np.float64).tiny)
    err = np.max(np.abs(got - want), axis=axes) / scale
    bound = eps + factor * work * np.maximum(cond, 1)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), (f"system {worst}: error {err[worst]:.3g} > {bound[worst]:.3g} "
                                  f"(cond {np.broadcast_to(cond, err.shape)[worst]:.3g})")


def count_factor_kernel_runs(monkeypatch, factors):
    """A Counter of the calls of a family's factor and factored-solve kernels (`factors`: its
    `pallas_tpu_factors` module), by name and `transposed`, that launched a Pallas kernel
    (rather than falling back to XLA's loops)."""
    import collections

    from tridiax._pallas import tpu as _tpu

    runs, launched, call = collections.Counter(), [], _tpu.call

    def counted_call(*args, **options):
        launched.append(options["name"])
        return call(*args, **options)

    monkeypatch.setattr(_tpu, "call", counted_call)
    for name in ("factor_pnq", "factored_solve_pnq"):
        def counted(*args, _kernel=getattr(factors, name), _name=name, **options):
            before = len(launched)
            out = _kernel(*args, **options)
            if len(launched) > before:
                runs[_name, options.get("transposed")] += 1
            return out

        monkeypatch.setattr(factors, name, counted)
    return runs


def check_factor_primitives(factor_and_solve, matrix, b, runs):
    """A family's factorization primitives on the interpreted TPU backend:
    `factor_and_solve(backend, matrix, b)` (the factors, a factored solve and its cotangent)
    equals XLA's, each kernel ran once (`runs`: `count_factor_kernel_runs`'s counter); under
    vmap (a leading batch dimension of the matrix, a pytree of arrays, and of b; of the matrix
    alone; of b alone) each system's result is the unbatched one."""
    backend = "pallas_tpu_interpret"
    got, want = factor_and_solve(backend, matrix, b), factor_and_solve("xla", matrix, b)
    assert runs == {("factor_pnq", None): 1, ("factored_solve_pnq", False): 1,
                    ("factored_solve_pnq", True): 1}
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=1e-6)
    stacked_matrix = jax.tree.map(lambda x: jnp.stack([x, 2 * x]), matrix)
    stacked_b = jnp.stack([b, -b])
    for in_axes in ((0, 0), (0, None), (None, 0)):
        batched = jax.vmap(functools.partial(factor_and_solve, backend), in_axes)(
            stacked_matrix if in_axes[0] == 0 else matrix, stacked_b if in_axes[1] == 0 else b)
        for n in range(2):
            one = factor_and_solve(
                backend, jax.tree.map(lambda x: x[n], stacked_matrix) if in_axes[0] == 0 else matrix,
                stacked_b[n] if in_axes[1] == 0 else b)
            for g, w in zip(jax.tree.leaves(batched), jax.tree.leaves(one), strict=True):
                g = g[n] if g.ndim > w.ndim else g  # factors of an unbatched matrix stay unbatched
                np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=1e-6)
