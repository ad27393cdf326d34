// The device-side per-column work as ZF_HD functors: a CUDA kernel (cuda space) or a TBB loop
// (host space) runs the very same code.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../adamw.hpp"
#include "../detail/macros.hpp"
#include "../numeric.hpp"
#include "../params.hpp"

namespace zenflow::device {

ZF_HD ZF_FORCEINLINE bool is_finite(float x) noexcept { return x - x == 0.0f; }

// The gradient pass's sums have one canonical evaluation order, which both spaces follow, so
// the column scores and the clipping norm are bit-identical on the host and on a GPU (and the
// two select the same columns):
//  - a column (or a vector chunk) of n values: lane j in [0, 32) sums values j, j+32, j+64, ...
//    in order; then the 32 lane sums are combined by lane_tree (what a warp's shuffle-down
//    reduction computes);
//  - the global sum of squares: per group of 32 consecutive columns of a matrix (or chunks of a
//    vector) the lane_tree of their sums (absent columns count as 0), these group partials listed
//    matrix after matrix, then vector after vector; entry e goes to lane e % 256, each lane sums
//    its entries in order, and the 256 lane sums are combined by lane_tree.
// Every term (|x| and x*x of a float, in double) is exact; only the additions round, and they
// happen in this order everywhere.
inline constexpr unsigned column_lanes = 32;
inline constexpr unsigned total_lanes = 256;

// v[j] += v[j + off] for off = lanes/2, ..., 1; the result is v[0].
template <class T>
ZF_HD ZF_FORCEINLINE T lane_tree(T* v, unsigned lanes) noexcept {
  for (unsigned off = lanes / 2; off > 0; off /= 2)
    for (unsigned j = 0; j < off; ++j) v[j] = v[j] + v[j + off];
  return v[0];
}

// Statistics of one column of the raw gradient: L1, sum of squares, any non-finite value.
template <class G>
struct column_stats_fn {
  const G* grad;
  std::size_t rows, cols;
  matrix_layout layout;
  double* l1;
  double* sumsq;
  unsigned char* bad;
  ZF_HD void operator()(std::size_t c) const {
    double a[column_lanes], q[column_lanes];
    for (unsigned j = 0; j < column_lanes; ++j) a[j] = q[j] = 0.0;
    bool finite = true;
    const bool contiguous = layout == matrix_layout::column_contiguous;
    const G* g = grad + (contiguous ? c * rows : c);
    const std::size_t stride = contiguous ? 1 : cols, whole = rows - rows % column_lanes;
    // Whole rounds of 32 values, then the rest. The fixed trip count, the branch-free |x| and
    // the finite flag taken once a round let the compiler vectorise the host's loop (a branch
    // on the sign made it 5x slower); each lane still adds its terms in row order.
    for (std::size_t i0 = 0; i0 < whole; i0 += column_lanes) {
      bool ok = true;
      for (unsigned j = 0; j < column_lanes; ++j) ok &= add(to_float(g[(i0 + j) * stride]), a[j], q[j]);
      finite = finite && ok;
    }
    for (std::size_t i = whole; i < rows; ++i)
      finite = add(to_float(g[i * stride]), a[i - whole], q[i - whole]) && finite;
    l1[c] = lane_tree(a, column_lanes);
    sumsq[c] = lane_tree(q, column_lanes);
    bad[c] = finite ? 0 : 1;
  }
  // One value into a lane's sums (|x| and x*x in double, both exact); whether it is finite.
  // (fabs: |-0| adds +0, which leaves a sum begun at +0 as it is, as the GPU's kernel does.)
  ZF_HD static ZF_FORCEINLINE bool add(float x, double& a, double& q) noexcept {
    const double d = x;
    a += std::fabs(d);
    q += d * d;
    return is_finite(x);
  }
};

// Statistics of one chunk of a vector's raw gradient (the chunk is summed like a column).
template <class G>
struct chunk_stats_fn {
  const G* grad;
  std::size_t n, chunk;
  double* sumsq;
  unsigned char* bad;
  ZF_HD void operator()(std::size_t k) const {
    double q[column_lanes];
    for (unsigned j = 0; j < column_lanes; ++j) q[j] = 0.0;
    bool finite = true;
    const std::size_t begin = k * chunk, end = (k + 1) * chunk < n ? (k + 1) * chunk : n;
    const std::size_t whole = begin + (end - begin) / column_lanes * column_lanes;
    auto add = [&q](float x, unsigned j) {  // as in column_stats_fn, without the L1 sums
      q[j] += double(x) * double(x);
      return is_finite(x);
    };
    for (std::size_t i0 = begin; i0 < whole; i0 += column_lanes) {
      bool ok = true;
      for (unsigned j = 0; j < column_lanes; ++j) ok &= add(to_float(grad[i0 + j]), j);
      finite = finite && ok;
    }
    for (std::size_t i = whole; i < end; ++i) finite = add(to_float(grad[i]), unsigned(i - whole)) && finite;
    sumsq[k] = lane_tree(q, column_lanes);
    bad[k] = finite ? 0 : 1;
  }
};

// Group partials of per-column (or per-chunk) sums: out[g] = lane_tree of sums[32g .. 32g+32).
inline void group_partials(const double* sums, std::size_t n, double* out) noexcept {
  for (std::size_t g = 0; g * column_lanes < n; ++g) {
    double v[column_lanes];
    for (unsigned j = 0; j < column_lanes; ++j) v[j] = g * column_lanes + j < n ? sums[g * column_lanes + j] : 0.0;
    out[g] = lane_tree(v, column_lanes);
  }
}

// The global sum of the group partials in the canonical order.
inline double canonical_total(const double* partials, std::size_t n) noexcept {
  double v[total_lanes] = {};
  for (std::size_t e = 0; e < n; ++e) v[e % total_lanes] += partials[e];
  return lane_tree(v, total_lanes);
}

// The AdamW of element e = s*rows + i of a selected column slot s (column c), with the slot's
// coefficients: the one per-element body of the selective update on every space. A null master
// (fp32 params only) means the param is the master: the same arithmetic, updated in place.
template <class P, class G>
ZF_HD ZF_FORCEINLINE void column_adamw_element(P* param, const G* grad, float* master, float* exp_avg,
                                               float* exp_avg_sq, std::size_t e, std::size_t at, float factor,
                                               const adamw_coeffs& co) noexcept {
  if constexpr (std::is_same_v<P, float>) {
    if (!master) {
      adamw_update(param[at], exp_avg[e], exp_avg_sq[e], mul_rn(to_float(grad[at]), factor), co);
      return;
    }
  }
  adamw_update(master[e], exp_avg[e], exp_avg_sq[e], mul_rn(to_float(grad[at]), factor), co);
  param[at] = from_float<P>(master[e]);
}

// AdamW on selected column slot s of a matrix: the fp32 master, moments and count of the slot
// live in compact [k][rows] device arrays; the param and gradient in the trainer's layout.
template <class P, class G>
struct column_adamw_fn {
  P* param;
  const G* grad;
  float* master;
  float* exp_avg;
  float* exp_avg_sq;
  std::uint32_t* counts;
  const std::uint32_t* columns;
  std::size_t rows, cols;
  matrix_layout layout;
  float factor;
  adamw_hyper hyper;
  ZF_HD void operator()(std::size_t s) const {
    const std::size_t c = columns[s];
    const adamw_coeffs co = make_coeffs(hyper, counts[s] + 1u);
    for (std::size_t i = 0; i < rows; ++i)
      column_adamw_element(param, grad, master, exp_avg, exp_avg_sq, s * rows + i,
                           element_offset(layout, rows, cols, i, c), factor, co);
    counts[s] += 1u;
  }
};

// AdamW on chunk k of a vector (its single count is advanced by the caller afterwards).
template <class P, class G>
struct vector_adamw_fn {
  P* param;
  const G* grad;
  float* master;
  float* exp_avg;
  float* exp_avg_sq;
  std::size_t n, chunk;
  adamw_coeffs coeffs;
  float factor;
  ZF_HD void operator()(std::size_t k) const {
    const std::size_t end = (k + 1) * chunk < n ? (k + 1) * chunk : n;
    if constexpr (std::is_same_v<P, float>) {
      if (!master) {  // the param is the master
        for (std::size_t i = k * chunk; i < end; ++i)
          adamw_update(param[i], exp_avg[i], exp_avg_sq[i], mul_rn(to_float(grad[i]), factor), coeffs);
        return;
      }
    }
    for (std::size_t i = k * chunk; i < end; ++i) {
      adamw_update(master[i], exp_avg[i], exp_avg_sq[i], mul_rn(to_float(grad[i]), factor), coeffs);
      param[i] = from_float<P>(master[i]);
    }
  }
};

}  // namespace zenflow::device
