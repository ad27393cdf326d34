// bench/cpu_adam: host kernels against a measured memory roofline, side by side in one run.
//
// For each kernel, size and thread count it times the kernel and its memory-only twin (the
// same loads and stores, no arithmetic: kernel_table::*_traffic) alternately on equal-sized
// buffers, and prints one JSON object per line with the medians and ratio = gbps / roofline.
//
//   cpu_adam [--sizes 1M,16M,128M] [--threads 1,2] [--reps 9] [--isa avx512_bf16|avx512|avx2|sse2|scalar]
//            [--versus TIER]
// (--isa: the best tier the CPU has unless given.) --versus adds lines timing the kernels that
// round to bf16 on --isa's tier and on TIER alternately, on the same buffers: "speedup" is
// TIER's median time over the tier's. A rank_sum line times the data-parallel reduction's sum
// (4 ranks' bf16 pieces) on the arena against the calling thread alone ("speedup"), and a
// column_scatter line a reselection's column moves (copy_pieces) against one thread's loop.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <oneapi/tbb/global_control.h>

#include <zenflow/zenflow.hpp>

#include "machine.hpp"

using namespace zenflow;
using namespace zenflow::host;

namespace {

std::vector<std::size_t> parse_list(const std::string& s) {
  std::vector<std::size_t> out;
  std::size_t pos = 0;
  while (pos < s.size()) {
    std::size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(pos, end - pos);
    std::size_t mult = 1;
    if (!item.empty() && (item.back() == 'M' || item.back() == 'K')) {
      mult = item.back() == 'M' ? (1u << 20) : (1u << 10);
      item.pop_back();
    }
    // (digits only: stoull would take "-1" as 2^64 - 1)
    bool digits = !item.empty() && item.size() <= 12;
    for (char ch : item) digits = digits && ch >= '0' && ch <= '9';
    const unsigned long long v = digits ? std::stoull(item) : 0;
    if (v == 0) throw std::invalid_argument("bad list item '" + s.substr(pos, end - pos) + "'");
    out.push_back(std::size_t(v) * mult);
    pos = end + 1;
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One set of buffers for the kernel or its roofline twin: zeroed by the constructing thread
// (host_array), then written by the arena's threads with the same static split as the kernels.
struct state {
  host_array<float> p, m, v, g32, acc;
  host_array<bfloat16> g16, copy;
  state(tbb::task_arena& arena, std::size_t n)
      : p(n), m(n), v(n), g32(n), acc(n), g16(n), copy(n) {
    std::mt19937 gen(42);
    std::normal_distribution<float> d(0.0f, 1e-3f);
    std::vector<float> sample(4096);
    for (auto& x : sample) x = d(gen);
    parallel_blocks(arena, n, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) {
        p[i] = 1.0f;
        g32[i] = sample[i % sample.size()];
        g16[i] = to_bfloat16(g32[i]);
      }
    });
  }
};

struct kernel_case {
  const char* name;
  double bytes_per_elem;
  void (*run)(tbb::task_arena&, state&, std::size_t n, const kernel_table&, bool traffic);
};

void run_adamw(tbb::task_arena& arena, state& s, std::size_t n, const kernel_table& k, bool traffic,
               bool copy) {
  adamw_job j;
  j.param = s.p.data(); j.exp_avg = s.m.data(); j.exp_avg_sq = s.v.data();
  j.grad = s.g32.data(); j.grad_type = dtype::f32;
  if (copy) { j.param_copy = s.copy.data(); j.copy_type = dtype::bf16; }
  j.rows = n;
  static std::uint32_t count = 0;
  j.counts = &count;
  auto fn = traffic ? k.adamw_traffic : k.adamw;
  parallel_blocks(arena, n, [&](std::size_t b, std::size_t e) { fn(j, b, e); });
}

void run_accumulate(tbb::task_arena& arena, state& s, std::size_t n, const kernel_table& k, bool traffic,
                    bool bf16) {
  accumulate_job j{s.acc.data(), bf16 ? static_cast<const void*>(s.g16.data()) : s.g32.data(),
                   bf16 ? dtype::bf16 : dtype::f32, 1.0f};
  auto fn = traffic ? k.accumulate_traffic : k.accumulate;
  parallel_blocks(arena, n, [&](std::size_t b, std::size_t e) { fn(j, b, e); });
}

void run_convert(tbb::task_arena& arena, state& s, std::size_t n, const kernel_table& k) {
  const convert_job j{s.g32.data(), dtype::f32, s.copy.data(), dtype::bf16};
  parallel_blocks(arena, n, [&](std::size_t b, std::size_t e) { k.convert(j, b, e); });
}

// --versus: the kernels that round to bf16, timed on two tiers alternately
struct versus_case {
  const char* name;
  void (*run)(tbb::task_arena&, state&, std::size_t n, const kernel_table&);
};
const versus_case versus_cases[] = {
    {"adamw_f32_bf16out", [](auto& a, auto& s, auto n, auto& k) { run_adamw(a, s, n, k, false, true); }},
    {"convert_f32_bf16", [](auto& a, auto& s, auto n, auto& k) { run_convert(a, s, n, k); }},
};

const kernel_case cases[] = {
    // AdamW fp32: reads p, g, m, v (16 B), writes p, m, v (12 B)
    {"adamw_f32", 28, [](auto& a, auto& s, auto n, auto& k, bool t) { run_adamw(a, s, n, k, t, false); }},
    // + the bf16 copy of the new params (2 B written)
    {"adamw_f32_bf16out", 30, [](auto& a, auto& s, auto n, auto& k, bool t) { run_adamw(a, s, n, k, t, true); }},
    // acc += g: reads acc (4 B) and a bf16 or fp32 gradient, writes acc (4 B)
    {"accumulate_bf16", 10, [](auto& a, auto& s, auto n, auto& k, bool t) { run_accumulate(a, s, n, k, t, true); }},
    {"accumulate_f32", 12, [](auto& a, auto& s, auto n, auto& k, bool t) { run_accumulate(a, s, n, k, t, false); }},
};

// Before a case is timed: the tier's result on fresh inputs has the scalar tier's bits (every
// tier computes the same bits, a promise of the library), so that a kernel that skipped or botched
// work is not timed as fast. On the first 2^20 elements (all of them when fewer).
void check_against_scalar(tbb::task_arena& arena, const kernel_case& c, const kernel_table& k, std::size_t n) {
  const std::size_t m = std::min<std::size_t>(n, std::size_t(1) << 20);
  state a(arena, m), b(arena, m);
  c.run(arena, a, m, k, false);
  c.run(arena, b, m, kernels(isa::scalar), false);
  auto same = [m](const auto& x, const auto& y) { return std::memcmp(x.data(), y.data(), m * sizeof(*x.data())) == 0; };
  if (!same(a.p, b.p) || !same(a.m, b.m) || !same(a.v, b.v) || !same(a.acc, b.acc) || !same(a.copy, b.copy))
    throw std::runtime_error(std::string(c.name) + ": the " + std::string(name_of(k.tier)) +
                             " kernel's result differs from the scalar tier's");
}

}  // namespace

int main(int argc, char** argv) try {
  zf_bench::record_run(argc, argv);
  std::vector<std::size_t> sizes = {1u << 20, 16u << 20, 128u << 20};
  std::vector<std::size_t> threads = {1, 2};
  int reps = 9;
  isa tier = best_isa();
  const kernel_table* versus = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--sizes") sizes = parse_list(value());
    else if (a == "--threads") threads = parse_list(value());
    else if (a == "--reps") {
      const std::string v = value();
      bool digits = !v.empty() && v.size() <= 4;
      for (char ch : v) digits = digits && ch >= '0' && ch <= '9';
      if (!digits || std::stoi(v) < 1) throw std::invalid_argument("--reps expects an integer in [1, 9999], got '" + v + "'");
      reps = std::stoi(v);
    }
    else if (a == "--isa" || a == "--versus") {
      const std::string t = value();
      const auto named = std::find_if(std::begin(all_isas), std::end(all_isas), [&](isa u) { return name_of(u) == t; });
      if (named == std::end(all_isas)) throw std::invalid_argument("unknown " + a + " " + t);
      if (a == "--isa") tier = *named;
      else versus = &kernels(*named);
    } else if (a == "--help" || a == "-h") {
      std::puts("cpu_adam [--sizes 1M,16M,128M] [--threads 1,2] [--reps 9] [--isa avx512_bf16|avx512|avx2|sse2|scalar] [--versus TIER]");
      return 0;
    } else {
      throw std::invalid_argument("unknown argument " + a + " (try --help)");
    }
  }
  const kernel_table& k = kernels(tier);
  const std::string cpu = zf_bench::cpu_model();
  const std::size_t max_threads = *std::max_element(threads.begin(), threads.end());
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, max_threads);

  for (std::size_t n : sizes)
    for (std::size_t t : threads) {
      tbb::task_arena arena{int(t)};
      state work(arena, n), roof(arena, n);
      for (const kernel_case& c : cases) {
        check_against_scalar(arena, c, k, n);
        std::vector<double> tk, tr;
        for (int r = -1; r < reps; ++r) {  // r = -1: warm-up, not recorded
          for (int which = 0; which < 2; ++which) {  // alternate kernel and roofline
            const bool traffic = (which == 1) ^ (r % 2 != 0);
            state& s = traffic ? roof : work;
            const auto t0 = std::chrono::steady_clock::now();
            c.run(arena, s, n, k, traffic);
            const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (r >= 0) (traffic ? tr : tk).push_back(dt);
          }
        }
        const double sk = median(tk), sr = median(tr);
        const double gb = c.bytes_per_elem * double(n) / 1e9;
        std::printf(
            "{%s\"kernel\":\"%s\",\"n\":%zu,\"threads\":%zu,\"seconds\":%.6g,\"gbps\":%.4g,"
            "\"roofline_gbps\":%.4g,\"ratio\":%.4f,\"isa\":\"%s\",\"reps\":%d,\"cpu\":\"%s\"}\n",
            zf_bench::run_fields(),
            c.name, n, t, sk, gb / sk, gb / sr, sr / sk, std::string(name_of(tier)).c_str(), reps, cpu.c_str());
        std::fflush(stdout);
      }
      // The data-parallel reduction's sum (sum_in_rank_order: 4 ranks' bf16 pieces, 8 bytes read
      // and 2 written an element) on the arena against the calling thread alone, alternately on
      // the same buffers: "speedup" is the calling thread's median time over the arena's.
      {
        constexpr std::size_t R = 4;
        host_array<bfloat16> pieces(R * n), out(n);
        parallel_blocks(arena, R * n, [&](std::size_t b, std::size_t e) {
          for (std::size_t i = b; i < e; ++i) pieces[i] = work.g16[i % n];
        });
        parallel_blocks(arena, n, [&](std::size_t b, std::size_t e) {
          for (std::size_t i = b; i < e; ++i) out[i] = bfloat16{};
        });
        std::vector<double> ta, ts;
        for (int r = -1; r < reps; ++r)
          for (int which = 0; which < 2; ++which) {
            const bool alone = (which == 1) ^ (r % 2 != 0);
            const auto t0 = std::chrono::steady_clock::now();
            sum_in_rank_order(alone ? nullptr : &arena, pieces.data(), dtype::bf16, R, n, true, out.data(), tier);
            const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (r >= 0) (alone ? ts : ta).push_back(dt);
          }
        // (and the two give the same bits: the rank order is the arena's too)
        host_array<bfloat16> alone_out(n);
        sum_in_rank_order(nullptr, pieces.data(), dtype::bf16, R, n, true, alone_out.data(), tier);
        sum_in_rank_order(&arena, pieces.data(), dtype::bf16, R, n, true, out.data(), tier);
        if (std::memcmp(alone_out.data(), out.data(), 2 * n) != 0)
          throw std::runtime_error("rank_sum: the arena's sum differs from the calling thread's");
        const double sa = median(ta), ss = median(ts);
        const double gb = double(2 * R + 2) * double(n) / 1e9;
        std::printf(
            "{%s\"kernel\":\"rank_sum_bf16_r4\",\"n\":%zu,\"threads\":%zu,\"seconds\":%.6g,\"gbps\":%.4g,"
            "\"calling_thread_seconds\":%.6g,\"speedup\":%.4f,\"isa\":\"%s\",\"reps\":%d,\"cpu\":\"%s\"}\n",
            zf_bench::run_fields(),
            n, t, sa, gb / sa, ss, ss / sa, std::string(name_of(tier)).c_str(), reps, cpu.c_str());
        std::fflush(stdout);
      }
      // A reselection's column moves (copy_pieces): n fp32 values as columns of 2048 rows,
      // scattered from a contiguous stage to their places (a fixed shuffle of the columns) in a
      // host array, on the arena against one thread's memcpy loop, alternately on the same
      // buffers: "speedup" is the loop's median time over the arena's.
      if (n >= 2048) {
        constexpr std::size_t rows = 2048;
        const std::size_t cols = n / rows;
        std::vector<std::uint32_t> place(cols);
        for (std::size_t c = 0; c < cols; ++c) place[c] = std::uint32_t(c);
        std::shuffle(place.begin(), place.end(), std::mt19937(7));
        host_array<float> stage(cols * rows), dst(cols * rows), loop_dst(cols * rows);
        parallel_blocks(arena, cols * rows, [&](std::size_t b, std::size_t e) {
          for (std::size_t i = b; i < e; ++i) {
            stage[i] = float(i % 1000003);
            dst[i] = loop_dst[i] = 0.0f;
          }
        });
        auto from = [&](std::size_t c) { return stage.data() + c * rows; };
        std::vector<double> ta, ts;
        for (int r = -1; r < reps; ++r)
          for (int which = 0; which < 2; ++which) {
            const bool alone = (which == 1) ^ (r % 2 != 0);
            const auto t0 = std::chrono::steady_clock::now();
            if (alone) {
              for (std::size_t c = 0; c < cols; ++c) std::memcpy(loop_dst.data() + place[c] * rows, from(c), rows * 4);
            } else {
              copy_pieces(arena, cols, rows * 4, [&](std::size_t c) { return dst.data() + place[c] * rows; }, from);
            }
            const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (r >= 0) (alone ? ts : ta).push_back(dt);
          }
        if (std::memcmp(dst.data(), loop_dst.data(), 4 * cols * rows) != 0)
          throw std::runtime_error("column_scatter: the arena's copy differs from the loop's");
        const double sa = median(ta), ss = median(ts);
        const double gb = 8.0 * double(cols * rows) / 1e9;
        std::printf(
            "{%s\"kernel\":\"column_scatter_f32_r2048\",\"n\":%zu,\"threads\":%zu,\"seconds\":%.6g,\"gbps\":%.4g,"
            "\"calling_thread_seconds\":%.6g,\"speedup\":%.4f,\"reps\":%d,\"cpu\":\"%s\"}\n",
            zf_bench::run_fields(), cols * rows, t, sa, gb / sa, ss, ss / sa, reps, cpu.c_str());
        std::fflush(stdout);
      }
      if (!versus) continue;
      for (const versus_case& c : versus_cases) {
        std::vector<double> ta, tb;
        for (int r = -1; r < reps; ++r)
          for (int which = 0; which < 2; ++which) {  // alternate the tiers, each first in turn
            const bool other = (which == 1) ^ (r % 2 != 0);
            const auto t0 = std::chrono::steady_clock::now();
            c.run(arena, work, n, other ? *versus : k);
            const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (r >= 0) (other ? tb : ta).push_back(dt);
          }
        const double sa = median(ta), sb = median(tb);
        std::printf(
            "{%s\"kernel\":\"%s\",\"n\":%zu,\"threads\":%zu,\"isa\":\"%s\",\"seconds\":%.6g,"
            "\"versus_isa\":\"%s\",\"versus_seconds\":%.6g,\"speedup\":%.4f,\"reps\":%d,\"cpu\":\"%s\"}\n",
            zf_bench::run_fields(),
            c.name, n, t, std::string(name_of(tier)).c_str(), sa, std::string(name_of(versus->tier)).c_str(), sb,
            sb / sa, reps, cpu.c_str());
        std::fflush(stdout);
      }
    }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "cpu_adam: %s\n", e.what());
  return 2;
}
