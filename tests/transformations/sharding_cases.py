"""Sharded inputs (run by test_sharding.py on 8 host devices; not collected on its own).

Every case compares the sharded jit result with the single-device result, checks the output
keeps the input's sharding, and reads the compiled module's collectives: none when only batch
axes are split; when the solve (or time) axis is split, only the small boundary exchange of
the partition method, far below the size of the arrays.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import pde_bands, pde_rhs, random_bands, relative_error, truth_dtype
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import tridiax
from tridiax import verify
from tridiax._core.hlo import collectives

assert jax.device_count() == 8, "run through test_sharding.py (8 host devices)"

MESHES = {"8": ((8,), ("x",)), "4x2": ((4, 2), ("x", "y"))}


def mesh_of(name):
    shape, names = MESHES[name]
    return Mesh(np.array(jax.devices()).reshape(shape), names)


def solve_fn(kind, axis):
    def f(l, d, u, b):
        if kind == "periodic":
            return tridiax.solve_periodic_tridiagonal(l, d, u, b, axis=axis)
        if kind == "factored":
            return tridiax.Tridiagonal(l, d, u, axis=axis).factor().solve(b)
        return tridiax.solve_tridiagonal(l, d, u, b, axis=axis, pivoting=kind == "pivoted")

    return f


def vjp_fn(f):
    """All four cotangents for a given output cotangent (no loss reduction, so no all-reduce)."""
    def g(l, d, u, b, ct):
        return jax.vjp(f, l, d, u, b)[1](ct)

    return g


def run_sharded(f, arrays, mesh, spec):
    sharded = [jax.device_put(jnp.asarray(a), NamedSharding(mesh, spec)) for a in arrays]
    compiled = jax.jit(f).lower(*sharded).compile()
    out = compiled(*sharded)
    expected = f(*arrays)  # one device
    for o, e in zip(jax.tree.leaves(out), jax.tree.leaves(expected), strict=True):
        scale = max(np.max(np.abs(np.asarray(e))), 1e-300)
        assert np.max(np.abs(np.asarray(o) - np.asarray(e))) / scale < 1e-13
    return out, collectives(compiled.as_text())


# --- batch axes sharded: every device solves its own systems, nothing moves ------------------

BATCH_CASES = [  # (mesh, shape, axis, spec of every operand)
    ("8", (40, 64), 0, P(None, "x")),
    ("8", (64, 33), -1, P("x", None)),
    ("4x2", (8, 37, 6), 1, P("x", None, "y")),
    ("4x2", (4, 8, 50), 2, P("y", "x", None)),
]


@pytest.mark.parametrize("kind", ["thomas", "pivoted", "periodic", "factored"])
@pytest.mark.parametrize("mesh,shape,axis,spec", BATCH_CASES)
def test_batch_sharded_solves_move_nothing(kind, mesh, shape, axis, spec):
    mesh = mesh_of(mesh)
    arrays = random_bands(shape, np.float64, seed=1)
    out, moved = run_sharded(solve_fn(kind, axis), arrays, mesh, spec)
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, spec), len(shape))
    assert moved == []


@pytest.mark.parametrize("mesh,shape,axis,spec", BATCH_CASES)
def test_batch_sharded_gradients_move_nothing(mesh, shape, axis, spec):
    mesh = mesh_of(mesh)
    arrays = random_bands(shape, np.float64, seed=2) + [np.ones(shape)]
    outs, moved = run_sharded(vjp_fn(solve_fn("thomas", axis)), arrays, mesh, spec)
    for o in outs:
        assert o.sharding.is_equivalent_to(NamedSharding(mesh, spec), len(shape))
    assert moved == []


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("mesh,shape,axis,spec", BATCH_CASES)
def test_batch_sharded_solves_give_the_same_bits(mesh, shape, axis, spec, dtype):
    # Each device solves its own systems, with the same eliminations in every lane as on one
    # device (and as the sequential sweep): the same answer, bit for bit.
    mesh = mesh_of(mesh)
    arrays = [a.astype(dtype) for a in random_bands(shape, np.float64, seed=4)]
    sharded = [jax.device_put(jnp.asarray(a), NamedSharding(mesh, spec)) for a in arrays]
    f = solve_fn("thomas", axis)
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(*sharded)),
                                  np.asarray(f(*(jnp.asarray(a) for a in arrays))))


def test_shared_matrix_stays_replicated():
    # One (N, 1) matrix for every column: the bands are never split, copied or gathered.
    mesh = mesh_of("8")
    lower, diag, upper, _ = random_bands((50, 1), np.float64, seed=3)
    rhs = np.random.default_rng(0).standard_normal((50, 64))
    b = jax.device_put(rhs, NamedSharding(mesh, P(None, "x")))
    f = jax.jit(lambda b: tridiax.solve_tridiagonal(lower, diag, upper, b, axis=0))
    assert collectives(f.lower(b).compile().as_text()) == []
    np.testing.assert_allclose(f(b), tridiax.solve_tridiagonal(lower, diag, upper, rhs, axis=0),
                               rtol=1e-13)
    assert f(b).sharding.is_equivalent_to(NamedSharding(mesh, P(None, "x")), 2)


@pytest.mark.parametrize("name", ["linear", "indrnn", "final_only", "grad", "grad-decay-per-sequence",
                                  "grad-weight-per-feature"])
def test_batch_sharded_recurrences_move_nothing(name):
    mesh, spec = mesh_of("4x2"), P(None, "x", "y")
    rng = np.random.default_rng(4)
    a, x = rng.uniform(0.2, 1, (30, 8, 6)), rng.standard_normal((30, 8, 6))
    # coefficients constant in time: their cotangent is summed in the reversed run
    # (`recurrence_sums_p`), a second result sharded as the states are
    f = {"linear": lambda a, x: tridiax.linear_recurrence(a, x),
         "indrnn": lambda a, x: tridiax.indrnn(a, x),
         "final_only": lambda a, x: tridiax.linear_recurrence(a, x, final_only=True),
         "grad": lambda a, x: jax.vjp(lambda a, x: tridiax.indrnn(a, x, activation=jnp.tanh),
                                      a, x)[1](x),
         "grad-decay-per-sequence": lambda a, x: jax.vjp(tridiax.linear_recurrence, a[:1], x)[1](x),
         "grad-weight-per-feature": lambda a, x: jax.vjp(
             lambda w, x: tridiax.indrnn(w, x, activation=jnp.tanh), a[0], x)[1](x)}[name]
    out, moved = run_sharded(f, [a, x], mesh, spec)
    assert moved == []
    if name in ("linear", "indrnn"):
        assert out.sharding.is_equivalent_to(NamedSharding(mesh, spec), 3)


def banded_case(shape, axis, seed, l=2, u=1):
    """ab (l + u + 1, *shape) in scipy's layout, diagonally dominant, and b of `shape`."""
    rng = np.random.default_rng(seed)
    ab = rng.uniform(-1, 1, (l + u + 1, *shape))
    ab[u] += 2 * (l + u)
    return (l, u), ab, rng.standard_normal(shape)


def block_case(shape, axis, seed, k=3, m=2):
    """Blocks (*shape, k, k), diagonally dominant, and b (*shape, k, m)."""
    rng = np.random.default_rng(seed)
    lower, diag, upper = (rng.uniform(-1, 1, (*shape, k, k)) for _ in range(3))
    diag += 4 * k * np.eye(k)
    return lower, diag, upper, rng.standard_normal((*shape, k, m))


def extended(spec, leading=0, trailing=0):
    """`spec` with unsharded dimensions before and after it."""
    return P(*(None,) * leading, *spec, *(None,) * trailing)


@pytest.mark.parametrize("grad", [False, True], ids=["solve", "grad"])
@pytest.mark.parametrize("mesh,shape,axis,spec", BATCH_CASES)
def test_batch_sharded_banded_solves_move_nothing(mesh, shape, axis, spec, grad):
    mesh = mesh_of(mesh)
    l_and_u, ab, b = banded_case(shape, axis, seed=11)

    def solve(ab, b):
        return tridiax.solve_banded(l_and_u, ab, b, axis=axis)

    f = (lambda ab, b: jax.vjp(solve, ab, b)[1](b)) if grad else solve
    arrays = [jax.device_put(ab, NamedSharding(mesh, extended(spec, leading=1))),
              jax.device_put(b, NamedSharding(mesh, spec))]
    compiled = jax.jit(f).lower(*arrays).compile()
    out = compiled(*arrays)
    assert collectives(compiled.as_text()) == []
    for o, e in zip(jax.tree.leaves(out), jax.tree.leaves(f(ab, b)), strict=True):
        np.testing.assert_allclose(np.asarray(o), np.asarray(e), rtol=1e-13, atol=1e-13)
    if not grad:
        assert out.sharding.is_equivalent_to(NamedSharding(mesh, spec), len(shape))
        np.testing.assert_array_equal(np.asarray(out), np.asarray(solve(ab, b)))


@pytest.mark.parametrize("how", ["solve", "grad", "factored"])
@pytest.mark.parametrize("mesh,shape,axis,spec", BATCH_CASES)
def test_batch_sharded_block_solves_move_nothing(mesh, shape, axis, spec, how):
    mesh = mesh_of(mesh)
    operands = block_case(shape, axis, seed=12)
    grad = how == "grad"

    def solve(lower, diag, upper, b):
        if how == "factored":  # the factorization and its solve, each a primitive
            return tridiax.BlockTridiagonal(lower, diag, upper, axis=axis).factor().solve(b)
        return tridiax.solve_block_tridiagonal(lower, diag, upper, b, axis=axis)

    f = (lambda *a: jax.vjp(solve, *a)[1](a[3])) if grad else solve
    sharding = NamedSharding(mesh, extended(spec, trailing=2))
    arrays = [jax.device_put(x, sharding) for x in operands]
    compiled = jax.jit(f).lower(*arrays).compile()
    out = compiled(*arrays)
    assert collectives(compiled.as_text()) == []
    for o, e in zip(jax.tree.leaves(out), jax.tree.leaves(f(*operands)), strict=True):
        np.testing.assert_allclose(np.asarray(o), np.asarray(e), rtol=1e-13, atol=1e-13)
    if not grad:
        assert out.sharding.is_equivalent_to(sharding, len(shape) + 2)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(solve(*operands)))


def test_banded_and_block_solves_with_a_split_solve_axis_gather_and_stay_correct():
    mesh = mesh_of("8")
    l_and_u, ab, b = banded_case((64, 6), 0, seed=13)
    sharded = [jax.device_put(ab, NamedSharding(mesh, P(None, "x"))),
               jax.device_put(b, NamedSharding(mesh, P("x")))]
    x = jax.jit(lambda ab, b: tridiax.solve_banded(l_and_u, ab, b, axis=0))(*sharded)
    np.testing.assert_allclose(x, tridiax.solve_banded(l_and_u, ab, b, axis=0), rtol=1e-13)
    operands = block_case((64, 3), 0, seed=14)
    sharded = [jax.device_put(a, NamedSharding(mesh, P("x"))) for a in operands]
    x = jax.jit(lambda *a: tridiax.solve_block_tridiagonal(*a, axis=0))(*sharded)
    np.testing.assert_allclose(x, tridiax.solve_block_tridiagonal(*operands, axis=0), rtol=1e-13)


# --- the solve axis sharded: the partition method -----------------------------------------------

SPLIT_CASES = [  # (mesh, shape, axis, spec): `axis` is split over the mesh
    ("8", (1024, 6), 0, P("x", None)),
    ("8", (3, 1024), -1, P(None, "x")),
    ("4x2", (4, 512, 6), 1, P("y", "x", None)),
    ("4x2", (3, 1024), 1, P(None, ("x", "y"))),
]


def split_devices(mesh, spec, axis, ndim):
    entry = spec[axis % ndim]
    return int(np.prod([mesh.shape[n] for n in ((entry,) if isinstance(entry, str) else entry)]))


def assert_small_exchange(moved, shape, axis, devices, values_per_system):
    """Only boundary values cross devices: each collective carries at most `values_per_system`
    numbers per device for every system, and all of them together far less than an array."""
    systems = np.prod(shape) // shape[axis]
    assert moved, "a split axis needs an exchange"
    for op, size in moved:
        assert size <= values_per_system * devices * systems * 8, (op, size)
    assert sum(size for _, size in moved) < 8 * np.prod(shape) / 2, moved


@pytest.mark.parametrize("kind", ["thomas", "pivoted", "periodic"])
@pytest.mark.parametrize("mesh,shape,axis,spec", SPLIT_CASES)
def test_split_solve_axis_partition_method(kind, mesh, shape, axis, spec):
    mesh = mesh_of(mesh)
    devices = split_devices(mesh, spec, axis, len(shape))
    arrays = random_bands(shape, np.float64, seed=5)
    out, moved = run_sharded(solve_fn(kind, axis), arrays, mesh, spec)
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, spec), len(shape))
    assert_small_exchange(moved, shape, axis, devices, values_per_system=7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("system", ["poisson", "poisson_shifted", "heat_1e4", "upwind"])
def test_split_solve_axis_as_accurate_as_the_sweep(system, dtype):
    # The reduced system across devices is formed from its rows' sums, as on one device: on
    # nearly singular Poisson problems its two-sided differences would cost digits.
    mesh = mesh_of("8")
    bands = [b.astype(dtype) for b in pde_bands(system, 2048, 4)] + [pde_rhs((4, 2048), dtype)]
    sharded = [jax.device_put(jnp.asarray(b.T), NamedSharding(mesh, P("x", None))) for b in bands]
    x = np.asarray(jax.jit(lambda *a: tridiax.solve_tridiagonal(*a, axis=0))(*sharded)).T
    truth = verify.sequential_solve(*bands, dtype=truth_dtype(dtype))
    sweep = verify.sequential_solve(*bands, dtype=dtype)
    assert relative_error(x, truth) <= 4 * relative_error(sweep, truth)


@pytest.mark.parametrize("kind", ["thomas", "periodic"])
@pytest.mark.parametrize("mesh,shape,axis,spec", SPLIT_CASES[:3])
def test_split_solve_axis_gradients(kind, mesh, shape, axis, spec):
    mesh = mesh_of(mesh)
    arrays = random_bands(shape, np.float64, seed=6) + [np.ones(shape)]
    outs, moved = run_sharded(vjp_fn(solve_fn(kind, axis)), arrays, mesh, spec)
    for o in outs:
        assert o.sharding.is_equivalent_to(NamedSharding(mesh, spec), len(shape))
    assert_small_exchange(moved, shape, axis, split_devices(mesh, spec, axis, len(shape)),
                          values_per_system=7)


@pytest.mark.parametrize("grad", [False, True])
def test_split_solve_calls_no_lapack(grad):
    # The reduced system is eliminated in XLA operations: a batched LAPACK getrf runs on
    # XLA:CPU's intra-op pool and hung when every pool thread was a device in a collective.
    mesh, (_, shape, axis, spec) = mesh_of("8"), SPLIT_CASES[0]
    arrays = [jax.device_put(jnp.asarray(a), NamedSharding(mesh, spec))
              for a in random_bands(shape, np.float64, seed=5) + ([np.ones(shape)] if grad else [])]
    f = vjp_fn(solve_fn("pivoted", axis)) if grad else solve_fn("pivoted", axis)
    text = jax.jit(f).lower(*arrays).compile().as_text()
    targets = set(re.findall(r'custom_call_target="([^"]+)"', text))
    assert "all-gather" in text and not [t for t in targets if "lapack" in t.lower()], targets


def test_split_axis_with_a_shared_matrix_and_constant_bands():
    mesh = mesh_of("8")
    rhs = np.random.default_rng(7).standard_normal((1024, 12))
    bands = random_bands((1024, 1), np.float64, seed=7)[:3]
    for f in (lambda b: tridiax.solve_tridiagonal(*bands, b, axis=0),
              lambda b: tridiax.solve_tridiagonal(-1.0, 4.0, -1.0, b, axis=0)):
        out, moved = run_sharded(f, [rhs], mesh, P("x", None))
        assert out.sharding.is_equivalent_to(NamedSharding(mesh, P("x", None)), 2)
        assert_small_exchange(moved, (1024, 12), 0, 8, values_per_system=7)


@pytest.mark.parametrize("case", ["factored", "one row per device"])
def test_split_axis_fallbacks_gather_and_stay_correct(case):
    # A factored solve's factors couple the blocks, and one row per device leaves no block
    # interior: both gather the axis (correct, but the data moves).
    shape = {"factored": (64, 5), "one row per device": (8, 5)}[case]
    arrays = random_bands(shape, np.float64, seed=8)
    out, moved = run_sharded(solve_fn("factored" if case == "factored" else "thomas", 0),
                             arrays, mesh_of("8"), P("x", None))
    assert any(op == "all-gather" for op, _ in moved)


@pytest.mark.parametrize("name", ["linear", "reverse", "final_only", "grad", "grad decay per sequence",
                                  "grad decay per sequence reversed", "indrnn relu"])
@pytest.mark.parametrize("mesh,shape,axis,spec", SPLIT_CASES[:3])
def test_split_time_axis_recurrences(name, mesh, shape, axis, spec):
    mesh = mesh_of(mesh)
    devices = split_devices(mesh, spec, axis, len(shape))
    rng = np.random.default_rng(9)
    a, x = rng.uniform(-1, 1, shape), rng.standard_normal(shape)
    state = tuple(s for i, s in enumerate(shape) if i != axis % len(shape))
    h0 = rng.standard_normal(state)
    decay = np.take(a, [0], axis=axis)  # constant in time: its cotangent sums over the split axis
    f = {"linear": lambda a, x: tridiax.linear_recurrence(a, x, axis=axis, initial=h0),
         "grad decay per sequence": lambda a, x: jax.vjp(lambda d, x: tridiax.linear_recurrence(
             d, x, axis=axis, initial=h0), jnp.asarray(decay), x)[1](x),
         "grad decay per sequence reversed": lambda a, x: jax.vjp(
             lambda d, x: tridiax.linear_recurrence(d, x, axis=axis, reverse=True, initial=h0),
             jnp.asarray(decay), x)[1](x),
         "reverse": lambda a, x: tridiax.linear_recurrence(a, x, axis=axis, reverse=True),
         "final_only": lambda a, x: tridiax.linear_recurrence(a, x, axis=axis, initial=h0,
                                                              final_only=True),
         "grad": lambda a, x: jax.vjp(lambda a, x: tridiax.linear_recurrence(
             a, x, axis=axis, initial=h0), a, x)[1](x),
         "indrnn relu": lambda a, x: tridiax.indrnn(a, x, axis=axis)}[name]
    out, moved = run_sharded(f, [a, x], mesh, spec)
    if name == "indrnn relu":
        return  # nonlinear: the time axis is gathered (documented), correct all the same
    assert_small_exchange(moved, shape, axis, devices,
                          values_per_system=6 if name.startswith("grad") else 2)
    if name.startswith("grad decay per sequence"):
        out = out[1]  # the decay's cotangent has no time axis to split
    if name != "final_only":
        for o in jax.tree.leaves(out):
            assert o.sharding.is_equivalent_to(NamedSharding(mesh, spec), len(shape))


def test_inside_shard_map_each_device_solves_its_block():
    # Under shard_map the code already runs per device: the kernel runs on the local block.
    mesh = mesh_of("8")
    arrays = random_bands((40, 64), np.float64, seed=10)
    f = jax.shard_map(lambda *a: tridiax.solve_tridiagonal(*a, axis=0), mesh=mesh,
                      in_specs=P(None, "x"), out_specs=P(None, "x"))
    out, moved = run_sharded(f, arrays, mesh, P(None, "x"))
    assert moved == []


def _shard_map_families(backend):
    """(name, function, arguments, in_specs, argnums) for each family inside shard_map: an
    operand replicated (P()) against sharded ones where the family can share one."""
    from tridiax._banded.api import solve as banded
    from tridiax._block.api import solve as block
    from tridiax._recurrence.api import recurrence
    from tridiax._tridiagonal.api import solve

    rng = np.random.default_rng(21)

    def r(*shape):
        return jnp.asarray(rng.uniform(-1, 1, shape), jnp.float32)

    n, s, k = 16, P(None, "x"), 2
    l, d, u, b = r(n, 1), 4 + r(n, 8), r(n, 8), r(n, 8)
    blocks = [r(n, 8, k, k), r(n, 8, k, k) + 4 * jnp.eye(k, dtype=jnp.float32), r(n, 8, k, k), r(n, 8, k)]
    s4, s3 = P(None, "x", None, None), P(None, "x", None)
    return [
        ("tridiagonal", lambda *a: solve(*a, axis=0, backend=backend), (l, d, u, b), (P(), s, s, s)),
        ("pivoted", lambda *a: solve(*a, axis=0, pivoting=True, backend=backend), (r(n, 8), d - 4, r(n, 8), b),
         (s,) * 4),
        ("banded", lambda ab, b: banded((2, 1), ab, b, axis=0, backend=backend),
         (r(4, n, 1).at[1].add(4), b), (P(), s)),
        ("solveh_banded", lambda ab, b: banded(None, ab, b, axis=0, hermitian="lower", backend=backend),
         (r(3, n, 8).at[0].add(6), b), (P(None, None, "x"), s)),
        ("block", lambda *a: block(*a, axis=0, backend=backend), blocks, (s4, s4, s4, s3)),
        ("recurrence", lambda a, x: recurrence(a, x, axis=0, backend=backend), (0.5 * r(n, 1), b), (P(), s)),
    ]


@pytest.mark.parametrize("backend", ["xla", "native", "pallas_interpret", "pallas_tpu_interpret"])
def test_inside_shard_map_with_its_checks_and_gradients(backend):
    # shard_map's default check_vma types how values vary over the mesh: the primitives' operands
    # vary together (a replicated band is cast, its cotangent summed over the devices once) and
    # their results vary as they do; the kernels' lowerings, one device's program, are not typed.
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    for name, f, args, specs in _shard_map_families(backend):
        argnums = tuple(range(len(args)))

        def both(*a, f=f, argnums=argnums):
            return f(*a), jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a))), argnums=argnums)(*a)

        x, grads = jax.jit(jax.shard_map(both, mesh=mesh, in_specs=specs,
                                         out_specs=(specs[-1], specs)))(*args)
        want_x, want_grads = jax.jit(both)(*args)  # one device
        for got, want in zip((x, *grads), (want_x, *want_grads), strict=True):
            scale = float(jnp.abs(want).max())
            assert float(jnp.abs(got - want).max()) <= 1e-5 * scale, (backend, name)


# --- no Pallas Triton deprecation warning from the per-device kernels -------------------------


def test_sharded_kernels_lower_without_the_triton_warning(monkeypatch):
    # JAX's partitioner lowers each device's function outside tridiax's lowering rules; make
    # every Pallas lowering warn as jax >= 0.11 does for Triton and check none reaches us.
    import dataclasses
    import warnings

    from jax._src.interpreters import mlir
    from jax._src.pallas.pallas_call import pallas_call_p

    from tridiax._recurrence.api import recurrence
    from tridiax._tridiagonal.api import solve

    entry = mlir._lowerings[pallas_call_p]

    def warning_rule(*args, **kwargs):
        warnings.warn("The Pallas Triton backend is deprecated and will be removed in a future "
                      "JAX version.", DeprecationWarning, stacklevel=2)
        return entry.rule(*args, **kwargs)

    monkeypatch.setitem(mlir._lowerings, pallas_call_p, dataclasses.replace(entry, rule=warning_rule))
    mesh = mesh_of("8")
    bands = random_bands((64, 16), np.float64, seed=3)
    for spec in (P(None, "x"), P("x", None)):  # the batch split; the solve axis split
        def f(l, d, u, b):
            return (solve(l, d, u, b, axis=0, backend="pallas_interpret"),
                    recurrence(0.5 * d, b, axis=0, backend="pallas_interpret"))

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_sharded(f, bands, mesh, spec)
        assert not [w for w in caught if "Pallas Triton" in str(w.message)], spec
    # The same rule does warn outside tridiax (the check above can fail).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax.jit(lambda x: jax.experimental.pallas.pallas_call(
            lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
            out_shape=jax.ShapeDtypeStruct((8,), jnp.float32), interpret=True)(x)).lower(
            jnp.ones(8, jnp.float32))
    assert [w for w in caught if "Pallas Triton" in str(w.message)]
