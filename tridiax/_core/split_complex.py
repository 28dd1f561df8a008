"""Complex values as their real and imaginary parts, for kernels whose compiler has no complex
type (Triton; Mosaic GPU).

`launch` (`_pallas/tiles.py`) passes each complex operand and output as two real arrays and
hands the kernel a `SplitRef` (re, im) for it; loading a row of one gives a `SplitComplex`,
which does the arithmetic the sweeps need (+, -, *, /, with real or split operands) on the
parts, so one kernel body serves real and complex systems. `select`, `zeros_like` and
`magnitude` take either kind, so helpers shared with the XLA kernels (`pivot_step`) do too.
Division (`divide`, `/`) is Smith's algorithm (no overflow of |y|^2 for large y) in the order
of XLA's complex division, dividing by the scaled modulus rather than multiplying by its
rounded reciprocal; the pivot choice compares |Re| + |Im| as LAPACK's gtsv does, like every
other backend.
"""

from __future__ import annotations

import dataclasses
import operator

import jax
import jax.numpy as jnp
import numpy as np


def real_dtype(dtype) -> np.dtype:
    """The dtype of the parts of `dtype` (itself when it is real)."""
    return np.dtype(jnp.finfo(dtype).dtype) if jnp.issubdtype(dtype, jnp.complexfloating) \
        else np.dtype(dtype)


@dataclasses.dataclass(frozen=True)
class SplitRef:
    """A complex operand or output of a kernel as its two real refs."""

    re: object
    im: object

    @property
    def shape(self):
        return self.re.shape

    @property
    def dtype(self):
        return jnp.result_type(self.re.dtype, jnp.complex64)


@jax.tree_util.register_pytree_node_class
class SplitComplex:
    """re + i*im, with re and im real arrays of one shape and dtype."""

    def __init__(self, re, im):
        self.re, self.im = re, im

    def tree_flatten(self):
        return (self.re, self.im), None

    @classmethod
    def tree_unflatten(cls, _, parts):
        return cls(*parts)

    @property
    def real(self):
        return self.re

    @property
    def imag(self):
        return self.im

    @property
    def shape(self):
        return jnp.shape(self.re)

    def map(self, fn):
        """fn applied to both parts (a broadcast, a cast)."""
        return SplitComplex(fn(self.re), fn(self.im))

    def __neg__(self):
        return SplitComplex(-self.re, -self.im)

    def __add__(self, other):
        if isinstance(other, SplitComplex):
            return SplitComplex(self.re + other.re, self.im + other.im)
        return SplitComplex(self.re + other, self.im)

    __radd__ = __add__

    def __sub__(self, other):
        return self + (-other)

    def __rsub__(self, other):
        return (-self) + other

    def __mul__(self, other):
        if isinstance(other, SplitComplex):
            return SplitComplex(self.re * other.re - self.im * other.im,
                                self.re * other.im + self.im * other.re)
        return SplitComplex(self.re * other, self.im * other)

    __rmul__ = __mul__

    def __truediv__(self, other):
        return divide(self, other)

    def __rtruediv__(self, other):
        # A real numerator over a split value: its reciprocal, scaled (the banded and block
        # kernels' inverse pivots, `1 / pivot`). `divide(x, y)` divides directly.
        return other * reciprocal(self)


def divide(x, y, real_divide=operator.truediv):
    """x / y for real or split x and y, with `real_divide` dividing real parts.

    A split y by Smith's algorithm, in the order of XLA's complex division: with
    ratio = Im y / Re y when |Re y| >= |Im y|,
    x / y = ((Re x + Im x*ratio) + i(Im x - Re x*ratio)) / (Re y + Im y*ratio), and with the
    parts' roles exchanged otherwise (ratio = Re y / Im y). Both parts are divided by that
    scaled modulus, never multiplied by a separately rounded reciprocal of it."""
    if not isinstance(y, SplitComplex):
        if isinstance(x, SplitComplex):
            return SplitComplex(real_divide(x.re, y), real_divide(x.im, y))
        return real_divide(x, y)
    x = as_split(x)
    wide = jnp.abs(y.re) >= jnp.abs(y.im)
    big = jnp.where(wide, y.re, y.im)
    small = jnp.where(wide, y.im, y.re)
    ratio = real_divide(small, big)
    scaled = big + small * ratio
    # wide: (Re x + Im x*r) + i(Im x - Re x*r); else (Re x*r + Im x) + i(Im x*r - Re x), the
    # imaginary part negated from (Re x - Im x*r) (exact).
    first, second = jnp.where(wide, x.re, x.im), jnp.where(wide, x.im, x.re)
    im = real_divide(second - first * ratio, scaled)
    return SplitComplex(real_divide(first + second * ratio, scaled), jnp.where(wide, im, -im))


def reciprocal(y: SplitComplex) -> SplitComplex:
    """1 / y by Smith's algorithm: the larger part divides the smaller, so nothing squares;
    both parts are products with one rounded 1 / (scaled modulus)."""
    wide = jnp.abs(y.re) >= jnp.abs(y.im)
    big = jnp.where(wide, y.re, y.im)
    small = jnp.where(wide, y.im, y.re)
    ratio = small / big
    scale = 1 / (big + small * ratio)
    # wide: 1/(a + ib) = (1 - i r) / (a + b r), r = b/a; else (r - i) / (a r + b), r = a/b.
    return SplitComplex(jnp.where(wide, scale, ratio * scale),
                        jnp.where(wide, -ratio * scale, -scale))


def as_split(x) -> SplitComplex:
    """x as a SplitComplex (a real value gets a zero imaginary part)."""
    return x if isinstance(x, SplitComplex) else SplitComplex(x, jnp.zeros_like(x))


def select(condition, x, y):
    """jnp.where for real or split values (a real operand against a split one is promoted)."""
    if isinstance(x, SplitComplex) or isinstance(y, SplitComplex):
        x, y = as_split(x), as_split(y)
        return SplitComplex(jnp.where(condition, x.re, y.re), jnp.where(condition, x.im, y.im))
    return jnp.where(condition, x, y)


def zeros_like(x):
    return x.map(jnp.zeros_like) if isinstance(x, SplitComplex) else jnp.zeros_like(x)


def magnitude(x):
    """The size gtsv compares to choose a pivot: |x|, or |Re x| + |Im x| for complex x."""
    if isinstance(x, SplitComplex) or jnp.iscomplexobj(x):
        return jnp.abs(x.real) + jnp.abs(x.imag)
    return jnp.abs(x)


def modulus(x):
    """|x| (the Euclidean modulus for complex x)."""
    if isinstance(x, SplitComplex):
        return jnp.sqrt(x.re * x.re + x.im * x.im)
    return jnp.abs(x)
