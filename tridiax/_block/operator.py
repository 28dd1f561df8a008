"""`BlockTridiagonal`, the block-tridiagonal operator, and `BlockTridiagonalFactorization`, its
factors kept for many solves.

Equinox modules in the style of `Banded` and `BandedFactorization`: the blocks (and factors)
are leaves, the axis is static. The axis counts in the dimensions before the two block
dimensions of the blocks' broadcast shape and is kept counted from the end, so a right-hand
side with more leading dimensions (or a vmapped operator, whose blocks lose a leading
dimension) means the same block-row dimension.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jax.typing import ArrayLike

from .._core import along_axis as _along
from .._core import dispatch as _dispatch
from .._core import not_lineax as _not_lineax
from .._core.inputs import read, signature
from . import algebra
from .api import block_size, read_rhs, solve
from .primitive import block_factor_p, block_factored_solve_p


class BlockTridiagonal(eqx.Module):
    r"""Many block-tridiagonal matrices with k x k blocks lying along `axis`, as one operator.

    Block row i of each matrix holds `lower[i]`, `diag[i]`, `upper[i]` (shape `(..., N, ...,
    k, k)`, broadcasting together; `lower[0]` and `upper[N-1]` are ignored), as in
    `tridiax.solve_block_tridiagonal`; `axis` counts in the dimensions before the two block
    dimensions and is kept counted from their end, so a right-hand side with more leading
    dimensions is aligned with the blocks at the right.

    **Operations:** `A.mv(x)` (x of shape `(..., N, ..., k)` or `(..., k, m)`), `A.T` (the
    blocks of A^T), `A.as_matrix()` (dense, `batch + (N k, N k)`), `A.solve(rhs, pivoting=True,
    check=False)`, `A.factor(pivoting=True)` (a `BlockTridiagonalFactorization`: eliminate
    once, solve many), `s * A`, `-A`.

    **Example:**

    ```python
    import jax.numpy as jnp, tridiax
    n, k = 64, 2
    off = jnp.broadcast_to(-jnp.eye(k), (n, k, k))
    diag = jnp.broadcast_to(jnp.array([[4.0, 1.0], [1.0, 3.0]]), (n, k, k))
    A = tridiax.BlockTridiagonal(off, diag, off)
    lu = A.factor()
    x = lu.solve(jnp.ones((n, k)))  # == A.solve(jnp.ones((n, k)))
    ```
    """

    lower: Array
    diag: Array
    upper: Array
    axis: int = eqx.field(static=True)  # counted from the end of the systems' dimensions

    def __init__(self, lower: ArrayLike, diag: ArrayLike, upper: ArrayLike, *,
                 axis: int = -1):
        values, signatures = read(("lower", "diag", "upper"), (lower, diag, upper))
        k = block_size({n: s for n, (s, _, _) in zip(("lower", "diag", "upper"), signatures,
                                                     strict=True)})
        # The checks of a solve with a right-hand side of the blocks' own systems shape.
        systems = np.broadcast_shapes(*(s[:-2] for s, _, _ in signatures))
        if not systems:
            raise ValueError("the blocks have no block-row dimension: give them shape "
                             "(..., N, k, k).")
        rhs = (tuple(systems) + (k,), np.dtype(np.float32), True)
        read_rhs(signatures, rhs, ("lower", "diag", "upper", "rhs"), axis, k)
        self.lower, self.diag, self.upper = (jnp.asarray(v) for v in values)
        self.axis = int(axis) % len(systems) - len(systems)

    __hash__ = _dispatch.structural_hash
    __getattr__ = _not_lineax.attribute_error(
        "Solve with it directly, `A.solve(b)` (any batch, any axis). lineax.linear_solve "
        "needs a lineax operator: for one system of blocks (N, k, k), "
        "`tridiax.lineax.BlockTridiagonalLinearOperator(lower, diag, upper)`, with "
        "solver=tridiax.lineax.BlockTDMA().")
    __array_ufunc__ = None

    @property
    def k(self) -> int:
        return self.diag.shape[-1]

    def _systems(self) -> tuple[int, ...]:
        return tuple(np.broadcast_shapes(*(b.shape[:-2] for b in (self.lower, self.diag,
                                                                  self.upper))))

    def _columns(self, x) -> int | None:
        """How `x` reads (`_block.read_rhs`): None for (..., k) vectors, else m."""
        sig = signature(x) if not hasattr(x, "shape") else (tuple(x.shape), np.dtype(x.dtype),
                                                             False)
        blocks = tuple((tuple(b.shape), np.dtype(b.dtype), False)
                       for b in (self.lower, self.diag, self.upper))
        return read_rhs(blocks, sig, ("lower", "diag", "upper", "x"), self.axis, self.k)[1]

    def mv(self, x: ArrayLike) -> Array:
        """A @ x along `axis` for every system (x as `rhs` of `solve_block_tridiagonal`)."""
        x = jnp.asarray(x)
        m = self._columns(x)
        xm = x[..., None] if m is None else x
        dtype = jnp.result_type(self.diag, x)
        ndim = max(xm.ndim, *(b.ndim for b in (self.lower, self.diag, self.upper)))
        blocks = [b.astype(dtype).reshape((1,) * (ndim - b.ndim) + b.shape)
                  for b in (self.lower, self.diag, self.upper)]
        xm = xm.astype(dtype).reshape((1,) * (ndim - xm.ndim) + xm.shape)
        full = tuple(np.broadcast_shapes(*(b.shape[:-2] for b in blocks), xm.shape[:-2]))
        xm = jnp.broadcast_to(xm, full + xm.shape[-2:])
        out = algebra.matvec(*blocks, xm, axis=len(full) + self.axis)
        return out[..., 0] if m is None else out

    @property
    def T(self) -> BlockTridiagonal:
        """The transposed operator (plain transpose): lower'[i] = upper[i-1]^T, diag'[i] =
        diag[i]^T, upper'[i] = lower[i+1]^T."""
        systems = self._systems()
        axis = len(systems) + self.axis

        def moved(block, by):  # block[i - by]^T along the axis (the same block if constant)
            block = jnp.swapaxes(block, -1, -2)
            block = block.reshape((1,) * (len(systems) + 2 - block.ndim) + block.shape)
            return block if block.shape[axis] == 1 else _along.shift(block, by, axis)

        return BlockTridiagonal(moved(self.upper, 1), jnp.swapaxes(self.diag, -1, -2),
                                moved(self.lower, -1), axis=self.axis)

    def as_matrix(self) -> Array:
        """Dense matrices, shape `batch + (N k, N k)` (`batch`: the systems' shape without
        `axis`)."""
        systems = self._systems()
        axis = len(systems) + self.axis
        n, k = systems[axis], self.k
        blocks = [jnp.moveaxis(jnp.broadcast_to(b, systems + (k, k)), axis, -3)
                  for b in (self.lower, self.diag, self.upper)]
        batch = blocks[1].shape[:-3]
        out = jnp.zeros(batch + (n * k, n * k), jnp.result_type(*blocks))
        for i in range(n):  # assembling a dense matrix: N is small wherever this is called
            rows = slice(i * k, (i + 1) * k)
            out = out.at[..., rows, rows].set(blocks[1][..., i, :, :])
            if i > 0:
                out = out.at[..., rows, (i - 1) * k:i * k].set(blocks[0][..., i, :, :])
            if i < n - 1:
                out = out.at[..., rows, (i + 1) * k:(i + 2) * k].set(blocks[2][..., i, :, :])
        return out

    def solve(self, rhs: ArrayLike, *, pivoting: bool = True, check: bool = False) -> Array:
        """x with A x = rhs (`tridiax.solve_block_tridiagonal`; `pivoting`, `check` as
        there)."""
        return solve(self.lower, self.diag, self.upper, rhs, axis=self.axis, pivoting=pivoting,
                     check=check)

    def factor(self, *, pivoting: bool = True) -> BlockTridiagonalFactorization:
        """Eliminate once; `.solve(rhs)` of the result reuses the factors."""
        return BlockTridiagonalFactorization(self, pivoting=pivoting)

    def scale(self, s: ArrayLike) -> BlockTridiagonal:
        """s * A for a scalar `s`."""
        s = jnp.asarray(s)
        if s.ndim:
            raise ValueError(f"scale takes a scalar, got shape {s.shape}.")
        return BlockTridiagonal(s * self.lower, s * self.diag, s * self.upper, axis=self.axis)

    def __mul__(self, s):
        if isinstance(s, BlockTridiagonal):
            return NotImplemented
        return self.scale(s)

    __rmul__ = __mul__

    def __neg__(self):
        return self.scale(-1)


class BlockTridiagonalFactorization(eqx.Module):
    """The factors of a `BlockTridiagonal` operator (each Schur complement eliminated with
    partial pivoting inside the block, or without), for solving many right-hand sides:
    `A.factor().solve(rhs)` equals `A.solve(rhs)`; `.T` solves with A^T.

    Computed by Pallas kernels on a TPU (`_block/pallas_tpu_factors.py`), by the XLA
    formulation elsewhere (`_block/xla.py`, `factor_pnq`): the same factors, in its layout.
    Differentiable w.r.t. the operator's blocks and the right-hand side (implicitly, through
    `lax.custom_linear_solve`: one factored solve per derivative).
    """

    operator: BlockTridiagonal
    lu: Array
    pivots: Array
    e: Array
    transposed: bool = eqx.field(static=True)

    __getattr__ = _not_lineax.attribute_error(
        "Solve with it directly, `F.solve(b)`. lineax.linear_solve needs a lineax operator: "
        "for one system of blocks (N, k, k), `tridiax.lineax.BlockTridiagonalLinearOperator("
        "lower, diag, upper)`, with solver=tridiax.lineax.BlockTDMA().")

    def __init__(self, operator: BlockTridiagonal, *, pivoting: bool = True,
                 transposed: bool = False, _factors=None):
        self.operator = operator
        self.transposed = bool(transposed)
        if _factors is not None:
            self.lu, self.pivots, self.e = _factors
            return
        op = operator
        systems = op._systems()
        axis = len(systems) + op.axis
        dtype = jnp.result_type(op.lower, op.diag, op.upper)
        blocks = [lax.stop_gradient(b).astype(dtype).reshape(
            (1,) * (len(systems) + 2 - b.ndim) + b.shape) for b in (op.lower, op.diag, op.upper)]
        kind = "block_pivoted" if pivoting else "block"
        self.lu, self.pivots, self.e = block_factor_p.bind(*blocks, axis=axis, kind=kind,
                                                           backend=None)

    @property
    def T(self) -> BlockTridiagonalFactorization:
        """The same factors, solving with the transposed matrix."""
        return BlockTridiagonalFactorization(self.operator, transposed=not self.transposed,
                                             _factors=(self.lu, self.pivots, self.e))

    def solve(self, rhs: ArrayLike) -> Array:
        """x with A x = rhs (A^T x = rhs for `.T`), reusing the factors."""
        op = self.operator
        rhs = jnp.asarray(rhs)
        m = op._columns(rhs)
        b = rhs[..., None] if m is None else rhs
        dtype = jnp.result_type(self.lu.dtype, b.dtype)
        factor_systems = self.lu.shape[:-2]
        ndim = max(b.ndim - 2, len(factor_systems))
        full = tuple(np.broadcast_shapes(factor_systems, b.shape[:-2]))
        full = (1,) * (ndim - len(full)) + full
        axis = ndim + op.axis

        blocks = [b_.astype(dtype).reshape((1,) * (ndim + 2 - b_.ndim) + b_.shape)
                  for b_ in (op.lower, op.diag, op.upper)]
        # the factors and the lower blocks, the factored solve's operands besides b
        operands = [f.astype(f.dtype if f.dtype == jnp.int32 else dtype).reshape(
            (1,) * (ndim + 2 - f.ndim) + f.shape) for f in (self.lu, self.pivots, self.e)]
        operands.append(lax.stop_gradient(blocks[0]))
        b = jnp.broadcast_to(b.astype(dtype).reshape((1,) * (ndim + 2 - b.ndim) + b.shape),
                             full + b.shape[-2:])

        def factored(transposed):
            def run(v):
                return block_factored_solve_p.bind(*operands, v, axis=axis,
                                                   transposed=transposed, backend=None)
            return run

        def matvec(v):
            return algebra.matvec(*blocks, v, axis=axis, transposed=self.transposed)

        x = lax.custom_linear_solve(matvec, b, solve=lambda _, v: factored(self.transposed)(v),
                                    transpose_solve=lambda _, v: factored(
                                        not self.transposed)(v))
        return x[..., 0] if m is None else x
