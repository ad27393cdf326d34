// Memory accounting: stats() reports the bytes held by kind, and they follow the closed form.
// Host, per matrix element: 16 (fp32 master, two moments, the accumulator) + 4 more for the second
// accumulator when host updates overlap, 4 per column for the Adam count, plus one bounded
// staging area (1/32 of the model's fp32 values, at most 1 Mi, at least one column). Device: per matrix the k
// selected columns twice (moments, an fp32 master unless the param is fp32, count and index: a
// new set is built during a reselection without allocating), per-column statistics and two
// column lists (all, unselected), each vector's moments (and master unless fp32), slot lists for
// a reselection's plan (4 per selected column of the widest selection), and the device end of
// chunked transfers (whole columns of the staging area); with overlap, also the compaction
// buffer of the unselected gradient columns (the background offload), each matrix's block
// rounded up to 256 bytes, and 4 bytes per column (its place there, for the compaction fused
// into the gradient pass).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <malloc.h>

#include <zenflow/zenflow.hpp>

using namespace zenflow;

TEST_CASE("stats: memory held follows the closed form") {
  for (bool overlap : {true, false}) {
    CAPTURE(overlap);
    const std::size_t R1 = 64, C1 = 100, R2 = 30, C2 = 50, N = 77;
    std::vector<bfloat16> w1(R1 * C1), g1(R1 * C1);
    std::vector<float> w2(R2 * C2), g2(R2 * C2), b(N), gb(N);
    config cfg;
    cfg.topk_ratio = 0.1;  // k = 10 and 5
    cfg.overlap_step = overlap;
    optimizer<> opt(cfg);
    opt.add_matrix({w1.data(), g1.data(), R1, C1, dtype::bf16, dtype::bf16});
    opt.add_matrix({w2.data(), g2.data(), R2, C2, dtype::f32, dtype::f32, matrix_layout::row_major});
    opt.add_vector({b.data(), gb.data(), N});
    CHECK(opt.stats().host_pageable_bytes == 0);
    opt.initialize();
    const std::size_t accs = overlap ? 2 : 1;
    const std::size_t stage = 4 * ((R1 * C1 + R2 * C2) / 32);  // 1/32 of a model this small (> 64 rows)
    const std::size_t host = stage + ((12 + 4 * accs) * R1 * C1 + 4 * C1) + ((12 + 4 * accs) * R2 * C2 + 4 * C2);
    // master: 4 bytes per selected element for the bf16 matrix, none for the fp32 one
    // (per column: 17 bytes of gradient statistics — a double L1 score, a double sum of squares
    // and a bad-value flag — and 8 of column lists)
    auto dev_matrix = [](std::size_t rows, std::size_t cols, std::size_t k, std::size_t master) {
      return 2 * (4 * k + (8 + master) * k * rows + 4 * k) + 17 * cols + 2 * 4 * cols;
    };
    // the device staging area: the most whole columns of either matrix that fit in the host's
    const std::size_t dev_stage = std::max(stage / 4 / R1 * R1 * 4, stage / 4 / R2 * R2 * 4);
    // with overlap, the unselected gradient columns compacted for the background offload:
    // (cols - k) * rows in the grad dtype (bf16: 2 bytes, f32: 4): 11520 bytes (a multiple of
    // 256) and 5400, rounded up to 5632; and each column's place in it (4 bytes a column, for the
    // compaction fused into the gradient pass)
    const std::size_t compact = overlap ? 11520 + 5632 + 4 * (C1 + C2) : 0;
    const std::size_t slots = 4 * 4 * 10;
    // the vector: 8 bytes of moments an element (fp32: its own master), and per chunk of up to
    // 4096 elements a double sum of squares and a flag (one chunk here)
    const std::size_t device =
        dev_matrix(R1, C1, 10, 4) + dev_matrix(R2, C2, 5, 0) + 8 * N + 9 * 1 + slots + dev_stage + compact;
    const optimizer_stats st = opt.stats();
    CHECK(st.host_pageable_bytes == host);
    CHECK(st.host_pinned_bytes == 0);
    CHECK(st.device_bytes == device);
  }
}

TEST_CASE("stats: host bytes per parameter of a large bf16 model") {
  // 16 bytes per parameter synchronously (master, moments, accumulator), 20 with overlap; the
  // staging area is at most 4 MiB however large the model.
  const std::size_t R = 1024, C = 2048;
  std::vector<bfloat16> w(R * C), g(R * C);
  for (bool overlap : {false, true}) {
    config cfg;
    cfg.overlap_step = overlap;
    optimizer<> opt(cfg);
    opt.add_matrix({w.data(), g.data(), R, C, dtype::bf16, dtype::bf16});
    opt.initialize();
    const std::size_t stage = 4 * std::min(simd_accumulator::stage_elems, R * C / 32);
    // master, m, v and one accumulator (two with overlap) of 4 bytes an element, and a 4-byte
    // count per column: 16 (20) bytes a parameter and 4 / 1024 more
    CHECK(opt.stats().host_pageable_bytes - stage == (overlap ? 20 : 16) * R * C + 4 * C);
  }
}

// Lean memory: what each configuration holds beyond the trainer's own params and grads, per
// parameter, from stats() — asserted in closed form — and checked against the growth of the
// process's resident memory (on the host space the "device" state is host memory too, so both
// kinds count). Model: 4 matrices of 256 x 1024 and a vector of 1024 (1.05M parameters).
//  - device_adam, fp32 params: 8 bytes per element (m, v; the param is its own master), nothing
//    on the host, and per column of 256 rows 33 bytes (gradient statistics 17, Adam count 4,
//    column lists 12) = 0.13 bytes per parameter;
//  - device_adam, bf16 params: the same + 4 per element (fp32 master) = 12;
//  - zenflow's host side: 16 bytes per element (master, m, v, accumulator), 20 with overlap's
//    second accumulator, + 4 per column + a staging area of 1/32 of the model's fp32 size (0.125).
namespace {

long rss_kb() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
  std::fclose(f);
  return kb;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized = true;
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool sanitized = true;
#  else
constexpr bool sanitized = false;
#  endif
#else
constexpr bool sanitized = false;
#endif

constexpr std::size_t LR = 256, LC = 1024, LM = 4, LV = 1024, LN = LM * LR * LC + LV;

struct lean_run {
  optimizer_stats st;
  long rss_growth_kb;
};

template <class Opt>
lean_run lean_measure(dtype t, const config& cfg) {
  const std::size_t es = size_of(t);
  // the trainer's buffers, touched before the measurement starts
  std::vector<std::vector<unsigned char>> w(LM + 1), g(LM + 1);
  for (std::size_t i = 0; i <= LM; ++i) {
    const std::size_t n = (i < LM ? LR * LC : LV) * es;
    w[i].assign(n, 0);
    g[i].assign(n, 0);
    for (std::size_t b = 0; b < n; b += es) w[i][b + es - 1] = 0x3c;  // small positive values
  }
  Opt opt(cfg);
  for (std::size_t i = 0; i < LM; ++i)
    opt.add_matrix(zenflow::matrix(w[i].data(), g[i].data(), zenflow::rows{LR}, zenflow::cols{LC}).dtypes(t, t));
  opt.add_vector(zenflow::vector(w[LM].data(), g[LM].data(), LV).dtypes(t, t));
  ::malloc_trim(0);  // what earlier tests freed goes back to the system: reused, it would not show
  const long before = rss_kb();
  opt.initialize();
  for (int s = 0; s < 5; ++s) {
    for (auto& gi : g)
      for (std::size_t b = 0; b < gi.size(); b += es) gi[b + es - 1] = (b / es + std::size_t(s)) % 3 ? 0x38 : 0xb8;
    opt.step();
  }
  opt.synchronize();
  return {opt.stats(), rss_kb() - before};
}

void check_against_rss(const lean_run& r, const std::string& what) {
  const double counted = double(r.st.host_pageable_bytes + r.st.device_bytes);
  const double grown = double(r.rss_growth_kb) * 1024.0;
  MESSAGE(what << ": stats " << counted / double(LN) << " B/param, resident memory grew by " << grown / double(LN)
               << " B/param");
  if (sanitized) {
    MESSAGE("the comparison with resident memory is not made under a sanitizer (its shadow memory grows too)");
    return;
  }
  // every counted byte is zeroed at allocation, so resident; what stats() does not count (thread
  // stacks, allocator headers, small host-side lists: well under 1 MB here) is the slack
  CHECK(grown >= 0.95 * counted);
  CHECK(grown <= 1.10 * counted + 1024.0 * 1024.0);
}

}  // namespace

TEST_CASE("lean memory: device_adam holds 8 (fp32) or 12 (bf16) bytes per parameter") {
  config cfg;
  cfg.adam.weight_decay = 0;
  for (dtype t : {dtype::f32, dtype::bf16}) {
    CAPTURE(int(t));
    const lean_run r = lean_measure<device_adam<>>(t, cfg);
    const std::size_t master = t == dtype::f32 ? 0 : 4;
    // nothing on the host (no column ever crosses: the staging area is released)
    CHECK(r.st.host_pageable_bytes == 0);
    // (the vector's statistics: a double and a flag per chunk of up to 4096 elements, one here)
    const std::size_t per_matrix = (8 + master) * LR * LC + 33 * LC, vec = (8 + master) * LV + 9;
    CHECK(r.st.device_bytes == LM * per_matrix + vec);
    const double per_param = double(r.st.device_bytes) / double(LN);
    CHECK(per_param <= (t == dtype::f32 ? 8.0 : 12.0) + 0.14);  // + the per-column 33 B / 256 rows
    check_against_rss(r, t == dtype::f32 ? "device_adam fp32" : "device_adam bf16");
  }
}

TEST_CASE("lean memory: zenflow's host side holds 16 bytes per parameter, 20 with overlap") {
  for (bool overlap : {false, true}) {
    CAPTURE(overlap);
    config cfg;
    cfg.overlap_step = overlap;
    const lean_run r = lean_measure<optimizer<>>(dtype::bf16, cfg);
    const std::size_t per_element = overlap ? 20 : 16;
    const std::size_t stage = 4 * (LM * LR * LC / 32);
    CHECK(r.st.host_pageable_bytes == LM * (per_element * LR * LC + 4 * LC) + stage);
    const double per_param = double(r.st.host_pageable_bytes) / double(LN);
    CHECK(per_param <= double(per_element) + 0.15);  // + 4 B per column of 256 rows + staging 1/8
    check_against_rss(r, overlap ? "zenflow, overlap" : "zenflow");
  }
}

// A model of very many small tensors: stats() accounts for what the optimizer holds — the
// state, and the per-tensor records (host_bookkeeping_bytes) — within 10% of the growth of the
// resident memory. (The small arrays of all tensors share one allocation per kind: without that,
// the allocator's headers and slack alone were several times the state.)
TEST_CASE("memory account: 20,000 tensors of 8 parameters, stats() within 10% of resident memory") {
  const std::size_t nm = 10000, nv = 10000, e = 8;
  std::vector<float> w(nm * e, 0.01f), dw(nm * e, 1e-3f), b(nv * e, 0.01f), db(nv * e, 1e-3f);
  ::malloc_trim(0);
  const long before = rss_kb();
  {
    config cfg;  // the defaults: topk 0.1, overlap on
    optimizer<> opt(cfg);
    for (std::size_t i = 0; i < nm; ++i)
      opt.add_matrix(zenflow::matrix(w.data() + i * e, dw.data() + i * e, zenflow::rows{2}, zenflow::cols{e / 2}));
    for (std::size_t i = 0; i < nv; ++i) opt.add_vector(zenflow::vector(b.data() + i * e, db.data() + i * e, e));
    opt.initialize();
    for (int s = 0; s < 5; ++s) opt.step();
    opt.synchronize();
    const optimizer_stats st = opt.stats();
    const double counted =
        double(st.host_pageable_bytes + st.host_pinned_bytes + st.device_bytes + st.host_bookkeeping_bytes);
    const double grown = double(rss_kb() - before) * 1024.0;
    MESSAGE("stats " << counted / 1e6 << " MB (bookkeeping " << double(st.host_bookkeeping_bytes) / 1e6
                     << " MB), resident memory grew by " << grown / 1e6 << " MB");
    CHECK(st.host_bookkeeping_bytes > 0);
    if (sanitized) {
      MESSAGE("the comparison with resident memory is not made under a sanitizer (its shadow memory grows too)");
    } else {
      CHECK(counted >= 0.9 * grown);
      CHECK(counted <= 1.1 * grown);
    }
  }
}
