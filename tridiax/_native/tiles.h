// The tiles of the tridiagonal and recurrence kernels (solve.cc, chunks.cc, factor.cc,
// recurrence.cc): which lanes a tile holds (Geometry), and how its rows are read (RowReader) and
// written (StoreRows, RowWriter). Same (P, N, Q) view as the Pallas kernels.
//
// Lanes and tiles. Each operand is a 3-D array (P|1, N|1, Q|1); a size-1 dimension is broadcast
// (stride 0), so a matrix shared by every column is read, never copied. A *lane* is one
// sequential sweep: a system (p, q), or, when the rows are split into chunks of `chunk` rows,
// one chunk (p, c, q) of it. A *tile* is W lanes swept together, vectorised over the lanes,
// taken along one dimension that the planner (tridiax/_core/planner.py) chooses:
//   Q: lanes are contiguous in memory (rows read and written in place);
//   P: lanes are systems N*Q values apart;  C: lanes are chunks `chunk*Q` values apart;
//   CQ: every Q lane of W/Q chunks, chunk-major (systems a few values apart, Q < a vector).
// Strided lanes are moved through a block of 8 rows x W lanes: when each lane's rows are
// contiguous (Q == 1) by in-register 8x8 transposes, CQ lanes by each chunk's run of Q values,
// else by scalar gathers. Work rows (c', y', ...) stay in a per-thread scratch of (rows x W)
// values, so memory sees each input read once and each output written once.
//
// Internal linkage, a copy per source: see lanes.h.

#pragma once

#include <algorithm>
#include <complex>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>

#include "lanes.h"
#include "xla/ffi/api/ffi.h"

namespace tridiax::cpu {

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kBlock = 8;   // rows and lanes of one transpose, the lane granule of a tile
constexpr int64_t kRows = 16;   // rows per block of strided lanes (a cache line of floats)
constexpr int64_t kAhead = 256;  // rows a strided lane is prefetched ahead of its reads
constexpr int64_t kNear = 2;  // blocks of kRows rows a strided lane is prefetched into L1 ahead
constexpr int64_t kGroupAhead = 1024;  // rows a CQ tile's chunks are prefetched ahead

// ---------------------------------------------------------------------------------------------
// Operands.

struct Operand {
  const void* data;
  int64_t sp, sn, sq;  // element strides along P, N, Q (0 where broadcast)
};

Operand MakeOperand(const void* data, ffi::Span<const int64_t> d) {
  Operand op;
  op.data = data;
  op.sq = d[2] > 1 ? 1 : 0;
  op.sn = d[1] > 1 ? d[2] : 0;
  op.sp = d[0] > 1 ? d[1] * d[2] : 0;
  return op;
}

Operand MakeOperand(const ffi::AnyBuffer& buf) {
  return MakeOperand(buf.untyped_data(), buf.dimensions());
}

// Call f(T{}) for the element type of a buffer; false for other types.
template <typename F>
bool ForType(ffi::DataType type, F&& f) {
  switch (type) {
    case ffi::DataType::F32: f(float{}); return true;
    case ffi::DataType::F64: f(double{}); return true;
    case ffi::DataType::C64: f(std::complex<float>{}); return true;
    case ffi::DataType::C128: f(std::complex<double>{}); return true;
    default: return false;
  }
}

[[maybe_unused]] bool IsComplex(ffi::DataType t) {
  return t == ffi::DataType::C64 || t == ffi::DataType::C128;
}

// The longest axis 1 of (P|1, N|1, Q|1) buffers: the rows (steps) of their broadcast shape.
[[maybe_unused]] int64_t Rows(std::initializer_list<const ffi::AnyBuffer*> bufs) {
  int64_t n = 1;
  for (const auto* b : bufs) n = std::max(n, b->dimensions()[1]);
  return n;
}

ffi::Error Unsupported() {
  return ffi::Error::InvalidArgument("tridiax: unsupported dtype");
}

// Whether this library can hold rows of `type` in vector registers (lanes.h,
// TRIDIAX_VECTOR_SCAN; real types).
[[maybe_unused]] bool HasVectorRows(ffi::DataType type) {
#if defined(TRIDIAX_VECTOR_SCAN)
  return type == ffi::DataType::F32 || type == ffi::DataType::F64;
#else
  (void)type;
  return false;
#endif
}

// ---------------------------------------------------------------------------------------------
// Geometry: which lanes a tile holds.

enum Lanes : int64_t { kLanesQ = 0, kLanesP = 1, kLanesC = 2, kLanesCQ = 3 };

// Tiles come in up to four classes, by length and width: tiles of full chunks (or of whole
// systems) or of the short last chunk, each full-width or the narrower last block of lanes
// along their dimension (Geometry::Class: 0 for full chunks at full width, plus kShortTiles,
// plus kNarrowTiles). Every tile of a class has the same lanes, width and length, so whether a
// kernel holds a tile's rows in vector registers is decided once per class, by the planner
// (tridiax/_core/planner.py, `tile_classes` mirrors Geometry), and passed to the kernels that
// can as their `scan` attribute: bit Class(tile) set where that class's tiles do. A kernel
// does what `scan` says, or fails the call where a tile cannot be swept that way.
constexpr int64_t kShortTiles = 2, kNarrowTiles = 1;

struct Tile {
  int64_t p, c, q;  // first lane
  int64_t lanes;    // dimension the lanes run along
  int64_t w;        // lanes in this tile
  int64_t len;      // rows of each lane (all the same within a tile)
  int64_t group;    // kLanesCQ: lanes per chunk (Q); 1 otherwise

  // The system (P, Q) and chunk (C) indices of lane s of this tile.
  int64_t P(int64_t s) const { return p + (lanes == kLanesP ? s : 0); }
  int64_t C(int64_t s) const {
    return c + (lanes == kLanesC ? s : lanes == kLanesCQ ? s / group : 0);
  }
  int64_t Q(int64_t s) const {
    return q + (lanes == kLanesQ ? s : lanes == kLanesCQ ? s % group : 0);
  }
};

// P x C x Q lanes of rows [c*chunk, min((c+1)*chunk, N)). Lanes along C never mix chunk
// lengths: when the last chunk is short, the full chunks form the main tiles and the last
// chunks of every system form tail tiles with lanes along P or Q. CQ tiles hold W/Q whole
// chunks (W a multiple of Q; without chunks they are Q tiles).
struct Geometry {
  int64_t P, N, Q, chunk, C, lanes, W;
  int64_t main_chunks, main_tiles, tail_lanes, tail_tiles;
  int64_t per_tile;  // chunks per tile along C (W, or W/Q for CQ tiles)

  Geometry(int64_t P_, int64_t N_, int64_t Q_, int64_t chunk_, int64_t lanes_, int64_t W_)
      : P(P_), N(N_), Q(Q_), lanes(lanes_), W(std::max<int64_t>(1, W_)) {
    chunk = chunk_ > 0 ? std::min(chunk_, N) : N;
    C = (N + chunk - 1) / chunk;
    main_chunks = C;
    tail_lanes = kLanesQ;
    tail_tiles = 0;
    if (lanes == kLanesCQ && (C == 1 || W < Q)) lanes = kLanesQ;
    per_tile = lanes == kLanesCQ ? W / Q : W;
    if (lanes == kLanesC || lanes == kLanesCQ) {
      if (N % chunk != 0) {
        main_chunks = C - 1;
        tail_lanes = P >= Q ? kLanesP : kLanesQ;
        tail_tiles = tail_lanes == kLanesP ? Q * Blocks(P) : P * Blocks(Q);
      }
      main_tiles = lanes == kLanesCQ ? P * ChunkBlocks(main_chunks)
                                     : P * Q * ChunkBlocks(main_chunks);
    } else if (lanes == kLanesP) {
      main_tiles = C * Q * Blocks(P);
    } else {
      main_tiles = P * C * Blocks(Q);
    }
  }

  int64_t Blocks(int64_t n) const { return (n + W - 1) / W; }
  int64_t ChunkBlocks(int64_t n) const { return (n + per_tile - 1) / per_tile; }
  int64_t tiles() const { return main_tiles + tail_tiles; }
  int64_t Length(int64_t c) const { return std::min(chunk, N - c * chunk); }

  // The width of a whole tile of t's lanes: the last block of lanes along a dimension may be
  // narrower.
  int64_t FullWidth(const Tile& t) const { return t.lanes == kLanesCQ ? per_tile * Q : W; }
  // The class of tile t (0 to 3, see kShortTiles): whether it holds full chunks (or whole
  // systems) or the short last chunk, and whether it is full-width or the last, narrower one.
  int64_t Class(const Tile& t) const {
    return (t.len != chunk ? kShortTiles : 0) + (t.w != FullWidth(t) ? kNarrowTiles : 0);
  }
  // Whether `scan`, a bit per class, says tile t's rows are held in vector registers.
  bool Scans(int64_t scan, const Tile& t) const { return (scan >> Class(t)) & 1; }

  Tile At(int64_t t) const {
    Tile tile;
    tile.group = 1;
    if (t >= main_tiles) {  // the short last chunks
      t -= main_tiles;
      tile.c = C - 1;
      tile.lanes = tail_lanes;
      if (tail_lanes == kLanesP) {
        tile.q = t / Blocks(P);
        tile.p = (t % Blocks(P)) * W;
        tile.w = std::min(W, P - tile.p);
      } else {
        tile.p = t / Blocks(Q);
        tile.q = (t % Blocks(Q)) * W;
        tile.w = std::min(W, Q - tile.q);
      }
    } else if (lanes == kLanesC) {
      const int64_t blocks = ChunkBlocks(main_chunks);
      tile.p = t / (Q * blocks);
      tile.q = (t / blocks) % Q;
      tile.c = (t % blocks) * W;
      tile.lanes = kLanesC;
      tile.w = std::min(W, main_chunks - tile.c);
    } else if (lanes == kLanesCQ) {
      const int64_t blocks = ChunkBlocks(main_chunks);
      tile.p = t / blocks;
      tile.q = 0;
      tile.c = (t % blocks) * per_tile;
      tile.lanes = kLanesCQ;
      tile.group = Q;
      tile.w = std::min(per_tile, main_chunks - tile.c) * Q;
    } else if (lanes == kLanesP) {
      const int64_t blocks = Blocks(P);
      tile.c = t / (Q * blocks);
      tile.q = (t / blocks) % Q;
      tile.p = (t % blocks) * W;
      tile.lanes = kLanesP;
      tile.w = std::min(W, P - tile.p);
    } else {
      const int64_t blocks = Blocks(Q);
      tile.p = t / (C * blocks);
      tile.c = (t / blocks) % C;
      tile.q = (t % blocks) * W;
      tile.lanes = kLanesQ;
      tile.w = std::min(W, Q - tile.q);
    }
    tile.len = Length(tile.c);
    return tile;
  }

  // Element offset of the tile's first lane, relative row 0, and the stride between lanes, in
  // an array with strides (sp, sn, sq) whose chunks are `rows_per_chunk` rows apart (`chunk`
  // for the operands, 1 for the (P, C, Q) arrays of one value per chunk). CQ tiles' lanes come
  // in groups of `group`: lane s at (s / group) * lane + (s % group) * inner.
  struct Strides {
    int64_t base, lane, group = 1, inner = 0;
    int64_t At(int64_t s) const { return base + Offset(s); }
    int64_t Offset(int64_t s) const {
      return group == 1 ? s * lane : (s / group) * lane + (s % group) * inner;
    }
  };
  Strides Of(const Tile& t, int64_t sp, int64_t sn, int64_t sq, int64_t rows_per_chunk) const {
    const int64_t sc = rows_per_chunk * sn;
    const int64_t base = t.p * sp + t.c * sc + t.q * sq;
    if (t.lanes == kLanesCQ) {
      // Evenly spaced after all (one value per chunk, or nothing varies): plain strided lanes.
      if (sc == t.group * sq) return {base, sq};
      return {base, sc, t.group, sq};
    }
    return {base, t.lanes == kLanesQ ? sq : t.lanes == kLanesP ? sp : sc};
  }
};


// ---------------------------------------------------------------------------------------------
// Reading and writing the rows of a tile.

// Move the runs of a CQ tile's rows between `rows` rows of its groups in memory (group k's run
// of row r at a + k*ga + r*ra, `n` values `inner` apart) and a (rows x W) block (at b + r*W +
// k*n), either way (`ToBlock`). Contiguous runs of 8, 16 or 32 bytes are one move each, with
// their size known to the compiler (a memcpy of a run's size read at run time is a call).
template <int Bytes, bool ToBlock, typename T>
void MoveRunsOf(T* a, int64_t ga, int64_t ra, T* b, int64_t W, int64_t groups, int64_t rows) {
  constexpr int64_t n = Bytes / static_cast<int64_t>(sizeof(T));
  for (int64_t r = 0; r < rows; ++r) {
    T* mem = a + r * ra;
    T* blk = b + r * W;
    for (int64_t k = 0; k < groups; ++k) {
      if constexpr (ToBlock) {
        std::memcpy(blk + k * n, mem + k * ga, Bytes);
      } else {
        std::memcpy(mem + k * ga, blk + k * n, Bytes);
      }
    }
  }
}

template <bool ToBlock, typename T>
void MoveRuns(T* a, int64_t ga, int64_t ra, int64_t n, int64_t inner, T* b, int64_t W,
              int64_t groups, int64_t rows) {
  if (inner == 1) {
    switch (n * static_cast<int64_t>(sizeof(T))) {
      case 8: return MoveRunsOf<8, ToBlock>(a, ga, ra, b, W, groups, rows);
      case 16: return MoveRunsOf<16, ToBlock>(a, ga, ra, b, W, groups, rows);
      case 32: return MoveRunsOf<32, ToBlock>(a, ga, ra, b, W, groups, rows);
      default: break;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < groups; ++k) {
      for (int64_t q = 0; q < n; ++q) {
        T& mem = a[k * ga + r * ra + q * inner];
        T& blk = b[r * W + k * n + q];
        if constexpr (ToBlock) {
          blk = mem;
        } else {
          mem = blk;
        }
      }
    }
  }
}

// Asks for the cache line holding p, into L1 (kIntoL1) or L2. An asm statement rather than
// __builtin_prefetch: GCC takes a function whose only effect is __builtin_prefetch for a pure
// one and drops the calls to it, with every prefetch of the helpers below (Prefetch,
// GroupPrefetch, PrefetchRuns).
constexpr bool kIntoL1 = true;
template <bool IntoL1>
inline __attribute__((always_inline)) void PrefetchLine(const void* p) {
#if defined(__x86_64__)
  if constexpr (IntoL1) {
    asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
  } else {
    asm volatile("prefetcht2 %0" : : "m"(*static_cast<const char*>(p)));
  }
#else
  __builtin_prefetch(p, 0, IntoL1 ? 3 : 1);
#endif
}

// Asks for the lines of `runs` runs of `bytes` bytes, the first at p, the others `apart`
// values after it, into L2 (a CQ tile's chunks: more streams than the hardware prefetchers
// follow).
template <typename T>
void PrefetchRuns(const T* p, int64_t runs, int64_t apart, int64_t bytes) {
  for (int64_t j = 0; j < runs; ++j) {
    const char* run = reinterpret_cast<const char*>(p + j * apart);
    for (int64_t b = 0; b < bytes; b += 64) PrefetchLine<!kIntoL1>(run + b);
  }
}

// Rows of one operand for a tile's W lanes: Row(i) points at W values (lanes s < w valid) of
// relative row i in [0, len). Contiguous lanes are read in place; broadcast ones filled; strided
// ones moved a block of `block_rows` rows at a time into `buf` (block_rows x W values); CQ lanes
// likewise, a run of Q values per chunk and row. A block of every row of a tile (block_rows =
// len: short batch-first systems, lanes one system after another) is read eight systems at a
// time, their rows one range copied as one stream into `stage` (kBlock * len values) and
// transposed from there: blocks of kRows rows of every lane would keep a stream per lane open,
// more than the hardware prefetchers follow.
template <typename T>
class RowReader {
 public:
  void Init(const T* data, const Geometry::Strides& st, int64_t row, int64_t w, int64_t W,
            int64_t len, T* buf, int64_t block_rows = kRows, T* stage = nullptr) {
    base_ = data + st.base;
    stage_ = stage;
    lanes_ = st;
    lanes_.base = 0;
    row_ = row;
    w_ = w;
    W_ = W;
    len_ = len;
    buf_ = buf;
    block_rows_ = block_rows;
    block_ = std::numeric_limits<int64_t>::min();
    if (lanes_.group > 1 && row_ != 0) {
      GroupPrefetch(0, kGroupAhead);
    } else if (lanes_.lane > 1 && row_ == 1 && block_rows_ == kRows) {
      Prefetch(0, kAhead);
      for (int64_t k = 0; k < kNear; ++k) NearPrefetch(k * kRows);
    }
  }

  inline __attribute__((always_inline)) const T* Row(int64_t i) {
    if (lanes_.lane == 1) return base_ + i * row_;
    const int64_t b = row_ == 0 ? 0 : i / block_rows_;
    if (b != block_) Load(b);
    return buf_ + (row_ == 0 ? 0 : (i - b * block_rows_)) * W_;
  }

  // Value of lane s at relative row i (any i: the caller knows it is inside the array).
  T At(int64_t s, int64_t i) const { return Lane(s)[i * row_]; }
  // Lane s's relative row 0 in the array.
  const T* Lane(int64_t s) const { return base_ + lanes_.Offset(s); }

 private:
  // A CQ tile's chunks: the lines of rows [i0, i0 + rows) of each, into L2.
  void GroupPrefetch(int64_t i0, int64_t rows) const {
    rows = std::min(rows, len_ - i0);
    if (rows <= 0) return;
    const int64_t bytes = ((rows - 1) * row_ + (lanes_.group - 1) * lanes_.inner + 1) *
                          static_cast<int64_t>(sizeof(T));
    PrefetchRuns(base_ + i0 * row_, w_ / lanes_.group, lanes_.lane, bytes);
  }

  // Each strided lane is its own stream, more than the hardware prefetchers follow: Load asks
  // for the lines kAhead rows on (Init for the first kAhead), into L2: a tile's lines ahead
  // would not fit in L1.
  void Prefetch(int64_t i0, int64_t rows) const {
    rows = std::min(rows, len_ - i0);
    for (int64_t s = 0; s < w_; ++s) {
      const char* lane = reinterpret_cast<const char*>(base_ + s * lanes_.lane + i0);
      for (int64_t b = 0; b < rows * static_cast<int64_t>(sizeof(T)); b += 64) {
        PrefetchLine<!kIntoL1>(lane + b);
      }
    }
  }

  // The lines of each lane's block of kRows rows from row i0 (rows 1 apart), into L1: lines
  // asked into L2 only (Prefetch) still stall the transposes that read them.
  void NearPrefetch(int64_t i0) const {
    if (i0 >= len_) return;
    const int64_t bytes = std::min(kRows, len_ - i0) * static_cast<int64_t>(sizeof(T));
    for (int64_t s = 0; s < w_; ++s) {
      const char* lane = reinterpret_cast<const char*>(base_ + s * lanes_.lane + i0);
      for (int64_t b = 0; b < bytes; b += 64) PrefetchLine<kIntoL1>(lane + b);
    }
  }

  void Load(int64_t b) {
    block_ = b;
    const int64_t i0 = b * block_rows_;
    const int64_t rows = row_ == 0 ? 1 : std::min(block_rows_, len_ - i0);
    if (lanes_.group > 1) {
      if (row_ != 0) GroupPrefetch(i0 + kGroupAhead, kRows);
      MoveRuns<true>(const_cast<T*>(base_ + i0 * row_), lanes_.lane, row_, lanes_.group,
                     lanes_.inner, buf_, W_, w_ / lanes_.group, rows);
      return;
    }
    if (lanes_.lane == 0) {
      for (int64_t r = 0; r < rows; ++r) std::fill(buf_ + r * W_, buf_ + r * W_ + w_, At(0, i0 + r));
      return;
    }
    // Whole 8x8 blocks (rows [0, full) of lanes [0, s0)) by transposes, the rest one by one.
    int64_t s0 = 0, full = 0;
    if (row_ == 1) {
      if (block_rows_ == kRows) {
        NearPrefetch(i0 + kNear * kRows);
        if (rows == kRows) Prefetch(i0 + kAhead, kRows);
      }
      full = rows - rows % kBlock;
      // A whole tile of contiguous systems: eight lanes' rows are one range, copied as one
      // stream into `stage_` and transposed from there.
      const bool staged = stage_ != nullptr && lanes_.lane == len_ && i0 == 0 && rows == len_;
      for (; full > 0 && s0 + kBlock <= w_; s0 += kBlock) {
        const T* from = base_ + s0 * lanes_.lane + i0;
        if (staged) {
          std::memcpy(stage_, from, kBlock * len_ * sizeof(T));
          from = stage_;
        }
        for (int64_t r = 0; r < full; r += kBlock) {
          Transpose8(from + r, lanes_.lane, buf_ + r * W_ + s0, W_);
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      T* dst = buf_ + r * W_;
      for (int64_t s = r < full ? s0 : 0; s < w_; ++s) dst[s] = At(s, i0 + r);
    }
  }

  const T* base_;
  Geometry::Strides lanes_;  // lane s at base_ + lanes_.Offset(s)
  int64_t row_, w_, W_, len_, block_rows_;
  T* buf_;
  T* stage_ = nullptr;  // kBlock * len values, for a whole tile's rows
  int64_t block_;
};

// Write rows [i0, i0 + rows) of a (rows x W) scratch `src` (src points at row i0) to lanes
// laid out as `st` (in `data`) with rows `row` apart.
template <typename T>
void StoreRows(T* data, const Geometry::Strides& st, int64_t row, int64_t w, int64_t W,
               int64_t i0, int64_t rows, const T* src) {
  T* base = data + st.base;
  const int64_t lane = st.lane;
  if (st.group > 1) {
    MoveRuns<false>(base + i0 * row, lane, row, st.group, st.inner, const_cast<T*>(src), W,
                    w / st.group, rows);
    return;
  }
  if (lane == 1) {
    for (int64_t r = 0; r < rows; ++r) std::copy(src + r * W, src + r * W + w, base + (i0 + r) * row);
    return;
  }
  // Whole 8x8 blocks (rows [0, full) of lanes [0, s0)) by transposes, eight lanes at a time
  // (each lane's rows one after another), the rest one by one.
  int64_t s0 = 0, full = 0;
  if (row == 1) {
    full = rows - rows % kBlock;
    for (; full > 0 && s0 + kBlock <= w; s0 += kBlock) {
      for (int64_t r = 0; r < full; r += kBlock) {
        Transpose8(src + r * W + s0, W, base + s0 * lane + i0 + r, lane);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t s = r < full ? s0 : 0; s < w; ++s) base[s * lane + (i0 + r) * row] = src[r * W + s];
  }
}

// ---------------------------------------------------------------------------------------------
// Writing rows one at a time (recurrences, factors): in place for contiguous lanes, else
// through a block of kRows rows flushed by transposes, whichever direction the rows go.

template <typename T>
class RowWriter {
 public:
  void Init(T* data, const Geometry::Strides& st, int64_t row, int64_t w, int64_t W, int64_t len,
            T* buf) {
    data_ = data;
    st_ = st;
    in_place_ = st.group == 1 && st.lane == 1;  // contiguous lanes
    row_ = row;
    w_ = w;
    W_ = W;
    len_ = len;
    buf_ = buf;
    block_ = -1;
  }

  T* Row(int64_t i) {
    if (in_place_) return data_ + st_.base + i * row_;
    const int64_t b = i / kRows;
    if (b != block_) {
      Flush();
      block_ = b;
    }
    return buf_ + (i - b * kRows) * W_;
  }

  void Flush() {
    if (in_place_ || block_ < 0) return;
    const int64_t i0 = block_ * kRows;
    StoreRows(data_, st_, row_, w_, W_, i0, std::min(kRows, len_ - i0), buf_);
    block_ = -1;
  }

 private:
  T* data_;
  Geometry::Strides st_;
  bool in_place_;
  int64_t row_, w_, W_, len_;
  T* buf_;
  int64_t block_;
};


}  // namespace
}  // namespace tridiax::cpu
