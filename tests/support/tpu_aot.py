"""Compile JAX functions for a TPU without one, and report each Pallas Mosaic TPU kernel.

libtpu describes TPU slices it is not running on (`jax.experimental.topologies`), and XLA
compiles for them: the real Mosaic TPU compiler lowers every Pallas kernel and rejects what the
chip cannot do. For each compiled function this module reports its Mosaic kernels (the
`tpu_custom_call` instructions: their scoped VMEM, as the compiler allotted it, and the limit
they ran under), the XLA `while` loops left in the program, its other top-level instructions,
and the bytes XLA's cost analysis counts it moving through HBM:

    from tpu_aot import compile_report
    case = compile_report("tridiax:lambda *a: solve_tridiagonal(*a, axis=0)",
                          *[((1000, 4096), "float32")] * 4, topology="v5e:2x2")
    print(case.kernels, case.bytes_accessed)

libtpu (about 700 MB installed) lives in a directory of its own, `SITE`, filled by
`python tests/support/tpu_aot.py --install` at the version jax's `tpu` extra pins: installed
beside jax, it would make every `import jax` look for TPUs. The compilation runs in a
subprocess (this file run as a script) whose path puts SITE first, with JAX_PLATFORMS=cpu (the
TPU plugin then only describes topologies). One subprocess compiles a whole batch
(`compile_reports`): a few seconds to start, then about a second per function.

A function is named by a string "module:expression", the expression evaluated in the module's
namespace in the subprocess (the repository root and the test folders are on its path).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

HERE = pathlib.Path(__file__).resolve().parent
TOPOLOGIES = ("v4:2x2x1", "v5e:2x2", "v5p:2x2x1", "v6e:2x2", "tpu7x:2x2x1")
TPU_CALL = "tpu_custom_call"


def _jax_version() -> str:
    return importlib.metadata.version("jax")


SITE = pathlib.Path(os.environ.get("TPU_AOT_SITE", pathlib.Path.home() / ".cache" / "tridiax-tpu-aot"
                                   / f"jax-{_jax_version()}"))

# (shape, dtype name) of one argument, on one device; or (shape, dtype name, partition) sharded
# over every device of the topology along one mesh axis, "devices": `partition` names the
# dimensions split across them ("devices") and the others (None), a PartitionSpec's entries.
Spec = tuple[Sequence[int], str] | tuple[Sequence[int], str, Sequence[str | None]]


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One Mosaic TPU kernel of a compiled program: `vmem_bytes` of scoped VMEM the compiler
    gave it (past what XLA keeps in VMEM across the kernel), under `vmem_limit_bytes`; the
    bytes of its operands and results in HBM (as laid out, tiles padded)."""

    name: str
    vmem_bytes: int
    vmem_limit_bytes: int
    operand_bytes: int
    result_bytes: int


@dataclasses.dataclass(frozen=True)
class CaseReport:
    """What one function compiled to for a device of `device_kind` ("TPU v5 lite"), or the
    error its compilation raised. `bytes_accessed`:
    XLA's cost analysis of the whole program (the sum of its per-operand and output counts),
    which counts arrays XLA keeps in VMEM between kernels as it counts those in HBM;
    `hbm_bytes`: only what moves through HBM (`read_program`);
    `whiles`: XLA while loops anywhere in it; `others`: opcodes of its other top-level
    instructions (fusions, copies; bitcasts and parameters left out)."""

    kernels: tuple[Kernel, ...]
    device_kind: str
    whiles: int
    others: tuple[str, ...]
    bytes_accessed: float
    compile_seconds: float
    error: str | None = None
    hbm_bytes: int = 0


def requirement() -> str:
    """The libtpu requirement of jax's `tpu` extra ("libtpu==0.0.42.*" for jax 0.10.2)."""
    for line in importlib.metadata.requires("jax") or ():
        spec, _, marker = line.partition(";")
        if spec.strip().startswith("libtpu") and "tpu" in marker:
            return spec.strip().replace(" ", "")
    raise RuntimeError(f"jax {_jax_version()} names no libtpu in its tpu extra")


def _installed_libtpu() -> str | None:
    for dist in importlib.metadata.distributions(path=[str(SITE)]):
        if dist.metadata["Name"].lower() == "libtpu":
            return dist.version
    return None


def install() -> None:
    """Install jax's libtpu into SITE (a 213 MB download unless pip has it cached)."""
    if unavailable_reason() is not None:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade",
                        "--target", str(SITE), requirement()], check=True)


def unavailable_reason() -> str | None:
    """Why deviceless TPU compilation cannot run here (for pytest.skip), or None if it can."""
    wanted = requirement()
    found = _installed_libtpu()
    version = wanted.split("==", 1)[1]
    pattern = re.escape(version).replace(r"\*", ".*")
    if found is None or not re.fullmatch(pattern, found):
        return f"{wanted} is not in {SITE}: run `python tests/support/tpu_aot.py --install`"
    return None


def compile_report(fn: str, *specs: Spec, topology: str = "v5e:2x2", x64: bool = False) -> CaseReport:
    """One function compiled for `topology`; RuntimeError if it does not compile."""
    case = compile_reports({"case": (fn, specs)}, topology=topology, x64=x64)["case"]
    if case.error:
        raise RuntimeError(case.error)
    return case


def compile_reports(cases: Mapping[str, tuple[str, Sequence[Spec]]], *, topology: str = "v5e:2x2",
                    x64: bool = False, timeout: float = 600) -> dict[str, CaseReport]:
    """Compile each case {name: (fn, specs)} for one device of `topology` (a name of
    TOPOLOGIES; sharded specs for all its devices, the report that of one device's program)
    in one subprocess. A case that fails to compile gets its error in
    `CaseReport.error`; a subprocess that fails as a whole raises RuntimeError."""
    if reason := unavailable_reason():
        raise RuntimeError(reason)
    request = {"topology": topology,
               "cases": [{"name": name, "fn": fn, "specs": [[list(s[0]), str(s[1]), *map(list, s[2:])]
                                                            for s in specs]}
                         for name, (fn, specs) in cases.items()]}
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_X64=str(int(x64)),
               TPU_WORKER_HOSTNAMES="localhost", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([str(SITE), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")  # quiets libtpu's start-up probing
    # libtpu takes a machine-wide lockfile unless told otherwise: compiles in parallel processes
    # (pytest-xdist's workers, a benchmark beside the tests) would otherwise refuse to start.
    env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    with tempfile.TemporaryDirectory(prefix="tpu_aot_") as tmp:
        request_file, result_file = pathlib.Path(tmp, "request.json"), pathlib.Path(tmp, "result.json")
        request_file.write_text(json.dumps(request))
        proc = subprocess.run([sys.executable, __file__, str(request_file), str(result_file)],
                              env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not result_file.exists():
            raise RuntimeError(f"tpu_aot worker failed (exit {proc.returncode}):\n{proc.stderr[-5000:]}")
        results = json.loads(result_file.read_text())
    return {name: CaseReport(tuple(Kernel(**k) for k in r["kernels"]), r["device_kind"], r["whiles"],
                             tuple(r["others"]), r["bytes_accessed"], r["compile_seconds"], r["error"],
                             r["hbm_bytes"])
            for name, r in results.items()}


# --- reading the compiled program -------------------------------------------------------------

_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
             "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
# An array shape with its TPU layout: f32[4,1000,2048]{2,1,0:T(8,128)}
_SHAPE = re.compile(r"\b(?P<type>[a-z]+\d*)\[(?P<dims>[\d,]*)\](?:\{(?P<layout>[^}]*)\})?")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(?P<name>[\w.\-]+) = (?P<shape>.*?) (?P<opcode>[\w\-]+)\("
                          r"(?P<operands>[^)]*)\)(?P<rest>.*)$")
_USED_VMEM = re.compile(r'"used_scoped_memory_configs":\[\{"memory_space":"1","offset":"0","size":"(\d+)"')
# The scoped VMEM a kernel runs under starts past what XLA keeps in VMEM across it (operands
# or results it placed there: "offset"), which the VMEM used counts too.
_VMEM_LIMIT = re.compile(r'"scoped_memory_configs":\[\{"memory_space":"1","offset":"(\d+)","size":"(\d+)"')


def padded_bytes(shape: str, *, hbm_only: bool = False) -> int:
    """Bytes of an HLO shape with its TPU layout: every tiled dimension padded to its tile
    (the last two dimensions of an (8, 128) tile, say); a tuple's arrays summed. `hbm_only`:
    only the arrays in HBM, not those XLA placed in another memory space (`S(1)`: VMEM)."""
    total = 0
    for m in _SHAPE.finditer(shape):
        dims = [int(d) for d in filter(None, m["dims"].split(","))]
        layout = m["layout"] or ""
        order, _, tiling = layout.partition(":")
        if hbm_only and re.search(r"S\([1-9]\d*\)", tiling):
            continue
        minor_to_major = [int(d) for d in filter(None, order.split(","))] or list(range(len(dims)))[::-1]
        tile = re.search(r"T\(([\d,]+)\)", tiling)
        padded = list(dims)
        if tile and dims:
            sizes = [int(t) for t in tile[1].split(",")]
            for t, axis in zip(reversed(sizes), minor_to_major):
                padded[axis] = -(-padded[axis] // t) * t
        count = 1
        for d in padded:
            count *= d
        total += count * _ITEMSIZE.get(m["type"], 0)
    return total


def read_program(hlo: str) -> dict:
    """The kernels, while loops and other top-level instructions of a compiled module's text."""
    entry = hlo[hlo.index("\nENTRY "):] if "\nENTRY " in hlo else hlo
    shapes = {m["name"]: m["shape"] for line in hlo.splitlines() if (m := _INSTRUCTION.match(line))}
    computations = _computations(hlo)
    reads = (_partial_reads(computations), _in_place_updates(computations))
    kernels, others, hbm = [], [], 0
    for line in entry.splitlines():
        m = _INSTRUCTION.match(line)
        if m is None or m["opcode"] in ("parameter", "bitcast", "tuple", "get-tuple-element", "constant"):
            continue
        hbm += _hbm_traffic(m, shapes, reads)
        if m["opcode"] == "custom-call" and f'custom_call_target="{TPU_CALL}"' in line:
            used, limit = _USED_VMEM.search(line), _VMEM_LIMIT.search(line)
            operands = re.findall(r"%([\w.\-]+)", m["operands"])
            offset = int(limit[1]) if limit else 0
            kernels.append({"name": m["name"], "vmem_bytes": int(used[1]) - offset if used else 0,
                            "vmem_limit_bytes": int(limit[2]) if limit else 0,
                            "operand_bytes": sum(padded_bytes(shapes.get(o, "")) for o in operands),
                            "result_bytes": padded_bytes(m["shape"])})
        else:
            others.append(m["opcode"])
    # Kernels inside loops and other computations count too (the XLA loops' bodies).
    nested = hlo.count(f'custom_call_target="{TPU_CALL}"') - len(kernels)
    for _ in range(nested):
        kernels.append({"name": "nested", "vmem_bytes": 0, "vmem_limit_bytes": 0,
                        "operand_bytes": 0, "result_bytes": 0})
    return {"kernels": kernels, "whiles": len(re.findall(r"\bwhile\(", hlo)), "others": others,
            "hbm_bytes": hbm}


# Instructions that read only part of their first operand: their result's bytes of it.
_PARTIAL = ("slice", "dynamic-slice", "gather")
_COMPUTATION = re.compile(r"^%(?P<name>[\w.\-]+) \(.*\{\s*$")


def _computations(hlo: str) -> dict[str, list]:
    """Each computation's instructions: {name: [instruction matches]}."""
    found, name, body = {}, None, []
    for line in hlo.splitlines() + ["}"]:
        if (m := _COMPUTATION.match(line)) is not None:
            name, body = m["name"], []
        elif line.startswith("}") and name is not None:
            found[name] = body
            name = None
        elif name is not None and (m := _INSTRUCTION.match(line)) is not None:
            body.append(m)
    return found


def _partial_reads(computations: Mapping[str, list]) -> dict[str, dict[int, int]]:
    """For each computation (`_computations`), the parameters it reads only through slices
    and gathers (seen through bitcasts): {computation: {parameter number: bytes those read}}."""
    return {name: _sliced_parameters(body) for name, body in computations.items()}


def _in_place_updates(computations: Mapping[str, list]) -> dict[str, tuple[int, str]]:
    """The computations (`_computations`) whose root is a dynamic-update-slice of one of their
    parameters (seen through bitcasts), which XLA runs in place in that parameter's buffer:
    {computation: (parameter number, the update's shape)}."""
    found = {}
    for name, body in computations.items():
        by_name = {m["name"]: m for m in body}
        root = next((m for m in body if m.group(0).lstrip().startswith("ROOT ")), None)
        if root is None or root["opcode"] != "dynamic-update-slice":
            continue
        buffer, update = (by_name.get(o) for o in _operands(root)[:2])
        while buffer is not None and buffer["opcode"] == "bitcast":
            buffer = by_name.get(_operands(buffer)[0])
        if buffer is not None and update is not None and buffer["opcode"] == "parameter":
            found[name] = (int(buffer["operands"]), update["shape"])
    return found


def _sliced_parameters(body) -> dict[int, int]:
    """The parameters of one computation (its instructions, `body`) read only as the first
    operand of slices and gathers, through bitcasts: {parameter number: the bytes they read}."""
    users: dict[str, list] = {}
    for m in body:
        for k, operand in enumerate(_operands(m)):
            users.setdefault(operand, []).append((m, k))
    sliced = {}
    for m in body:
        if m["opcode"] != "parameter":
            continue
        total: int | None = 0
        frontier = [m["name"]]
        while frontier and total is not None:
            for user, k in users.get(frontier.pop(), []):
                if user["opcode"] == "bitcast":
                    frontier.append(user["name"])
                elif user["opcode"] in _PARTIAL and k == 0:
                    total += padded_bytes(_in_any_memory(user["shape"]))
                else:
                    total = None
                    break
        if total:
            sliced[int(m["operands"])] = total
    return sliced


def _operands(instruction: re.Match) -> list[str]:
    return re.findall(r"%([\w.\-]+)", instruction["operands"])


def _in_any_memory(shape: str) -> str:
    """The shape with its memory-space annotations dropped (its bytes wherever it lies)."""
    return re.sub(r"S\(\d+\)", "", shape)


def _hbm_traffic(instruction: re.Match, shapes: Mapping[str, str],
                 reads: tuple[Mapping[str, Mapping[int, int]], Mapping[str, tuple[int, str]]]) -> int:
    """HBM bytes one top-level instruction moves: its operands read from HBM and its results
    written there; what stays in VMEM (`S(1)`) moves none. A slice or gather reads its
    result's bytes of its operand, and so does a fusion of an operand it only slices (`reads`:
    `_partial_reads`, then `_in_place_updates`). An asynchronous copy's or slice's start moves
    its destination's bytes (`_transfer`), its done nothing; a dynamic-update-slice, which XLA
    runs in place, reads and writes its update, and a fusion rooted in one writes its update
    and reads nothing of the buffer it updates. An upper bound: other partial reads count
    whole."""
    opcode = instruction["opcode"]
    if opcode.endswith("-done"):
        return 0
    operands = _operands(instruction)
    if opcode == "dynamic-update-slice":
        return 2 * padded_bytes(shapes.get(operands[1], ""), hbm_only=True)
    sliced, updates = reads
    called = re.search(r"calls=%([\w.\-]+)", instruction["rest"])
    called = called[1] if opcode == "fusion" and called else None
    partial = dict(sliced.get(called, {}))
    written = padded_bytes(instruction["shape"], hbm_only=True)
    if called in updates:
        buffer, update = updates[called]
        partial[buffer] = 0
        written = min(written, padded_bytes(_in_any_memory(update)))
    if opcode in _PARTIAL:
        partial[0] = padded_bytes(_in_any_memory(instruction["shape"]))
    read = sum(min(partial.get(i, math.inf), padded_bytes(shapes.get(o, ""), hbm_only=True))
               for i, o in enumerate(operands))
    if opcode.endswith("-start"):
        return _transfer(instruction["shape"], from_hbm=read > 0)
    return int(read) + written


def _transfer(result: str, *, from_hbm: bool) -> int:
    """HBM bytes of an asynchronous copy or slice: its destination (the first array of its
    result tuple outside the nested tuple that echoes its operands), read if its source lies
    in HBM and written if it does."""
    result, elements, depth, start = result.strip(), [], 0, 1
    for n, char in enumerate(result):
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(char, 0)
        if (char == "," and depth == 1) or depth == 0:
            elements.append(result[start:n].strip())
            start = n + 1
    destination = next((e for e in elements if not e.startswith("(")), "")
    amount = padded_bytes(_in_any_memory(destination))
    return amount * from_hbm + padded_bytes(destination, hbm_only=True)


def bytes_accessed(cost: dict) -> float:
    """HBM bytes of a compiled program by XLA's cost analysis: its per-operand counts and its
    output count (a program of one custom call has no total)."""
    return float(sum(v for k, v in cost.items() if re.fullmatch(r"bytes accessed(\d+|out)\{\}", k)))


# --- the subprocess -------------------------------------------------------------------------

def _resolve(reference: str):
    module, _, expression = reference.partition(":")
    return eval(expression, vars(importlib.import_module(module)))


def _sharding(spec, devices):
    """A spec's sharding: one device, or split over all of them (`Spec`)."""
    import jax
    import numpy as np

    if len(spec) == 2:
        return jax.sharding.SingleDeviceSharding(devices[0])
    mesh = jax.sharding.Mesh(np.array(devices), ("devices",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec[2]))


def _compile_case(case: dict, devices) -> dict:
    import jax

    start = time.perf_counter()
    try:
        specs = [jax.ShapeDtypeStruct(tuple(spec[0]), spec[1], sharding=_sharding(spec, devices))
                 for spec in case["specs"]]
        compiled = jax.jit(_resolve(case["fn"])).lower(*specs).compile()
    except Exception:
        import traceback

        return {"kernels": [], "whiles": 0, "others": [], "bytes_accessed": 0.0, "hbm_bytes": 0,
                "compile_seconds": time.perf_counter() - start, "error": traceback.format_exc()[-6000:]}
    seconds = time.perf_counter() - start
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return {**read_program(compiled.as_text()), "bytes_accessed": bytes_accessed(cost or {}),
            "compile_seconds": seconds, "error": None}


def _worker(request_file: str, result_file: str) -> None:
    """Compile the cases of `request_file` (JSON) for its topology; write their reports."""
    sys.path.insert(0, os.environ.get("TPU_AOT_ROOT", str(HERE.parents[1])))
    sys.path[1:1] = sorted(str(d) for d in HERE.parent.iterdir() if d.is_dir())
    import jax
    from jax.experimental import topologies

    jax.config.update("jax_enable_compilation_cache", False)
    request = json.loads(pathlib.Path(request_file).read_text())
    devices = topologies.get_topology_desc(request["topology"], "tpu").devices
    results = {case["name"]: {**_compile_case(case, devices), "device_kind": devices[0].device_kind}
               for case in request["cases"]}
    pathlib.Path(result_file).write_text(json.dumps(results))


if __name__ == "__main__":
    if sys.argv[1:] == ["--install"]:
        install()
    else:
        _worker(*sys.argv[1:])
