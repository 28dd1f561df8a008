"""One process of the two-process (multi-host) check in test_multihost.py; not collected.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 \
        python tests/transformations/multihost_worker.py PROCESS_ID NUM_PROCESSES HOST:PORT OUT.npz

Follows the README's multi-host recipe: `jax.distributed.initialize` (CPU collectives through
gloo), a `Mesh` over `jax.devices()` (every process's devices), data placed with
`jax.make_array_from_process_local_data` (each process passes only its own part of each
array). Runs the same jitted solves in every process and writes the output shards this process
holds (their global index and values) and the collectives of each compiled module to OUT.npz;
test_multihost.py assembles the shards of all processes and checks them against NumPy.
"""

import json
import sys
import time

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_platforms", "cpu")

process_id, num_processes, coordinator, out_path = (int(sys.argv[1]), int(sys.argv[2]),
                                                     sys.argv[3], sys.argv[4])
jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                           process_id=process_id, initialization_timeout=30)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from helpers import random_bands  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import tridiax  # noqa: E402
from tridiax._core.hlo import collectives  # noqa: E402

assert jax.process_count() == num_processes and jax.process_index() == process_id
mesh = Mesh(np.array(jax.devices()), ("d",))  # every process's devices, process by process


def local_part(full, sharding):
    """The block of `full` this process holds under `sharding` (what a host would load)."""
    indices = list(sharding.addressable_devices_indices_map(full.shape).values())
    box = []
    for dim, size in enumerate(full.shape):
        ranges = [index[dim].indices(size)[:2] for index in indices]
        box.append(slice(min(r[0] for r in ranges), max(r[1] for r in ranges)))
    return full[tuple(box)]


def place(full, spec):
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_process_local_data(sharding, local_part(full, sharding), full.shape)


saved, report = {}, {"process": process_id, "devices": [d.id for d in jax.devices()],
                     "local_devices": [d.id for d in jax.local_devices()], "cases": {}}


def run(name, f, arrays, specs):
    start = time.perf_counter()
    placed = [place(np.asarray(a), s) for a, s in zip(arrays, specs, strict=True)]
    compiled = jax.jit(f).lower(*placed).compile()
    outs = jax.block_until_ready(compiled(*placed))
    for k, out in enumerate(jax.tree.leaves(outs)):
        for j, shard in enumerate(out.addressable_shards):
            bounds = [s.indices(n)[:2] for s, n in zip(shard.index, out.shape, strict=True)]
            saved[f"{name}/{k}/{j}/index"] = np.array(bounds, dtype=np.int64).reshape(-1, 2)
            saved[f"{name}/{k}/{j}/data"] = np.asarray(shard.data)
    report["cases"][name] = {
        "collectives": collectives(compiled.as_text()),
        # does every output keep the first input's sharding?
        "kept": [o.sharding.is_equivalent_to(placed[0].sharding, o.ndim)
                 for o in jax.tree.leaves(outs)],
        "seconds": time.perf_counter() - start}
    print(f"process {process_id}: {name} done in {time.perf_counter() - start:.1f} s",
          file=sys.stderr, flush=True)


# 1. Batch axis sharded: 64 systems of 40 rows, 16 per device; nothing should move.
run("batch", lambda l, d, u, b: tridiax.solve_tridiagonal(l, d, u, b, axis=0),
    random_bands((40, 64), seed=1), [P(None, "d")] * 4)
run("batch_pivoted",
    lambda l, d, u, b: tridiax.solve_tridiagonal(l, d, u, b, axis=0, pivoting=True),
    random_bands((40, 64), seed=1, dominant=False), [P(None, "d")] * 4)
# 2. The solve axis sharded: 6 systems of 256 rows, 64 rows per device (partition method).
run("split", lambda l, d, u, b: tridiax.solve_tridiagonal(l, d, u, b, axis=0),
    random_bands((256, 6), seed=5), [P("d", None)] * 4)


# 3. Gradient of a scalar loss through the split solve, all four operands sharded.
def loss(l, d, u, b):
    return jnp.sum(jnp.sin(tridiax.solve_tridiagonal(l, d, u, b, axis=0)))


run("grad", jax.grad(loss, argnums=(0, 1, 2, 3)), random_bands((256, 6), seed=6),
    [P("d", None)] * 4)
# 4. A linear recurrence with its time axis sharded (and a replicated initial state); decays
# near 1, so that every block depends on the states handed in from the blocks before it.
rng = np.random.default_rng(9)
run("recurrence", lambda a, x, h0: tridiax.linear_recurrence(a, x, axis=0, initial=h0),
    [rng.uniform(0.9, 1, (256, 6)), rng.standard_normal((256, 6)), rng.standard_normal(6)],
    [P("d", None), P("d", None), P()])

np.savez(out_path, report=np.array(json.dumps(report)), **saved)
print(f"process {process_id}: wrote {out_path}", file=sys.stderr, flush=True)
