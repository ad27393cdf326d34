// zenflow::optimizer: ZenFlow (DESIGN.md §3) written once against an execution space and five
// policies. The optimizer owns the schedule — warm-up, windows, selections, boundaries, the
// Zen-auto rule — and only orders calls on its policies, which own all state.
//
//   zenflow::optimizer<> opt(cfg);              // host space, the paper's system
//   opt.add_matrix({w, dw, rows, cols, dtype::bf16, dtype::bf16, matrix_layout::row_major});
//   opt.add_vector({b, db, n, dtype::bf16, dtype::bf16});
//   opt.initialize();
//   for (...) { /* forward, backward into dw, db */ opt.step(loss_scale); }
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "config.hpp"
#include "device_update/fused_adamw.hpp"
#include "host/accumulator.hpp"
#include "params.hpp"
#include "policies.hpp"
#include "schedule/bounded_async.hpp"
#include "schedule/synchronous.hpp"
#include "selector/column_topk.hpp"
#include "space/host_space.hpp"
#include "transport/host_copy.hpp"

namespace zenflow {

struct optimizer_stats {
  std::uint64_t steps = 0;          // calls of step()
  std::uint64_t skipped_steps = 0;  // of which skipped for a non-finite gradient
  std::uint64_t selections = 0;
  std::uint64_t host_updates = 0;   // host AdamW passes over the unselected columns (warm-up included)
  std::uint64_t bytes_to_host = 0;  // device -> host, applied steps only (DESIGN.md §3 item 10)
  std::uint64_t bytes_to_device = 0;
  double stall_seconds = 0;         // time step() waited for host work
  double host_update_seconds = 0;   // time spent in host updates (foreground or background)
};

struct step_info {
  bool skipped = false;    // non-finite gradient: no state changed
  bool warm_up = false;
  bool selection = false;  // columns were (re)selected at this step
  bool boundary = false;   // a window ended: a host update was started (or done, if synchronous)
  std::uint64_t t = 0;     // applied steps so far
};

template <class Space = host_space, selector_policy Selector = column_topk,
          class GpuUpdater = fused_adamw<Space>, host_accumulator_policy HostAccumulator = simd_accumulator,
          transport_policy Transport = host_copy, scheduler_policy Scheduler = bounded_async>
  requires gpu_updater_policy<GpuUpdater, Space>
class optimizer {
 public:
  explicit optimizer(const config& cfg) : cfg_(checked(cfg)), host_(cfg.host_threads) {}
  optimizer(const optimizer&) = delete;
  optimizer& operator=(const optimizer&) = delete;
  ~optimizer() {
    try {
      scheduler_.wait();
    } catch (...) {
    }
  }

  // ---- registration (before initialize) -------------------------------------------------
  std::size_t add_matrix(const matrix_param& p) {
    const std::string who = "matrix " + std::to_string(matrices_.size());
    check_registration(who);
    if (p.rows == 0 || p.cols == 0) fail(who + ": rows and cols must be > 0");
    if (p.layout != matrix_layout::column_contiguous && p.layout != matrix_layout::row_major)
      fail(who + ": unknown layout");
    check_buffers(who, p.param, p.param_type, p.grad, p.grad_type, elements(who, p.rows, p.cols));
    matrices_.push_back(p);
    return matrices_.size() - 1;
  }
  std::size_t add_vector(const vector_param& p) {
    const std::string who = "vector " + std::to_string(vectors_.size());
    check_registration(who);
    if (p.n == 0) fail(who + ": n must be > 0");
    check_buffers(who, p.param, p.param_type, p.grad, p.grad_type, p.n);
    vectors_.push_back(p);
    return vectors_.size() - 1;
  }

  // Allocates all state and takes the fp32 masters from the current params. On failure nothing
  // is left half-built: the optimizer stays uninitialised with its registrations.
  void initialize() {
    if (initialized_) fail("initialize() called twice");
    if (matrices_.empty() && vectors_.empty()) fail("initialize(): no parameters registered");
    try {
      build();
    } catch (...) {
      host_ = HostAccumulator(cfg_.host_threads);
      updater_ = GpuUpdater{};
      unselected_.clear();
      all_columns_.clear();
      throw;
    }
    initialized_ = true;
  }

  // ---- training ---------------------------------------------------------------------------
  // One optimizer step with the gradients currently in the registered grad buffers, which hold
  // the loss scaled by grad_scale. Returns what happened; a non-finite gradient skips the step.
  step_info step(float grad_scale = 1.0f) {
    if (!initialized_) fail("step() before initialize()");
    if (!(std::isfinite(grad_scale) && grad_scale > 0))
      fail("grad_scale must be finite and > 0, got " + std::to_string(grad_scale));
    ++steps_;
    const auto summary = updater_.gradient_pass(space_);
    if (!summary.finite) {
      ++skipped_;
      return {true, false, false, false, applied_};
    }
    step_info info;
    info.t = applied_ + 1;
    const double inv = 1.0 / double(grad_scale);
    double clip = 1.0;
    if (cfg_.max_grad_norm > 0) {
      const double norm = std::sqrt(summary.sumsq) * inv;
      clip = std::min(1.0, cfg_.max_grad_norm / (norm + 1e-6));
    }
    const float factor = float(inv * clip);

    if (info.t <= cfg_.full_warm_up_rounds) {
      warm_up(factor);
      updater_.update(space_, factor, cfg_.adam);  // vectors
      info.warm_up = true;
      applied_ = info.t;
      return info;
    }
    if (window_steps_ == 0 && any_selected_ &&
        (!selected_once_ || info.t - last_selection_ >= cfg_.select_steps())) {
      drain();
      select();
      last_selection_ = info.t;
      selected_once_ = true;
      info.selection = true;
    }
    updater_.update(space_, factor, cfg_.adam);
    offload(factor);
    ++window_steps_;
    if (cfg_.update_interval.automatic ? auto_boundary(factor)
                                       : (info.t - cfg_.full_warm_up_rounds) % cfg_.update_interval.steps == 0) {
      boundary();
      info.boundary = true;
    }
    applied_ = info.t;
    return info;
  }

  // Finishes any host update in flight and makes its result visible in the params.
  void synchronize() {
    if (initialized_) drain();
  }

  void set_lr(float lr) {
    if (!(std::isfinite(lr) && lr >= 0)) fail("lr must be finite and >= 0, got " + std::to_string(lr));
    cfg_.adam.lr = lr;
  }
  float lr() const noexcept { return cfg_.adam.lr; }
  const config& get_config() const noexcept { return cfg_; }
  bool initialized() const noexcept { return initialized_; }
  std::uint64_t applied_steps() const noexcept { return applied_; }

  optimizer_stats stats() const {
    optimizer_stats s;
    s.steps = steps_;
    s.skipped_steps = skipped_;
    s.selections = selections_;
    s.host_updates = host_updates_;
    s.bytes_to_host = transport_.bytes_to_host() - base_to_host_;
    s.bytes_to_device = transport_.bytes_to_device() - base_to_device_;
    s.stall_seconds = scheduler_.stall_seconds() - base_stall_;
    s.host_update_seconds = double(host_ns_.load()) * 1e-9;
    return s;
  }

  // ---- inspection (waits for a host update in flight; changes nothing) ---------------------
  // The fp32 master of a matrix, column after column ([cols][rows]).
  void copy_master(std::size_t matrix, float* out) {
    column_state(matrix, out, [](auto& st, int b) { return st.master[b].data(); },
                 [](auto& hs) { return hs.master.data(); });
  }
  void copy_exp_avg(std::size_t matrix, float* out) {
    column_state(matrix, out, [](auto& st, int b) { return st.exp_avg[b].data(); },
                 [](auto& hs) { return hs.exp_avg.data(); });
  }
  void copy_exp_avg_sq(std::size_t matrix, float* out) {
    column_state(matrix, out, [](auto& st, int b) { return st.exp_avg_sq[b].data(); },
                 [](auto& hs) { return hs.exp_avg_sq.data(); });
  }
  std::vector<std::uint32_t> column_counts(std::size_t matrix) {
    check_matrix(matrix);
    scheduler_.wait();
    const auto& hs = host_.matrix(matrix);
    std::vector<std::uint32_t> out(hs.counts.data(), hs.counts.data() + hs.cols);
    const auto& d = updater_.matrix(matrix);
    for (std::size_t s = 0; s < d.active; ++s) out[d.columns[d.cur][s]] = d.counts[d.cur][s];
    return out;
  }
  std::vector<std::uint32_t> selected_columns(std::size_t matrix) const {
    check_matrix(matrix);
    const auto& d = updater_.matrix(matrix);
    return std::vector<std::uint32_t>(d.columns[d.cur].data(), d.columns[d.cur].data() + d.active);
  }
  void copy_vector_master(std::size_t vec, float* out) const {
    if (!initialized_ || vec >= vectors_.size()) fail("no vector " + std::to_string(vec));
    const auto& v = updater_.vector(vec);
    std::copy_n(v.master.data(), v.p.n, out);
  }

  Space& space() noexcept { return space_; }
  Scheduler& scheduler() noexcept { return scheduler_; }

 private:
  [[noreturn]] static void fail(const std::string& what) { throw std::invalid_argument("zenflow: " + what); }
  static const config& checked(const config& c) {
    c.validate();
    return c;
  }

  void check_registration(const std::string& who) const {
    if (initialized_) fail(who + ": cannot register after initialize()");
  }
  static std::size_t elements(const std::string& who, std::size_t rows, std::size_t cols) {
    if (rows > std::numeric_limits<std::size_t>::max() / 4 / cols) fail(who + ": rows * cols overflows");
    return rows * cols;
  }
  void check_buffers(const std::string& who, const void* param, dtype pt, const void* grad, dtype gt,
                     std::size_t n) {
    for (auto [p, t, what] : {std::tuple{param, pt, "param"}, std::tuple{grad, gt, "grad"}}) {
      if (t != dtype::f32 && t != dtype::bf16 && t != dtype::f16) fail(who + ": unknown " + what + " dtype");
      if (!p) fail(who + ": " + what + " is null");
      if (reinterpret_cast<std::uintptr_t>(p) % size_of(t))
        fail(who + ": " + what + " is not aligned to its element size (" + std::to_string(size_of(t)) + " bytes)");
    }
    const extent mine[2] = {{param, n * size_of(pt), who + " param"}, {grad, n * size_of(gt), who + " grad"}};
    if (overlaps(mine[0], mine[1])) fail(who + ": param and grad overlap");
    for (const extent& e : extents_)
      for (const extent& m : mine)
        if (overlaps(e, m)) fail(m.name + " overlaps " + e.name);
    extents_.push_back(mine[0]);
    extents_.push_back(mine[1]);
  }
  struct extent {
    const void* p;
    std::size_t bytes;
    std::string name;
  };
  static bool overlaps(const extent& a, const extent& b) {
    const auto a0 = reinterpret_cast<std::uintptr_t>(a.p), b0 = reinterpret_cast<std::uintptr_t>(b.p);
    return a0 < b0 + b.bytes && b0 < a0 + a.bytes;
  }
  void check_matrix(std::size_t m) const {
    if (!initialized_ || m >= matrices_.size()) fail("no matrix " + std::to_string(m));
  }

  void build() {
    for (const matrix_param& p : matrices_) {
      const std::size_t k = Selector::k(cfg_.topk_ratio, p.cols);
      updater_.add_matrix(p, k);
      host_.add_matrix(p.rows, p.cols, p.param_type);
      any_selected_ = any_selected_ || k > 0;
    }
    for (const vector_param& p : vectors_) updater_.add_vector(p);
    host_.allocate();
    updater_.allocate();
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const matrix_param& p = matrices_[i];
      auto& all = all_columns_.emplace_back(p.cols);
      for (std::size_t c = 0; c < p.cols; ++c) all[c] = std::uint32_t(c);
      unselected_.push_back(all);  // until the first selection every column lives on the host
      load_master(i);
    }
    updater_.load_vectors(space_);
    base_to_host_ = transport_.bytes_to_host();  // the initial load is not a training step
    base_to_device_ = transport_.bytes_to_device();
    base_stall_ = scheduler_.stall_seconds();
  }

  // Host master of matrix i from its device params, through the staging area in column chunks.
  void load_master(std::size_t i) {
    const matrix_param& p = matrices_[i];
    auto& hs = host_.matrix(i);
    const std::uint32_t* all = all_columns_[i].data();
    const std::size_t chunk = host_.stage_columns(i);
    for (std::size_t c0 = 0; c0 < p.cols; c0 += chunk) {
      const std::size_t n = std::min(chunk, p.cols - c0);
      transport_.columns_to_host(p.param, p.param_type, p.layout, p.rows, p.cols, all + c0, n, host_.stage());
      host::convert(host_.arena(), {host_.stage(), p.param_type, hs.master.data() + c0 * p.rows, dtype::f32},
                    n * p.rows);
    }
  }

  // Raw gradient columns list[0..n) of matrix i -> acc[which] += raw * factor, in stage-sized chunks.
  void gather_grad(std::size_t i, int which, const std::uint32_t* list, std::size_t n, float factor) {
    const matrix_param& p = matrices_[i];
    const std::size_t chunk = host_.stage_columns(i);
    for (std::size_t c0 = 0; c0 < n; c0 += chunk) {
      const std::size_t m = std::min(chunk, n - c0);
      transport_.columns_to_host(p.grad, p.grad_type, p.layout, p.rows, p.cols, list + c0, m, host_.stage());
      host_.accumulate(i, which, p.grad_type, list + c0, m, factor);
    }
  }

  // Warm-up: plain ZeRO-Offload. Every column crosses, gets a host AdamW with this step's g
  // (accumulated into the empty accumulator: 0 + raw*factor is exactly g) and is uploaded.
  void warm_up(float factor) {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const auto& all = all_columns_[i];
      gather_grad(i, active_acc_, all.data(), all.size(), factor);
      host_.update(i, active_acc_, all.data(), all.size(), 1.0f, cfg_.adam);
      upload(i, all.data(), all.size());
    }
    const auto dt = std::chrono::steady_clock::now() - t0;
    host_ns_ += std::uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count());
    ++host_updates_;
  }

  void offload(float factor) {
    for (std::size_t i = 0; i < matrices_.size(); ++i)
      gather_grad(i, active_acc_, unselected_[i].data(), unselected_[i].size(), factor);
  }

  void upload(std::size_t i, const std::uint32_t* list, std::size_t n) {
    const matrix_param& p = matrices_[i];
    transport_.columns_to_device(host_.matrix(i).param_stage.data(), p.param_type, p.param, p.layout, p.rows,
                                 p.cols, list, n);
  }

  // End of a window: host AdamW on every unselected column with the window mean.
  void boundary() {
    const float div = float(window_steps_);
    const adamw_hyper hyper = cfg_.adam;
    const int which = active_acc_;
    auto job = [this, which, div, hyper] {
      const auto t0 = std::chrono::steady_clock::now();
      for (std::size_t i = 0; i < matrices_.size(); ++i)
        host_.update(i, which, unselected_[i].data(), unselected_[i].size(), div, hyper);
      const auto dt = std::chrono::steady_clock::now() - t0;
      host_ns_ += std::uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count());
    };
    if (cfg_.overlap_step) {
      drain();  // the previous window's update lands now, before this one starts
      active_acc_ ^= 1;
    }
    scheduler_.launch(job);
    pending_ = true;
    ++host_updates_;
    if (!cfg_.overlap_step) drain();
    window_steps_ = 0;
    auto_a_.assign(matrices_.size(), 0.0);
    auto_b_.assign(matrices_.size(), 0.0);
  }

  // Waits for the host update in flight, if any, and uploads the columns it changed.
  void drain() {
    scheduler_.wait();
    if (!pending_) return;
    for (std::size_t i = 0; i < matrices_.size(); ++i) upload(i, unselected_[i].data(), unselected_[i].size());
    pending_ = false;
  }

  // Zen-auto (DESIGN.md §3 item 9): is this step a boundary?
  bool auto_boundary(float factor) {
    if (auto_a_.size() != matrices_.size()) {
      auto_a_.assign(matrices_.size(), 0.0);
      auto_b_.assign(matrices_.size(), 0.0);
    }
    std::size_t eligible = 0, needing = 0;
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const auto& d = updater_.matrix(i);
      const std::size_t k = d.active, cols = matrices_[i].cols;
      if (k == 0 || k == cols) continue;
      double sel = 0, all = 0;
      for (std::size_t s = 0; s < k; ++s) sel += d.l1[d.columns[d.cur][s]];
      for (std::size_t c = 0; c < cols; ++c) all += d.l1[c];
      const double f = double(factor);
      auto_a_[i] += f * sel / double(k);
      auto_b_[i] += f * (all - sel) / double(cols - k);
      ++eligible;
      if (auto_b_[i] >= auto_a_[i] / double(window_steps_)) ++needing;
    }
    return eligible == 0 || double(needing) >= cfg_.auto_ratio * double(eligible);
  }

  // Picks the new columns of every matrix from this step's scores and swaps their state.
  void select() {
    std::vector<std::uint32_t> chosen;
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      auto& d = updater_.matrix(i);
      if (d.k == 0) continue;
      chosen.resize(d.k);
      const double* scores = cfg_.score == score_kind::l1 ? d.l1.data() : d.sumsq.data();
      Selector::select(scores, matrices_[i].cols, d.k, chosen.data());
      swap_columns(i, chosen);
    }
    ++selections_;
  }

  // Columns that leave hand their fp32 master, moments and count to the host; columns that join
  // take theirs from the host; columns that stay move between the two device slot sets.
  void swap_columns(std::size_t i, const std::vector<std::uint32_t>& next) {
    auto& d = updater_.matrix(i);
    auto& hs = host_.matrix(i);
    const std::size_t rows = matrices_[i].rows, bytes = rows * 4;
    const int cur = d.cur, nxt = cur ^ 1;
    const std::uint32_t* old = d.columns[cur].data();
    const std::size_t nold = d.active;
    // leaving
    for (std::size_t s = 0, j = 0; s < nold; ++s) {
      while (j < next.size() && next[j] < old[s]) ++j;
      if (j < next.size() && next[j] == old[s]) continue;
      const std::size_t c = old[s];
      transport_.to_host(hs.master.data() + c * rows, d.master[cur].data() + s * rows, bytes);
      transport_.to_host(hs.exp_avg.data() + c * rows, d.exp_avg[cur].data() + s * rows, bytes);
      transport_.to_host(hs.exp_avg_sq.data() + c * rows, d.exp_avg_sq[cur].data() + s * rows, bytes);
      transport_.to_host(hs.counts.data() + c, d.counts[cur].data() + s, 4);
    }
    // the new slot set
    for (std::size_t s = 0, j = 0; s < next.size(); ++s) {
      const std::size_t c = next[s];
      while (j < nold && old[j] < c) ++j;
      d.columns[nxt][s] = std::uint32_t(c);
      if (j < nold && old[j] == c) {
        space_.copy(d.master[nxt].data() + s * rows, d.master[cur].data() + j * rows, bytes);
        space_.copy(d.exp_avg[nxt].data() + s * rows, d.exp_avg[cur].data() + j * rows, bytes);
        space_.copy(d.exp_avg_sq[nxt].data() + s * rows, d.exp_avg_sq[cur].data() + j * rows, bytes);
        space_.copy(d.counts[nxt].data() + s, d.counts[cur].data() + j, 4);
      } else {
        transport_.to_device(d.master[nxt].data() + s * rows, hs.master.data() + c * rows, bytes);
        transport_.to_device(d.exp_avg[nxt].data() + s * rows, hs.exp_avg.data() + c * rows, bytes);
        transport_.to_device(d.exp_avg_sq[nxt].data() + s * rows, hs.exp_avg_sq.data() + c * rows, bytes);
        transport_.to_device(d.counts[nxt].data() + s, hs.counts.data() + c, 4);
      }
    }
    d.cur = nxt;
    d.active = next.size();
    auto& un = unselected_[i];
    un.clear();
    for (std::size_t c = 0, j = 0; c < matrices_[i].cols; ++c) {
      if (j < next.size() && next[j] == c) ++j;
      else un.push_back(std::uint32_t(c));
    }
  }

  template <class DeviceArray, class HostArray>
  void column_state(std::size_t matrix, float* out, DeviceArray dev, HostArray host) {
    check_matrix(matrix);
    scheduler_.wait();
    const std::size_t rows = matrices_[matrix].rows, cols = matrices_[matrix].cols;
    const float* h = host(host_.matrix(matrix));
    std::copy_n(h, rows * cols, out);
    auto& d = updater_.matrix(matrix);
    const float* dv = dev(d, d.cur);
    for (std::size_t s = 0; s < d.active; ++s)
      std::copy_n(dv + s * rows, rows, out + std::size_t(d.columns[d.cur][s]) * rows);
  }

  config cfg_;
  Space space_{};
  HostAccumulator host_;
  GpuUpdater updater_{};
  Transport transport_{};
  Scheduler scheduler_{};

  std::vector<matrix_param> matrices_;
  std::vector<vector_param> vectors_;
  std::vector<extent> extents_;
  std::vector<std::vector<std::uint32_t>> all_columns_, unselected_;
  bool initialized_ = false, any_selected_ = false, selected_once_ = false, pending_ = false;
  int active_acc_ = 0;
  std::uint64_t applied_ = 0, steps_ = 0, skipped_ = 0, selections_ = 0, host_updates_ = 0;
  std::uint64_t last_selection_ = 0, window_steps_ = 0;
  std::uint64_t base_to_host_ = 0, base_to_device_ = 0;
  double base_stall_ = 0;
  std::atomic<std::uint64_t> host_ns_{0};
  std::vector<double> auto_a_, auto_b_;
};

// Baselines as policy combinations (DESIGN.md §3, last paragraph).

// ZeRO-Offload: no column on the device, a host AdamW of everything every step, synchronous.
template <class Space = host_space>
class zero_offload : public optimizer<Space, select_none, fused_adamw<Space>, simd_accumulator, host_copy, synchronous> {
  using base = optimizer<Space, select_none, fused_adamw<Space>, simd_accumulator, host_copy, synchronous>;
  static config adjust(config c) {
    c.topk_ratio = 0;
    c.update_interval = interval::every(1);
    c.select_interval = interval::every(1);
    c.overlap_step = false;
    c.full_warm_up_rounds = 0;
    return c;
  }

 public:
  explicit zero_offload(const config& c = {}) : base(adjust(c)) {}
};

// Plain AdamW where the model trains: every column selected once, nothing left on the host.
template <class Space = host_space>
class device_adam : public optimizer<Space, select_all, fused_adamw<Space>, simd_accumulator, host_copy, synchronous> {
  using base = optimizer<Space, select_all, fused_adamw<Space>, simd_accumulator, host_copy, synchronous>;
  static config adjust(config c) {
    c.topk_ratio = 1;
    c.update_interval = interval::every(1);
    c.select_interval = interval::every(std::numeric_limits<std::uint32_t>::max());
    c.overlap_step = false;
    c.full_warm_up_rounds = 0;
    return c;
  }

 public:
  explicit device_adam(const config& c = {}) : base(adjust(c)) {}
};

}  // namespace zenflow
