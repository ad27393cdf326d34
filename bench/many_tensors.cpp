// bench/many_tensors: a model made of very many small tensors (norms, biases, small heads) against
// the same number of parameters in one matrix and one vector, side by side in one run.
//
// Measures registration, initialize() and a step's time, and compares the optimizer's own
// memory account (stats(): host pageable + pinned + device + bookkeeping bytes) with the process's RSS growth.
// One JSON object per line:
//   many_tensors [--tensors 100000] [--elements 8] [--steps 20] [--threads 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <oneapi/tbb/global_control.h>

#include <zenflow/zenflow.hpp>

#include "args.hpp"
#include "machine.hpp"

namespace {

using clk = std::chrono::steady_clock;
double seconds(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Resident set size of this process in bytes (Linux), 0 where unknown.
std::uint64_t rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  return 0;
}

struct options {
  std::size_t tensors = 100000, elements = 8, steps = 20, threads = 2;
};

// Half the tensors are matrices (2 x elements/2), half vectors (elements); or, for the "one"
// layout, one matrix and one vector holding the same number of parameters.
void run(const char* layout, const options& o) {
  const bool many = std::string(layout) == "many";
  const std::size_t nm = o.tensors / 2, nv = o.tensors - nm;
  const std::size_t total_m = nm * o.elements, total_v = nv * o.elements;
  std::vector<float> w(total_m), dw(total_m), b(total_v), db(total_v);
  std::mt19937 gen(1);
  std::normal_distribution<float> d(0.0f, 0.02f);
  for (auto& x : w) x = d(gen);
  for (auto& x : b) x = d(gen);

  zenflow::config cfg;  // the defaults: topk 0.1, U 4, overlap on
  cfg.host_threads = std::uint32_t(o.threads);
  const std::uint64_t rss0 = rss_bytes();
  zenflow::optimizer<> opt(cfg);
  const auto t0 = clk::now();
  if (many) {
    const std::size_t cols = o.elements / 2;
    for (std::size_t i = 0; i < nm; ++i)
      opt.add_matrix(zenflow::matrix(w.data() + i * o.elements, dw.data() + i * o.elements, zenflow::rows{2},
                                     zenflow::cols{cols}));
    for (std::size_t i = 0; i < nv; ++i)
      opt.add_vector(zenflow::vector(b.data() + i * o.elements, db.data() + i * o.elements, o.elements));
  } else {
    opt.add_matrix(zenflow::matrix(w.data(), dw.data(), zenflow::rows{2}, zenflow::cols{total_m / 2}));
    opt.add_vector(zenflow::vector(b.data(), db.data(), total_v));
  }
  const auto t1 = clk::now();
  opt.initialize();
  const auto t2 = clk::now();
  std::vector<double> step_s;
  for (std::size_t s = 0; s < o.steps; ++s) {
    for (auto& x : dw) x = d(gen);
    for (auto& x : db) x = d(gen);
    const auto a = clk::now();
    opt.step();
    step_s.push_back(seconds(a, clk::now()));
  }
  opt.synchronize();
  const std::uint64_t rss1 = rss_bytes();
  const zenflow::optimizer_stats st = opt.stats();
  const std::uint64_t counted =
      st.host_pageable_bytes + st.host_pinned_bytes + st.device_bytes + st.host_bookkeeping_bytes;
  std::sort(step_s.begin(), step_s.end());
  std::printf(
      "{%s\"bench\":\"many_tensors\",\"layout\":\"%s\",\"tensors\":%zu,\"params\":%zu,\"threads\":%zu,"
      "\"register_s\":%.6f,\"initialize_s\":%.6f,\"step_median_s\":%.6f,\"steps\":%zu,"
      "\"stats_bytes\":%llu,\"rss_growth_bytes\":%llu,\"stats_over_rss\":%.4f,\"cpu\":\"%s\"}\n",
      zf_bench::run_fields(),
      layout, many ? o.tensors : std::size_t(2), total_m + total_v, o.threads, seconds(t0, t1), seconds(t1, t2),
      step_s[step_s.size() / 2], o.steps, (unsigned long long)counted, (unsigned long long)(rss1 > rss0 ? rss1 - rss0 : 0),
      rss1 > rss0 ? double(counted) / double(rss1 - rss0) : 0.0, zf_bench::cpu_model().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  zf_bench::record_run(argc, argv);
  options o;
  const zf_bench::args a("many_tensors", argc, argv, {"--tensors", "--elements", "--steps", "--threads"});
  o.tensors = a.count("--tensors", o.tensors, 0, 1u << 30);
  o.elements = a.count("--elements", o.elements, 0, 1ull << 40);
  // (the model's two buffers of tensors / 2 x elements floats each must be sizable)
  if (o.tensors > 1 && o.elements > (std::size_t(1) << 40) / (o.tensors / 2 + 1))
    a.fail("--tensors x --elements too large (" + std::to_string(o.tensors) + " x " + std::to_string(o.elements) + ")");
  o.steps = a.count("--steps", o.steps, 0, 1u << 30);
  o.threads = a.count("--threads", o.threads, 0, 1024);
  if (o.tensors < 2 || o.elements < 2 || o.elements % 2 || o.steps == 0 || o.threads == 0) {
    std::fprintf(stderr, "many_tensors: need tensors >= 2, an even elements >= 2, steps and threads >= 1\n");
    return 2;
  }
  tbb::global_control gc(tbb::global_control::max_allowed_parallelism, o.threads);
  // the single-tensor layout first, so the many-tensor run's RSS growth is not hidden by freed pages
  run("one", o);
  run("many", o);
}
