// The library's XLA FFI handlers, one per kernel entry point (kernels.h), registered by
// tridiax/_native/build.py under the target names tridiax/_native/ffi.py calls; and what the
// library was built with, for the planner. Nothing else: the kernels are in their own sources.

#include <cstdint>

#include "kernels.h"
#include "lanes.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

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

// What the library was built with (tridiax/_native/build.py asks, the planner decides from it).

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
