"""Bad input fails at trace time with a message naming the argument and the shapes."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import backends, random_bands

import tridiax
from tridiax._tridiagonal.api import solve


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


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("pivoting", [False, True])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("name", ["lower", "diag", "upper", "rhs"])
def test_nan_or_inf_in_one_system_stays_there(backend, pivoting, bad, name):
    args = random_bands((6, 4), np.float64, seed=1)  # 4 systems along axis 0
    clean = np.asarray(solve(*args, axis=0, backend=backend, pivoting=pivoting))
    position = ("lower", "diag", "upper", "rhs").index(name)
    args[position][3, 2] = bad  # row 3 of system 2
    x = np.asarray(solve(*args, axis=0, backend=backend, pivoting=pivoting))
    np.testing.assert_array_equal(np.delete(x, 2, axis=1), np.delete(clean, 2, axis=1))
    assert not np.all(np.isfinite(x[:, 2])) or not np.allclose(x[:, 2], clean[:, 2])


def test_python_lists_and_numpy_arrays_are_accepted():
    args = random_bands((5,), np.float64, seed=2)
    expected = tridiax.solve_tridiagonal(*(jnp.asarray(a) for a in args))
    np.testing.assert_array_equal(tridiax.solve_tridiagonal(*args), expected)  # NumPy
    np.testing.assert_array_equal(tridiax.solve_tridiagonal(*(a.tolist() for a in args)), expected)


def test_python_lists_of_integers_name_the_argument():
    with pytest.raises(TypeError, match=r"^diag has dtype int.*astype\(jnp.float32\)"):
        tridiax.solve_tridiagonal([1.0, 1.0], [2, 2], [1.0, 1.0], [1.0, 1.0])


def test_zero_d_bands_are_constant_coefficients():
    rhs = np.random.default_rng(3).standard_normal((7, 3))
    x = tridiax.solve_tridiagonal(-1.0, jnp.asarray(2.5), -1.0, rhs, axis=0)
    column = np.ones((7, 1))
    expected = tridiax.verify.reference_solve(-column, 2.5 * column, -column, rhs, axis=0)
    np.testing.assert_allclose(x, expected, rtol=1e-13)


def test_complex_and_real_inputs_promote_to_complex():
    x = tridiax.solve_tridiagonal(jnp.ones(3, jnp.float32), 3 * jnp.ones(3, jnp.complex64),
                                  jnp.ones(3, jnp.float32), jnp.ones(3, jnp.float32))
    assert x.dtype == jnp.complex64


def test_float64_inputs_in_32_bit_mode_run_in_float32():
    # JAX's rule: without jax_enable_x64, float64 inputs become float32 when they enter JAX;
    # tridiax then solves in float32 and returns float32 (README, "dtypes").
    code = ("import numpy as np, tridiax; "
            "x = tridiax.solve_tridiagonal(np.ones(4), 3 * np.ones(4), np.ones(4), np.ones(4)); "
            "print(x.dtype)")
    env = dict(os.environ, JAX_ENABLE_X64="0")
    # -W error: silently, as JAX itself converts them (no "float64 ... truncated" warning).
    result = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "float32"


def test_integer_dtype_is_reported_as_given_in_32_bit_mode():
    # JAX's 32-bit mode turns an int64 array into int32 on entry; the error names the dtype
    # the user passed, for the functions and for the operator.
    code = ("import numpy as np, tridiax\n"
            "for call in (lambda: tridiax.solve_tridiagonal(np.ones(4), 3 * np.ones(4), "
            "np.ones(4), np.arange(4)),\n"
            "             lambda: tridiax.Tridiagonal(np.ones(4), np.arange(4), np.ones(4)),\n"
            "             lambda: tridiax.linear_recurrence(np.ones(4), np.arange(4))):\n"
            "    try:\n        call()\n    except TypeError as err:\n        print(err)\n")
    env = dict(os.environ, JAX_ENABLE_X64="0")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert [line.split(";")[0] for line in lines] == [
        "rhs has dtype int64", "diag has dtype int64", "x has dtype int64"], lines
