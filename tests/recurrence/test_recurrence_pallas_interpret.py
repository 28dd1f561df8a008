"""linear_recurrence and indrnn on the pallas_interpret backend (the Pallas Triton kernels in
interpret mode, tested on CPU): the contract every backend passes, and the Pallas kernels' own
(no activation on complex values; recurrence_contract.py)."""

from __future__ import annotations

from recurrence_contract import PallasRecurrenceContract


class TestPallasInterpret(PallasRecurrenceContract):
    backend = "pallas_interpret"
