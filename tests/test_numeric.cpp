// Scalar bfloat16/float16 conversions (numeric.hpp) against the definition-based references.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include <zenflow/numeric.hpp>
#include <zenflow/selector/column_topk.hpp>

#include "reference/reference.hpp"
#include "support.hpp"

using namespace zenflow;

namespace {
// Finite floats: the result must be the reference rounding exactly (rounding is a function).
// NaN: a quiet NaN of the same sign with the top payload bits kept (the documented rule).
void check_bf16(float x) {
  const std::uint16_t got = to_bfloat16(x).bits;
  const std::uint32_t u = zf_ref::bits(x);
  if (std::isnan(x)) {
    REQUIRE(got == std::uint16_t((u >> 16) | 0x40));
  } else {
    INFO("x = ", x, " bits ", u);
    REQUIRE(got == zf_ref::bf16_round(x));
  }
}
void check_f16(float x) {
  const std::uint16_t got = to_float16(x).bits;
  const std::uint32_t u = zf_ref::bits(x);
  if (std::isnan(x)) {
    REQUIRE(got == std::uint16_t(((u >> 16) & 0x8000) | 0x7e00 | ((u >> 13) & 0x3ff)));
  } else {
    INFO("x = ", x, " bits ", u);
    REQUIRE(got == zf_ref::f16_round(x));
  }
}
}  // namespace

TEST_CASE("bfloat16 and float16 decode every bit pattern exactly") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const double rb = zf_ref::bf16_value(std::uint16_t(h));
    const float b = to_float(bfloat16::from_bits(std::uint16_t(h)));
    if (std::isnan(rb)) REQUIRE(std::isnan(b));
    else REQUIRE(double(b) == rb);
    const double rf = zf_ref::f16_value(std::uint16_t(h));
    const float f = to_float(float16::from_bits(std::uint16_t(h)));
    if (std::isnan(rf)) {
      REQUIRE(std::isnan(f));
      REQUIRE(std::signbit(f) == bool(h & 0x8000));
    } else {
      REQUIRE(double(f) == rf);
      REQUIRE(std::signbit(f) == bool(h & 0x8000));  // -0 stays -0
    }
    // the explicit conversions are the same decoding, bit for bit (NaNs included)
    REQUIRE(zf_ref::bits(float(bfloat16::from_bits(std::uint16_t(h)))) == zf_ref::bits(b));
    REQUIRE(zf_ref::bits(static_cast<float>(float16::from_bits(std::uint16_t(h)))) == zf_ref::bits(f));
  }
}

TEST_CASE("narrowing rounds to nearest even: edge cases") {
  const float inf = std::numeric_limits<float>::infinity();
  const float cases[] = {0.0f, -0.0f, 1.0f, -1.0f, inf, -inf,
                         std::numeric_limits<float>::quiet_NaN(),
                         -std::numeric_limits<float>::quiet_NaN(),
                         zf_ref::from_bits(0x7f800001u),  // signalling NaN
                         zf_ref::from_bits(0xffc12345u),
                         std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                         std::numeric_limits<float>::denorm_min(), 1e-40f, -1e-40f,
                         65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e5f,     // f16 overflow edge
                         5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f,       // f16 subnormal edge
                         6.1035156e-5f, 6.1035152e-5f,                      // f16 min normal edge
                         zf_ref::from_bits(0x3f808000u), zf_ref::from_bits(0x3f818000u),  // bf16 ties
                         zf_ref::from_bits(0x3f808001u), zf_ref::from_bits(0x7f7f8000u),  // tie -> inf
                         1.0009765625f + 0.00048828125f, 1.0f + 0.00048828125f};          // f16 ties
  for (float x : cases) {
    check_bf16(x);
    check_f16(x);
  }
}

TEST_CASE("narrowing matches the reference over every exponent and random mantissas") {
  zf_test::rng r(1);
  for (std::uint32_t e = 0; e < 256; ++e)
    for (int k = 0; k < 600; ++k) {
      std::uint32_t mant = r.u32() & 0x7fffffu;
      if (k % 4 == 1) mant = (mant & ~0xffffu) | 0x8000u;  // exact bf16 tie
      if (k % 4 == 2) mant = (mant & ~0x1fffu) | 0x1000u;  // exact f16 tie (normal range)
      const float x = zf_ref::from_bits((r.u32() & 0x80000000u) | (e << 23) | mant);
      check_bf16(x);
      check_f16(x);
    }
}

TEST_CASE("round trips: 16-bit values survive float and back") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float b = to_float(bfloat16::from_bits(std::uint16_t(h)));
    if (!std::isnan(b)) REQUIRE(to_bfloat16(b).bits == h);
    const float f = to_float(float16::from_bits(std::uint16_t(h)));
    if (!std::isnan(f)) REQUIRE(to_float16(f).bits == h);
  }
}

// bf16/fp16 from a float round to nearest even; raw bits only through from_bits(); a double or
// an integer does not compile (it used to be taken as raw bits: bfloat16(0.02f) was zero).
static_assert(!std::is_aggregate_v<bfloat16> && !std::is_aggregate_v<float16>);
static_assert(std::is_constructible_v<bfloat16, float> && !std::is_convertible_v<float, bfloat16>);
static_assert(!std::is_constructible_v<bfloat16, double> && !std::is_constructible_v<bfloat16, int> &&
              !std::is_constructible_v<bfloat16, std::uint16_t>);
static_assert(!std::is_constructible_v<float16, double> && !std::is_constructible_v<float16, std::uint16_t>);

TEST_CASE("bfloat16 and float16 made from a float round like to_bfloat16 / to_float16") {
  for (float x : {0.02f, -3.14159f, 1e-40f, 65504.0f, 1e30f, 0.0f, -0.0f}) {
    CAPTURE(x);
    CHECK(bfloat16(x).bits == to_bfloat16(x).bits);
    CHECK(float16(x).bits == to_float16(x).bits);
  }
  CHECK(bfloat16(0.02f).bits == 0x3ca4);  // 0.02 -> 0.0200195..., not zero
  CHECK(bfloat16::from_bits(0x3ca4).bits == 0x3ca4);
  CHECK(to_float(float16::from_bits(0x3c00)) == 1.0f);
  // back to float only explicitly: an implicit conversion would let a 16-bit value slip into
  // float arithmetic (and overload resolution) unseen
  static_assert(std::is_constructible_v<float, bfloat16> && !std::is_convertible_v<bfloat16, float>);
  static_assert(std::is_constructible_v<float, float16> && !std::is_convertible_v<float16, float>);
  std::vector<bfloat16> zeros(4);  // value-initialised: zero bits, as before
  for (bfloat16 z : zeros) CHECK(z.bits == 0);
}

// The host selector against the counting reference, with many exact ties (scores from a handful
// of values), ties straddling the k-th place included; k from 0 to every column.
TEST_CASE("column_topk: the k largest scores, ties to the lower index, as the counting reference") {
  zf_test::rng r(5);
  for (int trial = 0; trial < 300; ++trial) {
    CAPTURE(trial);
    const std::size_t cols = 1 + r.below(trial < 100 ? 12 : 400);
    const std::size_t distinct = 1 + r.below(trial % 3 == 0 ? 3 : 50);
    std::vector<double> scores(cols);
    for (auto& x : scores) x = double(r.below(distinct)) * 0.25;
    const std::size_t k = trial % 10 == 0 ? cols : trial % 10 == 1 ? 0 : r.below(cols + 1);
    std::vector<std::uint32_t> got(k);
    column_topk::select(scores.data(), cols, k, got.data());
    CHECK(got == zf_ref::topk_columns(scores.data(), cols, k));
  }
}
