// The library's XLA FFI handlers, one per kernel entry point (kernels.h), registered by
// tridiax/_native/build.py under the target names tridiax/_native/ffi.py calls; and what the
// library was built with, for the planner. Nothing else: the kernels are in their own sources.

#include <cstdint>

#include "kernels.h"
#include "lanes.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// The library is compiled with -fvisibility=hidden (compiler.py): what follows is all it exports,
// so that two builds of it (two x86-64 levels) loaded into one process share no symbol.
#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxThomasCpu, tridiax::cpu::ThomasImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("transposed")
                                  .Attr<int64_t>("kind")
                                  .Attr<int64_t>("lanes")
                                  .Attr<int64_t>("width"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxChunkEndsCpu, tridiax::cpu::ChunkEndsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("transposed")
                                  .Attr<bool>("periodic")
                                  .Attr<bool>("pivoting")
                                  .Attr<int64_t>("lanes")
                                  .Attr<int64_t>("width")
                                  .Attr<int64_t>("chunk")
                                  .Attr<int64_t>("scan"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxChunkSolveCpu, tridiax::cpu::ChunkSolveImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("transposed")
                                  .Attr<bool>("periodic")
                                  .Attr<bool>("pivoting")
                                  .Attr<int64_t>("lanes")
                                  .Attr<int64_t>("width")
                                  .Attr<int64_t>("chunk")
                                  .Attr<int64_t>("scan"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxFactorCpu, tridiax::cpu::FactorImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("lanes")
                                  .Attr<int64_t>("width"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxBandCotangentsCpu, tridiax::cpu::BandCotangentsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("transposed")
                                  .Attr<bool>("periodic"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxRecurrenceCpu, tridiax::cpu::RecurrenceImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("reverse")
                                  .Attr<bool>("shifted")
                                  .Attr<int64_t>("activation")
                                  .Attr<int64_t>("gate")
                                  .Attr<bool>("final_only")
                                  .Attr<int64_t>("lanes")
                                  .Attr<int64_t>("width")
                                  .Attr<int64_t>("chunk")
                                  .Attr<int64_t>("scan"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxRecurrenceEndsCpu, tridiax::cpu::RecurrenceEndsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("reverse")
                                  .Attr<bool>("shifted")
                                  .Attr<int64_t>("gate")
                                  .Attr<int64_t>("lanes")
                                  .Attr<int64_t>("width")
                                  .Attr<int64_t>("chunk")
                                  .Attr<int64_t>("scan"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxBandedCpu, tridiax::cpu::BandedImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("l")
                                  .Attr<int64_t>("u")
                                  .Attr<int64_t>("kind")
                                  .Attr<bool>("transposed"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxBlockCpu, tridiax::cpu::BlockImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("kind")
                                  .Attr<bool>("transposed")
                                  .Attr<int64_t>("cache"));

// What the library was built with, and the CPU it runs on (tridiax/_native/build.py asks, the
// planner decides from it).

// Rows of a real element of `itemsize` bytes that one vector register holds where the kernels
// hold rows of a lane in vector registers (lanes.h, TRIDIAX_VECTOR_SCAN); 0 where they cannot.
extern "C" int64_t TridiaxScanRows(int64_t itemsize) {
#if defined(TRIDIAX_VECTOR_SCAN)
  if (itemsize == 4) return tridiax::cpu::VectorOps<float>::L;
  if (itemsize == 8) return tridiax::cpu::VectorOps<double>::L;
#endif
  (void)itemsize;
  return 0;
}

// Whether float64 tanh comes from glibc's vector math library (the build links it where it
// can).
extern "C" int64_t TridiaxVectorMath() {
#if defined(TRIDIAX_LIBMVEC) && defined(__AVX2__)
  return 1;
#else
  return 0;
#endif
}

// The highest x86-64 level (compiler.py's LEVELS: 2, 3, 4) this CPU and its operating system
// run, 1 below those, 0 on other architectures: build.py asks the baseline library before it
// loads the best one there is.
// Compiled for the first x86-64 level whatever the library's level, so that asking is safe on any
// x86-64 CPU.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TRIDIAX_ANY_X86_64 __attribute__((target("arch=x86-64")))
#else
#define TRIDIAX_ANY_X86_64
#endif
extern "C" TRIDIAX_ANY_X86_64 int64_t TridiaxCpuLevel() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  // The features each level adds that the kernels' code generation can use; the compiler's
  // checks include the operating system's support of the AVX and AVX-512 registers.
  const bool v2 = __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("sse4.2") &&
                  __builtin_cpu_supports("ssse3");
  const bool v3 = v2 && __builtin_cpu_supports("avx") && __builtin_cpu_supports("avx2") &&
                  __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
                  __builtin_cpu_supports("bmi2");
  const bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
  return v4 ? 4 : v3 ? 3 : v2 ? 2 : 1;
#else
  return 0;
#endif
}

#pragma GCC visibility pop
