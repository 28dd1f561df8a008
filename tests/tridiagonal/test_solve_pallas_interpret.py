"""solve_tridiagonal on the pallas_interpret backend (the Pallas Triton kernels in interpret
mode, tested on CPU): the contract every backend passes, and the Pallas kernels' own (a user's
tile cut to the systems, complex systems as real and imaginary parts; solve_contract.py).

Long systems along a leading axis are left to the compiled backends: interpret mode runs one
program per system column, minutes for 40 systems of 20 000 rows, on no path the other tests
do not take."""

from __future__ import annotations

from solve_contract import PallasSolveContract


class TestPallasInterpret(PallasSolveContract):
    backend = "pallas_interpret"
    test_long_systems_along_a_leading_axis = None  # not a test here: the docstring says why
