// Elementwise recurrences h[t] = act(a[t]*h[t-1] + x[t]) (TridiaxRecurrenceCpu) and the first
// sweep of their chunked form (TridiaxRecurrenceEndsCpu), with the activations (identity,
// relu, tanh) and the gates of their derivatives. Lanes and tiles as in tiles.h.
//
// Scans. Where a recurrence's steps lie next to each other in memory (Q == 1: batch-first
// data), a vector can hold L consecutive steps of ONE lane instead of one step of L lanes, so
// the lane is read as one stream instead of through transposes; likewise L/Q steps of all Q
// lanes of rows of a few values (an (N, 4) field along axis 0). L steps (c_i, x_i) compose by a
// log-step scan (LogStepScan), and the chain from one vector to the next is one multiply-add
// and one broadcast. Reverse-time lanes scan towards lane 0. Real dtypes, linear steps (gated
// or not) only. Which tiles scan is the planner's choice (`scan`, a bit per class of tile:
// tiles.h, kShortTiles); a tile it sends there that cannot be scanned fails the call.
//
// Tridiagonal solves are never scanned: a scan composes the elimination in another order, which
// loses digits against the sequential sweep on the systems PDE users solve; linear recurrences
// stay close to their sequential loop.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <complex>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels.h"
#include "lanes.h"
#include "threads.h"
#include "tiles.h"

namespace tridiax::cpu {
namespace {

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

// v[s] = tanh(v[s]) for s < n. std::tanh is a scalar libm call, many times the cost of the
// step it serves. float32 takes the rational approximation XLA's CPU tanh uses
// (Eigen's: odd degree 13 over even degree 6 on [-7.9053, 7.9053], clamped beyond, x itself
// below 4e-4; within 6 ulp), which the compiler vectorizes; float64 goes through glibc's
// vector tanh (libmvec, glibc >= 2.35, within 4 ulp: tridiax/_native/compiler.py adds
// -DTRIDIAX_LIBMVEC and links -l:libmvec.so.1 where it finds it), else libm's.
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

#if defined(TRIDIAX_VECTOR_SCAN)
// The log-step scan of (c, x) over a vector's lanes, towards lane L-1 (Up) or lane 0: at
// distance k = 1, 2, 4, ..., x_i += c_i * x_{i-k} and c_i *= c_{i-k} (lanes past the vector's
// end take c = 1, x = 0), after which h_i = c_i * h_in + x_i for every lane and c_{L-1} is the
// product of the L coefficients.
template <typename T, bool Up, int K = 1>
inline __attribute__((always_inline)) void LogStepScan(typename VectorOps<T>::V& c,
                                                       typename VectorOps<T>::V& x,
                                                       typename VectorOps<T>::V one,
                                                       typename VectorOps<T>::V zero) {
  using S = VectorOps<T>;
  if constexpr (K < S::L) {
    using Lanes = std::make_index_sequence<S::L>;
    x += c * S::template Shift<K, Up>(x, zero, Lanes{});
    c *= S::template Shift<K, Up>(c, one, Lanes{});
    LogStepScan<T, Up, 2 * K>(c, x, one, zero);
  }
}

// G lanes of a recurrence at relative steps 0..len-1, whose steps are G values apart and whose
// lanes are next to each other (an (N, G) block along axis 0; G = 1: one contiguous lane), L/G
// steps of all G lanes a vector: the log-step scan over lanes G, 2G, 4G, ... apart, then the
// states carried in from the step before. a, x, g: lane 0 of step 0, with step strides sa, sx,
// sg and lane strides qa, qx, qg as LoadSteps reads them (G and 1; 0 and 1 or 0 where one step
// is broadcast; 1 and 0 where the lanes share a value a step); out: G values
// a step (nullptr: none). h: the G states entering in scan order, then the final ones; `edge`:
// the G coefficients of the first step in scan order when `shifted`; decay, if given: the
// products of each lane's coefficients. (Swept a row of G lanes at a time, each row would wait
// on the multiply-add and the store of the row before.)
template <typename T, int Gate, int G>
void ScanLanes(const T* a, int64_t sa, int64_t qa, const T* x, int64_t sx, int64_t qx,
               const T* g, int64_t sg, int64_t qg, T* out, int64_t len, bool reverse,
               bool shifted, const T* edge, T* h, T* decay) {
  using S = VectorOps<T>;
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
      LogStepScan<T, true, G>(c, v, one, zero);
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
      LogStepScan<T, false, G>(c, v, one, zero);
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
#endif  // TRIDIAX_VECTOR_SCAN

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
             int64_t activation, int64_t gate, int64_t mode, bool final_only, int64_t scan,
             std::atomic<bool>* refused)
      : g_(g), ops_{ops[0], ops[1], ops[2], ops[3]}, outs_{outs[0], outs[1]}, reverse_(reverse),
        shifted_(shifted), activation_(activation), gate_(gate), mode_(mode),
        final_only_(final_only), scan_(scan), refused_(refused) {}

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

  // A tile of lanes scanned in vector registers, as the planner says (`scan_`); false, nothing
  // done, where it cannot be: an activation, or lanes neither contiguous (Q == 1) nor all Q
  // lanes of rows of a few values (Grouped).
  template <int Act, int Gate>
  bool Scanned(const Tile& tile, T* scratch) const {
#if defined(TRIDIAX_VECTOR_SCAN)
    if constexpr (Act == kIdentity && std::is_floating_point_v<T>) {
      if (g_.Q == 1) {
        ScanSteps<Gate, 1>(tile, scratch);
        return true;
      }
      return GroupedSteps<Gate>(tile, scratch);
    }
#endif
    (void)tile;
    (void)scratch;
    return false;
  }

  template <int Act, int Gate>
  void Steps(const Tile& tile, T* scratch) const {
    if (g_.Scans(scan_, tile)) {
      if (!Scanned<Act, Gate>(tile, scratch)) refused_->store(true);
      return;
    }
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
    return Groupable<T>(g_.Q) && tile.lanes == kLanesQ && tile.q == 0 && tile.w == g_.Q;
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
  int64_t scan_;                // a bit per class of tile: the tiles scanned in registers
  std::atomic<bool>* refused_;  // set where a tile cannot be scanned as `scan_` says
};

ffi::Error RefusedScan() {
  return ffi::Error::InvalidArgument(
      "tridiax: `scan` names tiles of the recurrence that cannot be scanned in vector registers "
      "(those are real, linear, and either contiguous steps or all Q lanes of a few)");
}

// Whether `scan` can be carried out at all: no bits past the four classes, and none with an
// activation or where the library holds no rows of this type in vector registers.
bool ScanPossible(int64_t scan, int64_t activation, ffi::DataType type) {
  return scan == 0 || (scan > 0 && scan < 16 && activation == kIdentity && HasVectorRows(type));
}

}  // namespace

ffi::Error RecurrenceImpl(ffi::AnyBuffer a, ffi::AnyBuffer x, ffi::AnyBuffer h0,
                          ffi::AnyBuffer gate, ffi::Result<ffi::AnyBuffer> h, bool reverse,
                          bool shifted, int64_t activation, int64_t gate_slope, bool final_only,
                          int64_t lanes, int64_t width, int64_t chunk, int64_t scan) {
  auto dims = h->dimensions();
  if (dims.size() != 3) return ffi::Error::InvalidArgument("tridiax: expected (P, T, Q)");
  const int64_t P = dims[0], Q = dims[2];
  const int64_t T = Rows({&a, &x, &gate});
  if (P == 0 || T == 0 || Q == 0) return ffi::Error::Success();
  if ((activation != kIdentity || gate_slope != kIdentity) && IsComplex(h->element_type())) {
    return ffi::Error::InvalidArgument("tridiax: activations are for real dtypes");
  }
  if (!ScanPossible(scan, activation, h->element_type())) return RefusedScan();
  const Geometry g(P, T, Q, final_only ? 0 : chunk, lanes, width);
  if (h0.dimensions()[1] != g.C) {
    return ffi::Error::InvalidArgument("tridiax: one initial state per chunk expected");
  }
  const Operand ops[4] = {MakeOperand(a), MakeOperand(x), MakeOperand(h0), MakeOperand(gate)};
  void* out = h->untyped_data();
  std::atomic<bool> refused{false};
  const bool ok = ForType(h->element_type(), [&](auto zero) {
    using E = decltype(zero);
    E* outs[2] = {static_cast<E*>(out), nullptr};
    RunTiles<E>(Recurrence<E>(ops, outs, g, reverse, shifted, activation, gate_slope, kRun,
                              final_only, scan, &refused),
                P * T * Q);
  });
  if (!ok) return Unsupported();
  return refused.load() ? RefusedScan() : ffi::Error::Success();
}

ffi::Error RecurrenceEndsImpl(ffi::AnyBuffer a, ffi::AnyBuffer x, ffi::AnyBuffer gate,
                              ffi::Result<ffi::AnyBuffer> decay, ffi::Result<ffi::AnyBuffer> final,
                              bool reverse, bool shifted, int64_t gate_slope, int64_t lanes,
                              int64_t width, int64_t chunk, int64_t scan) {
  auto dims = decay->dimensions();
  const int64_t P = dims[0], Q = dims[2];
  const int64_t T = Rows({&a, &x, &gate});
  if (P == 0 || T == 0 || Q == 0) return ffi::Error::Success();
  if (gate_slope != kIdentity && IsComplex(decay->element_type())) {
    return ffi::Error::InvalidArgument("tridiax: activations are for real dtypes");
  }
  if (!ScanPossible(scan, kIdentity, decay->element_type())) return RefusedScan();
  const Geometry g(P, T, Q, chunk, lanes, width);
  if (g.C != dims[1]) return ffi::Error::InvalidArgument("tridiax: C outputs expected");
  const Operand ops[4] = {MakeOperand(a), MakeOperand(x), Operand{}, MakeOperand(gate)};
  void* raw[2] = {decay->untyped_data(), final->untyped_data()};
  std::atomic<bool> refused{false};
  const bool ok = ForType(decay->element_type(), [&](auto zero) {
    using E = decltype(zero);
    E* outs[2] = {static_cast<E*>(raw[0]), static_cast<E*>(raw[1])};
    RunTiles<E>(Recurrence<E>(ops, outs, g, reverse, shifted, kIdentity, gate_slope,
                              kRecurrenceEnds, false, scan, &refused),
                P * T * Q);
  });
  if (!ok) return Unsupported();
  return refused.load() ? RefusedScan() : ffi::Error::Success();
}

}  // namespace tridiax::cpu
