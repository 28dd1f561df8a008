// tridiax's CPU kernel for banded systems, as an XLA FFI custom call (TridiaxBandedCpu): banded
// Gaussian elimination without pivoting, with partial pivoting (row interchanges, LAPACK's
// gbtrf pivot choice) or for Hermitian positive definite matrices (no pivoting; a pivot whose
// real part is not positive makes that system NaN). Step for step the algorithm of
// tridiax/_banded/xla.py, whose docstring states it: a window of lo + 1 rows of
// lo + up + 1 columns walks down each system, row 0 of the window becomes row j of U (1/pivot
// in place of the pivot), then the back substitution walks up.
//
// Operands: ab (l + u + 1, P|1, N|1, Q|1) in scipy's band layout along axis 2,
// ab[u + i - j, j] = A[i, j]; b (P, N, Q). A size-1 dimension of ab is broadcast (stride 0),
// never copied. Entries of ab outside the matrix are never read.
//
// Lanes and tiles, as in tiles.h: a *lane* is one system (p, q); a *tile* is W lanes
// eliminated together, vectorised over lanes, L lanes (one vector register) per *group*:
//   lanes along Q (Q > 1): the lanes of a row are contiguous, read and written in place, rows
//   prefetched ahead (rows are Q values apart: no hardware prefetcher follows them);
//   lanes along P (Q == 1, batch-first): each lane's rows are contiguous; chunks of 32 rows x W
//   lanes of every band are moved by 8x8 transposes into a buffer (the next tile's rows
//   prefetched meanwhile), and x goes out the same way.
// A tile is one group of real lanes (16 float32 with AVX-512). U's rows and y of a tile stay in
// a per-thread scratch of N x (kept + 1) x W values. Where both bandwidths are at most 2 the
// window's size is a template argument (tri- and pentadiagonal windows; narrower bands run in
// them as zeros that take no part) and the window lives in vector registers; wider bands run
// with the window in the scratch, laid out so that it never moves (StepDynamic). Complex
// systems, and a handful of lanes, run one lane at a time. Tiles are shared out over one
// std::thread per core.

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

constexpr int64_t kBlock = 8;    // rows and lanes of one transpose
constexpr int64_t kChunk = 32;   // rows of strided lanes moved into a buffer at a time
// Rows of lanes read in place are prefetched this many rows ahead of their reads.
constexpr int64_t kAheadRows = 16;


// ---------------------------------------------------------------------------------------------
// Reading and writing the rows of a tile's lanes (as tiles.h's RowReader, StoreRows).

// One operand (a band of ab, or b) as a tile sees it: the element of lane s at row `pos` is
// base[s * lane + pos * row]. lane 1: the lanes are contiguous (read in place); lane 0: one
// value shared by every lane (broadcast); otherwise strided lanes, moved through a buffer.
template <typename T>
struct Operand {
  const T* base;
  int64_t lane, row;
  T At(int64_t s, int64_t pos) const { return base[s * lane + pos * row]; }
};

// Rows [pos, pos + rows) of w strided lanes into `buf` (rows x W, lanes contiguous): by 8x8
// transposes where each lane's rows are contiguous, else element by element. The same rows of
// the `next` lanes after the tile (W lanes on) are prefetched for the tile after this one.
template <typename T>
void Gather(const Operand<T>& op, int64_t pos, int64_t rows, int64_t w, int64_t W, int64_t next,
            T* buf) {
  const T* base = op.base + pos * op.row;
  if (op.row == 1) {
    const int64_t bytes = rows * static_cast<int64_t>(sizeof(T));
    for (int64_t s = 0; s < next; ++s) {
      const char* lane = reinterpret_cast<const char*>(base + (W + s) * op.lane);
      for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(lane + b, 0, 1);
      __builtin_prefetch(lane + bytes - 1, 0, 1);
    }
  }
  int64_t r0 = 0;
  if (op.row == 1) {
    for (; r0 + kBlock <= rows; r0 += kBlock) {
      int64_t s0 = 0;
      for (; s0 + kBlock <= w; s0 += kBlock) {
        Transpose8(base + s0 * op.lane + r0, op.lane, buf + r0 * W + s0, W);
      }
      for (int64_t r = r0; r < r0 + kBlock; ++r) {
        for (int64_t s = s0; s < w; ++s) buf[r * W + s] = base[s * op.lane + r];
      }
    }
  }
  for (int64_t r = r0; r < rows; ++r) {
    for (int64_t s = 0; s < w; ++s) buf[r * W + s] = base[s * op.lane + r * op.row];
  }
}

// Write rows [0, rows) of a (rows x W) scratch to strided lanes (base, lane stride, row stride).
template <typename T>
void StoreRows(T* base, int64_t lane, int64_t row, int64_t w, int64_t W, int64_t rows,
               const T* src) {
  int64_t r0 = 0;
  if (row == 1) {
    for (; r0 + kBlock <= rows; r0 += kBlock) {
      int64_t s0 = 0;
      for (; s0 + kBlock <= w; s0 += kBlock) {
        Transpose8(src + r0 * W + s0, W, base + s0 * lane + r0, lane);
      }
      for (int64_t r = r0; r < r0 + kBlock; ++r) {
        for (int64_t s = s0; s < w; ++s) base[s * lane + r] = src[r * W + s];
      }
    }
  }
  for (int64_t r = r0; r < rows; ++r) {
    for (int64_t s = 0; s < w; ++s) base[s * lane + r * row] = src[r * W + s];
  }
}

// f(i) for i in [0, n): unrolled when N >= 0 (then n == N), a loop otherwise.
template <typename F, int... I>
inline __attribute__((always_inline)) void Unrolled(F& f, std::integer_sequence<int, I...>) {
  (f(I), ...);
}
template <int N, typename F>
inline __attribute__((always_inline)) void Repeat(int n, F&& f) {
  if constexpr (N >= 0) {
    Unrolled(f, std::make_integer_sequence<int, N>{});
  } else {
    for (int i = 0; i < n; ++i) f(i);
  }
}

// ---------------------------------------------------------------------------------------------
// The problem and its tiles.

enum Kind : int64_t { kBanded = 0, kPivoted = 1, kHermitian = 2 };

struct Problem {
  int64_t P, N, Q;
  int64_t l, u, lo, up;  // bandwidths of A, and of the matrix solved (swapped when transposed)
  bool transposed, hermitian;
  const void* ab;
  int64_t ak, ap, an, aq;  // element strides of ab: band, P, N, Q (0 where broadcast)
  const void* b;
  void* x;
  bool lanes_p;  // lanes along P (else along Q)
  int64_t W;     // lanes per tile (a multiple of the group width)
};

// ---------------------------------------------------------------------------------------------
// The elimination. LO, UP >= 0: the solved matrix's bandwidths as template arguments (the
// window's loops unroll, and with one group per tile it lives in registers); -1: read at run
// time from the problem, the window in the scratch.

template <typename T, class O, int LO, int UP, bool PIV>
class Banded {
  using V = typename O::V;
  static constexpr int L = O::L;
  static constexpr bool kFixed = LO >= 0;
  // Compile-time loop counts for Repeat (-1: a run-time loop).
  static constexpr int kLo = kFixed ? LO : -1;
  static constexpr int kR = kFixed ? LO + 1 : -1;
  static constexpr int kWd = kFixed ? LO + UP + 1 : -1;
  static constexpr int kKept = kFixed ? (PIV ? LO + UP + 1 : UP + 1) : -1;

 public:
  explicit Banded(const Problem& pr) : pr_(pr) {
    lo_ = kFixed ? LO : static_cast<int>(pr.lo);
    up_ = kFixed ? UP : static_cast<int>(pr.up);
    rlo_ = static_cast<int>(pr.lo);
    rup_ = static_cast<int>(pr.up);
    K_ = pr.l + pr.u + 1;
    const int64_t lanes = pr.lanes_p ? pr.P : pr.Q;
    blocks_ = (lanes + pr.W - 1) / pr.W;
  }

  int64_t tiles() const { return blocks_ * (pr_.lanes_p ? pr_.Q : pr_.P); }

  // Per thread: the windows of a tile's groups, U's rows and y (N x kept, N x W), and a chunk
  // of kChunk rows x W of each window column and b for strided lanes.
  int64_t scratch_size() const {
    const int64_t W = pr_.W, R = Lo() + 1, Wd = Width();
    return State() + pr_.N * (Kept() + 1) * W + (Wd + 1) * kChunk * W + (R + 1) * L + W;
  }

  void Run(int64_t begin, int64_t end, T* scratch) const {
    for (int64_t t = begin; t < end; ++t) SolveTile(t, t + 1 < end, scratch);
  }

 private:
  int Lo() const {
    if constexpr (kFixed) return LO;
    return lo_;
  }
  int Up() const {
    if constexpr (kFixed) return UP;
    return up_;
  }
  int Width() const { return Lo() + Up() + 1; }
  int Kept() const { return PIV ? Width() : Up() + 1; }
  // V values of one group's window and right-hand sides: R x Wd for fixed bandwidths; R rows
  // of Slots() for run-time ones (StepDynamic).
  int64_t Slots() const { return Lo() + Width(); }
  int64_t Stride() const {
    const int64_t R = Lo() + 1;
    return R * (kFixed ? Width() : Slots()) + R;
  }
  int64_t State() const { return (pr_.W / L) * Stride() * L; }

  // Band of ab holding A'[i, i + d] (A' the matrix solved), and its index along N.
  int64_t Band(int d) const { return pr_.transposed ? pr_.u + d : pr_.u - d; }
  int64_t Pos(int64_t i, int d) const { return pr_.transposed ? i : i + d; }

  // Lanes g*L .. g*L + n - 1 of an operand at row pos.
  static V Value(const Operand<T>& op, int64_t g, int n, int64_t pos) {
    if (op.lane == 1) return O::Load(op.base + g * L + pos * op.row, n);
    if (op.lane == 0) return O::Splat(op.base[pos * op.row]);
    V v = O::Zero();
    if constexpr (L == 1) {
      v = op.At(g, pos);
    } else {
      for (int s = 0; s < n; ++s) v[s] = op.At(g * L + s, pos);
    }
    return v;
  }

  // Elimination step j of one group: pivot (PIV), U's row j and y[j] into urow (kept rows W
  // apart) and yrow, eliminate, shift the window up and left, and take in the incoming row
  // `in` (Wd entries and its right-hand side).
  // Loops over the window run through Repeat: unrolled when the bandwidths are fixed.
  inline __attribute__((always_inline)) void Step(V* __restrict__ w, V* __restrict__ v,
                                                  const V* in, T* urow, T* yrow,
                                                  typename O::Bits* masks) const {
    using Bits = typename O::Bits;
    const int lo = Lo(), Wd = Width(), kept = Kept(), W = static_cast<int>(pr_.W);
    // A window wider than the matrix's band (rows past rlo_, columns past rlo_ + rup_) holds
    // zeros that take no part: the same operations as a window of the band's own size, to the
    // last NaN of a breakdown.
    const int rlo = rlo_, last = rlo_ + rup_;
    if constexpr (PIV) {
      if (lo > 0 && rlo > 0) {
        // The first row of largest magnitude (argmax): win[r] where row r beats rows 0..r-1,
        // kept only where no later row wins; then row 0 and that row trade places.
        Bits local[kFixed ? LO + 1 : 1];
        Bits* win = kFixed ? local : masks;
        auto best = O::Abs(w[0]);
        Repeat<kLo>(lo, [&](int k) __attribute__((always_inline)) {
          const int r = k + 1;
          if (r > rlo) return;
          const auto m = O::Abs(w[r * Wd]);
          win[r] = O::Greater(m, best);
          best = O::Select(win[r], m, best);
        });
        Bits later = win[rlo];
        Repeat<kLo - 1>(lo - 1, [&](int k) __attribute__((always_inline)) {
          const int r = lo - 1 - k;
          if (r >= rlo) return;
          const Bits mine = win[r];
          win[r] = O::AndNot(mine, later);
          later = O::Or(later, mine);
        });
        Repeat<kLo>(lo, [&](int k) __attribute__((always_inline)) {
          const int r = k + 1;
          if (r > rlo) return;
          const Bits s = win[r];
          Repeat<kWd>(Wd, [&](int c) __attribute__((always_inline)) {
            const V a = w[c], b = w[r * Wd + c];
            w[c] = O::Select(s, b, a);
            w[r * Wd + c] = O::Select(s, a, b);
          });
          const V a = v[0], b = v[r];
          v[0] = O::Select(s, b, a);
          v[r] = O::Select(s, a, b);
        });
      }
    }
    V pivot = w[0];
    if (pr_.hermitian) pivot = O::Positive(pivot);
    const V inverse = O::One() / pivot;
    O::Store(urow, inverse, L);
    Repeat<kKept - 1>(kept - 1, [&](int k) __attribute__((always_inline)) {
      O::Store(urow + (k + 1) * W, w[k + 1], L);
    });
    O::Store(yrow, v[0], L);
    Repeat<kLo>(lo, [&](int k) __attribute__((always_inline)) {
      const int r = k + 1;
      if (r > rlo) return;
      const V m = w[r * Wd] * inverse;
      Repeat<kWd - 1>(Wd - 1, [&](int c) __attribute__((always_inline)) {
        if (c + 1 <= last) w[r * Wd + c + 1] -= m * w[c + 1];
      });
      v[r] -= m * v[0];
    });
    Repeat<kLo>(lo, [&](int r) __attribute__((always_inline)) {
      Repeat<kWd - 1>(Wd - 1, [&](int c) __attribute__((always_inline)) {
        w[r * Wd + c] = w[(r + 1) * Wd + c + 1];
      });
      w[r * Wd + Wd - 1] = O::Zero();
      v[r] = v[r + 1];
    });
    Repeat<kWd>(Wd, [&](int c) __attribute__((always_inline)) { w[lo * Wd + c] = in[c]; });
    v[lo] = in[Wd];
  }

  inline __attribute__((always_inline)) void Advance(V* wg, int64_t j, const V* in, T* urow,
                                                     T* yrow, typename O::Bits* masks,
                                                     V* multipliers) const {
    if constexpr (kFixed) {
      const int R = Lo() + 1, Wd = Width();
      Step(wg, wg + R * Wd, in, urow, yrow, masks);
    } else {
      StepDynamic(wg, j, in, urow, yrow, masks, multipliers);
    }
  }

  // Step for run-time bandwidths, the window in the scratch laid out so that it never moves:
  // matrix row m in row slot m % R, its column n at n - m + lo (Slots() = lo + Wd of them), so
  // that window entry (r, c) at step j is slot (j + r) % R, lo - r + c. The incoming row takes
  // the slot of row 0; entries past a row's window are zeros until they enter it.
  void StepDynamic(V* st, int64_t j, const V* in, T* urow, T* yrow, typename O::Bits* win,
                   V* multipliers) const {
    using Bits = typename O::Bits;
    const int lo = Lo(), Wd = Width(), R = lo + 1, kept = Kept(), W = static_cast<int>(pr_.W);
    const int S = static_cast<int>(Slots());
    V* vals = st + R * S;
    const int z = static_cast<int>(j % R);
    auto slot = [&](int r) { return z + r < R ? z + r : z + r - R; };
    V* __restrict__ top = st + z * S + lo;  // window row 0, column 0
    V& top_value = vals[z];
    if (PIV && lo > 0) {
      // The first row of largest magnitude in column 0 (win[r]: row r is it), then, column by
      // column, the exchange fused with the elimination: row 0 is retired into U as it is
      // formed, the others become (row r or row 0) - m_r (new row 0).
      auto best = O::Abs(top[0]);
      for (int r = 1; r <= lo; ++r) {
        const auto m = O::Abs(st[slot(r) * S + lo - r]);
        win[r] = O::Greater(m, best);
        best = O::Select(win[r], m, best);
      }
      Bits later = win[lo];
      for (int r = lo - 1; r >= 1; --r) {
        const Bits mine = win[r];
        win[r] = O::AndNot(mine, later);
        later = O::Or(later, mine);
      }
      V* m = multipliers;
      V pivot = top[0], value = top_value;
      for (int r = 1; r <= lo; ++r) {
        pivot = O::Select(win[r], st[slot(r) * S + lo - r], pivot);
        value = O::Select(win[r], vals[slot(r)], value);
      }
      if (pr_.hermitian) pivot = O::Positive(pivot);
      const V inverse = O::One() / pivot;
      O::Store(urow, inverse, L);
      O::Store(yrow, value, L);
      for (int r = 1; r <= lo; ++r) {
        const int k = slot(r);
        m[r] = O::Select(win[r], top[0], st[k * S + lo - r]) * inverse;
        vals[k] = O::Select(win[r], top_value, vals[k]) - m[r] * value;
      }
      for (int c = 1; c < Wd; ++c) {
        const V a = top[c];
        V head = a;
        for (int r = 1; r <= lo; ++r) head = O::Select(win[r], st[slot(r) * S + lo - r + c], head);
        O::Store(urow + c * W, head, L);
        for (int r = 1; r <= lo; ++r) {
          V& e = st[slot(r) * S + lo - r + c];
          e = O::Select(win[r], a, e) - m[r] * head;
        }
      }
    } else {
      V pivot = top[0];
      if (pr_.hermitian) pivot = O::Positive(pivot);
      const V inverse = O::One() / pivot;
      O::Store(urow, inverse, L);
      for (int c = 1; c < kept; ++c) O::Store(urow + c * W, top[c], L);
      O::Store(yrow, top_value, L);
      for (int r = 1; r <= lo; ++r) {
        V* __restrict__ row = st + slot(r) * S + lo - r;
        const V m = row[0] * inverse;
        for (int c = 1; c < Wd; ++c) row[c] -= m * top[c];  // as the XLA formulation: all
        vals[slot(r)] -= m * top_value;
      }
    }
    // The incoming row, matrix row j + lo + 1: its columns j + 1 .. j + Wd in slots 0 .. Wd-1.
    V* row = st + z * S;
    for (int c = 0; c < Wd; ++c) row[c] = in[c];
    for (int c = Wd; c < S; ++c) row[c] = O::Zero();
    top_value = in[Wd];
  }

  // The forward sweep of a tile: groups of L lanes, row by row. kOne: one group, whose window
  // is a local array (registers when the bandwidths are fixed). ops: the K bands, then b;
  // `zeros`: W zeros.
  template <bool kOne>
  void Forward(int64_t w, int64_t next, const Operand<T>* ops, const T* x, const T* zeros,
               V* state, T* U, T* Y, T* chunk, typename O::Bits* masks) const {
    const int lo = Lo(), up = Up(), Wd = Width(), R = lo + 1, kept = Kept();
    const int64_t N = pr_.N, W = pr_.W;
    const int64_t G = kOne ? 1 : (w + L - 1) / L;
    const int64_t stride = Stride();
    constexpr int kLocal = kFixed ? (LO + 1) * (LO + UP + 1) + LO + 1 : 1;
    constexpr int kIn = kFixed ? LO + UP + 2 : 1;
    V local[kLocal];
    V in_local[kIn];
    const T* ptr_local[kIn];
    int64_t rs_local[kIn];
    std::unique_ptr<V[]> in_heap;
    std::unique_ptr<const T*[]> ptr_heap;
    std::unique_ptr<int64_t[]> rs_heap;
    V* in = in_local;
    const T** ptr = ptr_local;
    int64_t* rs = rs_local;
    if constexpr (!kFixed) {
      in_heap.reset(new V[Wd + 1]);
      ptr_heap.reset(new const T*[Wd + 1]);
      rs_heap.reset(new int64_t[Wd + 1]);
      in = in_heap.get();
      ptr = ptr_heap.get();
      rs = rs_heap.get();
    }
    std::unique_ptr<V[]> multipliers(new V[kFixed ? 1 : R]);
    auto window = [&](int64_t g) -> V* {
      if constexpr (kOne && kFixed) return local;
      return state + g * stride;
    };
    auto lanes = [&](int64_t g) { return static_cast<int>(std::min<int64_t>(L, w - g * L)); };
    // Row i of the matrix solved, window column c holding column i - shift + c; entries
    // outside the band or the matrix are zeros, never read.
    auto fetch_any = [&](int64_t i, int shift, int64_t g) __attribute__((always_inline)) {
      const int n = lanes(g);
      Repeat<kWd>(Wd, [&](int c) __attribute__((always_inline)) {
        const int d = c - shift;
        const bool inside = d >= -rlo_ && d <= rup_ && i < N && i + d >= 0 && i + d < N;
        in[c] = inside ? Value(ops[Band(d)], g, n, Pos(i, d)) : O::Zero();
      });
      in[Wd] = i < N ? Value(ops[K_], g, n, i) : O::Zero();
    };
    // Rows 0..lo, row r entering with shift r (its columns from 0).
    Repeat<kR>(R, [&](int r) __attribute__((always_inline)) {
      for (int64_t g = 0; g < G; ++g) {
        V* wg = window(g);
        fetch_any(r, r, g);
        if constexpr (kFixed) {
          Repeat<kWd>(Wd, [&](int c) __attribute__((always_inline)) { wg[r * Wd + c] = in[c]; });
          wg[R * Wd + r] = in[Wd];
        } else {  // row r in slot r, its column c (window column c) at lo - r + c
          V* row = wg + r * Slots();
          std::fill(row, row + Slots(), O::Zero());
          std::copy(in, in + Wd, row + lo - r);
          wg[R * Slots() + r] = in[Wd];
        }
      }
    });
    // Step j takes in row i = j + lo + 1. While all its columns lie inside the matrix, it is
    // read straight: in place (or broadcast), or from a chunk of rows gathered for strided
    // lanes; operand c at step j0 + jj at ptr[c] + jj * rs[c].
    const int64_t interior = std::max<int64_t>(0, N - 1 - rup_ - lo);
    // Lanes read in place: rows far apart, each its own stream, which the hardware does not
    // follow: step j asks for row j + ahead of every band, b and x (to be written), or, past the
    // last row, for the first rows of the next tile (`next` lanes, W on).
    const int64_t ahead = kAheadRows;
    const bool direct = ops[K_].lane == 1 && ops[K_].row != 0;
    const bool direct_ab = ops[0].lane == 1 && ops[0].row != 0;
    auto prefetch = [&](int64_t j) __attribute__((always_inline)) {
      if (!direct) return;
      int64_t r = j + ahead, shift = 0, bytes = w * static_cast<int64_t>(sizeof(T));
      if (r >= N) {
        if (next == 0) return;
        r -= N;
        shift = W;
        bytes = next * static_cast<int64_t>(sizeof(T));
      }
      auto fetch = [&](const T* at, int rw) __attribute__((always_inline)) {
        const char* c = reinterpret_cast<const char*>(at);
        for (int64_t b = 0; b < bytes; b += 64) {
          // Reads into the outer caches (locality 1): prefetches into L1 would fill its few
          // miss buffers with hundreds of streams' lines and stall.
          if (rw) {
            __builtin_prefetch(c + b, 1, 3);
          } else {
            __builtin_prefetch(c + b, 0, 1);
          }
        }
      };
      if (direct_ab) {
        for (int64_t k = 0; k < K_; ++k) fetch(ops[k].base + shift + r * ops[k].row, 0);
      }
      fetch(ops[K_].base + shift + r * ops[K_].row, 0);
      fetch(x + shift + r * ops[K_].row, 1);
    };
    for (int64_t j0 = 0; j0 < interior; j0 += kChunk) {
      const int64_t rows = std::min(kChunk, interior - j0), i0 = j0 + lo + 1;
      for (int c = 0; c <= Wd; ++c) {
        const int d = c - lo;
        if (c < Wd && (d < -rlo_ || d > rup_)) {  // a column past the matrix's band
          ptr[c] = zeros;
          rs[c] = 0;
          continue;
        }
        const Operand<T>& op = c < Wd ? ops[Band(d)] : ops[K_];
        const int64_t pos = c < Wd ? Pos(i0, d) : i0;
        T* buf = chunk + c * kChunk * W;
        if (op.lane == 1) {
          ptr[c] = op.base + pos * op.row;
          rs[c] = op.row;
          continue;
        }
        const int64_t at = op.row == 0 ? 0 : pos, count = op.row == 0 ? 1 : rows;
        if (op.lane == 0) {  // one value for all lanes
          for (int64_t r = 0; r < count; ++r) std::fill(buf + r * W, buf + (r + 1) * W, op.At(0, at + r));
        } else {
          Gather(op, at, count, w, W, op.row == 0 ? 0 : next, buf);
        }
        ptr[c] = buf;
        rs[c] = op.row == 0 ? 0 : W;
      }
      for (int64_t jj = 0; jj < rows; ++jj) {
        const int64_t j = j0 + jj;
        prefetch(j);
        T* urow = U + j * kept * W;
        T* yrow = Y + j * W;
        for (int64_t g = 0; g < G; ++g) {
          const int n = lanes(g);
          Repeat<kWd>(Wd, [&](int c) __attribute__((always_inline)) {
            const T* at = ptr[c] + jj * rs[c];
            in[c] = O::Load(at + g * L, n);
          });
          in[Wd] = O::Load(ptr[Wd] + jj * rs[Wd] + g * L, n);
          Advance(window(g), j, in, urow + g * L, yrow + g * L, masks, multipliers.get());
        }
      }
    }
    for (int64_t j = interior; j < N; ++j) {
      prefetch(j);
      T* urow = U + j * kept * W;
      T* yrow = Y + j * W;
      for (int64_t g = 0; g < G; ++g) {
        fetch_any(j + lo + 1, lo, g);
        Advance(window(g), j, in, urow + g * L, yrow + g * L, masks, multipliers.get());
      }
    }
  }

  // x[j] = (y[j] - sum_c U[j, c] x[j + c]) / pivot_j, from the last row up; x rows `xrow`
  // apart from `X`, lanes contiguous (w valid), or in place of y.
  void Backward(int64_t w, const T* U, T* Y, T* X, int64_t xrow) const {
    const int kept = Kept(), used = PIV ? rlo_ + rup_ + 1 : rup_ + 1;  // U's columns, the band's
    const int64_t N = pr_.N, W = pr_.W, G = (w + L - 1) / L;
    for (int64_t j = N - 1; j >= 0; --j) {
      const T* urow = U + j * kept * W;
      const int top = static_cast<int>(std::min<int64_t>(used - 1, N - 1 - j));
      for (int64_t g = 0; g < G; ++g) {
        const int n = static_cast<int>(std::min<int64_t>(L, w - g * L));
        V acc = O::Load(Y + j * W + g * L, L);
        for (int c = 1; c <= top; ++c) {
          acc -= O::Load(urow + c * W + g * L, L) * O::Load(X + (j + c) * xrow + g * L, n);
        }
        O::Store(X + j * xrow + g * L, acc * O::Load(urow + g * L, L), n);
      }
    }
  }

  void SolveTile(int64_t t, bool more, T* scratch) const {
    const int64_t P = pr_.P, N = pr_.N, Q = pr_.Q, W = pr_.W;
    int64_t p, q, w, lane_a, lane_b, next;
    if (pr_.lanes_p) {
      q = t / blocks_;
      p = (t % blocks_) * W;
      w = std::min(W, P - p);
      lane_a = pr_.ap;
      lane_b = N * Q;
      next = std::min(W, P - p - w);
    } else {
      p = t / blocks_;
      q = (t % blocks_) * W;
      w = std::min(W, Q - q);
      lane_a = pr_.aq;
      lane_b = 1;
      next = std::min(W, Q - q - w);
    }
    if (!more) next = 0;
    const int Wd = Width(), R = Lo() + 1;
    V* state = reinterpret_cast<V*>(scratch);
    T* U = scratch + State();
    T* Y = U + N * Kept() * W;
    T* chunk = Y + N * W;
    T* zeros = chunk + (Wd + 1) * kChunk * W;
    auto* masks = reinterpret_cast<typename O::Bits*>(zeros + W);
    static_assert(sizeof(typename O::Bits) <= sizeof(V), "mask scratch");
    (void)R;
    // Operands: ab's bands, then b.
    constexpr int kOps = kFixed ? LO + UP + 2 : 1;
    Operand<T> ops_local[kOps];
    std::unique_ptr<Operand<T>[]> ops_heap;
    Operand<T>* ops = ops_local;
    if (!kFixed || K_ + 1 > kOps) {
      ops_heap.reset(new Operand<T>[K_ + 1]);
      ops = ops_heap.get();
    }
    const T* ab = static_cast<const T*>(pr_.ab) + p * pr_.ap + q * pr_.aq;
    for (int64_t k = 0; k < K_; ++k) ops[k] = {ab + k * pr_.ak, lane_a, pr_.an};
    const int64_t base = p * N * Q + q;
    ops[K_] = {static_cast<const T*>(pr_.b) + base, lane_b, Q};
    std::fill(zeros, zeros + W, T(0));
    T* out = static_cast<T*>(pr_.x) + base;
    if constexpr (kFixed) {  // one group per tile
      Forward<true>(w, next, ops, out, zeros, state, U, Y, chunk, masks);
    } else if (w <= L) {
      Forward<true>(w, next, ops, out, zeros, state, U, Y, chunk, masks);
    } else {
      Forward<false>(w, next, ops, out, zeros, state, U, Y, chunk, masks);
    }
    if (lane_b == 1) {
      Backward(w, U, Y, out, Q);
    } else {
      Backward(w, U, Y, Y, W);
      StoreRows(out, lane_b, Q, w, W, N, Y);
    }
  }

  Problem pr_;
  int lo_, up_;    // the window's bandwidths (fixed ones may exceed the matrix's)
  int rlo_, rup_;  // the matrix's
  int64_t K_, blocks_;
};

template <typename T, class O, int LO, int UP, bool PIV>
void Launch(const Problem& pr) {
  RunTiles<T>(Banded<T, O, LO, UP, PIV>(pr), pr.P * pr.N * pr.Q * (pr.l + pr.u + 2));
}

// The window's bandwidths as template arguments where both are at most 2 (tri- and
// pentadiagonal, and narrower, matrices): a band narrower than the window's runs in it as
// zeros, which change no rounding. Wider bands run with the window's size read at run time.
int Capacity(int64_t bandwidth) { return bandwidth <= 1 ? 1 : bandwidth <= 2 ? 2 : -1; }

template <typename T, class O, bool PIV>
void Dispatch(const Problem& pr) {
  const int lo = Capacity(pr.lo), up = Capacity(pr.up);
  if (lo == 1 && up == 1) return Launch<T, O, 1, 1, PIV>(pr);
  if (lo == 1 && up == 2) return Launch<T, O, 1, 2, PIV>(pr);
  if (lo == 2 && up == 1) return Launch<T, O, 2, 1, PIV>(pr);
  if (lo == 2 && up == 2) return Launch<T, O, 2, 2, PIV>(pr);
  Launch<T, O, -1, -1, PIV>(pr);
}

// Choose the lanes and the tile width, then the kernel.
template <typename T>
void Solve(Problem pr, bool pivoting) {
  constexpr bool real = std::is_floating_point_v<T>;
  const bool lanes_p = pr.Q == 1 || (pr.Q < 8 && pr.P > pr.Q);
  const int64_t lanes = lanes_p ? pr.P : pr.Q;
  constexpr int64_t vl = real ? VectorOps<std::conditional_t<real, T, float>>::L : 1;
  const bool vector = real && lanes >= std::max<int64_t>(2, vl / 4);
  const int64_t group = vector ? vl : 1;
  // Tiles: one vector of lanes (the window in registers for fixed bandwidths, in L1
  // otherwise); complex numbers and a handful of lanes: up to 16 lanes, one at a time.
  const int64_t W = vector ? vl : std::min<int64_t>(16, lanes);
  pr.lanes_p = lanes_p;
  pr.W = W;
  if constexpr (real) {
    if (vector) {
      return pivoting ? Dispatch<T, VectorOps<T>, true>(pr) : Dispatch<T, VectorOps<T>, false>(pr);
    }
  }
  return pivoting ? Launch<T, ScalarOps<T>, -1, -1, true>(pr)
                  : Launch<T, ScalarOps<T>, -1, -1, false>(pr);
}

}  // namespace

ffi::Error BandedImpl(ffi::AnyBuffer ab, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> x,
                      int64_t l, int64_t u, int64_t kind, bool transposed) {
  const auto bd = b.dimensions(), ad = ab.dimensions(), xd = x->dimensions();
  if (bd.size() != 3 || xd.size() != 3 || ad.size() != 4) {
    return ffi::Error::InvalidArgument("tridiax: expected ab (K, P, N, Q) and b, x (P, N, Q)");
  }
  const int64_t P = xd[0], N = xd[1], Q = xd[2];
  if (l < 0 || u < 0 || ad[0] != l + u + 1 || bd[0] != P || bd[1] != N || bd[2] != Q ||
      (ad[1] != 1 && ad[1] != P) || (ad[2] != 1 && ad[2] != N) || (ad[3] != 1 && ad[3] != Q)) {
    return ffi::Error::InvalidArgument("tridiax: banded operand shapes do not match");
  }
  if (kind < kBanded || kind > kHermitian) {
    return ffi::Error::InvalidArgument("tridiax: unknown banded kind");
  }
  if (ab.element_type() != x->element_type() || b.element_type() != x->element_type()) {
    return ffi::Error::InvalidArgument("tridiax: operands and result differ in dtype");
  }
  if (P == 0 || N == 0 || Q == 0) return ffi::Error::Success();
  Problem pr{};
  pr.P = P;
  pr.N = N;
  pr.Q = Q;
  pr.l = l;
  pr.u = u;
  pr.lo = transposed ? u : l;
  pr.up = transposed ? l : u;
  pr.transposed = transposed;
  pr.hermitian = kind == kHermitian;
  pr.ab = ab.untyped_data();
  pr.aq = ad[3] > 1 ? 1 : 0;
  pr.an = ad[2] > 1 ? ad[3] : 0;
  pr.ap = ad[1] > 1 ? ad[2] * ad[3] : 0;
  pr.ak = ad[1] * ad[2] * ad[3];
  pr.b = b.untyped_data();
  pr.x = x->untyped_data();
  const bool pivoting = kind == kPivoted;
  switch (x->element_type()) {
    case ffi::DataType::F32: Solve<float>(pr, pivoting); break;
    case ffi::DataType::F64: Solve<double>(pr, pivoting); break;
    case ffi::DataType::C64: Solve<std::complex<float>>(pr, pivoting); break;
    case ffi::DataType::C128: Solve<std::complex<double>>(pr, pivoting); break;
    default: return ffi::Error::InvalidArgument("tridiax: unsupported dtype");
  }
  return ffi::Error::Success();
}

}  // namespace tridiax::cpu
