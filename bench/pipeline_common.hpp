// What bench/pipeline (emulated device) and bench/pipeline_cuda (a real GPU) share: the model
// shapes, the sweep, the ZeRO-Offload config and the JSON line of one configuration.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <zenflow/zenflow.hpp>

#include "args.hpp"
#include "machine.hpp"

namespace zf_bench {

// A Llama-style decoder layer: q, k, v, o (hidden x hidden), gate and up (ffn x hidden), down
// (hidden x ffn), two RMSNorm weights; bf16 params and grads, column-contiguous (the layout
// DeepSpeed gives ZenFlow: the fast path, for both optimizers alike).
struct model {
  struct mat {
    std::size_t rows, cols;
  };
  std::vector<mat> mats;
  std::vector<std::size_t> vecs;
  std::size_t params = 0;

  model(std::size_t layers, std::size_t d, std::size_t f) {
    for (std::size_t l = 0; l < layers; ++l) {
      for (int k = 0; k < 4; ++k) mats.push_back({d, d});
      mats.push_back({f, d});
      mats.push_back({f, d});
      mats.push_back({d, f});
      vecs.push_back(d);
      vecs.push_back(d);
    }
    for (auto m : mats) params += m.rows * m.cols;
    for (auto n : vecs) params += n;
  }

  // Registers every parameter; alloc(n, value) returns a bf16 buffer of n elements (the
  // caller's kind of memory) holding value.
  template <class Opt, class Alloc>
  void register_with(Opt& opt, Alloc&& alloc) const {
    for (auto m : mats) {
      void* w = alloc(m.rows * m.cols, 0.01f);
      void* g = alloc(m.rows * m.cols, 1e-3f);
      opt.add_matrix({w, g, m.rows, m.cols, zenflow::dtype::bf16, zenflow::dtype::bf16,
                      zenflow::matrix_layout::column_contiguous});
    }
    for (auto n : vecs) {
      void* w = alloc(n, 1.0f);
      void* g = alloc(n, 1e-3f);
      opt.add_vector({w, g, n, zenflow::dtype::bf16, zenflow::dtype::bf16});
    }
  }
};

struct result {
  double step_s = 0, stall_s = 0, host_update_s = 0, device_work_s = 0;
  double d2h_bytes = 0, h2d_bytes = 0;
  double link_model_s[2] = {0, 0};
  double reduce_s = 0;  // data parallel: the gradient reduction, per step
  // The measured steps one by one (from one return of step() to the next): their median, and the
  // step that made a selection (0: none in the span) — its excess over the median is what a
  // reselection (the drain, top-k, the column-state swaps) adds to a step; of that step, the time
  // step() waited for host work (the optimizer's stall_seconds over the step: the drain's wait
  // for the host update in flight, which the selection must see applied).
  double median_step_s = 0, selection_step_s = 0, selection_stall_s = 0;
};

// Times `steps` calls of one() one by one into r (median_step_s, selection_step_s,
// selection_stall_s); stats() reads the optimizer's counters (selections, stall_seconds).
template <class One, class Stats>
void time_steps(int steps, One&& one, Stats&& stats, result& r) {
  std::vector<double> t;
  t.reserve(std::size_t(steps));
  auto before = stats();
  auto prev = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    one();
    const auto now = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double>(now - prev).count());
    prev = now;
    const auto after = stats();
    if (after.selections != before.selections) {
      r.selection_step_s = t.back();
      r.selection_stall_s = after.stall_seconds - before.stall_seconds;
    }
    before = after;
  }
  if (t.empty()) return;
  std::sort(t.begin(), t.end());
  r.median_step_s = t[t.size() / 2];
}

inline zenflow::config zero_offload_config(unsigned threads) {
  zenflow::config c;
  c.topk_ratio = 0;
  c.update_interval = zenflow::interval::every(1);
  c.select_interval = zenflow::interval::every(1);
  c.overlap_step = false;
  c.host_threads = threads;
  return c;
}

struct point {
  double r;
  unsigned U;
  // forward/backward time over ZeRO-Offload's host update time with all cores (the calibration;
  // JSON compute_over_host_update); a point with fewer host threads writes its own ratio too
  // (compute_over_this_host_update: against that run's host update)
  double compute_frac;
  double gbps;          // link bandwidth (emulated only; a GPU has its own)
  unsigned threads;
  const char* sweep;
  bool upload_ahead = false;  // ZenFlow's transport uploads a host update's params ahead of its boundary
};

// The base point first, then the base point and the lowest compute ratio with uploads ahead, then
// the sweeps: a run cut short by a time limit (or --quick, which keeps two) has the goal's point
// and its variant.
inline std::vector<point> sweep_points(unsigned cores, bool link_sweep) {
  std::vector<point> points;
  points.push_back({0.1, 4, 0.5, 25.0, 0, "base"});
  points.push_back({0.1, 4, 0.5, 25.0, 0, "upload_ahead", true});
  points.push_back({0.1, 4, 0.25, 25.0, 0, "upload_ahead", true});
  for (double r : {0.01, 0.05, 0.2}) points.push_back({r, 4, 0.5, 25.0, 0, "topk_ratio"});
  for (unsigned U : {1u, 2u, 8u}) points.push_back({0.1, U, 0.5, 25.0, 0, "update_interval"});
  for (double f : {0.25, 1.0, 2.0}) points.push_back({0.1, 4, f, 25.0, 0, "compute"});
  if (link_sweep)
    for (double g : {12.0, 50.0}) points.push_back({0.1, 4, 0.5, g, 0, "link"});
  if (cores > 1) points.push_back({0.1, 4, 0.5, 25.0, 1, "host_threads"});
  return points;
}

// Only the points of the named sweeps ("base,upload_ahead"; empty: all of them).
// The model and span flags both pipeline benches take (--quick: a 3M-parameter model, 8 steps).
struct model_args {
  bool quick;
  std::size_t layers, hidden, ffn;
  int steps;  // a multiple of 8: the update intervals of the sweep divide it
  std::string out;
};
inline model_args read_model_args(const args& a) {
  model_args m;
  m.quick = a.has("--quick");
  m.layers = a.count("--layers", m.quick ? 1 : 4, 1, 1024);
  m.hidden = a.count("--hidden", m.quick ? 512 : 2048, 1, 1 << 20);
  m.ffn = a.count("--ffn", m.quick ? 1376 : 5504, 1, 1 << 20);
  m.steps = int(a.count("--steps", m.quick ? 8 : 64, 8, 1 << 20));
  if (m.steps % 8) a.fail("--steps must be a multiple of 8 (the update intervals divide it), got " + std::to_string(m.steps));
  m.out = a.text("--out", "");
  return m;
}

// --sweeps: only the named sweeps' points (a name no point has is refused).
inline void keep_sweeps(std::vector<point>& points, const std::string& names, const args& a) {
  if (names.empty()) return;
  std::vector<point> kept;
  for (const point& p : points)
    if (("," + names + ",").find("," + std::string(p.sweep) + ",") != std::string::npos) kept.push_back(p);
  for (std::size_t at = 0; at <= names.size();) {
    std::size_t end = names.find(',', at);
    if (end == std::string::npos) end = names.size();
    const std::string name = names.substr(at, end - at);
    bool known = false;
    for (const point& p : points) known = known || name == p.sweep;
    if (!known) a.fail("--sweeps: no sweep named '" + name + "' here");
    at = end + 1;
  }
  points = kept;
}

// ZenFlow's config at a point; the measured span (one select interval of `steps`) holds one
// reselection.
inline zenflow::config zenflow_config(const point& p, int steps) {
  zenflow::config c;
  c.topk_ratio = p.r;
  c.update_interval = zenflow::interval::every(p.U);
  c.select_interval = zenflow::interval::every(std::uint32_t(steps));
  c.overlap_step = true;
  c.host_threads = p.threads;
  return c;
}

// One point measured as `pairs` pairs of runs, ZeRO-Offload and ZenFlow alternated (ZO ZF, then
// ZF ZO, ...), each run on a fresh optimizer: the ratios are taken per pair (two runs back to back,
// under the same drift of a noisy machine) and reported as their median and range; the runs'
// own figures as field-by-field medians.
struct paired {
  result zf, zo;
  int pairs = 0;
  double speedup = 0, speedup_lo = 0, speedup_hi = 0;
  double stall_reduction = 0, stall_reduction_lo = 0, stall_reduction_hi = 0;
};
inline double median_of(std::vector<double> v) {
  std::vector<double> finite;
  for (double x : v)
    if (std::isfinite(x)) finite.push_back(x);
  if (finite.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(finite.begin(), finite.end());
  const std::size_t n = finite.size();
  return n % 2 ? finite[n / 2] : 0.5 * (finite[n / 2 - 1] + finite[n / 2]);
}
inline result median_result(const std::vector<result>& rs) {
  auto med = [&](auto field) {
    std::vector<double> v;
    for (const result& r : rs) v.push_back(field(r));
    return median_of(v);
  };
  result m;
  m.step_s = med([](const result& r) { return r.step_s; });
  m.stall_s = med([](const result& r) { return r.stall_s; });
  m.host_update_s = med([](const result& r) { return r.host_update_s; });
  m.device_work_s = med([](const result& r) { return r.device_work_s; });
  m.d2h_bytes = med([](const result& r) { return r.d2h_bytes; });
  m.h2d_bytes = med([](const result& r) { return r.h2d_bytes; });
  m.link_model_s[0] = med([](const result& r) { return r.link_model_s[0]; });
  m.link_model_s[1] = med([](const result& r) { return r.link_model_s[1]; });
  m.reduce_s = med([](const result& r) { return r.reduce_s; });
  m.median_step_s = med([](const result& r) { return r.median_step_s; });
  m.selection_step_s = med([](const result& r) { return r.selection_step_s; });
  m.selection_stall_s = med([](const result& r) { return r.selection_stall_s; });
  return m;
}
template <class RunZf, class RunZo>
paired run_pairs(int pairs, RunZf&& run_zf, RunZo&& run_zo) {
  std::vector<result> zf, zo;
  std::vector<double> speedup, stall;
  for (int i = 0; i < pairs; ++i) {
    result a, b;
    if (i % 2 == 0) {
      b = run_zo();
      a = run_zf();
    } else {
      a = run_zf();
      b = run_zo();
    }
    zf.push_back(a);
    zo.push_back(b);
    speedup.push_back(b.step_s / a.step_s);
    stall.push_back(b.stall_s > 0 ? 1.0 - a.stall_s / b.stall_s : std::numeric_limits<double>::quiet_NaN());
  }
  paired p;
  p.pairs = pairs;
  p.zf = median_result(zf);
  p.zo = median_result(zo);
  p.speedup = median_of(speedup);
  p.stall_reduction = median_of(stall);
  auto range = [](const std::vector<double>& v, double& lo, double& hi) {
    lo = std::numeric_limits<double>::infinity();
    hi = -lo;
    for (double x : v)
      if (std::isfinite(x)) lo = std::min(lo, x), hi = std::max(hi, x);
    if (lo > hi) lo = hi = std::numeric_limits<double>::quiet_NaN();
  };
  range(speedup, p.speedup_lo, p.speedup_hi);
  range(stall, p.stall_reduction_lo, p.stall_reduction_hi);
  return p;
}

// One JSON line. With `pr` (the point measured in pairs): zf and zo are the pairs' medians, the
// speedup and stall reduction the medians of the per-pair ratios, with their ranges and the
// number of pairs; without, one run of each.
inline void print_line(FILE* out, const char* device, const point& p, const model& shape, double compute,
                       double link_gbps, double latency_us, unsigned cores, const result& zf, const result& zo,
                       const paired* pr = nullptr) {
  const double model_bytes = double(shape.params) * 2;  // bf16
  const double threads_used = p.threads ? p.threads : cores;
  std::fprintf(out,
               "{%s\"bench\":\"pipeline\",\"device\":\"%s\",\"cpu\":\"%s\","
               "\"sweep\":\"%s\",\"params\":%zu,\"model_bytes\":%.0f,\"topk_ratio\":%g,\"update_interval\":%u,"
               "\"compute_s\":%.5f,\"compute_over_host_update\":%g,\"compute_over_this_host_update\":%.4f,"
               "\"link_gbps\":%g,\"link_latency_us\":%g,"
               "\"host_threads\":%g,\"cores\":%u,\"upload_ahead\":%s,"
               "\"zenflow\":{\"step_s\":%.5f,\"stall_s\":%.5f,\"host_update_s\":%.5f,\"device_work_s\":%.6f,"
               "\"d2h_bytes\":%.0f,\"h2d_bytes\":%.0f,\"bytes_over_model\":%.4f,\"link_s\":[%.5f,%.5f],"
               "\"median_step_s\":%.5f,\"selection_step_s\":%.5f,\"selection_stall_s\":%.5f},"
               "\"zero_offload\":{\"step_s\":%.5f,\"stall_s\":%.5f,\"host_update_s\":%.5f,\"device_work_s\":%.6f,"
               "\"d2h_bytes\":%.0f,\"h2d_bytes\":%.0f,\"bytes_over_model\":%.4f,\"link_s\":[%.5f,%.5f]},"
               "\"speedup\":%.3f,\"stall_reduction\":%s,\"pairs\":%d,\"speedup_range\":[%s,%s],"
               "\"stall_reduction_range\":[%s,%s]}\n",
               zf_bench::run_fields(),
               device, zf_bench::cpu_model().c_str(), p.sweep, shape.params, model_bytes, p.r, p.U, compute, p.compute_frac,
               zo.host_update_s > 0 ? compute / zo.host_update_s : 0.0, link_gbps, latency_us,
               threads_used, cores, p.upload_ahead ? "true" : "false", zf.step_s, zf.stall_s, zf.host_update_s, zf.device_work_s, zf.d2h_bytes,
               zf.h2d_bytes, (zf.d2h_bytes + zf.h2d_bytes) / model_bytes, zf.link_model_s[0], zf.link_model_s[1],
               zf.median_step_s, zf.selection_step_s, zf.selection_stall_s,
               zo.step_s, zo.stall_s, zo.host_update_s, zo.device_work_s, zo.d2h_bytes, zo.h2d_bytes,
               (zo.d2h_bytes + zo.h2d_bytes) / model_bytes, zo.link_model_s[0], zo.link_model_s[1],
               pr ? pr->speedup : zo.step_s / zf.step_s,
               json_number(pr ? pr->stall_reduction : 1.0 - zf.stall_s / zo.stall_s).c_str(), pr ? pr->pairs : 1,
               json_number(pr ? pr->speedup_lo : zo.step_s / zf.step_s).c_str(),
               json_number(pr ? pr->speedup_hi : zo.step_s / zf.step_s).c_str(),
               json_number(pr ? pr->stall_reduction_lo : 1.0 - zf.stall_s / zo.stall_s).c_str(),
               json_number(pr ? pr->stall_reduction_hi : 1.0 - zf.stall_s / zo.stall_s).c_str());
  std::fflush(out);
}

}  // namespace zf_bench
