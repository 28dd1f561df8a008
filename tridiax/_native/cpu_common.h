// Pieces shared by tridiax's three native CPU sources (cpu_kernels.cc, cpu_banded.cc,
// cpu_block.cc): the pivot magnitude, the 8x8 transpose that moves the rows of strided lanes,
// and the thread pool that shares a kernel's tiles out over the cores. Included inside each
// source's anonymous namespace, after the standard headers and <immintrin.h>: each translation
// unit keeps its own copy.

// The size LAPACK's gtsv and gbtrf compare to choose a pivot: |x| for real x, |Re x| + |Im x| (cabs1)
// for complex x, which needs no square root.
template <typename T>
T Magnitude(T x) { return std::abs(x); }
template <typename R>
R Magnitude(std::complex<R> x) { return std::abs(x.real()) + std::abs(x.imag()); }

// out[r][s] = in[s][r] for r, s < 8, where in[s] = in + s*in_stride and out[r] = out + r*out_stride
// (strides in elements): 8 lanes' 8 consecutive rows become 8 rows of 8 lanes, or back. Pure
// data movement, so it goes by element size.
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

// The cores the kernels share their tiles over (read once: the call costs microseconds).
int64_t Cores() {
  static const int64_t cores = std::max<unsigned>(1, std::thread::hardware_concurrency());
  return cores;
}

// Share a kernel's tiles out over one thread per core, when each gets enough work to pay for
// starting it. Kernel: tiles(), scratch_size() (elements of T), Run(begin, end, scratch), the
// scratch 64-byte aligned and uninitialised (every kernel writes it before reading it).
template <typename T, typename Kernel>
void RunTiles(const Kernel& kernel, int64_t work) {
  const int64_t tiles = kernel.tiles();
  if (tiles == 0) return;
  const int64_t threads =
      std::min<int64_t>({Cores(), tiles, std::max<int64_t>(1, work / (1 << 16))});
  const int64_t bytes = kernel.scratch_size() * static_cast<int64_t>(sizeof(T)) + 64;
  auto run = [&](int64_t id) {
    // A small scratch is kept by the thread across calls, so a small solve in a time loop pays
    // no allocation; a large one is allocated for the call.
    constexpr int64_t kKept = int64_t{1} << 19;
    thread_local std::vector<char> kept;
    std::unique_ptr<char[]> local;
    char* raw;
    if (bytes <= kKept) {
      if (static_cast<int64_t>(kept.size()) < bytes) kept.resize(kKept);
      raw = kept.data();
    } else {
      local.reset(new char[bytes]);
      raw = local.get();
    }
    const uintptr_t at = (reinterpret_cast<uintptr_t>(raw) + 63) & ~uintptr_t{63};
    const int64_t begin = tiles * id / threads, end = tiles * (id + 1) / threads;
    kernel.Run(begin, end, reinterpret_cast<T*>(at));
  };
  std::vector<std::thread> pool;
  for (int64_t id = 1; id < threads; ++id) pool.emplace_back(run, id);
  run(0);
  for (auto& th : pool) th.join();
}
