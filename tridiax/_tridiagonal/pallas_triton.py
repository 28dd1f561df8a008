"""Tridiagonal solves as Pallas kernels over the (P, N, Q) view (tiles: `_pallas/tiles.py`).

Each program walks the N rows of its tile of systems: a forward sweep stores one row at a
time, a backward sweep reads them back in reverse and writes x. Three kinds share the band
conventions (row i: sub[i]*x[i-1] + d[i]*x[i] + sup[i]*x[i+1] = b[i]; `transposed` reads the
transposed matrix, sub[i] = u[i-1], sup[i] = l[i+1]):

- "thomas": operands (lower, diag, upper, rhs); elimination stores c' and y'.
- "factored": operands (l, m, c', rhs), the stored factors A = L D V of `factor_pnq`:
  y[i] = b[i] - l[i]*y[i-1], then x[i] = m[i]*y[i] - c'[i]*x[i+1]. Transposed, the same
  sweep reads c'[i-1] and l[i+1], since A^T = V^T D L^T.
- "periodic": operands (lower, diag, upper, rhs) with lower[0] = A[0, N-1] and upper[N-1] =
  A[N-1, 0]; Sherman-Morrison with the split gamma of `_periodic.split`: the tridiagonal part
  T' (d'[0] = d[0] - gamma, d'[N-1] = d[N-1] - alpha*beta/gamma) is eliminated for y and for
  z = T'^{-1}(gamma, 0, ..., 0, beta) in the same sweep, then
  x = y - (y[0] + kappa*y[N-1])/(1 + z[0] + kappa*z[N-1]) z with kappa = alpha/gamma.
- "pivoted": operands (lower, diag, upper, rhs); Gaussian elimination with partial pivoting
  (row interchanges, as LAPACK's gtsv, one fill-in diagonal): U's rows are stored as pivot,
  U1, U2 and y, then x[i] = (y[i] - U1[i] x[i+1] - U2[i] x[i+2]) / pivot[i].

Every sweep divides by its pivots in `verify.sequential_solve`'s order (thomas: c'[i] =
u[i] / p[i], y'[i] = (b[i] - a[i]*y'[i-1]) / p[i] with p[i] = d[i] - a[i]*c'[i-1]; pivoted:
the multiplier (swap ? a : l) / pivot); none multiplies by a rounded reciprocal of a pivot.
Divisions go through the rows' `divide` (`TileRows.divide`: correctly rounded on a GPU too).

Triton has no scratch memory, so c', z (and y' for half precision, which is eliminated in
float32) are extra outputs that the launcher drops.

`factor_pnq` is the forward elimination alone, for `TridiagonalFactorization`: it writes the
factors (l, m, c') that the "factored" kind reads, one sweep and no back substitution; its c'
is the thomas sweep's (u[i] / p[i]), m = 1/p and l[i] = a[i] / p[i-1].
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from .._core.dtypes import compute_dtype
from .._core.layout import broadcast_shape
from .._core.split_complex import SplitComplex, select, zeros_like
from .._pallas import row_tiles as _pallas_rows
from .._pallas.tiles import TileRows, launch
from . import periodic as _periodic
from .xla import pivot_step

# Work rows each kind stores as extra outputs: c' (thomas); c' and z (periodic); none (factored);
# pivot, U1 and U2 (pivoted).
_WORK_OUTPUTS = {"thomas": 1, "factored": 0, "periodic": 2, "pivoted": 3}


def _kernel(l_ref, d_ref, u_ref, b_ref, x_ref, *extra, n, kind, transposed, tiles, P, Q,
            rows_class=TileRows):
    """The sweeps of one program's tile; `rows_class` gives its row access (Triton's masked
    tiles, or the Mosaic GPU warpgroup's columns of `_pallas/mosaic_gpu.py`)."""
    half = len(extra) > _WORK_OUTPUTS[kind]  # one more: y' in float32 for a half-precision x
    y_ref = extra[-1] if half else x_ref
    rows = rows_class(P, Q, tiles, x_ref.dtype if not half else extra[-1].dtype)
    load, store, full, divide = rows.load, rows.store, rows.full, rows.divide

    def sub(i):
        return load(u_ref, i - 1) if transposed else load(l_ref, i)

    def sup(i):
        return load(l_ref, jnp.minimum(i + 1, n - 1)) if transposed else load(u_ref, i)

    def back_substitute(c_ref, v_ref, v_last, out_ref):
        """out[i] = v[i] - c'[i]*out[i+1] from the last row up (out_ref may be v_ref);
        returns out[0]."""

        def step(k, v_next):
            i = n - 2 - k
            v = load(v_ref, i) - load(c_ref, i) * v_next
            store(out_ref, i, v)
            return v

        store(out_ref, n - 1, v_last)
        return lax.fori_loop(0, n - 1, step, full(v_last))

    if kind == "pivoted":
        _pivoted(rows, sub, sup, d_ref, b_ref, y_ref, x_ref, *extra[:3], n=n)
        return

    if kind == "factored":
        y0 = load(b_ref, 0)
        store(y_ref, 0, y0)

        def forward(i, y_prev):
            y = load(b_ref, i) - sub(i) * y_prev
            store(y_ref, i, y)
            return full(y)

        y_last = lax.fori_loop(1, n, forward, full(y0))
        x_last = load(d_ref, n - 1) * y_last  # loaded after the loop: not live across it
        store(x_ref, n - 1, x_last)

        def backward(k, x_next):
            i = n - 2 - k
            x = load(d_ref, i) * load(y_ref, i) - sup(i) * x_next
            store(x_ref, i, x)
            return full(x)

        lax.fori_loop(0, n - 1, backward, full(x_last))
        return

    c_ref = extra[0]
    periodic = kind == "periodic"

    def corners():
        # alpha = A[0, N-1], beta = A[N-1, 0] and the split gamma; loaded again after the
        # elimination loop rather than kept live across it.
        lo0, upn = load(l_ref, 0), load(u_ref, n - 1)
        alpha, beta = (upn, lo0) if transposed else (lo0, upn)
        return alpha, beta, _periodic.split_values(load(d_ref, 0), alpha, sup(0), divide)

    p_first = load(d_ref, 0)
    if periodic:
        z_ref = extra[1]
        _, _, gamma = corners()
        p_first = p_first - gamma
    carry = (full(divide(sup(0), p_first)), full(divide(load(b_ref, 0), p_first)))
    store(c_ref, 0, carry[0])
    store(y_ref, 0, carry[1])
    if periodic:
        carry += (full(divide(gamma, p_first)),)
        store(z_ref, 0, carry[2])

    def eliminate(i, carry):
        a = sub(i)
        p = load(d_ref, i) - a * carry[0]
        c = divide(sup(i), p)
        y = divide(load(b_ref, i) - a * carry[1], p)
        store(c_ref, i, c)
        store(y_ref, i, y)
        out = (full(c), full(y))
        if periodic:
            z = divide(-a * carry[2], p)
            store(z_ref, i, z)
            out += (full(z),)
        return out

    if not periodic:
        _, y_last = lax.fori_loop(1, n, eliminate, carry)
        back_substitute(c_ref, y_ref, y_last, x_ref)
        return

    # Periodic: rows 1..N-2 as usual, row N-1 with d'[N-1] = d[N-1] - alpha*beta/gamma and
    # u[N-1] = beta, then x = y - f z with f = (y[0] + kappa*y[N-1]) / (1 + z[0] + kappa*z[N-1]),
    # kappa = alpha/gamma: `verify.sequential_solve`'s order (the corners are loaded again here
    # rather than kept live across the loop).
    carry = lax.fori_loop(1, n - 1, eliminate, carry)
    alpha, beta, gamma = corners()
    a = sub(n - 1)
    p = (load(d_ref, n - 1) - divide(alpha * beta, gamma)) - a * carry[0]
    y_last = divide(load(b_ref, n - 1) - a * carry[1], p)
    z_last = divide(beta - a * carry[2], p)
    y_first = back_substitute(c_ref, y_ref, y_last, y_ref)
    z_first = back_substitute(c_ref, z_ref, z_last, z_ref)
    kappa = divide(alpha, gamma)
    f = divide(y_first + kappa * y_last, 1 + z_first + kappa * z_last)

    def combine(i, _):
        store(x_ref, i, load(y_ref, i) - f * load(z_ref, i))

    lax.fori_loop(0, n, combine, None)


def _pivoted(rows, sub, sup, d_ref, b_ref, y_ref, x_ref, pivot_ref, u1_ref, u2_ref, *, n):
    """Elimination with partial pivoting (`_xla_thomas.pivot_step`); U's rows are stored as
    pivot, U1, U2 (work outputs) and y, then substituted back from the last row, dividing by
    each pivot."""
    load, store, full, divide = rows.load, rows.store, rows.full, rows.divide
    zero = full(zeros_like(load(d_ref, 0)))  # full(): the row layout, for loop carries
    pending = (full(load(d_ref, 0)), full(sup(0)) if n > 1 else zero, full(load(b_ref, 0)))

    def forward(i, pending):
        un = select(i + 2 < n, sup(i + 1), 0)  # sup(N-1) lies outside the matrix
        kept, pending = pivot_step(pending, sub(i + 1), load(d_ref, i + 1), un,
                                   load(b_ref, i + 1), divide=divide)
        for ref, value in zip((pivot_ref, u1_ref, u2_ref, y_ref), kept, strict=True):
            store(ref, i, value)
        return tuple(full(v) for v in pending)

    a, _, f = lax.fori_loop(0, n - 1, forward, pending)
    x_last = divide(f, a)
    store(x_ref, n - 1, x_last)

    def backward(k, carry):
        i = n - 2 - k
        x1, x2 = carry
        x = divide(load(y_ref, i) - load(u1_ref, i) * x1 - load(u2_ref, i) * x2,
                   load(pivot_ref, i))
        store(x_ref, i, x)
        return full(x), x1

    lax.fori_loop(0, n - 1, backward, (full(x_last), zero))


def _factor_kernel(l_ref, d_ref, u_ref, lo_ref, m_ref, c_ref, *, n, dtype, tiles, P, Q,
                   rows_class=TileRows):
    """The factors of one program's tile (`_xla_thomas.factor_sweep` states them): pivots
    p[i] = d[i] - lower[i]*c'[i-1], c'[i] = upper[i] / p[i] (c'[N-1] = 0), m[i] = 1/p[i] and
    l[i] = lower[i] / p[i-1] (l[0] = 0), in the compute `dtype`. `rows_class` as for
    `_kernel`."""
    rows = rows_class(P, Q, tiles, dtype)
    load, store, full, divide = rows.load, rows.store, rows.full, rows.divide

    def inverse(p):  # 1/p, a quotient like every other (a complex one directly, by Smith)
        return divide(jnp.ones_like(p.re) if isinstance(p, SplitComplex) else 1, p)

    p0 = load(d_ref, 0)
    store(m_ref, 0, inverse(p0))
    store(lo_ref, 0, zeros_like(p0))
    if n == 1:
        store(c_ref, 0, zeros_like(p0))
        return

    def row(i, p_prev, c_prev):
        a = load(l_ref, i)
        p = load(d_ref, i) - a * c_prev
        store(lo_ref, i, divide(a, p_prev))
        store(m_ref, i, inverse(p))
        return p

    def eliminate(i, carry):
        p = row(i, *carry)
        c = divide(load(u_ref, i), p)
        store(c_ref, i, c)
        return full(p), full(c)

    c0 = divide(load(u_ref, 0), p0)
    store(c_ref, 0, c0)
    carry = lax.fori_loop(1, n - 1, eliminate, (full(p0), full(c0)))
    p = row(n - 1, *carry)  # the last row has no upper band: c'[N-1] = 0
    store(c_ref, n - 1, zeros_like(p))


def _rows_class(interpret: bool):
    """The kernels' row access: compiled by Triton unless interpreted (`TileRows`)."""
    return functools.partial(TileRows, compiled=not interpret)


def factor_pnq(l, d, u, *, out_dtype, interpret: bool = False, tiles=None,
               compiler_params=None):
    """The factors (l, m, c') of the (P|1, N|1, Q|1) bands' systems along axis 1 with the
    Pallas kernel, as `_xla_thomas.factor_pnq`: three (P, N, Q) arrays of `out_dtype`."""
    N = broadcast_shape(l, d, u)[1]
    kernel = functools.partial(_factor_kernel, n=N, dtype=compute_dtype(out_dtype),
                               rows_class=_rows_class(interpret))
    return tuple(launch(kernel, (l, d, u), [(N, out_dtype)] * 3, name="tridiax_factor",
                        interpret=interpret, tiles=tiles, compiler_params=compiler_params))


def solve_pnq(l, d, u, b, *, transposed: bool, out_dtype, kind: str = "thomas",
              interpret: bool = False, tiles=None, compiler_params=None):
    """Solve along axis 1 of (P|1, N|1, Q|1) operands with the Pallas kernel; returns (P, N, Q).

    `kind`: "thomas", "factored", "periodic" or "pivoted" (see the module docstring). Plain
    systems with contiguous rows (Q = 1) and no tile given go by tiles of rows
    (`_pallas/row_tiles.py`)."""
    P, N, Q = broadcast_shape(l, d, u, b)
    if tiles is None and _pallas_rows.applies(P, N, Q, out_dtype, kind=kind):
        return _pallas_rows.solve_pnq(l, d, u, b, transposed=transposed, out_dtype=out_dtype,
                                      interpret=interpret, compiler_params=compiler_params,
                                      rows=_pallas_rows.INTERPRET_ROWS if interpret else None)
    cdt = compute_dtype(out_dtype)
    outs = [(N, out_dtype)] + [(N, cdt)] * _WORK_OUTPUTS[kind]
    if jnp.dtype(cdt) != jnp.dtype(out_dtype):
        outs.append((N, cdt))
    kernel = functools.partial(_kernel, n=N, kind=kind, transposed=transposed,
                               rows_class=_rows_class(interpret))
    return launch(kernel, (l, d, u, b), outs, name="tridiax_thomas", interpret=interpret,
                  tiles=tiles, compiler_params=compiler_params)[0]
