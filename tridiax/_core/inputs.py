"""What the arguments of every tridiax call mean: dtypes, shapes and `axis`, checked in one place.

The rules (docs/guides/tridiagonal.md, "Shapes and axis"), the same for every
entry point (`solve_tridiagonal`, `solve_periodic_tridiagonal`, `linear_recurrence`, `indrnn`,
`LinearRecurrence`, `IndRNN`, `Tridiagonal`, `TDMA`, `TridiagonalFactorization`):

1. The arrays of a call broadcast together under NumPy's rules: an array with fewer
   dimensions is aligned with the others at the right, and a dimension of size 1 is repeated
   (never copied). `axis` is a dimension of that broadcast shape (negative: from the end); the
   systems (or sequences) lie along it, every other dimension is a batch dimension.
2. An array whose NumPy alignment leaves it without the axis (e.g. decays of shape (F,) against
   inputs (T, F) with time along axis 0) is constant along the axis. When one of its
   dimensions has the axis's length N > 1 and would fit lying along the axis, and NumPy's
   alignment does not fit at all (bands (N,) against a right-hand side (N, B), B != N, with
   axis=0: the habit of jax.lax.linalg and scipy, where 1-D bands lie along the system), the
   error shows the shape that lies along the axis. When both fit (B == N), a tridiagonal
   solve refuses the call and names both readings: with that habit around, tridiax does not
   guess. A recurrence's coefficients (`a`, `weight_hh`) follow NumPy there (a 1-D `a` of F
   values is per feature, as in every sequence library), so (F,) decays with (T, F) inputs
   work for T == F; its inputs `x`, `z` are refused like bands.
3. An operator (`Tridiagonal`, a factorization) counts `axis` in its bands' broadcast shape. A
   right-hand side with more dimensions than the bands had when the operator was built is
   aligned with them at the right (NumPy), so a negative `axis` means the same dimension in
   both. A non-negative one could also be read as counting in the right-hand side; the call
   is refused when that reading fits too (axis `axis` of the right-hand side has the
   operator's N rows, or any number of rows for bands constant along the axis), with both
   readings and the fix for each.

Only shapes and dtypes are read here (no device work): `plan_of` checks a call and returns what
the computation needs, `conform` casts and reshapes inside it.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .dtypes import is_supported

_SHAPES_DOC = "See 'Shapes and axis' in tridiax's documentation (docs/guides/tridiagonal.md)."


@dataclasses.dataclass(frozen=True)
class Plan:
    """A checked call: the number of dimensions, the axis (>= 0) and the common dtype."""

    ndim: int
    axis: int
    dtype: np.dtype
    shape: tuple[int, ...]


def as_input(name: str, value):
    """`value` as something with a shape and dtype (JAX or NumPy array, NumPy or Python
    scalar): a list or tuple becomes a NumPy array; anything else is a TypeError naming the
    argument. Dtypes are checked by `plan_of`, on the dtype as given: an int64 array is reported
    as int64 even where JAX's 32-bit mode would make it int32."""
    if isinstance(value, list | tuple):
        try:
            return np.asarray(value)
        except (TypeError, ValueError) as err:
            try:  # a list of tracers (a list argument under jit) stacks in jnp
                return jnp.asarray(value)
            except (TypeError, ValueError):
                raise TypeError(f"{name} must be an array, got a {type(value).__name__} that "
                                f"NumPy cannot read as one: {err}") from None
    if isinstance(value, bool | int | float | complex) or (
            hasattr(value, "dtype") and hasattr(value, "shape")):
        return value
    raise TypeError(f"{name} must be an array, got {type(value).__name__}.")


def read(names: Sequence[str], values: Sequence) -> tuple[list, tuple]:
    """`as_input` of each value, and their signatures (what `plan_of` reads)."""
    out, signatures = [], []
    for name, value in zip(names, values, strict=True):
        if isinstance(value, jax.Array):  # the common case, tracers included: no conversion
            signatures.append((value.shape, value.dtype, value.weak_type))
        else:
            value = as_input(name, value)
            signatures.append(signature(value))
        out.append(value)
    return out, tuple(signatures)


def signature(value) -> tuple:
    """What `plan_of` reads of an input: (shape, dtype, weakly typed)."""
    if isinstance(value, bool | int | float | complex):  # Python scalars are weakly typed
        return (), np.dtype(type(value)), not isinstance(value, bool)
    return tuple(value.shape), np.dtype(value.dtype), bool(getattr(value, "weak_type", False))


def plan_of(signatures: tuple, names: Sequence[str], axis, *, along: str = "systems") -> Plan:
    """Check the arrays of one call, given their signatures (`read`): dtypes, axis, alignment
    and broadcasting, without touching their data. `along` names what lies along the axis
    in messages: "systems" (tridiagonal solves) or "time steps" (recurrences, whose
    coefficients keep NumPy's reading under rule 2). Raises TypeError or ValueError naming
    the argument, the shapes and the fix. Cached by signatures, so a repeated call costs a
    dictionary lookup."""
    if not isinstance(axis, int | np.integer) or isinstance(axis, bool | np.bool_):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}.")
    if along not in _ALONG:
        raise ValueError(f"along must be one of {_ALONG}")
    return _plan(signatures, tuple(names), int(axis), along, x64_enabled())


_ALONG = ("systems", "time steps")


def x64_enabled() -> bool:
    """JAX's 64-bit mode, which decides the dtype float64 inputs compute in: part of every
    cache key that holds a dtype."""
    return bool(jax.config.jax_enable_x64)


@functools.lru_cache(maxsize=4096)
def _plan(signature, names, axis: int, along: str, x64: bool) -> Plan:
    for name, (_, dtype, weak) in zip(names, signature, strict=True):
        check_dtype(name, dtype, weak)
    shapes = [shape for shape, _, _ in signature]
    ndim = max(len(s) for s in shapes)
    if ndim == 0:
        raise ValueError(
            "all inputs are scalars (0-d); a tridiagonal system needs an axis to lie along."
        )
    axis = _check_axis(axis, ndim, shapes, names)
    _check_alignment(shapes, names, axis, ndim, along)
    try:
        shape = tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        described = ", ".join(f"{n}{s}" for n, s in zip(names, shapes, strict=True))
        raise ValueError(
            f"the shapes do not broadcast together: {described}. Every input must broadcast to "
            f"the shape of the solution under NumPy rules.{_other_axis_hint(shapes, axis, along)} "
            f"{_SHAPES_DOC}"
        ) from None
    if shape[axis] == 0:
        raise ValueError(
            f"axis {axis} has size 0 in the broadcast shape {shape}; a system or sequence "
            "needs at least one row."
        )
    dtype = result_dtype(signature)
    if not is_supported(dtype):
        raise TypeError(f"the inputs ({', '.join(names)}) have no floating-point or complex "
                        f"array among them (their common dtype is {dtype}); pass floats.")
    return Plan(ndim=ndim, axis=axis, dtype=dtype, shape=shape)


def result_dtype(signatures) -> np.dtype:
    """The dtype the inputs of these signatures compute in: a weakly typed input (a Python
    scalar) takes the others' precision, as in JAX; float64 inputs in JAX's 32-bit mode are
    float32 (canonicalised here, silently, as JAX does on entry)."""
    kinds = {"f": float, "c": complex, "i": int, "u": int}
    return np.dtype(jnp.result_type(*(kinds.get(d.kind, d) if weak
                                      else jax.dtypes.canonicalize_dtype(d)
                                      for _, d, weak in signatures)))


def check_dtype(name: str, dtype, weak: bool = False) -> None:
    """A TypeError naming the argument unless `dtype` is floating-point or complex, or a
    weakly typed integer (a Python int, which takes the others' dtype, as in JAX)."""
    if weak and np.dtype(dtype).kind in "iu":
        return
    if not is_supported(dtype):
        raise TypeError(
            f"{name} has dtype {np.dtype(dtype)}; tridiax works on floating-point or complex "
            f"arrays (float16, bfloat16, float32, float64, complex64, complex128). Cast it first, "
            f"e.g. {name}.astype(jnp.float32)."
        )


def _check_axis(axis, ndim: int, shapes, names) -> int:
    """`axis` (an int) in [0, ndim), or a ValueError that shows the shapes."""
    if not -ndim <= axis < ndim:
        described = ", ".join(f"{n}{s}" for n, s in zip(names, shapes, strict=True))
        try:
            shape = tuple(np.broadcast_shapes(*shapes))
        except ValueError:
            shape = max(shapes, key=len)
        raise ValueError(
            f"axis={axis} is out of range for inputs broadcasting to shape {shape} "
            f"(ndim {ndim}: {described}); use -{ndim} <= axis < {ndim}."
        )
    return int(axis) % ndim


def conform(values, p: Plan) -> list:
    """The arrays cast to the common dtype, with leading size-1 dimensions up to `p.ndim`
    (run inside the computation: under jit these are free)."""
    arrays = [jnp.asarray(v) for v in values]
    return [x.astype(p.dtype).reshape((1,) * (p.ndim - x.ndim) + x.shape) for x in arrays]


def _broadcasts(*shapes) -> tuple[int, ...] | None:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def _check_alignment(shapes, names, axis: int, ndim: int, along: str) -> None:
    """Rule 2 of the module docstring: refuse an array that NumPy's alignment keeps off the
    axis when it would also fit along it (ambiguous), or fits only along it (a misaligned
    band, whose fix we can show). Checked against the arrays that have every dimension."""
    reference = _broadcasts(*(s for s in shapes if len(s) == ndim))
    if reference is None:
        return  # the full-rank arrays disagree among themselves: the broadcast error says so
    problems = {}  # shape -> (names, where it would start lying along the axis, NumPy fits)
    for name, shape in zip(names, shapes, strict=True):
        rank = len(shape)
        if rank == 0 or rank == ndim or axis >= ndim - rank:
            continue  # a scalar, a full-rank array, or NumPy's alignment reaches the axis
        # Windows of `rank` consecutive dimensions that contain the axis, nearest the right first.
        starts = range(min(axis, ndim - rank), max(0, axis - rank + 1) - 1, -1)
        n = reference[axis]  # the axis's length among the arrays that have every dimension
        fits = [s for s in starts if n > 1 and shape[axis - s] == n
                and _broadcasts(reference, shape + (1,) * (ndim - s - rank)) is not None]
        numpy_fit = _broadcasts(reference, shape) is not None
        coefficient = along == "time steps" and name == names[0]  # a recurrence's decays
        if fits and not (numpy_fit and coefficient):  # those keep NumPy's reading (rule 2)
            problems.setdefault(shape, ([], fits[0], numpy_fit))[0].append(name)
    if not problems:
        return
    shape, (which, start, numpy_fit) = next(iter(problems.items()))
    rank = len(shape)
    trailing = ndim - start - rank  # size-1 dimensions to add after the array's own
    suggested = shape + (1,) * trailing
    subject = (f"{_join(which)} {'have' if len(which) > 1 else 'has'} shape {shape}; the "
               f"{along} lie along axis {axis} of {ndim}-d inputs ("
               + ", ".join(f"{n} {s}" for n, s in zip(names, shapes, strict=True)
                           if n not in which) + ")")
    numpy_axes = _axes(ndim - rank, ndim)
    example = which[0]
    expand = tuple(range(-trailing, 0))
    along_fix = (f"shape {suggested} (jnp.expand_dims({example}, "
                 f"{expand[0] if len(expand) == 1 else expand}))")
    if not numpy_fit:
        raise ValueError(
            f"{subject}. Aligned at the right (NumPy's rule), a {shape} array lies along "
            f"{numpy_axes}, where it does not fit. To lie along axis {axis}, pass {along_fix}. "
            f"{_SHAPES_DOC}")
    constant = (1,) * (ndim - rank) + shape
    raise ValueError(
        f"{subject}. Aligned at the right (NumPy's rule), a {shape} array lies along "
        f"{numpy_axes} and is constant along the {along}; but its size {shape[axis - start]} "
        f"also matches axis {axis}, and tridiax does not guess which was meant. Constant along "
        f"the {along}: pass shape {constant} (jnp.reshape({example}, {constant})). Along axis "
        f"{axis}: pass {along_fix}. {_SHAPES_DOC}")


def _other_axis_hint(shapes, axis: int, along: str) -> str:
    """For 1-D arrays whose length is that of exactly one other dimension of the full-rank
    arrays: the axis the user probably meant, and the shape that puts them along it."""
    reference = _broadcasts(*(s for s in shapes if len(s) == max(map(len, shapes))))
    lengths = {s[0] for s in shapes if len(s) == 1 and s[0] > 1}
    if reference is None or len(lengths) != 1:
        return ""
    (n,) = lengths
    matches = [k for k, size in enumerate(reference) if size == n and k != axis]
    if len(matches) != 1:
        return ""
    k, ndim = matches[0], len(reference)
    shape = (n,) + (1,) * (ndim - k - 1)
    return (f" If the {along} lie along axis {k} (length {n}), pass axis={k}"
            + (f" and give the 1-D arrays shape {shape}" if shape != (n,) else "") + ".")


def _axes(start: int, stop: int) -> str:
    return f"axis {start}" if stop - start == 1 else f"axes {start}..{stop - 1}"


def _join(names) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def band_shape(owner) -> tuple[int, ...]:
    """The broadcast shape of an operator's bands as they are now."""
    return tuple(np.broadcast_shapes(*(np.shape(b) for b in (owner.lower, owner.diag,
                                                             owner.upper))))


def operator_axis(owner, now: tuple[int, ...] | None = None) -> int:
    """The axis (>= 0) of an operator's bands as they are now, from the `axis` it was built
    with on bands of shape `owner.band_shape`. Under jax.vmap the bands lose (or, returned
    from it, gain) a dimension; the axis follows its own dimension, found by matching the
    two shapes, and a vmap over the axis itself or an ambiguous match is an error. `now`:
    `band_shape(owner)`, when the caller has it already."""
    then, now = tuple(owner.band_shape), band_shape(owner) if now is None else now
    axis = owner.axis % len(then)
    if now == then:
        return axis
    found = set()
    if len(now) < len(then):  # which dimensions survived
        for kept in itertools.combinations(range(len(then)), len(now)):
            if tuple(then[k] for k in kept) == now and axis in kept:
                found.add(kept.index(axis))
    else:  # where the old dimensions went
        for placed in itertools.combinations(range(len(now)), len(then)):
            if tuple(now[k] for k in placed) == then:
                found.add(placed[axis])
    if len(found) == 1:
        return found.pop()
    name = type(owner).__name__
    if not found:
        raise ValueError(
            f"{name} was built on bands of shape {then} with its systems along axis {axis}; its "
            f"bands now have shape {now}, which is not that shape with dimensions removed or "
            f"added without touching the axis (jax.vmap over the operator's own axis leaves "
            f"no rows to solve). Map over another dimension.")
    raise ValueError(
        f"{name} was built on bands of shape {then} with its systems along axis {axis}; its "
        f"bands now have shape {now} (jax.vmap removed or added a dimension), and more than "
        f"one dimension of that shape could be the axis. Give the vmapped dimension a size "
        f"different from its neighbours', or map outside the operator.")


def check_operator_rank(owner, rhs_name: str, rhs) -> int:
    """Rule 3 of the module docstring, for the operator `owner` (fields lower, diag, upper,
    axis, band_shape) applied to the array `rhs`. Returns the axis to solve along, counted
    from the end (the same dimension of the bands and of `rhs`)."""
    bands, rhs_shape = band_shape(owner), np.shape(rhs)
    axis, band_ndim, rhs_ndim = operator_axis(owner, bands), len(bands), len(rhs_shape)
    from_end = axis - band_ndim
    if owner.axis < 0 or rhs_ndim <= band_ndim:
        return from_end
    # The operator's N (1 when its bands are constant along the axis), and whether axis
    # `axis` of the right-hand side could hold its systems too.
    n = bands[axis]
    if not (rhs_shape[axis] == n if n > 1 else rhs_shape[axis] > 1):
        return from_end
    numpy_axis = rhs_ndim + from_end
    options = [f"axis={from_end} to solve along axis {numpy_axis} of {rhs_name} (size "
               f"{rhs_shape[numpy_axis]}), where NumPy's alignment at the right puts the bands' "
               f"axis {axis}"]
    wanted = axis - rhs_ndim  # axis `axis` of the right-hand side, counted from its end
    if band_ndim >= -wanted:
        options.append(f"axis={wanted} to solve along axis {axis} of {rhs_name} (size "
                       f"{rhs_shape[axis]})")
    else:
        suggested = bands + (1,) * (rhs_ndim - band_ndim)
        if _broadcasts(suggested, tuple(rhs_shape)) is not None:
            expand = tuple(range(band_ndim - rhs_ndim, 0))
            options.append(f"bands of shape {suggested} (jnp.expand_dims(band, "
                           f"{expand[0] if len(expand) == 1 else expand})) and axis={axis} to "
                           f"solve along axis {axis} of {rhs_name} (size {rhs_shape[axis]})")
    raise ValueError(
        f"{type(owner).__name__} was built with axis={axis} on bands of {band_ndim} dimension"
        f"{'s' if band_ndim > 1 else ''} and is applied "
        f"to {rhs_name} of shape {tuple(rhs_shape)}, which has {rhs_ndim}: a non-negative axis "
        f"could then count in either (axis {axis} of {rhs_name} fits the operator too), and "
        f"tridiax does not guess. Build the operator with "
        + "; or with ".join(options) + ". A negative axis counts from the end, the same "
        f"dimension of the bands and of any right-hand side. {_SHAPES_DOC}")
