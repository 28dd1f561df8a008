// Tridiagonal solves of whole systems (TridiaxThomasCpu), by kind: Thomas's algorithm, a stored
// factorization, periodic systems (Sherman-Morrison) and Gaussian elimination with partial
// pivoting (as LAPACK's gtsv). Same algorithms and band conventions as the Pallas kernels
// (tridiax/_tridiagonal/pallas_triton.py states the kinds). Every lane is swept row after row
// in the sequential sweep's order, dividing by each pivot, in tiles of lanes (tiles.h).

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>

#include "kernels.h"
#include "sweeps.h"
#include "threads.h"
#include "tiles.h"

namespace tridiax::cpu {
namespace {

constexpr int64_t kWholeTileBytes = 1 << 18;  // the most a tile's rows read whole may take

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

// Stored factors A = L D V (sub: L's sub-diagonal l, dia: D = 1/pivots m, sup: V's
// super-diagonal c'): y[i] = b[i] - l[i]*y[i-1], then x[i] = m[i]*y[i] - c'[i]*x[i+1].
// Transposed, the accessors read c'[i-1] and l[i+1]: A^T = V^T D L^T is the same sweep.
template <typename T, typename Sub, typename Dia, typename Sup, typename Rhs>
void Factored(Sub sub, Dia dia, Sup sup, Rhs rhs, T* y, int64_t W, int64_t w, int64_t N) {
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
template <typename T, typename Sub, typename Dia, typename Sup, typename Rhs>
void Periodic(Sub sub, Dia dia, Sup sup, Rhs rhs, const T* alpha, const T* beta, T* kappa,
              T* c, T* y, T* z, int64_t W, int64_t w, int64_t N) {
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

template <typename T>
class WholeSolver {
 public:
  WholeSolver(const Operand* ops, T* out, const Geometry& g, bool transposed, int64_t kind)
      : g_(g), out_(out), transposed_(transposed), kind_(kind) {
    for (int k = 0; k < 4; ++k) ops_[k] = ops[k];
  }

  int64_t tiles() const { return g_.tiles(); }
  // c', y', z'/U2, pivots (rows x W each), 4 reader blocks, kSpareRows spare rows and a whole
  // tile's stage.
  int64_t scratch_size() const {
    return (4 * g_.chunk + 4 * ReaderRows() + kSpareRows) * g_.W + kBlock * g_.N;
  }

  void Run(int64_t begin, int64_t end, T* scratch) const {
    for (int64_t t = begin; t < end; ++t) SolveTile(g_.At(t), scratch);
  }

 private:
  // Rows of a RowReader block: every row of a tile of whole batch-first systems (rows
  // contiguous, lanes along P) while four operands' blocks take at most kWholeTileBytes,
  // kRows otherwise.
  int64_t ReaderRows() const {
    const bool whole = g_.lanes == kLanesP && g_.Q == 1 &&
                       4 * g_.N * g_.W * static_cast<int64_t>(sizeof(T)) <= kWholeTileBytes;
    return whole ? std::max(g_.N, kRows) : kRows;
  }

  void SolveTile(const Tile& tile, T* scratch) const {
    const int64_t W = g_.W, len = tile.len, w = tile.w;
    T* c = scratch;
    T* y = c + len * W;
    T* z = y + len * W;
    T* v = z + len * W;
    const int64_t block_rows = ReaderRows();
    T* blocks = v + len * W;
    T* spare = blocks + 4 * block_rows * W;  // kSpareRows rows of W
    RowReader<T> rd[4];
    OpenBands(rd, ops_, g_, tile, blocks, block_rows,
              block_rows == kRows ? nullptr : spare + kSpareRows * W);
    const int kl = transposed_ ? 2 : 0, ku = transposed_ ? 0 : 2;
    // sub(i), i >= 1, and sup(i), i <= len - 2, inside the tile's rows.
    auto sub = [&](int64_t i) { return rd[kl].Row(transposed_ ? i - 1 : i); };
    auto dia = [&](int64_t i) { return rd[1].Row(i); };
    auto sup = [&](int64_t i) { return rd[ku].Row(transposed_ ? i + 1 : i); };
    auto rhs = [&](int64_t i) { return rd[3].Row(i); };

    if (kind_ == kFactored) {
      Factored<T>(sub, dia, sup, rhs, y, W, w, len);
    } else if (kind_ == kThomas) {
      Eliminate<T>(sub, dia, sup, rhs, nullptr, nullptr, c, y, W, w, len);
      BackSubstitute(c, y, W, w, len);
    } else if (kind_ == kPivoted) {
      Pivoted<T>(sub, dia, sup, rhs, spare, v, c, z, y, W, w, len);
    } else {
      // Corners of A (A^T when transposed): alpha = A[0, N-1], beta = A[N-1, 0].
      T* alpha = spare;
      T* beta = spare + W;
      const T* lo0 = rd[0].Row(0);
      std::copy(lo0, lo0 + w, transposed_ ? beta : alpha);
      const T* upn = rd[2].Row(len - 1);
      std::copy(upn, upn + w, transposed_ ? alpha : beta);
      Periodic<T>(sub, dia, sup, rhs, alpha, beta, spare + 2 * W, c, y, z, W, w, len);
    }
    const auto st = g_.Of(tile, g_.N * g_.Q, g_.Q, 1, g_.chunk);
    StoreRows(out_, st, g_.Q, w, W, 0, len, y);
  }

  Geometry g_;
  Operand ops_[4];
  T* out_;
  bool transposed_;
  int64_t kind_;
};

}  // namespace

ffi::Error ThomasImpl(ffi::AnyBuffer lower, ffi::AnyBuffer diag, ffi::AnyBuffer upper,
                      ffi::AnyBuffer rhs, ffi::Result<ffi::AnyBuffer> x, bool transposed,
                      int64_t kind, int64_t lanes, int64_t width) {
  auto dims = x->dimensions();
  if (dims.size() != 3) return ffi::Error::InvalidArgument("tridiax: expected (P, N, Q)");
  if (kind < kThomas || kind > kPivoted) {
    return ffi::Error::InvalidArgument("tridiax: unknown tridiagonal kind");
  }
  const int64_t P = dims[0], N = dims[1], Q = dims[2];
  if (P == 0 || N == 0 || Q == 0) return ffi::Error::Success();
  const Operand ops[4] = {MakeOperand(lower), MakeOperand(diag), MakeOperand(upper),
                          MakeOperand(rhs)};
  const Geometry g(P, N, Q, 0, lanes, width);
  void* out = x->untyped_data();
  const bool ok = ForType(x->element_type(), [&](auto zero) {
    using T = decltype(zero);
    RunTiles<T>(WholeSolver<T>(ops, static_cast<T*>(out), g, transposed, kind), P * N * Q);
  });
  return ok ? ffi::Error::Success() : Unsupported();
}

}  // namespace tridiax::cpu
