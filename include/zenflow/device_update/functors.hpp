// The device-side per-column work as ZF_HD functors: a CUDA kernel (cuda space) or a TBB loop
// (host space) runs the very same code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../adamw.hpp"
#include "../detail/macros.hpp"
#include "../numeric.hpp"
#include "../params.hpp"

namespace zenflow::device {

ZF_HD ZF_FORCEINLINE bool is_finite(float x) noexcept { return x - x == 0.0f; }

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
    double a = 0, q = 0;
    bool finite = true;
    for (std::size_t i = 0; i < rows; ++i) {
      const float x = to_float(grad[element_offset(layout, rows, cols, i, c)]);
      finite = finite && is_finite(x);
      a += x < 0 ? -double(x) : double(x);
      q += double(x) * double(x);
    }
    l1[c] = a;
    sumsq[c] = q;
    bad[c] = finite ? 0 : 1;
  }
};

// Statistics of one chunk of a vector's raw gradient.
template <class G>
struct chunk_stats_fn {
  const G* grad;
  std::size_t n, chunk;
  double* sumsq;
  unsigned char* bad;
  ZF_HD void operator()(std::size_t k) const {
    double q = 0;
    bool finite = true;
    const std::size_t end = (k + 1) * chunk < n ? (k + 1) * chunk : n;
    for (std::size_t i = k * chunk; i < end; ++i) {
      const float x = to_float(grad[i]);
      finite = finite && is_finite(x);
      q += double(x) * double(x);
    }
    sumsq[k] = q;
    bad[k] = finite ? 0 : 1;
  }
};

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
    for (std::size_t i = 0; i < rows; ++i) {
      const std::size_t at = element_offset(layout, rows, cols, i, c), e = s * rows + i;
      adamw_update(master[e], exp_avg[e], exp_avg_sq[e], mul_rn(to_float(grad[at]), factor), co);
      param[at] = from_float<P>(master[e]);
    }
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
    for (std::size_t i = k * chunk; i < end; ++i) {
      adamw_update(master[i], exp_avg[i], exp_avg_sq[i], mul_rn(to_float(grad[i]), factor), coeffs);
      param[i] = from_float<P>(master[i]);
    }
  }
};

}  // namespace zenflow::device
