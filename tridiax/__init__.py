"""tridiax: batched tridiagonal solves and linear recurrences for JAX.

Pallas kernels along any axis of a batched array, gradients by implicit differentiation,
verified against SciPy. `tridiax.lineax` (lineax interop) is imported on first use.
"""

import importlib
import importlib.metadata

from . import verify as verify
from ._factorization import TridiagonalFactorization as TridiagonalFactorization
from ._modules import IndRNN as IndRNN
from ._modules import LinearRecurrence as LinearRecurrence
from ._operator import TDMA as TDMA
from ._operator import Tridiagonal as Tridiagonal
from ._recurrence import indrnn as indrnn
from ._recurrence import linear_recurrence as linear_recurrence
from ._solve import solve_periodic_tridiagonal as solve_periodic_tridiagonal
from ._solve import solve_tridiagonal as solve_tridiagonal

__version__ = importlib.metadata.version("tridiax")


def __getattr__(name: str):
    # `tridiax.lineax` needs the optional lineax package: import it only when asked for.
    if name == "lineax":
        return importlib.import_module(".lineax", __name__)
    raise AttributeError(f"module 'tridiax' has no attribute {name!r}")
