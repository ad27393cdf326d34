// Header-only use: no kernels library, no ZENFLOW_HOST_DISPATCH. The kernels are compiled
// inline for the ISA this file is built for (x86-64 baseline, x86-64-v3, and x86-64-v4 with
// AVX-512 BF16 where the building CPU has it).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include <zenflow/host/kernels.hpp>

#include "reference/reference.hpp"
#include "support.hpp"

#if defined(ZENFLOW_HOST_DISPATCH)
#  error "this test must be built without the kernels library"
#endif

using namespace zenflow;
using namespace zenflow::host;

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512CD__)
static_assert(compiled_isa == isa::avx512_bf16, "an x86-64-v4 + AVX-512 BF16 build gets that tier");
#elif defined(__AVX2__) && defined(__F16C__) && !defined(__AVX512F__)
static_assert(compiled_isa == isa::avx2, "an x86-64-v3 build gets the AVX2 tier");
#endif

TEST_CASE("header-only: the tier compiled for is the one used, and only it") {
  MESSAGE("compiled for: ", name_of(compiled_isa));
  REQUIRE(cpu_supports(compiled_isa));  // this test runs where it was built
  CHECK(best_isa() == compiled_isa);
  CHECK(available(isa::scalar));
  for (isa t : all_isas)
    if (t != compiled_isa && t != isa::scalar) {
      CHECK_FALSE(available(t));
      CHECK_THROWS_AS(kernels(t), std::invalid_argument);
    }
}

TEST_CASE("header-only: AdamW with a bf16 gradient and bf16 copy matches the reference") {
  const std::size_t rows = 129, cols = 300, n = rows * cols;  // > serial threshold: threaded
  zf_test::rng r(5);
  std::vector<float> p(n), m(n), v(n);
  std::vector<bfloat16> g(n), copy(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = r.spread(-4, 1);
    m[i] = r.spread(-10, -3);
    v[i] = std::fabs(r.spread(-20, -6));
    g[i] = to_bfloat16(r.spread(-8, -1));
  }
  std::vector<std::uint32_t> counts(cols);
  for (auto& c : counts) c = std::uint32_t(r.below(50));
  const auto p0 = p, m0 = m, v0 = v;
  const auto counts0 = counts;

  adamw_job job;
  job.param = p.data(); job.exp_avg = m.data(); job.exp_avg_sq = v.data();
  job.grad = g.data(); job.grad_type = dtype::bf16;
  job.param_copy = copy.data(); job.copy_type = dtype::bf16;
  job.rows = rows;
  tbb::task_arena arena(2);
  adamw(arena, job, cols, counts.data());

  // The same update on the scalar tier must give the same bits.
  auto ps = p0, ms = m0, vs = v0;
  auto cs = counts0;
  adamw_job js = job;
  js.param = ps.data(); js.exp_avg = ms.data(); js.exp_avg_sq = vs.data(); js.param_copy = nullptr;
  adamw(arena, js, cols, cs.data(), isa::scalar);

  // Each element within a tolerance of the double reference: every float rounding of the update
  // is relative to one of the magnitudes it handles — the param before and after, and m's terms
  // |m| and |g| carried through step/denom (cancellation in m + (1-b1)(g-m) makes m's own error
  // large next to m, not next to them) — and 1e-6 is about 16 roundings of those
  // (test_host_adamw argues the tight budget; the scalar tier's bits are compared exactly).
  // That it can tell: in every column some element's update moves by more than its tolerance
  // when the Adam count is one off (the bias corrections change).
  std::vector<char> told(cols, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t cnt = counts0[i / rows] + 1;
    const double gi = double(to_float(g[i]));
    auto reference = [&](std::uint32_t c) {
      return zf_ref::adamw({p0[i], m0[i], v0[i]}, gi, job.hyper.lr, job.hyper.beta1, job.hyper.beta2, job.hyper.eps,
                           job.hyper.weight_decay, true, c);
    };
    const auto ref = reference(cnt);
    const double bc1 = 1 - std::pow(double(job.hyper.beta1), double(cnt));
    const double bc2 = 1 - std::pow(double(job.hyper.beta2), double(cnt));
    const double denom = std::sqrt(ref.v) / std::sqrt(bc2) + job.hyper.eps;
    const double scale = std::fabs(p0[i]) + std::fabs(ref.p) +
                         double(job.hyper.lr) / bc1 / denom * (std::fabs(m0[i]) + std::fabs(gi));
    const double tol = 1e-6 * scale + 1e-30;
    REQUIRE(std::fabs(p[i] - ref.p) <= tol);
    if (std::fabs(reference(cnt + 1).p - ref.p) > 2 * tol) told[i / rows] = 1;
    REQUIRE(zf_test::bits(p[i]) == zf_test::bits(ps[i]));
    REQUIRE(zf_test::bits(m[i]) == zf_test::bits(ms[i]));
    REQUIRE(zf_test::bits(v[i]) == zf_test::bits(vs[i]));
    REQUIRE(copy[i].bits == zf_ref::bf16_round(p[i]));
  }
  CHECK(std::count(told.begin(), told.end(), 1) == std::ptrdiff_t(cols));
  CHECK(counts[0] == counts0[0] + 1);
}
