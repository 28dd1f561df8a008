"""solve_tridiagonal on the pallas_triton backend (the Pallas kernels compiled by Triton, on
CUDA and ROCm GPUs): the contract every backend passes, and the Pallas kernels' own
(solve_contract.py). Collected only where Triton runs on the default device."""

from __future__ import annotations

from solve_contract import PallasSolveContract


class TestPallasTriton(PallasSolveContract):
    backend = "pallas_triton"
