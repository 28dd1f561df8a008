"""Tridiagonal solves on sharded arrays: batch axes split across devices, and long systems split.

    python examples/sharded_solve.py [--quick] [--devices 8]

On a machine with one CPU this starts JAX with --devices host devices (XLA_FLAGS=
--xla_force_host_platform_device_count); on GPUs it uses the GPUs there are. Nothing in the
solver code changes with sharding: the inputs carry a `NamedSharding`, and `jax.jit` does the
rest.

1. Batch axes sharded: implicit diffusion along z of a (nx, ny, nz) grid whose x axis is split
   over the devices. Every device solves its own columns; the compiled module has no
   collective at all and the output keeps the input's sharding.
2. The solve axis sharded: the same grid with z split over the devices (each device holds a
   slab of every system). tridiax runs the partition method: each device eliminates its
   slab, one all-gather of 6 numbers per system and device builds a small reduced system, and
   each device finishes its slab. The bytes communicated are read from the compiled module.
3. A gradient through the split solve (implicit differentiation: one more partitioned solve,
   with the transposed bands' edge rows fetched from the neighbouring devices).

Every result is checked against the same solve on one device. For several hosts, call
`jax.distributed.initialize()` first (see examples/README.md); the code is the same.
"""

import os
import sys

from _common import parse_args


def main():
    def extra(parser):
        parser.add_argument("--devices", type=int, default=8,
                            help="host devices to simulate on CPU (default 8)")

    args = parse_args(__doc__, extra)
    # XLA reads its flags once, when JAX starts: set the host device count before importing.
    if "jax" not in sys.modules and "xla_force_host_platform_device_count" not in os.environ.get(
            "XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={args.devices}")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import tridiax
    from tridiax._hlo import collectives

    jax.config.update("jax_enable_x64", True)
    devices = jax.devices()
    count = len(devices)
    mesh = Mesh(np.array(devices), ("d",))
    nx, ny, nz = (16, 8, 2048) if args.quick else (64, 64, 4096)
    nx, nz = count * -(-nx // count), count * -(-nz // count)  # multiples of the device count
    print(f"{count} {devices[0].platform} devices; grid {nx} x {ny} x {nz}, float64")

    rng = np.random.default_rng(0)
    u = rng.standard_normal((nx, ny, nz))
    r = 0.8  # (I - r D_zz) u_new = u along z, one (nz,) matrix for every column
    lower, diag, upper = np.full(nz, -r), np.full(nz, 1 + 2 * r), np.full(nz, -r)
    reference = np.asarray(tridiax.solve_tridiagonal(lower, diag, upper, u, axis=-1))
    solve = jax.jit(lambda u: tridiax.solve_tridiagonal(lower, diag, upper, u, axis=-1))

    def report(title, spec):
        sharded = jax.device_put(u, NamedSharding(mesh, spec))
        compiled = solve.lower(sharded).compile()
        x = compiled(sharded)
        error = np.max(np.abs(np.asarray(x) - reference)) / np.max(np.abs(reference))
        moved = collectives(compiled.as_text())
        per_device = sum(size for _, size in moved)
        kept = x.sharding.is_equivalent_to(NamedSharding(mesh, spec), u.ndim)
        print(f"{title}: input {spec}, output keeps it: {kept}; max |x - one device| / |x| "
              f"= {error:.1e}")
        print(f"  collectives: {[op for op, _ in moved] or 'none'}; {per_device} bytes per "
              f"device per solve ({per_device / (u.nbytes / count):.2%} of a device's share "
              "of the array)")
        assert error < 1e-13, "the sharded solve differs from the single-device solve"
        assert kept, "the output lost the input's sharding"
        return x, moved

    x, moved = report("1. batch axis x sharded", P("d", None, None))
    assert moved == [], "a batch-sharded solve should not communicate"
    x, moved = report("2. solve axis z sharded", P(None, None, "d"))
    assert sum(size for _, size in moved) < u.nbytes / count / 4

    # 3. Gradient of a loss through the split solve, against the single-device gradient. On a
    # 2-core machine simulating 8 devices, XLA:CPU's in-process collectives can stall in large
    # programs (its thread pool runs out while devices wait for each other), so this runs on
    # 8 x 8 columns; on real devices the size does not matter.
    def loss(d, u):
        return jnp.sum(jnp.sin(tridiax.solve_tridiagonal(lower, d, upper, u, axis=-1)))

    small = u[:8, :8]
    sharded = jax.device_put(small, NamedSharding(mesh, P(None, None, "d")))
    grad = jax.jit(jax.grad(loss))(jnp.asarray(diag), sharded)
    expected = jax.grad(loss)(jnp.asarray(diag), small)
    error = np.max(np.abs(np.asarray(grad) - np.asarray(expected))) / np.max(np.abs(expected))
    print(f"3. d loss / d diag through the split solve: max difference from one device "
          f"{error:.1e}")
    assert error < 1e-12, "the sharded gradient differs"


if __name__ == "__main__":
    main()
