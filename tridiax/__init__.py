"""tridiax: batched tridiagonal solves and linear recurrences for JAX.

Kernels along any axis of a batched array, gradients by implicit differentiation, verified
against SciPy (`tridiax.verify`). `tridiax.lineax` (lineax interop) is imported on first use.

Solves: `solve_tridiagonal`, `solve_periodic_tridiagonal`, `solve_banded`, `solveh_banded`
(scipy's banded layout), `solve_block_tridiagonal`, `solveh_block_tridiagonal`; operators
`Banded`, `BandedFactorization`, `BlockTridiagonal`, `BlockTridiagonalFactorization`, and solvers (Equinox
modules): `Tridiagonal`, `TDMA`, `TridiagonalFactorization`; recurrences: `linear_recurrence`,
`indrnn`, `LinearRecurrence`, `IndRNN`; `BreakdownError` is what `check=True` raises.
How `axis` and shapes are read, for all of them: docs/guides/tridiagonal.md, "Shapes and axis".
"""

import importlib

from . import verify as verify
from ._banded.api import solve_banded as solve_banded
from ._banded.api import solveh_banded as solveh_banded
from ._banded.operator import Banded as Banded
from ._banded.operator import BandedFactorization as BandedFactorization
from ._block.api import solve_block_tridiagonal as solve_block_tridiagonal
from ._block.api import solveh_block_tridiagonal as solveh_block_tridiagonal
from ._block.operator import BlockTridiagonal as BlockTridiagonal
from ._block.operator import BlockTridiagonalFactorization as BlockTridiagonalFactorization
from ._core.check import BreakdownError as BreakdownError
from ._recurrence.api import indrnn as indrnn
from ._recurrence.api import linear_recurrence as linear_recurrence
from ._recurrence.modules import IndRNN as IndRNN
from ._recurrence.modules import LinearRecurrence as LinearRecurrence
from ._tridiagonal.api import solve_periodic_tridiagonal as solve_periodic_tridiagonal
from ._tridiagonal.api import solve_tridiagonal as solve_tridiagonal
from ._tridiagonal.factorization import TridiagonalFactorization as TridiagonalFactorization
from ._tridiagonal.operator import TDMA as TDMA
from ._tridiagonal.operator import Tridiagonal as Tridiagonal
from ._version import version as _version

__version__ = _version()

__all__ = [
    "Banded",
    "BandedFactorization",
    "BlockTridiagonal",
    "BlockTridiagonalFactorization",
    "BreakdownError",
    "IndRNN",
    "LinearRecurrence",
    "TDMA",
    "Tridiagonal",
    "TridiagonalFactorization",
    "indrnn",
    "linear_recurrence",
    "solve_banded",
    "solve_block_tridiagonal",
    "solve_periodic_tridiagonal",
    "solve_tridiagonal",
    "solveh_banded",
    "solveh_block_tridiagonal",
    "verify",
]


def __getattr__(name: str):
    # `tridiax.lineax` needs the optional lineax package: import it only when asked for.
    if name == "lineax":
        return importlib.import_module(".lineax", __name__)
    raise AttributeError(f"module 'tridiax' has no attribute {name!r}")
