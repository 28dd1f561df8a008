"""linear_recurrence and indrnn on the pallas_triton backend (the Pallas kernels compiled by
Triton, on CUDA and ROCm GPUs): the contract every backend passes, and the Pallas kernels' own
(recurrence_contract.py). Collected only where Triton runs on the default device."""

from __future__ import annotations

from recurrence_contract import PallasRecurrenceContract


class TestPallasTriton(PallasRecurrenceContract):
    backend = "pallas_triton"
