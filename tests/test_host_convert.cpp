// Vectorised dtype conversion, every available ISA tier and several thread counts, against the
// definition-based references: exact equality (rounding is a function, nothing to tolerate).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#  include <xmmintrin.h>
#endif

#include <zenflow/host/kernels.hpp>

#include "reference/reference.hpp"
#include "support.hpp"

using namespace zenflow;
using namespace zenflow::host;

namespace {
std::vector<float> awkward_floats() {
  zf_test::rng r(7);
  std::vector<float> xs;
  for (std::uint32_t e = 0; e < 256; ++e)
    for (int k = 0; k < 300; ++k) {
      std::uint32_t mant = r.u32() & 0x7fffffu;
      if (k % 3 == 1) mant = (mant & ~0xffffu) | 0x8000u;  // bf16 tie
      if (k % 3 == 2) mant = (mant & ~0x1fffu) | 0x1000u;  // f16 tie
      xs.push_back(zf_ref::from_bits((r.u32() & 0x80000000u) | (e << 23) | mant));
    }
  for (float x : {0.0f, -0.0f, 65520.0f, 65519.996f, 2.9802322e-8f, 1e-40f})
    xs.push_back(x);
  xs.push_back(zf_ref::from_bits(0x7f800001u));  // signalling NaN
  xs.push_back(zf_ref::from_bits(0xffc00000u));
  return xs;  // length not a multiple of any vector width: exercises the tail
}
}  // namespace

TEST_CASE("float -> bf16/f16 on every tier equals the reference rounding") {
  const auto xs = awkward_floats();
  const std::size_t n = xs.size();
  for (unsigned threads : zf_test::quick_mode() ? std::vector<unsigned>{2} : std::vector<unsigned>{1, 2, 3}) {
    tbb::task_arena arena{int(threads)};
    for (isa t : zf_test::available_tiers()) {
      CAPTURE(name_of(t));
      CAPTURE(threads);
      std::vector<std::uint16_t> b(n), h(n);
      convert(arena, {xs.data(), dtype::f32, b.data(), dtype::bf16}, n, t);
      convert(arena, {xs.data(), dtype::f32, h.data(), dtype::f16}, n, t);
      for (std::size_t i = 0; i < n; ++i) {
        const float x = xs[i];
        const std::uint32_t u = zf_ref::bits(x);
        if (std::isnan(x)) {
          REQUIRE(b[i] == std::uint16_t((u >> 16) | 0x40));
          REQUIRE(h[i] == std::uint16_t(((u >> 16) & 0x8000) | 0x7e00 | ((u >> 13) & 0x3ff)));
        } else {
          CAPTURE(x);
          REQUIRE(b[i] == zf_ref::bf16_round(x));
          REQUIRE(h[i] == zf_ref::f16_round(x));
        }
      }
    }
  }
}

// The kernels library holds the tiers CMake built, and a tier is available exactly where the CPU
// supports it too. Where the compiler knows the newest tier's flag (GCC 10, Clang 9 and later on
// x86-64), it must have been built: the tests of the other cases would pass without it.
TEST_CASE("the kernels library has every tier it was built with, available where the CPU has it") {
  // (appended piece by piece: GCC 12 warns falsely about "," + std::string(...))
  std::string built = ",";
  built.append(ZF_TEST_BUILT_TIERS).append(",");
  for (isa t : all_isas) {
    CAPTURE(name_of(t));
    std::string name = ",";
    name.append(name_of(t)).append(",");
    const bool expected = built.find(name) != std::string::npos;
    CHECK((built_table(t) != nullptr) == expected);
    CHECK(available(t) == (expected && cpu_supports(t)));
    MESSAGE(name_of(t), ": built ", expected, ", CPU ", cpu_supports(t));
  }
#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && __GNUC__ >= 10))
  CHECK(built.find(",avx512_bf16,") != std::string::npos);
#endif
}

#if defined(__linux__) && defined(__x86_64__)
// The run-time CPU detection against an independent source, the flags Linux reports (it clears
// those whose register state the OS does not enable): every test "on every tier" runs on the
// tiers detected, so a detection that missed a feature would quietly drop a tier from all of
// them. Each tier needs the flags its objects are compiled with (cmake/zenflowHostKernels.cmake).
TEST_CASE("tier detection agrees with /proc/cpuinfo's flags") {
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':') + 1) + " ";
      break;
    }
  REQUIRE_MESSAGE(!flags.empty(), "no flags line in /proc/cpuinfo");
  auto has = [&](const char* f) { return flags.find(std::string(" ") + f + " ") != std::string::npos; };
  const bool avx2 = has("avx2") && has("f16c");
  const bool avx512 = has("avx512f") && has("avx512cd") && has("avx512dq") && has("avx512bw") && has("f16c");
  CHECK(cpu_supports(isa::scalar));
  CHECK(cpu_supports(isa::sse2) == has("sse2"));
  CHECK(cpu_supports(isa::avx2) == avx2);
  CHECK(cpu_supports(isa::avx512) == avx512);
  CHECK(cpu_supports(isa::avx512_bf16) == (avx512 && has("avx512_bf16")));
}
#endif

// The avx512_bf16 tier rounds with vcvtneps2bf16, which turns a subnormal into a zero and
// so falls back to the integer rounding for a vector holding one. Here one subnormal lane sits
// among normal ones, at every position of a 16-lane vector and of the next: a fallback that
// looked at some lanes only, or blended the two roundings wrongly, gives a zero or a wrong
// rounding for that lane. The subnormals round to a nonzero bf16 (mantissa >= 0x8000; one
// of exactly 0x8000, a tie to the even zero, has odds of 2^-22).
TEST_CASE("float -> bf16 on every tier: one subnormal lane among normal ones") {
  zf_test::rng r(11);
  const std::size_t n = 64 + 5;
  for (std::size_t k = 0; k < 32; ++k) {
    std::vector<float> xs(n);
    for (auto& x : xs) x = zf_ref::from_bits((r.u32() & 0x80000000u) | ((1 + std::uint32_t(r.below(254))) << 23) |
                                             ((r.u32() & 0x7f0000u) | 0x8000u));  // normal, a tie
    xs[k] = zf_ref::from_bits((r.u32() & 0x80000000u) | 0x8000u | (r.u32() & 0x7f7fffu));
    CAPTURE(k);
    for (isa t : zf_test::available_tiers()) {
      CAPTURE(name_of(t));
      std::vector<std::uint16_t> b(n);
      kernels(t).convert({xs.data(), dtype::f32, b.data(), dtype::bf16}, 0, n);
      for (std::size_t i = 0; i < n; ++i) {
        CAPTURE(i);
        REQUIRE(b[i] == zf_ref::bf16_round(xs[i]));
      }
    }
  }
}

#if defined(__x86_64__) || defined(__i386__)
// MXCSR's denormals-are-zero and flush-to-zero, which a -ffast-math object or a framework in the
// same process may set on a thread: the bf16 rounding is integer work on every tier (the
// avx512_bf16 tier's subnormal test included; vfpclassps would take a subnormal for a zero
// under DAZ and let the conversion flush it), so each tier still gives the bits it gives
// without them. (fp16 is not claimed: F16C and the software path treat DAZ differently.)
TEST_CASE("float -> bf16 on every tier: the same bits with MXCSR's DAZ and FTZ set") {
  zf_test::rng r(13);
  std::vector<float> xs(16 * 40 + 3);
  for (std::size_t i = 0; i < xs.size(); ++i)  // a subnormal every 7th lane, normals around
    xs[i] = zf_ref::from_bits((r.u32() & 0x80000000u) |
                              (i % 7 == 0 ? 0x8000u | (r.u32() & 0x7f7fffu)
                                          : ((1 + std::uint32_t(r.below(254))) << 23) | (r.u32() & 0x7fffffu)));
  struct mxcsr_guard {
    unsigned saved = _mm_getcsr();
    ~mxcsr_guard() { _mm_setcsr(saved); }
  };
  for (isa t : zf_test::available_tiers()) {
    CAPTURE(name_of(t));
    std::vector<std::uint16_t> plain(xs.size()), daz(xs.size());
    kernels(t).convert({xs.data(), dtype::f32, plain.data(), dtype::bf16}, 0, xs.size());
    {
      mxcsr_guard g;
      _mm_setcsr(g.saved | 0x8040u);  // DAZ (bit 6) and FTZ (bit 15), on this thread
      kernels(t).convert({xs.data(), dtype::f32, daz.data(), dtype::bf16}, 0, xs.size());
    }
    for (std::size_t i = 0; i < xs.size(); ++i) {
      CAPTURE(i);
      REQUIRE(plain[i] == zf_ref::bf16_round(xs[i]));
      REQUIRE(daz[i] == plain[i]);
    }
  }
}
#endif

// Every tier gives the scalar tier's bf16 for every one of the 2^32 float patterns (the scalar
// tier is checked against the definition above; every tier is then bit-identical, NaNs, ties,
// subnormals and overflow included). ~10 s; the sanitizer runs take one high half in 61.
TEST_CASE("float -> bf16: every tier equals the scalar tier on every float") {
  const std::uint32_t step = zf_test::full_or_quick(1u, 61u);
  std::vector<float> xs(65536);
  std::vector<std::uint16_t> want(xs.size()), got(xs.size());
  const auto tiers = zf_test::available_tiers();
  MESSAGE("tiers: ", tiers.size());
  std::uint64_t compared = 0;
  for (std::uint32_t hi = 0; hi < 65536; hi += step) {
    for (std::uint32_t lo = 0; lo < 65536; ++lo) xs[lo] = zf_ref::from_bits(hi << 16 | lo);
    kernels(isa::scalar).convert({xs.data(), dtype::f32, want.data(), dtype::bf16}, 0, xs.size());
    for (isa t : tiers) {
      if (t == isa::scalar) continue;
      kernels(t).convert({xs.data(), dtype::f32, got.data(), dtype::bf16}, 0, xs.size());
      if (got != want) {
        const auto at = std::size_t(std::mismatch(got.begin(), got.end(), want.begin()).first - got.begin());
        FAIL("tier ", name_of(t), ": float bits ", zf_ref::bits(xs[at]), " -> ", got[at], ", scalar ", want[at]);
      }
      compared += xs.size();
    }
  }
  CHECK(compared == (tiers.size() - 1) * ((65536 + step - 1) / step) * 65536ull);
}

TEST_CASE("bf16/f16 -> float on every tier decodes all 65536 patterns exactly") {
  std::vector<std::uint16_t> all(65536 + 3);  // + 3: a ragged tail
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = std::uint16_t(i);
  tbb::task_arena arena(2);
  std::vector<std::uint32_t> first_f16;
  for (isa t : zf_test::available_tiers()) {
    CAPTURE(name_of(t));
    std::vector<float> fb(all.size()), fh(all.size());
    convert(arena, {all.data(), dtype::bf16, fb.data(), dtype::f32}, all.size(), t);
    convert(arena, {all.data(), dtype::f16, fh.data(), dtype::f32}, all.size(), t);
    std::vector<std::uint32_t> hbits;
    for (std::size_t i = 0; i < all.size(); ++i) {
      REQUIRE(zf_ref::bits(fb[i]) == std::uint32_t(all[i]) << 16);  // bf16 is the top half
      const double ref = zf_ref::f16_value(all[i]);
      if (std::isnan(ref)) {
        REQUIRE(std::isnan(fh[i]));
        REQUIRE((zf_ref::bits(fh[i]) & 0x00400000u) != 0);  // quiet
      } else {
        REQUIRE(double(fh[i]) == ref);
        REQUIRE(std::signbit(fh[i]) == bool(all[i] & 0x8000));
      }
      hbits.push_back(zf_ref::bits(fh[i]));
    }
    // NaN payloads too: every tier (F16C or software) gives the same bits.
    if (first_f16.empty()) first_f16 = hbits;
    else REQUIRE(hbits == first_f16);
  }
}

TEST_CASE("convert rejects bad arguments and leaves the destination alone") {
  tbb::task_arena arena(1);
  std::vector<float> src(16, 1.0f);
  std::vector<std::uint16_t> dst(16, 7);
  CHECK_THROWS_WITH_AS(convert(arena, {nullptr, dtype::f32, dst.data(), dtype::bf16}, 16),
                       "zenflow: src is null", std::invalid_argument);
  auto* odd = reinterpret_cast<std::uint16_t*>(reinterpret_cast<char*>(dst.data()) + 1);
  CHECK_THROWS_WITH_AS(convert(arena, {src.data(), dtype::f32, odd, dtype::bf16}, 8),
                       "zenflow: dst is not aligned to its element size (2 bytes)", std::invalid_argument);
  CHECK_THROWS_WITH_AS(convert(arena, {src.data(), dtype::f32, src.data() + 4, dtype::f32}, 8),
                       "zenflow: src and dst overlap", std::invalid_argument);
  for (auto v : dst) CHECK(v == 7);
  convert(arena, {nullptr, dtype::f32, nullptr, dtype::bf16}, 0);  // empty: a no-op, not an error
}

// The data-parallel reduction's arithmetic (host::sum_in_rank_order): R pieces widened exactly,
// summed in rank order in fp32, divided by R for the mean, rounded to the pieces' dtype. Against
// the formats' definitions (tests/reference) element by element, on every tier, on the calling
// thread and on arenas of 1 to 3 threads: exact equality, since each step is one correctly
// rounded fp32 operation or the nearest-even rounding, nothing to tolerate (a NaN result is
// compared as a NaN: which operand's payload an addition keeps is the compiler's choice). The
// values' exponents span 2^-8..2^8 with both signs, so the fp32 sums carry more bits than a
// 16-bit dtype and another order of the additions would round differently; every 97th element
// of a piece is a special value of its dtype: signed zeros (-0 + -0 is -0, +0 + -0 is +0),
// subnormals, infinities (Inf - Inf is NaN), 2^127 or 2^15 (two of them overflow fp32 or the
// 16-bit format), a NaN — the same one on every rank at one position, a different one per rank
// at another. n is past the size below which one thread does it all (2^15), with a tail that is
// no multiple of a chunk or a vector.
TEST_CASE("the ranks' pieces summed in rank order equal the reference on every tier and thread count") {
  const std::size_t n = (std::size_t(1) << 15) + 3 * 4096 + 37;
  zf_test::rng rng(11);
  std::vector<float> base(4 * n);
  for (float& x : base)
    x = std::ldexp(float(rng.uniform(1.0, 2.0)), int(std::floor(rng.uniform(-8.0, 9.0)))) *
        (rng.uniform(0.0, 1.0) < 0.5 ? -1.0f : 1.0f);
  // the specials, as bits of each dtype: +0, -0, subnormals, +Inf, -Inf, 2^127 (2^15 in f16), NaN
  const std::uint32_t special32[8] = {0x00000000u, 0x80000000u, 0x00000001u, 0x806d0000u,
                                      0x7f800000u, 0xff800000u, 0x7f000000u, 0x7fc00001u};
  const std::uint16_t special_bf16[8] = {0x0000, 0x8000, 0x0001, 0x8050, 0x7f80, 0xff80, 0x7f00, 0x7fc1};
  const std::uint16_t special_f16[8] = {0x0000, 0x8000, 0x0001, 0x8203, 0x7c00, 0xfc00, 0x7800, 0x7e01};
  // which special element i of rank r's piece holds, or -1
  auto special = [](std::size_t r, std::size_t i) -> int {
    if (i % 97 == 0) return int((i / 97 + r) % 8);  // a different one per rank
    if (i % 97 == 1) return int((i / 97) % 8);      // the same on every rank
    return -1;
  };
  const std::vector<unsigned> thread_counts = zf_test::quick_mode() ? std::vector<unsigned>{0, 2} : std::vector<unsigned>{0, 1, 2, 3};
  std::size_t compared = 0, nan_results = 0;
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16}) {
    CAPTURE(int(t));
    const std::size_t es = size_of(t);
    // the pieces in dtype t, and their exact values
    std::vector<unsigned char> pieces(base.size() * es);
    std::vector<float> wide(base.size());
    for (std::size_t k = 0; k < base.size(); ++k) {
      const int sp = special(k / n, k % n);
      if (t == dtype::f32) {
        const float x = sp < 0 ? base[k] : zf_ref::from_bits(special32[sp]);
        std::memcpy(&pieces[k * 4], &x, 4);
        wide[k] = x;
      } else {
        const std::uint16_t h = sp >= 0 ? (t == dtype::bf16 ? special_bf16[sp] : special_f16[sp])
                                : t == dtype::bf16 ? zf_ref::bf16_round(base[k]) : zf_ref::f16_round(base[k]);
        std::memcpy(&pieces[k * 2], &h, 2);
        wide[k] = float(t == dtype::bf16 ? zf_ref::bf16_value(h) : zf_ref::f16_value(h));
      }
    }
    for (std::size_t R = 1; R <= 4; ++R)
      for (bool mean : {false, true}) {
        CAPTURE(R);
        CAPTURE(mean);
        std::vector<unsigned char> want(n * es);
        std::vector<bool> nan(n);
        for (std::size_t i = 0; i < n; ++i) {
          float s = wide[i];
          for (std::size_t r = 1; r < R; ++r) s += wide[r * n + i];
          if (mean) s /= float(R);
          nan[i] = std::isnan(s);
          nan_results += nan[i];
          if (t == dtype::f32) {
            std::memcpy(&want[i * 4], &s, 4);
          } else {
            // (both references keep an infinity; a NaN is compared as any NaN below)
            const std::uint16_t h = t == dtype::bf16 ? zf_ref::bf16_round(s) : zf_ref::f16_round(s);
            std::memcpy(&want[i * 2], &h, 2);
          }
        }
        auto is_nan = [&](const unsigned char* p) {
          if (t == dtype::f32) {
            float x;
            std::memcpy(&x, p, 4);
            return std::isnan(x);
          }
          std::uint16_t h;
          std::memcpy(&h, p, 2);
          return (h & 0x7fff) > (t == dtype::bf16 ? 0x7f80 : 0x7c00);
        };
        // (pieces of R ranks: the first R n elements; the buffer holds 4)
        for (isa tier : zf_test::available_tiers())
          for (unsigned threads : thread_counts) {
            CAPTURE(name_of(tier));
            CAPTURE(threads);
            std::vector<unsigned char> out(n * es, 0xab);
            if (threads == 0) {
              sum_in_rank_order(nullptr, pieces.data(), t, R, n, mean, out.data(), tier);
            } else {
              tbb::task_arena arena{int(threads)};
              sum_in_rank_order(&arena, pieces.data(), t, R, n, mean, out.data(), tier);
            }
            std::size_t bad = 0;
            for (std::size_t i = 0; i < n; ++i)
              bad += nan[i] ? !is_nan(&out[i * es]) : std::memcmp(&out[i * es], &want[i * es], es) != 0;
            REQUIRE(bad == 0);
            ++compared;
          }
      }
  }
  CHECK(compared == 3 * 4 * 2 * zf_test::available_tiers().size() * thread_counts.size());
  CHECK(nan_results > 0);  // (the specials met: Inf - Inf, NaN)
}

TEST_CASE("sum_in_rank_order rejects bad arguments and leaves the destination alone") {
  tbb::task_arena arena(1);
  std::vector<float> pieces(32, 1.0f);
  std::vector<float> out(16, 7.0f);
  CHECK_THROWS_WITH_AS(sum_in_rank_order(&arena, pieces.data(), dtype::f32, 0, 16, false, out.data()),
                       "zenflow: sum_in_rank_order of no pieces", std::invalid_argument);
  CHECK_THROWS_WITH_AS(sum_in_rank_order(&arena, nullptr, dtype::f32, 2, 16, false, out.data()),
                       "zenflow: pieces is null", std::invalid_argument);
  CHECK_THROWS_WITH_AS(sum_in_rank_order(nullptr, pieces.data(), dtype::f32, 2, 16, false, nullptr),
                       "zenflow: out is null", std::invalid_argument);
  auto* odd = reinterpret_cast<float*>(reinterpret_cast<char*>(out.data()) + 2);
  CHECK_THROWS_WITH_AS(sum_in_rank_order(&arena, pieces.data(), dtype::f32, 2, 8, false, odd),
                       "zenflow: out is not aligned to its element size (4 bytes)", std::invalid_argument);
  // the output inside the second rank's piece
  CHECK_THROWS_WITH_AS(sum_in_rank_order(&arena, pieces.data(), dtype::f32, 2, 16, true, pieces.data() + 20),
                       "zenflow: pieces and out overlap", std::invalid_argument);
  for (float v : out) CHECK(v == 7.0f);
  for (std::size_t i = 0; i < 16; ++i) CHECK(pieces[16 + i] == 1.0f);
  sum_in_rank_order(&arena, nullptr, dtype::bf16, 3, 0, false, nullptr);  // empty: a no-op, not an error
}

// A reselection's column moves (host::copy_pieces): n pieces of `bytes` each, piece k from
// src(k) to dst(k). Against a byte-by-byte copy of the same pieces into a second buffer (no
// memcpy in the reference): both directions a reselection uses (scatter from a contiguous stage
// to shuffled places, gather back), piece sizes that are no multiple of a vector or a cache
// line, totals below and above serial_copy_below (one thread, then the arena's), arenas of 1 to
// 3 threads. Exact equality — a copy has nothing to tolerate — and the bytes outside every
// destination piece keep their sentinel, so a piece written twice, partly or out of place fails.
TEST_CASE("copy_pieces moves each piece to its place, whatever the size and the thread count") {
  zf_test::rng rng(5);
  for (unsigned threads : {1u, 2u, 3u}) {
    tbb::task_arena arena{int(threads)};
    // (pieces, bytes per piece): from 1 byte to 20 KiB, under and over the threshold in total
    for (const auto& size : {std::pair<std::size_t, std::size_t>{1, 1}, {3, 4}, {64, 4099},
                             {2, serial_copy_below / 2 + 8}, {97, 8196}, {517, 20484}}) {
      const std::size_t n = size.first, bytes = size.second;  // (not a structured binding: lambdas use them)
      CAPTURE(threads);
      CAPTURE(n);
      CAPTURE(bytes);
      // the places: n of 2n + 1 slots, in a shuffled order
      const std::size_t slots = 2 * n + 1;
      std::vector<std::size_t> place(slots);
      std::iota(place.begin(), place.end(), std::size_t(0));
      for (std::size_t s = slots; s > 1; --s) std::swap(place[s - 1], place[rng.below(s)]);
      place.resize(n);
      std::vector<unsigned char> stage(n * bytes), arrays(slots * bytes, 0xa5), want(slots * bytes, 0xa5);
      for (auto& b : stage) b = static_cast<unsigned char>(rng.below(256));
      for (std::size_t k = 0; k < n; ++k)
        for (std::size_t b = 0; b < bytes; ++b) want[place[k] * bytes + b] = stage[k * bytes + b];
      copy_pieces(arena, n, bytes, [&](std::size_t k) { return arrays.data() + place[k] * bytes; },
                  [&](std::size_t k) { return stage.data() + k * bytes; });
      REQUIRE(arrays == want);
      // and back: gathered from the places into a fresh stage
      std::vector<unsigned char> back(n * bytes, 0x5a);
      copy_pieces(arena, n, bytes, [&](std::size_t k) { return back.data() + k * bytes; },
                  [&](std::size_t k) { return arrays.data() + place[k] * bytes; });
      REQUIRE(back == stage);
    }
    // nothing to copy: no piece is asked for (the callables would fail the test)
    auto never = [](std::size_t) -> unsigned char* {
      FAIL("copy_pieces asked for a piece of an empty copy");
      return nullptr;
    };
    copy_pieces(arena, 0, 16, never, never);
    copy_pieces(arena, 16, 0, never, never);
  }
}
