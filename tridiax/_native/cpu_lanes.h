// Lane arithmetic shared by the banded and block kernels (cpu_banded.cc, cpu_block.cc): a vector
// of L real lanes (VectorOps, GCC vector extensions; AVX-512's mask registers for the pivot's
// comparisons) or one lane of any type (ScalarOps). Each elimination is written once against
// these. Included inside each source's anonymous namespace, after cpu_common.h.

#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#elif defined(__AVX__)
constexpr int kVectorBytes = 32;
#else
constexpr int kVectorBytes = 16;
#endif

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
};

template <typename T>
struct Real { using type = T; };
template <typename R>
struct Real<std::complex<R>> { using type = R; };

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
