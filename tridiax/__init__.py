"""tridiax: batched tridiagonal solves and linear recurrences for JAX.

Pallas kernels along any axis of a batched array, gradients by implicit differentiation,
verified against SciPy.
"""

import importlib.metadata

from . import verify as verify
from ._solve import solve_tridiagonal as solve_tridiagonal

__version__ = importlib.metadata.version("tridiax")
