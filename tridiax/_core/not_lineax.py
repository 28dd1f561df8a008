"""tridiax's operators and factorizations are not lineax operators: each holds a batch of
systems lying along an axis of N-d arrays, where a lineax operator is one system acting on a
pytree. `lineax.linear_solve(tridiax.Tridiagonal(...), b, solver=tridiax.TDMA())` asks the
operator for `out_structure` before anything else; without this module that fails with
"'Tridiagonal' object has no attribute 'out_structure'", which does not say what to do.

`attribute_error(advice)` makes a class's `__getattr__`: the methods of
`lineax.AbstractLinearOperator` that tridiax's classes lack raise an AttributeError (so
`hasattr` and duck typing still see them missing) that says the object is not a lineax
operator and what to call or pass instead; any other missing attribute raises Python's usual
error.
"""

from __future__ import annotations

# The methods of lineax.AbstractLinearOperator that only lineax operators have (tridiax's
# operators have mv and as_matrix too, with their batched meaning, and `.T` for transpose).
LINEAX_METHODS = frozenset({"in_structure", "out_structure", "in_size", "out_size"})


def message(cls_name: str, attribute: str, advice: str) -> str:
    return (f"tridiax.{cls_name} is not a lineax operator (it has no `{attribute}`, which "
            f"lineax asks its operators for): it holds a batch of systems lying along an "
            f"axis, where a lineax operator is one system. {advice}")


def attribute_error(advice: str):
    """A `__getattr__` for a tridiax class whose instances lineax may be handed by mistake;
    `advice` says what to do instead."""

    def __getattr__(self, name: str):
        if name in LINEAX_METHODS:
            raise AttributeError(message(type(self).__name__, name, advice), name=name,
                                 obj=self)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}",
                             name=name, obj=self)

    return __getattr__
