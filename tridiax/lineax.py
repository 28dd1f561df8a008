"""lineax interop: `tridiax.lineax.TDMA`, a lineax solver that runs tridiax's kernels.

```python
import jax.numpy as jnp, lineax as lx, tridiax
n = 8
diag, lower_diag, upper_diag = 4 * jnp.ones(n), jnp.ones(n - 1), jnp.ones(n - 1)
op = lx.TridiagonalLinearOperator(diag, lower_diag, upper_diag)   # (N,), (N-1,), (N-1,)
x = lx.linear_solve(op, jnp.ones(n), solver=tridiax.lineax.TDMA()).value
```

`tridiax.TDMA()` works in its place. A lineax operator is one system; `jax.vmap` over a batch
of operators and right-hand sides runs one batched kernel (tridiax's batching rule), not a
loop. Needs lineax (`pip install ".[lineax]"`).

`tridiax.lineax.Banded(l, u)` solves with ANY square lineax operator on 1-D vectors whose
matrix is banded (l sub- and u super-diagonals): `MatrixLinearOperator`,
`JacobianLinearOperator` (e.g. the Jacobian of a Newton step in optimistix or diffrax),
`FunctionLinearOperator`, ... It reads the band with l + u + 1 matrix-vector products (JVPs for
a Jacobian), not N, and solves with `tridiax.solve_banded`:

```python
import jax.numpy as jnp, lineax as lx, tridiax
def f(y):   # a pentadiagonal Jacobian: (l, u) = (2, 2)
    return 6 * y - 4 * (jnp.roll(y, 1) + jnp.roll(y, -1)) + jnp.roll(y, 2) + jnp.roll(y, -2)
y0 = jnp.linspace(0.0, 1.0, 8)
op = lx.JacobianLinearOperator(lambda y, args: f(y).at[:2].set(y[:2]).at[-2:].set(y[-2:]), y0)
x = lx.linear_solve(op, jnp.ones(8), solver=tridiax.lineax.Banded(2, 2)).value
```

`tridiax.lineax.BlockTridiagonalLinearOperator(lower, diag, upper)` is a lineax operator on
vectors of N k values (N block rows of k x k blocks, block row after block row), and
`tridiax.lineax.BlockTDMA()` solves it with `tridiax.solve_block_tridiagonal`; with `k=` given,
`BlockTDMA(k=...)` also solves any other lineax operator on 1-D vectors whose matrix is block
tridiagonal (a Jacobian of coupled species in diffrax or optimistix: its blocks are read with
4k - 1 products):

```python
import jax.numpy as jnp, lineax as lx, tridiax
n, k = 16, 2
off, diag = jnp.broadcast_to(-jnp.eye(k), (n, k, k)), jnp.broadcast_to(4 * jnp.eye(k), (n, k, k))
op = tridiax.lineax.BlockTridiagonalLinearOperator(off, diag, off)
x = lx.linear_solve(op, jnp.ones(n * k), solver=tridiax.lineax.BlockTDMA()).value  # (32,)
```
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

try:
    import lineax as lx
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tridiax.lineax needs lineax, an optional dependency: pip install lineax "
        "(or install tridiax with the extra: pip install \".[lineax]\")."
    ) from err

from ._banded.api import solve_banded
from ._block import algebra as _block_algebra
from ._block.api import solve_block_tridiagonal
from ._core import backend as _backend
from ._tridiagonal.api import solve

__all__ = ["Banded", "BlockTDMA", "BlockTridiagonalLinearOperator", "TDMA"]


class TDMA(lx.AbstractLinearSolver):
    """The Thomas algorithm as a lineax solver, for operators tagged tridiagonal
    (`lineax.TridiagonalLinearOperator`, or any operator with `lineax.tridiagonal_tag`).

    By default no pivoting: stable for diagonally dominant and symmetric positive definite
    matrices; `pivoting=True` eliminates with row interchanges (as LAPACK's gtsv) for any
    nonsingular matrix. A zero pivot gives a non-finite solution, reported as
    `lineax.RESULTS.singular` (so `linear_solve(..., throw=True)` raises). Gradients w.r.t. the
    operator and the vector come from lineax's implicit differentiation, which calls this
    solver's transpose.

    A lineax operator is one system (its vector is flattened); batch with `jax.vmap`, which
    runs one batched kernel. `tridiax.TDMA()` works with `lineax.linear_solve` in the same
    way; this class also subclasses `lineax.AbstractLinearSolver`, for code that checks.

    **Fields** (static): `backend`, `block`, `pivoting` and `chunk` as in `tridiax.TDMA`.
    """

    backend: str | None = eqx.field(static=True, default=None)
    block: tuple[int, int] | None = eqx.field(static=True, default=None)
    pivoting: bool = eqx.field(static=True, default=False)
    chunk: int | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        _backend.check_solver_settings(self.backend, self.block, pivoting=self.pivoting)
        _backend.check_chunk(self.chunk, "pivoted" if self.pivoting else None)

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        return init_state(self, operator)

    def compute(self, state, vector, options: dict[str, Any]):
        return compute_solution(self, state, vector)

    def transpose(self, state, options: dict[str, Any]):
        return transpose_state(state), options

    def conj(self, state, options: dict[str, Any]):
        return conj_state(state), options

    def assume_full_rank(self) -> bool:
        return True


# The solver interface's work, shared by this TDMA and tridiax.TDMA (which duck-types it).

def init_state(solver, operator: lx.AbstractLinearOperator):
    """The bands (diag, lower, upper) of a square tridiagonal lineax operator."""
    name = "tridiax.lineax.TDMA" if isinstance(solver, TDMA) else "tridiax.TDMA"
    if operator.in_size() != operator.out_size():
        raise ValueError(
            f"{name} solves square systems; the operator maps {operator.in_size()} values to "
            f"{operator.out_size()}.")
    if not lx.is_tridiagonal(operator):
        raise ValueError(
            f"{name} needs a tridiagonal operator, got {type(operator).__name__} without "
            "lineax.tridiagonal_tag. Use lineax.TridiagonalLinearOperator(diag, lower_diag, "
            "upper_diag), or tag the operator if it is tridiagonal.")
    if jax.tree.structure(operator.in_structure()) != jax.tree.structure(
            operator.out_structure()):
        raise ValueError(f"{name} needs the same input and output structure.")
    return lx.tridiagonal(operator)


def compute_solution(solver, state, vector):
    """lineax's (solution, result, stats) for one system, with the solver's settings."""
    diag, lower, upper = state
    flat, unravel = ravel_pytree(vector)
    zero = jnp.zeros((1,), diag.dtype)
    # lineax stores the off-diagonals with N-1 entries; tridiax's bands have N (lower[0]
    # and upper[N-1] ignored).
    x = solve(jnp.concatenate([zero, lower]), diag, jnp.concatenate([upper, zero]), flat,
              axis=-1, backend=solver.backend, block=solver.block, pivoting=solver.pivoting,
              check=getattr(solver, "check", False), chunk=solver.chunk)
    result = lx.RESULTS.where(jnp.all(jnp.isfinite(x)), lx.RESULTS.successful,
                              lx.RESULTS.singular)
    return unravel(x), result, {}


def transpose_state(state):
    diag, lower, upper = state
    return diag, upper, lower


def conj_state(state):
    return tuple(jnp.conj(x) for x in state)


class Banded(lx.AbstractLinearSolver):
    """A banded LU solve (`tridiax.solve_banded`) for any lineax operator whose matrix has `l`
    sub-diagonals and `u` super-diagonals.

    `init` reads the band from the operator with `l + u + 1` matrix-vector products (for a
    `lineax.JacobianLinearOperator`: JVPs, all in one batched call), by graph colouring: colour
    `c` is the set of columns `j` with `j % (l + u + 1) == c`. Two columns of one colour are at
    least `l + u + 1` apart, so no row has nonzero entries in both, and one product with the sum
    of a colour's unit vectors gives, in row `i`, `A[i, j]` for the one column `j` of that colour
    inside the row's band. A `lineax.MatrixLinearOperator` has its band read directly. The band
    is assembled in scipy's layout, `ab[u + i - j, j] == A[i, j]`, shape `(l + u + 1, N)`.

    **The operator must be banded**: entries outside the band are not read by the matrix case
    and, for the others, are silently added into the band entries of their colour (what a
    graph-coloured Jacobian is); nothing checks it.

    **Fields** (static):

    - `l`, `u`: the numbers of sub- and super-diagonals (non-negative integers).
    - `pivoting` (default True): partial pivoting (row interchanges, as LAPACK's gbsv) for any
      nonsingular matrix; `False` eliminates without, for diagonally dominant or symmetric
      positive definite matrices, and is faster.
    - `check` (default False): as in `tridiax.solve_banded`, raise an error when the
      elimination breaks down.

    A zero pivot gives a non-finite solution, reported as `lineax.RESULTS.singular` (so
    `linear_solve(..., throw=True)` raises). Transposed solves (reverse-mode gradients, lineax's
    `transpose`) transpose the band (bandwidths `(u, l)`) and run the same `tridiax.solve_banded`;
    gradients w.r.t. the operator come from lineax's implicit differentiation. The operator must
    be square, with one 1-D array as its input and output structure (a band is defined along one
    axis); batch with `jax.vmap`.

    ```python
    import jax.numpy as jnp, lineax as lx, optimistix as optx, tridiax
    newton = optx.Newton(rtol=1e-8, atol=1e-8, linear_solver=tridiax.lineax.Banded(2, 2))
    ```
    """

    l: int = eqx.field(static=True)
    u: int = eqx.field(static=True)
    pivoting: bool = eqx.field(static=True, default=True)
    check: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        for name in ("l", "u"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"tridiax.lineax.Banded({name}=...) must be a non-negative integer (the "
                    f"number of {'sub' if name == 'l' else 'super'}-diagonals), got {value!r}.")

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        del options
        in_structure, out_structure = _vector_structures(operator)
        return _BandedState(band_from_operator(operator, self.l, self.u), self.l, self.u,
                            in_structure, out_structure)

    def compute(self, state, vector, options: dict[str, Any]):
        del options
        x = solve_banded((state.l, state.u), state.ab, vector, pivoting=self.pivoting,
                          check=self.check)
        result = lx.RESULTS.where(jnp.all(jnp.isfinite(x)), lx.RESULTS.successful,
                                  lx.RESULTS.singular)
        if jnp.iscomplexobj(x) and not jnp.issubdtype(state.in_structure.dtype, jnp.complexfloating):
            x = jnp.real(x)
        return x.astype(state.in_structure.dtype), result, {}

    def transpose(self, state, options: dict[str, Any]):
        return _BandedState(transpose_band(state.ab, state.l, state.u), state.u, state.l,
                            state.out_structure, state.in_structure), options

    def conj(self, state, options: dict[str, Any]):
        return _BandedState(jnp.conj(state.ab), state.l, state.u, state.in_structure,
                            state.out_structure), options

    def assume_full_rank(self) -> bool:
        return True


class _BandedState(eqx.Module):
    """`Banded`'s state: the band in scipy's layout and what it takes to read it."""

    ab: jax.Array
    l: int = eqx.field(static=True)
    u: int = eqx.field(static=True)
    in_structure: jax.ShapeDtypeStruct = eqx.field(static=True)
    out_structure: jax.ShapeDtypeStruct = eqx.field(static=True)


def _vector_structures(operator: lx.AbstractLinearOperator):
    """(in, out) structures of a square operator on 1-D vectors, or a ValueError saying why not."""
    name = "tridiax.lineax.Banded"
    in_structure, out_structure = operator.in_structure(), operator.out_structure()
    for which, structure in (("input", in_structure), ("output", out_structure)):
        if not isinstance(structure, jax.ShapeDtypeStruct) or len(structure.shape) != 1:
            raise ValueError(
                f"{name} needs an operator on 1-D vectors (a band is defined along one axis); "
                f"its {which} structure is {structure}. Flatten the problem to one vector "
                "first (e.g. jax.flatten_util.ravel_pytree), in an order that keeps the "
                "matrix banded.")
    if in_structure.shape != out_structure.shape:
        raise ValueError(
            f"{name} solves square systems; the operator maps {in_structure.shape[0]} values to "
            f"{out_structure.shape[0]}.")
    return in_structure, out_structure


def _band_indices(n: int, l: int, u: int):
    """For band row r and column j of scipy's layout: the matrix row i = j + r - u, clipped into
    [0, n), and whether it is inside the matrix."""
    k = l + u + 1
    cols = jnp.arange(n)[None, :]
    rows = cols + jnp.arange(k)[:, None] - u
    return cols, jnp.clip(rows, 0, n - 1), (rows >= 0) & (rows < n)


def band_from_operator(operator: lx.AbstractLinearOperator, l: int, u: int) -> jax.Array:
    """scipy's band layout ab (l + u + 1, N), ab[u + i - j, j] = A[i, j], of a banded operator
    on 1-D vectors: read directly from a matrix, else with l + u + 1 coloured products."""
    in_structure, _ = _vector_structures(operator)
    n, k = in_structure.shape[0], l + u + 1
    cols, rows, inside = _band_indices(n, l, u)
    if isinstance(operator, lx.MatrixLinearOperator):
        values = operator.matrix[rows, cols]
    else:
        colours = min(k, n)  # colour c >= n has no column
        seeds = (jnp.arange(n)[None, :] % k == jnp.arange(colours)[:, None]).astype(in_structure.dtype)
        products = jax.vmap(operator.mv)(seeds)  # products[c, i] = A[i, j], j % k == c
        values = products[cols % k, rows]
    return jnp.where(inside, values, jnp.zeros((), values.dtype))


def transpose_band(ab: jax.Array, l: int, u: int) -> jax.Array:
    """The band of A^T (bandwidths (u, l)) from that of A (bandwidths (l, u)), scipy's layout:
    A^T[i, j] = A[j, i] gives abT[r, j] = ab[l + u - r, j + r - l]."""
    k, n = ab.shape
    cols = jnp.arange(n)[None, :]
    src_cols = cols + jnp.arange(k)[:, None] - l
    inside = (src_cols >= 0) & (src_cols < n)
    values = ab[::-1][jnp.arange(k)[:, None], jnp.clip(src_cols, 0, n - 1)]
    return jnp.where(inside, values, jnp.zeros((), ab.dtype))


class BlockTridiagonalLinearOperator(lx.AbstractLinearOperator):
    """A block-tridiagonal matrix with k x k blocks as a lineax operator on vectors of N k values
    (x[i k + r] is entry r of block row i).

    `lower`, `diag`, `upper`: shape `(N, k, k)`; block row i of the matrix is `lower[i]`,
    `diag[i]`, `upper[i]` (lower[0] and upper[N-1] ignored), as in
    `tridiax.solve_block_tridiagonal`. Solve it with `tridiax.lineax.BlockTDMA()` (any lineax
    solver that materialises works too); batch with `jax.vmap`.
    """

    lower: jax.Array
    diag: jax.Array
    upper: jax.Array

    def __check_init__(self):
        shapes = [jnp.shape(b) for b in (self.lower, self.diag, self.upper)]
        if len(set(shapes)) != 1 or len(shapes[0]) != 3 or shapes[0][1] != shapes[0][2]:
            raise ValueError(
                "BlockTridiagonalLinearOperator takes lower, diag and upper of one shape (N, k, "
                f"k); got {', '.join(map(str, shapes))}.")

    def _blocks(self):
        n = self.diag.shape[0]
        rows = jnp.arange(n)[:, None, None]
        return (jnp.where(rows > 0, self.lower, 0), self.diag,
                jnp.where(rows < n - 1, self.upper, 0))

    def mv(self, vector):
        n, k = self.diag.shape[:2]
        x = vector.reshape(n, k, 1)
        dtype = jnp.result_type(self.diag, x)
        return _block_algebra.matvec(*(b.astype(dtype) for b in self._blocks()), x.astype(dtype),
                                   axis=0).reshape(n * k)

    def as_matrix(self):
        from ._block.operator import BlockTridiagonal

        return BlockTridiagonal(*self._blocks(), axis=0).as_matrix()

    def transpose(self):
        t = lambda b: jnp.swapaxes(b, -1, -2)  # noqa: E731
        lower, diag, upper = self._blocks()
        zero = jnp.zeros_like(diag[:1])
        return BlockTridiagonalLinearOperator(jnp.concatenate([zero, t(upper)[:-1]]), t(diag),
                                              jnp.concatenate([t(lower)[1:], zero]))

    def in_structure(self):
        n, k = self.diag.shape[:2]
        return jax.ShapeDtypeStruct((n * k,), self.diag.dtype)

    def out_structure(self):
        return self.in_structure()


def _register_block_operator():
    cls = BlockTridiagonalLinearOperator
    for fn in (lx.linearise, lx.materialise):
        fn.register(cls)(lambda operator: operator)
    for fn in (lx.is_symmetric, lx.is_diagonal, lx.is_lower_triangular, lx.is_upper_triangular,
               lx.is_positive_semidefinite, lx.is_negative_semidefinite, lx.has_unit_diagonal):
        fn.register(cls)(lambda operator: False)
    lx.is_tridiagonal.register(cls)(lambda operator: operator.diag.shape[-1] == 1)
    lx.diagonal.register(cls)(lambda operator: jnp.diagonal(operator.diag, axis1=-2,
                                                            axis2=-1).reshape(-1))

    @lx.tridiagonal.register(cls)
    def _(operator):
        matrix = operator.as_matrix()
        return (jnp.diagonal(matrix), jnp.diagonal(matrix, -1), jnp.diagonal(matrix, 1))

    @lx.conj.register(cls)
    def _(operator):
        return cls(*(jnp.conj(b) for b in (operator.lower, operator.diag, operator.upper)))


_register_block_operator()


class BlockTDMA(lx.AbstractLinearSolver):
    """Block Thomas (`tridiax.solve_block_tridiagonal`) as a lineax solver.

    For a `BlockTridiagonalLinearOperator` the blocks are used as they are. With `k` given, any
    square lineax operator on 1-D vectors of N k values whose matrix is block tridiagonal (a
    `JacobianLinearOperator`, `MatrixLinearOperator`, ...) is read as bandwidths (2k - 1,
    2k - 1) with 4k - 1 products (`Banded`'s colouring) and solved the same way; entries
    outside the block-tridiagonal pattern are not checked.

    **Fields** (static): `k` (None: the operator must be a `BlockTridiagonalLinearOperator`),
    `pivoting` (default True: partial pivoting inside each diagonal block), `check` (as in
    `tridiax.solve_block_tridiagonal`).

    A non-finite solution is reported as `lineax.RESULTS.singular`. Transposed solves (reverse
    mode) solve with the transposed blocks; gradients w.r.t. the operator come from lineax's
    implicit differentiation.
    """

    k: int | None = eqx.field(static=True, default=None)
    pivoting: bool = eqx.field(static=True, default=True)
    check: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        if self.k is not None and (isinstance(self.k, bool) or not isinstance(self.k, int)
                                   or self.k < 1):
            raise ValueError(f"tridiax.lineax.BlockTDMA(k=...) must be None or a positive "
                             f"integer (the block size), got {self.k!r}.")

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        del options
        if isinstance(operator, BlockTridiagonalLinearOperator):
            return operator
        if self.k is None:
            raise ValueError(
                "tridiax.lineax.BlockTDMA() without k solves BlockTridiagonalLinearOperator; for "
                f"a {type(operator).__name__}, give the block size: BlockTDMA(k=...).")
        in_structure, _ = _vector_structures(operator)
        k = self.k
        if in_structure.shape[0] % k:
            raise ValueError(f"the operator acts on {in_structure.shape[0]} values, not a "
                             f"multiple of the block size k = {k}.")
        return blocks_from_band(band_from_operator(operator, 2 * k - 1, 2 * k - 1), k)

    def compute(self, state, vector, options: dict[str, Any]):
        del options
        n, k = state.diag.shape[:2]
        x = solve_block_tridiagonal(state.lower, state.diag, state.upper, vector.reshape(n, k),
                                    pivoting=self.pivoting, check=self.check).reshape(n * k)
        result = lx.RESULTS.where(jnp.all(jnp.isfinite(x)), lx.RESULTS.successful,
                                  lx.RESULTS.singular)
        return x.astype(jnp.result_type(vector, state.diag)), result, {}

    def transpose(self, state, options: dict[str, Any]):
        return state.transpose(), options

    def conj(self, state, options: dict[str, Any]):
        return lx.conj(state), options

    def assume_full_rank(self) -> bool:
        return True


def blocks_from_band(ab: jax.Array, k: int) -> BlockTridiagonalLinearOperator:
    """The blocks of the block-tridiagonal matrix whose band (bandwidths (2k - 1, 2k - 1),
    scipy's layout ab[w + i - j, j] = A[i, j]) is `ab`."""
    w = 2 * k - 1
    n = ab.shape[1] // k
    rows, cols = jnp.arange(k)[:, None], jnp.arange(k)[None, :]
    block_rows = jnp.arange(n)[:, None, None]

    def block(offset):  # A[i k + r, (i + offset) k + c] for every block row i
        column = (block_rows + offset) * k + cols
        inside = (column >= 0) & (column < n * k)
        values = ab[w - offset * k + rows - cols, jnp.clip(column, 0, n * k - 1)]
        return jnp.where(inside, values, 0)

    return BlockTridiagonalLinearOperator(block(-1), block(0), block(1))
