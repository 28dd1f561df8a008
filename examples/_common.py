"""What every example shares: the command line, figures (when matplotlib is installed), timing.

JAX is imported inside the functions that need it, so that a script can still set XLA_FLAGS
(sharded_solve.py) after parsing its arguments.
"""

from __future__ import annotations

import argparse
import pathlib
import time
from collections.abc import Callable


def parse_args(doc: str, add_arguments: Callable[[argparse.ArgumentParser], None] | None = None):
    """`--quick` (small sizes, seconds on a laptop CPU) and `--out DIR` (where figures go)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(doc.splitlines()[1:]))
    parser.add_argument("--quick", action="store_true",
                        help="small sizes: seconds on a 2-core CPU (what CI runs)")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="folder for the figure (needs matplotlib: pip install '.[plot]')")
    if add_arguments is not None:
        add_arguments(parser)
    return parser.parse_args()


def save_figure(out: pathlib.Path | None, name: str, draw: Callable, *, size=(9, 3.6)) -> None:
    """Call `draw(figure)` and save the figure as `out/name`; say so when matplotlib is missing."""
    if out is None:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed, so no figure ({name}); pip install '.[plot]' for it")
        return
    figure = plt.figure(figsize=size, layout="constrained")
    draw(figure)
    out.mkdir(parents=True, exist_ok=True)
    figure.savefig(out / name, dpi=110)
    plt.close(figure)
    print(f"figure: {out / name}")


def best_time(fn: Callable, *args, repeats: int = 5) -> tuple[float, float]:
    """(first call including compilation, best of `repeats` later calls), in seconds."""
    import jax

    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return first, best


def adam(learning_rate: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
    """Adam on any pytree of arrays (no optimiser library needed): returns (init, update),
    with `update(gradients, state, parameters) -> (new parameters, new state)`."""
    import jax


    def init(parameters):
        zeros = jax.tree.map(jax.numpy.zeros_like, parameters)
        return jax.numpy.zeros((), jax.numpy.int32), zeros, zeros

    def update(gradients, state, parameters):
        k, m, v = state
        k += 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, gradients)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, gradients)
        correction = learning_rate * (1 - b2**k) ** 0.5 / (1 - b1**k)
        parameters = jax.tree.map(lambda p, m, v: p - correction * m / (jax.numpy.sqrt(v) + eps),
                                  parameters, m, v)
        return parameters, (k, m, v)

    return init, update
