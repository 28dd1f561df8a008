"""The deviceless H100 compilation harness `gpu_aot`: its parsers on XLA's output as jax 0.10.2
writes it, and one real compilation where the CUDA plugin is installed."""

import pytest
from gpu_aot import compile_report, parse_dump, parse_ptxas, unavailable_reason

# Two parallel ptxas runs as XLA logs them: the second run's --warn-on-spills warning comes
# before its report, after the first run's "Function properties" block.
PTXAS_LOG = """\
I1123 10:48:55.113431    7406 subprocess_compilation.cc:356] ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'loop_multiply_fusion' for 'sm_90a'
ptxas info    : Function properties for loop_multiply_fusion
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 14 registers, used 0 barriers
ptxas info    : Compile time = 1.866 ms

I1123 10:48:55.222904    7406 subprocess_compilation.cc:349] ptxas warning : Registers are spilled to local \
memory in function 'tridiax_thomas__1', 16 bytes spill stores, 16 bytes spill loads
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'tridiax_thomas__1' for 'sm_90a'
ptxas info    : Function properties for tridiax_thomas__1
    16 bytes stack frame, 16 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 16 bytes cumulative stack size
ptxas info    : Compiling entry function 'input_add_reduce_fusion' for 'sm_90a'
ptxas info    : Function properties for input_add_reduce_fusion
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 41 registers, used 1 barriers, 8320 bytes smem
"""

THUNK_SEQUENCE = """\
001: kCustomKernel [source       | next=002 (1)] tridiax_thomas__1 grid: [1, 1, 1] threads: [64, 1, 1]  shared_memory: 0 bytes
002: kWhile        [prev=001 (1) | next=003 (1)]
  body:
    003: kCustomKernel [source | sink] loop_multiply_fusion grid: [125000, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
004: kCustomKernel [prev=002 (1) | sink        ] input_add_reduce_fusion grid: [16, 1, 1] threads: [1024, 1, 1]  shared_memory: 1024 bytes
"""  # noqa: E501

THUNK_METADATA = """\
thunk_metadata {
  thunk_info {
    profile_annotation: "pallas_call.6"
    thunk_id: 1
  }
  thunk_kind: "kCustomKernel"
}
"""

HLO = """\
  %pallas_call.6 = (f32[1,1000000,64]{2,1,0}) custom-call(%bitcast.7), custom_call_target="__gpu$xla.gpu.triton", \
api_version=API_VERSION_TYPED_FFI
  %loop_multiply_fusion = f32[1000000,64]{1,0} fusion(%pallas_call.2.0), kind=kLoop, calls=%fused_multiply
"""


def test_ptxas_spills_are_read_from_each_entry_functions_own_report():
    stats = parse_ptxas(PTXAS_LOG)
    assert stats["loop_multiply_fusion"]["spill_store_bytes"] == 0
    assert stats["tridiax_thomas__1"] == {"arch": "sm_90a", "registers": 40, "spill_store_bytes": 16,
                                          "spill_load_bytes": 16, "static_smem": 0}
    assert stats["input_add_reduce_fusion"]["static_smem"] == 8320


def test_dump_gives_each_launch_with_its_origin(tmp_path):
    (tmp_path / "module_0001.jit_f.thunk_sequence.txt").write_text(THUNK_SEQUENCE)
    (tmp_path / "module_0001.jit_f.thunk_metadata.txt").write_text(THUNK_METADATA)
    (tmp_path / "module_0001.jit_f.sm_9.0a_gpu_after_optimizations.txt").write_text(HLO)
    kernels = {k["name"]: k for k in parse_dump(tmp_path, PTXAS_LOG)}
    assert list(kernels) == ["tridiax_thomas__1", "loop_multiply_fusion", "input_add_reduce_fusion"]
    assert kernels["tridiax_thomas__1"]["origin"] == "pallas_triton"
    assert kernels["loop_multiply_fusion"]["origin"] == "xla"
    assert kernels["loop_multiply_fusion"]["grid"] == [125000, 1, 1]
    assert kernels["input_add_reduce_fusion"]["block"] == [1024, 1, 1]
    assert kernels["input_add_reduce_fusion"]["shared_memory_bytes"] == 8320 + 1024


@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_solve_compiles_for_h100():
    kernels = compile_report("tridiax:lambda *a: solve_tridiagonal(*a, axis=-1)", *[((1000, 100), "float32")] * 4)
    # Batch-first systems are read in place by tiles of rows: one Triton kernel, no transposes.
    (kernel,) = kernels
    assert (kernel.name, kernel.origin, kernel.arch) == ("tridiax_thomas_rows", "pallas_triton", "sm_90a")
    assert kernel.registers and kernel.spill_store_bytes == kernel.spill_load_bytes == 0
    assert kernel.threads_per_block >= 32 and kernel.blocks == 1000 // 32 + 1
    # What the cost model reads: 4 operands and 2 results (x, c') of 1000 x 100 float32, their
    # (1000, 100, 1) arrays in blocks of 32 systems, and the (32, 16, 1) tiles of its IR.
    assert (kernel.operand_bytes, kernel.result_bytes) == (4 * 400_000, 2 * 400_000)
    assert [a["output"] for a in kernel.arrays] == [False] * 4 + [True] * 2
    assert all(a["shape"] == [1000, 100, 1] and a["block"] == [32, 100, 1] for a in kernel.arrays)
    assert kernel.accesses and set(kernel.accesses) <= {(32, 16, 1, 4), (32, 1, 1, 4)}
