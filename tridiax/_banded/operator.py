"""`Banded`, the banded operator, and `BandedFactorization`, its factors kept for many solves.

Equinox modules in the style of `Tridiagonal` and `TridiagonalFactorization`: the bands (and
factors) are leaves, the bandwidths and axis are static. The axis counts in the shape of one
band, `ab.shape[1:]`, and is stored counted from the end, so a right-hand side with more
leading dimensions means the same dimension; `_inputs.check_operator_rank` refuses the
readings that are ambiguous, as it does for `Tridiagonal`.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jax.typing import ArrayLike

from .._core import along_axis as _along
from .._core import dispatch as _dispatch
from .._core import not_lineax as _not_lineax
from .._core.dtypes import compute_dtype
from .._core.inputs import check_operator_rank, plan_of, read
from . import algebra
from .api import check_bandwidths, solve
from .primitive import banded_factor_p, banded_factored_solve_p


class _RankView(NamedTuple):
    """What `check_operator_rank` reads of an operator, for one band of a banded one."""

    lower: Array
    diag: Array
    upper: Array
    axis: int
    band_shape: tuple[int, ...]


def _rank_view(owner, cls_name: str):
    band = owner.ab[0]
    view = type(cls_name, (_RankView,), {})
    return view(band, band, band, owner.axis, owner.band_shape)


class Banded(eqx.Module):
    r"""Many banded matrices in scipy's layout, lying along `axis`, as one operator.

    `ab[u + i - j, j] == A[i, j]` (as `tridiax.solve_banded`): `ab` has shape `(l + u + 1,
    *s)`, the band index first; `axis` counts in `s`, the shape of one band (`(N,)` for one
    matrix, `(N, B)` with `axis=0` for B matrices, `(N, 1)` with `axis=0` for one matrix
    shared by the B columns of an `(N, B)` right-hand side). A right-hand side with more
    leading dimensions is aligned with the bands at the right; a non-negative `axis` that
    could count in either is refused, with both readings ([Shapes and axis](../guides/tridiagonal.md#shapes-and-axis)).

    **Operations:** `A.mv(x)`, `A.T` (the (u, l) band of the transpose), `A.as_matrix()`
    (dense, `batch + (N, N)`), `A.solve(rhs, pivoting=True, check=False)`,
    `A.factor(pivoting=True)` (a `BandedFactorization`: eliminate once, solve many),
    `s * A`, `-A`, `A.shift_diagonal(s)`.

    **Example:**

    ```python
    import jax.numpy as jnp, tridiax
    n = 32  # (I + K) x = f with K the 5-point fourth-difference stencil
    ab = jnp.stack([jnp.ones(n), -4 * jnp.ones(n), 6 * jnp.ones(n), -4 * jnp.ones(n), jnp.ones(n)])
    A = tridiax.Banded(ab, (2, 2)).shift_diagonal(1.0)
    lu = A.factor()
    x = lu.solve(jnp.ones(n))  # == A.solve(jnp.ones(n))
    ```
    """

    ab: Array
    l: int = eqx.field(static=True)
    u: int = eqx.field(static=True)
    axis: int = eqx.field(static=True)
    band_shape: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, ab: ArrayLike, l_and_u: tuple[int, int], *, axis: int = -1):
        self.l, self.u = check_bandwidths(l_and_u)
        (ab,), signatures = read(("ab",), (ab,))
        shape = signatures[0][0]
        if len(shape) < 2 or shape[0] != self.l + self.u + 1:
            raise ValueError(
                f"ab must have shape (l + u + 1, ...) = ({self.l + self.u + 1}, ...) with at "
                f"least one row axis for l_and_u = ({self.l}, {self.u}); got {shape}.")
        band_signature = (shape[1:],) + signatures[0][1:]
        plan_of((band_signature,), ("ab (each band)",), axis)  # dtype and axis in range
        self.ab = jnp.asarray(ab)
        self.axis = int(axis)
        self.band_shape = tuple(shape[1:])

    __hash__ = _dispatch.structural_hash
    __getattr__ = _not_lineax.attribute_error(
        "Solve with it directly, `A.solve(b)` (any batch, any axis). lineax.linear_solve "
        "needs a lineax operator of one system whose matrix is banded (a "
        "`lineax.MatrixLinearOperator`, a Jacobian, ...), with solver=tridiax.lineax.Banded(l, "
        "u).")
    __array_ufunc__ = None

    def _from_end(self, name: str | None = None, rhs=None) -> int:
        view = _rank_view(self, type(self).__name__)
        if rhs is None:
            return check_operator_rank(view, "x", jnp.zeros(()))
        return check_operator_rank(view, name, rhs)

    def _bands_for(self, ndim: int) -> Array:
        """ab with leading size-1 band dimensions up to `ndim` (at least its own)."""
        own = self.ab.ndim - 1
        return self.ab.reshape((self.ab.shape[0],) + (1,) * max(ndim - own, 0)
                               + self.ab.shape[1:])

    def mv(self, x: ArrayLike) -> Array:
        """A @ x along `axis` for every system (x broadcasts against a band)."""
        from_end = self._from_end("x", x)
        x = jnp.asarray(x)
        ndim = max(x.ndim, self.ab.ndim - 1)
        ab = self._bands_for(ndim)
        x = jnp.broadcast_to(x, np.broadcast_shapes(ab.shape[1:], x.shape))
        return algebra.matvec(ab.astype(jnp.result_type(ab, x)), x, l=self.l, u=self.u,
                                    axis=ndim + from_end)

    @property
    def T(self) -> Banded:
        """The transposed operator, in scipy's layout with bandwidths (u, l)."""
        axis = self._from_end() + self.ab.ndim  # in ab's dimensions, band axis included
        n = self.ab.shape[axis]
        rows = []
        for k in range(self.l + self.u + 1):  # A^T's row k: ab[l + u - k] moved by k - l
            source, t = self.ab[self.l + self.u - k], k - self.l
            if n == 1 or t == 0:
                rows.append(source)
            elif abs(t) >= n:
                rows.append(jnp.zeros_like(source))
            else:
                rows.append(_along.shift(source, -t, axis - 1))
        return Banded(jnp.stack(rows), (self.u, self.l), axis=self.axis)

    def as_matrix(self) -> Array:
        """Dense matrices, shape `batch + (N, N)` (`batch`: a band's shape without `axis`)."""
        axis = self._from_end() + self.ab.ndim - 1
        n = self.band_shape[axis]
        bands = jnp.moveaxis(self.ab, axis + 1, -1)  # (K, *batch, N): bands[k, ..., j]
        rows, cols = np.arange(n)[:, None], np.arange(n)[None, :]
        out = jnp.zeros(bands.shape[1:-1] + (n, n), self.ab.dtype)
        for k, s in enumerate(algebra.band_offsets(self.l, self.u)):
            out = out + jnp.where(rows - cols == s, bands[k][..., None, :], 0)
        return out

    def solve(self, rhs: ArrayLike, *, pivoting: bool = True, check: bool = False) -> Array:
        """x with A x = rhs (`tridiax.solve_banded`; `pivoting`, `check` as there)."""
        from_end = self._from_end("rhs", rhs)
        ab = self._bands_for(jnp.ndim(rhs))
        return solve((self.l, self.u), ab, rhs, axis=from_end, pivoting=pivoting, check=check)

    def factor(self, *, pivoting: bool = True) -> BandedFactorization:
        """Eliminate once (LAPACK's gbtrf order); `.solve(rhs)` of the result reuses it."""
        return BandedFactorization(self, pivoting=pivoting)

    def scale(self, s: ArrayLike) -> Banded:
        """s * A for a scalar `s` (or an array broadcasting like one band)."""
        return Banded(jnp.asarray(s) * self.ab, (self.l, self.u), axis=self.axis)

    def shift_diagonal(self, s: ArrayLike) -> Banded:
        """A + s I (`s` a scalar or an array broadcasting like one band)."""
        ab = jnp.broadcast_to(self.ab, (self.ab.shape[0],) + np.broadcast_shapes(
            self.band_shape, jnp.shape(s))) if jnp.ndim(s) else self.ab
        return Banded(ab.at[self.u].add(s), (self.l, self.u), axis=self.axis)

    def __mul__(self, s):
        if isinstance(s, Banded):
            return NotImplemented
        return self.scale(s)

    __rmul__ = __mul__

    def __neg__(self):
        return self.scale(-1)


class BandedFactorization(eqx.Module):
    """The LU factors of a `Banded` operator (partial pivoting as LAPACK's gbtrf, or none),
    for solving many right-hand sides: `A.factor().solve(rhs)` equals `A.solve(rhs)`.

    Computed by Pallas kernels on a TPU (`_banded/pallas_tpu_factors.py`), by the XLA
    formulation elsewhere (`_banded/xla.py`, `factor_pnq`): the same factors, in its layout.
    Differentiable w.r.t. the operator's bands and the right-hand side (implicitly, through
    `lax.custom_linear_solve`: one factored solve per derivative); `.T` solves with A^T.
    """

    operator: Banded
    u_rows: Array
    multipliers: Array
    pivots: Array
    transposed: bool = eqx.field(static=True)

    __getattr__ = _not_lineax.attribute_error(
        "Solve with it directly, `F.solve(b)`. lineax.linear_solve needs a lineax operator of "
        "one system whose matrix is banded, with solver=tridiax.lineax.Banded(l, u).")

    def __init__(self, operator: Banded, *, pivoting: bool = True, transposed: bool = False,
                 _factors=None):
        self.operator = operator
        self.transposed = bool(transposed)
        if _factors is not None:
            self.u_rows, self.multipliers, self.pivots = _factors
            return
        op = operator
        axis = op._from_end() + op.ab.ndim - 1
        ab = jnp.broadcast_to(lax.stop_gradient(op.ab), (op.ab.shape[0], *op.band_shape))
        kind = "banded_pivoted" if pivoting else "banded"
        self.u_rows, self.multipliers, self.pivots = banded_factor_p.bind(
            ab, l=op.l, u=op.u, axis=axis, kind=kind, backend=None)

    @property
    def T(self) -> BandedFactorization:
        """The same factors, solving with the transposed matrix."""
        return BandedFactorization(self.operator, transposed=not self.transposed,
                                   _factors=(self.u_rows, self.multipliers, self.pivots))

    def solve(self, rhs: ArrayLike) -> Array:
        """x with A x = rhs (A^T x = rhs for `.T`), reusing the factors."""
        op = self.operator
        from_end = op._from_end("rhs", rhs)
        rhs = jnp.asarray(rhs)
        ndim = max(rhs.ndim, op.ab.ndim - 1)
        ab = op._bands_for(ndim)
        dtype = jnp.result_type(ab.dtype, rhs.dtype)
        full = tuple(np.broadcast_shapes(ab.shape[1:], rhs.shape))
        axis = ndim + from_end
        b = jnp.broadcast_to(rhs, full).astype(dtype)
        ab = ab.astype(dtype)

        band_full = (1,) * (ndim - len(op.band_shape)) + op.band_shape

        # The factors with the rank of b (their band shape broadcasts against it), in the
        # dtype the solve computes in (real factors stay real against a complex b).
        compute = compute_dtype(dtype)
        u_rows, multipliers = (
            f.reshape((f.shape[0], *band_full)).astype(
                compute if jnp.iscomplexobj(f) else jnp.finfo(compute).dtype)
            for f in (self.u_rows, self.multipliers))
        pivots = self.pivots.reshape(band_full)

        def factored(transposed):
            def run(v):
                return banded_factored_solve_p.bind(u_rows, multipliers, pivots, v, axis=axis,
                                                    transposed=transposed, backend=None)
            return run

        def matvec(v):
            return algebra.matvec(ab, v, l=op.l, u=op.u, axis=axis,
                                        transposed=self.transposed)

        return lax.custom_linear_solve(matvec, b, solve=lambda _, v: factored(self.transposed)(v),
                                       transpose_solve=lambda _, v: factored(
                                           not self.transposed)(v))
