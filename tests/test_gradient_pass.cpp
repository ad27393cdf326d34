// The gradient pass's canonical summation order (device_update/functors.hpp), which a GPU pass
// must reproduce bit for bit: the host space's results against an independent, literal
// implementation of the written rule, on gradients whose sums round, in
// both layouts, bf16/fp16/fp32, with ragged row and column counts; the values span 2^-40..2^12
// (fp16: 2^-14..2^4), so the double sums round (floats of a few binades sum exactly in double in
// any order and would prove nothing). The comparisons are exact:
// the rule fixes every addition. How much that shows: another order of the per-column sums
// (L1 or squares) gives other bits on these inputs (checked by changing the rule: the test
// fails), and so does a plain sequential total (checked below); another grouping of the total's
// lanes (128 instead of 256) happened to give the same bits here, since sums of float-derived
// doubles are mostly exact, so for the total this test pins the rule without proving its order.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <zenflow/zenflow.hpp>

#include "optimizer_harness.hpp"
#include "support.hpp"

using namespace zenflow;

namespace {

// lane_tree as written in the rule: v[j] += v[j + off] for off = n/2 .. 1.
double tree(std::vector<double> v) {
  for (std::size_t off = v.size() / 2; off > 0; off /= 2)
    for (std::size_t j = 0; j < off; ++j) v[j] = v[j] + v[j + off];
  return v[0];
}

// A column (or chunk) of values: lane j sums values j, j+32, ... in order; then the tree.
template <class Value>
double column_sum(std::size_t n, Value value) {
  std::vector<double> lanes(32, 0.0);
  for (std::size_t i = 0; i < n; ++i) lanes[i % 32] = lanes[i % 32] + value(i);
  return tree(lanes);
}

}  // namespace

TEST_CASE("gradient pass: the host space follows the canonical order exactly") {
  zf_test::rng r(5);
  const dtype types[] = {dtype::f32, dtype::bf16, dtype::f16};
  int differs = 0;
  for (int trial = 0; trial < 30; ++trial) {
    CAPTURE(trial);
    host_space hs(trial % 2 ? 1 : 0);
    fused_adamw<host_space> u;
    struct mat {
      std::size_t rows, cols;
      dtype t;
      matrix_layout layout;
      std::vector<unsigned char> g;
    };
    std::vector<mat> mats;
    std::vector<std::pair<dtype, std::vector<unsigned char>>> vecs;
    const std::size_t nm = 1 + r.below(3), nv = r.below(3);
    for (std::size_t i = 0; i < nm; ++i) {
      // the last trials have a wide matrix: more than 256 group partials, so every lane of the
      // total sums several entries
      const bool wide = trial >= 24 && i == 0;
      mat m{wide ? 1 + r.below(3) : 1 + r.below(200), wide ? 30000 + r.below(20000) : 1 + r.below(150), types[r.below(3)],
            r.below(2) ? matrix_layout::row_major : matrix_layout::column_contiguous, {}};
      m.g.resize(m.rows * m.cols * size_of(m.t));
      for (std::size_t e = 0; e < m.rows * m.cols; ++e) zf_test::store_float(m.g, m.t, e, float(m.t == dtype::f16 ? r.spread(-14, 4) : r.spread(-40, 12)));
      mats.push_back(std::move(m));
    }
    for (std::size_t i = 0; i < nv; ++i) {
      const std::size_t n = 1 + r.below(30000);
      const dtype t = types[r.below(3)];
      std::vector<unsigned char> g(n * size_of(t));
      for (std::size_t e = 0; e < n; ++e) zf_test::store_float(g, t, e, float(t == dtype::f16 ? r.spread(-14, 4) : r.spread(-40, 12)));
      vecs.emplace_back(t, std::move(g));
    }
    for (auto& m : mats) u.add_matrix({nullptr, m.g.data(), m.rows, m.cols, dtype::f32, m.t, m.layout}, 1);
    for (auto& [t, g] : vecs) u.add_vector({nullptr, g.data(), g.size() / size_of(t), dtype::f32, t});
    u.allocate();
    // every other pair of trials the pass also compacts (the offload's compaction fused into
    // it): a random subset of each matrix's columns to random distinct places of a block; the
    // statistics below must not change, and the blocks must hold exactly those columns
    const bool compact = trial % 4 >= 2;
    std::vector<std::vector<std::uint32_t>> slots(mats.size());
    std::vector<std::vector<unsigned char>> blocks(mats.size());
    std::vector<compaction_target> targets(mats.size());
    for (std::size_t mi = 0; mi < mats.size(); ++mi) {
      const mat& m = mats[mi];
      std::vector<std::uint32_t> place(m.cols + 1);
      for (std::size_t k = 0; k < place.size(); ++k) place[k] = std::uint32_t(k);
      for (std::size_t k = place.size() - 1; k > 0; --k) std::swap(place[k], place[r.below(k + 1)]);
      slots[mi].assign(m.cols, no_slot);
      for (std::size_t c = 0; c < m.cols; ++c)
        if (r.below(2)) slots[mi][c] = place[c];
      blocks[mi].assign((m.cols + 1) * m.rows * size_of(m.t), 0xA5);
      targets[mi] = {blocks[mi].data(), slots[mi].data()};
    }
    // before set_compaction() there is nowhere to compact to: refused, not a plain pass that
    // would leave the offload's block as it was
    if (compact) CHECK_THROWS_AS(u.gradient_pass(hs, true), std::logic_error);
    u.set_compaction(hs, targets.data());
    const auto got = u.gradient_pass(hs, compact);
    REQUIRE(got.finite);
    for (std::size_t mi = 0; mi < mats.size(); ++mi) {
      const mat& m = mats[mi];
      const std::size_t es = size_of(m.t);
      std::vector<unsigned char> want((m.cols + 1) * m.rows * es, 0xA5);
      if (compact)
        for (std::size_t c = 0; c < m.cols; ++c)
          if (slots[mi][c] != no_slot)
            for (std::size_t i = 0; i < m.rows; ++i)
              std::memcpy(want.data() + (std::size_t(slots[mi][c]) * m.rows + i) * es,
                          m.g.data() + element_offset(m.layout, m.rows, m.cols, i, c) * es, es);
      CHECK(blocks[mi] == want);
    }

    std::vector<double> partials;
    double sequential = 0;  // a plain left-to-right sum of the same squares, for contrast
    for (std::size_t mi = 0; mi < mats.size(); ++mi) {
      const mat& m = mats[mi];
      std::vector<double> sq(m.cols);
      for (std::size_t c = 0; c < m.cols; ++c) {
        auto x = [&](std::size_t i) {
          return double(zf_test::load_as_float(m.g, m.t, element_offset(m.layout, m.rows, m.cols, i, c)));
        };
        const double l1 = column_sum(m.rows, [&](std::size_t i) { return std::fabs(x(i)); });
        sq[c] = column_sum(m.rows, [&](std::size_t i) { return x(i) * x(i); });
        for (std::size_t i = 0; i < m.rows; ++i) sequential += x(i) * x(i);
        CHECK(u.scores(mi, score_kind::l1)[c] == l1);
        CHECK(u.scores(mi, score_kind::l2sq)[c] == sq[c]);
      }
      for (std::size_t g0 = 0; g0 < m.cols; g0 += 32) {
        std::vector<double> v(32, 0.0);
        for (std::size_t j = 0; j < 32 && g0 + j < m.cols; ++j) v[j] = sq[g0 + j];
        partials.push_back(tree(v));
      }
    }
    for (auto& [t, g] : vecs) {
      const std::size_t n = g.size() / size_of(t), chunk = fused_adamw<host_space>::vector_chunk;
      std::vector<double> sq;
      for (std::size_t b = 0; b < n; b += chunk) {
        const std::size_t len = std::min(chunk, n - b);
        sq.push_back(column_sum(len, [&](std::size_t i) {
          const double x = zf_test::load_as_float(g, t, b + i);
          return x * x;
        }));
        for (std::size_t i = 0; i < len; ++i) {
          const double x = zf_test::load_as_float(g, t, b + i);
          sequential += x * x;
        }
      }
      for (std::size_t g0 = 0; g0 < sq.size(); g0 += 32) {
        std::vector<double> v(32, 0.0);
        for (std::size_t j = 0; j < 32 && g0 + j < sq.size(); ++j) v[j] = sq[g0 + j];
        partials.push_back(tree(v));
      }
    }
    std::vector<double> lanes(256, 0.0);
    for (std::size_t e = 0; e < partials.size(); ++e) lanes[e % 256] = lanes[e % 256] + partials[e];
    CHECK(got.sumsq == tree(lanes));
    // the same value to rounding (relative 1e-12 is far above the ~1e-15 of the reordering)
    CHECK(std::fabs(got.sumsq - sequential) <= 1e-12 * sequential);
    differs += got.sumsq != sequential;
  }
  CHECK(differs > 0);  // the order matters: on these inputs another order gives other bits
}

TEST_CASE("gradient pass: a non-finite value marks its column (or chunk) wherever it sits") {
  // The pass reads a column in whole rounds of 32 rows and then the rest, with the finite flag
  // taken once a round: a NaN or an infinity anywhere (first, last or middle of a round, in
  // the rest) must mark exactly its own column, in both layouts, and the summary not finite.
  const std::size_t rows = 70, cols = 3;  // two whole rounds and 6 rows more
  const float bad_values[] = {std::nanf(""), INFINITY, -INFINITY};
  for (const matrix_layout layout : {matrix_layout::column_contiguous, matrix_layout::row_major})
    for (const std::size_t at : {0, 1, 31, 32, 63, 64, 69})
      for (const float v : bad_values) {
        CAPTURE(at);
        CAPTURE(v);
        std::vector<float> g(rows * cols, 0.5f);
        g[element_offset(layout, rows, cols, at, 1)] = v;
        host_space hs(1);
        fused_adamw<host_space> u;
        u.add_matrix({nullptr, g.data(), rows, cols, dtype::f32, dtype::f32, layout}, 1);
        u.allocate();
        CHECK_FALSE(u.gradient_pass(hs, false).finite);
        CHECK(u.column_bad(0)[0] == 0);
        CHECK(u.column_bad(0)[1] == 1);
        CHECK(u.column_bad(0)[2] == 0);
      }
  // a vector: its chunks are summed like columns
  const std::size_t chunk = fused_adamw<host_space>::vector_chunk, n = chunk + 40;
  for (const std::size_t at : {std::size_t(0), std::size_t(31), chunk - 1, chunk, chunk + 32, n - 1}) {
    CAPTURE(at);
    std::vector<float> g(n, 0.5f);
    g[at] = std::nanf("");
    host_space hs(1);
    fused_adamw<host_space> u;
    u.add_vector({nullptr, g.data(), n, dtype::f32, dtype::f32});
    u.allocate();
    CHECK_FALSE(u.gradient_pass(hs, false).finite);
  }
  // and all finite: finite
  std::vector<float> g(rows * cols, 0.5f);
  host_space hs(1);
  fused_adamw<host_space> u;
  u.add_matrix({nullptr, g.data(), rows, cols, dtype::f32, dtype::f32, matrix_layout::column_contiguous}, 1);
  u.allocate();
  CHECK(u.gradient_pass(hs, false).finite);
  CHECK(u.column_bad(0)[1] == 0);
}
