// The host AdamW kernel on every available ISA tier and thread count: against the double
// precision PyTorch-formula reference (argued tolerances), and bit-identical across tiers and
// thread counts.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <zenflow/host/kernels.hpp>

#include "reference/reference.hpp"
#include "support.hpp"

using namespace zenflow;
using namespace zenflow::host;

namespace {

constexpr double u = 0x1p-24;  // unit roundoff of float

struct case_config {
  std::size_t rows, cols, offset;
  adam_mode mode;
  float weight_decay, grad_mul, grad_div;
};

std::uint16_t ref_round(float x, dtype t) {
  if (std::isnan(x)) return 0;  // not produced by these inputs
  return t == dtype::bf16 ? zf_ref::bf16_round(x) : zf_ref::f16_round(x);
}

template <class G, class C>  // C = void: no param copy
void run_case(const case_config& cfg, std::uint64_t seed) {
  CAPTURE(cfg.rows); CAPTURE(cfg.cols); CAPTURE(cfg.offset); CAPTURE(int(cfg.mode));
  CAPTURE(cfg.weight_decay); CAPTURE(cfg.grad_mul); CAPTURE(cfg.grad_div);
  CAPTURE(name_of(dtype_of_v<G>));
  const std::size_t n = cfg.rows * cfg.cols;
  zf_test::rng r(seed);
  adamw_hyper h;
  h.lr = float(std::exp2(r.uniform(-16, -3)));
  const float b1s[] = {0.9f, 0.0f, 0.5f}, b2s[] = {0.999f, 0.95f};
  h.beta1 = b1s[r.below(3)];
  h.beta2 = b2s[r.below(2)];
  h.eps = r.below(2) ? 1e-8f : 1e-6f;
  h.weight_decay = cfg.weight_decay;
  h.mode = cfg.mode;

  std::vector<float> p0(n), m0(n), v0(n);
  std::vector<G> grad(n);
  for (std::size_t i = 0; i < n; ++i) {
    p0[i] = r.spread(-8, 2);
    m0[i] = r.spread(-14, -2);
    v0[i] = std::fabs(r.spread(-28, -4));
    grad[i] = from_float<G>(r.spread(-12, 0));
  }
  std::vector<std::uint32_t> counts0(cfg.cols);
  const std::uint32_t count_choices[] = {0, 0, 1, 4, 99, 1000, 123456, 3000000};
  for (auto& c : counts0) c = count_choices[r.below(8)];

  // The reference, once, in double.
  std::vector<zf_ref::adam_state> ref(n);
  std::vector<double> tol_p(n), tol_m(n), tol_v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t cnt = std::uint64_t(counts0[i / cfg.rows]) + 1;
    const double g = double(to_float(grad[i])) * cfg.grad_mul / cfg.grad_div;
    zf_ref::adam_state s{p0[i], m0[i], v0[i]};
    ref[i] = zf_ref::adamw(s, g, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay,
                           h.mode == adam_mode::adamw, cnt);
    // Error budget, in units of u = 2^-24 (each float operation rounds with relative error <= u):
    //  g: up to 2 roundings (scale, divide) and, in classic mode, 2 more for + wd*p.
    //  m = m + (1-b1)(g-m): 3 roundings plus the rounded coefficient and g's error, each bounded
    //    by u times |m| + |g| + wd|p|  ->  8u (|m| + |g| + wd|p|).
    //  v: all terms non-negative, so its own roundings give a relative error: ~7 -> 12u v; plus
    //    g's absolute error (4u (|g| + wd|p|), large relative to g after cancellation in classic
    //    mode) enters through dv/dg = 2(1-b2)|g|.
    //  p: the decay product and the final subtraction (u each, on |p_old| and |p_new|), plus the
    //    error of update = step*m/denom to first order: m's absolute error times step/denom, and
    //    |update| times (denom's relative error + ~6u for the rounded step coefficient, the
    //    product and the quotient). denom = sqrt(v)/sqrt(bc2) + eps inherits sqrt(v)'s error,
    //    dv/(2 sqrt v) (or sqrt(dv) when v is ~0), plus ~3u. A factor 1.5 covers second order.
    //  Factors of about 2 of headroom; a wrong bias-correction count or a missing term is off by
    //  orders of magnitude more.
    const double gabs = std::fabs(g) + (h.mode == adam_mode::classic ? h.weight_decay * std::fabs(p0[i]) : 0);
    const double g_eff = g + (h.mode == adam_mode::classic ? h.weight_decay * double(p0[i]) : 0);
    const double bc1 = 1 - std::pow(double(h.beta1), double(cnt));
    const double bc2 = 1 - std::pow(double(h.beta2), double(cnt));
    const double sv = std::sqrt(ref[i].v);
    const double denom = sv / std::sqrt(bc2) + h.eps;
    const double step = h.lr / bc1;
    tol_m[i] = 8 * u * (std::fabs(m0[i]) + gabs) + 1e-45;
    tol_v[i] = 12 * u * ref[i].v + 2 * (1 - double(h.beta2)) * std::fabs(g_eff) * 4 * u * gabs + 1e-45;
    const double dsqrt = sv > 0 ? std::min(tol_v[i] / (2 * sv), std::sqrt(tol_v[i])) : std::sqrt(tol_v[i]);
    const double ddenom = dsqrt / std::sqrt(bc2) + 3 * u * denom;
    const double update = step * std::fabs(ref[i].m) / denom;
    tol_p[i] = 4 * u * (std::fabs(p0[i]) + std::fabs(ref[i].p)) +
               1.5 * (step / denom * tol_m[i] + update * (ddenom / denom + 6 * u)) + 1e-45;
  }

  std::vector<std::uint32_t> first;
  const std::vector<unsigned> thread_counts =
      zf_test::quick_mode() ? std::vector<unsigned>{2} : std::vector<unsigned>{1, 2, 4};
  for (isa t : zf_test::available_tiers())
    for (unsigned threads : thread_counts) {
      CAPTURE(name_of(t)); CAPTURE(threads);
      tbb::task_arena arena{int(threads)};
      zf_test::offset_buffer<float> p(n, cfg.offset), m(n, cfg.offset), v(n, cfg.offset);
      zf_test::offset_buffer<G> g(n, cfg.offset);
      using copy_t = std::conditional_t<std::is_void_v<C>, std::uint16_t, C>;
      zf_test::offset_buffer<copy_t> copy(n, cfg.offset);
      std::copy(p0.begin(), p0.end(), p.data());
      std::copy(m0.begin(), m0.end(), m.data());
      std::copy(v0.begin(), v0.end(), v.data());
      std::copy(grad.begin(), grad.end(), g.data());
      std::vector<std::uint32_t> counts = counts0;

      adamw_job job;
      job.param = p.data();
      job.exp_avg = m.data();
      job.exp_avg_sq = v.data();
      job.grad = g.data();
      job.grad_type = dtype_of_v<G>;
      if constexpr (!std::is_void_v<C>) {
        job.param_copy = copy.data();
        job.copy_type = dtype_of_v<C>;
      }
      job.rows = cfg.rows;
      job.hyper = h;
      job.grad_mul = cfg.grad_mul;
      job.grad_div = cfg.grad_div;
      adamw(arena, job, cfg.cols, counts.data(), t);

      std::vector<std::uint32_t> got;
      for (std::size_t c = 0; c < cfg.cols; ++c)
        REQUIRE(counts[c] == (n ? counts0[c] + 1 : counts0[c]));
      for (std::size_t i = 0; i < n; ++i) {
        CAPTURE(i);
        REQUIRE(std::fabs(double(p[i]) - ref[i].p) <= tol_p[i]);
        REQUIRE(std::fabs(double(m[i]) - ref[i].m) <= tol_m[i]);
        REQUIRE(std::fabs(double(v[i]) - ref[i].v) <= tol_v[i]);
        got.push_back(zf_test::bits(p[i]));
        got.push_back(zf_test::bits(m[i]));
        got.push_back(zf_test::bits(v[i]));
        if constexpr (!std::is_void_v<C>) {
          if constexpr (std::is_same_v<C, float>) REQUIRE(zf_test::bits(copy[i]) == zf_test::bits(p[i]));
          else REQUIRE(copy[i].bits == ref_round(p[i], dtype_of_v<C>));
          got.push_back(zf_test::bits(to_float(copy[i])));
        }
      }
      if (first.empty()) first = std::move(got);
      else REQUIRE(got == first);  // same bits whatever the tier and thread count
    }
}

template <class G>
void run_all_copies(const case_config& cfg, std::uint64_t& seed) {
  run_case<G, void>(cfg, seed++);
  run_case<G, bfloat16>(cfg, seed++);
  run_case<G, float16>(cfg, seed++);
  run_case<G, float>(cfg, seed++);
}

}  // namespace

TEST_CASE("adamw: every dtype combination, shape, alignment and mode against the reference") {
  struct shape { std::size_t rows, cols; };
  const std::vector<shape> shapes =
      zf_test::quick_mode()  // sanitizer runs: small shapes and one above the threading threshold
          ? std::vector<shape>{{0, 5}, {1, 7}, {17, 9}, {300, 257}}
          : std::vector<shape>{{0, 0}, {0, 5}, {5, 0},   {1, 1},    {1, 7},      {7, 1},     {5, 3},
                               {17, 9}, {1000, 1}, {64, 64}, {300, 257}, {3, 12000}, {100003, 1}};
  const std::vector<std::size_t> offsets = zf_test::quick_mode() ? std::vector<std::size_t>{3} : std::vector<std::size_t>{0, 3};
  std::uint64_t seed = 100;
  for (const shape& s : shapes)
    for (std::size_t off : offsets)
      for (adam_mode mode : {adam_mode::adamw, adam_mode::classic}) {
        const float wd = (seed % 3 == 0) ? 0.0f : 0.05f;
        const bool window_mean = seed % 2 == 0;
        case_config cfg{s.rows, s.cols, off, mode, wd, window_mean ? 1.0f : 0.37f,
                        window_mean ? 3.0f : 1.0f};
        run_all_copies<float>(cfg, seed);
        run_all_copies<bfloat16>(cfg, seed);
        run_all_copies<float16>(cfg, seed);
      }
}

TEST_CASE("adamw: weight decay off and on, both modes, large shapes") {
  std::uint64_t seed = 9000;
  for (float wd : {0.0f, 0.01f, 0.1f})
    for (adam_mode mode : {adam_mode::adamw, adam_mode::classic})
      run_case<bfloat16, bfloat16>({zf_test::full_or_quick<std::size_t>(4096, 1024), 33, 1, mode, wd, 0.5f, 1.0f}, seed++);
}

TEST_CASE("adamw: bias correction uses each column's own count") {
  // Two columns, identical data, counts 0 and 9: the first update is the bias-corrected
  // first step, |dp| = lr (m/sqrt(v) = sign(g) after correction), the second a 10th step.
  tbb::task_arena arena(1);
  std::vector<float> p = {1, 1}, m = {0, 0}, v = {0, 0}, g = {0.5f, 0.5f};
  std::uint32_t counts[2] = {0, 9};
  adamw_job job;
  job.param = p.data(); job.exp_avg = m.data(); job.exp_avg_sq = v.data(); job.grad = g.data();
  job.rows = 1;
  job.hyper.lr = 0.01f; job.hyper.weight_decay = 0.0f; job.hyper.eps = 1e-12f;
  adamw(arena, job, 2, counts);
  CHECK(counts[0] == 1);
  CHECK(counts[1] == 10);
  // (1e-6: p is an fp32 near 1, whose spacing is 1.2e-7, and the update, ~0.01, carries a relative
  // error of a few float roundings, ~1e-9 absolute: the fp32 result is within a spacing or so of
  // the exact one, 8x inside the bound; a wrong count moves it by ~1e-3, see the last check)
  CHECK(std::fabs(double(p[0]) - (1 - 0.01)) < 1e-6);
  const zf_ref::adam_state tenth = zf_ref::adamw({1, 0, 0}, 0.5, 0.01, 0.9, 0.999, 1e-12, 0, true, 10);
  CHECK(std::fabs(double(p[1]) - tenth.p) < 1e-6);
  CHECK(std::fabs(p[1] - p[0]) > 1e-3);  // the counts really differ in effect
}

TEST_CASE("adamw: bad arguments throw a clear error and change nothing") {
  tbb::task_arena arena(1);
  std::vector<float> p(8, 1), m(8, 0), v(8, 0), g(8, 0.5f);
  std::vector<std::uint16_t> g16(9, 0);
  std::uint32_t counts[1] = {3};
  auto job = [&] {
    adamw_job j;
    j.param = p.data(); j.exp_avg = m.data(); j.exp_avg_sq = v.data(); j.grad = g.data();
    j.rows = 8;
    return j;
  };
  auto expect = [&](adamw_job j, const char* msg, std::uint32_t* cnt = nullptr) {
    CHECK_THROWS_WITH_AS(adamw(arena, j, 1, cnt ? cnt : counts), msg, std::invalid_argument);
    for (int i = 0; i < 8; ++i) {
      CHECK(p[i] == 1.0f);
      CHECK(m[i] == 0.0f);
      CHECK(v[i] == 0.0f);
    }
    CHECK(counts[0] == 3);
  };
  adamw_job j = job(); j.param = nullptr;
  expect(j, "zenflow: param is null");
  j = job(); j.grad = reinterpret_cast<char*>(g16.data()) + 1; j.grad_type = dtype::bf16;
  expect(j, "zenflow: grad is not aligned to its element size (2 bytes)");
  j = job(); j.exp_avg_sq = m.data() + 4;
  expect(j, "zenflow: exp_avg and exp_avg_sq overlap");
  j = job(); j.grad = p.data();
  expect(j, "zenflow: param and grad overlap");
  j = job(); j.hyper.lr = -1;
  expect(j, "zenflow: lr must be finite and >= 0, got -1");
  j = job(); j.hyper.lr = NAN;
  expect(j, "zenflow: lr must be finite and >= 0, got nan");
  j = job(); j.hyper.beta1 = 1.0f;
  expect(j, "zenflow: beta1 must be in [0, 1), got 1");
  j = job(); j.hyper.beta2 = -0.5f;
  expect(j, "zenflow: beta2 must be in [0, 1), got -0.5");
  j = job(); j.hyper.eps = 0;
  expect(j, "zenflow: eps must be finite and > 0, got 0");
  j = job(); j.hyper.weight_decay = INFINITY;
  expect(j, "zenflow: weight_decay must be finite and >= 0, got inf");
  j = job(); j.grad_div = 0;
  expect(j, "zenflow: grad_div must be finite and > 0");
  j = job(); j.grad_mul = NAN;
  expect(j, "zenflow: grad_mul must be finite");
  std::uint32_t full[1] = {std::numeric_limits<std::uint32_t>::max()};
  expect(job(), "zenflow: an Adam step count would overflow", full);
  CHECK_THROWS_WITH_AS(adamw(arena, job(), 1, nullptr), "zenflow: counts is null", std::invalid_argument);
}

TEST_CASE("adamw: an empty block is a no-op that keeps its counts") {
  tbb::task_arena arena(1);
  std::uint32_t counts[3] = {1, 2, 3};
  adamw_job j;  // all pointers null: nothing is touched
  j.rows = 0;
  adamw(arena, j, 3, counts);
  CHECK(counts[0] == 1);
  CHECK(counts[2] == 3);
}

TEST_CASE("adamw: a column list updates exactly those columns, as a full update would") {
  // A small list (run on one thread), and one of 40 columns of 1000 rows (40,000 elements: above
  // the serial limit, so split among 2 and 4 threads, blocks starting mid-column; 1000 is not a
  // multiple of any vector width).
  struct shape {
    std::size_t rows, cols;
    std::vector<std::uint32_t> list;
    int threads;
  };
  std::vector<shape> shapes = {{37, 50, {0, 3, 4, 17, 49, 20}, 2}};  // any order
  for (int threads : {2, 4}) {
    shape big{1000, 120, {}, threads};
    for (int c = 119; c >= 2; c -= 3) big.list.push_back(std::uint32_t(c));  // 40 columns, descending
    shapes.push_back(big);
  }
  for (const shape& sh : shapes) {
  CAPTURE(sh.rows);
  CAPTURE(sh.threads);
  const std::size_t rows = sh.rows, cols = sh.cols;
  zf_test::rng r(77);
  std::vector<float> p0(rows * cols), m0(rows * cols), v0(rows * cols), g(rows * cols);
  for (std::size_t i = 0; i < p0.size(); ++i) {
    p0[i] = r.spread(-4, 1);
    m0[i] = r.spread(-10, -3);
    v0[i] = std::fabs(r.spread(-20, -6));
    g[i] = r.spread(-8, -1);
  }
  std::vector<std::uint32_t> counts0(cols);
  for (auto& c : counts0) c = std::uint32_t(r.below(20));
  const std::vector<std::uint32_t>& list = sh.list;
  for (isa t : zf_test::available_tiers()) {
    CAPTURE(name_of(t));
    tbb::task_arena arena{sh.threads};
    // full update of every column: the expected values of the listed ones
    auto pf = p0, mf = m0, vf = v0;
    auto cf = counts0;
    std::vector<bfloat16> copy_full(rows * cols);
    adamw_job jf;
    jf.param = pf.data(); jf.exp_avg = mf.data(); jf.exp_avg_sq = vf.data(); jf.grad = g.data();
    jf.param_copy = copy_full.data(); jf.copy_type = dtype::bf16;
    jf.rows = rows;
    adamw(arena, jf, cols, cf.data(), t);
    // listed columns only
    auto pl = p0, ml = m0, vl = v0;
    auto cl = counts0;
    std::vector<bfloat16> copy_list(rows * cols, bfloat16::from_bits(0x7fff));
    adamw_job jl = jf;
    jl.param = pl.data(); jl.exp_avg = ml.data(); jl.exp_avg_sq = vl.data();
    jl.param_copy = copy_list.data();
    jl.columns = list.data();
    adamw(arena, jl, cols, cl.data(), t, list.size());
    for (std::size_t c = 0; c < cols; ++c) {
      const bool listed = std::find(list.begin(), list.end(), c) != list.end();
      CHECK(cl[c] == (listed ? counts0[c] + 1 : counts0[c]));
      for (std::size_t i = c * rows; i < (c + 1) * rows; ++i) {
        REQUIRE(zf_test::bits(pl[i]) == zf_test::bits(listed ? pf[i] : p0[i]));
        REQUIRE(zf_test::bits(ml[i]) == zf_test::bits(listed ? mf[i] : m0[i]));
        REQUIRE(zf_test::bits(vl[i]) == zf_test::bits(listed ? vf[i] : v0[i]));
        REQUIRE(copy_list[i].bits == (listed ? copy_full[i].bits : 0x7fff));
      }
    }
  }
  }
  // Refused lists: nothing is written. The state is random (an all-zero one is AdamW's fixed
  // point, where a partial update would not show), and the gradient too.
  const std::size_t rows = 37, cols = 50;
  zf_test::rng r(77);
  std::vector<float> p0(rows * cols), m0(rows * cols), v0(rows * cols), g(rows * cols);
  for (std::size_t i = 0; i < p0.size(); ++i) {
    p0[i] = r.spread(-4, 1);
    m0[i] = r.spread(-10, -3);
    v0[i] = std::fabs(r.spread(-20, -6));
    g[i] = r.spread(-8, -1);
  }
  std::vector<std::uint32_t> counts0(cols);
  for (auto& c : counts0) c = std::uint32_t(r.below(20));
  tbb::task_arena arena{1};
  std::vector<std::uint32_t> bad = {1, 50};
  adamw_job jb;
  auto pb = p0, mb = m0, vb = v0;
  auto cb = counts0;
  jb.param = pb.data(); jb.exp_avg = mb.data(); jb.exp_avg_sq = vb.data(); jb.grad = g.data();
  jb.rows = rows;
  jb.columns = bad.data();
  CHECK_THROWS_WITH_AS(adamw(arena, jb, cols, cb.data(), best_isa(), bad.size()),
                       "zenflow: column index out of range", std::invalid_argument);
  CHECK_THROWS_WITH_AS(adamw(arena, jb, cols, cb.data()),
                       "zenflow: ncols must be given and <= cols with a column list", std::invalid_argument);
  // a column listed twice (two threads would update it at once, and count it twice), in an
  // unsorted list and a sorted one
  for (const std::vector<std::uint32_t>& twice : {std::vector<std::uint32_t>{7, 3, 7}, std::vector<std::uint32_t>{2, 5, 5}}) {
    jb.columns = twice.data();
    CHECK_THROWS_WITH_AS(adamw(arena, jb, cols, cb.data(), best_isa(), twice.size()), "zenflow: a column is listed twice",
                         std::invalid_argument);
  }
  CHECK(pb == p0);  // nothing was written
  CHECK(mb == m0);
  CHECK(vb == v0);
  CHECK(cb == counts0);
}

TEST_CASE("adamw_traffic (bench/cpu_adam's roofline twin): the kernel's loads and stores, no arithmetic") {
  // The twin must move exactly the bytes AdamW moves — p, m, v read and written in place, g
  // read, the 16-bit copy written — with the values merely permuted: p <- m, m <- v, v <- p ^ g
  // (bits), copy <- p's upper 16 bits, unrounded (a rounding store made the twin partly
  // compute-bound and flattered the kernel's ratio). On every tier, with lengths that leave a
  // vector tail, and a bf16 gradient (loaded widened, as the kernel loads it).
  zf_test::rng r(21);
  for (isa t : zf_test::available_tiers())
    for (const std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(64), std::size_t(100)}) {
      CAPTURE(name_of(t));
      CAPTURE(n);
      std::vector<float> p(n), m(n), v(n);
      std::vector<bfloat16> g(n), copy(n, bfloat16::from_bits(0x1234));
      for (std::size_t i = 0; i < n; ++i) {
        p[i] = r.spread(-4, 4);
        m[i] = r.spread(-4, 4);
        v[i] = r.spread(-4, 4);
        g[i] = bfloat16(r.spread(-4, 4));
      }
      const auto p0 = p, m0 = m, v0 = v;
      adamw_job j;
      j.param = p.data(); j.exp_avg = m.data(); j.exp_avg_sq = v.data();
      j.grad = g.data(); j.grad_type = dtype::bf16;
      j.param_copy = copy.data(); j.copy_type = dtype::bf16;
      j.rows = n;
      kernels(t).adamw_traffic(j, 0, n);
      bool same = true;
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t gbits = std::uint32_t(g[i].bits) << 16;  // (the widened bf16)
        same = same && zf_test::bits(p[i]) == zf_test::bits(m0[i]) && zf_test::bits(m[i]) == zf_test::bits(v0[i]) &&
               zf_test::bits(v[i]) == (zf_test::bits(p0[i]) ^ gbits) &&
               copy[i].bits == std::uint16_t(zf_test::bits(p0[i]) >> 16);
      }
      CHECK(same);
    }
}

#if ZENFLOW_HAS_MXCSR
// zenflow's loops keep subnormals whatever the calling thread's MXCSR (detail/fp_env.hpp): with
// flush-to-zero and denormals-are-zero set by the caller — a trainer's choice, or crtfastmath's
// at load — AdamW, accumulate and the rank-order sum give the bits they give without, on the
// calling thread alone (below serial_below elements) and on the arena's threads, and the
// caller's setting is as it was after each call. Before, the serial path flushed: DAZ read the
// subnormal gradients as 0, FTZ flushed the decayed params.
TEST_CASE("host kernels: the same bits with the caller's flush-to-zero and denormals-are-zero set") {
  constexpr unsigned flush = 0x8040u;  // FTZ | DAZ
  for (const std::size_t n : {std::size_t(7), std::size_t(40000)}) {  // one column of n rows
    CAPTURE(n);
    auto run = [&](bool flushing) {
      std::vector<float> p(n), m(n), v(n), g(n), acc(n), pieces(2 * n), sum(n), sum2(n);
      for (std::size_t i = 0; i < n; ++i) {  // every value subnormal (FLT_MIN is 1.18e-38)
        p[i] = 1e-39f * float(1 + i % 7);
        m[i] = 3e-40f * float(i % 5);
        v[i] = 1e-39f * float(i % 3);
        g[i] = -2e-40f * float(1 + i % 11);
        acc[i] = 5e-40f * float(i % 4);
        pieces[i] = 1e-40f * float(i % 9);
        pieces[n + i] = -3e-41f * float(i % 13);
      }
      const unsigned saved = _mm_getcsr();  // (the inputs made first: under FTZ they would flush)
      if (flushing) _mm_setcsr(saved | flush);
      if (flushing) {  // the setting took: a product of subnormals' size flushes outside zenflow
        volatile float tiny = 1e-39f;
        CHECK(tiny * 1.0f == 0.0f);
      }
      tbb::task_arena arena(2);  // (made under the caller's setting: oneTBB may pass it to its threads)
      std::uint32_t count = 0;
      adamw_job job;
      job.param = p.data(); job.exp_avg = m.data(); job.exp_avg_sq = v.data(); job.grad = g.data();
      job.rows = n;
      job.hyper.lr = 1e-3f; job.hyper.weight_decay = 0.01f;
      adamw(arena, job, 1, &count);
      accumulate(arena, {acc.data(), g.data(), dtype::f32, 0.5f}, n);
      sum_in_rank_order(nullptr, pieces.data(), dtype::f32, 2, n, true, sum.data());   // the calling thread
      sum_in_rank_order(&arena, pieces.data(), dtype::f32, 2, n, false, sum2.data());  // the arena
      const unsigned after = _mm_getcsr();
      _mm_setcsr(saved);
      // the caller's control bits as they were (the status flags, bits 0-5, record what ran)
      CHECK((after & ~0x3fu) == ((flushing ? (saved | flush) : saved) & ~0x3fu));
      std::vector<float> all;
      for (const auto* x : {&p, &m, &v, &acc, &sum, &sum2}) all.insert(all.end(), x->begin(), x->end());
      return all;
    };
    const std::vector<float> ieee = run(false), flushed = run(true);
    REQUIRE(ieee.size() == flushed.size());
    CHECK(std::memcmp(ieee.data(), flushed.data(), ieee.size() * sizeof(float)) == 0);
    // (and the data was of the kind flushing changes: some results are subnormal, not zero)
    CHECK(std::any_of(ieee.begin(), ieee.end(), [](float x) { return x != 0 && std::fabs(x) < 1.17549435e-38f; }));
  }
}
#endif
