"""solve_tridiagonal on the xla backend (the fori_loop formulation, on every platform): the
contract every backend passes (solve_contract.py)."""

from __future__ import annotations

from solve_contract import SolveContract


class TestXla(SolveContract):
    backend = "xla"
