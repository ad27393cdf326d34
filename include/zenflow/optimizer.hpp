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
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
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

// The Transport a space uses unless told otherwise (cuda_pinned for cuda_space, <zenflow/cuda.hpp>).
template <class Space>
struct default_transport {
  using type = host_copy;
};
template <class Space>
using default_transport_t = typename default_transport<Space>::type;

template <class Space = host_space, selector_policy Selector = column_topk,
          class GpuUpdater = fused_adamw<Space>, host_accumulator_policy HostAccumulator = simd_accumulator,
          transport_policy Transport = default_transport_t<Space>, scheduler_policy Scheduler = bounded_async>
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
    if (p.cols > std::numeric_limits<std::uint32_t>::max())
      fail(who + ": " + std::to_string(p.cols) + " columns; at most 4294967295 (column lists are 32-bit)");
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
    enter();
    if (matrices_.empty() && vectors_.empty()) fail("initialize(): no parameters registered");
    try {
      build();
    } catch (...) {
      host_ = HostAccumulator(cfg_.host_threads);
      updater_ = GpuUpdater{};
      grad_compact_ = {};
      dev_stage_ = {};
      slots_dev_ = {};
      compacted_ = {};
      lists_dev_.clear();
      async_offload_ = false;
      unselected_.clear();
      selected_.clear();
      all_columns_.clear();
      throw;
    }
    initialized_ = true;
  }

  // initialize() with the device work ordered on `stream` (a cudaStream_t on cuda_space).
  void initialize(typename Space::stream_type stream) {
    space_.set_stream(stream);
    initialize();
  }

  // ---- training ---------------------------------------------------------------------------
  // step() on `stream`: the optimizer's device work is ordered after what the trainer enqueued
  // there (its backward) and before what it enqueues next.
  step_info step(typename Space::stream_type stream, float grad_scale = 1.0f) {
    space_.set_stream(stream);
    return step(grad_scale);
  }

  // One optimizer step with the gradients currently in the registered grad buffers, which hold
  // the loss scaled by grad_scale. Returns what happened; a non-finite gradient skips the step.
  step_info step(float grad_scale = 1.0f) {
    if (!initialized_) fail("step() before initialize()");
    enter();
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
    enter();
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
      if constexpr (pinned_transport<Transport>) s.host_pinned_bytes = transport_.pinned_bytes();
      s.device_bytes = updater_.bytes_allocated() + grad_compact_.size() + dev_stage_.size() + 4 * slots_dev_.size();
      for (const auto& l : lists_dev_) s.device_bytes += 4 * l.size();
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
    const std::vector<std::uint32_t> dev = download<std::uint32_t>(d.counts[d.cur].data(), d.active);
    for (std::size_t s = 0; s < d.active; ++s) out[selected_[matrix][s]] = dev[s];
    return out;
  }
  std::vector<std::uint32_t> selected_columns(std::size_t matrix) const {
    check_matrix(matrix);
    return selected_[matrix];
  }
  void copy_vector_master(std::size_t vec, float* out) {
    if (!initialized_ || vec >= vectors_.size()) fail("no vector " + std::to_string(vec));
    const auto& v = updater_.vector(vec);
    space_.download(out, v.master.data(), 4 * v.p.n);
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
    enter();
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
      w.bytes(selected_[i].data(), 4 * d.active);
      for (const float* a : {d.master[d.cur].data(), d.exp_avg[d.cur].data(), d.exp_avg_sq[d.cur].data()}) {
        const auto dev = download<float>(a, ks);
        w.bytes(dev.data(), 4 * ks);
      }
      const auto counts = download<std::uint32_t>(d.counts[d.cur].data(), d.active);
      w.bytes(counts.data(), 4 * d.active);
      for (const float* a : {h.master.data(), h.exp_avg.data(), h.exp_avg_sq.data(), h.acc[0].data()}) w.bytes(a, 4 * n);
      if (cfg_.overlap_step) w.bytes(h.acc[1].data(), 4 * n);
      w.bytes(h.counts.data(), 4 * p.cols);
      w.bytes(h.param_stage.data(), pb);
      const auto params = download(static_cast<const unsigned char*>(p.param), pb);
      w.bytes(params.data(), pb);
    }
    for (std::size_t i = 0; i < vectors_.size(); ++i) {
      const vector_param& p = vectors_[i];
      const auto& v = updater_.vector(i);
      ckpt::writer& w = vecs[i];
      for (const float* a : {v.master.data(), v.exp_avg.data(), v.exp_avg_sq.data()}) {
        const auto dev = download<float>(a, p.n);
        w.bytes(dev.data(), 4 * p.n);
      }
      w.put<std::uint32_t>(v.count);
      const auto params = download(static_cast<const unsigned char*>(p.param), p.n * size_of(p.param_type));
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
    enter();
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
      auto take_dev = [&](void* dst, std::size_t bytes) {
        if (bytes) space_.upload(dst, at, bytes);
        at += bytes;
      };
      d.cur = 0;
      d.active = mb[i].active;
      selected_[i].assign(d.active, 0);
      take(selected_[i].data(), 4 * d.active);
      if (d.active) space_.upload(d.columns[0].data(), selected_[i].data(), 4 * d.active);
      take_dev(d.master[0].data(), 4 * ks);
      take_dev(d.exp_avg[0].data(), 4 * ks);
      take_dev(d.exp_avg_sq[0].data(), 4 * ks);
      take_dev(d.counts[0].data(), 4 * d.active);
      for (float* a : {h.master.data(), h.exp_avg.data(), h.exp_avg_sq.data(), h.acc[0].data()}) take(a, 4 * n);
      if (cfg_.overlap_step) take(h.acc[1].data(), 4 * n);
      take(h.counts.data(), 4 * p.cols);
      take(h.param_stage.data(), pb);
      take_dev(p.param, pb);
      set_unselected(i);
    }
    for (std::size_t i = 0; i < vectors_.size(); ++i) {
      const vector_param& p = vectors_[i];
      auto& v = updater_.vector(i);
      const unsigned char* at = secs[3 + matrices_.size() + i].data;
      space_.upload(v.master.data(), at, 4 * p.n);
      space_.upload(v.exp_avg.data(), at + 4 * p.n, 4 * p.n);
      space_.upload(v.exp_avg_sq.data(), at + 8 * p.n, 4 * p.n);
      std::memcpy(&v.count, at + 12 * p.n, 4);
      space_.upload(p.param, at + 12 * p.n + 4, p.n * size_of(p.param_type));
    }
    space_.fence();  // the uploads read the file image, which the caller may free
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
  // Every public entry point that touches the device first makes the space current on the
  // calling thread (a CUDA space sets its device: a trainer may drive the optimizer from another
  // thread than the one that initialised it). Spaces without activate() need nothing.
  void enter() {
    if constexpr (requires(Space& s) { s.activate(); }) space_.activate();
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
    space_.initialize();
    for (const matrix_param& p : matrices_) {
      const std::size_t k = Selector::k(cfg_.topk_ratio, p.cols);
      updater_.add_matrix(p, k);
      host_.add_matrix(p.rows, p.cols, p.param_type);
      any_selected_ = any_selected_ || k > 0;
    }
    for (const vector_param& p : vectors_) updater_.add_vector(p);
    host_.allocate(cfg_.overlap_step);
    updater_.allocate();
    // Device-side column lists ([all columns | unselected columns] per matrix), the swap plans'
    // slot lists, and the device end of chunked transfers (the host staging area's size).
    std::size_t stage = 0, max_k = 0;
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const matrix_param& p = matrices_[i];
      stage = std::max(stage, host_.stage_columns(i) * p.rows * 4);
      max_k = std::max(max_k, updater_.matrix(i).k);
      auto& all = all_columns_.emplace_back(p.cols);
      for (std::size_t c = 0; c < p.cols; ++c) all[c] = std::uint32_t(c);
      lists_dev_.emplace_back(2 * p.cols);
      space_.upload(lists_dev_.back().data(), all.data(), 4 * p.cols);
      selected_.emplace_back();
      set_unselected(i);  // until the first selection every column lives on the host
    }
    dev_stage_ = typename Space::template buffer<unsigned char>(stage);
    slots_dev_ = typename Space::template buffer<std::uint32_t>(4 * max_k);
    if constexpr (reservable_transport<Transport, Space>) transport_.reserve(space_, stage);
    for (std::size_t i = 0; i < matrices_.size(); ++i) load_master(i);
    updater_.load_vectors(space_);
    if constexpr (Scheduler::concurrent) {
      if (cfg_.overlap_step) {
        // Room for the unselected gradient columns of every matrix, compacted on the device so
        // the offload can run behind the next forward/backward (the grad buffers are free again).
        std::size_t bytes = 0;
        for (std::size_t i = 0; i < matrices_.size(); ++i) {
          const matrix_param& p = matrices_[i];
          bytes += align_up((p.cols - updater_.matrix(i).k) * p.rows * size_of(p.grad_type));
        }
        grad_compact_ = typename Space::template buffer<unsigned char>(bytes);
        compacted_.create();
        compact_offset_.assign(matrices_.size(), 0);
        async_offload_ = true;
      }
    }
    space_.fence();
    base_to_host_ = transport_.bytes_to_host();  // the initial load is not a training step
    base_to_device_ = transport_.bytes_to_device();
    base_stall_ = scheduler_.stall_seconds();
  }

  // Blocks in the compaction buffer start 256-byte aligned (any element type, vector loads).
  static constexpr std::size_t align_up(std::size_t bytes) noexcept { return (bytes + 255) / 256 * 256; }

  const std::uint32_t* all_dev(std::size_t i) const noexcept { return lists_dev_[i].data(); }
  const std::uint32_t* unselected_dev(std::size_t i) const noexcept { return lists_dev_[i].data() + matrices_[i].cols; }

  // The unselected list of matrix i from its selected list, on the host and on the device.
  void set_unselected(std::size_t i) {
    if (unselected_.size() <= i) unselected_.resize(i + 1);
    const auto& sel = selected_[i];
    auto& un = unselected_[i];
    un.clear();
    for (std::size_t c = 0, j = 0; c < matrices_[i].cols; ++c) {
      if (j < sel.size() && sel[j] == c) ++j;
      else un.push_back(std::uint32_t(c));
    }
    if (!un.empty()) space_.upload(lists_dev_[i].data() + matrices_[i].cols, un.data(), 4 * un.size());
  }

  template <class T>
  std::vector<T> download(const T* src, std::size_t n) {
    std::vector<T> out(n);
    if (n) space_.download(out.data(), src, n * sizeof(T));
    return out;
  }

  // Columns list[0..n) of a device matrix to the host staging area, chunk by chunk (compacted on
  // the device, then one transfer each); then(c0, m) consumes columns [c0, c0+m) of the list.
  template <class Then>
  void columns_down(std::size_t i, const void* src, dtype t, const std::uint32_t* list_dev, std::size_t n, Then then) {
    const matrix_param& p = matrices_[i];
    const std::size_t chunk = host_.stage_columns(i), es = size_of(t);
    for (std::size_t c0 = 0; c0 < n; c0 += chunk) {
      const std::size_t m = std::min(chunk, n - c0);
      space_.compact_columns(src, t, p.layout, p.rows, p.cols, list_dev + c0, m, dev_stage_.data());
      transport_.to_host(host_.stage(), dev_stage_.data(), m * p.rows * es);
      then(c0, m);
    }
  }

  // Host master of matrix i from its device params.
  void load_master(std::size_t i) {
    const matrix_param& p = matrices_[i];
    float* master = host_.matrix(i).master.data();
    columns_down(i, p.param, p.param_type, all_dev(i), p.cols, [&](std::size_t c0, std::size_t m) {
      host::convert(host_.arena(), {host_.stage(), p.param_type, master + c0 * p.rows, dtype::f32}, m * p.rows);
    });
  }

  // Raw gradient columns list[0..n) of matrix i -> acc[which] += raw * factor.
  void gather_grad(std::size_t i, int which, const std::uint32_t* list, const std::uint32_t* list_dev, std::size_t n,
                   float factor) {
    const matrix_param& p = matrices_[i];
    columns_down(i, p.grad, p.grad_type, list_dev, n, [&](std::size_t c0, std::size_t m) {
      host_.accumulate(i, which, p.grad_type, list + c0, m, factor);
    });
  }

  // Warm-up: plain ZeRO-Offload. Every column crosses, gets a host AdamW with this step's g
  // (accumulated into the empty accumulator: 0 + raw*factor is exactly g) and is uploaded.
  void warm_up(float factor) {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const auto& all = all_columns_[i];
      gather_grad(i, active_acc_, all.data(), all_dev(i), all.size(), factor);
      host_.update(i, active_acc_, all.data(), all.size(), 1.0f, cfg_.adam);
      upload(i, all.data(), all_dev(i), all.size());
    }
    const auto dt = std::chrono::steady_clock::now() - t0;
    host_ns_ += std::uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count());
    ++host_updates_;
  }

  void offload(float factor) {
    for (std::size_t i = 0; i < matrices_.size(); ++i)
      gather_grad(i, active_acc_, unselected_[i].data(), unselected_dev(i), unselected_[i].size(), factor);
  }

  // The same offload behind the device: the unselected columns are compacted on the device now
  // (the trainer may overwrite its grad buffers once the device has passed this point); their
  // transfer and accumulation run on the scheduler's offload lane, one step in flight, starting
  // when the device reaches the recorded event. The accumulation is the same calls in the same
  // order as offload(), so results are identical.
  void offload_async(float factor) {
    scheduler_.wait_offload();  // the previous step's transfer still reads the compaction buffer
    std::size_t at = 0;
    for (std::size_t i = 0; i < matrices_.size(); ++i)
      at += align_up(unselected_[i].size() * matrices_[i].rows * size_of(matrices_[i].grad_type));
    if (at > grad_compact_.size()) return offload(factor);  // only before a first selection
    at = 0;
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const matrix_param& p = matrices_[i];
      const auto& un = unselected_[i];
      space_.compact_columns(p.grad, p.grad_type, p.layout, p.rows, p.cols, unselected_dev(i), un.size(),
                             grad_compact_.data() + at);
      compact_offset_[i] = at;
      at += align_up(un.size() * p.rows * size_of(p.grad_type));
    }
    space_.record(compacted_);
    const int which = active_acc_;
    scheduler_.launch_offload([this, which, factor] {
      for (std::size_t i = 0; i < matrices_.size(); ++i) {
        const matrix_param& p = matrices_[i];
        const auto& un = unselected_[i];
        const std::size_t col_bytes = p.rows * size_of(p.grad_type);
        transport_.stream_to_host(compacted_, grad_compact_.data() + compact_offset_[i], un.size() * col_bytes,
                                  host_.stage_columns(i) * col_bytes,
                                  [&](const void* piece, std::size_t off, std::size_t len) {
                                    host_.accumulate_from(piece, i, which, p.grad_type, un.data() + off / col_bytes,
                                                          len / col_bytes, factor);
                                  });
      }
    });
  }

  // Every background job finished (nothing applied).
  void quiesce() {
    scheduler_.wait_offload();
    scheduler_.wait();
  }

  // The host's staged params of columns list[0..n) of matrix i into the device params: gathered
  // on the host into the staging area, one transfer per chunk, scattered on the device.
  void upload(std::size_t i, const std::uint32_t* list, const std::uint32_t* list_dev, std::size_t n) {
    const matrix_param& p = matrices_[i];
    const std::size_t chunk = host_.stage_columns(i), cb = p.rows * size_of(p.param_type);
    const unsigned char* staged = host_.matrix(i).param_stage.data();
    auto* st = static_cast<unsigned char*>(host_.stage());
    for (std::size_t c0 = 0; c0 < n; c0 += chunk) {
      const std::size_t m = std::min(chunk, n - c0);
      for (std::size_t k = 0; k < m; ++k) std::memcpy(st + k * cb, staged + std::size_t(list[c0 + k]) * cb, cb);
      transport_.to_device(dev_stage_.data(), st, m * cb);
      space_.scatter_columns(dev_stage_.data(), p.param_type, p.param, p.layout, p.rows, p.cols, list_dev + c0, m);
    }
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
    for (std::size_t i = 0; i < matrices_.size(); ++i)
      upload(i, unselected_[i].data(), unselected_dev(i), unselected_[i].size());
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
    updater_.fetch_scores(space_, score_kind::l1);
    std::size_t eligible = 0, needing = 0;
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const std::size_t k = selected_[i].size(), cols = matrices_[i].cols;
      if (k == 0 || k == cols) continue;
      const double* l1 = updater_.scores(i, score_kind::l1);
      double sel = 0, all = 0;
      for (std::size_t s = 0; s < k; ++s) sel += l1[selected_[i][s]];
      for (std::size_t c = 0; c < cols; ++c) all += l1[c];
      const double f = double(factor);
      auto_a_[i] += f * sel / double(k);
      auto_b_[i] += f * (all - sel) / double(cols - k);
      ++eligible;
      if (auto_b_[i] >= auto_a_[i] / double(window_steps_)) ++needing;
    }
    return eligible == 0 || double(needing) >= cfg_.auto_ratio * double(eligible);
  }

  // Picks the new columns of every matrix from this step's scores and swaps their state. The
  // updater may select on the device (cuda_space's top-k for column_topk); otherwise the
  // Selector runs on the host over the scores.
  void select() {
    std::vector<std::vector<std::uint32_t>> chosen(matrices_.size());
    bool done = false;
    if constexpr (device_topk_updater<GpuUpdater, Space>) {
      if constexpr (std::is_same_v<Selector, column_topk>) {
        updater_.select_topk(space_, cfg_.score, chosen);
        done = true;
      }
    }
    if (!done) {
      if constexpr (Selector::needs_scores) updater_.fetch_scores(space_, cfg_.score);
      for (std::size_t i = 0; i < matrices_.size(); ++i) {
        const std::size_t k = updater_.matrix(i).k;
        if (k == 0) continue;
        chosen[i].resize(k);
        Selector::select(Selector::needs_scores ? updater_.scores(i, cfg_.score) : nullptr, matrices_[i].cols, k,
                         chosen[i].data());
      }
    }
    for (std::size_t i = 0; i < matrices_.size(); ++i)
      if (updater_.matrix(i).k) swap_columns(i, chosen[i]);
    ++selections_;
  }

  // Columns that leave hand their fp32 master, moments and count to the host; columns that join
  // take theirs from the host; columns that stay move between the two device slot sets. Planned
  // on the host, then carried out in bulk: device-side slot moves, and one transfer per chunk
  // and array for each direction (12*rows + 4 bytes per column changing sides).
  void swap_columns(std::size_t i, const std::vector<std::uint32_t>& next) {
    auto& d = updater_.matrix(i);
    auto& hs = host_.matrix(i);
    const std::size_t rows = matrices_[i].rows;
    const int cur = d.cur, nxt = cur ^ 1;
    const std::vector<std::uint32_t>& old = selected_[i];
    // plan: leave_slot/leave_col, stay_src/stay_dst, join_slot/join_col
    std::vector<std::uint32_t> slots, leave_col, join_col;
    std::vector<std::uint32_t> leave_slot, stay_src, stay_dst, join_slot;
    for (std::size_t s = 0, j = 0; s < old.size(); ++s) {
      while (j < next.size() && next[j] < old[s]) ++j;
      if (j < next.size() && next[j] == old[s]) continue;
      leave_slot.push_back(std::uint32_t(s));
      leave_col.push_back(old[s]);
    }
    for (std::size_t s = 0, j = 0; s < next.size(); ++s) {
      while (j < old.size() && old[j] < next[s]) ++j;
      if (j < old.size() && old[j] == next[s]) {
        stay_src.push_back(std::uint32_t(j));
        stay_dst.push_back(std::uint32_t(s));
      } else {
        join_slot.push_back(std::uint32_t(s));
        join_col.push_back(next[s]);
      }
    }
    const std::size_t nl = leave_slot.size(), ns = stay_src.size(), nj = join_slot.size();
    for (const auto* v : {&leave_slot, &stay_src, &stay_dst, &join_slot}) slots.insert(slots.end(), v->begin(), v->end());
    if (!slots.empty()) space_.upload(slots_dev_.data(), slots.data(), 4 * slots.size());
    const std::uint32_t* leave_dev = slots_dev_.data();
    const std::uint32_t* src_dev = leave_dev + nl;
    const std::uint32_t* dst_dev = src_dev + ns;
    const std::uint32_t* join_dev = dst_dev + ns;

    float* dev_cur[3] = {d.master[cur].data(), d.exp_avg[cur].data(), d.exp_avg_sq[cur].data()};
    float* dev_nxt[3] = {d.master[nxt].data(), d.exp_avg[nxt].data(), d.exp_avg_sq[nxt].data()};
    float* host_arr[3] = {hs.master.data(), hs.exp_avg.data(), hs.exp_avg_sq.data()};
    auto* st = static_cast<unsigned char*>(host_.stage());
    const std::size_t chunk = host_.stage_columns(i);
    // staying columns change slot set on the device
    for (int a = 0; a < 3; ++a) space_.move_slots(dev_nxt[a], dst_dev, dev_cur[a], src_dev, ns, 4 * rows);
    space_.move_slots(d.counts[nxt].data(), dst_dev, d.counts[cur].data(), src_dev, ns, 4);
    // leaving: gathered on the device, one transfer, scattered into the host arrays
    for (std::size_t c0 = 0; c0 < nl; c0 += chunk) {
      const std::size_t m = std::min(chunk, nl - c0);
      for (int a = 0; a < 3; ++a) {
        space_.move_slots(dev_stage_.data(), nullptr, dev_cur[a], leave_dev + c0, m, 4 * rows);
        transport_.to_host(st, dev_stage_.data(), m * rows * 4);
        for (std::size_t k = 0; k < m; ++k)
          std::memcpy(host_arr[a] + std::size_t(leave_col[c0 + k]) * rows, st + k * rows * 4, rows * 4);
      }
      space_.move_slots(dev_stage_.data(), nullptr, d.counts[cur].data(), leave_dev + c0, m, 4);
      transport_.to_host(st, dev_stage_.data(), m * 4);
      for (std::size_t k = 0; k < m; ++k) std::memcpy(hs.counts.data() + leave_col[c0 + k], st + k * 4, 4);
    }
    // joining: gathered on the host, one transfer, scattered into the new device slots
    for (std::size_t c0 = 0; c0 < nj; c0 += chunk) {
      const std::size_t m = std::min(chunk, nj - c0);
      for (int a = 0; a < 3; ++a) {
        for (std::size_t k = 0; k < m; ++k)
          std::memcpy(st + k * rows * 4, host_arr[a] + std::size_t(join_col[c0 + k]) * rows, rows * 4);
        transport_.to_device(dev_stage_.data(), st, m * rows * 4);
        space_.move_slots(dev_nxt[a], join_dev + c0, dev_stage_.data(), nullptr, m, 4 * rows);
      }
      for (std::size_t k = 0; k < m; ++k) std::memcpy(st + k * 4, hs.counts.data() + join_col[c0 + k], 4);
      transport_.to_device(dev_stage_.data(), st, m * 4);
      space_.move_slots(d.counts[nxt].data(), join_dev + c0, dev_stage_.data(), nullptr, m, 4);
    }
    if (!next.empty()) space_.upload(d.columns[nxt].data(), next.data(), 4 * next.size());
    d.cur = nxt;
    d.active = next.size();
    selected_[i] = next;
    set_unselected(i);
  }

  template <class DeviceArray, class HostArray>
  void column_state(std::size_t matrix, float* out, DeviceArray dev, HostArray host) {
    check_matrix(matrix);
    quiesce();
    const std::size_t rows = matrices_[matrix].rows, cols = matrices_[matrix].cols;
    const float* h = host(host_.matrix(matrix));
    std::copy_n(h, rows * cols, out);
    auto& d = updater_.matrix(matrix);
    const std::vector<float> dv = download<float>(dev(d, d.cur), d.active * rows);
    for (std::size_t s = 0; s < d.active; ++s)
      std::copy_n(dv.data() + s * rows, rows, out + std::size_t(selected_[matrix][s]) * rows);
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
  // host mirrors of each matrix's column lists: all, unselected, selected (ascending)
  std::vector<std::vector<std::uint32_t>> all_columns_, unselected_, selected_;
  bool initialized_ = false, any_selected_ = false, selected_once_ = false, pending_ = false;
  bool async_offload_ = false;
  typename Space::template buffer<unsigned char> grad_compact_, dev_stage_;
  std::vector<typename Space::template buffer<std::uint32_t>> lists_dev_;
  typename Space::template buffer<std::uint32_t> slots_dev_;
  typename Space::event compacted_;
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
class zero_offload : public optimizer<Space, select_none, fused_adamw<Space>, simd_accumulator, default_transport_t<Space>, synchronous> {
  using base = optimizer<Space, select_none, fused_adamw<Space>, simd_accumulator, default_transport_t<Space>, synchronous>;
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
class device_adam : public optimizer<Space, select_all, fused_adamw<Space>, simd_accumulator, default_transport_t<Space>, synchronous> {
  using base = optimizer<Space, select_all, fused_adamw<Space>, simd_accumulator, default_transport_t<Space>, synchronous>;
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
