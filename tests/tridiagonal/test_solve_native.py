"""solve_tridiagonal on the native backend (the C++ kernels through XLA FFI, CPU): the
contract every backend passes (solve_contract.py), with batch-first systems on both of the
kernel's paths (strided tiles of up to two vectors of systems, and tiles of four vectors for
many short systems, the planner's choice forced) at every size around the vector length (8 or
16 rows) and the blocks of its 8x8 transposes (16 rows)."""

from __future__ import annotations

from solve_contract import BATCH_FIRST_SIZES, SolveContract


class TestNative(SolveContract):
    backend = "native"
    batch_first_paths = ("strided", "tiles")
    batch_first_sizes = BATCH_FIRST_SIZES
