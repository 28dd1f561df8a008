"""Reading a compiled module's communication: the collectives and the data each one moves."""

from __future__ import annotations

import math
import re

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)
import numpy as np

COLLECTIVES = ("all-gather", "all-to-all", "collective-permute", "all-reduce", "reduce-scatter")
_SHAPE = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
# HLO element type names that NumPy spells differently.
_NUMPY_NAMES = {"pred": "bool", "bf16": "bfloat16", "f16": "float16", "f32": "float32",
                "f64": "float64", "c64": "complex64", "c128": "complex128", "s32": "int32",
                "s64": "int64", "u32": "uint32", "u64": "uint64", "s8": "int8", "u8": "uint8"}
_OP = re.compile(r"=\s*(.*?)\s(" + "|".join(COLLECTIVES) + r")(-start)?\(")


def collectives(hlo_text: str) -> list[tuple[str, int]]:
    """(collective, bytes of its result on one device) for every collective in an HLO module's
    text (`jax.jit(f).lower(...).compile().as_text()`); the `-done` halves of async pairs are
    not counted twice."""
    found = []
    for line in hlo_text.splitlines():
        match = _OP.search(line)
        if not match:
            continue
        size = 0
        for dtype, dims in _SHAPE.findall(match.group(1)):
            if dtype != "token":
                count = math.prod(int(d) for d in dims.split(",") if d)
                size += count * np.dtype(_NUMPY_NAMES.get(dtype, dtype)).itemsize
        found.append((match.group(2), size))
    return found
