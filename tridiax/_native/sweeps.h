// The tridiagonal sweeps that whole systems (solve.cc) and the partition method's chunks
// (chunks.cc) share: Thomas's elimination and back substitution, and Gaussian elimination with
// partial pivoting, over a tile's W lanes, each lane row after row in the sweep's order.
//
// Row i of the matrix swept reads sub[i]*x[i-1] + d[i]*x[i] + sup[i]*x[i+1] = b[i]; with
// `transposed` the transposed matrix is read: sub[i] = upper[i-1], sup[i] = lower[i+1]. The
// sweeps take the rows through accessors, sub(i), dia(i), sup(i), rhs(i), each a pointer to W
// values (one per lane) of row i.
//
// The arithmetic here must round each operation on its own (no multiply-add fused into one
// rounding), so that a system gets the sequential sweep's answer bit for bit in any tile, batch
// and layout: only sources compiled with -ffp-contract=off may include this header, and the
// build (tridiax/_native/compiler.py) defines TRIDIAX_FP_CONTRACT_OFF for those alone. Internal
// linkage, a copy per source, as lanes.h explains.

#pragma once

#if !defined(TRIDIAX_FP_CONTRACT_OFF)
#error "sweeps.h holds arithmetic that must not be contracted: include it only from sources compiled with -ffp-contract=off (TRIDIAX_FP_CONTRACT_OFF)"
#endif

#include <algorithm>
#include <cstdint>

#include "lanes.h"
#include "tiles.h"

namespace tridiax::cpu {
namespace {

// The kinds of a whole-system solve (TridiaxThomasCpu's `kind`).
enum Kind : int64_t { kThomas = 0, kFactored = 1, kPeriodic = 2, kPivoted = 3 };

constexpr int64_t kSpareRows = 32;  // a sweep tile's rows of per-lane values

// The four band operands' readers of one tile: lower, diag, upper and rhs (ops[0..3]), their
// blocks of `block_rows` rows from `blocks` (see RowReader; `stage` for a whole tile's rows).
template <typename T>
void OpenBands(RowReader<T>* rd, const Operand* ops, const Geometry& g, const Tile& tile,
               T* blocks, int64_t block_rows, T* stage) {
  for (int k = 0; k < 4; ++k) {
    const auto st = g.Of(tile, ops[k].sp, ops[k].sn, ops[k].sq, g.chunk);
    rd[k].Init(static_cast<const T*>(ops[k].data), st, ops[k].sn, tile.w, g.W, tile.len,
               blocks + k * block_rows * g.W, block_rows, stage);
  }
}

// Thomas forward elimination of rows [0, n), dividing by each pivot p[i] = d[i] -
// sub[i] c'[i-1]: c'[i] = sup[i] / p[i] into c (c'[n-1] = 0: row n-1's sup is never read),
// y'[i] = (b[i] - sub[i] y'[i-1]) / p[i] into y. `b0` and `bl`, if given, replace the
// right-hand sides of rows 0 and n-1 (n >= 2 for `bl`).
template <typename T, typename Sub, typename Dia, typename Sup, typename Rhs>
void Eliminate(Sub sub, Dia dia, Sup sup, Rhs rhs, const T* b0, const T* bl, T* c, T* y,
               int64_t W, int64_t w, int64_t n) {
  {
    const T* __restrict__ d0 = dia(0);
    const T* __restrict__ r0 = b0 != nullptr ? b0 : rhs(0);
    const T* __restrict__ u0 = n > 1 ? sup(0) : nullptr;
#pragma GCC ivdep
    for (int64_t s = 0; s < w; ++s) {
      c[s] = n > 1 ? u0[s] / d0[s] : T(0);
      y[s] = r0[s] / d0[s];
    }
  }
  for (int64_t i = 1; i < n; ++i) {
    const bool last = i == n - 1;
    const T *__restrict__ a = sub(i), *__restrict__ d = dia(i);
    const T* __restrict__ b = last && bl != nullptr ? bl : rhs(i);
    const T* __restrict__ cp = c + (i - 1) * W;
    const T* __restrict__ yp = y + (i - 1) * W;
    T* __restrict__ ci = c + i * W;
    T* __restrict__ yi = y + i * W;
    if (!last) {
      const T* __restrict__ u = sup(i);
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) {
        const T p = d[s] - a[s] * cp[s];
        ci[s] = u[s] / p;
        yi[s] = (b[s] - a[s] * yp[s]) / p;
      }
    } else {
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) {
        ci[s] = T(0);
        yi[s] = (b[s] - a[s] * yp[s]) / (d[s] - a[s] * cp[s]);
      }
    }
  }
}

// x[i] = y'[i] - c'[i] x[i+1] in place in y, from x[n-1] = y'[n-1].
template <typename T>
void BackSubstitute(const T* c, T* y, int64_t W, int64_t w, int64_t n) {
  for (int64_t i = n - 2; i >= 0; --i) {
    const T* __restrict__ ci = c + i * W;
    T* __restrict__ yi = y + i * W;
    const T* __restrict__ yn = y + (i + 1) * W;
#pragma GCC ivdep
    for (int64_t s = 0; s < w; ++s) yi[s] -= ci[s] * yn[s];
  }
}

// Gaussian elimination with partial pivoting (row interchanges), as LAPACK's gtsv: at step i
// the pending row (a, c | f) (its entries in columns i and i+1, and its right-hand side) and
// row i+1 of A (sub, d, sup | b) compete for the pivot; the larger |column i| entry becomes
// row i of U, and the other row, minus m times it, becomes the pending row for step i+1. An
// interchange makes U's row i (sub, d, sup): one fill-in diagonal U2. U's rows are kept as
// pivot, U1, U2 and y, then x[i] = (y[i] - U1[i] x[i+1] - U2[i] x[i+2]) / pivot[i]; the
// multiplier divides by the pivot too (gtsv's order of operations).
// Branch-free, so the W systems of a tile vectorise whichever rows they interchange.
template <typename T, typename Sub, typename Dia, typename Sup, typename Rhs>
void Pivoted(Sub sub, Dia dia, Sup sup, Rhs rhs, T* state, T* pivots, T* u1, T* u2, T* y,
             int64_t W, int64_t w, int64_t N) {
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
    T* __restrict__ vi = pivots + i * W;
    T* __restrict__ u1i = u1 + i * W;
    T* __restrict__ u2i = u2 + i * W;
    T* __restrict__ yi = y + i * W;
#pragma GCC ivdep
    for (int64_t s = 0; s < w; ++s) {
      const T un = fill ? u[s] : T(0);
      const bool swap = Magnitude(l[s]) > Magnitude(pa[s]);
      const T pivot = swap ? l[s] : pa[s];
      const T m = (swap ? pa[s] : l[s]) / pivot;
      const T k1 = swap ? d[s] : pc[s], k2 = swap ? un : T(0), ky = swap ? b[s] : pf[s];
      const T o1 = swap ? pc[s] : d[s], o2 = swap ? T(0) : un, oy = swap ? pf[s] : b[s];
      vi[s] = pivot;
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
    const T *__restrict__ vi = pivots + i * W, *__restrict__ u1i = u1 + i * W,
                          *__restrict__ u2i = u2 + i * W;
    const T* __restrict__ x1 = y + (i + 1) * W;
    T* __restrict__ xi = y + i * W;
    if (i + 2 < N) {
      const T* __restrict__ x2 = y + (i + 2) * W;
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) xi[s] = (xi[s] - u1i[s] * x1[s] - u2i[s] * x2[s]) / vi[s];
    } else {
#pragma GCC ivdep
      for (int64_t s = 0; s < w; ++s) xi[s] = (xi[s] - u1i[s] * x1[s]) / vi[s];
    }
  }
}

}  // namespace
}  // namespace tridiax::cpu
