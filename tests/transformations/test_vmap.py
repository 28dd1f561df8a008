"""vmap over any in_axes: correct, composes with grad, and moves no data."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, backends, random_bands

from tridiax import verify
from tridiax._tridiagonal.api import solve


def _loop(f, args, in_axes, out_axis):
    size = next(a.shape[ax] for a, ax in zip(args, in_axes, strict=True) if ax is not None)
    outs = []
    for k in range(size):
        sliced = [a if ax is None else jnp.take(a, k, axis=ax)
                  for a, ax in zip(args, in_axes, strict=True)]
        outs.append(f(*sliced))
    return jnp.stack(outs, axis=out_axis)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize(
    "in_axes,axis",
    [
        (0, 0), (1, 0), (2, 0), (0, -1), (1, -1), (2, 1),
        ((None, None, None, 1), 0),
        ((0, None, 0, None), -1),
        ((2, 0, 1, 2), 0),  # different positions: those operands are moved
    ],
)
def test_vmap_matches_loop(backend, in_axes, axis):
    shape = (4, 4, 4) if in_axes == (2, 0, 1, 2) else (4, 5, 3)
    args = [jnp.asarray(a) for a in random_bands(shape, np.float64, seed=3)]
    axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * 4
    # Unbatched operands have the per-example shape.
    first = next(ax for ax in axes if ax is not None)
    args = [a if ax is not None else jnp.take(a, 0, axis=first)
            for a, ax in zip(args, axes, strict=True)]
    f = lambda *a: solve(*a, axis=axis, backend=backend)  # noqa: E731
    out = jax.vmap(f, in_axes=in_axes)(*args)
    assert_close(out, _loop(f, args, axes, 0), np.float64)


@pytest.mark.parametrize("backend", backends())
def test_vmap_of_grad_and_grad_of_vmap(backend):
    args = [jnp.asarray(a) for a in random_bands((3, 6, 4), np.float64, seed=4)]
    f = lambda *a: jnp.sum(solve(*a, axis=0, backend=backend) ** 2)  # noqa: E731
    per_example = jax.vmap(jax.grad(f, argnums=(0, 1, 2, 3)), in_axes=2, out_axes=2)(*args)
    looped = [jnp.stack(g, axis=2) for g in zip(
        *[jax.grad(f, argnums=(0, 1, 2, 3))(*(a[..., k] for a in args)) for k in range(4)],
        strict=True)]
    for g, e in zip(per_example, looped, strict=True):
        assert_close(g, e, np.float64)
    total = jax.grad(lambda *a: jnp.sum(jax.vmap(f, in_axes=2)(*a)), argnums=(0, 1, 2, 3))(*args)
    for g, e in zip(total, looped, strict=True):
        assert_close(g, e, np.float64)


def test_nested_vmap():
    args = [jnp.asarray(a) for a in random_bands((2, 3, 7, 4), np.float64, seed=5)]
    f = lambda *a: solve(*a, axis=0)  # noqa: E731
    out = jax.vmap(jax.vmap(f, in_axes=1, out_axes=1), in_axes=0, out_axes=0)(*args)
    assert_close(out, verify.reference_solve(*args, axis=1), np.float64)


@pytest.mark.parametrize("in_axes", [0, 1, 2, (None, None, None, 1)])
def test_vmap_inserts_no_transpose(in_axes):
    shape = (6, 5, 4)
    args = [jnp.ones(shape)] * 4
    axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * 4
    out_axes = next(ax for ax in axes if ax is not None)
    args = [a if ax is not None else jnp.take(a, 0, axis=out_axes)
            for a, ax in zip(args, axes, strict=True)]
    f = jax.vmap(lambda *a: solve(*a, axis=0), in_axes=in_axes, out_axes=out_axes)
    text = jax.jit(f).lower(*args).as_text()
    assert "stablehlo.transpose" not in text
