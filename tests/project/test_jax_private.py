"""Every private (or departing) JAX name tridiax uses has a fallback: remove each in turn.

Also: the Pallas Triton deprecation warning of jax >= 0.11 never reaches a user through
tridiax (while a user's own Pallas Triton kernel still warns), and a JAX without the Triton
backend falls through to the next backend instead of failing.
"""

import dataclasses
import importlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, dense_solve, random_bands

import tridiax
from tridiax import verify
from tridiax._core import backend as _backend
from tridiax._core import jax_private as _jax_private
from tridiax._pallas import tiles as _pallas_tiles
from tridiax._tridiagonal.api import solve

ORIGINAL_SHAPED_ARRAY = _jax_private.ShapedArray


def _without(monkeypatch, *missing):
    """Make `_jax_private._attribute` behave as if the named (module, attribute) were gone."""
    real = _jax_private._attribute

    def attribute(*candidates):
        return real(*(c for c in candidates if c not in missing))

    monkeypatch.setattr(_jax_private, "_attribute", attribute)


def test_shaped_array_falls_back_through_each_path(monkeypatch):
    assert _jax_private.shaped_array_type() is ORIGINAL_SHAPED_ARRAY
    _without(monkeypatch, ("jax.core", "ShapedArray"))
    assert _jax_private.shaped_array_type() is ORIGINAL_SHAPED_ARRAY
    _without(monkeypatch, ("jax.core", "ShapedArray"), ("jax._src.core", "ShapedArray"))
    assert _jax_private.shaped_array_type() is ORIGINAL_SHAPED_ARRAY
    aval = _jax_private.shaped_array_type()((3, 4), jnp.float32)
    assert aval.shape == (3, 4) and aval.dtype == jnp.float32


@pytest.mark.parametrize("missing", [(("jax.core", "Tracer"),),
                                     (("jax.core", "Tracer"), ("jax._src.core", "Tracer"))])
def test_tracer_check_falls_back(monkeypatch, missing):
    _without(monkeypatch, *missing)
    monkeypatch.setattr(_jax_private, "_TRACER", _jax_private.tracer_type())
    if len(missing) == 2:
        assert _jax_private._TRACER is None  # the class-name check runs
    seen = []

    def f(x):
        seen.append(_jax_private.is_tracer(x))
        return x

    jax.jit(f)(jnp.ones(3))
    jax.grad(lambda x: f(x).sum())(jnp.ones(3))
    jax.vmap(f)(jnp.ones(3))
    assert seen == [True, True, True]
    assert not _jax_private.is_tracer(jnp.ones(3))
    assert not _jax_private.is_tracer(np.ones(3))
    assert not _jax_private.is_tracer(2.0)


def test_device_registry_missing_is_not_an_error(monkeypatch):
    primitive = jax.extend.core.Primitive("tridiax_test_devices")
    assert _jax_private.declare_needs_devices(primitive)
    from jax._src import dispatch

    assert primitive in dispatch.prim_requires_devices_during_lowering
    _without(monkeypatch, ("jax._src.dispatch", "prim_requires_devices_during_lowering"))
    assert not _jax_private.declare_needs_devices(jax.extend.core.Primitive("other"))


def test_shard_map_typing_missing_leaves_other_calls_alone(monkeypatch):
    """Without JAX's typing of varying mesh axes (ManualAxisType, the check_vma state) the
    primitives are plain ones: solves and their gradients outside shard_map are unchanged."""
    _without(monkeypatch, ("jax.sharding", "ManualAxisType"), ("jax._src.core", "ManualAxisType"),
             ("jax._src.config", "_check_vma"))
    assert _jax_private._manual_axis_type() is None
    with _jax_private.vma_unchecked():
        pass
    l, d, u, b = (jnp.asarray(v) for v in random_bands((12, 3), np.float64, seed=4))
    aval = jax.typeof(b)
    assert _jax_private.unvarying(aval) is aval and _jax_private.with_varying(aval, frozenset(), aval) is aval
    x = jax.jit(lambda *a: solve(*a, axis=0, backend="xla"))(l, d, u, b)
    assert_close(x, verify.reference_solve(l, d, u, b, axis=0), np.float64)
    grad = jax.grad(lambda b: jnp.sum(solve(l, d, u, b, axis=0, backend="xla") ** 2))(b)
    want = jax.grad(lambda b: jnp.sum(dense_solve(l, d, u, b, 0) ** 2))(b)
    assert_close(grad, want, np.float64)


def _no_triton(monkeypatch):
    monkeypatch.setattr(_jax_private, "pallas_triton", lambda: None)
    monkeypatch.setattr(_pallas_tiles, "_TRITON", None)


def test_a_jax_without_triton_falls_through(monkeypatch):
    assert _backend.default_backend("cuda", jnp.float32) == (
        "pallas_triton" if _jax_private.pallas_triton() is not None else "xla")
    _no_triton(monkeypatch)
    for platform in ("cuda", "rocm"):
        assert _backend.default_backend(platform, jnp.float32) == "xla"
        assert _backend.default_backend(platform, jnp.float32, op="recurrence") == "xla"
    with pytest.raises(ValueError, match="has no Pallas Triton backend"):
        solve(*random_bands((5, 3)), axis=0, backend="pallas_triton")
    # The Pallas kernels still run in interpret mode, masking ragged tiles by selection.
    args = random_bands((9, 70, 3), np.float64, seed=4)
    for kind in ({}, {"pivoting": True}, {"periodic": True}):
        x = solve(*args, axis=1, backend="pallas_interpret", **kind)
        periodic = {"periodic": True} if "periodic" in kind else {}
        assert_close(x, verify.reference_solve(*args, axis=1, **periodic), np.float64)


def test_an_accelerated_triton_deprecation_counts_as_no_triton(monkeypatch):
    assert _jax_private.pallas_triton() is not None  # jax 0.10 and 0.11 have it
    deprecations = importlib.import_module("jax._src.deprecations")
    monkeypatch.setattr(deprecations, "is_accelerated",
                        lambda name: name == _jax_private.TRITON_DEPRECATION)
    assert _jax_private.pallas_triton() is None
    assert _backend.default_backend("cuda", jnp.float32) == "xla"
    # And a JAX that never registered the deprecation (0.10) is not accelerated.
    monkeypatch.setattr(deprecations, "is_accelerated",
                        lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert _jax_private.pallas_triton() is not None


TRITON_WARNING = ("The Pallas Triton backend is deprecated and will be removed in a future "
                  "JAX version.")


@pytest.fixture
def warning_jax(monkeypatch):
    """Make every Pallas lowering warn as jax >= 0.11 does for Triton (this jax may not)."""
    from jax._src.interpreters import mlir
    from jax._src.pallas.pallas_call import pallas_call_p

    entry = mlir._lowerings[pallas_call_p]  # a LoweringRuleEntry (rule, inline)
    lowering = entry.rule

    def warning_lowering(*args, **kwargs):
        warnings.warn(TRITON_WARNING, DeprecationWarning, stacklevel=2)
        return lowering(*args, **kwargs)

    monkeypatch.setitem(mlir._lowerings, pallas_call_p,
                        dataclasses.replace(entry, rule=warning_lowering))


def _lowering_warnings(f, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
    return [w for w in caught if "Pallas Triton" in str(w.message)]


def test_no_triton_deprecation_warning_reaches_users(warning_jax):
    args = [jnp.ones((64, 8), jnp.float32)] * 4
    assert _backend.default_backend("cuda", jnp.float32) == "pallas_triton"
    entry_points = [
        lambda *a: tridiax.solve_tridiagonal(*a, axis=0),
        lambda *a: tridiax.solve_periodic_tridiagonal(*a, axis=0, pivoting=True),
        jax.grad(lambda *a: jnp.sum(tridiax.solve_tridiagonal(*a) ** 2), argnums=(0, 1, 2, 3)),
        lambda a, x, *_: tridiax.linear_recurrence(a, x, axis=0),
        lambda a, x, *_: tridiax.IndRNN(8, 8, key=jax.random.PRNGKey(0))(x),
    ]
    for f in entry_points:
        assert _lowering_warnings(f, *args) == []
    # A user's own Pallas Triton kernel still warns: the filter is tridiax's alone.
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pltriton

    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    def user_kernel(x):
        return pl.pallas_call(copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              compiler_params=pltriton.CompilerParams())(x)

    # (jax >= 0.11 warns there itself as well as through the fixture: one or two warnings.)
    assert len(_lowering_warnings(user_kernel, jnp.ones((16, 16), jnp.float32))) >= 1


def test_gpu_generations_pick_their_backends(monkeypatch):
    # Hopper: Triton first, Mosaic GPU on request; Ampere: no Mosaic GPU; older: the XLA loop.
    f32 = jnp.dtype(jnp.float32)
    for capability, triton, mosaic in ((9.0, True, True), (8.0, True, False), (7.5, False, False)):
        monkeypatch.setattr(_backend, "_cuda_capability", lambda c=capability: c)
        assert (_backend.unavailable("pallas_triton", f32, platform="cuda") is None) == triton
        assert (_backend.unavailable("mosaic_gpu", f32, platform="cuda") is None) == mosaic
        assert _backend.default_backend("cuda", f32) == ("pallas_triton" if triton else "xla")
