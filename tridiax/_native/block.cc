// tridiax's CPU kernel for block-tridiagonal systems, as an XLA FFI custom call
// (TridiaxBlockCpu): the block Thomas algorithm of tridiax/_block/xla.py, without
// pivoting, with partial pivoting inside each diagonal block, or for Hermitian positive definite
// matrices (no pivoting; a pivot whose real part is not positive makes that system NaN).
//
//   forward, i = 0 .. N-1: S = D[i] - L[i] E[i-1], t = b[i] - L[i] y[i-1] (S = D[0], t = b[0]
//     at i = 0); Gaussian elimination of the k x (k + k + m) matrix [S | U[i] | t], column by
//     column (the pivoted kind first swaps in the first row of largest |S[r, c]|, |Re| + |Im|
//     for complex), then back substitution in the block: [E[i] | y[i]] = S^-1 [U[i] | t];
//   backward: x[N-1] = y[N-1], x[i] = y[i] - E[i] x[i+1].
//
// Operands: lower, diag, upper (P|1, N|1, Q|1, k, k), blocks [row, col] in the last two
// dimensions, a size-1 dimension broadcast (stride 0), never copied; b and x (P, N, Q, k, m).
// lower[0] and upper[N-1] lie outside the matrix and are never read. Transposed (A^T x = b,
// no conjugate): lower'[i] = upper[i-1]^T, diag'[i] = diag[i]^T, upper'[i] = lower[i+1]^T,
// read from the same operands with the block's indices swapped.
//
// Lanes and tiles, as in banded.cc: a *lane* is one system (p, q); a *tile* is W lanes
// solved together, vectorised over lanes, L lanes (one vector register) per *group*. Lanes go
// along Q, or along P for batch-first data (Q == 1). Either way a lane's block is k*k (k*m)
// contiguous values, so chunks of rows are moved into a buffer (blocks' entries by lanes, for
// the whole tile at once: each row of an operand is read in one run) before they are used: by
// 8x8 transposes where a lane's values run on for 8 or more (each lane's rows for batch-first
// data; blocks of k*k a multiple of 8 along Q), by AVX-512 permutes for blocks of fewer than 8
// values along Q, one by one otherwise; the rows ahead are prefetched meanwhile (rather than
// moving each group's rows on its own). E and y of a tile stay in a per-thread
// scratch of N x (k*k + k*m) x W values; x overwrites y in the backward sweep and goes out the
// same way. Tiles along Q are as wide as keep that scratch in half the L2 cache (up to 512
// lanes), so that every row of an operand is read in long runs (short runs cost more per
// value); along P a tile is one vector. For k in
// {1, 2, 3, 4} the block's loops are unrolled at compile time (with one right-hand side the
// augmented matrix lives in registers); other k run the same code with loops at run time.
// Complex systems, and a handful of lanes, run one lane at a time. Tiles are shared out over
// one std::thread per core (RunTiles).

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels.h"
#include "lanes.h"
#include "threads.h"
#include "xla/ffi/api/ffi.h"

namespace tridiax::cpu {
namespace {

constexpr int64_t kBlock = 8;  // rows and lanes of one transpose
constexpr int64_t kRows = 8;   // block rows moved into a chunk buffer at a time (at most)
constexpr int64_t kChunkBytes = 32 << 10;  // a chunk buffer's size along Q (L1)
constexpr int64_t kTileBytes = 128 << 10;  // a chunk buffer's size along P (L2)
constexpr int64_t kAhead = 16;  // rows prefetched ahead of their reads


// f(i) for i in [begin, end): unrolled over [0, N) when N > 0 (then end <= N, and the bounds
// fold away where they are constants after unrolling), a loop otherwise.
template <typename F, int... I>
inline __attribute__((always_inline)) void Unrolled(int begin, int end, F& f,
                                                    std::integer_sequence<int, I...>) {
  ((I >= begin && I < end ? f(I) : void()), ...);
}
template <int N, typename F>
inline __attribute__((always_inline)) void Range(int begin, int end, F&& f) {
  if constexpr (N > 0) {
    Unrolled(begin, end, f, std::make_integer_sequence<int, N>{});
  } else {
    for (int i = begin; i < end; ++i) f(i);
  }
}

// ---------------------------------------------------------------------------------------------
// Moving a tile's blocks between the operands and chunk buffers.

// One operand as a tile sees it: entry e of lane s's block at row pos is
// base[s * lane + pos * row + e], e < E (k*k or k*m). lane 0: one block shared by every lane;
// row 0: one block for every row.
template <typename T>
struct Operand {
  const T* base;
  int64_t lane, row, E;
};

// Blocks of E < 8 values of one vector of contiguous lanes (L lanes: E vectors) to E vectors
// of one entry each (In), and back (Out), with AVX-512's permutes of two vectors: E per vector
// moved (E=4, float32: 0.25 permutes a value, where one by one it is a load and a store).
#if defined(__AVX512F__)
template <int kBytes>
struct SmallVector { using type = __m512; };
template <>
struct SmallVector<8> { using type = __m512d; };

template <typename T>
class Small {
 public:
  static constexpr int L = 64 / static_cast<int>(sizeof(T));
  static constexpr int kMax = 7;  // largest E

  // Lanes [0, w / L * L) of one row: out[e * stride + s] = in[s * E + e], e < E; returns the
  // lanes moved (the rest go value by value).
  static int64_t InRow(const T* in, int E, int64_t w, T* out, int64_t stride) {
    return WithE(E, [&](auto e) { return Row<decltype(e)::value, true>(in, w, out, stride); });
  }
  // The reverse: out[s * E + e] = in[e * stride + s].
  static int64_t OutRow(const T* in, int64_t stride, int E, int64_t w, T* out) {
    return WithE(E, [&](auto e) { return Row<decltype(e)::value, false>(in, w, out, stride); });
  }

 private:
  // E as a compile-time constant (1 .. kMax), so that a block's E vectors stay in registers
  // (with E read at run time GCC moves them through a memcpy call to the stack).
  template <typename F>
  static int64_t WithE(int E, F&& f) {
    switch (E) {
      case 1: return f(std::integral_constant<int, 1>{});
      case 2: return f(std::integral_constant<int, 2>{});
      case 3: return f(std::integral_constant<int, 3>{});
      case 4: return f(std::integral_constant<int, 4>{});
      case 5: return f(std::integral_constant<int, 5>{});
      case 6: return f(std::integral_constant<int, 6>{});
      default: return f(std::integral_constant<int, 7>{});
    }
  }
  // In: packed blocks (src) to rows of one entry each (dst, `stride` apart); Out: back.
  template <int E, bool kIn>
  static int64_t Row(const T* src, int64_t w, T* dst, int64_t stride) {
    const int64_t whole = w / L * L;
    const I* idx = (kIn ? Table().in : Table().out) + Base(E) * L;
    for (int64_t s = 0; s < whole; s += L) {
      Vec v[E], o[E];
      if constexpr (kIn) {
        for (int j = 0; j < E; ++j) v[j] = LoadV(src + s * E + j * L);
      } else {
        for (int e = 0; e < E; ++e) v[e] = LoadV(src + s + e * stride);
      }
      for (int x = 0; x < E; ++x) {
        const I* at = idx + x * E * L;
        o[x] = Permute(LoadI(at), v[0]);
        for (int j = 1; j < E; ++j) o[x] = Permute2(o[x], LoadI(at + j * L), v[j]);
      }
      if constexpr (kIn) {
        for (int e = 0; e < E; ++e) StoreV(dst + s + e * stride, o[e]);
      } else {
        for (int j = 0; j < E; ++j) StoreV(dst + s * E + j * L, o[j]);
      }
    }
    return whole;
  }

  using I = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  using Vec = typename SmallVector<sizeof(T)>::type;
  static Vec LoadV(const T* p) {
    if constexpr (sizeof(T) == 4) {
      return _mm512_loadu_ps(p);
    } else {
      return _mm512_loadu_pd(p);
    }
  }
  static void StoreV(T* p, Vec v) {
    if constexpr (sizeof(T) == 4) {
      _mm512_storeu_ps(p, v);
    } else {
      _mm512_storeu_pd(p, v);
    }
  }
  static __m512i LoadI(const I* p) { return _mm512_load_si512(p); }
  static Vec Permute(__m512i idx, Vec a) {
    if constexpr (sizeof(T) == 4) {
      return _mm512_permutexvar_ps(idx, a);
    } else {
      return _mm512_permutexvar_pd(idx, a);
    }
  }
  // idx < L: a's entry, L + j: b's entry j.
  static Vec Permute2(Vec a, __m512i idx, Vec b) {
    if constexpr (sizeof(T) == 4) {
      return _mm512_permutex2var_ps(a, idx, b);
    } else {
      return _mm512_permutex2var_pd(a, idx, b);
    }
  }
  // E x E index vectors per E, E = 1 .. kMax, one after another.
  static constexpr int Base(int E) { return (E - 1) * E * (2 * E - 1) / 6; }
  static constexpr int kVectors = kMax * (kMax + 1) * (2 * kMax + 1) / 6;  // Base(kMax + 1)
  struct Tables {
    alignas(64) I in[kVectors * L];
    alignas(64) I out[kVectors * L];
  };
  static const Tables& Table() {
    static const Tables tables = [] {
      Tables t{};
      for (int E = 1; E <= kMax; ++E) {
        // In: output e, step j takes the lanes whose entry e lies in input vector j.
        for (int e = 0; e < E; ++e) {
          for (int j = 0; j < E; ++j) {
            I* idx = t.in + (Base(E) + e * E + j) * L;
            for (int s = 0; s < L; ++s) {
              const int f = s * E + e;
              idx[s] = f / L == j ? (j ? L : 0) + f % L : s;
            }
          }
        }
        // Out: output vector j, step e takes its values f with f % E == e.
        for (int j = 0; j < E; ++j) {
          for (int e = 0; e < E; ++e) {
            I* idx = t.out + (Base(E) + j * E + e) * L;
            for (int s = 0; s < L; ++s) {
              const int f = j * L + s;
              idx[s] = f % E == e ? (e ? L : 0) + f / E : s;
            }
          }
        }
      }
      return t;
    }();
    return tables;
  }
};
#endif

// Whether Small moves blocks of E values of T (else 0).
template <typename T>
constexpr int SmallLanes(int64_t E) {
#if defined(__AVX512F__)
  if constexpr (std::is_floating_point_v<T>) {
    return E >= 1 && E <= Small<T>::kMax ? Small<T>::L : 0;
  }
#endif
  (void)E;
  return 0;
}

// Rows [pos, pos + rows) of lanes [0, W) into buf: entry e of row r at buf[(r * E + e) * W + s]
// (lanes past w repeat lane 0, so that every lane computes with numbers). By 8x8 transposes
// where lanes run on for 8 values: a lane's rows (row == E, each lane's run read in turn, the
// same rows of the `next` lanes after the tile prefetched meanwhile) or its block (lane == E,
// E a multiple of 8); by Small's permutes for contiguous blocks of fewer values; value by
// value otherwise.
template <typename T>
void Gather(const Operand<T>& op, int64_t pos, int64_t rows, int64_t w, int64_t W,
            int64_t next, T* buf) {
  const int64_t E = op.E;
  const T* base = op.base + pos * op.row;
  const int64_t whole = op.lane == 0 ? 0 : w / kBlock * kBlock;  // lanes moved by transposes
  if (op.row == E && E > 0) {
    const int64_t F = rows * E;
    constexpr int64_t kLine = 64 / sizeof(T);
    int64_t f0 = 0;
    for (; f0 + kBlock <= F; f0 += kBlock) {
      if (op.lane != 0 && f0 % kLine == 0) {
        for (int64_t s = 0; s < next; ++s) __builtin_prefetch(base + (W + s) * op.lane + f0, 0, 1);
      }
      for (int64_t s0 = 0; s0 < whole; s0 += kBlock) {
        Transpose8(base + s0 * op.lane + f0, op.lane, buf + f0 * W + s0, W);
      }
      for (int64_t f = f0; f < f0 + kBlock; ++f) {
        for (int64_t s = whole; s < W; ++s) buf[f * W + s] = base[(s < w ? s : 0) * op.lane + f];
      }
    }
    for (int64_t f = f0; f < F; ++f) {
      for (int64_t s = 0; s < W; ++s) buf[f * W + s] = base[(s < w ? s : 0) * op.lane + f];
    }
    return;
  }
  const bool blocks = op.lane == E && E % kBlock == 0;
  const int64_t small = op.lane == E ? SmallLanes<T>(E) : 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = base + r * op.row;
    T* out = buf + r * E * W;
    int64_t s1 = 0;
    if (blocks) {
      for (int64_t e0 = 0; e0 < E; e0 += kBlock) {
        for (int64_t s0 = 0; s0 < whole; s0 += kBlock) {
          Transpose8(in + s0 * E + e0, E, out + e0 * W + s0, W);
        }
      }
      s1 = whole;
    }
#if defined(__AVX512F__)
    if constexpr (SmallLanes<T>(1) > 0) {
      if (small && s1 == 0) s1 = Small<T>::InRow(in, static_cast<int>(E), w, out, W);
    }
#endif
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t s = s1; s < W; ++s) out[e * W + s] = in[(s < w ? s : 0) * op.lane + e];
    }
  }
}

// The reverse of Gather for lanes [0, w): buf's rows [0, rows) to x.
template <typename T>
void Scatter(const T* buf, int64_t rows, int64_t w, int64_t W, T* base, int64_t lane,
             int64_t row, int64_t E) {
  const int64_t whole = w / kBlock * kBlock;
  if (row == E) {
    const int64_t F = rows * E;
    int64_t f0 = 0;
    for (; f0 + kBlock <= F; f0 += kBlock) {
      for (int64_t s0 = 0; s0 < whole; s0 += kBlock) {
        Transpose8(buf + f0 * W + s0, W, base + s0 * lane + f0, lane);
      }
      for (int64_t f = f0; f < f0 + kBlock; ++f) {
        for (int64_t s = whole; s < w; ++s) base[s * lane + f] = buf[f * W + s];
      }
    }
    for (int64_t f = f0; f < F; ++f) {
      for (int64_t s = 0; s < w; ++s) base[s * lane + f] = buf[f * W + s];
    }
    return;
  }
  const bool blocks = lane == E && E % kBlock == 0;
  const int64_t small = lane == E ? SmallLanes<T>(E) : 0;
  for (int64_t r = 0; r < rows; ++r) {
    T* out = base + r * row;
    const T* in = buf + r * E * W;
    int64_t s1 = 0;
    if (blocks) {
      for (int64_t e0 = 0; e0 < E; e0 += kBlock) {
        for (int64_t s0 = 0; s0 < whole; s0 += kBlock) {
          Transpose8(in + e0 * W + s0, W, out + s0 * E + e0, E);
        }
      }
      s1 = whole;
    }
#if defined(__AVX512F__)
    if constexpr (SmallLanes<T>(1) > 0) {
      if (small && s1 == 0) s1 = Small<T>::OutRow(in, W, static_cast<int>(E), w, out);
    }
#endif
    for (int64_t s = s1; s < w; ++s) {
      for (int64_t e = 0; e < E; ++e) out[s * lane + e] = in[e * W + s];
    }
  }
}

// Prefetch rows [pos, pos + rows) of lanes [s0, s0 + w) of an operand read (or x written) in
// place: its rows are far apart (along Q) or its lanes are (along P), streams the hardware
// does not follow. Into the outer caches for reads, as banded.cc explains.
template <typename T>
void Prefetch(const T* base, int64_t lane, int64_t row, int64_t E, int64_t pos, int64_t rows,
              int64_t s0, int64_t w, bool write) {
  if (lane == 0 || row == 0 || rows <= 0 || w <= 0) return;
  auto range = [&](const T* at, int64_t n) {
    const char* c = reinterpret_cast<const char*>(at);
    const int64_t bytes = n * static_cast<int64_t>(sizeof(T));
    for (int64_t b = 0; b < bytes; b += 64) {
      if (write) {
        __builtin_prefetch(c + b, 1, 3);
      } else {
        __builtin_prefetch(c + b, 0, 1);
      }
    }
    if (write) {
      __builtin_prefetch(c + bytes - 1, 1, 3);
    } else {
      __builtin_prefetch(c + bytes - 1, 0, 1);
    }
  };
  if (row == E) {  // each lane's rows contiguous
    for (int64_t s = s0; s < s0 + w; ++s) range(base + s * lane + pos * row, rows * E);
  } else if (lane == E) {  // each row's lanes contiguous
    for (int64_t r = pos; r < pos + rows; ++r) range(base + r * row + s0 * E, w * E);
  }
}

// ---------------------------------------------------------------------------------------------
// The problem and its tiles.

enum Kind : int64_t { kPlain = 0, kPivoted = 1, kHermitian = 2 };

struct Strides {
  int64_t p, n, q;  // element strides of a block operand along P, N, Q (0 where broadcast)
};

struct Problem {
  int64_t P, N, Q, K, M;
  bool transposed, hermitian;
  const void* lower;
  const void* diag;
  const void* upper;
  const void* b;
  void* x;
  Strides sl, sd, su;
  bool lanes_p;  // lanes along P (else along Q)
  int64_t W;     // lanes per tile (a multiple of the group width)
};

// KF, MF > 0: k and m as template arguments (the block's loops unroll; with both fixed the
// augmented matrix is a local array, registers); -1: read at run time, the matrix in the scratch.
template <typename T, class O, int KF, int MF, bool PIV>
class Block {
  using V = typename O::V;
  using Bits = typename O::Bits;
  static constexpr int L = O::L;
  static constexpr bool kLocal = KF > 0 && MF > 0;
  static constexpr int kC = kLocal ? 2 * KF + MF : -1;  // columns of the augmented matrix

 public:
  explicit Block(const Problem& pr) : pr_(pr) {
    const int64_t lanes = pr.lanes_p ? pr.P : pr.Q;
    blocks_ = (lanes + pr.W - 1) / pr.W;
    groups_ = pr.W / L;
    // Rows per chunk of the tile: lanes along P (one group a tile), as many as a core's cache
    // holds (up to all N), so that each lane's rows are read in long runs; along Q, where a
    // row's groups lie one after another, up to kRows as the L1 cache holds.
    const int64_t row_bytes = pr.K * (3 * pr.K + pr.M) * pr.W * static_cast<int64_t>(sizeof(T));
    rows_ = pr.lanes_p ? std::clamp<int64_t>(kTileBytes / row_bytes, kRows, pr.N)
                       : std::clamp<int64_t>(kChunkBytes / row_bytes, 1, kRows);
    rs_ = pr.transposed ? pr.W : pr.K * pr.W;
    cs_ = pr.transposed ? pr.K * pr.W : pr.W;
  }

  int64_t tiles() const { return blocks_ * (pr_.lanes_p ? pr_.Q : pr_.P); }

  // Per thread: the augmented matrix and pivot masks of one group (V values), E and y of the
  // tile (N x k*k, N x k*m, group by group), and a chunk of rows_ rows of each operand for the
  // tile's W lanes.
  int64_t scratch_size() const {
    const int64_t k = K(), m = M(), W = pr_.W;
    return (k * (2 * k + m) + k) * L + pr_.N * (k * k + k * m) * W +
           rows_ * (3 * k * k + k * m) * W;
  }

  void Run(int64_t begin, int64_t end, T* scratch) const {
    for (int64_t t = begin; t < end; ++t) SolveTile(t, t + 1 < end, scratch);
  }

 private:
  int K() const {
    if constexpr (KF > 0) return KF;
    return static_cast<int>(pr_.K);
  }
  int M() const {
    if constexpr (MF > 0) return MF;
    return static_cast<int>(pr_.M);
  }

  // One block row of one group: lo, di, up, bb point at the row's chunk entries (entry e at
  // e * L), Ep, Yp at E[i-1], y[i-1] and Ei, Yi at E[i], y[i] in the scratch. Entry (r, c) of
  // lower', diag', upper' at r * rs_ + c * cs_ (swapped strides read the blocks transposed).
  // `a`: the k x (2k + m) augmented matrix; `win`: k pivot masks. The sums of products are
  // formed before they are subtracted, as in the XLA formulation (the same rounding).
  inline __attribute__((always_inline)) void Step(bool first, bool last, const T* lo,
                                                  const T* di, const T* up, const T* bb,
                                                  const T* Ep, const T* Yp, T* Ei, T* Yi, V* a,
                                                  Bits* win) const {
    const int k = K(), m = M(), C = 2 * k + m;
    const int64_t rs = rs_, cs = cs_;
    auto at = [&](int r, int c) { return r * rs + c * cs; };
    // S = D - L E[i-1], [U | t = b - L y[i-1]]; U is not read in the last row.
    Range<KF>(0, k, [&](int r) __attribute__((always_inline)) {
      Range<KF>(0, k, [&](int c) __attribute__((always_inline)) {
        V s = O::Load(di + at(r, c));
        if (!first) {
          V sum = O::Load(lo + at(r, 0)) * O::Load(Ep + c * L);
          Range<KF>(1, k, [&](int j) __attribute__((always_inline)) {
            sum += O::Load(lo + at(r, j)) * O::Load(Ep + (j * k + c) * L);
          });
          s -= sum;
        }
        a[r * C + c] = s;
        a[r * C + k + c] = last ? O::Zero() : O::Load(up + at(r, c));
      });
      Range<MF>(0, m, [&](int c) __attribute__((always_inline)) {
        V s = O::Load(bb + (r * m + c) * pr_.W);
        if (!first) {
          V sum = O::Load(lo + at(r, 0)) * O::Load(Yp + c * L);
          Range<KF>(1, k, [&](int j) __attribute__((always_inline)) {
            sum += O::Load(lo + at(r, j)) * O::Load(Yp + (j * m + c) * L);
          });
          s -= sum;
        }
        a[r * C + 2 * k + c] = s;
      });
    });
    // Elimination, column by column; 1/pivot takes the pivot's place.
    Range<KF>(0, k, [&](int c) __attribute__((always_inline)) {
      if constexpr (PIV) {
        // The first row of largest magnitude (argmax): win[r] where row r beats rows c..r-1,
        // kept only where no later row wins; then row c and that row trade places.
        if (c + 1 < k) {
          auto best = O::Abs(a[c * C + c]);
          Range<KF>(c + 1, k, [&](int r) __attribute__((always_inline)) {
            const auto mag = O::Abs(a[r * C + c]);
            win[r] = O::Greater(mag, best);
            best = O::Select(win[r], mag, best);
          });
          Bits later = win[k - 1];
          Range<KF>(c + 1, k - 1, [&](int n) __attribute__((always_inline)) {
            const int r = k - 1 + c - n;  // k - 2 down to c + 1
            const Bits mine = win[r];
            win[r] = O::AndNot(mine, later);
            later = O::Or(later, mine);
          });
          Range<KF>(c + 1, k, [&](int r) __attribute__((always_inline)) {
            const Bits s = win[r];
            Range<kC>(c, C, [&](int j) __attribute__((always_inline)) {
              const V x = a[c * C + j], y = a[r * C + j];
              a[c * C + j] = O::Select(s, y, x);
              a[r * C + j] = O::Select(s, x, y);
            });
          });
        }
      }
      V pivot = a[c * C + c];
      if (pr_.hermitian) pivot = O::Positive(pivot);
      const V inverse = O::One() / pivot;
      a[c * C + c] = inverse;
      Range<KF>(c + 1, k, [&](int r) __attribute__((always_inline)) {
        const V f = a[r * C + c] * inverse;
        Range<kC>(c + 1, C, [&](int j) __attribute__((always_inline)) {
          a[r * C + j] -= f * a[c * C + j];
        });
      });
    });
    // Back substitution of the right-hand columns, from the last row up.
    Range<KF>(0, k, [&](int rr) __attribute__((always_inline)) {
      const int c = k - 1 - rr;
      Range<kC>(k, C, [&](int j) __attribute__((always_inline)) {
        V v = a[c * C + j];
        Range<KF>(c + 1, k, [&](int r) __attribute__((always_inline)) {
          v -= a[c * C + r] * a[r * C + j];
        });
        a[c * C + j] = v * a[c * C + c];
      });
    });
    Range<KF>(0, k, [&](int r) __attribute__((always_inline)) {
      if (!last) {
        Range<KF>(0, k, [&](int c) __attribute__((always_inline)) {
          O::Store(Ei + (r * k + c) * L, a[r * C + k + c]);
        });
      }
      Range<MF>(0, m, [&](int c) __attribute__((always_inline)) {
        O::Store(Yi + (r * m + c) * L, a[r * C + 2 * k + c]);
      });
    });
  }

  // The forward sweep of a tile: chunks of rows_ rows; each chunk's rows of every operand are
  // moved into the chunk buffers for all the tile's lanes at once (entry e of row r at
  // (r * E + e) * W + lane: a row of contiguous blocks is read in one run), then solved group
  // by group. ops: lower', diag', upper' (their sources), b; shift: the row of the source that
  // row i of lower' and upper' read (-1, +1 transposed); x: prefetched to be written.
  void Forward(int64_t w, int64_t next, const Operand<T>* ops, const int64_t* shift,
               const Operand<T>& x, T* E, T* Y, T* chunk, V* aug, Bits* masks) const {
    const int k = K(), m = M(), kk = k * k, km = k * m;
    const int64_t N = pr_.N, W = pr_.W, G = (w + L - 1) / L, Gs = groups_;
    const int64_t chunk_rows = rows_;
    T* bufs[4];
    int64_t rs[4];
    for (int o = 0, at = 0; o < 4; ++o) {
      bufs[o] = chunk + at * chunk_rows * W;
      at += ops[o].E;
      rs[o] = ops[o].row == 0 ? 0 : ops[o].E * W;  // 0: one block for every row
    }
    V local[kLocal ? KF * (2 * KF + MF) : 1];
    Bits local_masks[KF > 0 ? KF : 1];
    V* a = kLocal ? local : aug;
    Bits* win = KF > 0 ? local_masks : masks;
    // Rows of A' at which each operand is read: lower' from row 1, upper' to row N - 2.
    const int64_t first[4] = {1, 0, 0, 0}, end[4] = {N, N, N - 1, N};
    // Lanes along Q: the rows kAhead rows on of every operand (and of x, to be written), for
    // the tile's lanes; past the last row, the first rows of the tile after this one (`next`
    // lanes, W on). (Lanes along P: Gather prefetches the next tile's rows.)
    const bool by_rows = ops[3].lane == ops[3].E && !pr_.lanes_p;
    auto prefetch = [&](int64_t i) {
      int64_t s0 = 0, lanes = w;
      if (i >= N) {
        if (i >= 2 * N || next <= 0) return;
        i -= N;
        s0 = W;
        lanes = next;
      }
      for (int o = 0; o < 4; ++o) {
        if (i >= first[o] && i < end[o]) {
          Prefetch(ops[o].base, ops[o].lane, ops[o].row, ops[o].E, i + shift[o], 1, s0, lanes,
                   false);
        }
      }
      Prefetch(x.base, x.lane, x.row, x.E, i, 1, s0, lanes, true);
    };
    for (int64_t i0 = 0; i0 < N; i0 += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, N - i0);
      if (by_rows) {
        for (int64_t i = i0 + kAhead; i < i0 + kAhead + rows; ++i) prefetch(i);
      }
      for (int o = 0; o < 4; ++o) {
        if (rs[o] == 0) {  // one block for every row: moved once
          if (i0 == 0) Gather(ops[o], 0, 1, w, W, 0, bufs[o]);
          continue;
        }
        const int64_t lo = std::max(i0, first[o]), hi = std::min(i0 + rows, end[o]);
        if (hi > lo) {
          Gather(ops[o], lo + shift[o], hi - lo, w, W, next, bufs[o] + (lo - i0) * rs[o]);
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t jj = 0; jj < rows; ++jj) {
          const int64_t i = i0 + jj, prev = i > 0 ? i - 1 : 0;
          Step(i == 0, i == N - 1, bufs[0] + jj * rs[0] + g * L, bufs[1] + jj * rs[1] + g * L,
               bufs[2] + jj * rs[2] + g * L, bufs[3] + jj * rs[3] + g * L,
               E + (prev * Gs + g) * kk * L, Y + (prev * Gs + g) * km * L,
               E + (i * Gs + g) * kk * L, Y + (i * Gs + g) * km * L, a, win);
        }
      }
    }
  }

  // x[i] = y[i] - E[i] x[i+1], from the second last row up, in place of y.
  void Backward(int64_t w, const T* E, T* Y) const {
    const int k = K(), m = M(), kk = k * k, km = k * m;
    const int64_t N = pr_.N, G = (w + L - 1) / L, Gs = groups_;
    for (int64_t i = N - 2; i >= 0; --i) {
      for (int64_t g = 0; g < G; ++g) {
        const T* e = E + (i * Gs + g) * kk * L;
        T* y = Y + (i * Gs + g) * km * L;
        const T* x = y + Gs * km * L;
        Range<KF>(0, k, [&](int r) __attribute__((always_inline)) {
          Range<MF>(0, m, [&](int c) __attribute__((always_inline)) {
            V sum = O::Load(e + r * k * L) * O::Load(x + c * L);
            Range<KF>(1, k, [&](int j) __attribute__((always_inline)) {
              sum += O::Load(e + (r * k + j) * L) * O::Load(x + (j * m + c) * L);
            });
            O::Store(y + (r * m + c) * L, O::Load(y + (r * m + c) * L) - sum);
          });
        });
      }
    }
  }

  void SolveTile(int64_t t, bool more, T* scratch) const {
    const int64_t P = pr_.P, N = pr_.N, Q = pr_.Q, W = pr_.W;
    const int k = K(), m = M();
    const int64_t kk = k * k, km = k * m;
    int64_t p, q, w, next;
    if (pr_.lanes_p) {
      q = t / blocks_;
      p = (t % blocks_) * W;
      w = std::min(W, P - p);
      next = std::min(W, P - p - w);
    } else {
      p = t / blocks_;
      q = (t % blocks_) * W;
      w = std::min(W, Q - q);
      next = std::min(W, Q - q - w);
    }
    if (!more) next = 0;
    V* aug = reinterpret_cast<V*>(scratch);
    auto* masks = reinterpret_cast<Bits*>(aug + k * (2 * k + m));
    static_assert(sizeof(Bits) <= sizeof(V), "mask scratch");
    T* E = scratch + (k * (2 * k + m) + k) * L;
    T* Y = E + N * kk * W;
    T* chunk = Y + N * km * W;
    auto block = [&](const void* data, const Strides& s) {
      const T* base = static_cast<const T*>(data) + p * s.p + q * s.q;
      return Operand<T>{base, pr_.lanes_p ? s.p : s.q, s.n, kk};
    };
    const Operand<T> lower = block(pr_.lower, pr_.sl), diag = block(pr_.diag, pr_.sd),
                     upper = block(pr_.upper, pr_.su);
    const int64_t bb = (p * N * Q + q) * km, blane = pr_.lanes_p ? N * Q * km : km;
    const Operand<T> b{static_cast<const T*>(pr_.b) + bb, blane, Q * km, km};
    T* out = static_cast<T*>(pr_.x) + bb;
    const Operand<T> x{out, blane, Q * km, km};
    const bool tr = pr_.transposed;
    const Operand<T> ops[4] = {tr ? upper : lower, diag, tr ? lower : upper, b};
    const int64_t shift[4] = {tr ? -1 : 0, 0, tr ? 1 : 0, 0};
    Forward(w, next, ops, shift, x, E, Y, chunk, aug, masks);
    Backward(w, E, Y);
    if (groups_ == 1) {
      Scatter(Y, N, w, L, out, blane, Q * km, km);
    } else {  // row by row, group by group
      for (int64_t i = 0; i < N; ++i) {
        for (int64_t s0 = 0; s0 < w; s0 += L) {
          Scatter(Y + (i * groups_ + s0 / L) * km * L, 1, std::min<int64_t>(L, w - s0), L,
                  out + i * Q * km + s0 * blane, blane, Q * km, km);
        }
      }
    }
  }

  Problem pr_;
  int64_t blocks_, groups_, rows_;
  int64_t rs_, cs_;  // strides of a block's rows and columns in a chunk (swapped: transposed)
};

template <typename T, class O, int KF, int MF, bool PIV>
void Launch(const Problem& pr) {
  RunTiles<T>(Block<T, O, KF, MF, PIV>(pr), pr.P * pr.N * pr.Q * pr.K * (3 * pr.K + pr.M));
}

// k as a template argument for k in {1, 2, 3, 4}, and m too where it is 1.
template <typename T, class O, bool PIV, int KF>
void WithM(const Problem& pr) {
  if (pr.M == 1) return Launch<T, O, KF, 1, PIV>(pr);
  Launch<T, O, KF, -1, PIV>(pr);
}

template <typename T, class O, bool PIV>
void Dispatch(const Problem& pr) {
  switch (pr.K) {
    case 1: return WithM<T, O, PIV, 1>(pr);
    case 2: return WithM<T, O, PIV, 2>(pr);
    case 3: return WithM<T, O, PIV, 3>(pr);
    case 4: return WithM<T, O, PIV, 4>(pr);
    default: return Launch<T, O, -1, -1, PIV>(pr);
  }
}

// Choose the lanes and the tile width, then the kernel. `cache`: the bytes of a core's cache
// that a tile's E and y should fit in (the planner's cpu_cache_bytes, half the L2).
template <typename T>
void Solve(Problem pr, bool pivoting, int64_t cache) {
  constexpr bool real = std::is_floating_point_v<T>;
  const bool lanes_p = pr.Q == 1 || (pr.Q < 8 && pr.P > pr.Q);
  const int64_t lanes = lanes_p ? pr.P : pr.Q;
  constexpr int64_t vl = real ? VectorOps<std::conditional_t<real, T, float>>::L : 1;
  const bool vector = real && lanes >= std::max<int64_t>(2, vl / 4);
  pr.lanes_p = lanes_p;
  if (!vector) {  // complex numbers and a handful of lanes: up to 16 lanes, one at a time
    pr.W = std::min<int64_t>(16, lanes);
  } else if (lanes_p) {  // whole transposes of lanes (8), one vector
    pr.W = std::max<int64_t>(vl, kBlock);
  } else {
    // Contiguous lanes: as many as keep E and y in the cache (up to 512), so that each row
    // of an operand is read in long runs; split over the cores where there are few tiles.
    const int64_t unit = std::max<int64_t>(vl, kBlock);
    const int64_t lane_bytes = pr.N * pr.K * (pr.K + pr.M) * static_cast<int64_t>(sizeof(T));
    int64_t W = std::clamp<int64_t>(cache / std::max<int64_t>(1, lane_bytes), unit, 512);
    W = std::min(W, (pr.Q + unit - 1) / unit * unit);
    if (pr.P * ((pr.Q + W - 1) / W) < Cores()) {
      W = std::max(unit, (pr.Q + Cores() - 1) / Cores());
    }
    pr.W = (W + unit - 1) / unit * unit;
  }
  if constexpr (real) {
    if (vector) {
      return pivoting ? Dispatch<T, VectorOps<T>, true>(pr)
                      : Dispatch<T, VectorOps<T>, false>(pr);
    }
  }
  return pivoting ? Launch<T, ScalarOps<T>, -1, -1, true>(pr)
                  : Launch<T, ScalarOps<T>, -1, -1, false>(pr);
}

}  // namespace

ffi::Error BlockImpl(ffi::AnyBuffer lower, ffi::AnyBuffer diag, ffi::AnyBuffer upper,
                     ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> x, int64_t kind,
                     bool transposed, int64_t cache) {
  const auto bd = b.dimensions(), xd = x->dimensions();
  if (bd.size() != 5 || xd.size() != 5) {
    return ffi::Error::InvalidArgument("tridiax: expected b and x of shape (P, N, Q, k, m)");
  }
  const int64_t P = xd[0], N = xd[1], Q = xd[2], K = xd[3], M = xd[4];
  for (int d = 0; d < 5; ++d) {
    if (bd[d] != xd[d]) return ffi::Error::InvalidArgument("tridiax: b and x differ in shape");
  }
  Strides strides[3];
  const ffi::AnyBuffer* blocks[3] = {&lower, &diag, &upper};
  for (int o = 0; o < 3; ++o) {
    const auto d = blocks[o]->dimensions();
    if (d.size() != 5 || (d[0] != 1 && d[0] != P) || (d[1] != 1 && d[1] != N) ||
        (d[2] != 1 && d[2] != Q) || d[3] != K || d[4] != K) {
      return ffi::Error::InvalidArgument(
          "tridiax: block operands must be (P|1, N|1, Q|1, k, k) for b of shape (P, N, Q, k, m)");
    }
    if (blocks[o]->element_type() != x->element_type()) {
      return ffi::Error::InvalidArgument("tridiax: operands and result differ in dtype");
    }
    const int64_t kk = K * K;
    strides[o] = {d[0] > 1 ? d[1] * d[2] * kk : 0, d[1] > 1 ? d[2] * kk : 0, d[2] > 1 ? kk : 0};
  }
  if (b.element_type() != x->element_type()) {
    return ffi::Error::InvalidArgument("tridiax: operands and result differ in dtype");
  }
  if (kind < kPlain || kind > kHermitian) {
    return ffi::Error::InvalidArgument("tridiax: unknown block kind");
  }
  if (P == 0 || N == 0 || Q == 0 || K == 0 || M == 0) return ffi::Error::Success();
  Problem pr{};
  pr.P = P;
  pr.N = N;
  pr.Q = Q;
  pr.K = K;
  pr.M = M;
  pr.transposed = transposed;
  pr.hermitian = kind == kHermitian;
  pr.lower = lower.untyped_data();
  pr.diag = diag.untyped_data();
  pr.upper = upper.untyped_data();
  pr.b = b.untyped_data();
  pr.x = x->untyped_data();
  pr.sl = strides[0];
  pr.sd = strides[1];
  pr.su = strides[2];
  const bool pivoting = kind == kPivoted;
  switch (x->element_type()) {
    case ffi::DataType::F32: Solve<float>(pr, pivoting, cache); break;
    case ffi::DataType::F64: Solve<double>(pr, pivoting, cache); break;
    case ffi::DataType::C64: Solve<std::complex<float>>(pr, pivoting, cache); break;
    case ffi::DataType::C128: Solve<std::complex<double>>(pr, pivoting, cache); break;
    default: return ffi::Error::InvalidArgument("tridiax: unsupported dtype");
  }
  return ffi::Error::Success();
}

}  // namespace tridiax::cpu
