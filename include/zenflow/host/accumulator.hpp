// HostAccumulator policy: the host side of ZenFlow. Per matrix it owns the fp32 master, the Adam
// moments and per-column counts of every column (authoritative for the unselected ones), two
// fp32 gradient accumulators (one filling while the other feeds a background update) and a
// staging copy of the updated params in the param dtype. The math is the SIMD kernels.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include "../adamw.hpp"
#include "../numeric.hpp"
#include "buffer.hpp"
#include "kernels.hpp"

namespace zenflow {

class simd_accumulator {
 public:
  struct matrix_state {
    std::size_t rows = 0, cols = 0;
    dtype param_type = dtype::f32;
    host::host_array<float> master, exp_avg, exp_avg_sq;
    host::host_array<std::uint32_t> counts;
    host::host_array<float> acc[2];
    host::host_array<unsigned char> param_stage;  // [cols][rows] of param_type
  };

  // Elements of the bounded staging buffer through which offloaded gradients arrive.
  static constexpr std::size_t stage_elems = std::size_t(1) << 20;

  explicit simd_accumulator(unsigned threads = 0)
      : arena_(std::make_unique<tbb::task_arena>(threads ? int(threads) : tbb::task_arena::automatic)) {}

  std::size_t add_matrix(std::size_t rows, std::size_t cols, dtype param_type) {
    auto& s = matrices_.emplace_back();
    s.rows = rows;
    s.cols = cols;
    s.param_type = param_type;
    return matrices_.size() - 1;
  }

  // Allocates everything (zeroed), masters included; the caller fills them. The second
  // accumulator exists only when host updates overlap the next window (double_buffer).
  void allocate(bool double_buffer) {
    std::size_t widest = 0;
    for (auto& s : matrices_) {
      const std::size_t n = s.rows * s.cols;
      s.master = host::host_array<float>(n);
      s.exp_avg = host::host_array<float>(n);
      s.exp_avg_sq = host::host_array<float>(n);
      s.counts = host::host_array<std::uint32_t>(s.cols);
      s.acc[0] = host::host_array<float>(n);
      if (double_buffer) s.acc[1] = host::host_array<float>(n);
      s.param_stage = host::host_array<unsigned char>(n * size_of(s.param_type));
      widest = std::max(widest, s.rows);
    }
    stage_ = host::host_array<unsigned char>(std::max(stage_elems, widest) * 4);
  }

  // Bytes of host memory held (element counts times sizes): per matrix element 4 (master) + 4 + 4
  // (moments) + 4 per accumulator + the param size (staged copy), 4 per column (count), plus the
  // bounded gradient staging area.
  std::size_t bytes_allocated() const noexcept {
    std::size_t b = stage_.size();
    for (const auto& s : matrices_)
      b += 4 * (s.master.size() + s.exp_avg.size() + s.exp_avg_sq.size() + s.acc[0].size() + s.acc[1].size() +
                s.counts.size()) +
           s.param_stage.size();
    return b;
  }

  matrix_state& matrix(std::size_t i) noexcept { return matrices_[i]; }
  const matrix_state& matrix(std::size_t i) const noexcept { return matrices_[i]; }
  std::size_t matrices() const noexcept { return matrices_.size(); }
  tbb::task_arena& arena() noexcept { return *arena_; }

  // The bounded gradient staging area: how many columns of matrix i fit, and where.
  std::size_t stage_columns(std::size_t i) const noexcept {
    return std::max<std::size_t>(1, stage_.size() / 4 / std::max<std::size_t>(1, matrices_[i].rows));
  }
  void* stage() noexcept { return stage_.data(); }

  // acc[which] columns list[0..n) += grad * factor, grad compact in the staging area.
  void accumulate(std::size_t i, int which, dtype grad_type, const std::uint32_t* list, std::size_t n,
                  float factor) {
    accumulate_from(stage_.data(), i, which, grad_type, list, n, factor);
  }
  // The same from a compact [n][rows] block anywhere in host memory.
  void accumulate_from(const void* block, std::size_t i, int which, dtype grad_type, const std::uint32_t* list,
                       std::size_t n, float factor) {
    auto& s = matrices_[i];
    host::accumulate_job j{s.acc[which].data(), block, grad_type, factor, s.rows, list};
    host::accumulate(*arena_, j, n * s.rows, host::best_isa(), s.cols);
  }

  // Host AdamW on columns list[0..n) with gradient acc[which] / grad_div, the new params written
  // to the staging copy; then those accumulator columns are cleared for the next window.
  void update(std::size_t i, int which, const std::uint32_t* list, std::size_t n, float grad_div,
              const adamw_hyper& hyper) {
    auto& s = matrices_[i];
    if (n == 0) return;
    host::adamw_job j;
    j.param = s.master.data();
    j.exp_avg = s.exp_avg.data();
    j.exp_avg_sq = s.exp_avg_sq.data();
    j.grad = s.acc[which].data();
    j.grad_type = dtype::f32;
    j.param_copy = s.param_stage.data();
    j.copy_type = s.param_type;
    j.rows = s.rows;
    j.columns = list;
    j.hyper = hyper;
    j.grad_div = grad_div;
    host::adamw(*arena_, j, s.cols, s.counts.data(), host::best_isa(), n);
    float* acc = s.acc[which].data();
    host::parallel_blocks(*arena_, n, [&](std::size_t b, std::size_t e) {
      for (std::size_t k = b; k < e; ++k) std::memset(acc + std::size_t(list[k]) * s.rows, 0, s.rows * 4);
    });
  }

 private:
  std::unique_ptr<tbb::task_arena> arena_;
  std::vector<matrix_state> matrices_;
  host::host_array<unsigned char> stage_;
};

}  // namespace zenflow
