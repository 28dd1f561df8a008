"""Tridiagonal solves on sharded arrays: batch axes split across devices, and long systems split.

    python examples/sharded_solve.py [--quick] [--devices 8] [--processes 1]

On a machine with one CPU this starts JAX with --devices host devices (XLA_FLAGS=
--xla_force_host_platform_device_count); on GPUs it uses the GPUs there are. Nothing in the
solver code changes with sharding: the inputs carry a `NamedSharding`, and `jax.jit` does the
rest.

1. Batch axes sharded: implicit diffusion along z of a (nx, ny, nz) grid whose x axis is split
   over the devices. Every device solves its own columns; the compiled module has no
   collective at all and the output keeps the input's sharding.
2. The solve axis sharded: the same grid with z split over the devices (each device holds a
   slab of every system). tridiax runs the partition method: each device eliminates its
   slab, one all-gather of 7 numbers per system and device builds a small reduced system, and
   each device finishes its slab. The bytes communicated are read from the compiled module.
3. A gradient through the split solve (implicit differentiation: one more partitioned solve,
   with the transposed bands' edge rows fetched from the neighbouring devices).
4. A linear recurrence h_t = a_t h_(t-1) + x_t with its time axis split over the devices.

Every result is checked against the same computation on one device.

Several hosts: `--processes 2` simulates two hosts on this machine (CPU). The script starts
itself twice, with --devices / 2 host devices each and a free port on localhost; every process
calls `jax.distributed.initialize(coordinator_address, num_processes, process_id)` with CPU
collectives through gloo, builds the mesh over `jax.devices()` (both processes' devices), places
its own part of every array with `jax.make_array_from_process_local_data`, runs the same jitted
code, and checks the shards it holds. The launcher prints what each process printed. On a real
cluster, run one process per host and call `jax.distributed.initialize()` the same way (or with
no arguments where JAX reads the cluster's environment); the rest of the code is the same.
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

from _common import parse_args

LAUNCH_TIMEOUT = 900  # seconds for all processes of --processes together


def main():
    def extra(parser):
        parser.add_argument("--devices", type=int, default=8,
                            help="host devices to simulate on CPU (default 8), over all processes")
        parser.add_argument("--processes", type=int, default=1,
                            help="processes (simulated hosts) to start on this machine, CPU "
                                 "collectives through gloo (default 1: this process only)")
        # set by the launcher of --processes for each process it starts, not by hand
        parser.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)
        parser.add_argument("--coordinator", default=None, help=argparse.SUPPRESS)

    args = parse_args(__doc__, extra)
    if args.processes > 1 and args.process_id is None:
        sys.exit(launch(args))
    if args.devices % args.processes:
        sys.exit(f"--devices {args.devices} is not a multiple of --processes {args.processes}")
    # XLA reads its flags once, when JAX starts: set the host device count before importing.
    if "jax" not in sys.modules and "xla_force_host_platform_device_count" not in os.environ.get(
            "XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={args.devices}")
    check(args)


def launch(args):
    """Start this script once per process on localhost and wait for all; print their output."""
    with socket.socket() as s:  # a free port for the coordinator
        s.bind(("127.0.0.1", 0))
        coordinator = f"127.0.0.1:{s.getsockname()[1]}"
    if args.devices % args.processes:
        return f"--devices {args.devices} is not a multiple of --processes {args.processes}"
    env = dict(os.environ, JAX_PLATFORMS="cpu")  # several hosts simulated on this machine's CPU
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))
    env["XLA_FLAGS"] = (f"{flags} --xla_force_host_platform_device_count="
                        f"{args.devices // args.processes}")
    print(f"starting {args.processes} processes, {args.devices // args.processes} CPU devices "
          f"each, coordinator {coordinator}", flush=True)
    logs = [tempfile.TemporaryFile("w+") for _ in range(2 * args.processes)]
    procs = [subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--process-id", str(i),
                               "--coordinator", coordinator], env=env,
                              stdout=logs[2 * i], stderr=logs[2 * i + 1])
             for i in range(args.processes)]
    start, problem = time.monotonic(), None
    try:  # one process failing leaves the others waiting for it: stop them all
        while problem is None and any(p.poll() is None for p in procs):
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                problem = f"process {failed[0]} failed (exit code {procs[failed[0]].returncode})"
            elif time.monotonic() - start > LAUNCH_TIMEOUT:
                problem = f"timed out after {LAUNCH_TIMEOUT} s"
            time.sleep(0.1)
        if problem is None and any(p.returncode for p in procs):
            problem = f"exit codes {[p.returncode for p in procs]}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    for i in range(args.processes):
        out, err = logs[2 * i], logs[2 * i + 1]
        out.seek(0)
        err.seek(0)
        for line in out.read().splitlines():
            if not line.startswith("[Gloo]"):  # gloo's connection messages
                print(f"[process {i}] {line}")
        if problem:
            print(f"[process {i}] stderr:\n{err.read()[-4000:]}")
    if problem:
        return problem
    print(f"all {args.processes} processes agree with their single-device results "
          f"({time.monotonic() - start:.1f} s)")
    return 0


def check(args):
    import jax

    if args.process_id is not None:  # one of several processes (hosts): before any other JAX call
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=args.coordinator,
                                   num_processes=args.processes, process_id=args.process_id)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import tridiax
    from tridiax._core.hlo import collectives

    jax.config.update("jax_enable_x64", True)
    devices = jax.devices()  # every process's devices
    count = len(devices)
    mesh = Mesh(np.array(devices), ("d",))
    nx, ny, nz = (16, 8, 2048) if args.quick else (64, 64, 4096)
    nx, nz = count * -(-nx // count), count * -(-nz // count)  # multiples of the device count
    if jax.process_count() == 1:
        print(f"{count} {devices[0].platform} devices; grid {nx} x {ny} x {nz}, float64")
    else:
        print(f"process {jax.process_index()} of {jax.process_count()}: a mesh of {count} "
              f"{devices[0].platform} devices, {jax.local_device_count()} of them here; grid "
              f"{nx} x {ny} x {nz}, float64; every check is on the shards this process holds")

    def put(a, spec):
        """Place `a` with this sharding, each process passing only the block it holds (on one
        host, `jax.device_put(a, sharding)` does the same)."""
        sharding = NamedSharding(mesh, spec)
        a = np.asarray(a)
        here = list(sharding.addressable_devices_indices_map(a.shape).values())
        block = tuple(slice(min(i[d].indices(n)[0] for i in here),
                            max(i[d].indices(n)[1] for i in here)) for d, n in enumerate(a.shape))
        return jax.make_array_from_process_local_data(sharding, a[block], a.shape)

    def difference(x, reference):
        """max |x - reference| / max |reference| over the shards of x on this process."""
        reference = np.asarray(reference)
        worst = max(np.max(np.abs(np.asarray(s.data) - reference[s.index]))
                    for s in x.addressable_shards)
        return worst / np.max(np.abs(reference))

    rng = np.random.default_rng(0)
    u = rng.standard_normal((nx, ny, nz))
    r = 0.8  # (I - r D_zz) u_new = u along z, one (nz,) matrix for every column
    lower, diag, upper = np.full(nz, -r), np.full(nz, 1 + 2 * r), np.full(nz, -r)
    reference = np.asarray(tridiax.solve_tridiagonal(lower, diag, upper, u, axis=-1))
    solve = jax.jit(lambda u: tridiax.solve_tridiagonal(lower, diag, upper, u, axis=-1))

    def report(title, spec):
        sharded = put(u, spec)
        compiled = solve.lower(sharded).compile()
        x = compiled(sharded)
        error = difference(x, reference)
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

    # 3. Gradient of a loss through the split solve, against the single-device gradient. (It
    # once hung on 2 cores: the reduced systems went to LAPACK's batched LU, which ran on the
    # thread pool that the simulated devices' collectives were waiting on; they are now
    # eliminated in plain XLA operations.)
    def loss(d, u):
        return jnp.sum(jnp.sin(tridiax.solve_tridiagonal(lower, d, upper, u, axis=-1)))

    grad = jax.jit(jax.grad(loss))(put(diag, P()), put(u, P(None, None, "d")))
    error = difference(grad, jax.grad(loss)(jnp.asarray(diag), u))
    print(f"3. d loss / d diag through the split solve: max difference from one device "
          f"{error:.1e}")
    assert error < 1e-12, "the sharded gradient differs"

    # 4. A linear recurrence along z with z split: each device runs its block, one all-gather
    # of 2 numbers per sequence and device hands every device its incoming state.
    decay = rng.uniform(0.99, 1.0, u.shape)  # near 1: the incoming states matter
    recurrence = jax.jit(lambda a, x: tridiax.linear_recurrence(a, x, axis=-1))
    spec = P(None, None, "d")
    compiled = recurrence.lower(put(decay, spec), put(u, spec)).compile()
    h = compiled(put(decay, spec), put(u, spec))
    error = difference(h, tridiax.linear_recurrence(decay, u, axis=-1))
    moved = collectives(compiled.as_text())
    print(f"4. linear recurrence, time axis z sharded: max |h - one device| / |h| = {error:.1e}; "
          f"collectives: {[op for op, _ in moved] or 'none'} "
          f"({sum(size for _, size in moved)} bytes per device)")
    assert error < 1e-13, "the sharded recurrence differs"
    assert h.sharding.is_equivalent_to(NamedSharding(mesh, spec), 3)


if __name__ == "__main__":
    main()
