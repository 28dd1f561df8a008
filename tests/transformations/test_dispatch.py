"""Per-call overhead: an eager call is one compiled program, traced once per configuration.

Timing lives in benchmarks/bench_small.py; what can be tested is the mechanism: repeated
eager calls with the same shapes neither retrace nor recompile their one program.
"""

import jax.numpy as jnp
import numpy as np

import tridiax
from tridiax._recurrence import api as _recurrence
from tridiax._tridiagonal import api as _solve


def _count_traces(module, monkeypatch):
    traces = []
    original = module._compute

    def counting(*args):
        traces.append(1)
        return original(*args)

    monkeypatch.setattr(module, "_compute", counting)
    return traces


def test_eager_solves_trace_once_per_configuration(monkeypatch):
    traces = _count_traces(_solve, monkeypatch)
    bands = [jnp.ones((10, 10)), 4 * jnp.ones((10, 10)), jnp.ones((10, 10))]
    for k in range(3):
        x = tridiax.solve_tridiagonal(*bands, jnp.full((10, 10), float(k)))
    assert len(traces) == 1
    np.testing.assert_allclose(x, tridiax.verify.reference_solve(*bands, np.full((10, 10), 2.0)),
                               rtol=1e-13)
    tridiax.solve_tridiagonal(*bands, jnp.ones((10, 10)), check=True)
    tridiax.solve_tridiagonal(*bands, jnp.ones((10, 10)), check=True)
    assert len(traces) == 2  # one more configuration (check=True), traced once


def test_eager_recurrences_trace_once(monkeypatch):
    traces = _count_traces(_recurrence, monkeypatch)
    for _ in range(3):
        tridiax.linear_recurrence(jnp.full((32,), 0.5), jnp.ones((10, 32)))
    assert len(traces) == 1
