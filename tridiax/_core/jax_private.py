"""Every JAX name tridiax uses that is private, or public but on its way out, in one place.

Each has a fallback, so that a JAX release that moves or drops the name degrades one feature
with a clear message instead of breaking `import tridiax` (tests/project/test_jax_private.py removes
each name in turn and checks its fallback):

| name                                       | used for                     | fallback                      |
|--------------------------------------------|------------------------------|-------------------------------|
| jax.core.ShapedArray (jax._src.core)       | primitives' abstract values  | the type of `jax.typeof(x)`   |
| jax.core.Tracer (jax._src.core)            | "is this call traced?"       | a class named Tracer in the   |
|                                            |                              | value's type's MRO            |
| jax._src.dispatch.                         | custom_partitioning sees the | none: sharded operands are    |
|   prim_requires_devices_during_lowering    | mesh while lowering          | gathered (correct, slower)    |
| jax.experimental.pallas.triton             | the "pallas_triton" backend; | the backend is unavailable    |
|   (load/store with masks, CompilerParams)  | masked rows in interpret     | and the next one runs;        |
|                                            | mode                         | interpret masks by `where`    |
| jax._src.deprecations ("jax-pallas-        | Triton removed in all but    | not accelerated               |
|   triton" accelerated into an error)       | name                         |                               |
| jax.experimental.pallas.mosaic_gpu         | the "mosaic_gpu" backend     | the backend is unavailable    |
| jax._src.pallas.mosaic_gpu.interpret.      | the "mosaic_gpu_interpret"   | that backend is unavailable   |
|   params.InterpretGPUParams                | backend (tests on CPU)       |                               |
| jax.sharding.ManualAxisType (avals'        | tridiax's primitives inside  | `vma` (older JAX), else none: |
|   manual_axis_type; `vma` before jax 0.10) | shard_map with check_vma     | shard_map needs               |
| jax._src.config._check_vma                 | unchecked lowerings          | check_vma=False               |

The Triton backend's deprecation warning (jax >= 0.11) is silenced around tridiax's own
lowerings only (`quiet_triton_deprecation`: the primitives' lowering rules, and the per-device
functions of sharded calls, `_sharding._quietly_lowered`): a user cannot act on it, and
tridiax falls back on its own once the backend is gone. Other code's warnings are left alone.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings

import jax
import numpy as np


def _attribute(*candidates: tuple[str, str]):
    """The first (module, name) of `candidates` that imports, or None."""
    for module, name in candidates:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    return None


# --- Abstract values and tracers -------------------------------------------------------------


def shaped_array_type() -> type:
    """jax's ShapedArray class (public in jax 0.10 as jax.core.ShapedArray)."""
    found = _attribute(("jax.core", "ShapedArray"), ("jax._src.core", "ShapedArray"))
    return found if found is not None else type(jax.typeof(np.float32(0)))


ShapedArray = shaped_array_type()


def tracer_type() -> type | None:
    """jax's Tracer class, or None where no import path has it (`is_tracer` then looks at
    the class names)."""
    return _attribute(("jax.core", "Tracer"), ("jax._src.core", "Tracer"))


_TRACER = tracer_type()


def is_tracer(x) -> bool:
    """Whether `x` is a tracer (the call is being traced by jit, vmap, grad, ...)."""
    if _TRACER is not None:
        return isinstance(x, _TRACER)
    return any(cls.__name__ == "Tracer" for cls in type(x).__mro__)


# --- Lowering with the device assignment -----------------------------------------------------


def declare_needs_devices(primitive) -> bool:
    """Declare that lowering `primitive` needs the device assignment (a private JAX registry,
    present in jax 0.4.31 to 0.11); False where this JAX has no such registry."""
    registry = _attribute(("jax._src.dispatch", "prim_requires_devices_during_lowering"))
    if registry is None:
        return False
    registry.add(primitive)
    return True


# --- Pallas Triton ---------------------------------------------------------------------------

TRITON_DEPRECATION = "jax-pallas-triton"
_TRITON_WARNING = r"The Pallas Triton backend is deprecated"


def pallas_triton():
    """`jax.experimental.pallas.triton` (masked load/store, CompilerParams), or None where this
    JAX has no Triton backend: removed, or its deprecation accelerated into an error."""
    try:
        from jax.experimental.pallas import triton as module
    except ImportError:
        return None
    if not all(hasattr(module, name) for name in ("load", "store", "CompilerParams")):
        return None
    if _deprecation_accelerated(TRITON_DEPRECATION):
        return None
    return module


def _deprecation_accelerated(deprecation_id: str) -> bool:
    is_accelerated = _attribute(("jax._src.deprecations", "is_accelerated"))
    if is_accelerated is None:
        return False
    try:
        return bool(is_accelerated(deprecation_id))
    except (ValueError, KeyError):  # not registered in this JAX: not deprecated yet
        return False


# --- Pallas Mosaic GPU ----------------------------------------------------------------------

_MOSAIC_GPU_API = ("kernel", "SMEM", "Barrier", "copy_gmem_to_smem", "copy_smem_to_gmem",
                   "barrier_wait", "commit_smem", "wait_smem_to_gmem")


def pallas_mosaic_gpu():
    """`jax.experimental.pallas.mosaic_gpu` with what tridiax's kernels call, or None (the
    module needs absl-py: without it JAX wrongly asks for a GPU jaxlib)."""
    try:
        from jax.experimental.pallas import mosaic_gpu as module
    except ImportError:
        return None
    return module if all(hasattr(module, name) for name in _MOSAIC_GPU_API) else None


def mosaic_gpu_interpreter():
    """The Mosaic GPU interpreter's parameter class (private, jax >= 0.10.2), or None."""
    return _attribute(("jax._src.pallas.mosaic_gpu.interpret.params", "InterpretGPUParams"))


@contextlib.contextmanager
def quiet_triton_deprecation():
    """Silence the Pallas Triton deprecation warning raised inside the block (tridiax's own
    lowerings); every other warning passes."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TRITON_WARNING, category=DeprecationWarning)
        yield


# --- shard_map's typing of how values vary over its mesh axes (check_vma) -------------------


def _manual_axis_type(**axes):
    """A jax.sharding.ManualAxisType (jax >= 0.10), or None where JAX has none."""
    kind = _attribute(("jax.sharding", "ManualAxisType"), ("jax._src.core", "ManualAxisType"))
    return None if kind is None else kind(**{k: frozenset(v) for k, v in axes.items()})


def varying_axes(aval) -> frozenset:
    """The mesh axes (inside shard_map) over which values of `aval` vary."""
    kind = getattr(aval, "manual_axis_type", None)
    if kind is not None:
        return frozenset(kind.varying)
    return frozenset(getattr(aval, "vma", None) or ())


def with_varying(aval, axes, like):
    """`aval` declared to vary over the mesh `axes`, as `like` (an operand's aval, varying over
    some of them) does: its mesh (shard_map's, whose manual axes these are) goes with it."""
    if not axes:
        return aval
    if getattr(aval, "manual_axis_type", None) is not None:
        kind = _manual_axis_type(varying=axes)
        if kind is None:
            return aval
        unsharded = jax.sharding.NamedSharding(like.sharding.mesh,
                                               jax.sharding.PartitionSpec(*[None] * aval.ndim))
        return aval.update(sharding=unsharded, manual_axis_type=kind)
    if hasattr(aval, "vma"):
        return aval.update(vma=frozenset(axes))
    return aval


def unvarying(aval):
    """`aval` without varying mesh axes (for tracing a lowering, where they are unchecked)."""
    if not varying_axes(aval):
        return aval
    if getattr(aval, "manual_axis_type", None) is not None:
        kind = _manual_axis_type()
        return aval if kind is None else aval.update(manual_axis_type=kind)
    return aval.update(vma=frozenset())


def _vary(value, axes):
    """`value` cast to vary over the mesh `axes` too."""
    missing = tuple(sorted(axes - varying_axes(jax.typeof(value))))
    if not missing:
        return value
    cast = getattr(jax.lax, "pcast", None)
    return cast(value, missing, to="varying") if cast else jax.lax.pvary(value, missing)


def vary_together(args):
    """`args`, each cast to vary over every mesh axis any of them varies over: inside shard_map
    (with check_vma, its default) a primitive's operands must agree, and JAX's own primitives
    cast theirs the same way. Outside shard_map nothing varies and `args` come back as they
    are."""
    union = frozenset().union(*(varying_axes(jax.typeof(a)) for a in args))
    return [_vary(a, union) for a in args] if union else args


def struct_of(aval):
    """A ShapeDtypeStruct of `aval`, varying over the mesh axes it varies over (an argument of
    jax.linear_transpose inside shard_map: one that did not vary would have its cotangent
    summed over the devices there, and again where the primitive's operands were cast)."""
    if varying_axes(aval):
        if getattr(aval, "manual_axis_type", None) is not None:
            return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=aval.sharding,
                                        manual_axis_type=aval.manual_axis_type)
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype, vma=aval.vma)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype)


def vma_unchecked():
    """A context in which JAX does not check how values vary over shard_map's mesh axes: a
    lowering rule traces the one program every device runs, where that typing says nothing
    (pallas_call traces its kernels the same way)."""
    state = _attribute(("jax._src.config", "_check_vma"))
    return contextlib.nullcontext() if state is None else state(False)
