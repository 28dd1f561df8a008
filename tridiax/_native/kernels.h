// The kernels' entry points, one per FFI handler: ffi.cc binds each to its XLA FFI handler
// (the buffers, results and attributes in this order); each is defined in its kernel's source.

#pragma once

#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace tridiax::cpu {

namespace ffi = xla::ffi;
using Buffer = ffi::AnyBuffer;
using Result = ffi::Result<ffi::AnyBuffer>;

// solve.cc: whole tridiagonal systems of `kind` (Kind, sweeps.h), tiled as (lanes, width).
ffi::Error ThomasImpl(Buffer lower, Buffer diag, Buffer upper, Buffer rhs, Result x,
                      bool transposed, int64_t kind, int64_t lanes, int64_t width);

// chunks.cc: the partition method's first sweep (ten (P, C, Q) results) and last sweep.
ffi::Error ChunkEndsImpl(Buffer lower, Buffer diag, Buffer upper, Buffer rhs, Result o0,
                         Result o1, Result o2, Result o3, Result o4, Result o5, Result o6,
                         Result o7, Result o8, Result o9, bool transposed, bool periodic,
                         bool pivoting, int64_t lanes, int64_t width, int64_t chunk,
                         int64_t scan);
ffi::Error ChunkSolveImpl(Buffer lower, Buffer diag, Buffer upper, Buffer rhs, Buffer xsep,
                          Result x, bool transposed, bool periodic, bool pivoting, int64_t lanes,
                          int64_t width, int64_t chunk, int64_t scan);

// factor.cc: the factors (l, m, c') of A = L D V, and a solve's band cotangents.
ffi::Error FactorImpl(Buffer lower, Buffer diag, Buffer upper, Result l, Result m, Result c,
                      int64_t lanes, int64_t width);
ffi::Error BandCotangentsImpl(Buffer g, Buffer x, Result lo, Result di, Result up,
                              bool transposed, bool periodic);

// recurrence.cc: recurrences, and the first sweep of their chunked form.
ffi::Error RecurrenceImpl(Buffer a, Buffer x, Buffer h0, Buffer gate, Result h, bool reverse,
                          bool shifted, int64_t activation, int64_t gate_slope, bool final_only,
                          int64_t lanes, int64_t width, int64_t chunk, int64_t scan);
ffi::Error RecurrenceEndsImpl(Buffer a, Buffer x, Buffer gate, Result decay, Result final,
                              bool reverse, bool shifted, int64_t gate_slope, int64_t lanes,
                              int64_t width, int64_t chunk, int64_t scan);

// banded.cc: banded systems in scipy's band layout.
ffi::Error BandedImpl(Buffer ab, Buffer b, Result x, int64_t l, int64_t u, int64_t kind,
                      bool transposed);

// block.cc: block-tridiagonal systems; `cache` the bytes a tile's work should fit in.
ffi::Error BlockImpl(Buffer lower, Buffer diag, Buffer upper, Buffer b, Result x, int64_t kind,
                     bool transposed, int64_t cache);

}  // namespace tridiax::cpu
