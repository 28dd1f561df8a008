// tridiax's CPU kernels, as XLA FFI custom calls: the Thomas algorithm for many tridiagonal
// systems (TridiaxThomasCpu) and elementwise recurrences h[t] = act(a[t]*h[t-1] + x[t])
// (TridiaxRecurrenceCpu).
//
// Thomas (kind 0), a solve with stored factors (kind 1), a periodic solve (kind 2) and Gaussian
// elimination with partial pivoting (kind 3): same algorithms, band conventions and (P, N, Q)
// view as the Pallas kernel (_pallas_thomas.py, which states the kinds). Each operand is a 3-D
// array (P|1, N|1, Q|1); a size-1 dimension is broadcast (stride 0), so a matrix shared by
// every column is read, never copied.
//
// Work is split into tiles of W systems that are contiguous in memory when the systems run
// along Q (axis not last), or one system apart when Q is small (axis last). For each row i
// the tile's W values of every operand are copied into small contiguous buffers (in L1), the
// elimination runs vectorised over the W systems, and c' and y' stay in a per-thread scratch
// of N*W values (sized to stay in L2), so memory sees each input read once and x written
// once. Tiles are shared out over std::threads.
//
// Built on first use by tridiax/_native.py against jax.ffi.include_dir().

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Operand {
  const void* data;
  int64_t sp, sn, sq;  // element strides along P, N, Q (0 where broadcast)
  int64_t n;           // rows held (1 if broadcast along the solve axis)
};

Operand MakeOperand(const ffi::AnyBuffer& buf) {
  auto d = buf.dimensions();
  Operand op;
  op.data = buf.untyped_data();
  op.n = d[1];
  op.sq = d[2] > 1 ? 1 : 0;
  op.sn = d[1] > 1 ? d[2] : 0;
  op.sp = d[0] > 1 ? d[1] * d[2] : 0;
  return op;
}

enum Kind : int64_t { kThomas = 0, kFactored = 1, kPeriodic = 2, kPivoted = 3 };

// The size LAPACK's gtsv compares to choose a pivot: |x| for real x, |Re x| + |Im x| (cabs1)
// for complex x, which needs no square root.
template <typename T>
T Magnitude(T x) { return std::abs(x); }
template <typename R>
R Magnitude(std::complex<R> x) { return std::abs(x.real()) + std::abs(x.imag()); }

// The Sherman-Morrison split of a periodic system (tridiax/_periodic.py, `split`): gamma =
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

// The cores the kernels share their tiles over (read once: the call costs microseconds).
int64_t Cores() {
  static const int64_t cores = std::max<unsigned>(1, std::thread::hardware_concurrency());
  return cores;
}

template <typename T>
class Solver {
 public:
  Solver(const Operand* ops, T* out, int64_t P, int64_t N, int64_t Q, bool transposed,
         int64_t kind)
      : ops_{ops[0], ops[1], ops[2], ops[3]}, out_(out), P_(P), N_(N), Q_(Q),
        transposed_(transposed), kind_(kind) {
    along_q_ = Q_ >= 16;
    // W systems per tile: enough to vectorise, few enough that the per-thread scratch stays
    // in cache (measured on a 2-core EPYC, N = 100: 512 along Q, 16 along P were fastest).
    const int64_t bytes = static_cast<int64_t>(sizeof(T)) * N_;
    const int64_t columns = kind_ == kPivoted ? 4 : kind_ == kPeriodic ? 3 : 2;
    // Never fewer than a cache line of systems along Q: for long systems (N above ~65 000)
    // the scratch no longer fits in L2 whatever W is, and W = 1 made every row a scalar
    // access 4*Q bytes from the last (30x the memory floor); with a line of systems the
    // scratch streams through memory instead, at full vector width.
    const int64_t line = std::max<int64_t>(1, 64 / static_cast<int64_t>(sizeof(T)));
    int64_t w = along_q_ ? (int64_t{1} << 20) / (columns * bytes)
                         : std::clamp<int64_t>((int64_t{1} << 16) / (6 * bytes), 1, 16);
    if (along_q_ && w < line) {
      // The scratch streams from memory anyway: split Q evenly over the cores, in whole lines.
      const int64_t share = (Q_ + Cores() - 1) / Cores();
      w = std::clamp<int64_t>((share + line - 1) / line * line, line, 512);
    } else if (along_q_) {
      w = std::min<int64_t>(w, 512);
    }
    if (w > 8) w -= w % 8;
    w_ = std::min<int64_t>(w, along_q_ ? Q_ : P_);
    tiles_per_line_ = along_q_ ? (Q_ + w_ - 1) / w_ : (P_ + w_ - 1) / w_;
    tiles_ = tiles_per_line_ * (along_q_ ? P_ : Q_);
  }

  int64_t tiles() const { return tiles_; }
  int64_t width() const { return w_; }
  // Scratch values one thread needs: c', y', z' (periodic) and a fourth row store (pivoted)
  // (N*W each), 4 row buffers, 3 buffers for periodic corners or the pivoted sweep's state,
  // gathered operands.
  int64_t scratch_size() const { return (4 * N_ + 7 + (along_q_ ? 0 : 4 * N_)) * w_; }

  // Solve tiles [begin, end) with the caller's scratch of scratch_size() values.
  void Run(int64_t begin, int64_t end, T* scratch) const {
    for (int64_t t = begin; t < end; ++t) SolveTile(t, scratch, t == begin);
  }

 private:
  struct Tile {
    int64_t p, q, w;       // first system and number of systems
    T* buf;                // W values for one row of a broadcast or strided operand
    const T* gathered[4];  // along P: operands copied to (N|1, W) in scratch, else null
  };

  // W contiguous values of row i of operand `k` for the tile's systems.
  const T* Row(int k, int64_t i, Tile& tile, T* buf) const {
    const Operand& op = ops_[k];
    if (op.n == 1) i = 0;
    if (tile.gathered[k] != nullptr) return tile.gathered[k] + i * w_;
    const T* src = static_cast<const T*>(op.data) + i * op.sn + tile.p * op.sp + tile.q * op.sq;
    if (op.sq == 1) return src;  // systems contiguous: read in place
    std::fill(buf, buf + tile.w, *src);  // broadcast along Q
    return buf;
  }

  // Along P, the systems of a tile are N*Q values apart: copy each operand's tile into
  // scratch as (N, W), a transpose in cache. Row by row, the W source lines stay in L1 while
  // a row of W values is written contiguously.
  void Gather(int k, Tile& tile, T* dst) const {
    const Operand& op = ops_[k];
    const T* base = static_cast<const T*>(op.data) + tile.p * op.sp + tile.q * op.sq;
    const int64_t w = op.sp == 0 ? w_ : tile.w, sp = op.sp;
    for (int64_t i = 0; i < op.n; ++i) {
      const T* src = base + i * op.sn;
      T* __restrict__ row = dst + i * w_;
      for (int64_t s = 0; s < w; ++s) row[s] = src[s * sp];
    }
    tile.gathered[k] = dst;
  }

  // An operand broadcast along P (and Q, or Q == 1) is the same in every tile: gathered once
  // per thread, on its first tile.
  bool SameInEveryTile(int k) const { return ops_[k].sp == 0 && (ops_[k].sq == 0 || Q_ == 1); }

  void SolveTile(int64_t t, T* scratch, bool first_of_thread) const {
    const int64_t line = t / tiles_per_line_, first = (t % tiles_per_line_) * w_;
    Tile tile;
    tile.p = along_q_ ? line : first;
    tile.q = along_q_ ? first : line;
    tile.w = std::min(w_, (along_q_ ? Q_ : P_) - first);
    const int64_t N = N_, W = w_, w = tile.w;
    T* c = scratch;                    // c'[i*W + s]
    T* y = c + N * W;                  // y'[i*W + s], then x
    T* z = y + N * W;                  // periodic: z'[i*W + s], then z
    T* v = z + N * W;                  // pivoted: 1/pivot[i*W + s]
    T* bufs = v + N * W;               // 4 row buffers of W, then 3 for corners or state
    for (int k = 0; k < 4; ++k) tile.gathered[k] = nullptr;
    if (!along_q_) {
      T* g = bufs + 7 * W;
      for (int k = 0; k < 4; ++k) {
        if (first_of_thread || !SameInEveryTile(k)) {
          Gather(k, tile, g + k * N * W);
        } else {
          tile.gathered[k] = g + k * N * W;
        }
      }
    }
    const int kl = transposed_ ? 2 : 0, kd = 1, ku = transposed_ ? 0 : 2, kb = 3;
    auto sub = [&](int64_t i) { return Row(kl, transposed_ ? i - 1 : i, tile, bufs); };
    auto dia = [&](int64_t i) { return Row(kd, i, tile, bufs + W); };
    auto sup = [&](int64_t i) {
      return Row(ku, transposed_ ? std::min<int64_t>(i + 1, N - 1) : i, tile, bufs + 2 * W);
    };
    auto rhs = [&](int64_t i) { return Row(kb, i, tile, bufs + 3 * W); };

    if (kind_ == kFactored) {
      Factored(sub, dia, sup, rhs, y, W, w);
    } else if (kind_ == kThomas) {
      Eliminate(sub, dia, sup, rhs, c, y, W, w);
      BackSubstitute(c, y, W, w);
    } else if (kind_ == kPivoted) {
      Pivoted(sub, dia, sup, rhs, bufs + 4 * W, v, c, z, y, W, w);
    } else {
      // Corners of A (A^T when transposed): alpha = A[0, N-1], beta = A[N-1, 0].
      T* alpha = bufs + 4 * W;
      T* beta = bufs + 5 * W;
      const T* lo0 = Row(0, 0, tile, bufs);
      std::copy(lo0, lo0 + w, transposed_ ? beta : alpha);
      const T* upn = Row(2, N - 1, tile, bufs);
      std::copy(upn, upn + w, transposed_ ? alpha : beta);
      Periodic(sub, dia, sup, rhs, alpha, beta, bufs + 6 * W, c, y, z, W, w);
    }
    Scatter(tile, y);
  }

  // Thomas: forward elimination into c' and y'; BackSubstitute() then overwrites y' with x.
  template <typename Sub, typename Dia, typename Sup, typename Rhs>
  void Eliminate(Sub sub, Dia dia, Sup sup, Rhs rhs, T* c, T* y, int64_t W, int64_t w) const {
    {
      const T *__restrict__ d0 = dia(0), *__restrict__ u0 = sup(0), *__restrict__ b0 = rhs(0);
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) {
        const T r = T(1) / d0[s];
        c[s] = u0[s] * r;
        y[s] = b0[s] * r;
      }
    }
    for (int64_t i = 1; i < N_; ++i) {
      const T *__restrict__ a = sub(i), *__restrict__ d = dia(i), *__restrict__ u = sup(i),
                            *__restrict__ b = rhs(i);
      const T* __restrict__ cp = c + (i - 1) * W;
      const T* __restrict__ yp = y + (i - 1) * W;
      T* __restrict__ ci = c + i * W;
      T* __restrict__ yi = y + i * W;
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) {
        const T r = T(1) / (d[s] - a[s] * cp[s]);
        ci[s] = u[s] * r;
        yi[s] = (b[s] - a[s] * yp[s]) * r;
      }
    }
  }

  void BackSubstitute(const T* c, T* y, int64_t W, int64_t w) const {
    for (int64_t i = N_ - 2; i >= 0; --i) {
      const T* __restrict__ ci = c + i * W;
      const T* __restrict__ xn = y + (i + 1) * W;
      T* __restrict__ yi = y + i * W;
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) yi[s] -= ci[s] * xn[s];
    }
  }

  // Gaussian elimination with partial pivoting (row interchanges), as LAPACK's gtsv: at step i
  // the pending row (a, c | f) (its entries in columns i and i+1, and its right-hand side) and
  // row i+1 of A (sub, d, sup | b) compete for the pivot; the larger |column i| entry becomes
  // row i of U, and the other row, minus m times it, becomes the pending row for step i+1. An
  // interchange makes U's row i (sub, d, sup): one fill-in diagonal U2. U's rows are kept as
  // 1/pivot (inv), U1, U2 and y, then x[i] = (y[i] - U1[i] x[i+1] - U2[i] x[i+2]) / pivot[i].
  // Branch-free, so the W systems of a tile vectorise whichever rows they interchange.
  template <typename Sub, typename Dia, typename Sup, typename Rhs>
  void Pivoted(Sub sub, Dia dia, Sup sup, Rhs rhs, T* state, T* inv, T* u1, T* u2, T* y,
               int64_t W, int64_t w) const {
    const int64_t N = N_;
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
      T* __restrict__ vi = inv + i * W;
      T* __restrict__ u1i = u1 + i * W;
      T* __restrict__ u2i = u2 + i * W;
      T* __restrict__ yi = y + i * W;
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) {
        const T un = fill ? u[s] : T(0);
        const bool swap = Magnitude(l[s]) > Magnitude(pa[s]);
        const T pivot = swap ? l[s] : pa[s];
        const T r = T(1) / pivot;
        const T m = (swap ? pa[s] : l[s]) * r;
        const T k1 = swap ? d[s] : pc[s], k2 = swap ? un : T(0), ky = swap ? b[s] : pf[s];
        const T o1 = swap ? pc[s] : d[s], o2 = swap ? T(0) : un, oy = swap ? pf[s] : b[s];
        vi[s] = r;
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
      const T *__restrict__ vi = inv + i * W, *__restrict__ u1i = u1 + i * W,
                            *__restrict__ u2i = u2 + i * W;
      const T* __restrict__ x1 = y + (i + 1) * W;
      T* __restrict__ xi = y + i * W;
      if (i + 2 < N) {
        const T* __restrict__ x2 = y + (i + 2) * W;
#pragma GCC ivdep
        for (int64_t s = 0; s < w; ++s) xi[s] = (xi[s] - u1i[s] * x1[s] - u2i[s] * x2[s]) * vi[s];
      } else {
#pragma GCC ivdep
        for (int64_t s = 0; s < w; ++s) xi[s] = (xi[s] - u1i[s] * x1[s]) * vi[s];
      }
    }
  }

  // Stored factors A = L D V (sub: L's sub-diagonal l, dia: D = 1/pivots m, sup: V's
  // super-diagonal c'): y[i] = b[i] - l[i]*y[i-1], then x[i] = m[i]*y[i] - c'[i]*x[i+1].
  // Transposed, the accessors read c'[i-1] and l[i+1]: A^T = V^T D L^T is the same sweep.
  template <typename Sub, typename Dia, typename Sup, typename Rhs>
  void Factored(Sub sub, Dia dia, Sup sup, Rhs rhs, T* y, int64_t W, int64_t w) const {
    {
      const T* b0 = rhs(0);
      std::copy(b0, b0 + w, y);
    }
    for (int64_t i = 1; i < N_; ++i) {
      const T *__restrict__ l = sub(i), *__restrict__ b = rhs(i);
      const T* __restrict__ yp = y + (i - 1) * W;
      T* __restrict__ yi = y + i * W;
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) yi[s] = b[s] - l[s] * yp[s];
    }
    {
      const T* __restrict__ m = dia(N_ - 1);
      T* __restrict__ yl = y + (N_ - 1) * W;
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) yl[s] *= m[s];
    }
    for (int64_t i = N_ - 2; i >= 0; --i) {
      const T *__restrict__ m = dia(i), *__restrict__ u = sup(i);
      const T* __restrict__ xn = y + (i + 1) * W;
      T* __restrict__ yi = y + i * W;
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) yi[s] = m[s] * yi[s] - u[s] * xn[s];
    }
  }

  // Periodic, by Sherman-Morrison (tridiax/_periodic.py): A = T' + u v^T, T' the tridiagonal
  // part with d'[0] = d[0] - gamma and d'[N-1] = d[N-1] - alpha*beta/gamma, u = (gamma, 0, ...,
  // 0, beta), v = (1, 0, ..., 0, alpha/gamma), gamma = Split(...) so that T' is never worse than
  // A (no breakdown on a zero d[0]). One forward sweep eliminates T' for y' and for
  // z' = T'^{-1}u together (u is zero between its ends, so z' reads nothing from memory), one
  // backward sweep substitutes both, and x = y - (v.y)/(1 + v.z) z is formed in cache.
  template <typename Sub, typename Dia, typename Sup, typename Rhs>
  void Periodic(Sub sub, Dia dia, Sup sup, Rhs rhs, const T* alpha, const T* beta, T* kappa,
                T* c, T* y, T* z, int64_t W, int64_t w) const {
    const int64_t N = N_;
    T* corr = z + (N - 1) * W;  // -alpha*beta/gamma until row N-1 is eliminated
    {
      const T *__restrict__ d0 = dia(0), *__restrict__ u0 = sup(0), *__restrict__ b0 = rhs(0);
      for (int64_t s = 0; s < w; ++s) {
        const T gamma = Split(d0[s], alpha[s], u0[s]);
        const T r = T(1) / (d0[s] - gamma);
        c[s] = u0[s] * r;
        y[s] = b0[s] * r;
        z[s] = gamma * r;
        kappa[s] = alpha[s] / gamma;
        corr[s] = -alpha[s] * beta[s] / gamma;
      }
    }
    for (int64_t i = 1; i < N; ++i) {
      const bool last = i == N - 1;
      const T *__restrict__ a = sub(i), *__restrict__ d = dia(i), *__restrict__ u = sup(i),
                            *__restrict__ b = rhs(i);
      const T* __restrict__ cp = c + (i - 1) * W;
      const T* __restrict__ yp = y + (i - 1) * W;
      const T* __restrict__ zp = z + (i - 1) * W;
      T* __restrict__ ci = c + i * W;
      T* __restrict__ yi = y + i * W;
      T* __restrict__ zi = z + i * W;
      if (!last) {
#pragma GCC ivdep
        for (int64_t s = 0; s < w; ++s) {
          const T r = T(1) / (d[s] - a[s] * cp[s]);
          ci[s] = u[s] * r;
          yi[s] = (b[s] - a[s] * yp[s]) * r;
          zi[s] = -a[s] * zp[s] * r;
        }
      } else {
        for (int64_t s = 0; s < w; ++s) {
          const T r = T(1) / (d[s] + corr[s] - a[s] * cp[s]);
          yi[s] = (b[s] - a[s] * yp[s]) * r;
          zi[s] = (beta[s] - a[s] * zp[s]) * r;
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

  // Write x (N, W) in scratch to the output, each system contiguously when along P.
  void Scatter(const Tile& tile, const T* x) const {
    T* base = out_ + tile.p * N_ * Q_ + tile.q;
    if (along_q_) {
      for (int64_t i = 0; i < N_; ++i) std::copy(x + i * w_, x + i * w_ + tile.w, base + i * Q_);
    } else {
      for (int64_t s = 0; s < tile.w; ++s) {
        T* dst = base + s * N_ * Q_;
        for (int64_t i = 0; i < N_; ++i) dst[i * Q_] = x[i * w_ + s];
      }
    }
  }

  Operand ops_[4];
  T* out_;
  int64_t P_, N_, Q_;
  bool transposed_;
  int64_t kind_;
  bool along_q_;
  int64_t w_, tiles_per_line_, tiles_;
};

// Share a kernel's tiles out over one thread per core, when each gets enough work to pay for
// starting it. Kernel: tiles(), scratch_size(), Run(begin, end, scratch).
template <typename T, typename Kernel>
void RunTiles(const Kernel& kernel, int64_t work) {
  const int64_t tiles = kernel.tiles();
  const int64_t threads = std::min<int64_t>({Cores(), tiles, std::max<int64_t>(1, work / (1 << 16))});
  auto run = [&](int64_t id) {
    // A small scratch is kept by the thread across calls, so a small solve in a time loop
    // pays no allocation (every kernel writes its scratch before reading it); a large one
    // is freed after the call.
    constexpr int64_t kKept = int64_t{1} << 16;
    thread_local std::vector<T> kept;
    std::vector<T> local;
    std::vector<T>& scratch = kernel.scratch_size() <= kKept ? kept : local;
    if (static_cast<int64_t>(scratch.size()) < kernel.scratch_size()) {
      scratch.resize(kernel.scratch_size());
    }
    const int64_t begin = tiles * id / threads, end = tiles * (id + 1) / threads;
    kernel.Run(begin, end, scratch.data());
  };
  std::vector<std::thread> pool;
  for (int64_t id = 1; id < threads; ++id) pool.emplace_back(run, id);
  run(0);
  for (auto& th : pool) th.join();
}

template <typename T>
void Solve(const Operand* ops, void* out, int64_t P, int64_t N, int64_t Q, bool transposed,
           int64_t kind) {
  RunTiles<T>(Solver<T>(ops, static_cast<T*>(out), P, N, Q, transposed, kind), P * N * Q);
}

// Recurrence: h[t] = act(c[t]*h[prev] + x[t]) over T steps (reversed when `reverse`), with
// c[t] = a[t], or, when `shifted`, a at the previous step's index and zero at the first step.
// A tile is W feature columns, contiguous along Q (W = 512) or N*Q apart along P (W = 16, read
// with a stride; each cache line serves 16 consecutive steps). The state stays in L1.
enum Activation : int64_t { kIdentity = 0, kRelu = 1, kTanh = 2 };

template <typename T>
class Recurrence {
 public:
  Recurrence(const Operand* ops, T* out, int64_t P, int64_t T_, int64_t Q, bool reverse,
             bool shifted, int64_t activation, bool final_only)
      : a_(ops[0]), x_(ops[1]), h0_(ops[2]), out_(out), P_(P), T_(T_), Q_(Q), reverse_(reverse),
        shifted_(shifted), activation_(activation), final_only_(final_only) {
    along_q_ = Q_ >= 16;
    w_ = std::min<int64_t>(along_q_ ? 512 : 16, along_q_ ? Q_ : P_);
    tiles_per_line_ = along_q_ ? (Q_ + w_ - 1) / w_ : (P_ + w_ - 1) / w_;
    tiles_ = tiles_per_line_ * (along_q_ ? P_ : Q_);
  }

  int64_t tiles() const { return tiles_; }
  int64_t scratch_size() const { return 3 * w_; }

  void Run(int64_t begin, int64_t end, T* scratch) const {
    for (int64_t t = begin; t < end; ++t) RunTile(t, scratch);
  }

 private:
  const T* Row(const Operand& op, int64_t t, int64_t p, int64_t q, int64_t w, T* buf) const {
    const T* src = static_cast<const T*>(op.data) + (op.n == 1 ? 0 : t) * op.sn + p * op.sp +
                   q * op.sq;
    const int64_t stride = along_q_ ? op.sq : op.sp;
    if (stride == 1) return src;
    if (stride == 0) {
      std::fill(buf, buf + w, *src);
    } else {
      for (int64_t s = 0; s < w; ++s) buf[s] = src[s * stride];
    }
    return buf;
  }

  void Store(int64_t t, int64_t p, int64_t q, int64_t w, const T* h) const {
    const int64_t rows = final_only_ ? 1 : T_;
    T* dst = out_ + p * rows * Q_ + t * Q_ + q;
    if (along_q_) {
      std::copy(h, h + w, dst);
    } else {
      for (int64_t s = 0; s < w; ++s) dst[s * rows * Q_] = h[s];
    }
  }

  void RunTile(int64_t tile, T* scratch) const {
    const int64_t line = tile / tiles_per_line_, first = (tile % tiles_per_line_) * w_;
    const int64_t p = along_q_ ? line : first, q = along_q_ ? first : line;
    const int64_t w = std::min(w_, (along_q_ ? Q_ : P_) - first);
    T* __restrict__ h = scratch;
    T* abuf = scratch + w_;
    T* xbuf = abuf + w_;
    const T* h0 = Row(h0_, 0, p, q, w, xbuf);
    std::copy(h0, h0 + w, h);
    for (int64_t k = 0; k < T_; ++k) {
      const int64_t t = reverse_ ? T_ - 1 - k : k;
      const T* __restrict__ x = Row(x_, t, p, q, w, xbuf);
      if (shifted_ && k == 0) {
#pragma GCC ivdep
        for (int64_t s = 0; s < w; ++s) h[s] = x[s];
      } else {
        const int64_t ta = shifted_ ? (reverse_ ? t + 1 : t - 1) : t;
        const T* __restrict__ a = Row(a_, ta, p, q, w, abuf);
#pragma GCC ivdep
        for (int64_t s = 0; s < w; ++s) h[s] = a[s] * h[s] + x[s];
      }
      Activate(h, w);
      if (!final_only_) Store(t, p, q, w, h);
    }
    if (final_only_) Store(0, p, q, w, h);
  }

  void Activate(T* __restrict__ h, int64_t w) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (activation_ == kRelu) {
        for (int64_t s = 0; s < w; ++s) h[s] = h[s] > T(0) ? h[s] : T(0);
      } else if (activation_ == kTanh) {
        for (int64_t s = 0; s < w; ++s) h[s] = std::tanh(h[s]);
      }
    }
  }

  Operand a_, x_, h0_;
  T* out_;
  int64_t P_, T_, Q_;
  bool reverse_, shifted_;
  int64_t activation_;
  bool final_only_;
  bool along_q_;
  int64_t w_, tiles_per_line_, tiles_;
};

template <typename T>
void Recur(const Operand* ops, void* out, int64_t P, int64_t N, int64_t Q, bool reverse,
           bool shifted, int64_t activation, bool final_only) {
  RunTiles<T>(Recurrence<T>(ops, static_cast<T*>(out), P, N, Q, reverse, shifted, activation,
                            final_only),
              P * N * Q);
}

ffi::Error ThomasImpl(ffi::AnyBuffer lower, ffi::AnyBuffer diag, ffi::AnyBuffer upper,
                      ffi::AnyBuffer rhs, ffi::Result<ffi::AnyBuffer> x, bool transposed,
                      int64_t kind) {
  auto dims = x->dimensions();
  if (dims.size() != 3) return ffi::Error::InvalidArgument("tridiax: expected (P, N, Q)");
  const int64_t P = dims[0], N = dims[1], Q = dims[2];
  if (P == 0 || N == 0 || Q == 0) return ffi::Error::Success();
  const Operand ops[4] = {MakeOperand(lower), MakeOperand(diag), MakeOperand(upper),
                          MakeOperand(rhs)};
  void* out = x->untyped_data();
  switch (x->element_type()) {
    case ffi::DataType::F32: Solve<float>(ops, out, P, N, Q, transposed, kind); break;
    case ffi::DataType::F64: Solve<double>(ops, out, P, N, Q, transposed, kind); break;
    case ffi::DataType::C64: Solve<std::complex<float>>(ops, out, P, N, Q, transposed, kind); break;
    case ffi::DataType::C128: Solve<std::complex<double>>(ops, out, P, N, Q, transposed, kind); break;
    default: return ffi::Error::InvalidArgument("tridiax: unsupported dtype");
  }
  return ffi::Error::Success();
}

ffi::Error RecurrenceImpl(ffi::AnyBuffer a, ffi::AnyBuffer x, ffi::AnyBuffer h0,
                          ffi::Result<ffi::AnyBuffer> h, bool reverse, bool shifted,
                          int64_t activation, bool final_only) {
  auto dims = h->dimensions();
  if (dims.size() != 3) return ffi::Error::InvalidArgument("tridiax: expected (P, T, Q)");
  const int64_t P = dims[0], Q = dims[2];
  const int64_t T = std::max(a.dimensions()[1], x.dimensions()[1]);
  if (P == 0 || T == 0 || Q == 0) return ffi::Error::Success();
  if (activation != kIdentity && (h->element_type() == ffi::DataType::C64 ||
                                  h->element_type() == ffi::DataType::C128)) {
    return ffi::Error::InvalidArgument("tridiax: activations are for real dtypes");
  }
  const Operand ops[3] = {MakeOperand(a), MakeOperand(x), MakeOperand(h0)};
  void* out = h->untyped_data();
  const auto args = std::make_tuple(reverse, shifted, activation, final_only);
  switch (h->element_type()) {
    case ffi::DataType::F32:
      std::apply([&](auto... r) { Recur<float>(ops, out, P, T, Q, r...); }, args);
      break;
    case ffi::DataType::F64:
      std::apply([&](auto... r) { Recur<double>(ops, out, P, T, Q, r...); }, args);
      break;
    case ffi::DataType::C64:
      std::apply([&](auto... r) { Recur<std::complex<float>>(ops, out, P, T, Q, r...); }, args);
      break;
    case ffi::DataType::C128:
      std::apply([&](auto... r) { Recur<std::complex<double>>(ops, out, P, T, Q, r...); }, args);
      break;
    default: return ffi::Error::InvalidArgument("tridiax: unsupported dtype");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxRecurrenceCpu, RecurrenceImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("reverse")
                                  .Attr<bool>("shifted")
                                  .Attr<int64_t>("activation")
                                  .Attr<bool>("final_only"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TridiaxThomasCpu, ThomasImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("transposed")
                                  .Attr<int64_t>("kind"));
