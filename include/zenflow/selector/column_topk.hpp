// Selector policies: which columns of a matrix are updated on the device.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

namespace zenflow {

// The paper's selector: the k columns with the largest score, k = max(1, floor(r * cols)) for
// r > 0 and 0 for r = 0; ties go to the lower column index; the result is sorted ascending.
struct column_topk {
  static std::size_t k(double ratio, std::size_t cols) noexcept {
    if (ratio <= 0.0 || cols == 0) return 0;
    const auto k = std::size_t(std::floor(ratio * double(cols)));
    return std::clamp<std::size_t>(k, 1, cols);
  }
  static constexpr bool needs_scores = true;
  // scores[c] for c < cols; writes k indices to out.
  static void select(const double* scores, std::size_t cols, std::size_t k, std::uint32_t* out) {
    std::vector<std::uint32_t> idx(cols);
    std::iota(idx.begin(), idx.end(), 0u);
    auto better = [&](std::uint32_t a, std::uint32_t b) {
      return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
    };
    std::nth_element(idx.begin(), idx.begin() + std::ptrdiff_t(k), idx.end(), better);
    std::sort(idx.begin(), idx.begin() + std::ptrdiff_t(k));
    std::copy_n(idx.begin(), k, out);
  }
};

// No column on the device: every matrix update happens on the host (ZeRO-Offload).
struct select_none {
  static std::size_t k(double, std::size_t) noexcept { return 0; }
  static constexpr bool needs_scores = false;
  static void select(const double*, std::size_t, std::size_t, std::uint32_t*) {}
};

// Every column on the device: plain AdamW where the model trains.
struct select_all {
  static std::size_t k(double, std::size_t cols) noexcept { return cols; }
  static constexpr bool needs_scores = false;
  static void select(const double*, std::size_t cols, std::size_t, std::uint32_t* out) {
    std::iota(out, out + cols, 0u);
  }
};

}  // namespace zenflow
