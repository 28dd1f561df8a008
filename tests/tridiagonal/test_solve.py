"""solve_tridiagonal whatever the backend: every backend this machine runs agrees with the
others to rounding; the public function takes lists and NumPy arrays under jit and an empty
batch; and nothing in the lowered program (solve and gradient) grows with the number of rows
but the levels of chunking. Each backend's own tests are in test_solve_<backend>.py (the
contract all of them pass, in solve_contract.py)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from helpers import assert_close, backends, random_bands

import tridiax
from tridiax import verify
from tridiax._core import planner as _planner
from tridiax._tridiagonal.api import solve


def test_backends_agree_to_rounding():
    args = [jnp.asarray(a) for a in random_bands((33, 70), np.float32, seed=9)]
    results = [np.asarray(solve(*args, axis=1, backend=b)) for b in backends()]
    for r in results[1:]:
        np.testing.assert_allclose(r, results[0], rtol=1e-5, atol=1e-6)


def test_public_function_under_jit_with_lists_and_numpy():
    lower, diag, upper, rhs = random_bands((4, 3), np.float64, seed=1)
    f = jax.jit(tridiax.solve_tridiagonal, static_argnames="axis")
    x = f(lower.tolist(), diag, jnp.asarray(upper), rhs, axis=0)
    assert_close(x, verify.reference_solve(lower, diag, upper, rhs, axis=0), np.float64)


def test_empty_batch():
    x = tridiax.solve_tridiagonal(jnp.ones((4, 0)), jnp.ones((4, 0)), jnp.ones((4, 0)),
                                  jnp.ones((4, 0)), axis=0)
    assert x.shape == (4, 0)


def _program_sizes(n, **settings):
    """Sizes of the lowered solve and its gradient for 4 systems of n rows along axis 0, with
    every number in the text replaced by one letter (shapes and chunk counts vary with n), and
    the total length of long string literals apart (a GPU kernel's serialized IR, whose
    encoding changes a little with the numbers in it)."""
    args = [jax.ShapeDtypeStruct((n, 4), jnp.float32)] * 4

    def f(*a):
        return solve(*a, axis=0, **settings)

    texts = (jax.jit(f).lower(*args).as_text(),
             jax.jit(jax.grad(lambda *a: jnp.sum(f(*a)), argnums=(0, 1, 2, 3))).lower(*args)
             .as_text())
    long_strings = re.compile(r'"[^"]{400,}"')
    return tuple((len(re.sub(r"\d+", "N", long_strings.sub('""', t))),
                  sum(map(len, long_strings.findall(t)))) for t in texts)


def test_compile_time_flat_in_n(monkeypatch):
    # Nothing is unrolled over N: whole systems lower to the same program for every N, up to
    # numbers. Chunked ones add a level of chunking as N grows (a few, on GPU: the reduced
    # system is chunked again while it is long), so 10x the rows may add a level, never the
    # 10x a loop unrolled over N would.
    programs = [_program_sizes(n, chunk=0) for n in (8, 64, 512, 4096)]
    assert len({tuple(text for text, _ in p) for p in programs}) == 1, programs
    for kernels in zip(*((k for _, k in p) for p in programs)):  # per program, across n
        assert max(kernels) <= 1.1 * min(kernels), programs
    # Chunked by the planner (told of a small last-level cache, in which (n, 4) would run
    # whole: `solve_chunk`).
    monkeypatch.setattr(_planner, "cpu_last_cache_bytes", lambda: 1 << 16)
    programs = [_program_sizes(n) for n in (50_000, 500_000, 5_000_000)]
    for smaller, larger in zip(programs, programs[1:]):
        for (text, kernels), (text10, kernels10) in zip(smaller, larger):
            assert text10 <= 2.5 * text and kernels10 <= 2.5 * max(kernels, 1), programs
