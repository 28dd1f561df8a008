"""Compile JAX functions for an NVIDIA H100 without a GPU, and report every kernel launched.

XLA compiles "devicelessly" for the target described by `data/h100-target-config.txtpb` once the
CUDA PJRT plugin and ptxas are at hand. For each kernel launch of the compiled program this module
reports what `ptxas -v` said of the kernel (registers, spills, static shared memory) and how the
program launches it (grid, threads per block, dynamic shared memory: XLA's thunk-sequence dump):

    from gpu_aot import compile_report
    for k in compile_report("tridiax:lambda *a: solve_tridiagonal(*a, axis=0)",
                            *[((1_000_000, 64), "float32")] * 4):
        print(k)

The plugin (jax-cuda12-plugin, jax-cuda12-pjrt) and ptxas (nvidia-cuda-nvcc-cu12) live in a
directory of their own, `SITE`, filled by `python tests/support/gpu_aot.py --install`: installed beside
jax, on a machine without a GPU, they make every `import jax` print CUDA warnings on stderr.
The compilation runs in a subprocess (this file run as a script) whose environment puts SITE on
its path, sets JAX_PLATFORMS=cpu (the plugin then registers without looking for a GPU) and turns
on XLA's logging of ptxas; jax and XLA read these at start-up. One subprocess compiles a whole
batch (`compile_reports`): about 1.5 s to start, then 0.1 to 0.9 s per function.

A function is named by a string "module:expression", the expression evaluated in the module's
namespace in the subprocess (the repository root and tests/ are on its path), e.g.
"tridiax:solve_tridiagonal" or "test_gpu_lowering:ENTRY_POINTS['grad'][0]"; a module-level
function can be passed itself.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Callable, Mapping, Sequence

HERE = pathlib.Path(__file__).resolve().parent
TARGET_CONFIG = HERE / "data" / "h100-target-config.txtpb"
TRITON_CALL = "__gpu$xla.gpu.triton"  # the custom call that Pallas's Triton lowering emits
PTXAS_PACKAGE = "nvidia-cuda-nvcc-cu12==12.9.86"


def _jax_version() -> str:
    return importlib.metadata.version("jax")


SITE = pathlib.Path(os.environ.get("GPU_AOT_SITE", pathlib.Path.home() / ".cache" / "tridiax-gpu-aot"
                                   / f"jax-{_jax_version()}"))


Spec = tuple[Sequence[int], str]  # (shape, dtype name) of one argument


@dataclasses.dataclass(frozen=True)
class KernelReport:
    """One kernel launch of a compiled program (a kernel in a loop body is listed once).

    `origin` is "pallas_triton" for a Pallas kernel lowered through Triton, "xla" for a kernel
    XLA generated (fusions, including XLA's own Triton GEMM fusions), "mosaic_gpu" for a Pallas
    Mosaic GPU kernel, or the custom-call target for any other custom call. Mosaic GPU kernels
    are compiled to PTX by the CUDA plugin only when loaded on a device: their launch (grid,
    block, dynamic shared memory) is recorded as Mosaic GPU lowers them, and ptxas's figures
    (registers, spills, arch) stay None. `registers`, `spill_*` and `arch` come from ptxas -v and are None
    where ptxas said nothing of the kernel. `shared_memory_bytes` is ptxas's static shared memory
    plus the dynamic shared memory of the launch.
    """

    name: str
    origin: str
    registers: int | None
    spill_store_bytes: int | None
    spill_load_bytes: int | None
    shared_memory_bytes: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    arch: str | None
    # What the launch moves, for `benchmarks/gpu_model.py`: the bytes of its operands and of its
    # results (one pass over each, from the compiled HLO), and for a Pallas Triton kernel its
    # arrays as {"shape", "block", "itemsize", "output"} (the pallas_call's block specs).
    operand_bytes: int = 0
    result_bytes: int = 0
    arrays: tuple = ()
    # ... and each global load and store of its Triton IR as [tile dims..., itemsize].
    accesses: tuple = ()

    @property
    def blocks(self) -> int:
        """Thread blocks in the launch grid."""
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def __str__(self) -> str:
        spills = f"spills {self.spill_store_bytes}/{self.spill_load_bytes} B"
        return (f"{self.name} [{self.origin}, {self.arch}]: {self.registers} regs, {spills}, "
                f"smem {self.shared_memory_bytes} B, grid {self.grid} = {self.blocks} blocks "
                f"x {self.threads_per_block} threads")


@dataclasses.dataclass(frozen=True)
class CaseReport:
    """The kernels of one compiled function, or the error its compilation raised."""

    kernels: tuple[KernelReport, ...]
    compile_seconds: float
    error: str | None = None
    # Custom calls that launch a library's kernels (cuSPARSE, cuBLAS: no grid of their own), as
    # {"target", "operand_bytes", "result_bytes"}.
    library_calls: tuple = ()


def packages() -> list[str]:
    """The pip requirements installed into SITE: the plugin at jax's own version, and ptxas."""
    version = _jax_version()
    return [f"jax-cuda12-plugin=={version}", f"jax-cuda12-pjrt=={version}", PTXAS_PACKAGE]


def install() -> None:
    """Install `packages()` into SITE (about 570 MB; a 223 MB download unless pip has it cached)."""
    if unavailable_reason() is not None:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade",
                        "--target", str(SITE), *packages()], check=True)


def unavailable_reason() -> str | None:
    """Why deviceless CUDA compilation cannot run here (for pytest.skip), or None if it can."""
    def normalized(name):
        return re.sub(r"[-_.]+", "-", name).lower()

    found = {(normalized(d.metadata["Name"]), d.version)
             for d in importlib.metadata.distributions(path=[str(SITE), *sys.path])}
    for requirement in packages():
        name, version = requirement.split("==")
        if (normalized(name), version) not in found:
            return f"{requirement} is not in {SITE}: run `python tests/support/gpu_aot.py --install`"
    return None


def compile_report(fn: str | Callable, *specs: Spec, x64: bool = False) -> list[KernelReport]:
    """The kernels of `fn` compiled for an H100 on arguments of these (shape, dtype) specs."""
    case = compile_reports({"case": (fn, specs)}, x64=x64)["case"]
    if case.error:
        raise RuntimeError(case.error)
    return list(case.kernels)


def compile_reports(cases: Mapping[str, tuple[str | Callable, Sequence[Spec]]], *, x64: bool = False,
                    timeout: float = 600) -> dict[str, CaseReport]:
    """Compile each case {name: (fn, specs)} for an H100 in one subprocess.

    A case that fails to compile gets its traceback in `CaseReport.error`; a subprocess that
    fails as a whole, or cannot start (`unavailable_reason`), raises RuntimeError. `x64` sets
    JAX_ENABLE_X64 in the subprocess.
    """
    if reason := unavailable_reason():
        raise RuntimeError(reason)
    request = {"cases": [{"name": name, "fn": _reference(fn), "specs": [[list(s), _dtype_name(d)] for s, d in specs]}
                         for name, (fn, specs) in cases.items()]}
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_X64=str(int(x64)),
               TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="subprocess_compilation=3",
               PYTHONPATH=os.pathsep.join([str(SITE), *filter(None, [os.environ.get("PYTHONPATH")])]))
    with tempfile.TemporaryDirectory(prefix="gpu_aot_") as tmp:
        request_file, result_file = pathlib.Path(tmp, "request.json"), pathlib.Path(tmp, "result.json")
        request_file.write_text(json.dumps(request))
        proc = subprocess.run([sys.executable, __file__, str(request_file), str(result_file)],
                              env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not result_file.exists():
            raise RuntimeError(f"gpu_aot worker failed (exit {proc.returncode}):\n{proc.stderr[-5000:]}")
        results = json.loads(result_file.read_text())
    return {name: case_report(r) for name, r in results.items()}


def case_report(result: dict) -> CaseReport:
    """A CaseReport from its JSON form (the worker's output, or stored data)."""
    kernels = tuple(KernelReport(**{**k, "grid": tuple(k["grid"]), "block": tuple(k["block"]),
                                    "arrays": tuple(k.get("arrays", ())),
                                    "accesses": tuple(map(tuple, k.get("accesses", ())))})
                    for k in result["kernels"])
    return CaseReport(kernels, result["compile_seconds"], result["error"],
                      tuple(result.get("library_calls", ())))


def _reference(fn: str | Callable) -> str:
    """"module:expression" naming `fn` for the subprocess."""
    if isinstance(fn, str):
        return fn
    module, qualname = getattr(fn, "__module__", "__main__"), getattr(fn, "__qualname__", "<unnamed>")
    if "<" in qualname or module == "__main__":
        raise ValueError(f"{fn!r} cannot be imported by name; pass a string 'module:expression' instead.")
    return f"{module}:{qualname}"


def _dtype_name(dtype) -> str:
    import numpy as np

    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


# --- parsing XLA's output -----------------------------------------------------------------------

_THUNK = re.compile(r"^\s*(?P<id>\d+): \w+\s+(?:\[[^\]]*\]\s+)?(?P<name>\S+) "
                    r"grid: \[(?P<grid>[\d, ]+)\] threads: \[(?P<block>[\d, ]+)\]\s+shared_memory: (?P<smem>\d+)",
                    re.M)
_ANNOTATION = re.compile(r'profile_annotation: "(?P<annotation>[^"]*)"\s+thunk_id: (?P<id>\d+)')
_CUSTOM_CALL = re.compile(r'%(?P<name>[\w.\-]+) = [^\n]*?\bcustom-call\([^\n]*?custom_call_target="(?P<target>[^"]+)"')
# An HLO instruction: its name, result shape (an array or a tuple of them), opcode and operands.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(?P<name>[\w.\-]+) = (?P<shape>\([^=]*?\)|[\w]+\[[\d,]*\](?:\{[^}]*\})?) "
                          r"(?P<opcode>[\w\-]+)\((?P<operands>[^)]*)\)", re.M)
_ARRAY = re.compile(r"\b(?P<type>[a-z]+\d*)\[(?P<dims>[\d,]*)\]")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
             "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
# Custom calls that are neither kernels of their own nor free (library solvers and GEMMs).
_LIBRARY = re.compile(r"cusparse|cublas|cusolver|gtsv", re.I)


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape ("f32[64,100]{1,0}", or a tuple of arrays)."""
    total = 0
    for m in _ARRAY.finditer(shape):
        count = 1
        for d in filter(None, m["dims"].split(",")):
            count *= int(d)
        total += count * _ITEMSIZE.get(m["type"], 0)
    return total


def instruction_bytes(hlo: str) -> dict[str, tuple[int, int]]:
    """Per HLO instruction name: (bytes of its operands, bytes of its result)."""
    shapes = {m["name"]: m["shape"] for m in _INSTRUCTION.finditer(hlo)}
    sizes = {}
    for m in _INSTRUCTION.finditer(hlo):
        operands = re.findall(r"%([\w.\-]+)", m["operands"])
        sizes[m["name"]] = (sum(shape_bytes(shapes.get(o, "")) for o in operands),
                            shape_bytes(m["shape"]))
    return sizes


def parse_ptxas(log: str) -> dict[str, dict]:
    """Per entry function, what `ptxas -v` printed: registers, spills, static smem, arch.

    Each ptxas run's report is one log record, so records of parallel runs don't mix. Spills are
    read from the "Function properties" block of the entry itself (not from device functions'
    blocks, nor from --warn-on-spills warnings, which may precede another run's report).
    """
    stats: dict[str, dict] = {}
    entry = props = None
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '([^']+)' for '([^']+)'", line):
            entry, props = m[1], None
            stats[entry] = {"arch": m[2], "registers": None, "spill_store_bytes": None,
                            "spill_load_bytes": None, "static_smem": 0}
        elif m := re.search(r"Function properties for (\S+)", line):
            props = m[1]
        elif m := re.search(r"bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            if props in stats:
                stats[props].update(spill_store_bytes=int(m[1]), spill_load_bytes=int(m[2]))
        elif (m := re.search(r"Used (\d+) registers", line)) and entry in stats:
            stats[entry]["registers"] = int(m[1])
            if smem := re.search(r"(\d+) bytes smem", line):
                stats[entry]["static_smem"] = int(smem[1])
    return stats


def parse_dump(dump_dir: pathlib.Path, log: str) -> list[dict]:
    """The kernel launches of the program dumped in `dump_dir`, with ptxas's stats from `log`."""
    def read(pattern):
        return "\n".join(p.read_text() for p in sorted(dump_dir.glob(pattern)))

    annotations = {m["id"]: m["annotation"] for m in _ANNOTATION.finditer(read("*thunk_metadata.txt"))}
    hlo = read("*gpu_after_optimizations.txt")
    targets = {m["name"]: m["target"] for m in _CUSTOM_CALL.finditer(hlo)}
    sizes = instruction_bytes(hlo)
    ptxas = parse_ptxas(log)
    kernels = []
    for m in _THUNK.finditer(read("*thunk_sequence.txt")):
        instruction = annotations.get(str(int(m["id"])), "")
        target = targets.get(instruction)
        stats = ptxas.get(m["name"], {})
        operand_bytes, result_bytes = sizes.get(instruction, (0, 0))
        kernels.append({
            "name": m["name"],
            "origin": "xla" if target is None else "pallas_triton" if target == TRITON_CALL else target,
            "registers": stats.get("registers"),
            "spill_store_bytes": stats.get("spill_store_bytes"),
            "spill_load_bytes": stats.get("spill_load_bytes"),
            "shared_memory_bytes": stats.get("static_smem", 0) + int(m["smem"]),
            "grid": [int(g) for g in m["grid"].split(",")],
            "block": [int(b) for b in m["block"].split(",")],
            "arch": stats.get("arch"),
            "operand_bytes": operand_bytes,
            "result_bytes": result_bytes,
        })
    return kernels


def parse_library_calls(dump_dir: pathlib.Path) -> list[dict]:
    """The library custom calls (cuSPARSE, ...) of the program dumped in `dump_dir`."""
    hlo = "\n".join(p.read_text() for p in sorted(dump_dir.glob("*gpu_after_optimizations.txt")))
    sizes = instruction_bytes(hlo)
    return [{"target": m["target"], "operand_bytes": sizes.get(m["name"], (0, 0))[0],
             "result_bytes": sizes.get(m["name"], (0, 0))[1]}
            for m in _CUSTOM_CALL.finditer(hlo) if _LIBRARY.search(m["target"])]


# --- the subprocess -------------------------------------------------------------------------

def _resolve(reference: str):
    """The object a "module:expression" reference names."""
    module, _, expression = reference.partition(":")
    return eval(expression, vars(importlib.import_module(module)))


def _compile_case(case: dict, device, dump_dir: pathlib.Path) -> dict:
    """Compile one case with its ptxas log (stderr) and XLA's dump going to `dump_dir`."""
    import jax

    sharding = jax.sharding.SingleDeviceSharding(device)
    dump_dir.mkdir()
    log_file = dump_dir / "stderr.log"
    start = time.perf_counter()
    saved_stderr = os.dup(2)
    try:
        with open(log_file, "w") as log:
            sys.stderr.flush()
            os.dup2(log.fileno(), 2)
            specs = [jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding) for shape, dtype in case["specs"]]
            with _mosaic_launches() as mosaic, _triton_block_specs() as triton:
                jax.jit(_resolve(case["fn"])).trace(*specs).lower().compile(
                    compiler_options={"xla_dump_to": str(dump_dir)})
            sys.stderr.flush()
    except Exception:
        import traceback

        log = log_file.read_text()
        # Compiler errors (e.g. Triton's MLIR verifier) sit among thousands of ptxas lines.
        errors = "\n".join(line for line in log.splitlines() if "error" in line.lower())
        error = (f"{traceback.format_exc()}\nerrors in the compilation log:\n{errors}\n"
                 f"end of the log:\n{log[-5000:]}")
        return {"kernels": [], "compile_seconds": time.perf_counter() - start, "error": error}
    finally:
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
    seconds = time.perf_counter() - start
    kernels = parse_dump(dump_dir, log_file.read_text()) + mosaic
    for kernel in kernels:  # a Pallas Triton launch gets its block specs
        if kernel["origin"] == "pallas_triton":
            stem = re.sub(r"__\d+$", "", kernel["name"])  # XLA numbers repeated kernels
            record = triton.get((stem, kernel["operand_bytes"], kernel["result_bytes"]), {})
            kernel["arrays"] = record.get("arrays", [])
            kernel["accesses"] = record.get("accesses", [])
    return {"kernels": kernels, "compile_seconds": seconds, "error": None,
            "library_calls": parse_library_calls(dump_dir)}


@contextlib.contextmanager
def _triton_block_specs():
    """Record the arrays and block shapes of each pallas_call lowered through Triton inside the
    block, keyed by (kernel name, operand bytes, result bytes) as `parse_dump` sees its launch,
    by wrapping Pallas's registered Triton lowering rule."""
    records: dict[tuple, list[dict]] = {}
    try:
        from jax._src.interpreters import mlir
        from jax._src.pallas import core as pallas_core
        from jax._src.pallas.triton import core as triton_core
        from jax._src.pallas.triton import pallas_call_registration  # noqa: F401 (registers the rule)
    except ImportError:
        yield records
        return
    rules = pallas_core._backend_lowering_rules
    saved = rules.get(triton_core.CompilerParams)
    if saved is None:
        yield records
        return
    rule, platform = saved
    to_triton = pallas_call_registration.lowering.lower_jaxpr_to_triton_module
    modules: list[str] = []

    def keeping_module(*args, **kwargs):
        result = to_triton(*args, **kwargs)
        modules.append(result.module.operation.get_asm())
        return result

    def recording(ctx, *in_nodes, jaxpr, grid_mapping, **params):
        arrays = []
        for k, bm in enumerate(grid_mapping.block_mappings):
            aval = bm.array_aval
            block = [d if isinstance(d, int) else 1 for d in
                     (getattr(b, "block_size", b) for b in bm.block_shape)]
            arrays.append({"shape": list(aval.shape), "block": block,
                           "itemsize": aval.dtype.itemsize,
                           "output": k >= grid_mapping.num_inputs})
        sizes = [math.prod(a["shape"]) * a["itemsize"] for a in arrays]
        key = (mlir.sanitize_name(jaxpr.debug_info.func_name),
               sum(sz for sz, a in zip(sizes, arrays) if not a["output"]),
               sum(sz for sz, a in zip(sizes, arrays) if a["output"]))
        modules.clear()
        lowered = rule(ctx, *in_nodes, jaxpr=jaxpr, grid_mapping=grid_mapping, **params)
        records[key] = {"arrays": arrays, "accesses": [a for m in modules for a in triton_accesses(m)]}
        return lowered

    rules[triton_core.CompilerParams] = (recording, platform)
    pallas_call_registration.lowering.lower_jaxpr_to_triton_module = keeping_module
    try:
        yield records
    finally:
        rules[triton_core.CompilerParams] = saved
        pallas_call_registration.lowering.lower_jaxpr_to_triton_module = to_triton


_TRITON_ACCESS = re.compile(r"\btt\.(?P<op>load|store) [^\n]*?: tensor<(?P<dims>[\dx]+)x!tt\.ptr<(?P<type>\w+)>>")
_TRITON_ITEMSIZE = {"i1": 1, "i8": 1, "i16": 2, "f16": 2, "bf16": 2, "i32": 4, "f32": 4, "i64": 8,
                    "f64": 8}


def triton_accesses(asm: str) -> list[list[int]]:
    """Each global load and store of a Triton module as [its tile's dims..., itemsize]: the
    last dim is the run of contiguous values it moves (Pallas's refs are row-major)."""
    return [[*map(int, m["dims"].split("x")), _TRITON_ITEMSIZE.get(m["type"], 4)]
            for m in _TRITON_ACCESS.finditer(asm)]


@contextlib.contextmanager
def _mosaic_launches():
    """Record each Mosaic GPU kernel launch lowered inside the block (a list of KernelReport
    dicts), by wrapping Mosaic GPU's private launch builder."""
    launches: list[dict] = []
    try:
        from jax.experimental.mosaic.gpu import core
    except ImportError:
        yield launches
        return
    launch = core._launch
    size = getattr(core, "_smem_tree_size", lambda buffers: 0)

    def recording(token, grid, cluster, block, smem_buffers, *args, **kwargs):
        launches.append({"name": f"mosaic_gpu kernel {len(launches)}", "origin": "mosaic_gpu",
                         "registers": None, "spill_store_bytes": None, "spill_load_bytes": None,
                         "shared_memory_bytes": int(size(smem_buffers)),
                         "grid": list(grid), "block": list(block), "arch": None})
        return launch(token, grid, cluster, block, smem_buffers, *args, **kwargs)

    getattr(core, "KNOWN_KERNELS", {}).clear()  # a cached kernel would not be lowered again
    core._launch = recording
    try:
        yield launches
    finally:
        core._launch = launch


def _worker(request_file: str, result_file: str) -> None:
    """Compile the cases of `request_file` (JSON) for an H100; write their reports to `result_file`."""
    # tridiax from this checkout, as `python -m pytest` has it, or from GPU_AOT_ROOT (another
    # checkout: the model's calibration compiles the code a GPU measured)
    sys.path.insert(0, os.environ.get("GPU_AOT_ROOT", str(HERE.parents[1])))
    # The test modules that cases name ("test_gpu_lowering:ENTRY_POINTS[...]"), by folder.
    sys.path[1:1] = sorted(str(d) for d in HERE.parent.iterdir() if d.is_dir())
    import jax
    from jax.experimental import topologies

    jax.config.update("jax_enable_compilation_cache", False)  # a cache hit would run no ptxas
    topology = topologies.get_topology_desc("h100", "cuda", target_config=TARGET_CONFIG.read_text(),
                                            topology="1x1x1")
    request = json.loads(pathlib.Path(request_file).read_text())
    results = {}
    with tempfile.TemporaryDirectory(prefix="gpu_aot_dump_") as tmp:
        for i, case in enumerate(request["cases"]):
            results[case["name"]] = _compile_case(case, topology.devices[0], pathlib.Path(tmp, str(i)))
    pathlib.Path(result_file).write_text(json.dumps(results))


if __name__ == "__main__":
    if sys.argv[1:] == ["--install"]:
        install()
    else:
        _worker(*sys.argv[1:])
