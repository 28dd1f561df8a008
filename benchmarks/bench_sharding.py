"""Scaling of sharded solves over host devices, and the bytes each solve communicates.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/bench_sharding.py [--devices 8] [--json FILE]

Starts JAX with --devices host CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count)
unless more than one device is already there (GPUs), then for D = 1, 2, 4, ... devices times
(min of --repeats after a warm-up; float32):

- batch sharded: systems of N = 1024 along the last axis, the batch split over D devices
  (strong: 4096 systems in all; weak: 1024 systems per device);
- solve axis split: 256 systems, each split over D devices (partition method) (strong:
  N = 16384 in all; weak: N = 4096 per device).

and reads the collectives of each compiled solve: the bytes one device receives per solve.
On a 2-core CPU the "devices" share two cores, so the times are only indicative: they show
the overheads (the partition method's 3 local solves and its reduced system), not a speedup.
--json writes the table as data (table "sharding", one row per case and D, with `devices`,
`efficiency`, `bytes_received` and `share`; see benchmarks/_timing.py).
"""

from __future__ import annotations

import argparse
import os
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", metavar="PATH", default=None,  # as _timing.add_json_option
                        help="also write the table as data to PATH: JSON with `meta` (machine, "
                             "jax, date, command) and `rows` (see benchmarks/_timing.py)")
    args = parser.parse_args()
    if "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={args.devices}")
    import jax
    import numpy as np
    from _timing import machine, row, write_rows  # imports jax: only after XLA_FLAGS is set
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import tridiax
    from tridiax._core.hlo import collectives
    from tridiax._core.timing import best_time

    all_devices = jax.devices()
    counts = [d for d in (1, 2, 4, 8, 16) if d <= len(all_devices)]
    print(f"{len(all_devices)} {all_devices[0].platform} devices on machine: {machine()}; "
          f"float32, min of {args.repeats}")
    rng = np.random.default_rng(0)

    def measure(shape, spec, devices):
        mesh = Mesh(np.array(all_devices[:devices]), ("d",))
        n = shape[-1]
        bands = [np.full(n, -1.0, np.float32), np.full(n, 4.0, np.float32),
                 np.full(n, -1.0, np.float32)]
        rhs = jax.device_put(rng.standard_normal(shape).astype(np.float32),
                             NamedSharding(mesh, spec))
        compiled = jax.jit(lambda b: tridiax.solve_tridiagonal(*bands, b)).lower(rhs).compile()
        seconds = best_time(compiled, (rhs,), args.repeats)
        received = sum(size for _, size in collectives(compiled.as_text()))
        return seconds, received

    rows = [  # (label, global shape for D devices, spec)
        ("batch, strong", lambda d: (4096, 1024), P("d", None)),
        ("batch, weak", lambda d: (1024 * d, 1024), P("d", None)),
        ("split axis, strong", lambda d: (256, 16384), P(None, "d")),
        ("split axis, weak", lambda d: (256, 4096 * d), P(None, "d")),
    ]
    data = []  # the table as data, for --json
    print(f"{'case':>20} {'D':>3} {'shape':>15} {'ms':>9} {'efficiency':>11} "
          f"{'bytes in/device':>16} {'of its share':>13}")
    for label, shape_of, spec in rows:
        base = None
        for devices in counts:
            shape = shape_of(devices)
            seconds, received = measure(shape, spec, devices)
            if base is None:
                base = seconds
            strong = "strong" in label
            efficiency = base / (devices * seconds) if strong else base / seconds
            share = 4 * np.prod(shape) / devices
            print(f"{label:>20} {devices:>3} {str(shape):>15} {1e3 * seconds:>9.2f} "
                  f"{efficiency:>10.0%} {received:>16} {received / share:>12.2%}")
            data.append(row("sharding", label, "tridiax", shape=shape, axis=-1, dtype="float32",
                            ms=seconds * 1e3, devices=devices, efficiency=efficiency,
                            bytes_received=int(received), share=float(received / share)))
    if args.json:
        write_rows(args.json, data, {"args": vars(args)})


if __name__ == "__main__":
    main()
