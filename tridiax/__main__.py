"""`python -m tridiax`: solve a batch on the default device, check it, time it.

`python -m tridiax --info`: what this installation can run (versions, devices, the native CPU
kernel, the backend of each operation on each dtype) and how to fix what it cannot.

Solves `--batch` systems of `--n` rows (float32, systems along axis 0), checks a sample against
scipy.linalg.solve_banded (tridiax.verify), and prints the device, the backend that ran and the
time beside jax.lax.linalg.tridiagonal_solve. Exits non-zero if the check fails.
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

from . import __version__, solve_tridiagonal, verify
from ._core.backend import default_backend, device_platform
from ._core.timing import best_time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tridiax", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="rows per system")
    parser.add_argument("--batch", type=int, default=100_000, help="number of systems")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--info", action="store_true",
                        help="print versions, devices, whether the native CPU kernel is built "
                             "(or why not, and the fix) and the backend of each operation, then exit")
    args = parser.parse_args(argv)
    if args.info:
        from ._info import report

        print(report())
        return 0

    rng = np.random.default_rng(0)
    shape = (args.n, args.batch)
    lower, upper = rng.uniform(-1, 1, shape), rng.uniform(-1, 1, shape)
    diag = 3 + rng.uniform(0, 1, shape)
    rhs = rng.standard_normal(shape)
    bands = [jnp.asarray(a, jnp.float32) for a in (lower, diag, upper, rhs)]

    device = jax.devices()[0]
    platform = device_platform(device)
    backend = default_backend(platform, jnp.float32)
    print(f"tridiax {__version__}, jax {jax.__version__}")
    print(f"device:  {device.device_kind} ({platform})")
    print(f"backend: {backend}")
    print(f"problem: {args.batch} systems of N = {args.n}, float32, axis=0")

    solve = jax.jit(lambda *a: solve_tridiagonal(*a, axis=0))
    x = np.asarray(solve(*bands))
    sample = np.unique(np.linspace(0, args.batch - 1, min(args.batch, 500)).astype(int))
    ref = verify.reference_solve(*(np.asarray(a)[:, sample] for a in bands), axis=0)
    err = np.max(np.abs(x[:, sample] - ref)) / np.max(np.abs(ref))
    ok = bool(np.isfinite(err) and err < 1e-5)
    print(f"check:   max relative error vs scipy.linalg.solve_banded on {sample.size} systems "
          f"= {err:.1e} ({'ok' if ok else 'FAILED'})")

    lax_solve = jax.jit(lambda l, d, u, b: jax.lax.linalg.tridiagonal_solve(
        l.T, d.T, u.T, b.T[..., None])[..., 0].T)
    t_tridiax = best_time(solve, bands, args.repeats)
    t_lax = best_time(lax_solve, bands, args.repeats)
    print(f"time:    tridiax {t_tridiax * 1e3:.2f} ms, jax.lax.linalg.tridiagonal_solve "
          f"{t_lax * 1e3:.2f} ms ({t_lax / t_tridiax:.1f}x slower; it solves along the last axis "
          "only, so (N, B) data pays its transposes)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
