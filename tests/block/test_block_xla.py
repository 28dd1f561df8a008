"""The XLA formulation of the block-tridiagonal solve (`_block/xla.py`), the program every
platform can run and the one the native and Pallas kernels follow step for step.

`TestXla` runs the block kernel contract (block_contract.py) on it against dense solves of the
assembled matrices: block sizes unrolled small and large, every kind and orientation, short
systems, broadcast blocks, every dtype, breakdowns and pivot ties. Each case compiles a program
of its own (at XLA's optimization level 0), so the cases are fewer than the native kernel's; it
is not compared with itself.
"""

from __future__ import annotations

import numpy as np
from block_contract import ALL_DTYPES, EVERY_BROADCAST, KINDS, SIZES, BlockKernelContract, xla_solve


class TestXla(BlockKernelContract):
    TWIN = False
    SYSTEMS = ([(k, 33, 1, np.float64, kind, t) for k in (1, 2, 3, 4, 8) for kind in KINDS
                for t in (False, True)]
               + [(2, n, m, np.float64, kind, t) for n, m in SIZES[:-1] for kind, t in
                  [("block", True), ("block_pivoted", False), ("block_hermitian", True)]])
    LAYOUTS = [(2, 2, np.float32, (2, 33, 21), kind, broadcast) for kind, broadcast in EVERY_BROADCAST]
    DTYPES = [(2, (3, 7, 19), dtype) for dtype in ALL_DTYPES]
    PIVOTING = [(2, (2, 17, 19), t) for t in (False, True)]
    SINGULAR = [(2, (3, 9, 19), kind) for kind in KINDS]
    INDEFINITE = [(k, (3, 9, 19), dtype) for k in (1, 2) for dtype in (np.float32, np.complex128)]
    # No system and no block is empty: the public functions refuse N = 0 and k = 0.
    ZERO_SIZES = [(shape, 2, m) for shape in [(0, 7, 5), (3, 7, 0), (3, 7, 5)] for m in (1, 0)
                  if 0 in (*shape, m)]

    test_matches_the_xla_formulation = None

    def solve(self, *operands, **options):
        return xla_solve(*operands, **options)

    def batch(self, k, n):
        return [(2, n, 5)]
