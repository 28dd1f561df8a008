"""linear_recurrence and indrnn on the xla backend (the XLA formulation, on every platform):
the contract every backend passes (recurrence_contract.py), IndRNN with a user's activation
included."""

from __future__ import annotations

from recurrence_contract import RecurrenceContract


class TestXla(RecurrenceContract):
    backend = "xla"
