"""The XLA formulation of the banded solve (`_banded/xla.py`), the program every platform can
run and the one the native and Pallas kernels follow step for step.

`TestXla` runs the banded kernel contract (banded_contract.py) on it against
scipy.linalg.solve_banded: every bandwidth, kind and orientation, short systems, broadcast
bands, every dtype, breakdowns and pivot ties. Each case compiles a program of its own (at
XLA's optimization level 0), so the cases are fewer than the native kernel's; it is not
compared with itself.
"""

from __future__ import annotations

import numpy as np
from banded_contract import ALL_DTYPES, BANDS, EVERY_BROADCAST, KINDS, SHORT, BandedKernelContract, xla_solve


class TestXla(BandedKernelContract):
    TWIN = False
    SYSTEMS = ([(l, u, kind, 33, t) for l, u in BANDS for kind in KINDS for t in (False, True)]
               + [(l, u, kind, n, t) for l, u in BANDS for n, kind, t in SHORT])
    LAYOUTS = [(2, 2, "banded_pivoted", True, (2, 33, 21), np.float32),
               (1, 1, "banded_hermitian", False, (37, 33, 1), np.float32),
               (3, 1, "banded", True, (40, 7, 3), np.float32)]
    BROADCASTS = EVERY_BROADCAST
    DTYPES = [(2, 2, kind, t, (3, 33, 19), dtype) for dtype in ALL_DTYPES for kind in KINDS
              for t in (False, True)]
    INDEFINITE = [(l, t, (3, 33, 19), dtype) for l in (0, 2) for t in (False, True)
                  for dtype in (np.float32, np.complex128)]
    # No system is empty: the public functions refuse N = 0.
    ZERO_SIZES = [(0, 7, 5), (3, 7, 0)]

    test_matches_the_xla_formulation = None
    test_broadcast_bands_match_the_xla_formulation = None
    test_dtypes_match_the_xla_formulation = None

    def solve(self, ab, b, **options):
        return xla_solve(ab, b, **options)

    def batch(self, n):
        return [(2, n, 19)]
