"""Run by test_levels.py in a process of its own with TRIDIAX_CPU_LEVEL set: solves every family
with the native kernel at that level on awkward shapes and prints, as one JSON line, the level
the process loaded and each case's error against an independent float64 reference, with the
error of the plain sequential sweep in the same dtype beside it (`tridiax.verify`) where there
is one."""

from __future__ import annotations

import json
import os
import sys

import jax
import numpy as np
import scipy.linalg

jax.config.update("jax_enable_x64", True)

import tridiax  # noqa: E402
from tridiax import verify  # noqa: E402
from tridiax._native import build  # noqa: E402


def relative(x, reference):
    x, reference = np.asarray(x, np.complex128), np.asarray(reference, np.complex128)
    return float(np.max(np.abs(x - reference)) / max(np.max(np.abs(reference)), 1e-300))


def tridiagonal_cases(rng):
    for dtype in (np.float32, np.float64, np.complex64, np.complex128):
        for shape, axis in (((37, 33), -1), ((33, 37), 0), ((5,), 0), ((3, 1), -1), ((4, 3), -1)):
            n = shape[axis]
            draw = (lambda s: rng.uniform(-1, 1, s) + 1j * rng.uniform(-1, 1, s)) \
                if np.issubdtype(dtype, np.complexfloating) else (lambda s: rng.uniform(-1, 1, s))
            lower, upper, rhs = draw(shape), draw(shape), draw(shape)
            diag = draw(shape) + 3
            bands = [v.astype(dtype) for v in (lower, diag, upper, rhs)]
            for kind, options in (("thomas", {}), ("pivoted", {"pivoting": True})):
                x = tridiax.solve_tridiagonal(*bands, axis=axis, **options)
                want = verify.reference_solve(*bands, axis=axis)
                sweep = verify.sequential_solve(*bands, axis=axis, dtype=dtype, **options)
                yield (f"tridiagonal {kind} {np.dtype(dtype).name} {shape} axis={axis} n={n}",
                       relative(x, want), relative(sweep, want))
            if n < 3:  # a periodic system needs three rows
                continue
            x = tridiax.solve_periodic_tridiagonal(*bands, axis=axis)
            want = verify.reference_solve(*bands, axis=axis, periodic=True)
            sweep = verify.sequential_solve(*bands, axis=axis, dtype=dtype, periodic=True)
            yield (f"tridiagonal periodic {np.dtype(dtype).name} {shape} axis={axis}",
                   relative(x, want), relative(sweep, want))


def recurrence_cases(rng):
    for dtype in (np.float32, np.float64):
        for T, F in ((1, 3), (50, 7), (33, 1)):
            a = rng.uniform(-0.99, 0.99, (T, F)).astype(dtype)
            x = rng.standard_normal((T, F)).astype(dtype)
            want, same_dtype, tanh_want = [], [], []
            h, h_dtype, v = np.zeros(F), np.zeros(F, dtype), np.zeros(F)
            for t in range(T):
                h = a[t].astype(np.float64) * h + x[t]
                h_dtype = a[t] * h_dtype + x[t]
                v = np.tanh(a[0].astype(np.float64) * v + x[t])
                want.append(h)
                same_dtype.append(h_dtype)
                tanh_want.append(v)
            out = tridiax.linear_recurrence(a, x, axis=0)
            yield (f"recurrence {np.dtype(dtype).name} T={T} F={F}", relative(out, np.stack(want)),
                   relative(np.stack(same_dtype), np.stack(want)))
            out = tridiax.indrnn(a[0], x, axis=0, activation=jax.numpy.tanh)
            yield (f"indrnn tanh {np.dtype(dtype).name} T={T} F={F}", relative(out, np.stack(tanh_want)),
                   None)


def banded_cases(rng):
    for dtype in (np.float32, np.float64, np.complex128):
        for (l, u), n in (((2, 1), 9), ((1, 3), 33), ((4, 4), 2)):
            ab = rng.uniform(-1, 1, (l + u + 1, n))
            ab[u] += 3 * (l + u)
            if np.issubdtype(dtype, np.complexfloating):
                ab = ab + 1j * rng.uniform(-1, 1, ab.shape)
            b = rng.standard_normal((n, 3))
            for pivoting in (True, False):
                x = tridiax.solve_banded((l, u), ab.astype(dtype), b.astype(dtype), axis=0, pivoting=pivoting)
                want = scipy.linalg.solve_banded((l, u), ab.astype(dtype).astype(np.complex128),
                                                 b.astype(dtype).astype(np.complex128))
                yield (f"banded ({l}, {u}) n={n} pivoting={pivoting} {np.dtype(dtype).name}",
                       relative(x, want), None)


def block_cases(rng):
    for dtype in (np.float32, np.float64, np.complex128):
        for k, n in ((1, 5), (2, 7), (3, 1), (8, 3)):
            def draw(shape):
                v = rng.uniform(-1, 1, shape)
                return v + 1j * rng.uniform(-1, 1, shape) if np.issubdtype(dtype, np.complexfloating) else v
            lower, diag, upper = draw((4, n, k, k)), draw((4, n, k, k)) + 3 * k * np.eye(k), draw((4, n, k, k))
            rhs = draw((4, n, k))
            lower, diag, upper, rhs = (v.astype(dtype) for v in (lower, diag, upper, rhs))
            for pivoting in (True, False):
                x = tridiax.solve_block_tridiagonal(lower, diag, upper, rhs, pivoting=pivoting)
                want = verify.reference_solve_block_tridiagonal(lower, diag, upper, rhs)
                yield (f"block k={k} n={n} pivoting={pivoting} {np.dtype(dtype).name}",
                       relative(x, want), None)


def main():
    rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    if not build.available():
        print(json.dumps({"level": None, "why": build.unavailable_reason()}))
        return
    cases = [*tridiagonal_cases(rng), *recurrence_cases(rng), *banded_cases(rng), *block_cases(rng)]
    choice = build.choice()
    print(json.dumps({"level": choice.level, "origin": choice.origin, "pinned": os.environ.get("TRIDIAX_CPU_LEVEL"),
                      "default_backend_native": tridiax._core.backend.default_backend("cpu", np.float32) == "native",
                      "cases": cases}))


if __name__ == "__main__":
    main()
