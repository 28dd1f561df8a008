// The two sweeps of the partition method that solves long systems as many chunks at once
// (tridiax/_long_systems/chunked.py): the first (TridiaxChunkEndsCpu) writes each chunk's
// contributions to the reduced system in the separators, the last (TridiaxChunkSolveCpu) solves
// each chunk's interior again with the separators known. Unpivoted (Thomas, periodic systems
// included) or with partial pivoting inside each chunk. Lanes are chunks (tiles.h).
//
// Modes:
//   kEnds:   the first sweep. Chunk c of rows [c*m, c*m + n + 1) has interior rows 0..n-1 and
//            its last row n as separator s_c. With T the interior matrix, y = T^{-1} b,
//            v = T^{-1}(alpha e_1), w = T^{-1}(omega e_n), where alpha = sub(0) couples row 0
//            to the previous separator and omega = sup(n-1) couples row n-1 to s_c, the
//            interior is x = y - v x[s_{c-1}] - w x[s_c]. Substituted into the separator rows,
//            that leaves a tridiagonal system in the separators, whose rows this sweep writes
//            chunk by chunk (10 arrays (P, C, Q)):
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
//
// Rows of runs. Where the planner says so (`scan`, a bit per class of tile: tiles.h,
// kShortTiles), an unpivoted tile of CQ lanes that is exactly one vector (L/Q chunks of Q
// lanes, Q dividing L) reads each row of each operand straight into one vector, a run of Q
// values per chunk, and keeps its state in registers (EndsOfRuns, SolveOfRuns): the same
// operations in the same order as the sweep through a RowReader, without moving the rows
// through a buffer. A tile the planner sends there that is not such a tile fails the call.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <complex>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels.h"
#include "lanes.h"
#include "sweeps.h"
#include "threads.h"
#include "tiles.h"

namespace tridiax::cpu {
namespace {

constexpr int kReducedRows = 10;  // the partition method's values per chunk (Reduced)
// How much smaller the reduced row's sums' spikes must be for its diagonal to be formed from
// them (Reduced; tridiax/_long_systems/chunked.py, SUMS_MARGIN, the same).
constexpr double kSumsMargin = 16;

enum Mode : int64_t { kEnds = 1, kChunkSolve = 2 };

template <typename T>
class ChunkSolver {
 public:
  ChunkSolver(const Operand* ops, const Operand* xsep, T* const* outs, const Geometry& g,
              bool transposed, bool pivoting, int64_t mode, bool periodic, int64_t scan,
              std::atomic<bool>* refused)
      : g_(g), transposed_(transposed), pivoting_(pivoting), mode_(mode), periodic_(periodic),
        scan_(scan), refused_(refused) {
    for (int k = 0; k < 4; ++k) ops_[k] = ops[k];
    for (int k = 0; k < kReducedRows; ++k) outs_[k] = outs[k];
    if (xsep != nullptr) xsep_ = *xsep;
  }

  int64_t tiles() const { return g_.tiles(); }
  // c', y', z'/U2, pivots (rows x W each), 4 reader blocks, kSpareRows spare rows; at least c'
  // and y' of a tile's chunks where tiles take SolveOfRuns.
  int64_t scratch_size() const {
    return std::max(RunsSize(), (4 * g_.chunk + 4 * kRows + kSpareRows) * g_.W + kBlock * g_.N);
  }

  void Run(int64_t begin, int64_t end, T* scratch) const {
    for (int64_t t = begin; t < end; ++t) SolveTile(g_.At(t), scratch);
  }

 private:
  const T* Data(int k) const { return static_cast<const T*>(ops_[k].data); }

  // The scratch of SolveOfRuns (c' and y' of a tile's chunks), where tiles take it.
  int64_t RunsSize() const {
#if defined(TRIDIAX_VECTOR_SCAN)
    if constexpr (std::is_floating_point_v<T>) {
      if (mode_ == kChunkSolve && scan_ != 0) return 2 * g_.chunk * VectorOps<T>::L;
    }
#endif
    return 0;
  }

  // Ends or the last sweep by rows of runs (EndsOfRuns, SolveOfRuns) for a tile the planner
  // sends there: false, nothing done, where the tile is not one vector of CQ lanes.
  bool EndsInRegisters(const Tile& tile, const T* alpha, const T* beta, const T* omega,
                       T* work) const {
#if defined(TRIDIAX_VECTOR_SCAN)
    if constexpr (std::is_floating_point_v<T>) {
      bool done = false;
      const auto runs = [&](auto G) {
        done = EndsOfRuns<decltype(G)::value>(tile, alpha, beta, omega, work);
      };
      return tile.lanes == kLanesCQ && WithGroup<T>(g_.Q, runs) && done;
    }
#endif
    return false;
  }
  bool SolveInRegisters(const Tile& tile, T* scratch) const {
#if defined(TRIDIAX_VECTOR_SCAN)
    if constexpr (std::is_floating_point_v<T>) {
      bool done = false;
      const auto runs = [&](auto G) { done = SolveOfRuns<decltype(G)::value>(tile, scratch); };
      return tile.lanes == kLanesCQ && WithGroup<T>(g_.Q, runs) && done;
    }
#endif
    return false;
  }

  void SolveTile(const Tile& tile, T* scratch) const {
    const int64_t W = g_.W, len = tile.len;
    if (mode_ == kChunkSolve && g_.Scans(scan_, tile)) {  // the planner's choice
      if (!SolveInRegisters(tile, scratch)) refused_->store(true);
      return;
    }
    T* c = scratch;
    T* y = c + len * W;
    T* z = y + len * W;
    T* v = z + len * W;
    T* blocks = v + len * W;
    T* spare = blocks + 4 * kRows * W;  // kSpareRows rows of W
    RowReader<T> rd[4];
    OpenBands(rd, ops_, g_, tile, blocks, kRows, static_cast<T*>(nullptr));
    const int kl = transposed_ ? 2 : 0, ku = transposed_ ? 0 : 2;
    // sub(i), i >= 1, and sup(i), i <= len - 2, inside the tile's rows.
    auto sub = [&](int64_t i) { return rd[kl].Row(transposed_ ? i - 1 : i); };
    auto dia = [&](int64_t i) { return rd[1].Row(i); };
    auto sup = [&](int64_t i) { return rd[ku].Row(transposed_ ? i + 1 : i); };
    auto rhs = [&](int64_t i) { return rd[3].Row(i); };
    Chunk(tile, rd, sub, dia, sup, rhs, c, y, z, v, spare);
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
    if (g_.Scans(scan_, tile)) {  // the planner's choice: the rows in vector registers
      if (!EndsInRegisters(tile, alpha, beta, omega, work)) refused_->store(true);
      return;
    }
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
    using S = VectorOps<T>;
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

  // The tile's RunRows; false where the tile is not one vector of lanes (RunRows loads whole
  // vectors) or an operand's lanes are laid out otherwise.
  template <int G>
  bool TileRuns(const Tile& tile, RunRows<G>& runs) const {
    using Rows = RunRows<G>;
    if (tile.w != VectorOps<T>::L) return false;
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
  // y', v', pi and the two sums) carried in registers, where Ends moves such rows run by run
  // through a RowReader's buffer and its state through `work`. False, nothing done, for other
  // tiles. Compiled apart from Chunk (noinline): inlined there, GCC left RunRows::Load out of
  // line, or, with Load forced inline, made the sweep slower.
  template <int G>
  __attribute__((noinline)) bool EndsOfRuns(const Tile& tile, const T* alpha, const T* beta,
                                            const T* omega, T* work) const {
    using S = VectorOps<T>;
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
    const V om = S::Load(omega);
    V cp, yp, vp, rp, pi = one, ys, vs, rs, wl;  // as Ends
    {
      const V p = load(1, 0);
      const V u = n > 1 ? load(2, 0) : om;
      cp = n > 1 ? u / p : zero;
      yp = ys = load(3, 0) / p;
      const V al = S::Load(alpha);
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
    using S = VectorOps<T>;
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
    const V right_coupled = rows.Load(2, n - 1) * S::Load(right);  // omega x[s_c]
    V b0 = rows.Load(3, 0) - S::Load(left);
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
      xv = S::Load(y_rows + i * L) - S::Load(c_rows + i * L) * xv;
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

  // The partition method's sweeps on one tile of chunks (see Mode), unpivoted or, `pivoting`,
  // with partial pivoting inside each chunk. `c`, `y`, `z`, `v`: work rows of
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
      if (pivoting_) {
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
    if (pivoting_) {
      // Rows 0 and n-1 take the adjusted right-hand sides (both in b0 when n = 1).
      auto ends = [&](int64_t i) { return i == 0 ? b0 : i == n - 1 ? bl : rhs(i); };
      Pivoted<T>(sub, dia, sup, ends, spare + 5 * W, v, c, z, y, W, w, n);
    } else {
      Eliminate<T>(sub, dia, sup, rhs, b0, n > 1 ? bl : nullptr, c, y, W, w, n);
      BackSubstitute(c, y, W, w, n);
    }
    const auto st = g_.Of(tile, g_.N * g_.Q, g_.Q, 1, g_.chunk);
    StoreRows(outs_[0], st, g_.Q, w, W, 0, n + 1, y);
  }

  Geometry g_;
  Operand ops_[4];
  Operand xsep_{};
  T* outs_[kReducedRows];  // x, or (kEnds) the reduced system's arrays
  bool transposed_, pivoting_;
  int64_t mode_;
  bool periodic_;
  int64_t scan_;                // a bit per class of tile: rows of runs in registers
  std::atomic<bool>* refused_;  // set where a tile cannot be swept as `scan_` says
};

ffi::Error RefusedScan() {
  return ffi::Error::InvalidArgument(
      "tridiax: `scan` names tiles whose rows the chunk sweeps cannot hold in vector registers "
      "(those are unpivoted real chunks, a tile one vector of Q-value runs)");
}

// The sweep of `mode` on every tile; false where a tile could not be swept as `scan` says.
template <typename T>
bool SweepChunks(const Operand* ops, const Operand* xsep, T* const* outs, const Geometry& g,
                 bool transposed, bool pivoting, int64_t mode, bool periodic, int64_t scan) {
  std::atomic<bool> refused{false};
  RunTiles<T>(ChunkSolver<T>(ops, xsep, outs, g, transposed, pivoting, mode, periodic, scan,
                             &refused),
              g.P * g.N * g.Q);
  return !refused.load();
}

// Whether `scan` can be carried out at all: no bits past the four classes, and none for
// pivoted chunks or where the library holds no rows of this type in vector registers.
bool ScanPossible(int64_t scan, bool pivoting, ffi::DataType type) {
  return scan == 0 || (scan > 0 && scan < 16 && !pivoting && HasVectorRows(type));
}

}  // namespace

ffi::Error ChunkEndsImpl(ffi::AnyBuffer lower, ffi::AnyBuffer diag, ffi::AnyBuffer upper,
                         ffi::AnyBuffer rhs, ffi::Result<ffi::AnyBuffer> o0,
                         ffi::Result<ffi::AnyBuffer> o1, ffi::Result<ffi::AnyBuffer> o2,
                         ffi::Result<ffi::AnyBuffer> o3, ffi::Result<ffi::AnyBuffer> o4,
                         ffi::Result<ffi::AnyBuffer> o5, ffi::Result<ffi::AnyBuffer> o6,
                         ffi::Result<ffi::AnyBuffer> o7, ffi::Result<ffi::AnyBuffer> o8,
                         ffi::Result<ffi::AnyBuffer> o9, bool transposed, bool periodic,
                         bool pivoting, int64_t lanes, int64_t width, int64_t chunk,
                         int64_t scan) {
  auto dims = o0->dimensions();
  const int64_t P = dims[0], Q = dims[2], N = Rows({&lower, &diag, &upper, &rhs});
  if (!ScanPossible(scan, pivoting, o0->element_type())) return RefusedScan();
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
  bool swept = true;
  const bool ok = ForType(o0->element_type(), [&](auto zero) {
    using T = decltype(zero);
    T* outs[kReducedRows];
    for (int k = 0; k < kReducedRows; ++k) outs[k] = static_cast<T*>(raw[k]);
    swept = SweepChunks<T>(ops, nullptr, outs, g, transposed, pivoting, kEnds, periodic, scan);
  });
  if (!ok) return Unsupported();
  return swept ? ffi::Error::Success() : RefusedScan();
}

ffi::Error ChunkSolveImpl(ffi::AnyBuffer lower, ffi::AnyBuffer diag, ffi::AnyBuffer upper,
                          ffi::AnyBuffer rhs, ffi::AnyBuffer xsep, ffi::Result<ffi::AnyBuffer> x,
                          bool transposed, bool periodic, bool pivoting, int64_t lanes,
                          int64_t width, int64_t chunk, int64_t scan) {
  auto dims = x->dimensions();
  const int64_t P = dims[0], N = dims[1], Q = dims[2];
  if (!ScanPossible(scan, pivoting, x->element_type())) return RefusedScan();
  if (P == 0 || N == 0 || Q == 0) return ffi::Error::Success();
  const Geometry g(P, N, Q, chunk, lanes, width);
  if (g.C != xsep.dimensions()[1] || N % g.chunk == 1 || g.chunk < 2) {
    return ffi::Error::InvalidArgument("tridiax: every chunk needs >= 2 rows and C separators");
  }
  const Operand ops[4] = {MakeOperand(lower), MakeOperand(diag), MakeOperand(upper),
                          MakeOperand(rhs)};
  const Operand sep = MakeOperand(xsep);
  void* out = x->untyped_data();
  bool swept = true;
  const bool ok = ForType(x->element_type(), [&](auto zero) {
    using T = decltype(zero);
    T* outs[kReducedRows] = {static_cast<T*>(out)};
    swept = SweepChunks<T>(ops, &sep, outs, g, transposed, pivoting, kChunkSolve, periodic, scan);
  });
  if (!ok) return Unsupported();
  return swept ? ffi::Error::Success() : RefusedScan();
}

}  // namespace tridiax::cpu
