"""`recurrence_p`: h[t] = act(a[t]*h[t-1] + x[t]) along an axis, as a JAX primitive.

Operands `a`, `x`, `h0` share one rank and broadcast together; `h0` has size 1 along `axis`.
Params: `axis`, `reverse` (run from the end: h[t] = act(a[t]*h[t+1] + x[t])), `shifted` (the
state is multiplied by `a` at the previous step's index, zero at the first step: what the
transpose of a linear recurrence runs), `activation` (None for the linear recurrence, else an
elementwise function), `final_only` (return only the last state, shape 1 along `axis`),
`backend` (None = per platform, see `_core/backend.py`), `chunk` (None: the planner decides whether
to split long sequences into chunks, `_core/planner.py`; 0: never; m: chunks of m steps).

Differentiation (never through the loop):
- JVP, linear: h' = recurrence(a, x' + a' * h_prev, h0') with the same kernel;
  nonlinear: with d = act'(pre), h' = recurrence(d * a, d * (x' + a' * h_prev), h0'), a linear
  recurrence, so reverse mode and second order come from the linear rules.
- Transpose (linear, w.r.t. x and h0): the reverse-time recurrence
  dh[t] = g[t] + a[t+1]*dh[t+1] (the same kernel, `shifted`), and h0_bar = a[first]*dh[first].
  The cotangent of `a` (dh[t] * h[t-1]) follows from the JVP's elementwise product.
- Batching adds a batch dimension and shifts `axis`, as for the tridiagonal solve.

`gated_recurrence_p` is the linear recurrence the derivatives of a nonlinear one run,
h[t] = s[t] * (c[t]*h[t-1] + x[t]) with the slope s = act'(.) read from the nonlinear
recurrence's states (operand `states`, param `gate`: relu or tanh, whose derivative is a function
of their output). The native and TPU kernels compute s inside the sweep, so neither s nor s*a
is ever written to memory; other backends materialize them. Its transpose is the reverse-time gated
recurrence z[t] = s[t] * (g[t] + c[t+1]*z[t+1]) with the same gate.

A real coefficient constant in time (IndRNN's weight, a decay per sequence) has the cotangent
sum_t g[t] * h[t-1], which XLA would form in a pass of its own over g and h. Its JVP binds
`recurrence_tangent_p` instead, the same tangent recurrence (gated or not) as one primitive
linear in (x', h0', a'), whose transpose binds `recurrence_sums_p`: the reverse-time run and the
sum over its steps of the state entering each step times the states h there, which the TPU
kernel forms in the sweep (`_recurrence/pallas_tpu.py`, `sums`; gated, from the rows it reads
for the slope), and XLA after the run elsewhere. A linear run whose time axis is split
across devices keeps running in place, each device summing its block from the state entering
it (`_long_systems/partition_method.py`, `recurrence_split`). Both primitives are composed of
the ones above for their JVPs and other lowerings, so higher orders work as before.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.interpreters import ad, batching

from .._core import along_axis as _along
from .._core import backend as _backend
from .._core import layout as _layout
from .._core import planner as _planner
from .._core import sharding as _sharding
from .._core.jax_private import ShapedArray
from .._core.primitive import VaryingPrimitive, def_jit_impl
from .._long_systems import chunked as _chunked
from .._long_systems import partition_method as _partition_method

recurrence_p = VaryingPrimitive("tridiax_recurrence")


def_jit_impl(recurrence_p)


def _out_shape(full, axis, final_only):
    return full[:axis] + (1,) + full[axis + 1 :] if final_only else full


@recurrence_p.def_abstract_eval
def _abstract_eval(a, x, h0, *states, axis, final_only, **_):
    full = _layout.broadcast_shape(a, x, h0, *states)  # h0 has size 1 along axis
    return ShapedArray(_out_shape(full, axis, final_only), x.dtype)


def _lowering(platform: str):
    def run(a, x, h0, *states, axis, reverse, shifted, final_only, backend, chunk,
            activation=None, gate=None, sums=False):
        full = _layout.broadcast_shape(a, x, h0, *states)
        out = _out_shape(full, axis, final_only)
        if 0 in full:
            zeros = jnp.zeros(out, x.dtype)
            return (zeros, jnp.zeros(_out_shape(full, axis, True), x.dtype)) if sums else zeros
        backend = backend or _backend.default_backend(platform, x.dtype, activation=activation,
                                                      op="recurrence")
        kernels = _backend.kernels(backend)
        linear = activation is None
        # The gate's slope computed in the sweep (the native and TPU kernels know every
        # activation that gates, relu and tanh; the TPU kernel in real dtypes, unchunked, which
        # a TPU recurrence is unless told otherwise), else materialized.
        on_tpu = backend in _planner.TPU_BACKENDS and not chunk and not jnp.iscomplexobj(x)
        in_kernel = _gates(gate) and (backend == "native" or on_tpu)
        # Sums (`sums`) formed in the sweep by the TPU kernel, else by XLA after the run.
        kernel_sums = on_tpu and not any(map(jnp.iscomplexobj, states))

        def plan(P, T, Q, override, gated=False):
            return _planner.recurrence_plan(backend, platform, P, T, Q, x.dtype, linear=linear,
                                            chunk=override, gated=gated)

        def local_recurrence(a, x, h0, *states, shifted=False, final_only, sums=False):
            """The sequences one device holds (all of them when unsharded); with `sums`, also
            the sum over the steps of the state entering each step times `states`."""
            operands, along, back = (a, x, h0, *states), axis, lambda h: h
            if backend in _planner.TPU_BACKENDS:
                from .._pallas import tpu as _tpu  # the operands as TPU memory holds them

                operands, along, back = _tpu.in_physical_order(operands, axis, x.dtype)
            h, total = run_along(along, *operands, shifted=shifted, final_only=final_only,
                                 sums=sums)
            if not sums:
                return back(h)
            h = back(h)
            if total is None:
                return h, _entering_sums(h, h0, states[0], axis=axis, reverse=reverse).astype(x.dtype)
            return h, back(total).astype(x.dtype)

        def run_along(axis, a, x, h0, *states, shifted, final_only, sums):
            """`local_recurrence` of sequences along `axis`."""
            shape = _layout.broadcast_shape(a, x, h0, *states)
            state = _out_shape(shape, axis, True)
            a, x, *states = (_layout.to_pnq(v, axis, shape) for v in (a, x, *states))
            h0 = _layout.to_pnq(h0, axis, state)
            P, T, Q = _layout.broadcast_shape(a, x, *states)
            move = _planner.gpu_columns(P, Q, x.dtype, backend=backend, kind="recurrence",
                                        N=T)
            (a, x, h0, *states), P, Q, back = _layout.columns_if(move, (a, x, h0, *states), P, Q)
            gated = None
            if gate is not None and in_kernel:
                gated = (states[0], gate)
            elif gate is not None:  # s * c and s * x written out, run ungated
                slope = _slope(gate, states[0], None)
                a = slope * _coefficients(a, T, axis=1, reverse=reverse, shifted=shifted)
                x, shifted = slope * x, False
            if sums and kernel_sums:
                h, total = kernels.recurrence(a, x, h0, reverse=reverse, shifted=shifted,
                                              activation=None, final_only=False, out_dtype=x.dtype,
                                              tiling=None, gate=gated, sums=states[0])
                return (back(h).reshape(shape),
                        back(total).reshape(_out_shape(shape, axis, True)))
            h = _chunked.recurrence_any(
                kernels, a, x, h0, plan=plan(P, T, Q, chunk, gated=gated is not None),
                reverse=reverse, shifted=shifted, final_only=final_only, gate=gated,
                activation=activation,
                replan=lambda P, C, Q: plan(P, C, Q, None if chunk != 0 else 0))
            return back(h).reshape(_out_shape(shape, axis, final_only)), None

        def local(*operands):
            return local_recurrence(*operands, shifted=shifted, final_only=final_only, sums=sums)

        # A split time axis is run in place for linear recurrences (with their sums); IndRNN's
        # nonlinear ones and the gated ones of their derivatives gather it.
        split = None if activation is not None or gate is not None else functools.partial(
            _partition_method.recurrence_split, axis=axis, reverse=reverse, shifted=shifted,
            final_only=final_only, local_recurrence=local_recurrence)
        operands = (a, x, h0, *states)
        outs = [out, _out_shape(full, axis, True)] if sums else [out]
        return _sharding.partitioned(local, [v.shape for v in operands], outs, axis,
                                     split=split)(*operands)

    return run


gated_recurrence_p = VaryingPrimitive("tridiax_gated_recurrence")
def_jit_impl(gated_recurrence_p)
gated_recurrence_p.def_abstract_eval(_abstract_eval)

# The reversed run of a transpose with the cotangent of a coefficient constant in time:
# (g, the sum over the steps of the state entering each step times that step's states), the
# second formed in the sweep by the TPU kernel (`_recurrence/pallas_tpu.py`, `sums`), and by
# XLA after the run elsewhere (other backends, chunked or complex runs). Operands (a, x, h0,
# states), params those of `gated_recurrence_p` (`gate`: the activation whose slope gates the
# run, or None) without `final_only`.
recurrence_sums_p = VaryingPrimitive("tridiax_recurrence_sums")
recurrence_sums_p.multiple_results = True
def_jit_impl(recurrence_sums_p)


@recurrence_sums_p.def_abstract_eval
def _sums_abstract_eval(a, x, h0, states, *, axis, **_):
    full = _layout.broadcast_shape(a, x, h0, states)
    return [ShapedArray(full, x.dtype), ShapedArray(_out_shape(full, axis, True), x.dtype)]


def _sums_lowering(platform: str):
    run = _lowering(platform)

    def sums(a, x, h0, states, **params):
        # The run has the states' shape: a cotangent that vmap left unbatched against batched
        # states (a loss linear in h) is broadcast to it (a no-op otherwise).
        x = jnp.broadcast_to(x, _layout.broadcast_shape(a, x, h0, states))
        return run(a, x, h0, states, final_only=False, sums=True, **params)

    return sums


def _sums_composed(a, x, h0, states, *, axis, reverse, shifted, gate, backend, chunk):
    """`recurrence_sums_p` from the recurrence primitives (its JVP)."""
    params = dict(axis=axis, reverse=reverse, shifted=shifted, final_only=False, backend=backend,
                  chunk=chunk)
    if gate is None:
        h = recurrence_p.bind(a, x, h0, activation=None, **params)
    else:
        h = gated_recurrence_p.bind(a, x, h0, states, gate=gate, **params)
    return h, _entering_sums(h, h0, states, axis=axis, reverse=reverse)


for _platform in ("cpu", "cuda", "rocm", "tpu"):
    _sharding.register_lowering(recurrence_p, _lowering(_platform), _platform)
    _sharding.register_lowering(gated_recurrence_p, _lowering(_platform), _platform)
    _sharding.register_lowering(recurrence_sums_p, _sums_lowering(_platform), _platform,
                                multiple_results=True)


def _first_index(T, reverse):
    return T - 1 if reverse else 0


def previous_states(h, h0, *, axis, reverse):
    """The state each step multiplies: h[t-1] (h[t+1] when `reverse`), h0 at the first step."""
    T = h.shape[axis]
    step = -1 if reverse else 1
    first = h0.astype(h.dtype)  # size 1 along axis
    config = [(0, 0, 0)] * h.ndim
    config[axis] = (T - 1, 0, 0) if reverse else (0, T - 1, 0)
    first = jax.lax.pad(jnp.broadcast_to(first, h.shape[:axis] + (1,) + h.shape[axis + 1:]),
                        jnp.zeros((), h.dtype), config)
    return _along.shift(h, step, axis) + first


def _entering_sums(h, h0, states, *, axis, reverse):
    """The sum over the steps of a run h (from h0) of the state entering each step times that
    step's states: `recurrence_sums_p`'s second result, formed after the run."""
    entering = previous_states(h, h0, axis=axis, reverse=reverse)
    return _along.sum_along(entering * states, axis)


def _coefficients(a, T, *, axis, reverse, shifted):
    """a as applied at each step: a[t], or a at the previous step's index (zero first)."""
    a = _along.broadcast_along(a, axis, T)
    return _along.shift(a, -1 if reverse else 1, axis) if shifted else a


def _last_state(h, axis, reverse):
    T = h.shape[axis]
    return jax.lax.slice_in_dim(h, _first_index(T, not reverse), _first_index(T, not reverse) + 1,
                                axis=axis)


def _slope_from_output():
    # Activations whose derivative is a function of their output: the backward then reads
    # only the stored states, not the inputs again.
    return {
        jax.nn.relu: lambda h: (h > 0).astype(h.dtype),
        jnp.tanh: lambda h: 1 - h * h,
    }


def _output_slope(activation):
    """The function giving activation' from the activation's output, or None."""
    try:
        return _slope_from_output().get(activation)
    except TypeError:  # unhashable callable
        return None


def _slope(activation, h, pre):
    """activation'(pre-activation), from the output h where possible, else from pre()."""
    from_output = _output_slope(activation)
    if from_output is not None:
        return from_output(h)
    if pre is None:
        raise ValueError(f"no slope from the output of {activation!r}")
    pre = pre()  # recomputed from the stored states: no extra output from the kernel
    return jax.jvp(activation, (pre,), (jnp.ones_like(pre),))[1]


def _jvp(primals, tangents, *, axis, reverse, shifted, activation, final_only, backend, chunk):
    a, x, h0 = primals
    a_t, x_t, h0_t = (None if type(t) is ad.Zero else t for t in tangents)
    params = dict(axis=axis, reverse=reverse, backend=backend, chunk=chunk)
    linear = activation is None
    need_sequence = not linear or a_t is not None
    T = max(a.shape[axis], x.shape[axis])
    if need_sequence:
        h_seq = recurrence_p.bind(a, x, h0, shifted=shifted, activation=activation,
                                  final_only=False, **params)
        h = _last_state(h_seq, axis, reverse) if final_only else h_seq
        h_prev = previous_states(h_seq, h0, axis=axis, reverse=reverse)
    else:
        h = recurrence_p.bind(a, x, h0, shifted=shifted, activation=activation,
                              final_only=final_only, **params)
    if a_t is not None and _sums_apply(a, x, axis, activation):
        # The coefficient is constant in time: its cotangent is summed in the transpose's run.
        zeros = [jnp.zeros((1,) * v.ndim, v.dtype) if t is None else t
                 for v, t in ((x, x_t), (h0, h0_t))]
        return h, recurrence_tangent_p.bind(
            a, *zeros, a_t, h_seq, h0, shifted=shifted, gate=activation,
            final_only=final_only, **params)
    inputs = [] if x_t is None else [x_t]
    if a_t is not None:
        inputs.append(_coefficients(a_t, T, axis=axis, reverse=reverse, shifted=shifted) * h_prev)
    if not inputs and h0_t is None:
        return h, ad.Zero.from_primal_value(h)
    x_in = functools.reduce(jnp.add, inputs) if inputs else jnp.zeros_like(x)
    h0_in = jnp.zeros_like(h0) if h0_t is None else h0_t
    if linear:
        h_t = recurrence_p.bind(a, x_in, h0_in, shifted=shifted, activation=None,
                                final_only=final_only, **params)
    elif _gates(activation):
        h_t = gated_recurrence_p.bind(a, x_in, h0_in, h_seq, shifted=shifted, gate=activation,
                                      final_only=final_only, **params)
    else:
        slope = _slope(activation, h_seq, lambda: a * h_prev + x)
        h_t = recurrence_p.bind(slope * a, slope * x_in, h0_in, shifted=shifted,
                                activation=None, final_only=final_only, **params)
    return h, h_t


ad.primitive_jvps[recurrence_p] = _jvp


def _sums_apply(a, x, axis, activation) -> bool:
    """Whether the coefficient's tangent goes through `recurrence_tangent_p`: a real
    coefficient constant in time (IndRNN's weight, a decay per sequence), in a linear recurrence
    or one whose derivatives run gated."""
    return (a.shape[axis] == 1 and not jnp.iscomplexobj(a) and not jnp.iscomplexobj(x)
            and (activation is None or _gates(activation)))


# The tangent of a recurrence whose coefficient is constant in time, linear in (x', h0', a'):
# the linear recurrence (gated by `gate`'s slope of the states h, or None) of
# x' + a' * h[t-1]. Operands (a, x', h0', a', h, h0); params those of `gated_recurrence_p`.
# Its transpose gives a''s cotangent from `recurrence_sums_p`, so that the sum of
# g[t] * h[t-1] over time needs no pass of its own.
recurrence_tangent_p = VaryingPrimitive("tridiax_recurrence_tangent")
def_jit_impl(recurrence_tangent_p)


@recurrence_tangent_p.def_abstract_eval
def _tangent_abstract_eval(a, x_t, h0_t, a_t, h, h0, *, axis, final_only, **_):
    full = _layout.broadcast_shape(a, x_t, h0_t, a_t, h, h0)
    return ShapedArray(_out_shape(full, axis, final_only), x_t.dtype)


def _tangent_composed(a, x_t, h0_t, a_t, h, h0, *, axis, reverse, shifted, gate, final_only,
                      backend, chunk):
    """`recurrence_tangent_p` from the recurrence primitives."""
    T = h.shape[axis]
    h_prev = previous_states(h, h0, axis=axis, reverse=reverse)
    x_in = x_t + _coefficients(a_t, T, axis=axis, reverse=reverse, shifted=shifted) * h_prev
    params = dict(axis=axis, reverse=reverse, shifted=shifted, final_only=final_only,
                  backend=backend, chunk=chunk)
    if gate is None:
        return recurrence_p.bind(a, x_in, h0_t, activation=None, **params)
    return gated_recurrence_p.bind(a, x_in, h0_t, h, gate=gate, **params)


def _tangent_transpose(h_bar, a, x_t, h0_t, a_t, h, h0, *, axis, reverse, shifted, gate,
                       final_only, backend, chunk):
    if any(ad.is_undefined_primal(v) for v in (a, h, h0)):
        raise NotImplementedError("the tangent recurrence is linear in x', h0' and a' only")
    linear = (x_t, h0_t, a_t)
    avals = [v.aval if ad.is_undefined_primal(v) else None for v in linear]
    if type(h_bar) is ad.Zero:
        return (None, *(None if aval is None else ad.Zero(aval) for aval in avals), None, None)
    T = h.shape[axis]
    h_bar = _every_state_cotangent(h_bar, T, axis=axis, reverse=reverse, final_only=final_only)
    zero_h0 = jnp.zeros((1,) * h_bar.ndim, h_bar.dtype)
    g, total = recurrence_sums_p.bind(a, h_bar, zero_h0, h, axis=axis, reverse=not reverse,
                                      shifted=not shifted, gate=gate, backend=backend, chunk=chunk)
    first = _first_index(T, reverse)
    g_first = jax.lax.slice_in_dim(g, first, first + 1, axis=axis)
    x_ct = h0_ct = a_ct = None
    if avals[0] is not None:
        x_ct = _along.unbroadcast(g, avals[0].shape)
    if avals[1] is not None:
        h0_ct = _h0_cotangent(a, g, avals[1], T, axis=axis, reverse=reverse, shifted=shifted)
    if avals[2] is not None:
        # sum over t of g[t] h[t-1]: the run's sum (the state entering each of its steps,
        # g[t+1] or g[t-1], times h[t]) and the first step's g times h0 (zero when shifted)
        if not shifted:
            total = total + g_first * h0.astype(g.dtype)
        a_ct = _along.unbroadcast(total, avals[2].shape)
    return (None, x_ct, h0_ct, a_ct, None, None)


def _instantiated(primals, tangents) -> tuple:
    """The tangents with symbolic zeros made arrays, for jax.jvp of a composition."""
    return tuple(jnp.zeros_like(p) if type(t) is ad.Zero else t
                 for p, t in zip(primals, tangents, strict=True))


def _tangent_jvp(primals, tangents, **params):
    return jax.jvp(functools.partial(_tangent_composed, **params), tuple(primals),
                   _instantiated(primals, tangents))


def _sums_jvp(primals, tangents, **params):
    out, out_t = jax.jvp(functools.partial(_sums_composed, **params), tuple(primals),
                         _instantiated(primals, tangents))
    return list(out), list(out_t)


for _platform in ("cpu", "cuda", "rocm", "tpu"):
    _sharding.register_lowering(recurrence_tangent_p, _tangent_composed, _platform)
ad.primitive_jvps[recurrence_tangent_p] = _tangent_jvp
ad.primitive_transposes[recurrence_tangent_p] = _tangent_transpose
ad.primitive_jvps[recurrence_sums_p] = _sums_jvp


def _gates(activation) -> bool:
    """Whether the derivatives of this activation's recurrence run gated (slope from h)."""
    return _output_slope(activation) is not None


def _gated_jvp(primals, tangents, *, axis, reverse, shifted, gate, final_only, backend, chunk):
    a, x, h0, states = primals
    params = dict(axis=axis, reverse=reverse, shifted=shifted, gate=gate, final_only=final_only,
                  backend=backend, chunk=chunk)
    if type(tangents[0]) is ad.Zero and type(tangents[3]) is ad.Zero:
        # Linear in x and h0: the same recurrence carries the tangents.
        h = gated_recurrence_p.bind(*primals, **params)
        x_t, h0_t = (jnp.zeros_like(p) if type(t) is ad.Zero else t
                     for p, t in zip((x, h0), tangents[1:3], strict=True))
        return h, gated_recurrence_p.bind(a, x_t, h0_t, states, **params)

    # Second order through the coefficients or the gate: the materialized formulation.
    def materialized(a, x, h0, states):
        T = max(a.shape[axis], x.shape[axis], states.shape[axis])
        slope = _slope(gate, states, None)
        coefficient = slope * _coefficients(a, T, axis=axis, reverse=reverse, shifted=shifted)
        return recurrence_p.bind(coefficient, slope * x, h0, axis=axis, reverse=reverse,
                                 shifted=False, activation=None, final_only=final_only,
                                 backend=backend, chunk=chunk)

    return jax.jvp(materialized, tuple(primals), _instantiated(primals, tangents))


ad.primitive_jvps[gated_recurrence_p] = _gated_jvp


def _transpose(h_bar, a, x, h0, *states, axis, reverse, shifted, final_only, backend, chunk,
               activation=None, gate=None):
    if activation is not None or ad.is_undefined_primal(a) or any(
            ad.is_undefined_primal(s) for s in states):
        raise NotImplementedError("only the linear recurrence is linear, and only in x and h0")
    x_aval = x.aval if ad.is_undefined_primal(x) else x
    h0_aval = h0.aval if ad.is_undefined_primal(h0) else h0
    if type(h_bar) is ad.Zero:
        return (None, ad.Zero(x_aval) if ad.is_undefined_primal(x) else None,
                ad.Zero(h0_aval) if ad.is_undefined_primal(h0) else None) + (None,) * len(states)
    T = max(a.shape[axis], x_aval.shape[axis])
    h_bar = _every_state_cotangent(h_bar, T, axis=axis, reverse=reverse, final_only=final_only)
    zero_h0 = jnp.zeros((1,) * h_bar.ndim, h_bar.dtype)
    params = dict(axis=axis, reverse=not reverse, shifted=not shifted, final_only=False,
                  backend=backend, chunk=chunk)
    if states:  # z[t] = s[t] * (g[t] + c[t+1] z[t+1]): the same gate, the time reversed
        g = gated_recurrence_p.bind(a, h_bar, zero_h0, *states, gate=gate, **params)
    else:
        g = recurrence_p.bind(a, h_bar, zero_h0, activation=None, **params)
    x_ct = _along.unbroadcast(g, x_aval.shape) if ad.is_undefined_primal(x) else None
    h0_ct = None
    if ad.is_undefined_primal(h0):
        h0_ct = _h0_cotangent(a, g, h0_aval, T, axis=axis, reverse=reverse, shifted=shifted)
    return (None, x_ct, h0_ct) + (None,) * len(states)


def _every_state_cotangent(h_bar, T, *, axis, reverse, final_only):
    """The cotangent of every state: h_bar itself, or that of the last state only (padded with
    zeros) when `final_only`."""
    if not final_only:
        return h_bar
    config = [(0, 0, 0)] * h_bar.ndim
    config[axis] = (T - 1, 0, 0) if not reverse else (0, T - 1, 0)
    return jax.lax.pad(h_bar, jnp.zeros((), h_bar.dtype), config)


def _h0_cotangent(a, g, h0_aval, T, *, axis, reverse, shifted):
    """h0's cotangent from the transpose's run g: a at the first step times g there (zero when
    shifted: the shifted recurrence multiplies h0 by zero)."""
    if shifted:
        return ad.Zero(h0_aval)
    first = _first_index(T, reverse)
    a_index = first if a.shape[axis] > 1 else 0
    a_first = jax.lax.slice_in_dim(a, a_index, a_index + 1, axis=axis)
    g_first = jax.lax.slice_in_dim(g, first, first + 1, axis=axis)
    return _along.unbroadcast(a_first * g_first, h0_aval.shape)


ad.primitive_transposes[recurrence_p] = _transpose
ad.primitive_transposes[gated_recurrence_p] = _transpose


def _batcher(primitive):
    def batch(operands, dims, *, axis, **params):
        moved, bdim, axis = _along.align_batch(operands, dims, axis, preferred=1)
        out = primitive.bind(*moved, axis=axis, **params)
        return out, ([bdim] * len(out) if primitive.multiple_results else bdim)

    return batch


batching.primitive_batchers[recurrence_p] = _batcher(recurrence_p)
batching.primitive_batchers[gated_recurrence_p] = _batcher(gated_recurrence_p)
batching.primitive_batchers[recurrence_tangent_p] = _batcher(recurrence_tangent_p)
batching.primitive_batchers[recurrence_sums_p] = _batcher(recurrence_sums_p)
