// Memory accounting: stats() reports the bytes held by kind, and they follow the closed form.
// Host, per matrix element: 16 (fp32 master, two moments, the accumulator) + 4 more for the second
// accumulator when host updates overlap + the param size (the staged updated params), 4 per
// column for the Adam count, plus one bounded gradient staging area. Device: per matrix the k
// selected columns twice (fp32 master and moments, count and index: a new set is built during a
// reselection without allocating), per-column statistics and two column lists (all, unselected),
// each vector's state, slot lists for a reselection's plan (4 per selected column of the widest
// selection), and the device end of chunked transfers (the size of the host staging area); with
// overlap, also the compaction buffer of the unselected gradient columns (the background
// offload), each matrix's block rounded up to 256 bytes.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

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
    const std::size_t accs = overlap ? 2 : 1, stage = simd_accumulator::stage_elems * 4;
    const std::size_t host = stage + ((12 + 4 * accs) * R1 * C1 + 4 * C1 + 2 * R1 * C1) +
                             ((12 + 4 * accs) * R2 * C2 + 4 * C2 + 4 * R2 * C2);
    auto dev_matrix = [](std::size_t rows, std::size_t cols, std::size_t k) {
      return 2 * (4 * k + 12 * k * rows + 4 * k) + 17 * cols + 2 * 4 * cols;
    };
    // with overlap, the unselected gradient columns compacted for the background offload:
    // (cols - k) * rows in the grad dtype (bf16: 2 bytes, f32: 4): 11520 bytes (a multiple of
    // 256) and 5400, rounded up to 5632
    const std::size_t compact = overlap ? 11520 + 5632 : 0;
    const std::size_t slots = 4 * 4 * 10;
    const std::size_t device =
        dev_matrix(R1, C1, 10) + dev_matrix(R2, C2, 5) + 12 * N + 9 * 1 + slots + stage + compact;
    const optimizer_stats st = opt.stats();
    CHECK(st.host_pageable_bytes == host);
    CHECK(st.host_pinned_bytes == 0);
    CHECK(st.device_bytes == device);
  }
}

TEST_CASE("stats: host bytes per parameter of a large bf16 model") {
  // 16 + 2 bytes per parameter synchronously (master, moments, accumulator, staged bf16 params),
  // 20 + 2 with overlap; the staging area is a fixed 4 MiB however large the model.
  const std::size_t R = 1024, C = 2048;
  std::vector<bfloat16> w(R * C), g(R * C);
  for (bool overlap : {false, true}) {
    config cfg;
    cfg.overlap_step = overlap;
    optimizer<> opt(cfg);
    opt.add_matrix({w.data(), g.data(), R, C, dtype::bf16, dtype::bf16});
    opt.initialize();
    const double per_param =
        double(opt.stats().host_pageable_bytes - simd_accumulator::stage_elems * 4) / double(R * C);
    CHECK(per_param == doctest::Approx(overlap ? 22.0 : 18.0).epsilon(0.001));
  }
}
