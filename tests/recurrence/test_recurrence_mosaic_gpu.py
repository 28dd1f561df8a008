"""linear_recurrence and indrnn on the mosaic_gpu backend (the Pallas Mosaic GPU kernels,
NVIDIA Hopper and later): the contract every backend passes, in the real 16- and 32-bit dtypes
it runs (recurrence_contract.py). Collected only where Mosaic GPU runs on the default
device."""

from __future__ import annotations

from recurrence_contract import RecurrenceContract


class TestMosaicGpu(RecurrenceContract):
    backend = "mosaic_gpu"
