"""tridiax: batched tridiagonal solves and linear recurrences for JAX.

Pallas kernels along any axis of a batched array, gradients by implicit differentiation,
verified against SciPy.
"""

import importlib.metadata

from . import verify as verify
from ._modules import IndRNN as IndRNN
from ._modules import LinearRecurrence as LinearRecurrence
from ._recurrence import indrnn as indrnn
from ._recurrence import linear_recurrence as linear_recurrence
from ._solve import solve_tridiagonal as solve_tridiagonal

__version__ = importlib.metadata.version("tridiax")
