// The factorization A = L D V of tridiagonal systems (TridiaxFactorCpu), and the band
// cotangents of a solve's gradient (TridiaxBandCotangentsCpu): the two elementwise-per-row
// companions of the solves, each row written as it is formed. Lanes and tiles as in tiles.h.

#include <algorithm>
#include <complex>
#include <cstdint>
#include <utility>

#include "kernels.h"
#include "threads.h"
#include "tiles.h"

namespace tridiax::cpu {
namespace {

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

}  // namespace

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

}  // namespace tridiax::cpu
