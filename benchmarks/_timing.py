"""Timing shared by the benchmarks: compile once, warm up, take the minimum of repeats; and
the one way every script writes its table as data (`--json PATH`, `row`, `write_rows`).

The data file is JSON, an object with two keys:

- `meta`: where and how it was measured: `schema` (SCHEMA), `script`, `command` (the command
  line, GLIBC_TUNABLES included when set), `date` (UTC, ISO 8601), `machine` (machine()),
  `jax`, `jaxlib`, `platform`, `device`, `device_count`, `cpu_count`, `glibc_tunables`, and
  `args` (the script's options);
- `rows`: one flat object per measurement, every one with the keys ROW_KEYS:
  `table` (which printed table), `case` (the row's label in it: shape and layout),
  `shape` (list of ints, or null), `axis`, `dtype`, `method` ("tridiax", "floor", "lax",
  "associative_scan", ... and variants such as "tridiax pivoting=True"), `grad` (false: the
  forward call; true: forward and the gradient of a scalar loss), `ms` (best time in
  milliseconds), `compile_s`, `error` (largest relative error against the reference, where
  checked), `ratio` and `ratio_to`: ratio = ms / ms of the forward (grad false) row of method
  `ratio_to` in the same table, case and dtype. A script may add keys of its own (`op`,
  `pivoting`, `devices`, ...). null: not measured (or not finite).
"""

import datetime
import importlib.metadata
import json
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import jax

from tridiax._core.backend import device_platform
from tridiax._core.timing import best_time


def timed(fn, *args, repeats):
    """(best seconds, compile seconds, compiled function) for `jax.jit(fn)(*args)`."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    return best_time(compiled, args, repeats), compile_s, compiled


def cell(value, spec):
    """`value` formatted with `spec` (e.g. ">10.1e"), or a dash where nothing was measured."""
    width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit()) or "0"
    return format(value, spec) if value == value else format("-", ">" + width)


def machine() -> str:
    """The device every figure is measured on: on CPU the model `lscpu` shows, its cores and
    widest vector extension; on an accelerator its kind. With jax's version and whether
    GLIBC_TUNABLES (hugetlb) is set."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        model, flags = platform.processor() or "unknown CPU", set()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        model = line.split(":", 1)[1].strip()
                    elif line.startswith("flags"):
                        flags = set(line.split(":", 1)[1].split())
        except OSError:
            pass
        vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
        where = f"{model} ({os.cpu_count()} cores, {vector})"
    else:
        where = f"{device.device_kind} ({device_platform(device)})"
    return (f"{where}, jax {jax.__version__}, "
            f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}")


SCHEMA = "tridiax-benchmark/1"
ROW_KEYS = ("table", "case", "shape", "axis", "dtype", "method", "grad", "ms", "compile_s",
            "error", "ratio", "ratio_to")


def _plain(value):
    """`value` as JSON: NaN and infinities as null, NumPy scalars as numbers, shapes as lists,
    dtypes by name."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "dtype") and getattr(value, "shape", None) == ():  # NumPy / JAX scalar
        value = value.item()
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "name") and hasattr(value, "itemsize"):  # a dtype
        return value.name
    raise TypeError(f"not a plain JSON value: {value!r}")


def row(table, case, method, *, shape=None, axis=None, dtype=None, grad=False, ms=None,
        compile_s=None, error=None, ratio=None, ratio_to=None, **extra):
    """One measurement as a flat dict with every key of ROW_KEYS (then `extra`)."""
    fields = dict(table=table, case=case, shape=shape, axis=axis, dtype=dtype, method=method,
                  grad=grad, ms=ms, compile_s=compile_s, error=error, ratio=ratio,
                  ratio_to=ratio_to, **extra)
    return {key: _plain(value) for key, value in fields.items()}


def command_line() -> str:
    """The command that ran this script, with GLIBC_TUNABLES in front when it is set."""
    tunables = os.environ.get("GLIBC_TUNABLES")
    prefix = f"GLIBC_TUNABLES={shlex.quote(tunables)} " if tunables else ""
    return prefix + shlex.join(["python", *sys.argv])


def run_meta(**extra) -> dict:
    """Where and how this run measures: see the module's docstring."""
    device = jax.devices()[0]
    try:
        jaxlib = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        jaxlib = None
    meta = {
        "schema": SCHEMA, "script": Path(sys.argv[0]).name, "command": command_line(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(), "jax": jax.__version__, "jaxlib": jaxlib,
        "platform": device_platform(device), "device": device.device_kind,
        "device_count": jax.device_count(), "cpu_count": os.cpu_count(),
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
    }
    meta.update(extra)
    return meta


def add_json_option(parser):
    """The `--json PATH` option every benchmark script takes."""
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write the table(s) as data to PATH: JSON with `meta` (machine, "
                             "jax, date, command) and `rows` (see benchmarks/_timing.py)")


def write_rows(path, rows, meta=None):
    """Write `rows` (dicts from `row`) and run_meta() updated with `meta` (e.g. {"args":
    vars(args)}) to `path` as JSON, one row per line. Returns the path."""
    for r in rows:
        missing = [key for key in ROW_KEYS if key not in r]
        if missing:
            raise ValueError(f"row {r} lacks {missing}")
    info = run_meta(**{key: _plain_meta(value) for key, value in (meta or {}).items()})
    lines = ",\n".join("  " + json.dumps(r, allow_nan=False) for r in rows)
    text = ('{"meta": ' + json.dumps(info, indent=1, allow_nan=False) + ',\n"rows": [\n'
            + lines + "\n]}\n")
    path = Path(path)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _plain_meta(value):
    if isinstance(value, dict):
        return {str(k): _plain_meta(v) for k, v in value.items()}
    return _plain(value)
