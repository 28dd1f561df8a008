"""Draw bench_shapes.py's data: tridiax against the memory floor and jax.lax, shape by shape.

    python benchmarks/plot.py benchmarks/data/shapes_cpu.json [-o benchmarks/data/shapes_cpu.png]

Reads the JSON that `bench_shapes.py --json FILE` writes (see benchmarks/_timing.py) and draws,
for every shape, the time of tridiax and of the lax baseline (jax.lax.linalg.tridiagonal_solve
for a solve, jax.lax.associative_scan for a recurrence) as a multiple of the memory floor (one
fused elementwise op that reads the call's inputs once and writes one array, timed in the same
run): bars from the floor (1x) to each ratio on a log scale, forward in the top row and
forward+grad (against the same forward floor) in the bottom one, one column per dtype, the
machine, jax version and date of the run in the title. Writes a PNG (matplotlib, in the
test and plot extras).
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

SCHEMA = "tridiax-benchmark/1"  # as benchmarks/_timing.py writes it
COLORS = {"tridiax": "#1f77b4", "lax": "#d62728", "associative_scan": "#ff7f0e"}
LABELS = {"tridiax": "tridiax", "lax": "jax.lax.linalg.tridiagonal_solve",
          "associative_scan": "jax.lax.associative_scan"}


def load(path, table="shapes"):
    """(meta, rows of `table`) of a benchmark data file."""
    data = json.loads(Path(path).read_text())
    meta = data.get("meta", {})
    if meta.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a benchmark data file of schema {SCHEMA} "
                         f"(meta.schema = {meta.get('schema')!r})")
    rows = [r for r in data["rows"] if r["table"] == table]
    if not rows:
        raise ValueError(f"{path}: no rows of table {table!r} (written by bench_shapes.py --json?)")
    return meta, rows


def ordered(values):
    return list(dict.fromkeys(values))


def times(value):
    """A ratio as the table writes it: 0.68x, 2.3x, 16x, 160x."""
    return f"{value:.2g}x" if value < 10 else f"{value:.0f}x"


def plot(meta, rows, out, dpi=110):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    cases, dtypes = ordered(r["case"] for r in rows), ordered(r["dtype"] for r in rows)
    ratio = {(r["case"], r["dtype"], r["method"], r["grad"]): r["ratio"] for r in rows}
    baselines = ordered(r["method"] for r in rows if r["method"] not in ("tridiax", "floor"))
    passes = ((False, "forward"), (True, "forward + gradient of sum(x**2)"))
    fig, axes = plt.subplots(2, len(dtypes), squeeze=False, sharey=True,
                             figsize=(3.2 + 5 * len(dtypes), 1.6 + 1.24 * len(cases)))
    height = 0.38
    finite = [v for v in ratio.values() if v]
    lo, hi = min(finite + [1.0]) / 2.5, max(finite + [1.0]) * 2.5
    for col, dtype in enumerate(dtypes):
        for row_i, (grad, title) in enumerate(passes):
            ax = axes[row_i, col]
            for i, case in enumerate(cases):
                y = len(cases) - 1 - i  # the first shape on top
                bars = [("tridiax", y + height / 2)]
                bars += [(m, y - height / 2) for m in baselines if (case, dtype, m, grad) in ratio]
                for method, yy in bars[:2]:
                    value = ratio.get((case, dtype, method, grad))
                    if not value:
                        continue
                    ax.barh(yy, abs(value - 1), left=min(value, 1), height=height,
                            color=COLORS.get(method, "0.5"))
                    ax.text(value * (1.06 if value >= 1 else 1 / 1.06), yy, times(value),
                            va="center", ha="left" if value >= 1 else "right", fontsize=7)
            ax.axvline(1, color="k", lw=1)
            ax.set_xscale("log")
            ax.set_xlim(lo, hi)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
                lambda v, _: f"{v:g}x"))
            ax.set_yticks(range(len(cases)), [c for c in reversed(cases)], fontsize=8)
            ax.set_title(f"{dtype}, {title}", fontsize=9)
            ax.grid(axis="x", which="both", alpha=0.25)
            if row_i == 1:
                ax.set_xlabel("time / memory floor of the forward call (log scale)", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS.get(m, "0.5"))
               for m in ["tridiax", *baselines]]
    handles.append(plt.Line2D([0], [0], color="k", lw=1))
    fig.legend(handles, [LABELS.get(m, m) for m in ["tridiax", *baselines]]
               + ["memory floor (one fused elementwise op, 1x)"],
               loc="lower center", ncol=2 if len(dtypes) == 1 else 4, fontsize=8, frameon=False)
    machine = textwrap.fill(meta.get("machine", "unknown machine"), 110)
    date = str(meta.get("date", ""))[:10]
    fig.suptitle(f"tridiax vs the memory floor vs jax.lax, shape by shape ({date})\n{machine}",
                 fontsize=10)
    legend_rows = 2 if len(dtypes) == 1 else 1
    fig.tight_layout(rect=(0, (0.15 + 0.2 * legend_rows) / fig.get_figheight(), 1, 0.99))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="a JSON file written by bench_shapes.py --json")
    parser.add_argument("-o", "--out", default=None, help="the PNG (default: DATA with .png)")
    args = parser.parse_args()
    meta, rows = load(args.data)
    out = plot(meta, rows, args.out or Path(args.data).with_suffix(".png"))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
