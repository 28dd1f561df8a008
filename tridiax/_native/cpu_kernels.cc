// tridiax's CPU kernels, as XLA FFI custom calls: tridiagonal solves (TridiaxThomasCpu), the
// two sweeps of the in-device partition method (TridiaxChunkEndsCpu, TridiaxChunkSolveCpu), the
// factorization A = L D V (TridiaxFactorCpu), the band cotangents of a solve's gradient
// (TridiaxBandCotangentsCpu), and elementwise recurrences
// h[t] = act(a[t]*h[t-1] + x[t]) with their chunked sweep (TridiaxRecurrenceCpu,
// TridiaxRecurrenceEndsCpu). Same algorithms, band conventions and (P, N, Q) view as the Pallas
// kernels (_tridiagonal/pallas_triton.py states the kinds; _long_systems/chunked.py the partition method).
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
// else by scalar gathers. Work rows (c', y',
// ...) stay in a per-thread scratch of (rows x W) values, so memory sees each input read once
// and each output written once. Tiles are shared out over std::threads.
//
// Lanes whose rows are contiguous (Q == 1) are instead scanned one at a time, L rows per vector
// register, for plain and factored real solves and linear recurrences ("Contiguous lanes"
// below): one read stream per operand, no transposes.
//
// Built on first use by tridiax/_native/library.py against jax.ffi.include_dir(), with
// -march=native: the transposes use AVX2 where the compiler targets it.

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kBlock = 8;   // rows and lanes of one transpose, the lane granule of a tile
constexpr int64_t kRows = 16;   // rows per block of strided lanes (a cache line of floats)
constexpr int64_t kAhead = 256;  // rows a strided lane is prefetched ahead of its reads
constexpr int64_t kNear = 2;  // blocks of kRows rows a strided lane is prefetched into L1 ahead
constexpr int64_t kGroupAhead = 1024;  // rows a CQ tile's chunks are prefetched ahead
constexpr int64_t kScanRows = 16;  // the most rows one vector holds (ScanVector<T>::L)
constexpr int64_t kSpareRows = 32;  // a solve tile's rows of per-lane values (Solver)
constexpr int64_t kWholeTileBytes = 1 << 18;  // the most a tile's rows read whole may take
constexpr int kReducedRows = 10;  // the partition method's values per chunk (Solver::Reduced)
// How much smaller the reduced row's sums' spikes must be for its diagonal to be formed from
// them (Solver::Reduced; tridiax/_long_systems/chunked.py, SUMS_MARGIN, the same).
constexpr double kSumsMargin = 16;

// ---------------------------------------------------------------------------------------------
// Operands and the 8x8 transposes.

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

#include "cpu_common.h"

// ---------------------------------------------------------------------------------------------
// Geometry: which lanes a tile holds.

enum Lanes : int64_t { kLanesQ = 0, kLanesP = 1, kLanesC = 2, kLanesCQ = 3 };

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
// k*n), either way (`ToBlock`). Contiguous runs of 8, 16 or 32 bytes are one move each: a
// loop around memcpy of a run cost about 5 cycles a run, a third of a (10^6, 4) float32 solve.
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
// one and drops the calls to it, so every prefetch of the helpers below (Prefetch,
// GroupPrefetch, PrefetchRuns) was missing from the built kernel until 2026-11-25.
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

  // The lines of each lane's block of kRows rows from row i0 (rows 1 apart), into L1. Lines
  // asked into L2 only (Prefetch) still stalled the transposes that read them: a float32 solve
  // of one system of 10^7 rows took 42 ms without these, 28 ms with them, and 100 000
  // batch-first systems of 100 rows (tiles of 32) 4.7 -> 3.4 ns a value on one core (2-core
  // Zen 3, AVX2).
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
// Helpers shared by the kinds.

enum Kind : int64_t { kThomas = 0, kFactored = 1, kPeriodic = 2, kPivoted = 3 };
// Activations of a recurrence, and gate slopes: relu' or tanh' read from the state.
enum Activation : int64_t { kIdentity = 0, kRelu = 1, kTanh = 2 };

// The slope a gate multiplies a step by (1 for kIdentity): relu'(g) or tanh'(g) read from the
// state g, for a scalar or, lane by lane, a vector (`one`, `zero` of its type).
template <int Gate, typename U>
inline U GateSlope(U g, U one, U zero) {
  if constexpr (Gate == kRelu) return g > zero ? one : zero;
  if constexpr (Gate == kTanh) return one - g * g;
  return one;
}

// v[s] = tanh(v[s]) for s < n. std::tanh is a scalar libm call (about 20 ns: a tanh IndRNN
// ran at 40x the memory floor). float32 takes the rational approximation XLA's CPU tanh uses
// (Eigen's: odd degree 13 over even degree 6 on [-7.9053, 7.9053], clamped beyond, x itself
// below 4e-4; within 6 ulp), which the compiler vectorizes; float64 goes through glibc's
// vector tanh (libmvec, glibc >= 2.35, within 4 ulp: _native/library.py adds -DTRIDIAX_LIBMVEC and
// links -l:libmvec.so.1 where it finds it), else libm's.
inline float RationalTanh(float x) {
  const float c = std::min(std::max(x, -7.90531110763549805f), 7.90531110763549805f);
  const float x2 = c * c;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  return std::abs(x) < 0.0004f ? x : c * p / q;
}

#if defined(TRIDIAX_LIBMVEC) && defined(__AVX2__)
extern "C" {
__m256d _ZGVdN4v_tanh(__m256d);
#if defined(__AVX512F__)
__m512d _ZGVeN8v_tanh(__m512d);
#endif
}
#endif

template <typename T>
void TanhInPlace(T* __restrict__ v, int64_t n) {
  int64_t s = 0;
  if constexpr (std::is_same_v<T, float>) {
#pragma GCC ivdep
    for (; s < n; ++s) v[s] = RationalTanh(v[s]);
    return;
  }
#if defined(TRIDIAX_LIBMVEC) && defined(__AVX2__)
  if constexpr (std::is_same_v<T, double>) {
#if defined(__AVX512F__)
    for (; s + 8 <= n; s += 8) _mm512_storeu_pd(v + s, _ZGVeN8v_tanh(_mm512_loadu_pd(v + s)));
#endif
    for (; s + 4 <= n; s += 4) _mm256_storeu_pd(v + s, _ZGVdN4v_tanh(_mm256_loadu_pd(v + s)));
  }
#endif
  for (; s < n; ++s) v[s] = std::tanh(v[s]);
}

// The Sherman-Morrison split of a periodic system (tridiax/_tridiagonal/periodic.py, `split`): gamma =
// -sign(d0) * max(|d0|, |alpha|, |u0|) from row 0 of A, sign(0) = 1, so that row 0 of T' is
// diagonally dominant and |alpha*beta/gamma| <= |beta|.
template <typename T>
T Split(T d0, T alpha, T u0) {
  using R = decltype(std::abs(d0));
  const R size = std::max({std::abs(d0), std::abs(alpha), std::abs(u0)});
  const R magnitude = std::abs(d0);
  const T direction = magnitude > R(0) ? d0 / magnitude : T(1);
  return -direction * size;
}

// ---------------------------------------------------------------------------------------------
// Vectors of contiguous values: linear recurrences scanned inside vector registers, and rows of
// runs.
//
// When a recurrence's steps lie next to each other in memory (Q == 1: batch-first data), a
// vector holds L consecutive steps of ONE lane instead of one step of L lanes, so the lane is
// read as one stream instead of through transposes. L steps (c_i, x_i) compose by a log-step
// scan: at distance k = 1, 2, 4, ...,
//   x_i += c_i * x_{i-k},  c_i *= c_{i-k}     (lanes i < k take c = 1, x = 0),
// after which h_i = c_i * h_in + x_i for every step and c_{L-1} is the product of the L
// coefficients; the chain from one vector to the next is one multiply-add and one broadcast.
// Reverse-time lanes scan towards lane 0. Real dtypes only.
//
// Tridiagonal solves are never scanned: a scan composes the elimination in another order
// (c' as products of 2x2 matrices, y' and x as log-step scans), which loses digits against
// the sweep on the systems PDE users solve (implicit heat steps, near-singular Poisson
// problems). Every solve keeps the sweep's order, row after row, in every lane; the vectors
// here only move a solve's rows (RunRows).

#if (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)) && defined(__AVX2__)
#define TRIDIAX_VECTOR_SCAN 1
#if defined(__AVX512F__)
constexpr int kScanBytes = 64;
#else
constexpr int kScanBytes = 32;
#endif

template <typename T>
struct ScanVector {
  static constexpr int L = kScanBytes / static_cast<int>(sizeof(T));
  typedef T V __attribute__((vector_size(kScanBytes)));

  static V Load(const T* p, int64_t stride) {
    if (stride == 0) return Splat(*p);
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
  }
  static void Store(T* p, V v) { std::memcpy(p, &v, sizeof(V)); }
  static V Splat(T value) {
    V v;
    for (int i = 0; i < L; ++i) v[i] = value;
    return v;
  }
  // Lane i takes v[i - K] (Up) or v[i + K], and `fill` where that is outside the vector.
  template <int K, bool Up, size_t... I>
  static V Shift(V v, V fill, std::index_sequence<I...>) {
#if defined(__AVX512F__)
    // One valignd (no index register, no copy of a destroyed source).
    constexpr int words = K * static_cast<int>(sizeof(T)) / 4;
    if constexpr (Up) {
      return (V)_mm512_alignr_epi32((__m512i)v, (__m512i)fill, 16 - words);
    } else {
      return (V)_mm512_alignr_epi32((__m512i)fill, (__m512i)v, words);
    }
#else
    return __builtin_shufflevector(
        fill, v, (Up ? (static_cast<int>(I) < K ? static_cast<int>(I) : L + static_cast<int>(I) - K)
                     : (static_cast<int>(I) + K < L ? L + static_cast<int>(I) + K
                                                    : static_cast<int>(I)))...);
#endif
  }
  // Lane i takes v[First + i % G]: lanes [First, First + G) repeated over the vector.
  template <int First, int G, size_t... I>
  static V Repeat(V v, std::index_sequence<I...>) {
    return __builtin_shufflevector(v, v, (First + static_cast<int>(I) % G)...);
  }
  // L/G steps of G lanes from p, `step` values a step and `lane` values a lane: contiguous
  // rows of G values (step G, lane 1), one row repeated (step 0; lane 1, or 0 for one value),
  // or one value a step shared by the lanes (step 1, lane 0). G = 1: `step` 1 or 0.
  template <int G>
  static V LoadSteps(const T* p, int64_t step, int64_t lane) {
    if (G == 1 || (step != 0 && lane != 0)) return Load(p, G == 1 ? step : 1);
    if (step == 0) {
      V v;
      for (int i = 0; i < L; ++i) v[i] = p[(i % G) * lane];
      return v;
    }
    return Spread<G>(p, std::make_index_sequence<L>{});
  }
  // Lane i takes p[i / G]: L/G values, each repeated G times. One masked load of those values
  // (no read past them), then one permute: a narrower load widened through memory (memcpy into
  // a vector) stalled store forwarding, and the scan ran 2.6x slower.
  template <int G, size_t... I>
  static V Spread(const T* p, std::index_sequence<I...>) {
    constexpr int words = (L / G) * static_cast<int>(sizeof(T)) / 4;
#if defined(__AVX512F__)
    const V part = (V)_mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << words) - 1), p);
#else
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(words),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const V part = (V)_mm256_maskload_epi32(reinterpret_cast<const int*>(p), mask);
#endif
    return __builtin_shufflevector(part, part, (static_cast<int>(I) / G)...);
  }
  // L/G runs of G contiguous values, run j at p + j*apart, in lanes [jG, jG + G): a row of a
  // CQ tile's chunks read straight from memory (halves joined by shuffles, no trip through a
  // buffer).
  template <int G>
  static V LoadRuns(const T* p, int64_t apart) {
    return Runs<G, L / G>(p, apart);
  }
  template <int G, int R>
  static auto Runs(const T* p, int64_t apart) {
    if constexpr (R == 1) {
      typedef T H __attribute__((vector_size(G * sizeof(T))));
      H h;
      std::memcpy(&h, p, sizeof(H));
      return h;
    } else {
      const auto lo = Runs<G, R / 2>(p, apart);
      const auto hi = Runs<G, R / 2>(p + (R / 2) * apart, apart);
      return Join(lo, hi, std::make_index_sequence<G * R>{});
    }
  }
  template <typename H, size_t... I>
  static auto Join(H lo, H hi, std::index_sequence<I...>) {
    return __builtin_shufflevector(lo, hi, static_cast<int>(I)...);
  }
  // The inverse of LoadRuns: lanes [jG, jG + G) of v to the run at p + j*apart.
  template <int G>
  static void StoreRuns(T* p, int64_t apart, V v) {
    Unjoin<G, L / G>(p, apart, v);
  }
  template <int G, int R, typename H>
  static void Unjoin(T* p, int64_t apart, H v) {
    if constexpr (R == 1) {
      std::memcpy(p, &v, sizeof(H));
    } else {
      Unjoin<G, R / 2>(p, apart, Half<0>(v, std::make_index_sequence<G * R / 2>{}));
      Unjoin<G, R / 2>(p + (R / 2) * apart, apart,
                       Half<G * R / 2>(v, std::make_index_sequence<G * R / 2>{}));
    }
  }
  template <int First, typename H, size_t... I>
  static auto Half(H v, std::index_sequence<I...>) {
    return __builtin_shufflevector(v, v, (First + static_cast<int>(I))...);
  }
  // L/G values `apart` values apart, each repeated over G lanes (a band shared by the G lanes
  // of each run).
  template <int G>
  static V SpreadRuns(const T* p, int64_t apart) {
    const auto v = Runs<1, L / G>(p, apart);
    return Repeats<G>(v, std::make_index_sequence<L>{});
  }
  template <int G, typename H, size_t... I>
  static V Repeats(H v, std::index_sequence<I...>) {
    return __builtin_shufflevector(v, v, (static_cast<int>(I) / G)...);
  }
  // The log-step scan of (c, x) over the vector's lanes, towards lane L-1 (Up) or lane 0.
  template <bool Up, int K = 1>
  static inline __attribute__((always_inline)) void Scan(V& c, V& x, V one, V zero) {
    if constexpr (K < L) {
      using Lanes = std::make_index_sequence<L>;
      x += c * Shift<K, Up>(x, zero, Lanes{});
      c *= Shift<K, Up>(c, one, Lanes{});
      Scan<Up, 2 * K>(c, x, one, zero);
    }
  }
};

// Whether rows of q lanes share a vector (ScanLanes, RunRows): q divides the vector's L lanes,
// 1 < q < L.
template <typename T>
constexpr bool Groupable(int64_t q) {
  constexpr int64_t L = ScanVector<T>::L;
  return q > 1 && q < L && L % q == 0;
}

// f(std::integral_constant<int, q>{}) for a Groupable q (built for 2, 4 and 8);
// false, f not called, for any other q.
template <typename T, typename F>
bool WithGroup(int64_t q, F&& f) {
  constexpr int L = ScanVector<T>::L;
  switch (q) {
    case 2: f(std::integral_constant<int, 2>{}); return true;
    case 4: if constexpr (L > 4) { f(std::integral_constant<int, 4>{}); return true; } break;
    case 8: if constexpr (L > 8) { f(std::integral_constant<int, 8>{}); return true; } break;
  }
  return false;
}

#endif

// ---------------------------------------------------------------------------------------------
// Tridiagonal sweeps.
//
// Row i of the matrix swept reads sub[i]*x[i-1] + d[i]*x[i] + sup[i]*x[i+1] = b[i]; with
// `transposed` the transposed matrix is read: sub[i] = upper[i-1], sup[i] = lower[i+1].
//
// Modes:
//   kSolve:  whole systems by one of the kinds (chunk == N).
//   kEnds:   the partition method's first sweep (tridiax/_long_systems/chunked.py). Chunk c of rows
//            [c*m, c*m + n + 1) has interior rows 0..n-1 and its last row n as separator s_c.
//            With T the interior matrix, y = T^{-1} b, v = T^{-1}(alpha e_1), w = T^{-1}(omega
//            e_n), where alpha = sub(0) couples row 0 to the previous separator and omega =
//            sup(n-1) couples row n-1 to s_c, the interior is x = y - v x[s_{c-1}] - w x[s_c].
//            Substituted into the separator rows, that leaves a tridiagonal system in the
//            separators, whose rows this sweep writes chunk by chunk (10 arrays (P, C, Q)):
//              own row s_c:  lower = -sub(n) v_last,  diag1 = d(n) - sub(n) w_last,
//                            sum1 = sub(n) + d(n) - sub(n) yr_last,  rhs1 = b(n) - sub(n) y_last,
//                            score1 = kSumsMargin |sub(n) yr_last| - |sub(n) w_last|;
//              row s_{c-1}:  diag2 = -beta v_first,  sum2 = beta (1 - yr_first),
//                            upper = -beta w_first,  rhs2 = -beta y_first,
//                            score2 = kSumsMargin |beta yr_first| - |beta v_first|,
//                            beta = sup(s_{c-1}),
//            with yr = T^{-1} r, r the sums of the interior rows (alpha and omega included):
//            the reduced diagonal is diag1 + diag2, or the reduced row's sum sum1 + sum2 less
//            its lower and upper entries, whichever score1 + score2 picks (Reduced says why).
//   kChunkSolve: the last sweep: each interior solved again with the separators known,
//            b[0] -= alpha x[s_{c-1}], b[n-1] -= omega x[s_c]; x[s_c] written as given.
// Without `periodic`, nothing couples into chunk 0 from before (alpha = beta = 0 there);
// with it, s_{-1} is the last separator N-1.
enum Mode : int64_t { kSolve = 0, kEnds = 1, kChunkSolve = 2 };

template <typename T>
class Solver {
 public:
  Solver(const Operand* ops, const Operand* xsep, T* const* outs, const Geometry& g,
         bool transposed, int64_t kind, int64_t mode, bool periodic)
      : g_(g), transposed_(transposed), kind_(kind), mode_(mode), periodic_(periodic) {
    for (int k = 0; k < 4; ++k) ops_[k] = ops[k];
    for (int k = 0; k < kReducedRows; ++k) outs_[k] = outs[k];
    if (xsep != nullptr) xsep_ = *xsep;
  }

  int64_t tiles() const { return g_.tiles(); }
  // c', y', z'/U2, pivots (rows x W each), 4 reader blocks, kSpareRows spare rows; at least c'
  // and y' of a tile's chunks where tiles may take SolveOfRuns.
  int64_t scratch_size() const {
    return std::max(RunsSize(), (4 * g_.chunk + 4 * ReaderRows() + kSpareRows) * g_.W +
                                    kBlock * g_.N);
  }

  void Run(int64_t begin, int64_t end, T* scratch) const {
    for (int64_t t = begin; t < end; ++t) SolveTile(g_.At(t), scratch);
  }

 private:
  const T* Data(int k) const { return static_cast<const T*>(ops_[k].data); }

  // Rows of a RowReader block: every row of a tile of whole batch-first systems (rows
  // contiguous, lanes along P) while four operands' blocks take at most kWholeTileBytes,
  // kRows otherwise.
  int64_t ReaderRows() const {
    const bool whole = mode_ == kSolve && g_.lanes == kLanesP && g_.Q == 1 &&
                       4 * g_.N * g_.W * static_cast<int64_t>(sizeof(T)) <= kWholeTileBytes;
    return whole ? std::max(g_.N, kRows) : kRows;
  }

  // The scratch of SolveOfRuns (c' and y' of a tile's chunks), where tiles may take it.
  int64_t RunsSize() const {
#if defined(TRIDIAX_VECTOR_SCAN)
    if constexpr (std::is_floating_point_v<T>) {
      if (mode_ == kChunkSolve && kind_ == kThomas && g_.lanes == kLanesCQ) {
        return 2 * g_.chunk * ScanVector<T>::L;
      }
    }
#endif
    return 0;
  }

  // Whether SolveOfRuns took this tile: the last sweep of Thomas chunks whose rows are runs.
  bool SolvedOfRuns(const Tile& tile, T* scratch) const {
#if defined(TRIDIAX_VECTOR_SCAN)
    if constexpr (std::is_floating_point_v<T>) {
      if (mode_ != kChunkSolve || kind_ != kThomas || tile.lanes != kLanesCQ) return false;
      bool done = false;
      const auto runs = [&](auto G) { done = SolveOfRuns<decltype(G)::value>(tile, scratch); };
      return WithGroup<T>(g_.Q, runs) && done;
    }
#endif
    return false;
  }

  void SolveTile(const Tile& tile, T* scratch) const {
    const int64_t W = g_.W, len = tile.len, w = tile.w;
    if (SolvedOfRuns(tile, scratch)) return;
    T* c = scratch;
    T* y = c + len * W;
    T* z = y + len * W;
    T* v = z + len * W;
    const int64_t block_rows = ReaderRows();
    T* blocks = v + len * W;
    T* spare = blocks + 4 * block_rows * W;  // kSpareRows rows of W
    RowReader<T> rd[4];
    for (int k = 0; k < 4; ++k) {
      const auto st = g_.Of(tile, ops_[k].sp, ops_[k].sn, ops_[k].sq, g_.chunk);
      rd[k].Init(Data(k), st, ops_[k].sn, w, W, len, blocks + k * block_rows * W, block_rows,
                 block_rows == kRows ? nullptr : spare + kSpareRows * W);
    }
    const int kl = transposed_ ? 2 : 0, ku = transposed_ ? 0 : 2;
    // sub(i), i >= 1, and sup(i), i <= len - 2, inside the tile's rows.
    auto sub = [&](int64_t i) { return rd[kl].Row(transposed_ ? i - 1 : i); };
    auto dia = [&](int64_t i) { return rd[1].Row(i); };
    auto sup = [&](int64_t i) { return rd[ku].Row(transposed_ ? i + 1 : i); };
    auto rhs = [&](int64_t i) { return rd[3].Row(i); };

    if (mode_ != kSolve) {
      Chunk(tile, rd, sub, dia, sup, rhs, c, y, z, v, spare);
      return;
    }
    if (kind_ == kFactored) {
      Factored(sub, dia, sup, rhs, y, W, w, len);
    } else if (kind_ == kThomas) {
      Eliminate(sub, dia, sup, rhs, nullptr, nullptr, c, y, W, w, len);
      BackSubstitute(c, y, W, w, len);
    } else if (kind_ == kPivoted) {
      Pivoted(sub, dia, sup, rhs, spare, v, c, z, y, W, w, len);
    } else {
      // Corners of A (A^T when transposed): alpha = A[0, N-1], beta = A[N-1, 0].
      T* alpha = spare;
      T* beta = spare + W;
      const T* lo0 = rd[0].Row(0);
      std::copy(lo0, lo0 + w, transposed_ ? beta : alpha);
      const T* upn = rd[2].Row(len - 1);
      std::copy(upn, upn + w, transposed_ ? alpha : beta);
      Periodic(sub, dia, sup, rhs, alpha, beta, spare + 2 * W, c, y, z, W, w, len);
    }
    const auto st = g_.Of(tile, g_.N * g_.Q, g_.Q, 1, g_.chunk);
    StoreRows(outs_[0], st, g_.Q, w, W, 0, len, y);
  }

  // Thomas forward elimination of rows [0, n), dividing by each pivot p[i] = d[i] -
  // sub[i] c'[i-1]: c'[i] = sup[i] / p[i] into c (c'[n-1] = 0: row n-1's sup is never read),
  // y'[i] = (b[i] - sub[i] y'[i-1]) / p[i] into y. `b0` and `bl`, if given, replace the
  // right-hand sides of rows 0 and n-1 (n >= 2 for `bl`).
  template <typename Sub, typename Dia, typename Sup, typename Rhs>
  void Eliminate(Sub sub, Dia dia, Sup sup, Rhs rhs, const T* b0, const T* bl, T* c, T* y,
                 int64_t W, int64_t w, int64_t n) const {
    {
      const T* __restrict__ d0 = dia(0);
      const T* __restrict__ r0 = b0 != nullptr ? b0 : rhs(0);
      const T* __restrict__ u0 = n > 1 ? sup(0) : nullptr;
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) {
        c[s] = n > 1 ? u0[s] / d0[s] : T(0);
        y[s] = r0[s] / d0[s];
      }
    }
    for (int64_t i = 1; i < n; ++i) {
      const bool last = i == n - 1;
      const T *__restrict__ a = sub(i), *__restrict__ d = dia(i);
      const T* __restrict__ b = last && bl != nullptr ? bl : rhs(i);
      const T* __restrict__ cp = c + (i - 1) * W;
      const T* __restrict__ yp = y + (i - 1) * W;
      T* __restrict__ ci = c + i * W;
      T* __restrict__ yi = y + i * W;
      if (!last) {
        const T* __restrict__ u = sup(i);
#pragma GCC ivdep
        for (int64_t s = 0; s < w; ++s) {
          const T p = d[s] - a[s] * cp[s];
          ci[s] = u[s] / p;
          yi[s] = (b[s] - a[s] * yp[s]) / p;
        }
      } else {
#pragma GCC ivdep
        for (int64_t s = 0; s < w; ++s) {
          ci[s] = T(0);
          yi[s] = (b[s] - a[s] * yp[s]) / (d[s] - a[s] * cp[s]);
        }
      }
    }
  }

  // The separators around lane s's chunk, known in the last sweep (kChunkSolve): x[s_{c-1}]
  // (the last separator before chunk 0 when periodic, zero otherwise) and x[s_c].
  std::pair<T, T> Separators(const Tile& tile, int64_t s) const {
    const T* xs = static_cast<const T*>(xsep_.data) + tile.P(s) * xsep_.sp +
                  tile.Q(s) * xsep_.sq;
    const int64_t cs = tile.C(s);
    const T before = cs > 0 || periodic_ ? xs[(cs > 0 ? cs - 1 : g_.C - 1) * xsep_.sn] : T(0);
    return {before, xs[cs * xsep_.sn]};
  }

  // The couplings between lane s's chunk and the previous separator (row N-1 before chunk 0
  // when periodic; none into chunk 0 otherwise): alpha = sub(0) of row 0 (lower[0], or
  // upper[-1] transposed) and beta = sup(-1) of the separator (upper[-1], or lower[0]).
  // `lower`, `upper`: the chunk's row 0 in each band.
  std::pair<T, T> Couplings(const Tile& tile, int64_t s, const T* lower, const T* upper) const {
    const int64_t cs = tile.C(s);
    if (cs == 0 && !periodic_) return {T(0), T(0)};
    const Operand& up = ops_[2];
    const T up_before = cs > 0
        ? upper[-up.sn]
        : Data(2)[tile.P(s) * up.sp + (g_.N - 1) * up.sn + tile.Q(s) * up.sq];
    return transposed_ ? std::pair<T, T>{up_before, lower[0]}
                       : std::pair<T, T>{lower[0], up_before};
  }

  // x[i] = y'[i] - c'[i] x[i+1] in place in y, from x[n-1] = y'[n-1].
  void BackSubstitute(const T* c, T* y, int64_t W, int64_t w, int64_t n) const {
    for (int64_t i = n - 2; i >= 0; --i) {
      const T* __restrict__ ci = c + i * W;
      T* __restrict__ yi = y + i * W;
      const T* __restrict__ yn = y + (i + 1) * W;
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) yi[s] -= ci[s] * yn[s];
    }
  }

  // The first sweep of the partition method on one tile of chunks: one forward elimination of
  // the interior rows 0..n-1 carried in registers, nothing stored, for four right-hand sides:
  // b (y), alpha e_1 (v), omega e_n (w) and the interior rows' sums r (yr = T^{-1} r, the
  // interior of the answer to A x = A 1). The last values come straight from it (c'[n-1] = 0);
  // the first ones x[0] = sum_i pi_i x'[i] with pi_0 = 1, pi_{i+1} = -pi_i c'[i] (the back
  // substitution unrolled from row 0) accumulate along, and w' is zero but for omega/pivot in
  // row n-1. |c'| < 1 for the diagonally dominant matrices the unpivoted partition method is
  // for, so pi decays. Row sums: see Reduced.
  template <typename Sub, typename Dia, typename Sup, typename Rhs>
  void Ends(const Tile& tile, Sub sub, Dia dia, Sup sup, Rhs rhs, const T* alpha, const T* beta,
            const T* omega, T* work) const {
    const int64_t W = g_.W, w = tile.w, n = tile.len - 1;
#if defined(TRIDIAX_VECTOR_SCAN)
    if constexpr (std::is_floating_point_v<T>) {
      bool done = false;
      const auto runs = [&](auto G) {
        done = EndsOfRuns<decltype(G)::value>(tile, alpha, beta, omega, work);
      };
      if (tile.lanes == kLanesCQ && WithGroup<T>(g_.Q, runs) && done) return;
    }
#endif
    // c'[i-1], y'[i-1], v'[i-1], yr'[i-1], pi_i, the sums of pi y', pi v', pi yr', and w'[n-1].
    T* __restrict__ cp = work;
    T* __restrict__ yp = work + W;
    T* __restrict__ vp = work + 2 * W;
    T* __restrict__ rp = work + 3 * W;
    T* __restrict__ pi = work + 4 * W;
    T* __restrict__ ys = work + 5 * W;
    T* __restrict__ vs = work + 6 * W;
    T* __restrict__ rs = work + 7 * W;
    T* __restrict__ wl = work + 8 * W;
    {
      const T *__restrict__ d = dia(0), *__restrict__ b = rhs(0);
      const T* __restrict__ u = n > 1 ? sup(0) : omega;
      for (int64_t s = 0; s < w; ++s) {
        cp[s] = n > 1 ? u[s] / d[s] : T(0);
        yp[s] = ys[s] = b[s] / d[s];
        vp[s] = vs[s] = alpha[s] / d[s];
        rp[s] = rs[s] = (alpha[s] + d[s] + u[s]) / d[s];
        pi[s] = T(1);
        wl[s] = omega[s] / d[s];
      }
    }
    for (int64_t i = 1; i < n; ++i) {
      const T *__restrict__ a = sub(i), *__restrict__ d = dia(i), *__restrict__ b = rhs(i);
      if (i + 1 < n) {
        const T* __restrict__ u = sup(i);
#pragma GCC ivdep
        for (int64_t s = 0; s < w; ++s) {
          const T q = d[s] - a[s] * cp[s];
          const T p = -pi[s] * cp[s];
          const T y = (b[s] - a[s] * yp[s]) / q;
          const T v = -a[s] * vp[s] / q;
          const T r = ((a[s] + d[s] + u[s]) - a[s] * rp[s]) / q;
          cp[s] = u[s] / q;
          yp[s] = y;
          vp[s] = v;
          rp[s] = r;
          pi[s] = p;
          ys[s] += p * y;
          vs[s] += p * v;
          rs[s] += p * r;
        }
      } else {
        for (int64_t s = 0; s < w; ++s) {
          const T q = d[s] - a[s] * cp[s];
          const T p = -pi[s] * cp[s];
          const T y = (b[s] - a[s] * yp[s]) / q;
          const T v = -a[s] * vp[s] / q;
          const T r = ((a[s] + d[s] + omega[s]) - a[s] * rp[s]) / q;
          yp[s] = y;
          vp[s] = v;
          rp[s] = r;
          pi[s] = p;
          ys[s] += p * y;
          vs[s] += p * v;
          rs[s] += p * r;
          wl[s] = omega[s] / q;
        }
      }
    }
    const T *sn = sub(n), *dn = dia(n), *bn = rhs(n);
    T* o = work + 9 * W;  // kReducedRows rows: the reduced system's contributions
    for (int64_t s = 0; s < w; ++s) {
      Reduced(o, s, sn[s], dn[s], bn[s], beta[s], {yp[s], vp[s], wl[s], rp[s]},
              {ys[s], vs[s], pi[s] * wl[s], rs[s]});
    }
    StoreReduced(tile, o);
  }

#if defined(TRIDIAX_VECTOR_SCAN)
  // The rows of a CQ tile of exactly one vector of lanes (L/G chunks of G lanes), each row of
  // a sweep operand (sub, dia, sup, rhs; transposed: sub(i) = upper[i-1], sup(i) = lower[i+1])
  // read straight from memory into one vector: runs of G contiguous values (kRuns), one value
  // per run spread over its G lanes (kSpread: a band shared by the G systems), or one value
  // (kValue); a row broadcast along N is any of these, read again each row.
  template <int G>
  struct RunRows {
    using S = ScanVector<T>;
    using V = typename S::V;
    static constexpr int64_t R = S::L / G;  // chunks a vector
    enum Read { kRuns, kSpread, kValue };
    const T* at[4];  // row 0 of each sweep operand
    int64_t row[4], apart[4];
    Read read[4];

    inline __attribute__((always_inline)) V Load(int j, int64_t i) const {
      const T* p = at[j] + i * row[j];
      return read[j] == kRuns ? S::template LoadRuns<G>(p, apart[j])
             : read[j] == kSpread ? S::template SpreadRuns<G>(p, apart[j])
                                  : S::Splat(*p);
    }
    // The lines of `rows` rows of each operand's runs from row i, into L2.
    void Prefetch(int64_t i, int64_t rows) const {
      for (int j = 0; j < 4; ++j) {
        if (row[j] == 0) continue;  // one row for the whole chunk
        PrefetchRuns(at[j] + i * row[j], R, apart[j],
                     ((rows - 1) * row[j] + G) * static_cast<int64_t>(sizeof(T)));
      }
    }
  };

  // The tile's RunRows; false where the tile is not one vector of lanes or an operand's lanes
  // are laid out otherwise.
  template <int G>
  bool TileRuns(const Tile& tile, RunRows<G>& runs) const {
    using Rows = RunRows<G>;
    if (tile.w != ScanVector<T>::L) return false;
    const int kl = transposed_ ? 2 : 0, ku = transposed_ ? 0 : 2;
    const int op[4] = {kl, 1, ku, 3};
    const int64_t lag[4] = {transposed_ ? -1 : 0, 0, transposed_ ? 1 : 0, 0};
    for (int j = 0; j < 4; ++j) {
      const Operand& o = ops_[op[j]];
      const auto st = g_.Of(tile, o.sp, o.sn, o.sq, g_.chunk);
      if (st.group == G && (st.inner == 1 || st.inner == 0)) {
        runs.read[j] = st.inner == 1 ? Rows::kRuns : Rows::kSpread;
      } else if (st.group == 1 && st.lane == 0) {
        runs.read[j] = Rows::kValue;
      } else {
        return false;
      }
      runs.at[j] = Data(op[j]) + st.base + lag[j] * o.sn;
      runs.row[j] = o.sn;
      runs.apart[j] = st.lane;
    }
    return true;
  }

  // Ends for a CQ tile of exactly one vector of lanes, its rows read by RunRows, the state (c',
  // y', v', pi and the two sums) carried in registers. Ends reads such rows through RowReader,
  // moving them run by run into a buffer and back out, and its state through `work`: the first
  // sweep of a (10^6, 4) float32 field took 2.2-2.9 ms against 0.8-1.2 ms this way, (10^6, 8)
  // 5.5-6.4 against 2.0-2.6 (2-core Zen 4). False, nothing done, for other tiles. Compiled
  // apart from Chunk: inlined there, GCC left RunRows::Load out of line, or, with Load forced
  // inline, the sweep ran 10-20% slower.
  template <int G>
  __attribute__((noinline)) bool EndsOfRuns(const Tile& tile, const T* alpha, const T* beta,
                                            const T* omega, T* work) const {
    using S = ScanVector<T>;
    using V = typename S::V;
    constexpr int64_t L = S::L;
    const int64_t W = g_.W, n = tile.len - 1;
    RunRows<G> rows;
    if (n < 1 || !TileRuns<G>(tile, rows)) return false;
    const auto load = [&](int j, int64_t i) { return rows.Load(j, i); };
    // The tile's RowReaders (SolveTile) already asked for rows [0, kGroupAhead); each block of
    // kRows rows asks for the block kGroupAhead rows after it.
    const auto prefetch = [&](int64_t i) { rows.Prefetch(i, kRows); };
    const V one = S::Splat(T(1)), zero = S::Splat(T(0));
    const V om = S::Load(omega, 1);
    V cp, yp, vp, rp, pi = one, ys, vs, rs, wl;  // as Ends
    {
      const V p = load(1, 0);
      const V u = n > 1 ? load(2, 0) : om;
      cp = n > 1 ? u / p : zero;
      yp = ys = load(3, 0) / p;
      const V al = S::Load(alpha, 1);
      vp = vs = al / p;
      rp = rs = (al + p + u) / p;
      wl = om / p;
    }
    // Rows 1..n-1; the last has no sup and gives w's last value.
    for (int64_t i = 1; i < n; ++i) {
      if (i % kRows == 0 && i - kRows + kGroupAhead < n) prefetch(i - kRows + kGroupAhead);
      const V a = load(0, i), d = load(1, i);
      const V u = i + 1 < n ? load(2, i) : om;
      const V p = d - a * cp;
      pi = -pi * cp;
      yp = (load(3, i) - a * yp) / p;
      vp = -a * vp / p;
      rp = ((a + d + u) - a * rp) / p;
      ys += pi * yp;
      vs += pi * vp;
      rs += pi * rp;
      if (i + 1 < n) {
        cp = u / p;
      } else {
        wl = om / p;
      }
    }
    const V sn = load(0, n), dn = load(1, n), bn = load(3, n);
    T* o = work + 9 * W;  // kReducedRows rows: the reduced system's contributions, as Ends
    for (int64_t s = 0; s < L; ++s) {
      Reduced(o, s, sn[s], dn[s], bn[s], beta[s], {yp[s], vp[s], wl[s], rp[s]},
              {ys[s], vs[s], pi[s] * wl[s], rs[s]});
    }
    StoreReduced(tile, o);
    return true;
  }

  // The partition method's last sweep (kChunkSolve, Thomas) on a CQ tile of exactly one vector
  // of lanes, its rows read by RunRows: the forward elimination row by row with c' and y' in
  // registers and stored to `scratch` (2 n L values), then the back substitution, each row of x
  // stored as its runs. False, nothing done, for other tiles.
  template <int G>
  __attribute__((noinline)) bool SolveOfRuns(const Tile& tile, T* scratch) const {
    using S = ScanVector<T>;
    using V = typename S::V;
    constexpr int64_t L = S::L;
    const int64_t n = tile.len - 1;  // interior rows; row n: the separator
    RunRows<G> rows;
    if (n < 1 || !TileRuns<G>(tile, rows)) return false;
    rows.Prefetch(0, std::min(n, kGroupAhead));
    const auto so = g_.Of(tile, g_.N * g_.Q, g_.Q, 1, g_.chunk);
    T* x = outs_[0] + so.base;  // runs so.lane apart, rows Q apart
    const int64_t sx = g_.Q;
    // Each lane's separators: x[s_c] written as row n, and the right-hand sides of rows 0 and
    // n-1 less their couplings to x[s_{c-1}] and x[s_c] (both on row 0 when n = 1), as Chunk.
    alignas(64) T left[L], right[L];
    {
      const auto lower = g_.Of(tile, ops_[0].sp, ops_[0].sn, ops_[0].sq, g_.chunk);
      const auto upper = g_.Of(tile, ops_[2].sp, ops_[2].sn, ops_[2].sq, g_.chunk);
      for (int64_t s = 0; s < L; ++s) {
        const auto [xl, xr] = Separators(tile, s);
        left[s] = Couplings(tile, s, Data(0) + lower.At(s), Data(2) + upper.At(s)).first * xl;
        right[s] = xr;
        x[so.Offset(s) + n * sx] = xr;
      }
    }
    const V one = S::Splat(T(1)), zero = S::Splat(T(0));
    const V right_coupled = rows.Load(2, n - 1) * S::Load(right, 1);  // omega x[s_c]
    V b0 = rows.Load(3, 0) - S::Load(left, 1);
    if (n == 1) b0 -= right_coupled;
    T* c_rows = scratch;  // c'[i] at c_rows + i*L (rows 0..n-2), y'[i] at y_rows + i*L
    T* y_rows = scratch + n * L;
    V cp, yp;
    {
      const V p = rows.Load(1, 0);
      cp = n > 1 ? rows.Load(2, 0) / p : zero;
      yp = b0 / p;
      S::Store(c_rows, cp);
      S::Store(y_rows, yp);
    }
    for (int64_t i = 1; i < n; ++i) {
      const int64_t ahead = i - kRows + kGroupAhead;
      if (i % kRows == 0 && ahead < n) rows.Prefetch(ahead, std::min(kRows, n - ahead));
      const V a = rows.Load(0, i);
      const V p = rows.Load(1, i) - a * cp;
      if (i + 1 < n) {
        yp = (rows.Load(3, i) - a * yp) / p;
        cp = rows.Load(2, i) / p;
        S::Store(c_rows + i * L, cp);
      } else {  // row n-1: no sup; its right-hand side less omega x[s_c]
        yp = (rows.Load(3, i) - right_coupled - a * yp) / p;
      }
      S::Store(y_rows + i * L, yp);
    }
    // x[n-1] = y'[n-1], x[i] = y'[i] - c'[i] x[i+1].
    V xv = yp;
    S::template StoreRuns<G>(x + (n - 1) * sx, so.lane, xv);
    for (int64_t i = n - 2; i >= 0; --i) {
      xv = S::Load(y_rows + i * L, 1) - S::Load(c_rows + i * L, 1) * xv;
      S::template StoreRuns<G>(x + i * sx, so.lane, xv);
    }
    return true;
  }
#endif

  // The first or last values of y, v, w and yr (T^{-1} r, r the interior rows' sums) in one
  // chunk's interior.
  struct Spikes {
    T y, v, w, r;
  };

  // Lane s's ten contributions to the reduced system (see Mode) into rows of `o` (W apart):
  // from its separator row (sub, dia, rhs) and the previous separator's coupling beta. The
  // reduced diagonal comes in two forms, and _long_systems/chunked.py takes, row by row, the sums where
  // their spikes are kSumsMargin times smaller than the direct form's (the score:
  // kSumsMargin |sub yr| - |sub w| here, kSumsMargin |beta yr| - |beta v| for the previous
  // row; negative: the sums). Directly, d - sub w_last - beta v_first subtracts terms of
  // size 1 to a small number on weakly dominant matrices (a Poisson problem's reduced diagonal is
  // 2/(m+1)), and the spikes' rounding, grown along the chunk, is then a large part of it.
  // From the reduced row's sum: with yr = T^{-1} r = 1 + v + w, the row sums to
  // (sub + d - sub yr_last) + beta (1 - yr_first), and yr is small where r is (such
  // matrices), so little rounding enters; where T^{-1} is large and r is not (matrices far
  // from dominant, solved with pivoting), yr is as large as the spikes, and its rounding,
  // which its size does not show when its terms cancel, makes the direct form the better.
  void Reduced(T* o, int64_t s, T sn, T dn, T bn, T beta, Spikes last, Spikes first) const {
    const int64_t W = g_.W;
    o[s] = -sn * last.v;
    o[W + s] = dn - sn * last.w;
    o[2 * W + s] = (sn + dn) - sn * last.r;
    o[3 * W + s] = bn - sn * last.y;
    o[4 * W + s] = T(kSumsMargin * Magnitude(sn * last.r) - Magnitude(sn * last.w));
    o[5 * W + s] = -beta * first.v;
    o[6 * W + s] = beta * (T(1) - first.r);
    o[7 * W + s] = -beta * first.w;
    o[8 * W + s] = -beta * first.y;
    o[9 * W + s] = T(kSumsMargin * Magnitude(beta * first.r) - Magnitude(beta * first.v));
  }

  void StoreReduced(const Tile& tile, const T* o) const {
    const auto st = g_.Of(tile, g_.C * g_.Q, g_.Q, 1, 1);
    for (int k = 0; k < kReducedRows; ++k) {
      StoreRows(outs_[k], st, g_.Q, tile.w, g_.W, 0, 1, o + k * g_.W);
    }
  }

  // The first sweep with partial pivoting inside each chunk: Pivoted's elimination of the
  // interior rows 0..n-1 for the four right-hand sides b, alpha e_1, omega e_n and the row
  // sums r (as Ends) at once, carried in registers, nothing stored. The last values are those
  // of U's last row; the first ones are x[0] = sum_i pi_i y'[i] with pi = e_1^T U^{-1}, which
  // U's rows give as they are formed: pi_i = (delta_i0 - pi_{i-1} U1[i-1] - pi_{i-2} U2[i-2])
  // / pivot_i. With the multipliers at most 1 in magnitude, |pi| is bounded by the chunk's
  // ||T^{-1}||: the conditioning of the chunk, not the elimination, bounds it. `work`: 26
  // rows. Each step's interchange is Pivoted's, written out again (one always-inline helper
  // for both loops slowed the sequential pivoted solve).
  template <typename Sub, typename Dia, typename Sup, typename Rhs>
  void PivotedEnds(const Tile& tile, Sub sub, Dia dia, Sup sup, Rhs rhs, const T* alpha,
                   const T* beta, const T* omega, T* work) const {
    const int64_t W = g_.W, w = tile.w, n = tile.len - 1;
    // The pending row (columns i, i+1 and its four right-hand sides), pi_{i-1}, pi_{i-2},
    // U1[i-1], U2[i-1], U2[i-2], and the sums of pi y' for the four right-hand sides.
    T* __restrict__ pa = work;
    T* __restrict__ pc = work + W;
    T* __restrict__ fb = work + 2 * W;
    T* __restrict__ fv = work + 3 * W;
    T* __restrict__ fw = work + 4 * W;
    T* __restrict__ fr = work + 5 * W;
    T* __restrict__ p1 = work + 6 * W;
    T* __restrict__ p2 = work + 7 * W;
    T* __restrict__ u1p = work + 8 * W;
    T* __restrict__ u2p = work + 9 * W;
    T* __restrict__ u2pp = work + 10 * W;
    T* __restrict__ sb = work + 11 * W;
    T* __restrict__ sv = work + 12 * W;
    T* __restrict__ sw = work + 13 * W;
    T* __restrict__ sr = work + 14 * W;
    T* zeros = work + 25 * W;  // after the output rows: stands in for a missing band row
    std::fill(zeros, zeros + w, T(0));
    {
      const T *d0 = dia(0), *b0 = rhs(0);
      const T* u0 = n > 1 ? sup(0) : omega;
      for (int64_t s = 0; s < w; ++s) {
        pa[s] = d0[s];
        pc[s] = n > 1 ? u0[s] : T(0);
        fb[s] = b0[s];
        fv[s] = alpha[s];
        fw[s] = n == 1 ? omega[s] : T(0);
        fr[s] = alpha[s] + d0[s] + u0[s];
        p1[s] = p2[s] = u1p[s] = u2p[s] = u2pp[s] = T(0);
        sb[s] = sv[s] = sw[s] = sr[s] = T(0);
      }
    }
    for (int64_t i = 0; i + 1 < n; ++i) {
      const bool fill = i + 2 < n;      // sup(n-1) couples to the separator: omega, not U
      const bool into_last = i + 2 == n;  // row i+1 = n-1 carries omega
      const T e = i == 0 ? T(1) : T(0);
      const T *__restrict__ l = sub(i + 1), *__restrict__ d = dia(i + 1),
                            *__restrict__ b = rhs(i + 1);
      // Rows of zeros for a missing upper entry and omega's absence (no branch in the loop,
      // which then vectorises).
      const T* __restrict__ u = fill ? sup(i + 1) : zeros;
      const T* __restrict__ wr = into_last ? omega : zeros;
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) {
        const T un = u[s], wn = wr[s];
        const T rn = (l[s] + d[s] + un) + wn;  // row i+1's sum (un or wn is zero)
        const bool swap = Magnitude(l[s]) > Magnitude(pa[s]);
        const T pivot = swap ? l[s] : pa[s];
        const T m = (swap ? pa[s] : l[s]) / pivot;
        // U's row i (k: kept) and the next pending row (o: other, minus m times the kept).
        const T k1 = swap ? d[s] : pc[s], k2 = swap ? un : T(0);
        const T kb = swap ? b[s] : fb[s], kv = swap ? T(0) : fv[s], kw = swap ? wn : fw[s];
        const T kr = swap ? rn : fr[s];
        const T o1 = swap ? pc[s] : d[s], o2 = swap ? T(0) : un;
        const T ob = swap ? fb[s] : b[s], ov = swap ? fv[s] : T(0), ow = swap ? fw[s] : wn;
        const T orr = swap ? fr[s] : rn;
        const T pi = (e - p1[s] * u1p[s] - p2[s] * u2pp[s]) / pivot;
        sb[s] += pi * kb;
        sv[s] += pi * kv;
        sw[s] += pi * kw;
        sr[s] += pi * kr;
        p2[s] = p1[s];
        p1[s] = pi;
        u2pp[s] = u2p[s];
        u2p[s] = k2;
        u1p[s] = k1;
        pa[s] = o1 - m * k1;
        pc[s] = o2 - m * k2;
        fb[s] = ob - m * kb;
        fv[s] = ov - m * kv;
        fw[s] = ow - m * kw;
        fr[s] = orr - m * kr;
      }
    }
    const T *sn = sub(n), *dn = dia(n), *bn = rhs(n);
    const T e = n == 1 ? T(1) : T(0);
    T* o = work + 15 * W;  // kReducedRows rows: the reduced system's contributions, as Ends
    for (int64_t s = 0; s < w; ++s) {
      const T pi = (e - p1[s] * u1p[s] - p2[s] * u2pp[s]) / pa[s];
      Reduced(o, s, sn[s], dn[s], bn[s], beta[s],
              {fb[s] / pa[s], fv[s] / pa[s], fw[s] / pa[s], fr[s] / pa[s]},
              {sb[s] + pi * fb[s], sv[s] + pi * fv[s], sw[s] + pi * fw[s], sr[s] + pi * fr[s]});
    }
    StoreReduced(tile, o);
  }

  // The partition method's sweeps on one tile of chunks (see Mode), by the unpivoted kinds or,
  // kind kPivoted, with partial pivoting inside each chunk. `c`, `y`, `z`, `v`: work rows of
  // the chunk; `spare` holds kSpareRows rows.
  template <typename Sub, typename Dia, typename Sup, typename Rhs>
  void Chunk(const Tile& tile, RowReader<T>* rd, Sub sub, Dia dia, Sup sup, Rhs rhs, T* c, T* y,
             T* z, T* v, T* spare) const {
    const int64_t W = g_.W, w = tile.w, n = tile.len - 1;  // interior rows; row n: separator
    T* alpha = spare;          // coupling of row 0 to the previous separator
    T* beta = spare + W;       // the previous separator's sup (its coupling to row 0)
    T* omega = spare + 2 * W;  // coupling of row n-1 to this chunk's separator
    for (int64_t s = 0; s < w; ++s) {
      std::tie(alpha[s], beta[s]) = Couplings(tile, s, rd[0].Lane(s), rd[2].Lane(s));
    }
    {
      const T* om = sup(n - 1);  // upper[n-1], or lower[n] transposed
      std::copy(om, om + w, omega);
    }
    if (mode_ == kEnds) {
      if (kind_ == kPivoted) {
        PivotedEnds(tile, sub, dia, sup, rhs, alpha, beta, omega, spare + 3 * W);
      } else {
        Ends(tile, sub, dia, sup, rhs, alpha, beta, omega, spare + 3 * W);
      }
      return;
    }
    // kChunkSolve: the separators are known; adjust the end rows' right-hand sides.
    T* b0 = spare + 3 * W;
    T* bl = spare + 4 * W;
    {
      const T* r0 = rhs(0);
      for (int64_t s = 0; s < w; ++s) {
        const auto [xl, xr] = Separators(tile, s);
        b0[s] = r0[s] - alpha[s] * xl;
        y[n * W + s] = xr;  // the separator, row n of the output
        omega[s] *= xr;
      }
    }
    if (n == 1) {
      for (int64_t s = 0; s < w; ++s) b0[s] -= omega[s];
    } else {
      const T* rl = rhs(n - 1);
      for (int64_t s = 0; s < w; ++s) bl[s] = rl[s] - omega[s];
    }
    if (kind_ == kPivoted) {
      // Rows 0 and n-1 take the adjusted right-hand sides (both in b0 when n = 1).
      auto ends = [&](int64_t i) { return i == 0 ? b0 : i == n - 1 ? bl : rhs(i); };
      Pivoted(sub, dia, sup, ends, spare + 5 * W, v, c, z, y, W, w, n);
    } else {
      Eliminate(sub, dia, sup, rhs, b0, n > 1 ? bl : nullptr, c, y, W, w, n);
      BackSubstitute(c, y, W, w, n);
    }
    const auto st = g_.Of(tile, g_.N * g_.Q, g_.Q, 1, g_.chunk);
    StoreRows(outs_[0], st, g_.Q, w, W, 0, n + 1, y);
  }

  // Gaussian elimination with partial pivoting (row interchanges), as LAPACK's gtsv: at step i
  // the pending row (a, c | f) (its entries in columns i and i+1, and its right-hand side) and
  // row i+1 of A (sub, d, sup | b) compete for the pivot; the larger |column i| entry becomes
  // row i of U, and the other row, minus m times it, becomes the pending row for step i+1. An
  // interchange makes U's row i (sub, d, sup): one fill-in diagonal U2. U's rows are kept as
  // pivot, U1, U2 and y, then x[i] = (y[i] - U1[i] x[i+1] - U2[i] x[i+2]) / pivot[i]; the
  // multiplier divides by the pivot too (gtsv's order of operations).
  // Branch-free, so the W systems of a tile vectorise whichever rows they interchange.
  template <typename Sub, typename Dia, typename Sup, typename Rhs>
  void Pivoted(Sub sub, Dia dia, Sup sup, Rhs rhs, T* state, T* pivots, T* u1, T* u2, T* y,
               int64_t W, int64_t w, int64_t N) const {
    T* __restrict__ pa = state;          // pending row: column i
    T* __restrict__ pc = state + W;      // column i+1
    T* __restrict__ pf = state + 2 * W;  // right-hand side
    {
      const T *d0 = dia(0), *b0 = rhs(0);
      std::copy(d0, d0 + w, pa);
      std::copy(b0, b0 + w, pf);
      if (N > 1) {
        const T* u0 = sup(0);
        std::copy(u0, u0 + w, pc);
      }
    }
    for (int64_t i = 0; i + 1 < N; ++i) {
      // sup(N-1) lies outside the matrix (upper[N-1], or lower[N-1] transposed): never read.
      const bool fill = i + 2 < N;
      const T *__restrict__ l = sub(i + 1), *__restrict__ d = dia(i + 1),
                            *__restrict__ b = rhs(i + 1);
      const T* __restrict__ u = fill ? sup(i + 1) : nullptr;
      T* __restrict__ vi = pivots + i * W;
      T* __restrict__ u1i = u1 + i * W;
      T* __restrict__ u2i = u2 + i * W;
      T* __restrict__ yi = y + i * W;
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) {
        const T un = fill ? u[s] : T(0);
        const bool swap = Magnitude(l[s]) > Magnitude(pa[s]);
        const T pivot = swap ? l[s] : pa[s];
        const T m = (swap ? pa[s] : l[s]) / pivot;
        const T k1 = swap ? d[s] : pc[s], k2 = swap ? un : T(0), ky = swap ? b[s] : pf[s];
        const T o1 = swap ? pc[s] : d[s], o2 = swap ? T(0) : un, oy = swap ? pf[s] : b[s];
        vi[s] = pivot;
        u1i[s] = k1;
        u2i[s] = k2;
        yi[s] = ky;
        pa[s] = o1 - m * k1;
        pc[s] = o2 - m * k2;
        pf[s] = oy - m * ky;
      }
    }
    T* __restrict__ xl = y + (N - 1) * W;
#pragma GCC ivdep
    for (int64_t s = 0; s < w; ++s) xl[s] = pf[s] / pa[s];
    for (int64_t i = N - 2; i >= 0; --i) {
      const T *__restrict__ vi = pivots + i * W, *__restrict__ u1i = u1 + i * W,
                            *__restrict__ u2i = u2 + i * W;
      const T* __restrict__ x1 = y + (i + 1) * W;
      T* __restrict__ xi = y + i * W;
      if (i + 2 < N) {
        const T* __restrict__ x2 = y + (i + 2) * W;
#pragma GCC ivdep
        for (int64_t s = 0; s < w; ++s) xi[s] = (xi[s] - u1i[s] * x1[s] - u2i[s] * x2[s]) / vi[s];
      } else {
#pragma GCC ivdep
        for (int64_t s = 0; s < w; ++s) xi[s] = (xi[s] - u1i[s] * x1[s]) / vi[s];
      }
    }
  }

  // Stored factors A = L D V (sub: L's sub-diagonal l, dia: D = 1/pivots m, sup: V's
  // super-diagonal c'): y[i] = b[i] - l[i]*y[i-1], then x[i] = m[i]*y[i] - c'[i]*x[i+1].
  // Transposed, the accessors read c'[i-1] and l[i+1]: A^T = V^T D L^T is the same sweep.
  template <typename Sub, typename Dia, typename Sup, typename Rhs>
  void Factored(Sub sub, Dia dia, Sup sup, Rhs rhs, T* y, int64_t W, int64_t w, int64_t N) const {
    {
      const T* b0 = rhs(0);
      std::copy(b0, b0 + w, y);
    }
    for (int64_t i = 1; i < N; ++i) {
      const T *__restrict__ l = sub(i), *__restrict__ b = rhs(i);
      const T* __restrict__ yp = y + (i - 1) * W;
      T* __restrict__ yi = y + i * W;
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) yi[s] = b[s] - l[s] * yp[s];
    }
    {
      const T* __restrict__ m = dia(N - 1);
      T* __restrict__ yl = y + (N - 1) * W;
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) yl[s] *= m[s];
    }
    for (int64_t i = N - 2; i >= 0; --i) {
      const T *__restrict__ m = dia(i), *__restrict__ u = sup(i);
      const T* __restrict__ xn = y + (i + 1) * W;
      T* __restrict__ yi = y + i * W;
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) yi[s] = m[s] * yi[s] - u[s] * xn[s];
    }
  }

  // Periodic, by Sherman-Morrison (tridiax/_tridiagonal/periodic.py): A = T' + u v^T, T' the tridiagonal
  // part with d'[0] = d[0] - gamma and d'[N-1] = d[N-1] - alpha*beta/gamma, u = (gamma, 0, ...,
  // 0, beta), v = (1, 0, ..., 0, alpha/gamma), gamma = Split(...) so that T' is never worse than
  // A (no breakdown on a zero d[0]). One forward sweep eliminates T' for y' and for
  // z' = T'^{-1}u together (u is zero between its ends, so z' reads nothing from memory), one
  // backward sweep substitutes both, and x = y - (v.y)/(1 + v.z) z is formed in cache.
  template <typename Sub, typename Dia, typename Sup, typename Rhs>
  void Periodic(Sub sub, Dia dia, Sup sup, Rhs rhs, const T* alpha, const T* beta, T* kappa,
                T* c, T* y, T* z, int64_t W, int64_t w, int64_t N) const {
    T* corr = z + (N - 1) * W;  // -alpha*beta/gamma until row N-1 is eliminated
    {
      const T *__restrict__ d0 = dia(0), *__restrict__ u0 = sup(0), *__restrict__ b0 = rhs(0);
      for (int64_t s = 0; s < w; ++s) {
        const T gamma = Split(d0[s], alpha[s], u0[s]);
        const T p = d0[s] - gamma;
        c[s] = u0[s] / p;
        y[s] = b0[s] / p;
        z[s] = gamma / p;
        kappa[s] = alpha[s] / gamma;
        corr[s] = -alpha[s] * beta[s] / gamma;
      }
    }
    for (int64_t i = 1; i < N; ++i) {
      const bool last = i == N - 1;
      const T *__restrict__ a = sub(i), *__restrict__ d = dia(i), *__restrict__ b = rhs(i);
      const T* __restrict__ cp = c + (i - 1) * W;
      const T* __restrict__ yp = y + (i - 1) * W;
      const T* __restrict__ zp = z + (i - 1) * W;
      T* __restrict__ ci = c + i * W;
      T* __restrict__ yi = y + i * W;
      T* __restrict__ zi = z + i * W;
      if (!last) {
        const T* __restrict__ u = sup(i);
#pragma GCC ivdep
        for (int64_t s = 0; s < w; ++s) {
          const T p = d[s] - a[s] * cp[s];
          ci[s] = u[s] / p;
          yi[s] = (b[s] - a[s] * yp[s]) / p;
          zi[s] = -a[s] * zp[s] / p;
        }
      } else {
        for (int64_t s = 0; s < w; ++s) {
          const T p = d[s] + corr[s] - a[s] * cp[s];
          yi[s] = (b[s] - a[s] * yp[s]) / p;
          zi[s] = (beta[s] - a[s] * zp[s]) / p;
        }
      }
    }
    for (int64_t i = N - 2; i >= 0; --i) {
      const T* __restrict__ ci = c + i * W;
      T* __restrict__ yi = y + i * W;
      T* __restrict__ zi = z + i * W;
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) {
        yi[s] -= ci[s] * yi[s + W];
        zi[s] -= ci[s] * zi[s + W];
      }
    }
    T* f = kappa;  // becomes (v.y)/(1 + v.z)
    const T* yl = y + (N - 1) * W;
    const T* zl = z + (N - 1) * W;
#pragma GCC ivdep
    for (int64_t s = 0; s < w; ++s) {
      f[s] = (y[s] + kappa[s] * yl[s]) / (T(1) + z[s] + kappa[s] * zl[s]);
    }
    for (int64_t i = 0; i < N; ++i) {
      T* __restrict__ yi = y + i * W;
      const T* __restrict__ zi = z + i * W;
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) yi[s] -= f[s] * zi[s];
    }
  }

  Geometry g_;
  Operand ops_[4];
  Operand xsep_{};
  T* outs_[kReducedRows];  // x, or (kEnds) the reduced system's arrays
  bool transposed_;
  int64_t kind_, mode_;
  bool periodic_;
};

template <typename T>
void Solve(const Operand* ops, const Operand* xsep, T* const* outs, const Geometry& g,
           bool transposed, int64_t kind, int64_t mode, bool periodic) {
  RunTiles<T>(Solver<T>(ops, xsep, outs, g, transposed, kind, mode, periodic), g.P * g.N * g.Q);
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

// ---------------------------------------------------------------------------------------------
// The factorization A = L D V (tridiax/_tridiagonal/factorization.py): with the pivots p[i] = d[i] -
// lower[i]*c'[i-1] of the Thomas forward elimination, c'[i] = upper[i]/p[i] (c'[N-1] = 0: the
// sweep's own c'), m[i] = 1/p[i] and l[i] = lower[i]/p[i-1] (l[0] = 0), each row written as it
// is formed.

template <typename T>
class Factor {
 public:
  Factor(const Operand* ops, T* const* outs, const Geometry& g)
      : g_(g), ops_{ops[0], ops[1], ops[2]}, outs_{outs[0], outs[1], outs[2]} {}

  int64_t tiles() const { return g_.tiles(); }
  int64_t scratch_size() const { return (6 * kRows + 2) * g_.W; }

  void Run(int64_t begin, int64_t end, T* scratch) const {
    for (int64_t t = begin; t < end; ++t) FactorTile(g_.At(t), scratch);
  }

 private:
  void FactorTile(const Tile& tile, T* scratch) const {
    const int64_t W = g_.W, w = tile.w, N = tile.len;
    RowReader<T> rd[3];
    RowWriter<T> wr[3];
    for (int k = 0; k < 3; ++k) {
      const auto st = g_.Of(tile, ops_[k].sp, ops_[k].sn, ops_[k].sq, g_.chunk);
      rd[k].Init(static_cast<const T*>(ops_[k].data), st, ops_[k].sn, w, W, N,
                 scratch + k * kRows * W);
      const auto so = g_.Of(tile, g_.N * g_.Q, g_.Q, 1, g_.chunk);
      wr[k].Init(outs_[k], so, g_.Q, w, W, N, scratch + (3 + k) * kRows * W);
    }
    T* __restrict__ pp = scratch + 6 * kRows * W;  // pivot p[i-1]
    T* __restrict__ cp = pp + W;                     // c'[i-1]
    for (int64_t i = 0; i < N; ++i) {
      const T* __restrict__ d = rd[1].Row(i);
      const T* __restrict__ a = i > 0 ? rd[0].Row(i) : nullptr;
      const T* __restrict__ u = i + 1 < N ? rd[2].Row(i) : nullptr;
      T* __restrict__ lo = wr[0].Row(i);
      T* __restrict__ mo = wr[1].Row(i);
      T* __restrict__ co = wr[2].Row(i);
      if (i == 0) {
        for (int64_t s = 0; s < w; ++s) {
          lo[s] = T(0);
          mo[s] = T(1) / d[s];
          pp[s] = d[s];
          co[s] = cp[s] = u != nullptr ? u[s] / d[s] : T(0);
        }
        continue;
      }
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) {
        const T p = d[s] - a[s] * cp[s];
        lo[s] = a[s] / pp[s];
        mo[s] = T(1) / p;
        const T cn = u != nullptr ? u[s] / p : T(0);
        co[s] = cn;
        pp[s] = p;
        cp[s] = cn;
      }
    }
    for (auto& writer : wr) writer.Flush();
  }

  Geometry g_;
  Operand ops_[3];
  T* outs_[3];
};

// ---------------------------------------------------------------------------------------------
// The band cotangents of a solve's gradient (tridiax/_tridiagonal/band_product.py): with b_bar = A^{-T}
// x_bar and x the solution, lower_bar[i] = -b_bar[i] x[i-1], diag_bar[i] = -b_bar[i] x[i],
// upper_bar[i] = -b_bar[i] x[i+1] (zero where the neighbour is outside the system, or across
// the corner when `periodic`); for a solve with A^T the roles of b_bar and x swap in the lower
// and upper ones. One pass reading g = b_bar and x once and writing the cotangents asked for,
// where XLA runs three loops that read both three times. Rows along N are Q values apart, so
// the neighbours of flat index i within one system are i -/+ Q and every loop is contiguous.

template <typename T>
class BandCotangents {
 public:
  // outs: lower, diag, upper cotangents (nullptr: not asked for), each (P, N, Q).
  BandCotangents(const T* g, const T* x, T* const* outs, int64_t P, int64_t N, int64_t Q,
                 bool transposed, bool periodic)
      : g_(g), x_(x), outs_{outs[0], outs[1], outs[2]}, P_(P), N_(N), Q_(Q),
        transposed_(transposed), periodic_(periodic) {}

  static constexpr int64_t kSpan = int64_t{1} << 14;  // values of one system per tile
  int64_t spans() const { return (N_ * Q_ + kSpan - 1) / kSpan; }
  int64_t tiles() const { return P_ * spans(); }
  int64_t scratch_size() const { return 0; }

  void Run(int64_t begin, int64_t end, T*) const {
    const int64_t NQ = N_ * Q_;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t p = t / spans(), i0 = (t % spans()) * kSpan;
      Span(p * NQ, i0, std::min(i0 + kSpan, NQ));
    }
  }

 private:
  // Flat indices [i0, i1) of the system starting at `base`.
  void Span(int64_t base, int64_t i0, int64_t i1) const {
    const int64_t Q = Q_, NQ = N_ * Q_, last = NQ - Q;  // row N-1 starts at `last`
    const T* g = g_ + base;
    const T* x = x_ + base;
    // lower_bar[i] = -u[i] v[i-Q], upper_bar[i] = -u[i] v[i+Q]: (u, v) = (g, x) for A, and
    // for A^T lower_bar[i] = -x[i] g[i-Q], upper_bar[i] = -x[i] g[i+Q].
    const T* u = transposed_ ? x : g;
    const T* v = transposed_ ? g : x;
    T* lo = outs_[0] != nullptr ? outs_[0] + base : nullptr;
    T* di = outs_[1] != nullptr ? outs_[1] + base : nullptr;
    T* up = outs_[2] != nullptr ? outs_[2] + base : nullptr;
    // Rows 1..N-2 of the span, where every neighbour is inside the system: one pass.
    const int64_t m0 = std::min(std::max(i0, Q), i1), m1 = std::max(std::min(i1, last), m0);
    if (lo != nullptr && di != nullptr && up != nullptr) {
      NegProducts(lo + m0, di + m0, up + m0, g + m0, x + m0, u + m0, v + m0, Q, m1 - m0);
    } else {
      if (di != nullptr) NegProduct(di + m0, g + m0, x + m0, m1 - m0);
      if (lo != nullptr) NegProduct(lo + m0, u + m0, v + m0 - Q, m1 - m0);
      if (up != nullptr) NegProduct(up + m0, u + m0, v + m0 + Q, m1 - m0);
    }
    // Row 0 (before m0) and row N-1 (from m1): the corners when periodic, else zero.
    for (const auto [r0, r1] : {std::pair{i0, m0}, std::pair{m1, i1}}) {
      for (int64_t i = r0; i < r1; ++i) {
        if (di != nullptr) di[i] = -(g[i] * x[i]);
        if (lo != nullptr) {
          lo[i] = i >= Q ? -(u[i] * v[i - Q]) : periodic_ && N_ > 1 ? -(u[i] * v[i + last]) : T(0);
        }
        if (up != nullptr) {
          up[i] = i < last ? -(u[i] * v[i + Q]) : periodic_ && N_ > 1 ? -(u[i] * v[i - last]) : T(0);
        }
      }
    }
  }

  // lo[i] = -(u[i] v[i-Q]), di[i] = -(g[i] x[i]), up[i] = -(u[i] v[i+Q]), i < n.
  void NegProducts(T* __restrict__ lo, T* __restrict__ di, T* __restrict__ up,
                   const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ u,
                   const T* __restrict__ v, int64_t Q, int64_t n) const {
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) {
      lo[i] = -(u[i] * v[i - Q]);
      di[i] = -(g[i] * x[i]);
      up[i] = -(u[i] * v[i + Q]);
    }
  }

  // out[i] = -(a[i] * b[i]), i < n.
  void NegProduct(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b,
                  int64_t n) const {
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) out[i] = -(a[i] * b[i]);
  }

  const T* g_;
  const T* x_;
  T* outs_[3];
  int64_t P_, N_, Q_;
  bool transposed_, periodic_;
};

#if defined(TRIDIAX_VECTOR_SCAN)
// G lanes of a recurrence at relative steps 0..len-1, whose steps are G values apart and whose
// lanes are next to each other (an (N, G) block along axis 0; G = 1: one contiguous lane), L/G
// steps of all G lanes a vector: the log-step scan over lanes G, 2G, 4G, ... apart, then the
// states carried in from the step before. a, x, g: lane 0 of step 0, with step strides sa, sx,
// sg and lane strides qa, qx, qg as LoadSteps reads them (G and 1; 0 and 1 or 0 where one step
// is broadcast; 1 and 0 where the lanes share a value a step); out: G values
// a step (nullptr: none). h: the G states entering in scan order, then the final ones; `edge`:
// the G coefficients of the first step in scan order when `shifted`; decay, if given: the
// products of each lane's coefficients. Swept a row of 4 lanes at a time, a (10^6, 4) float32
// recurrence waited on a multiply-add and a store per row: 4.1 ms against 0.8 (2-core Zen 4).
template <typename T, int Gate, int G>
void ScanLanes(const T* a, int64_t sa, int64_t qa, const T* x, int64_t sx, int64_t qx,
               const T* g, int64_t sg, int64_t qg, T* out, int64_t len, bool reverse,
               bool shifted, const T* edge, T* h, T* decay) {
  using S = ScanVector<T>;
  using V = typename S::V;
  constexpr int L = S::L, R = L / G;  // R steps a vector
  static_assert(R >= 1 && R * G == L, "G must divide the vector's lanes");
  const V one = S::Splat(T(1)), zero = S::Splat(T(0));
  T product[G];
  std::fill(product, product + G, T(1));
  // One step of lane q in scan order at t, with coefficient c.
  auto step = [&](int64_t t, int q, T c) {
    T v = x[t * sx + q * qx];
    if constexpr (Gate != kIdentity) {
      const T slope = GateSlope<Gate>(g[t * sg + q * qg], T(1), T(0));
      c *= slope;
      v *= slope;
    }
    h[q] = c * h[q] + v;
    if (out != nullptr) out[t * G + q] = h[q];
    product[q] *= c;
  };
  // c at step t (shifted: a one step earlier in scan order).
  const int64_t lag = !shifted ? 0 : reverse ? 1 : -1;
  auto coef = [&](int64_t t, int q) { return a[(t + lag) * sa + q * qa]; };
  auto vectors = [&](int64_t t0) {  // steps t0..t0+R-1
    V c = S::template LoadSteps<G>(a + (t0 + lag) * sa, sa, qa);
    V v = S::template LoadSteps<G>(x + t0 * sx, sx, qx);
    if constexpr (Gate != kIdentity) {
      const V slope = GateSlope<Gate>(S::template LoadSteps<G>(g + t0 * sg, sg, qg), one, zero);
      c *= slope;
      v *= slope;
    }
    return std::make_pair(c, v);
  };
  using Lanes = std::make_index_sequence<L>;
  if (!reverse) {
    int64_t t = 0;
    if (shifted && len > 0) {
      for (int q = 0; q < G; ++q) step(0, q, edge[q]);
      t = 1;
    }
    V hv = S::template LoadSteps<G>(h, 0, 1), dv = one;
    for (; t + R <= len; t += R) {
      auto [c, v] = vectors(t);
      S::template Scan<true, G>(c, v, one, zero);
      const V next = c * hv + v;
      if (out != nullptr) S::Store(out + t * G, next);
      if (decay != nullptr) dv *= S::template Repeat<L - G, G>(c, Lanes{});
      hv = S::template Repeat<L - G, G>(next, Lanes{});
    }
    for (int q = 0; q < G; ++q) {
      h[q] = hv[q];
      product[q] *= dv[q];
    }
    for (; t < len; ++t) {
      for (int q = 0; q < G; ++q) step(t, q, coef(t, q));
    }
  } else {
    int64_t t = len;
    if (shifted && len > 0) {
      --t;
      for (int q = 0; q < G; ++q) step(t, q, edge[q]);
    }
    V hv = S::template LoadSteps<G>(h, 0, 1), dv = one;
    for (; t - R >= 0; t -= R) {
      auto [c, v] = vectors(t - R);
      S::template Scan<false, G>(c, v, one, zero);
      const V next = c * hv + v;
      if (out != nullptr) S::Store(out + (t - R) * G, next);
      if (decay != nullptr) dv *= S::template Repeat<0, G>(c, Lanes{});
      hv = S::template Repeat<0, G>(next, Lanes{});
    }
    for (int q = 0; q < G; ++q) {
      h[q] = hv[q];
      product[q] *= dv[q];
    }
    for (; t > 0; --t) {
      for (int q = 0; q < G; ++q) step(t - 1, q, coef(t - 1, q));
    }
  }
  if (decay != nullptr) std::copy(product, product + G, decay);
}
#endif

// ---------------------------------------------------------------------------------------------
// Recurrences: h[t] = act(c[t]*h[prev] + x[t]) over the steps of each lane (reversed when
// `reverse`), c[t] = a[t] or, when `shifted`, a at the previous step's index (zero at the very
// first step). With a `gate` g (the states of a nonlinear recurrence), the linear recurrence
// h[t] = slope(g[t]) * (c[t]*h[prev] + x[t]) that its derivatives run, slope = relu' or tanh'
// read from the state. Modes: kRun (from an initial state per lane: h0 is (P|1, 1, Q|1), or
// (P, C, Q) when chunked, one per chunk); kEnds (each chunk from a zero state: its final state
// and the product of its coefficients, two (P, C, Q) arrays, for the carry fold of _long_systems/chunked.py).
enum RecurrenceMode : int64_t { kRun = 0, kRecurrenceEnds = 1 };

template <typename T>
class Recurrence {
 public:
  Recurrence(const Operand* ops, T* const* outs, const Geometry& g, bool reverse, bool shifted,
             int64_t activation, int64_t gate, int64_t mode, bool final_only)
      : g_(g), ops_{ops[0], ops[1], ops[2], ops[3]}, outs_{outs[0], outs[1]}, reverse_(reverse),
        shifted_(shifted), activation_(activation), gate_(gate), mode_(mode),
        final_only_(final_only) {}

  int64_t tiles() const { return g_.tiles(); }
  int64_t scratch_size() const { return (4 * kRows + 4) * g_.W; }

  void Run(int64_t begin, int64_t end, T* scratch) const {
    for (int64_t t = begin; t < end; ++t) {
      const Tile tile = g_.At(t);
      if constexpr (std::is_floating_point_v<T>) {
        Dispatch(tile, scratch);
      } else {
        Steps<kIdentity, kIdentity>(tile, scratch);
      }
    }
  }

 private:
  void Dispatch(const Tile& tile, T* scratch) const {
    if (gate_ == kRelu) {
      Steps<kIdentity, kRelu>(tile, scratch);
    } else if (gate_ == kTanh) {
      Steps<kIdentity, kTanh>(tile, scratch);
    } else if (activation_ == kRelu) {
      Steps<kRelu, kIdentity>(tile, scratch);
    } else if (activation_ == kTanh) {
      Steps<kTanh, kIdentity>(tile, scratch);
    } else {
      Steps<kIdentity, kIdentity>(tile, scratch);
    }
  }

  // a's row at relative row i of the tile's lanes, outside [0, len): the neighbouring chunk's,
  // or zero where there is none (the first step of the whole sequence).
  void Boundary(const Tile& tile, const RowReader<T>& ra, int64_t i, T* dst) const {
    for (int64_t s = 0; s < tile.w; ++s) {
      const int64_t cs = tile.C(s);
      const bool none = i < 0 ? cs == 0 : cs == g_.C - 1;
      dst[s] = none ? T(0) : ra.At(s, i);
    }
  }

  template <int Act, int Gate>
  void Steps(const Tile& tile, T* scratch) const {
#if defined(TRIDIAX_VECTOR_SCAN)
    if constexpr (Act == kIdentity && std::is_floating_point_v<T>) {
      if (g_.Q == 1 && tile.len >= ScanVector<T>::L) return ScanSteps<Gate, 1>(tile, scratch);
      if (GroupedSteps<Gate>(tile, scratch)) return;
    }
#endif
    const int64_t W = g_.W, w = tile.w, len = tile.len;
    RowReader<T> rd[3];  // a, x, gate
    for (int k : {0, 1, 3}) {
      if (k == 3 && Gate == kIdentity) continue;
      const auto st = g_.Of(tile, ops_[k].sp, ops_[k].sn, ops_[k].sq, g_.chunk);
      rd[k == 3 ? 2 : k].Init(static_cast<const T*>(ops_[k].data), st,
                              ops_[k].sn, w, W, len, scratch + (k == 3 ? 2 : k) * kRows * W);
    }
    T* __restrict__ h = scratch + 4 * kRows * W;
    T* __restrict__ decay = h + W;
    T* edge = decay + W;
    T* ones = edge + W;
    RowWriter<T> out;
    const bool ends = mode_ == kRecurrenceEnds;
    if (!ends && !final_only_) {
      const auto so = g_.Of(tile, g_.N * g_.Q, g_.Q, 1, g_.chunk);
      out.Init(outs_[0], so, g_.Q, w, W, len, scratch + 3 * kRows * W);
    }
    if (ends) {
      std::fill(h, h + w, T(0));
      std::fill(decay, decay + w, T(1));
    } else {
      const Operand& h0 = ops_[2];
      const auto st = g_.Of(tile, h0.sp, h0.sn, h0.sq, 1);
      const T* src = static_cast<const T*>(h0.data);
      for (int64_t s = 0; s < w; ++s) h[s] = src[st.At(s)];
    }
    if (shifted_) Boundary(tile, rd[0], reverse_ ? len : -1, edge);
    std::fill(ones, ones + w, T(1));
    for (int64_t k = 0; k < len; ++k) {
      const int64_t t = reverse_ ? len - 1 - k : k;
      const T* __restrict__ a;
      if (!shifted_) {
        a = rd[0].Row(t);
      } else if (k == 0) {
        a = edge;
      } else {
        a = rd[0].Row(reverse_ ? t + 1 : t - 1);
      }
      const T* __restrict__ x = rd[1].Row(t);
      const T* __restrict__ g = Gate != kIdentity ? rd[2].Row(t) : ones;
      T* __restrict__ dst = ends || final_only_ ? nullptr : out.Row(t);
      if constexpr (Act == kTanh) {  // the pre-activations, then tanh over the tile's lanes
#pragma GCC ivdep
        for (int64_t s = 0; s < w; ++s) h[s] = a[s] * h[s] + x[s];
        TanhInPlace(h, w);
        if (dst != nullptr) std::copy(h, h + w, dst);
        continue;
      }
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) {
        T v = a[s] * h[s] + x[s];
        T slope = T(1);
        if constexpr (std::is_floating_point_v<T>) {
          slope = GateSlope<Gate>(g[s], T(1), T(0));
          if constexpr (Gate != kIdentity) v *= slope;
          if constexpr (Act == kRelu) v = v > T(0) ? v : T(0);
        }
        h[s] = v;
        if (dst != nullptr) dst[s] = v;
        if (ends) decay[s] *= slope * a[s];
      }
    }
    if (ends || final_only_) {
      StoreFinal(tile, h, decay);
    } else {
      out.Flush();
    }
  }

  // The final state of each lane of the tile (and, for kEnds, its coefficients' product).
  void StoreFinal(const Tile& tile, const T* h, const T* decay) const {
    if (mode_ == kRecurrenceEnds) {
      const auto so = g_.Of(tile, g_.C * g_.Q, g_.Q, 1, 1);
      StoreRows(outs_[0], so, g_.Q, tile.w, g_.W, 0, 1, decay);
      StoreRows(outs_[1], so, g_.Q, tile.w, g_.W, 0, 1, h);
    } else {
      const auto so = g_.Of(tile, g_.Q, 0, 1, 1);
      StoreRows(outs_[0], so, 0, tile.w, g_.W, 0, 1, h);
    }
  }

#if defined(TRIDIAX_VECTOR_SCAN)
  // Lanes whose steps are contiguous (Q == 1), one at a time, or all Q lanes of rows of a few
  // values together (Grouped), by ScanLanes with G = Q.
  template <int Gate, int G>
  void ScanSteps(const Tile& tile, T* scratch) const {
    const bool ends = mode_ == kRecurrenceEnds;
    T* h = scratch;
    T* decay = h + g_.W;
    const Operand &oa = ops_[0], &ox = ops_[1], &og = ops_[3];
    const auto sa = g_.Of(tile, oa.sp, oa.sn, oa.sq, g_.chunk);
    const auto sx = g_.Of(tile, ox.sp, ox.sn, ox.sq, g_.chunk);
    const auto so = g_.Of(tile, g_.N * g_.Q, g_.Q, 1, g_.chunk);
    auto sg = sx;
    if constexpr (Gate != kIdentity) sg = g_.Of(tile, og.sp, og.sn, og.sq, g_.chunk);
    const T* a = static_cast<const T*>(oa.data);
    const T* x = static_cast<const T*>(ox.data);
    const T* g = Gate != kIdentity ? static_cast<const T*>(og.data) : nullptr;
    const Operand& h0 = ops_[2];
    const auto s0 = ends ? sx : g_.Of(tile, h0.sp, h0.sn, h0.sq, 1);
    for (int64_t s = 0; s < tile.w; s += G) {
      const T* as = a + sa.At(s);
      T boundary[G] = {};
      for (int q = 0; q < G; ++q) {
        h[s + q] = ends ? T(0) : static_cast<const T*>(h0.data)[s0.At(s + q)];
      }
      if (shifted_) {
        // a one step before the lanes' first step in scan order: the neighbouring chunk's.
        const int64_t cs = tile.C(s);
        const bool none = reverse_ ? cs == g_.C - 1 : cs == 0;
        for (int q = 0; q < G && !none; ++q) {
          boundary[q] = as[(reverse_ ? tile.len : -1) * oa.sn + q * oa.sq];
        }
      }
      T* dst = ends || final_only_ ? nullptr : outs_[0] + so.At(s);
      ScanLanes<T, Gate, G>(as, oa.sn, oa.sq, x + sx.At(s), ox.sn, ox.sq,
                            g != nullptr ? g + sg.At(s) : nullptr, Gate != kIdentity ? og.sn : 0,
                            Gate != kIdentity ? og.sq : 0, dst, tile.len, reverse_, shifted_,
                            boundary, h + s, ends ? decay + s : nullptr);
    }
    if (ends || final_only_) StoreFinal(tile, h, decay);
  }

  // Whether the tile is all Q (< a vector, dividing it) lanes of rows of Q values: ScanLanes
  // with G = Q (each operand such rows, one row broadcast along the steps, or one value a step
  // shared by the lanes: LoadSteps).
  bool Grouped(const Tile& tile) const {
    return Groupable<T>(g_.Q) && tile.lanes == kLanesQ && tile.q == 0 && tile.w == g_.Q &&
           tile.len >= ScanVector<T>::L / g_.Q;
  }

  template <int Gate>
  bool GroupedSteps(const Tile& tile, T* scratch) const {
    const auto steps = [&](auto G) { ScanSteps<Gate, decltype(G)::value>(tile, scratch); };
    return Grouped(tile) && WithGroup<T>(g_.Q, steps);
  }
#endif

  Geometry g_;
  Operand ops_[4];
  T* outs_[2];
  bool reverse_, shifted_;
  int64_t activation_, gate_, mode_;
  bool final_only_;
};

// ---------------------------------------------------------------------------------------------
// FFI entry points.

// Call f.template operator()<T>() for the element type of a buffer; false for other types.
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

int64_t Rows(std::initializer_list<const ffi::AnyBuffer*> bufs) {
  int64_t n = 1;
  for (const auto* b : bufs) n = std::max(n, b->dimensions()[1]);
  return n;
}

ffi::Error Unsupported() { return ffi::Error::InvalidArgument("tridiax: unsupported dtype"); }

ffi::Error ThomasImpl(ffi::AnyBuffer lower, ffi::AnyBuffer diag, ffi::AnyBuffer upper,
                      ffi::AnyBuffer rhs, ffi::Result<ffi::AnyBuffer> x, bool transposed,
                      int64_t kind, int64_t lanes, int64_t width) {
  auto dims = x->dimensions();
  if (dims.size() != 3) return ffi::Error::InvalidArgument("tridiax: expected (P, N, Q)");
  const int64_t P = dims[0], N = dims[1], Q = dims[2];
  if (P == 0 || N == 0 || Q == 0) return ffi::Error::Success();
  const Operand ops[4] = {MakeOperand(lower), MakeOperand(diag), MakeOperand(upper),
                          MakeOperand(rhs)};
  const Geometry g(P, N, Q, 0, lanes, width);
  void* out = x->untyped_data();
  const bool ok = ForType(x->element_type(), [&](auto zero) {
    using T = decltype(zero);
    T* outs[kReducedRows] = {static_cast<T*>(out)};
    Solve<T>(ops, nullptr, outs, g, transposed, kind, kSolve, false);
  });
  return ok ? ffi::Error::Success() : Unsupported();
}

ffi::Error ChunkEndsImpl(ffi::AnyBuffer lower, ffi::AnyBuffer diag, ffi::AnyBuffer upper,
                         ffi::AnyBuffer rhs, ffi::Result<ffi::AnyBuffer> o0,
                         ffi::Result<ffi::AnyBuffer> o1, ffi::Result<ffi::AnyBuffer> o2,
                         ffi::Result<ffi::AnyBuffer> o3, ffi::Result<ffi::AnyBuffer> o4,
                         ffi::Result<ffi::AnyBuffer> o5, ffi::Result<ffi::AnyBuffer> o6,
                         ffi::Result<ffi::AnyBuffer> o7, ffi::Result<ffi::AnyBuffer> o8,
                         ffi::Result<ffi::AnyBuffer> o9, bool transposed, bool periodic,
                         bool pivoting, int64_t lanes, int64_t width, int64_t chunk) {
  auto dims = o0->dimensions();
  const int64_t P = dims[0], Q = dims[2], N = Rows({&lower, &diag, &upper, &rhs});
  if (P == 0 || N == 0 || Q == 0) return ffi::Error::Success();
  const Geometry g(P, N, Q, chunk, lanes, width);
  if (g.C != dims[1] || N % g.chunk == 1 || g.chunk < 2) {
    return ffi::Error::InvalidArgument("tridiax: every chunk needs >= 2 rows and C outputs");
  }
  const Operand ops[4] = {MakeOperand(lower), MakeOperand(diag), MakeOperand(upper),
                          MakeOperand(rhs)};
  void* raw[kReducedRows] = {o0->untyped_data(), o1->untyped_data(), o2->untyped_data(),
                             o3->untyped_data(), o4->untyped_data(), o5->untyped_data(),
                             o6->untyped_data(), o7->untyped_data(), o8->untyped_data(),
                             o9->untyped_data()};
  const bool ok = ForType(o0->element_type(), [&](auto zero) {
    using T = decltype(zero);
    T* outs[kReducedRows];
    for (int k = 0; k < kReducedRows; ++k) outs[k] = static_cast<T*>(raw[k]);
    Solve<T>(ops, nullptr, outs, g, transposed, pivoting ? kPivoted : kThomas, kEnds, periodic);
  });
  return ok ? ffi::Error::Success() : Unsupported();
}

ffi::Error ChunkSolveImpl(ffi::AnyBuffer lower, ffi::AnyBuffer diag, ffi::AnyBuffer upper,
                          ffi::AnyBuffer rhs, ffi::AnyBuffer xsep, ffi::Result<ffi::AnyBuffer> x,
                          bool transposed, bool periodic, bool pivoting, int64_t lanes,
                          int64_t width, int64_t chunk) {
  auto dims = x->dimensions();
  const int64_t P = dims[0], N = dims[1], Q = dims[2];
  if (P == 0 || N == 0 || Q == 0) return ffi::Error::Success();
  const Geometry g(P, N, Q, chunk, lanes, width);
  if (g.C != xsep.dimensions()[1] || N % g.chunk == 1 || g.chunk < 2) {
    return ffi::Error::InvalidArgument("tridiax: every chunk needs >= 2 rows and C separators");
  }
  const Operand ops[4] = {MakeOperand(lower), MakeOperand(diag), MakeOperand(upper),
                          MakeOperand(rhs)};
  const Operand sep = MakeOperand(xsep);
  void* out = x->untyped_data();
  const bool ok = ForType(x->element_type(), [&](auto zero) {
    using T = decltype(zero);
    T* outs[kReducedRows] = {static_cast<T*>(out)};
    Solve<T>(ops, &sep, outs, g, transposed, pivoting ? kPivoted : kThomas, kChunkSolve,
             periodic);
  });
  return ok ? ffi::Error::Success() : Unsupported();
}

ffi::Error FactorImpl(ffi::AnyBuffer lower, ffi::AnyBuffer diag, ffi::AnyBuffer upper,
                      ffi::Result<ffi::AnyBuffer> l, ffi::Result<ffi::AnyBuffer> m,
                      ffi::Result<ffi::AnyBuffer> c, int64_t lanes, int64_t width) {
  auto dims = l->dimensions();
  const int64_t P = dims[0], N = dims[1], Q = dims[2];
  if (P == 0 || N == 0 || Q == 0) return ffi::Error::Success();
  const Operand ops[3] = {MakeOperand(lower), MakeOperand(diag), MakeOperand(upper)};
  const Geometry g(P, N, Q, 0, lanes, width);
  void* raw[3] = {l->untyped_data(), m->untyped_data(), c->untyped_data()};
  const bool ok = ForType(l->element_type(), [&](auto zero) {
    using T = decltype(zero);
    T* outs[3] = {static_cast<T*>(raw[0]), static_cast<T*>(raw[1]), static_cast<T*>(raw[2])};
    RunTiles<T>(Factor<T>(ops, outs, g), P * N * Q);
  });
  return ok ? ffi::Error::Success() : Unsupported();
}

// g = b_bar and x, both (P, N, Q); three results, each (P, N, Q) when asked for, else of one
// element (not written).
ffi::Error BandCotangentsImpl(ffi::AnyBuffer g, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> lo,
                              ffi::Result<ffi::AnyBuffer> di, ffi::Result<ffi::AnyBuffer> up,
                              bool transposed, bool periodic) {
  auto dims = g.dimensions();
  if (dims.size() != 3 || x.dimensions().size() != 3) {
    return ffi::Error::InvalidArgument("tridiax: expected (P, N, Q)");
  }
  const int64_t P = dims[0], N = dims[1], Q = dims[2];
  for (int k = 0; k < 3; ++k) {
    if (x.dimensions()[k] != dims[k]) {
      return ffi::Error::InvalidArgument("tridiax: b_bar and x differ in shape");
    }
  }
  if (P == 0 || N == 0 || Q == 0) return ffi::Error::Success();
  const int64_t size = P * N * Q;
  ffi::Result<ffi::AnyBuffer>* results[3] = {&lo, &di, &up};
  void* raw[3];
  for (int k = 0; k < 3; ++k) {
    raw[k] = (*results[k])->element_count() == static_cast<size_t>(size)
                 ? (*results[k])->untyped_data()
                 : nullptr;
  }
  const bool ok = ForType(g.element_type(), [&](auto zero) {
    using T = decltype(zero);
    T* outs[3] = {static_cast<T*>(raw[0]), static_cast<T*>(raw[1]), static_cast<T*>(raw[2])};
    RunTiles<T>(BandCotangents<T>(static_cast<const T*>(g.untyped_data()),
                                  static_cast<const T*>(x.untyped_data()), outs, P, N, Q,
                                  transposed, periodic),
                size);
  });
  return ok ? ffi::Error::Success() : Unsupported();
}

bool IsComplex(ffi::DataType t) { return t == ffi::DataType::C64 || t == ffi::DataType::C128; }

ffi::Error RecurrenceImpl(ffi::AnyBuffer a, ffi::AnyBuffer x, ffi::AnyBuffer h0,
                          ffi::AnyBuffer gate, ffi::Result<ffi::AnyBuffer> h, bool reverse,
                          bool shifted, int64_t activation, int64_t gate_slope, bool final_only,
                          int64_t lanes, int64_t width, int64_t chunk) {
  auto dims = h->dimensions();
  if (dims.size() != 3) return ffi::Error::InvalidArgument("tridiax: expected (P, T, Q)");
  const int64_t P = dims[0], Q = dims[2];
  const int64_t T = Rows({&a, &x, &gate});
  if (P == 0 || T == 0 || Q == 0) return ffi::Error::Success();
  if ((activation != kIdentity || gate_slope != kIdentity) && IsComplex(h->element_type())) {
    return ffi::Error::InvalidArgument("tridiax: activations are for real dtypes");
  }
  const Geometry g(P, T, Q, final_only ? 0 : chunk, lanes, width);
  if (h0.dimensions()[1] != g.C) {
    return ffi::Error::InvalidArgument("tridiax: one initial state per chunk expected");
  }
  const Operand ops[4] = {MakeOperand(a), MakeOperand(x), MakeOperand(h0), MakeOperand(gate)};
  void* out = h->untyped_data();
  const bool ok = ForType(h->element_type(), [&](auto zero) {
    using E = decltype(zero);
    E* outs[2] = {static_cast<E*>(out), nullptr};
    RunTiles<E>(Recurrence<E>(ops, outs, g, reverse, shifted, activation, gate_slope, kRun,
                              final_only),
                P * T * Q);
  });
  return ok ? ffi::Error::Success() : Unsupported();
}

ffi::Error RecurrenceEndsImpl(ffi::AnyBuffer a, ffi::AnyBuffer x, ffi::AnyBuffer gate,
                              ffi::Result<ffi::AnyBuffer> decay, ffi::Result<ffi::AnyBuffer> final,
                              bool reverse, bool shifted, int64_t gate_slope, int64_t lanes,
                              int64_t width, int64_t chunk) {
  auto dims = decay->dimensions();
  const int64_t P = dims[0], Q = dims[2];
  const int64_t T = Rows({&a, &x, &gate});
  if (P == 0 || T == 0 || Q == 0) return ffi::Error::Success();
  if (gate_slope != kIdentity && IsComplex(decay->element_type())) {
    return ffi::Error::InvalidArgument("tridiax: activations are for real dtypes");
  }
  const Geometry g(P, T, Q, chunk, lanes, width);
  if (g.C != dims[1]) return ffi::Error::InvalidArgument("tridiax: C outputs expected");
  const Operand ops[4] = {MakeOperand(a), MakeOperand(x), Operand{}, MakeOperand(gate)};
  void* raw[2] = {decay->untyped_data(), final->untyped_data()};
  const bool ok = ForType(decay->element_type(), [&](auto zero) {
    using E = decltype(zero);
    E* outs[2] = {static_cast<E*>(raw[0]), static_cast<E*>(raw[1])};
    RunTiles<E>(Recurrence<E>(ops, outs, g, reverse, shifted, kIdentity, gate_slope,
                              kRecurrenceEnds, false),
                P * T * Q);
  });
  return ok ? ffi::Error::Success() : Unsupported();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxThomasCpu, ThomasImpl,
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxChunkEndsCpu, ChunkEndsImpl,
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
                                  .Attr<int64_t>("chunk"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxChunkSolveCpu, ChunkSolveImpl,
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
                                  .Attr<int64_t>("chunk"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxFactorCpu, FactorImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("lanes")
                                  .Attr<int64_t>("width"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxBandCotangentsCpu, BandCotangentsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("transposed")
                                  .Attr<bool>("periodic"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxRecurrenceCpu, RecurrenceImpl,
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
                                  .Attr<int64_t>("chunk"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxRecurrenceEndsCpu, RecurrenceEndsImpl,
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
                                  .Attr<int64_t>("chunk"));

// Rows of one vector of the contiguous-lane scans for a real element of `itemsize` bytes (0:
// built without them): the planner keeps scanned systems whole (tridiax/_core/planner.py, scanned).
extern "C" int64_t TridiaxScanRows(int64_t itemsize) {
#if defined(TRIDIAX_VECTOR_SCAN)
  if (itemsize == 4) return ScanVector<float>::L;
  if (itemsize == 8) return ScanVector<double>::L;
#endif
  (void)itemsize;
  return 0;
}

// Whether float64 tanh comes from glibc's vector math library (tridiax/_native/library.py
// builds with it where it links).
extern "C" int64_t TridiaxVectorMath() {
#if defined(TRIDIAX_LIBMVEC) && defined(__AVX2__)
  return 1;
#else
  return 0;
#endif
}
