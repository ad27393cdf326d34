// Header-only use: no kernels library, no ZENFLOW_HOST_DISPATCH. The kernels are compiled
// inline for the ISA this file is built for (x86-64 baseline, x86-64-v3, and x86-64-v4 with
// AVX-512 BF16 where the building CPU has it).
#include <doctest/doctest.h>

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

  for (std::size_t i = 0; i < n; ++i) {
    const auto ref = zf_ref::adamw({p0[i], m0[i], v0[i]}, double(to_float(g[i])), job.hyper.lr,
                                   job.hyper.beta1, job.hyper.beta2, job.hyper.eps,
                                   job.hyper.weight_decay, true, counts0[i / rows] + 1);
    // |p| >= 2^-4 here and an update is about lr = 1e-3 in size: 1e-6 relative covers the few
    // float roundings (test_host_adamw argues the tight bound); a wrong count would not pass.
    REQUIRE(std::fabs(p[i] - ref.p) <= 1e-6 * std::fabs(ref.p) + 1e-9);
    REQUIRE(zf_test::bits(p[i]) == zf_test::bits(ps[i]));
    REQUIRE(zf_test::bits(m[i]) == zf_test::bits(ms[i]));
    REQUIRE(zf_test::bits(v[i]) == zf_test::bits(vs[i]));
    REQUIRE(copy[i].bits == zf_ref::bf16_round(p[i]));
  }
  CHECK(counts[0] == counts0[0] + 1);
}
