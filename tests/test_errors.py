"""Bad input fails at trace time with a message naming the argument and the shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tridiax
from tridiax._solve import solve


def _ones(*shapes):
    return [jnp.ones(s) for s in shapes]


def test_shapes_that_do_not_broadcast():
    with pytest.raises(ValueError, match=r"do not broadcast.*lower\(5,\).*rhs\(4,\)"):
        tridiax.solve_tridiagonal(*_ones((5,), (5,), (5,), (4,)))


@pytest.mark.parametrize("axis", [2, -3, 10])
def test_axis_out_of_range(axis):
    with pytest.raises(ValueError, match=rf"axis={axis} is out of range.*\(5, 3\)"):
        tridiax.solve_tridiagonal(*_ones((5, 3), (5, 3), (5, 3), (5, 3)), axis=axis)


def test_axis_must_be_an_int():
    with pytest.raises(TypeError, match="axis must be an int"):
        tridiax.solve_tridiagonal(*_ones((5,), (5,), (5,), (5,)), axis=0.0)


@pytest.mark.parametrize("name,position", [("lower", 0), ("diag", 1), ("upper", 2), ("rhs", 3)])
@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_])
def test_integer_and_boolean_arrays(name, position, dtype):
    args = _ones((4,), (4,), (4,), (4,))
    args[position] = args[position].astype(dtype)
    with pytest.raises(TypeError, match=rf"^{name} has dtype {jnp.dtype(dtype)}"):
        tridiax.solve_tridiagonal(*args)


def test_size_zero_solve_axis():
    with pytest.raises(ValueError, match=r"axis 0 has size 0.*\(0, 3\)"):
        tridiax.solve_tridiagonal(*_ones((0, 3), (0, 3), (0, 3), (0, 3)), axis=0)


def test_scalars():
    with pytest.raises(ValueError, match="0-d"):
        tridiax.solve_tridiagonal(1.0, 2.0, 1.0, 1.0)


def test_not_an_array():
    with pytest.raises(TypeError, match="^rhs must be an array"):
        tridiax.solve_tridiagonal(jnp.ones(3), jnp.ones(3), jnp.ones(3), "abc")


def test_unknown_backend():
    with pytest.raises(ValueError, match="backend must be None or one of"):
        solve(*_ones((3,), (3,), (3,), (3,)), backend="cuda")


def test_errors_are_raised_at_trace_time_under_jit():
    f = jax.jit(lambda *a: tridiax.solve_tridiagonal(*a))
    with pytest.raises(ValueError, match="do not broadcast"):
        f(*_ones((5,), (5,), (5,), (6,)))


def test_mixed_float_dtypes_promote():
    x = tridiax.solve_tridiagonal(jnp.ones(3, jnp.float32), 3 * jnp.ones(3, jnp.float64),
                                  np.ones(3, np.float16), jnp.ones(3, jnp.float32))
    assert x.dtype == jnp.float64
