"""Sharded inputs: every device solves the systems it holds, and the output keeps the sharding.

The kernels are custom calls, which XLA's SPMD partitioner cannot split: left alone it would
gather every operand onto every device and solve everything everywhere. The primitives'
lowerings therefore wrap the kernel in `jax.experimental.custom_partitioning`:

- every dimension but the solve (or time) axis is a batch dimension: it stays sharded as the
  operands are, and each device runs the kernel on its own block of systems, with no
  communication at all;
- a dimension where an operand has size 1 (a band broadcast against the right-hand side) is
  its own factor in the sharding rule, so a shared matrix stays replicated and is never copied;
- a split solve axis is solved in place where the primitive provides a `split` function (the
  partition method, `_long_systems/partition_method.py`), with one small all-gather per solve; otherwise
  (a factored solve, IndRNN's nonlinear recurrences, N not a multiple of the device count)
  the partitioner is told to gather that axis first: correct, but it moves the data.

On one device, and inside `shard_map` (where the code already runs per shard), the wrapper
lowers to the kernel directly, so unsharded programs are unchanged.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive, jaxpr_as_fun
from jax.interpreters import mlir
from jax.sharding import NamedSharding, PartitionSpec

from . import jax_private as _jax_private

_PARTITION = contextvars.ContextVar("tridiax_partition", default=False)
_DEVICE = contextvars.ContextVar("tridiax_lowering_device", default=None)


def partitioning() -> bool:
    """Whether a lowering registered by `register_lowering` runs for a program partitioned over
    several devices (then `partitioned` wraps the kernel; an op that needs its neighbours along
    the axis is better left to XLA's partitioner)."""
    return _PARTITION.get()


def lowering_device():
    """The first device of the program a `register_lowering` lowering runs for (None where
    JAX lowers without its device assignment): the TPU kernels ask it for the arrays' default
    layouts (`_pallas/tpu.py`, `physical_order`)."""
    return _DEVICE.get()


def register_lowering(primitive, fn: Callable, platform: str, *,
                      multiple_results: bool = False) -> None:
    """Register `mlir.lower_fun(fn)` as the primitive's lowering; `fn` may use `partitioned`.

    JAX lowers a jitted function without its device assignment unless the jaxpr holds a
    primitive that needs it, and custom_partitioning needs it to see the mesh: since ours
    appears only inside the primitive's lowering, the primitive is declared as needing the
    devices (a private JAX registry, present in jax 0.4.31 to 0.11). Where the assignment is
    still missing (some enclosing transformations hide the primitive from that check) or
    there is one device, `partitioned` returns the unpartitioned function: correct, and
    XLA gathers a sharded operand."""
    _jax_private.declare_needs_devices(primitive)
    lowered = mlir.lower_fun(fn, multiple_results=multiple_results)

    def rule(ctx, *args, **params):
        context = ctx.module_context.axis_context
        devices = getattr(context, "device_assignment", None)
        if hasattr(context, "device_assignment"):  # jit's ShardingContext
            partition = devices is not None and len(devices) > 1
        else:  # inside shard_map: custom_partitioning lowers to the per-shard function itself
            partition = True
        token = _PARTITION.set(partition)
        device_token = _DEVICE.set(devices[0] if devices else None)
        # Inside shard_map the operands vary over its mesh axes (`primitive.VaryingPrimitive`);
        # the lowering traces the program of one device, where that is not checked.
        ctx = ctx.replace(avals_in=[_jax_private.unvarying(a) for a in ctx.avals_in],
                          avals_out=[_jax_private.unvarying(a) for a in ctx.avals_out])
        try:
            # A Pallas Triton kernel inside warns of the backend's deprecation (jax >= 0.11):
            # tridiax chooses the backend and falls back once it is gone, so users see nothing.
            with _jax_private.quiet_triton_deprecation(), _jax_private.vma_unchecked():
                return lowered(ctx, *args, **params)
        finally:
            _PARTITION.reset(token)
            _DEVICE.reset(device_token)

    mlir.register_lowering(primitive, rule, platform=platform)


# The per-device function of a sharded call is lowered by JAX's partitioner, outside the
# primitives' lowering rules: it runs behind this primitive, whose lowering is as quiet.
_quiet_call_p = Primitive("tridiax_quiet_call")
_quiet_call_p.multiple_results = True
_quiet_call_p.def_abstract_eval(lambda *args, jaxpr: jaxpr.out_avals)


def _quiet_call_lowering(ctx, *args, jaxpr):
    with _jax_private.quiet_triton_deprecation():
        return mlir.lower_fun(jaxpr_as_fun(jaxpr), multiple_results=True)(ctx, *args)


mlir.register_lowering(_quiet_call_p, _quiet_call_lowering)


def _quietly_lowered(fn: Callable) -> Callable:
    """`fn`, whose lowering silences the Pallas Triton deprecation warning (as `rule` does)."""

    def call(*args):
        jaxpr, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
        outs = _quiet_call_p.bind(*args, jaxpr=jaxpr)
        return jax.tree.unflatten(jax.tree.structure(shapes), outs)

    return call


def partitioned(local: Callable, operand_shapes: Sequence[tuple[int, ...]],
                out_shapes: Sequence[tuple[int, ...]], axis: int, *,
                split: Callable | None = None, leading: Sequence[int] = (),
                trailing: int = 0, out_leading: Sequence[int] = ()) -> Callable:
    """`local(*operands)`, returning one array per `out_shapes` (a single array when there is
    one), partitioned along the batch dimensions.

    The operands' systems dimensions have one rank and broadcast to the full shape; each
    output has that shape, or size 1 along `axis` (a recurrence's final state). An operand may
    have dimensions of its own before them (`leading[j]` for operand j: a banded solve's band
    axis; `out_leading[j]` for output j: a banded factorization's stacked factors), and every
    operand and output the same number after them (`trailing`: a block solve's two block
    dimensions); those are never sharded. `local` must work on any block of
    the batch dimensions: it is traced again with each device's local shapes.

    `split(*operands, names=, devices=)`, if given, runs on each device when the inputs split
    `axis` over the mesh axes `names` into `devices` equal blocks of at least 2 rows (it may
    use collectives over `names`). Otherwise, or for an uneven split, `axis` is gathered.
    """
    single = len(out_shapes) == 1
    if not _PARTITION.get():
        return local
    leading = tuple(leading) + (0,) * (len(operand_shapes) - len(leading))
    operands = [(lead, tuple(shape[lead:len(shape) - trailing]))
                for lead, shape in zip(leading, operand_shapes, strict=True)]
    out_leading = tuple(out_leading) + (0,) * (len(out_shapes) - len(out_leading))
    outs = [(lead, tuple(shape[lead:len(shape) - trailing]))
            for lead, shape in zip(out_leading, out_shapes, strict=True)]
    full = tuple(np.broadcast_shapes(*(s for _, s in operands), *(s for _, s in outs)))
    ndim = len(full)

    def factors(lead, shape, owner):
        # A dimension of the full size shares the factor of that dimension; a broadcast
        # (size-1) one is a factor of its own, never sharded, as are leading and trailing ones.
        return " ".join([f"{owner}l{k}" for k in range(lead)]
                        + [f"d{k}" if shape[k] == full[k] else f"{owner}{k}" for k in range(ndim)]
                        + [f"{owner}t{k}" for k in range(trailing)])

    rule = (", ".join(factors(lead, s, f"in{j}_") for j, (lead, s) in enumerate(operands))
            + " -> " + ", ".join(factors(lead, s, f"out{j}_") for j, (lead, s) in enumerate(outs)))

    def systems_spec(sharding, lead):
        """The entries of `sharding`'s spec on the systems dimensions of an array with `lead`
        dimensions before them."""
        spec = tuple(sharding.spec) + (None,) * (lead + ndim)
        return spec[lead:lead + ndim]

    def specs(mesh, spec, axis_entry):
        """Per-operand shardings following `spec` (on the systems dimensions) on the batch
        dims and `axis_entry` (mesh axes, or None: replicated) on the axis, replicated on
        broadcast, leading and trailing dims; and the output's."""
        spec = spec[:axis] + (axis_entry,) + spec[axis + 1:]

        def follow(lead, shape):
            return NamedSharding(mesh, PartitionSpec(
                *(None,) * lead, *(spec[k] if shape[k] == full[k] else None for k in range(ndim)),
                *(None,) * trailing))

        out = tuple(follow(lead, s) for lead, s in outs)
        return tuple(follow(lead, s) for lead, s in operands), out[0] if single else out

    def partition(mesh, arg_shapes, result_shape):
        spec = systems_spec((result_shape if single else result_shape[0]).sharding, outs[0][0])
        # How the inputs split the axis (the output may not have it: a final state).
        entry = None
        for (lead, shape), arg in zip(operands, arg_shapes):
            if shape[axis] == full[axis] and arg.sharding is not None:
                entry = systems_spec(arg.sharding, lead)[axis] or entry
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        devices = math.prod(mesh.shape[name] for name in names)
        n = full[axis]
        if split is not None and names and n % devices == 0 and n // devices >= 2:
            name_arg = names[0] if len(names) == 1 else names

            def fn(*operands):
                return split(*operands, names=name_arg, devices=devices)

            operand_shardings, out_sharding = specs(mesh, spec, axis_entry=entry)
        else:
            fn = local
            operand_shardings, out_sharding = specs(mesh, spec, axis_entry=None)
        return mesh, _quietly_lowered(fn), out_sharding, operand_shardings

    def infer_sharding_from_operands(mesh, arg_shapes, result_shape):
        # GSPMD path (Shardy off): follow the operand with the most full-size dimensions.
        widest = max(range(len(arg_shapes)),
                     key=lambda j: sum(a == b for a, b in zip(operands[j][1], full)))
        spec = systems_spec(arg_shapes[widest].sharding, operands[widest][0])
        entry = spec[axis] if split is not None else None
        return specs(mesh, spec, axis_entry=entry)[1]

    wrapped = custom_partitioning(local if single else lambda *operands: tuple(local(*operands)))
    wrapped.def_partition(partition, infer_sharding_from_operands=infer_sharding_from_operands,
                          sharding_rule=rule,
                          need_replication_factors=() if split else (f"d{axis}",))
    return wrapped
