// The lanes every kernel's arithmetic is written against: one vector of real lanes
// (VectorOps, GCC vector extensions; AVX-512's mask registers for the pivot's comparisons) or
// one lane of any type (ScalarOps); the pivot magnitude; the 8x8 transpose that moves the rows
// of strided lanes; and, where TRIDIAX_VECTOR_SCAN is defined, the shuffles that hold L
// consecutive rows of one lane in a vector instead of one row of L lanes (the recurrences'
// scans, the Thomas chunks' rows of runs).
//
// This header and the others the kernels share (threads.h, tiles.h, sweeps.h) put what they
// define in an anonymous namespace inside tridiax::cpu: every source that includes them
// compiles its own copy, with internal linkage, and no inline copy is shared between sources.
// The sources are compiled with different -ffp-contract (tridiax/_native/compiler.py: =fast for
// the block kernel, so that it rounds as XLA does; =off elsewhere), and even under =off GCC
// fuses some complex multiplications into vfmaddsub, depending on what it inlined around them:
// a copy the linker merged across sources could round one source's arithmetic as another's.
// Only kernels.h, the entry points ffi.cc calls, declares names with external linkage.

#pragma once

#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

// Vectors of consecutive rows of one lane: GCC >= 12 or clang (__builtin_shufflevector) and
// AVX2 (masked loads). The build asks the library whether it has them (TridiaxScanRows), and
// the planner decides from that which tiles use them.
#if (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)) && defined(__AVX2__)
#define TRIDIAX_VECTOR_SCAN 1
#endif

namespace tridiax::cpu {
namespace {

#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#elif defined(__AVX__)
constexpr int kVectorBytes = 32;
#else
constexpr int kVectorBytes = 16;
#endif

// The size LAPACK's gtsv and gbtrf compare to choose a pivot: |x| for real x, |Re x| + |Im x|
// (cabs1) for complex x, which needs no square root.
template <typename T>
T Magnitude(T x) { return std::abs(x); }
template <typename R>
R Magnitude(std::complex<R> x) { return std::abs(x.real()) + std::abs(x.imag()); }

// L real lanes of one vector register.
template <typename T>
struct VectorOps {
  static constexpr int L = kVectorBytes / static_cast<int>(sizeof(T));
  typedef T V __attribute__((vector_size(kVectorBytes)));
  using I = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  typedef I Mask __attribute__((vector_size(kVectorBytes)));
  using Mag = V;

  static V Splat(T x) {
    V v;
    for (int i = 0; i < L; ++i) v[i] = x;
    return v;
  }
  static V Zero() { return Splat(T(0)); }
  static V One() { return Splat(T(1)); }
  static V Load(const T* p) {
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
  }
  static void Store(T* p, V v) { std::memcpy(p, &v, sizeof(V)); }
  // The first n lanes (n <= L); the others are zero.
  static V Load(const T* p, int n) {
#if defined(__AVX512F__)
    // Masked: lanes past n are neither read nor faulted on, without a branch.
    if constexpr (sizeof(T) == 4) {
      return (V)_mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
    } else {
      return (V)_mm512_maskz_loadu_pd(static_cast<__mmask8>((1u << n) - 1), p);
    }
#endif
    V v;
    if (n == L) {
      std::memcpy(&v, p, sizeof(V));
    } else {
      v = Zero();
      std::memcpy(&v, p, static_cast<size_t>(n) * sizeof(T));
    }
    return v;
  }
  static void Store(T* p, V v, int n) {
#if defined(__AVX512F__)
    if constexpr (sizeof(T) == 4) {
      return _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), (__m512)v);
    } else {
      return _mm512_mask_storeu_pd(p, static_cast<__mmask8>((1u << n) - 1), (__m512d)v);
    }
#endif
    std::memcpy(p, &v, static_cast<size_t>(n == L ? L : n) * sizeof(T));
  }
  static Mag Abs(V v) {
    constexpr I sign = ~(I(1) << (8 * sizeof(T) - 1));
    return (V)((Mask)v & sign);
  }
  // a beats b for the pivot: larger, or NaN where b is not (jnp.argmax's NaN rule). With
  // AVX-512 the masks are mask registers.
#if defined(__AVX512F__)
  using Bits = std::conditional_t<sizeof(T) == 4, __mmask16, __mmask8>;
  static Bits Greater(Mag a, Mag b) {
    if constexpr (sizeof(T) == 4) {
      const __m512 x = (__m512)a, y = (__m512)b;
      return _mm512_cmp_ps_mask(x, y, _CMP_GT_OQ) |
             (_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) & _mm512_cmp_ps_mask(y, y, _CMP_ORD_Q));
    } else {
      const __m512d x = (__m512d)a, y = (__m512d)b;
      return _mm512_cmp_pd_mask(x, y, _CMP_GT_OQ) |
             (_mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q) & _mm512_cmp_pd_mask(y, y, _CMP_ORD_Q));
    }
  }
  static V Select(Bits m, V a, V b) {
    if constexpr (sizeof(T) == 4) {
      return (V)_mm512_mask_blend_ps(m, (__m512)b, (__m512)a);
    } else {
      return (V)_mm512_mask_blend_pd(m, (__m512d)b, (__m512d)a);
    }
  }
  static Bits AndNot(Bits a, Bits b) { return static_cast<Bits>(a & ~b); }
  static Bits Or(Bits a, Bits b) { return static_cast<Bits>(a | b); }
#else
  using Bits = Mask;
  static Bits Greater(Mag a, Mag b) { return (a > b) | ((a != a) & (b == b)); }
  static V Select(Bits m, V a, V b) { return m ? a : b; }
  static Bits AndNot(Bits a, Bits b) { return a & ~b; }
  static Bits Or(Bits a, Bits b) { return a | b; }
#endif
  // The Hermitian kind's pivot: itself where positive, NaN elsewhere.
  static V Positive(V p) { return p > Zero() ? p : Splat(std::numeric_limits<T>::quiet_NaN()); }

#if defined(TRIDIAX_VECTOR_SCAN)
  // Consecutive rows of one lane (or of a few lanes) in one vector.

  // One value a row: `stride` 0 repeats p[0], 1 reads p[0..L).
  static V LoadOrSplat(const T* p, int64_t stride) { return stride == 0 ? Splat(*p) : Load(p); }
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
    if (G == 1 || (step != 0 && lane != 0)) return LoadOrSplat(p, G == 1 ? step : 1);
    if (step == 0) {
      V v;
      for (int i = 0; i < L; ++i) v[i] = p[(i % G) * lane];
      return v;
    }
    return Spread<G>(p, std::make_index_sequence<L>{});
  }
  // Lane i takes p[i / G]: L/G values, each repeated G times. One masked load of those values
  // (no read past them), then one permute: a narrower load widened through memory (memcpy into
  // a vector) would stall store forwarding.
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
#endif  // TRIDIAX_VECTOR_SCAN
};

#if defined(TRIDIAX_VECTOR_SCAN)
// Whether rows of q lanes share a vector of T: q divides the vector's L lanes, 1 < q < L.
template <typename T>
constexpr bool Groupable(int64_t q) {
  constexpr int64_t L = VectorOps<T>::L;
  return q > 1 && q < L && L % q == 0;
}

// f(std::integral_constant<int, q>{}) for a Groupable q (built for 2, 4 and 8); false, f not
// called, for any other q.
template <typename T, typename F>
bool WithGroup(int64_t q, F&& f) {
  constexpr int L = VectorOps<T>::L;
  switch (q) {
    case 2: f(std::integral_constant<int, 2>{}); return true;
    case 4: if constexpr (L > 4) { f(std::integral_constant<int, 4>{}); return true; } break;
    case 8: if constexpr (L > 8) { f(std::integral_constant<int, 8>{}); return true; } break;
  }
  return false;
}
#endif  // TRIDIAX_VECTOR_SCAN

template <typename T>
struct Real { using type = T; };
template <typename R>
struct Real<std::complex<R>> { using type = R; };

// One lane of any type, with the operations of VectorOps.
template <typename T>
struct ScalarOps {
  static constexpr int L = 1;
  using V = T;
  using R = typename Real<T>::type;
  using Bits = bool;
  using Mag = R;

  static V Splat(T x) { return x; }
  static V Zero() { return T(0); }
  static V One() { return T(1); }
  static V Load(const T* p, int = 1) { return *p; }
  static void Store(T* p, V v, int = 1) { *p = v; }
  static Mag Abs(T x) { return Magnitude(x); }
  static Bits Greater(Mag a, Mag b) { return a > b || (std::isnan(a) && !std::isnan(b)); }
  template <typename U>
  static U Select(Bits m, U a, U b) { return m ? a : b; }
  static Bits Or(Bits a, Bits b) { return a || b; }
  static Bits AndNot(Bits a, Bits b) { return a && !b; }
  static V Positive(V p) {
    return std::real(p) > R(0) ? p : V(std::numeric_limits<R>::quiet_NaN());
  }
};

// out[r][s] = in[s][r] for r, s < 8, where in[s] = in + s*in_stride and out[r] = out +
// r*out_stride (strides in elements): 8 lanes' 8 consecutive rows become 8 rows of 8 lanes, or
// back. Pure data movement, so it goes by element size.
template <typename T>
inline __attribute__((always_inline)) void Transpose8(const T* in, int64_t in_stride, T* out,
                                                      int64_t out_stride) {
#if defined(__AVX2__)
  if constexpr (sizeof(T) == 4) {
    const float* src = reinterpret_cast<const float*>(in);
    float* dst = reinterpret_cast<float*>(out);
    __m256 r[8], t[8], u[8];
    for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(src + k * in_stride);
    for (int k = 0; k < 4; ++k) {
      t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
      t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 2; ++k) {
      u[4 * k + 0] = _mm256_shuffle_ps(t[4 * k + 0], t[4 * k + 2], _MM_SHUFFLE(1, 0, 1, 0));
      u[4 * k + 1] = _mm256_shuffle_ps(t[4 * k + 0], t[4 * k + 2], _MM_SHUFFLE(3, 2, 3, 2));
      u[4 * k + 2] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], _MM_SHUFFLE(1, 0, 1, 0));
      u[4 * k + 3] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int k = 0; k < 4; ++k) {
      _mm256_storeu_ps(dst + k * out_stride, _mm256_permute2f128_ps(u[k], u[k + 4], 0x20));
      _mm256_storeu_ps(dst + (k + 4) * out_stride, _mm256_permute2f128_ps(u[k], u[k + 4], 0x31));
    }
    return;
  } else if constexpr (sizeof(T) == 8) {
    const double* src = reinterpret_cast<const double*>(in);
    double* dst = reinterpret_cast<double*>(out);
    for (int rb = 0; rb < 8; rb += 4) {
      for (int sb = 0; sb < 8; sb += 4) {
        __m256d r[4];
        for (int k = 0; k < 4; ++k) r[k] = _mm256_loadu_pd(src + (sb + k) * in_stride + rb);
        const __m256d t0 = _mm256_unpacklo_pd(r[0], r[1]), t1 = _mm256_unpackhi_pd(r[0], r[1]);
        const __m256d t2 = _mm256_unpacklo_pd(r[2], r[3]), t3 = _mm256_unpackhi_pd(r[2], r[3]);
        double* o = dst + rb * out_stride + sb;
        _mm256_storeu_pd(o, _mm256_permute2f128_pd(t0, t2, 0x20));
        _mm256_storeu_pd(o + out_stride, _mm256_permute2f128_pd(t1, t3, 0x20));
        _mm256_storeu_pd(o + 2 * out_stride, _mm256_permute2f128_pd(t0, t2, 0x31));
        _mm256_storeu_pd(o + 3 * out_stride, _mm256_permute2f128_pd(t1, t3, 0x31));
      }
    }
    return;
  }
#endif
  for (int r = 0; r < 8; ++r) {
    for (int s = 0; s < 8; ++s) out[r * out_stride + s] = in[s * in_stride + r];
  }
}

}  // namespace
}  // namespace tridiax::cpu
