"""GPU readiness on any machine: lower the public entry points for CUDA and read the Triton IR.

Interpret mode pads out-of-bounds accesses and would hide a missing mask, so the masks are
checked on the lowered Triton kernels themselves.
"""

import re

import jax
import jax.numpy as jnp
import pytest
from helpers import triton_kernels

import tridiax


def _lower_cuda(f, *args):
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))


def _solve0(*a):
    return tridiax.solve_tridiagonal(*a, axis=0)


def _grad_all(*a):
    return jax.grad(lambda *b: jnp.sum(tridiax.solve_tridiagonal(*b, axis=0) ** 2),
                    argnums=(0, 1, 2, 3))(*a)


def _vjp_all(*a):
    # Reverse mode with the cotangent as an input: the gradient alone, without a loss function
    # (under vmap, JAX's own rule for the cotangent of jnp.sum moves the batch to the front).
    x, pullback = jax.vjp(_solve0, *a[:4])
    return pullback(a[4])


ENTRY_POINTS = {
    "plain axis 0": (_solve0, (100, 1000)),
    "plain last axis": (lambda *a: tridiax.solve_tridiagonal(*a, axis=-1), (1000, 100)),
    "middle axis": (lambda *a: tridiax.solve_tridiagonal(*a, axis=1), (3, 100, 7)),
    "grad": (_grad_all, (100, 1000)),
    "grad last axis": (jax.grad(lambda *a: jnp.sum(tridiax.solve_tridiagonal(*a) ** 2),
                                argnums=(0, 1, 2, 3)), (1000, 100)),
    "jvp": (lambda *a: jax.jvp(_solve0, a, a)[1], (100, 1000)),
    "vmap in_axes=1": (jax.vmap(_solve0, in_axes=1, out_axes=1), (100, 7, 1000)),
    "vmap in_axes=0": (jax.vmap(_solve0, in_axes=0, out_axes=0), (8, 100, 1000)),
    "vmap of vjp": (jax.vmap(_vjp_all, in_axes=2, out_axes=2), (100, 1000, 3)),
    "periodic": (lambda *a: tridiax.solve_periodic_tridiagonal(*a, axis=0), (100, 1000)),
    "periodic grad": (jax.grad(lambda *a: jnp.sum(tridiax.solve_periodic_tridiagonal(*a) ** 2),
                               argnums=(0, 1, 2, 3)), (1000, 100)),
    "periodic pivoted": (lambda *a: tridiax.solve_periodic_tridiagonal(*a, axis=0, pivoting=True),
                         (100, 1000)),
    "periodic pivoted grad": (jax.grad(lambda *a: jnp.sum(tridiax.solve_periodic_tridiagonal(
        *a, pivoting=True) ** 2), argnums=(0, 1, 2, 3)), (1000, 100)),
    "factored solve": (lambda l, d, u, b: tridiax.Tridiagonal(l, d, u, axis=0).factor().solve(b),
                       (100, 1000)),
    "periodic factored solve": (lambda l, d, u, b: tridiax.Tridiagonal(
        l, d, u, axis=-1, periodic=True).factor().solve(b), (1000, 100)),
    "pivoted": (lambda *a: tridiax.solve_tridiagonal(*a, axis=0, pivoting=True), (100, 1000)),
    "pivoted last axis": (lambda *a: tridiax.solve_tridiagonal(*a, pivoting=True), (1000, 100)),
    "pivoted grad": (jax.grad(lambda *a: jnp.sum(tridiax.solve_tridiagonal(
        *a, axis=0, pivoting=True) ** 2), argnums=(0, 1, 2, 3)), (100, 1000)),
    "factored grad": (jax.grad(lambda l, d, u, b: jnp.sum(tridiax.Tridiagonal(l, d, u, axis=0)
                                                          .factor().solve(b) ** 2),
                               argnums=(0, 1, 2, 3)), (100, 1000)),
}

_recur0 = lambda a, x: tridiax.linear_recurrence(a, x, axis=0)  # noqa: E731

RECURRENCE_ENTRY_POINTS = {
    "linear": (_recur0, (1000, 100), 1),
    "linear last axis reverse": (
        lambda a, x: tridiax.linear_recurrence(a, x, axis=-1, reverse=True), (100, 1000), 1),
    "linear final_only": (
        lambda a, x: tridiax.linear_recurrence(a, x, final_only=True), (1000, 100), 1),
    "linear grad": (jax.grad(lambda a, x: jnp.sum(_recur0(a, x) ** 2), argnums=(0, 1)),
                    (1000, 100), 2),
    "linear vmap": (jax.vmap(_recur0, in_axes=1, out_axes=1), (1000, 8, 100), 1),
    "indrnn relu": (lambda w, z: tridiax.indrnn(w, z), (1000, 100), 1),
    "indrnn tanh grad": (jax.grad(lambda w, z: jnp.sum(tridiax.indrnn(w, z, activation=jnp.tanh)),
                                  argnums=(0, 1)), (1000, 100), 2),
}


# Entry points whose systems (sequences) have rows narrower than a 32-byte memory sector in
# float32: batch-first data, and 7 columns of 4 bytes. The GPU kernels read them moved to
# columns (one XLA transpose per operand and one back); the others in place, untransposed.
NARROW = {"middle axis", "periodic grad", "periodic pivoted grad",
          "pivoted last axis", "periodic factored solve"}
# Plain solves and recurrences of batch-first data: read in place by tiles of each system's
# consecutive rows (`_pallas/row_tiles.py`), no transposes.
ROW_TILES = {"plain last axis", "grad last axis", "linear last axis reverse"}


def _check_layout(name, lowered, kernels, dtype):
    text = lowered.as_text()
    narrow = name in NARROW and not (name == "middle axis" and jnp.dtype(dtype).itemsize == 8)
    if name in ROW_TILES:
        assert "stablehlo.transpose" not in text
        for ir in kernels:  # (systems, rows) tiles, and single rows beyond a tile (transposed)
            shapes = re.findall(r"tt\.load [^\n]*: tensor<(\d+)x(\d+)x", ir)
            assert shapes and max(int(k) for _, k in shapes) > 1, shapes
        return
    if not narrow:
        assert "stablehlo.transpose" not in text
        return
    assert "stablehlo.transpose" in text
    for ir in kernels:  # tiles of systems side by side along Q: each row load is contiguous
        shapes = re.findall(r"tt\.load [^\n]*: tensor<(\d+)x(\d+)x", ir)
        assert shapes and all(int(bp) == 1 for bp, _ in shapes), shapes


@pytest.mark.parametrize("name", list(RECURRENCE_ENTRY_POINTS))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_recurrences_lower_to_masked_triton_in_their_layout(name, dtype):
    f, shape, kernels_expected = RECURRENCE_ENTRY_POINTS[name]
    lowered = _lower_cuda(f, jnp.ones(shape, dtype), jnp.ones(shape, dtype))
    kernels = triton_kernels(lowered)
    _check_layout(name, lowered, kernels, dtype)
    assert len(kernels) == kernels_expected
    assert "stablehlo.while" not in lowered.as_text()
    for ir in kernels:
        accesses = _loads_stores(ir)
        assert accesses  # 100 and 1000 columns: ragged tiles, so every access is masked
        assert not _unmasked_tile_accesses(ir)


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.bfloat16])
def test_cuda_lowering_uses_triton_in_the_coalesced_layout(name, dtype):
    f, shape = ENTRY_POINTS[name]
    args = [jnp.ones(shape, dtype)] * (5 if name == "vmap of vjp" else 4)
    lowered = _lower_cuda(f, *args)
    kernels = triton_kernels(lowered)
    _check_layout(name, lowered, kernels, dtype)
    # Kernels: the solve, its adjoint (gradients and JVPs), the factorization (factored solves;
    # a periodic one also solves for its correction).
    expected = {"grad": 2, "grad last axis": 2, "jvp": 2, "vmap of vjp": 2, "periodic grad": 2, "pivoted grad": 2,
                "periodic pivoted grad": 2, "factored solve": 2, "factored grad": 3,
                "periodic factored solve": 3}.get(name, 1)
    assert len(kernels) == expected
    # Every sweep is a kernel: no XLA loop over the rows (one launch per row on a GPU; the
    # factorization was one, 3% of the H100's bandwidth).
    assert "stablehlo.while" not in lowered.as_text()
    for ir in kernels:
        assert "tt.func" in ir and "tt.load" in ir and "tt.store" in ir
        assert not _unmasked_tile_accesses(ir)  # 1000 columns: ragged tiles, all masked


def _loads_stores(ir):
    return [line for line in ir.splitlines() if re.search(r"\btt\.(load|store)\b", line)]


def _unmasked_tile_accesses(ir):
    """Loads/stores without a mask operand, except 1x1 ones (a broadcast operand's only value,
    always in bounds). tt.load %ptr, %mask[, %other]; tt.store %ptr, %value, %mask."""
    return [a for a in _loads_stores(ir)
            if re.search(r"tt\.load %\w+ :|tt\.store %\w+, %\w+ :", a) and "tensor<1x1x" not in a]


@pytest.mark.parametrize("shape,axis", [((100, 1000), 0), ((1000, 100), -1), ((3, 100, 7), 1),
                                        ((100, 1), 0), ((1, 100), -1)])
def test_ragged_tiles_mask_every_load_and_store(shape, axis):
    # 1000 and 7 are not multiples of any power-of-two tile: every access must be masked.
    args = [jnp.ones(shape, jnp.float32)] * 4
    (ir,) = triton_kernels(_lower_cuda(lambda *a: tridiax.solve_tridiagonal(*a, axis=axis), *args))
    accesses = _loads_stores(ir)
    assert accesses
    unmasked = _unmasked_tile_accesses(ir)
    if shape in ((100, 1), (1, 100)):
        return  # one system: a tile of size 1 is never ragged
    assert not unmasked, unmasked


@pytest.mark.parametrize("family", ["banded", "block"])
@pytest.mark.parametrize("axis", [0, -1])
def test_batch_first_banded_and_block_systems_are_read_as_columns(family, axis):
    # Rows of batch-first systems (4 bytes each) are narrower than a memory sector: the banded
    # and block kernels take them moved to columns, as the tridiagonal ones do, so that every
    # row load of a tile is contiguous (systems side by side along Q); along axis 0 they are
    # columns already.
    B, N = 1000, 100
    batch = (B, N) if axis == -1 else (N, B)
    if family == "banded":
        f = lambda ab, b: tridiax.solve_banded((2, 2), ab, b, axis=axis)  # noqa: E731
        args = (jnp.ones((5, *batch), jnp.float32), jnp.ones(batch, jnp.float32))
    else:
        f = lambda *a: tridiax.solve_block_tridiagonal(*a, axis=axis)  # noqa: E731
        args = (jnp.ones((*batch, 2, 2), jnp.float32),) * 3 + (jnp.ones((*batch, 2), jnp.float32),)
    (ir,) = triton_kernels(jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)))
    # The last dimension of every load is the tile's systems side by side along Q.
    widths = re.findall(r"tt\.load [^\n]*: tensor<(?:\d+x)*(\d+)x!tt\.ptr", ir)
    assert widths and all(int(w) > 1 for w in widths), widths


def test_broadcast_bands_are_not_materialised_on_gpu():
    # One (N, 1) matrix for 1000 columns: the kernel reads the bands as (1, N, 1) blocks.
    bands = [jnp.ones((100, 1))] * 3
    rhs = jnp.ones((100, 1000))
    lowered = _lower_cuda(lambda *a: tridiax.solve_tridiagonal(*a, axis=0), *bands, rhs)
    assert "stablehlo.broadcast_in_dim" not in lowered.as_text()
    assert len(triton_kernels(lowered)) == 1


@pytest.mark.parametrize("shape,axis,options,library", [
    ((100_000, 64), 0, {}, True),               # few long systems: cuSPARSE
    ((64, 100_000), -1, {}, True),
    ((10**6,), 0, {}, True),                    # one long system
    ((100_000, 2048), 0, {}, False),            # more systems: the chunked Pallas kernels
    ((1000, 64), 0, {}, False),                 # short systems: one Pallas launch
    ((100_000, 64), 0, {"pivoting": True}, False),  # other kinds stay tridiax's
    ((100_000, 64), 0, {"periodic": True}, False),
    ((100_000, 64), 0, {"backend": "pallas_triton"}, False),  # what the user asks for
    ((100_000, 64), 0, {"chunk": 0}, False),
])
def test_few_long_plain_systems_lower_to_cusparse(shape, axis, options, library):
    from tridiax._tridiagonal.api import solve

    args = [jax.ShapeDtypeStruct(shape, jnp.float32)] * 4
    solve_it = lambda *a: solve(*a, axis=axis, **options)  # noqa: E731
    for f in (solve_it, jax.grad(lambda *a: jnp.sum(solve_it(*a) ** 2), argnums=(0, 1, 2, 3))):
        text = _lower_cuda(f, *args).as_text()
        assert ("cusparse_gtsv2_ffi" in text) == library
        assert ("__gpu$xla.gpu.triton" in text) != library
