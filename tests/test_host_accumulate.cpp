// acc += grad * factor on every tier, against a double reference.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include <zenflow/host/kernels.hpp>

#include "reference/reference.hpp"
#include "support.hpp"

using namespace zenflow;
using namespace zenflow::host;

namespace {
template <class G>
void run_case(std::size_t n, std::size_t offset, float factor, unsigned threads, std::uint64_t seed) {
  zf_test::rng r(seed);
  std::vector<float> acc0(n);
  zf_test::offset_buffer<G> grad(n, offset);
  std::vector<double> gval(n);
  for (std::size_t i = 0; i < n; ++i) {
    acc0[i] = r.spread(-10, 10);
    grad[i] = from_float<G>(r.spread(-10, 10));
    gval[i] = double(to_float(grad[i]));
  }
  tbb::task_arena arena{int(threads)};
  std::vector<std::uint32_t> first;
  for (isa t : zf_test::available_tiers()) {
    CAPTURE(name_of(t));
    zf_test::offset_buffer<float> acc(n, offset);
    std::copy(acc0.begin(), acc0.end(), acc.data());
    accumulate(arena, {acc.data(), &grad[0], dtype_of_v<G>, factor}, n, t);
    std::vector<std::uint32_t> got;
    for (std::size_t i = 0; i < n; ++i) {
      // (Exponents within 2^-10..2^10: the double sum below is exact.)
      // Two correctly rounded operations (product, then sum): the result is within half an ulp
      // of the sum of the rounded product, which is within half an ulp of the exact product.
      // So |err| <= 0.5 ulp(|result|) + 0.5 ulp(|g*factor|) <= 2^-24 (|result| + |g*factor|)
      // (+ a subnormal quantum). With factor == 1 the product is exact and the sum correctly
      // rounded: the result must equal the double sum rounded once to float.
      const double prod = gval[i] * double(factor);
      const double exact = double(acc0[i]) + prod;
      if (factor == 1.0f) {
        REQUIRE(acc[i] == float(exact));
      } else {
        const double tol = std::ldexp(std::fabs(exact) + std::fabs(prod), -24) + 1e-45;
        REQUIRE(std::fabs(double(acc[i]) - exact) <= tol);
      }
      got.push_back(zf_test::bits(acc[i]));
    }
    if (first.empty()) first = got;
    else REQUIRE(got == first);  // every tier gives the same bits
  }
}
}  // namespace

TEST_CASE("accumulate: all gradient dtypes, shapes, alignments, factors, threads") {
  std::uint64_t seed = 11;
  // quick mode (sanitizer runs): the sizes around the vector widths and one above the threading
  // threshold, two alignments, two factors, two threads
  const bool q = zf_test::quick_mode();
  const std::vector<std::size_t> sizes = q ? std::vector<std::size_t>{0, 1, 17, 40000}
                                           : std::vector<std::size_t>{0, 1, 3, 15, 16, 17, 33, 1000, 40000, 100003};
  const std::vector<std::size_t> offsets = q ? std::vector<std::size_t>{1} : std::vector<std::size_t>{0, 1, 5};
  const std::vector<float> factors = q ? std::vector<float>{1.0f, 0.37f} : std::vector<float>{1.0f, 0.125f, 0.37f, -3.0f};
  const std::vector<unsigned> thread_counts = q ? std::vector<unsigned>{2} : std::vector<unsigned>{1, 2};
  for (std::size_t n : sizes)
    for (std::size_t off : offsets)
      for (float factor : factors)
        for (unsigned threads : thread_counts) {
          CAPTURE(n); CAPTURE(off); CAPTURE(factor); CAPTURE(threads);
          run_case<float>(n, off, factor, threads, seed++);
          run_case<bfloat16>(n, off, factor, threads, seed++);
          run_case<float16>(n, off, factor, threads, seed++);
        }
}

TEST_CASE("accumulate rejects bad arguments before writing") {
  tbb::task_arena arena(1);
  std::vector<float> acc(8, 1.0f), g(8, 1.0f);
  CHECK_THROWS_WITH_AS(accumulate(arena, {acc.data(), g.data(), dtype::f32, NAN}, 8),
                       "zenflow: factor must be finite", std::invalid_argument);
  CHECK_THROWS_WITH_AS(accumulate(arena, {acc.data(), acc.data() + 2, dtype::f32, 1.0f}, 4),
                       "zenflow: acc and grad overlap", std::invalid_argument);
  CHECK_THROWS_WITH_AS(accumulate(arena, {acc.data(), nullptr, dtype::bf16, 1.0f}, 4),
                       "zenflow: grad is null", std::invalid_argument);
  for (float a : acc) CHECK(a == 1.0f);
}

TEST_CASE("accumulate: a compact gradient of listed columns lands in those columns") {
  // A small list (one thread), and 40 columns of 1000 rows (40,000 elements: split among 2 and 4
  // threads, blocks starting mid-column).
  struct shape {
    std::size_t rows, cols;
    std::vector<std::uint32_t> list;
    int threads;
  };
  std::vector<shape> shapes = {{45, 30, {29, 2, 7, 8, 0}, 2}};
  for (int threads : {2, 4}) {
    shape big{1000, 120, {}, threads};
    for (std::uint32_t c = 1; c < 120; c += 3) big.list.push_back(c);
    shapes.push_back(big);
  }
  for (const shape& sh : shapes) {
  CAPTURE(sh.rows);
  CAPTURE(sh.threads);
  const std::size_t rows = sh.rows, cols = sh.cols;
  const std::vector<std::uint32_t>& list = sh.list;
  zf_test::rng r(5);
  std::vector<float> acc0(rows * cols);
  for (auto& a : acc0) a = r.spread(-6, 3);
  std::vector<bfloat16> grad(rows * list.size());
  for (auto& g : grad) g = to_bfloat16(r.spread(-6, 3));
  tbb::task_arena arena{sh.threads};
  for (isa t : zf_test::available_tiers()) {
    CAPTURE(name_of(t));
    auto acc = acc0;
    accumulate_job j{acc.data(), grad.data(), dtype::bf16, 0.5f, rows, list.data()};
    accumulate(arena, j, grad.size(), t, cols);
    for (std::size_t c = 0; c < cols; ++c) {
      const auto it = std::find(list.begin(), list.end(), c);
      for (std::size_t i = 0; i < rows; ++i) {
        const float before = acc0[c * rows + i];
        if (it == list.end()) {
          REQUIRE(zf_test::bits(acc[c * rows + i]) == zf_test::bits(before));
        } else {
          // factor 0.5 is exact, so one rounding: the double sum rounded once
          const double g = double(to_float(grad[std::size_t(it - list.begin()) * rows + i]));
          REQUIRE(acc[c * rows + i] == float(double(before) + 0.5 * g));
        }
      }
    }
  }
  }
  const std::size_t rows = 45, cols = 30;
  const std::vector<std::uint32_t> list = {29, 2, 7, 8, 0};
  zf_test::rng r(5);
  std::vector<float> acc0(rows * cols);
  for (auto& a : acc0) a = r.spread(-6, 3);
  std::vector<bfloat16> grad(rows * list.size());
  for (auto& g : grad) g = to_bfloat16(r.spread(-6, 3));
  tbb::task_arena arena{2};
  auto acc = acc0;
  accumulate_job bad{acc.data(), grad.data(), dtype::bf16, 1.0f, rows, list.data()};
  CHECK_THROWS_WITH_AS(accumulate(arena, bad, grad.size(), best_isa(), 29),
                       "zenflow: column index out of range", std::invalid_argument);
  const std::vector<std::uint32_t> twice = {29, 2, 7, 2, 0};  // (a column listed twice)
  accumulate_job dup{acc.data(), grad.data(), dtype::bf16, 1.0f, rows, twice.data()};
  CHECK_THROWS_WITH_AS(accumulate(arena, dup, grad.size(), best_isa(), cols), "zenflow: a column is listed twice",
                       std::invalid_argument);
  CHECK(acc == acc0);
}
