// HostAccumulator policy: the host side of ZenFlow. Per matrix it owns the fp32 master, the Adam
// moments and per-column counts of every column (authoritative for the unselected ones) and an
// fp32 gradient accumulator, two with overlap_step (one filling while the other feeds a
// background update). The
// updated params are not kept a second time in their dtype: stage_params() rounds the master's
// columns when they are uploaded (the master does not change in between). A matrix whose every
// column lives on the device (topk_ratio 1) has no host state at all. The math is the SIMD
// kernels.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include "../adamw.hpp"
#include "../detail/array_pool.hpp"
#include "../numeric.hpp"
#include "buffer.hpp"
#include "kernels.hpp"

namespace zenflow {

class simd_accumulator {
 public:
  struct matrix_state {
    std::size_t rows = 0, cols = 0;
    dtype param_type = dtype::f32;
    template <class T>
    using array = detail::pooled_array<detail::host_family, T>;
    array<float> master, exp_avg, exp_avg_sq;
    array<std::uint32_t> counts;
    array<float> acc[2];
    bool on_host = true;  // false: every column lives on the device, nothing is held here
  };

  // Elements (at most) of the bounded staging buffer through which offloaded gradients arrive.
  static constexpr std::size_t stage_elems = std::size_t(1) << 20;

  // (the arena set up here, not at its first use: see host_space)
  explicit simd_accumulator(unsigned threads = 0)
      : arena_(std::make_unique<tbb::task_arena>(threads ? int(threads) : tbb::task_arena::automatic)) {
    arena_->initialize();
  }

  void reserve(std::size_t matrices) { matrices_.reserve(matrices); }
  // What add_matrix and the arrays made, dropped (the arena kept): for an optimizer whose
  // initialize() failed, where making a new accumulator could fail in turn.
  void clear() noexcept {
    std::vector<matrix_state>().swap(matrices_);
    pool_ = detail::array_pool<detail::host_family>{};
    stage_ = host::host_array<unsigned char>{};
  }

  // on_host = false for a matrix none of whose columns is ever updated on the host.
  std::size_t add_matrix(std::size_t rows, std::size_t cols, dtype param_type, bool on_host = true) {
    auto& s = matrices_.emplace_back();
    s.rows = rows;
    s.cols = cols;
    s.param_type = param_type;
    s.on_host = on_host;
    return matrices_.size() - 1;
  }

  // Allocates everything (zeroed), masters included; the caller fills them. The second
  // accumulator exists only when host updates overlap the next window (double_buffer). The
  // staging area holds 1/32 of the model's matrix elements (a pass over a model takes about 32
  // transfers, each large enough to split across threads) but at most stage_elems fp32 values,
  // and at least one column of the tallest matrix: 1/8 byte per parameter for a small model, a
  // fixed 4 MiB for a large one.
  void allocate(bool double_buffer) {
    std::size_t widest = 0, total = 0;
    for (auto& s : matrices_) {
      widest = std::max(widest, s.rows);
      total += s.rows * s.cols;
      if (!s.on_host) continue;
      const std::size_t n = s.rows * s.cols;
      pool_.request(s.master, n);
      pool_.request(s.exp_avg, n);
      pool_.request(s.exp_avg_sq, n);
      pool_.request(s.counts, s.cols);
      pool_.request(s.acc[0], n);
      if (double_buffer) pool_.request(s.acc[1], n);
    }
    pool_.commit();  // one allocation for the small arrays of every matrix
    stage_ = host::host_array<unsigned char>(std::max(std::min(stage_elems, total / 32), widest) * 4);
  }

  // Bytes of host memory held (element counts times sizes): per element of a matrix with host
  // state 4 (master) + 4 + 4 (moments) + 4 per accumulator, 4 per column (count), plus the
  // bounded staging area.
  std::size_t bytes_allocated() const noexcept {
    std::size_t b = stage_.size();
    for (const auto& s : matrices_)
      b += 4 * (s.master.size() + s.exp_avg.size() + s.exp_avg_sq.size() + s.acc[0].size() + s.acc[1].size() +
                s.counts.size());
    return b;
  }

  // Host memory of the per-matrix records (the state descriptors themselves).
  std::size_t records_bytes() const noexcept { return matrices_.size() * sizeof(matrix_state); }

  matrix_state& matrix(std::size_t i) noexcept { return matrices_[i]; }
  const matrix_state& matrix(std::size_t i) const noexcept { return matrices_[i]; }
  std::size_t matrices() const noexcept { return matrices_.size(); }
  tbb::task_arena& arena() noexcept { return *arena_; }

  // The bounded gradient staging area: how many columns of matrix i fit, and where.
  std::size_t stage_columns(std::size_t i) const noexcept {
    return std::max<std::size_t>(1, stage_.size() / 4 / std::max<std::size_t>(1, matrices_[i].rows));
  }
  void* stage() noexcept { return stage_.data(); }
  // Frees the staging area when no column will ever cross (every matrix on the device).
  void release_stage() noexcept { stage_ = {}; }

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

  // Host AdamW on columns list[0..n) of the master with gradient acc[which] / grad_div; then
  // those accumulator columns are cleared for the next window.
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

  // The params of columns list[0..n) of matrix i, rounded from the master to the param dtype,
  // into a compact [n][rows] block at dst: what the device params of those columns become when
  // uploaded (the same rounding as every other param write).
  void stage_params(std::size_t i, const std::uint32_t* list, std::size_t n, void* dst) {
    const auto& s = matrices_[i];
    const host::kernel_table& k = host::kernels(host::best_isa());
    const std::size_t rows = s.rows, es = size_of(s.param_type);
    auto* out = static_cast<unsigned char*>(dst);
    host::parallel_blocks(*arena_, n * rows, [&](std::size_t b, std::size_t e) {
      for (std::size_t at = b; at < e;) {
        const std::size_t c = at / rows, r0 = at % rows, r1 = std::min(rows, r0 + (e - at));
        const host::convert_job j{s.master.data() + std::size_t(list[c]) * rows, dtype::f32, out + c * rows * es,
                                  s.param_type};
        k.convert(j, r0, r1);
        at += r1 - r0;
      }
    });
  }

 private:
  std::unique_ptr<tbb::task_arena> arena_;
  std::vector<matrix_state> matrices_;
  detail::array_pool<detail::host_family> pool_;
  host::host_array<unsigned char> stage_;
};

}  // namespace zenflow
