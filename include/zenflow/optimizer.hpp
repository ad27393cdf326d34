// zenflow::optimizer: ZenFlow (README.md, "The optimizer") written once against an execution space and five
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

#include "checkpoint.hpp"
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
  std::uint64_t bytes_to_host = 0;  // device -> host, applied steps only
  std::uint64_t bytes_to_device = 0;
  double stall_seconds = 0;         // time step() waited for host work
  double host_update_seconds = 0;   // time spent in host updates (foreground or background)
  // Memory the optimizer holds, by kind (element counts times sizes; 0 before initialize()).
  std::uint64_t host_pageable_bytes = 0;
  std::uint64_t host_pinned_bytes = 0;  // page-locked staging (none on the host space)
  std::uint64_t device_bytes = 0;       // on the device (host memory too, on the host space)
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
      quiesce();
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
      grad_compact_ = {};
      async_offload_ = false;
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
      scheduler_.wait_offload();  // the last step's accumulation reads the column lists
      drain();
      select();
      last_selection_ = info.t;
      selected_once_ = true;
      info.selection = true;
    }
    updater_.update(space_, factor, cfg_.adam);
    if (async_offload_) offload_async(factor);
    else offload(factor);
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
    if (!initialized_) return;
    scheduler_.wait_offload();
    drain();
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
    if (initialized_) {
      s.host_pageable_bytes = host_.bytes_allocated();
      s.device_bytes = updater_.bytes_allocated() + grad_compact_.size();
    }
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
    quiesce();
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

  // ---- checkpoints ------------------------------------------------------------------------
  // Saves the complete state — config, registrations, counters, selections, per-column counts,
  // fp32 masters and moments on both sides, the open window's accumulator, a host update that
  // has run but is not yet visible, the Zen-auto sums, and the registered params themselves —
  // atomically (a crash mid-save leaves the previous file intact). A host update in flight is
  // waited for, not applied early: saving does not change the run. Throws std::runtime_error
  // on I/O failure, with the optimizer unchanged.
  void save(const std::string& path) {
    if (!initialized_) fail("save() before initialize()");
    quiesce();
    ckpt::writer conf, lay, cnt;
    write_config(conf, cfg_);
    lay.put<std::uint64_t>(matrices_.size());
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const matrix_param& p = matrices_[i];
      lay.put<std::uint64_t>(p.rows);
      lay.put<std::uint64_t>(p.cols);
      lay.put<std::uint8_t>(std::uint8_t(p.param_type));
      lay.put<std::uint8_t>(std::uint8_t(p.grad_type));
      lay.put<std::uint8_t>(std::uint8_t(p.layout));
      lay.put<std::uint64_t>(updater_.matrix(i).k);
    }
    lay.put<std::uint64_t>(vectors_.size());
    for (const vector_param& p : vectors_) {
      lay.put<std::uint64_t>(p.n);
      lay.put<std::uint8_t>(std::uint8_t(p.param_type));
      lay.put<std::uint8_t>(std::uint8_t(p.grad_type));
    }
    const optimizer_stats st = stats();
    for (std::uint64_t v : {applied_, steps_, skipped_, selections_, host_updates_, last_selection_, window_steps_,
                            st.bytes_to_host, st.bytes_to_device, host_ns_.load()})
      cnt.put(v);
    cnt.put<double>(st.stall_seconds);
    cnt.put<std::uint8_t>(selected_once_);
    cnt.put<std::uint8_t>(pending_);
    cnt.put<std::uint8_t>(std::uint8_t(active_acc_));
    cnt.put<std::uint64_t>(auto_a_.size());
    for (std::size_t i = 0; i < auto_a_.size(); ++i) {
      cnt.put(auto_a_[i]);
      cnt.put(auto_b_[i]);
    }
    std::vector<ckpt::writer> mats(matrices_.size()), vecs(vectors_.size());
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const matrix_param& p = matrices_[i];
      const auto& d = updater_.matrix(i);
      const auto& h = host_.matrix(i);
      const std::size_t n = p.rows * p.cols, ks = d.active * p.rows, pb = n * size_of(p.param_type);
      ckpt::writer& w = mats[i];
      w.put<std::uint64_t>(d.active);
      w.bytes(d.columns[d.cur].data(), 4 * d.active);
      w.bytes(d.master[d.cur].data(), 4 * ks);
      w.bytes(d.exp_avg[d.cur].data(), 4 * ks);
      w.bytes(d.exp_avg_sq[d.cur].data(), 4 * ks);
      w.bytes(d.counts[d.cur].data(), 4 * d.active);
      for (const float* a : {h.master.data(), h.exp_avg.data(), h.exp_avg_sq.data(), h.acc[0].data()}) w.bytes(a, 4 * n);
      if (cfg_.overlap_step) w.bytes(h.acc[1].data(), 4 * n);
      w.bytes(h.counts.data(), 4 * p.cols);
      w.bytes(h.param_stage.data(), pb);
      std::vector<unsigned char> params(pb);
      space_.copy(params.data(), p.param, pb);
      w.bytes(params.data(), pb);
    }
    for (std::size_t i = 0; i < vectors_.size(); ++i) {
      const vector_param& p = vectors_[i];
      const auto& v = updater_.vector(i);
      ckpt::writer& w = vecs[i];
      w.bytes(v.master.data(), 4 * p.n);
      w.bytes(v.exp_avg.data(), 4 * p.n);
      w.bytes(v.exp_avg_sq.data(), 4 * p.n);
      w.put<std::uint32_t>(v.count);
      std::vector<unsigned char> params(p.n * size_of(p.param_type));
      space_.copy(params.data(), p.param, params.size());
      w.bytes(params.data(), params.size());
    }
    std::vector<std::pair<std::uint32_t, const ckpt::writer*>> sections = {
        {ckpt::config_tag, &conf}, {ckpt::layout_tag, &lay}, {ckpt::counters_tag, &cnt}};
    for (const auto& w : mats) sections.push_back({ckpt::matrix_tag, &w});
    for (const auto& w : vecs) sections.push_back({ckpt::vector_tag, &w});
    ckpt::write_file(path, sections);
  }

  // Restores a checkpoint written by save() into this initialised optimizer, whose config and
  // registrations must match the file's (lr is taken from the file; host_threads may differ).
  // The registered params are overwritten with the saved ones. Everything is read and checked
  // first: a file that is unreadable, corrupt or mismatched throws zenflow::checkpoint_error
  // naming the problem, and the optimizer is left exactly as it was.
  void load(const std::string& path) {
    if (!initialized_) fail("load() before initialize()");
    const std::vector<unsigned char> file = ckpt::read_file(path);
    load_image(file.data(), file.size(), path);
  }

  // load() from a checkpoint image in memory (a file's bytes); `name` appears in the messages.
  void load_image(const void* data, std::size_t size, const std::string& name = "(memory)") {
    if (!initialized_) fail("load() before initialize()");
    const std::string& path = name;
    std::vector<ckpt::section> secs;
    ckpt::parse(static_cast<const unsigned char*>(data), size, path, secs);
    auto bad = [&](const std::string& why) -> void { throw checkpoint_error("zenflow checkpoint " + path + ": " + why); };
    const std::size_t want = 3 + matrices_.size() + vectors_.size();
    if (secs.size() != want)
      bad("has " + std::to_string(secs.size()) + " sections, this optimizer needs " + std::to_string(want) +
          " (a different number of registered parameters?)");
    auto expect_tag = [&](std::size_t i, std::uint32_t t, const char* what) {
      if (secs[i].tag != t) bad("section " + std::to_string(i) + " should be the " + what + " section");
    };
    expect_tag(0, ckpt::config_tag, "config");
    expect_tag(1, ckpt::layout_tag, "layout");
    expect_tag(2, ckpt::counters_tag, "counters");
    // config: everything but lr and host_threads must agree
    ckpt::reader rc(secs[0].data, secs[0].size, "config");
    const config fc = read_config(rc);
    rc.done();
    compare_config(fc, bad);
    // registrations
    ckpt::reader rl(secs[1].data, secs[1].size, "layout");
    if (rl.get<std::uint64_t>() != matrices_.size()) bad("registers a different number of matrices");
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const matrix_param& p = matrices_[i];
      const auto rows = rl.get<std::uint64_t>(), cols = rl.get<std::uint64_t>();
      const auto pt = rl.get<std::uint8_t>(), gt = rl.get<std::uint8_t>(), lo = rl.get<std::uint8_t>();
      const auto k = rl.get<std::uint64_t>();
      if (rows != p.rows || cols != p.cols || pt != std::uint8_t(p.param_type) || gt != std::uint8_t(p.grad_type) ||
          lo != std::uint8_t(p.layout) || k != updater_.matrix(i).k)
        bad("matrix " + std::to_string(i) + " is " + std::to_string(rows) + "x" + std::to_string(cols) +
            " (param dtype " + std::to_string(pt) + ", grad dtype " + std::to_string(gt) + ", layout " +
            std::to_string(lo) + ") in the file, " + std::to_string(p.rows) + "x" + std::to_string(p.cols) +
            " (" + std::to_string(int(p.param_type)) + ", " + std::to_string(int(p.grad_type)) + ", " +
            std::to_string(int(p.layout)) + ") here");
    }
    if (rl.get<std::uint64_t>() != vectors_.size()) bad("registers a different number of vectors");
    for (std::size_t i = 0; i < vectors_.size(); ++i) {
      const auto n = rl.get<std::uint64_t>();
      const auto pt = rl.get<std::uint8_t>(), gt = rl.get<std::uint8_t>();
      if (n != vectors_[i].n || pt != std::uint8_t(vectors_[i].param_type) || gt != std::uint8_t(vectors_[i].grad_type))
        bad("vector " + std::to_string(i) + " has " + std::to_string(n) + " elements in the file, " +
            std::to_string(vectors_[i].n) + " here (or other dtypes)");
    }
    rl.done();
    // counters
    ckpt::reader rn(secs[2].data, secs[2].size, "counters");
    std::uint64_t c[10];
    for (auto& v : c) v = rn.get<std::uint64_t>();
    const double stall = rn.get<double>();
    const auto sel_once = rn.get<std::uint8_t>(), pend = rn.get<std::uint8_t>(), acc = rn.get<std::uint8_t>();
    const auto na = rn.get<std::uint64_t>();
    if (sel_once > 1 || pend > 1 || acc > 1 || (na != 0 && na != matrices_.size()) || c[0] + c[2] != c[1] ||
        c[6] > c[0] || c[5] > c[0] || !(stall >= 0))
      bad("counters section is inconsistent");
    std::vector<double> aa(na), ab(na);
    for (std::size_t i = 0; i < na; ++i) {
      aa[i] = rn.get<double>();
      ab[i] = rn.get<double>();
    }
    rn.done();
    // matrices and vectors: sizes and column lists checked while parsing into staging copies
    struct mat_blob {
      std::size_t active;
      const unsigned char* at;
    };
    std::vector<mat_blob> mb;
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const ckpt::section& sec = secs[3 + i];
      if (sec.tag != ckpt::matrix_tag) bad("section " + std::to_string(3 + i) + " should be matrix " + std::to_string(i));
      const matrix_param& p = matrices_[i];
      ckpt::reader r(sec.data, sec.size, "matrix " + std::to_string(i));
      const auto active = r.get<std::uint64_t>();
      if (active != 0 && active != updater_.matrix(i).k) bad("matrix " + std::to_string(i) + ": selection size differs");
      const std::size_t n = p.rows * p.cols, pb = n * size_of(p.param_type);
      const std::size_t accs = cfg_.overlap_step ? 2 : 1;
      const std::size_t expect = 8 + 4 * active + 12 * active * p.rows + 4 * active + (12 + 4 * accs) * n + 4 * p.cols + 2 * pb;
      if (sec.size != expect) bad("matrix " + std::to_string(i) + " section has the wrong size");
      std::vector<std::uint32_t> cols(active), counts(active), hcounts(p.cols);
      r.bytes(cols.data(), 4 * active);
      for (std::size_t s = 0; s < active; ++s)
        if (cols[s] >= p.cols || (s > 0 && cols[s] <= cols[s - 1]))
          bad("matrix " + std::to_string(i) + ": corrupt column list");
      // a column's Adam count can never exceed the number of applied steps
      r.skip(12 * active * p.rows);
      r.bytes(counts.data(), 4 * active);
      r.skip((12 + 4 * accs) * n);
      r.bytes(hcounts.data(), 4 * p.cols);
      for (auto x : counts)
        if (x > c[0]) bad("matrix " + std::to_string(i) + ": an Adam count exceeds the applied steps");
      for (auto x : hcounts)
        if (x > c[0]) bad("matrix " + std::to_string(i) + ": an Adam count exceeds the applied steps");
      mb.push_back({active, sec.data + 8});
    }
    for (std::size_t i = 0; i < vectors_.size(); ++i) {
      const ckpt::section& sec = secs[3 + matrices_.size() + i];
      if (sec.tag != ckpt::vector_tag) bad("section " + std::to_string(3 + matrices_.size() + i) + " should be vector " + std::to_string(i));
      if (sec.size != 12 * vectors_[i].n + 4 + vectors_[i].n * size_of(vectors_[i].param_type))
        bad("vector " + std::to_string(i) + " section has the wrong size");
      std::uint32_t vc;
      std::memcpy(&vc, sec.data + 12 * vectors_[i].n, 4);
      if (vc > c[0]) bad("vector " + std::to_string(i) + ": its Adam count exceeds the applied steps");
    }

    // ---- everything checked: commit (copies only, nothing can fail from here) ----
    quiesce();
    cfg_.adam.lr = fc.adam.lr;
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const matrix_param& p = matrices_[i];
      auto& d = updater_.matrix(i);
      auto& h = host_.matrix(i);
      const std::size_t n = p.rows * p.cols, ks = mb[i].active * p.rows, pb = n * size_of(p.param_type);
      const unsigned char* at = mb[i].at;
      auto take = [&](void* dst, std::size_t bytes) {
        if (bytes) std::memcpy(dst, at, bytes);  // dst is null for an empty array
        at += bytes;
      };
      d.cur = 0;
      d.active = mb[i].active;
      take(d.columns[0].data(), 4 * d.active);
      take(d.master[0].data(), 4 * ks);
      take(d.exp_avg[0].data(), 4 * ks);
      take(d.exp_avg_sq[0].data(), 4 * ks);
      take(d.counts[0].data(), 4 * d.active);
      for (float* a : {h.master.data(), h.exp_avg.data(), h.exp_avg_sq.data(), h.acc[0].data()}) take(a, 4 * n);
      if (cfg_.overlap_step) take(h.acc[1].data(), 4 * n);
      take(h.counts.data(), 4 * p.cols);
      take(h.param_stage.data(), pb);
      space_.copy(p.param, at, pb);
      auto& un = unselected_[i];
      un.clear();
      for (std::size_t col = 0, j = 0; col < p.cols; ++col) {
        if (j < d.active && d.columns[0][j] == col) ++j;
        else un.push_back(std::uint32_t(col));
      }
    }
    for (std::size_t i = 0; i < vectors_.size(); ++i) {
      const vector_param& p = vectors_[i];
      auto& v = updater_.vector(i);
      const unsigned char* at = secs[3 + matrices_.size() + i].data;
      std::memcpy(v.master.data(), at, 4 * p.n);
      std::memcpy(v.exp_avg.data(), at + 4 * p.n, 4 * p.n);
      std::memcpy(v.exp_avg_sq.data(), at + 8 * p.n, 4 * p.n);
      std::memcpy(&v.count, at + 12 * p.n, 4);
      space_.copy(p.param, at + 12 * p.n + 4, p.n * size_of(p.param_type));
    }
    applied_ = c[0];
    steps_ = c[1];
    skipped_ = c[2];
    selections_ = c[3];
    host_updates_ = c[4];
    last_selection_ = c[5];
    window_steps_ = c[6];
    base_to_host_ = transport_.bytes_to_host() - c[7];  // stats() continues from the saved values
    base_to_device_ = transport_.bytes_to_device() - c[8];
    host_ns_ = c[9];
    base_stall_ = scheduler_.stall_seconds() - stall;
    selected_once_ = sel_once;
    pending_ = pend;
    active_acc_ = acc;
    auto_a_ = std::move(aa);
    auto_b_ = std::move(ab);
  }

 private:
  [[noreturn]] static void fail(const std::string& what) { throw std::invalid_argument("zenflow: " + what); }

  static void write_config(ckpt::writer& w, const config& c) {
    w.put(c.topk_ratio);
    w.put(c.select_interval.steps);
    w.put<std::uint8_t>(c.select_interval.automatic);
    w.put(c.update_interval.steps);
    w.put<std::uint8_t>(c.update_interval.automatic);
    w.put(c.full_warm_up_rounds);
    w.put<std::uint8_t>(c.overlap_step);
    w.put(c.auto_ratio);
    w.put(c.steps_per_epoch);
    w.put<std::uint8_t>(std::uint8_t(c.score));
    for (float x : {c.adam.lr, c.adam.beta1, c.adam.beta2, c.adam.eps, c.adam.weight_decay}) w.put(x);
    w.put<std::uint8_t>(std::uint8_t(c.adam.mode));
    w.put(c.max_grad_norm);
    w.put(c.host_threads);
  }
  static config read_config(ckpt::reader& r) {
    config c;
    c.topk_ratio = r.get<double>();
    c.select_interval.steps = r.get<std::uint32_t>();
    c.select_interval.automatic = r.get<std::uint8_t>() != 0;
    c.update_interval.steps = r.get<std::uint32_t>();
    c.update_interval.automatic = r.get<std::uint8_t>() != 0;
    c.full_warm_up_rounds = r.get<std::uint32_t>();
    c.overlap_step = r.get<std::uint8_t>() != 0;
    c.auto_ratio = r.get<double>();
    c.steps_per_epoch = r.get<std::uint32_t>();
    c.score = score_kind(r.get<std::uint8_t>());
    c.adam.lr = r.get<float>();
    c.adam.beta1 = r.get<float>();
    c.adam.beta2 = r.get<float>();
    c.adam.eps = r.get<float>();
    c.adam.weight_decay = r.get<float>();
    c.adam.mode = adam_mode(r.get<std::uint8_t>());
    c.max_grad_norm = r.get<double>();
    c.host_threads = r.get<unsigned>();
    return c;
  }
  template <class Bad>
  void compare_config(const config& f, Bad bad) const {
    auto differ = [&](const char* key, auto file, auto here) {
      if (!(file == here)) bad(std::string("config differs: ") + key + " is " + std::to_string(file) + " in the file, " +
                               std::to_string(here) + " here");
    };
    differ("topk_ratio", f.topk_ratio, cfg_.topk_ratio);
    differ("select_interval", f.select_interval.automatic ? -1.0 : double(f.select_interval.steps),
           cfg_.select_interval.automatic ? -1.0 : double(cfg_.select_interval.steps));
    differ("update_interval", f.update_interval.automatic ? -1.0 : double(f.update_interval.steps),
           cfg_.update_interval.automatic ? -1.0 : double(cfg_.update_interval.steps));
    differ("full_warm_up_rounds", f.full_warm_up_rounds, cfg_.full_warm_up_rounds);
    differ("overlap_step", int(f.overlap_step), int(cfg_.overlap_step));
    differ("auto_ratio", f.auto_ratio, cfg_.auto_ratio);
    differ("steps_per_epoch", f.steps_per_epoch, cfg_.steps_per_epoch);
    differ("score", int(f.score), int(cfg_.score));
    differ("beta1", f.adam.beta1, cfg_.adam.beta1);
    differ("beta2", f.adam.beta2, cfg_.adam.beta2);
    differ("eps", f.adam.eps, cfg_.adam.eps);
    differ("weight_decay", f.adam.weight_decay, cfg_.adam.weight_decay);
    differ("adam_mode", int(f.adam.mode), int(cfg_.adam.mode));
    differ("max_grad_norm", f.max_grad_norm, cfg_.max_grad_norm);
    if (!(std::isfinite(f.adam.lr) && f.adam.lr >= 0)) bad("config: lr is not finite and >= 0");
  }
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
    host_.allocate(cfg_.overlap_step);
    updater_.allocate();
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const matrix_param& p = matrices_[i];
      auto& all = all_columns_.emplace_back(p.cols);
      for (std::size_t c = 0; c < p.cols; ++c) all[c] = std::uint32_t(c);
      unselected_.push_back(all);  // until the first selection every column lives on the host
      load_master(i);
    }
    updater_.load_vectors(space_);
    if constexpr (Scheduler::concurrent) {
      if (cfg_.overlap_step) {
        // Room for the unselected gradient columns of every matrix, compacted on the device so
        // the offload can run behind the next forward/backward (the grad buffers are free again).
        std::size_t bytes = 0;
        for (std::size_t i = 0; i < matrices_.size(); ++i) {
          const matrix_param& p = matrices_[i];
          bytes += (p.cols - updater_.matrix(i).k) * p.rows * size_of(p.grad_type);
        }
        grad_compact_ = typename Space::template buffer<unsigned char>(bytes);
        compact_offset_.assign(matrices_.size(), 0);
        async_offload_ = true;
      }
    }
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

  // The same offload behind the device: the unselected columns are compacted on the device now
  // (the trainer may overwrite its grad buffers after step() returns); their transfer and
  // accumulation run on the scheduler's offload lane, one step in flight. The accumulation is
  // the same calls in the same order as offload(), so results are identical.
  void offload_async(float factor) {
    scheduler_.wait_offload();  // the previous step's transfer still reads the compaction buffer
    std::size_t at = 0;
    for (std::size_t i = 0; i < matrices_.size(); ++i)
      at += unselected_[i].size() * matrices_[i].rows * size_of(matrices_[i].grad_type);
    if (at > grad_compact_.size()) return offload(factor);  // only before a first selection
    at = 0;
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const matrix_param& p = matrices_[i];
      const auto& un = unselected_[i];
      space_.compact_columns(p.grad, p.grad_type, p.layout, p.rows, p.cols, un.data(), un.size(),
                             grad_compact_.data() + at);
      compact_offset_[i] = at;
      at += un.size() * p.rows * size_of(p.grad_type);
    }
    const int which = active_acc_;
    scheduler_.launch_offload([this, which, factor] {
      for (std::size_t i = 0; i < matrices_.size(); ++i) {
        const matrix_param& p = matrices_[i];
        const auto& un = unselected_[i];
        const unsigned char* block = grad_compact_.data() + compact_offset_[i];
        const std::size_t chunk = host_.stage_columns(i);
        for (std::size_t c0 = 0; c0 < un.size(); c0 += chunk) {
          const std::size_t m = std::min(chunk, un.size() - c0);
          transport_.columns_to_host(block, p.grad_type, matrix_layout::column_contiguous, p.rows, un.size(),
                                     all_columns_[i].data() + c0, m, host_.stage());
          host_.accumulate(i, which, p.grad_type, un.data() + c0, m, factor);
        }
      }
    });
  }

  // Every background job finished (nothing applied).
  void quiesce() {
    scheduler_.wait_offload();
    scheduler_.wait();
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
      if (async_offload_) scheduler_.wait_offload_quiet();  // this window's last accumulation
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

  // Zen-auto: per matrix with 0 < k < cols, A = mean over the window of (selected L1 mass / k),
  // B = sum over the window of (unselected L1 mass / (cols - k)); the matrix needs an update when
  // B >= A. A boundary when at least auto_ratio of the eligible matrices need one (or none is
  // eligible). Is this step a boundary?
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
    quiesce();
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
  bool async_offload_ = false;
  typename Space::template buffer<unsigned char> grad_compact_;
  std::vector<std::size_t> compact_offset_;
  int active_acc_ = 0;
  std::uint64_t applied_ = 0, steps_ = 0, skipped_ = 0, selections_ = 0, host_updates_ = 0;
  std::uint64_t last_selection_ = 0, window_steps_ = 0;
  std::uint64_t base_to_host_ = 0, base_to_device_ = 0;
  double base_stall_ = 0;
  std::atomic<std::uint64_t> host_ns_{0};
  std::vector<double> auto_a_, auto_b_;
};

// Baselines as policy combinations.

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
