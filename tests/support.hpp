// Shared test helpers: random data, tier lists, bit comparisons.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <zenflow/host/kernels.hpp>

namespace zf_test {

// ZENFLOW_TEST_QUICK=1 (set by the sanitizer runs of CI, where code runs 5-15x slower): every
// test still runs, the heaviest with fewer random cases or smaller sizes.
inline bool quick_mode() { return std::getenv("ZENFLOW_TEST_QUICK") != nullptr; }
template <class T>
T full_or_quick(T full, T quick) { return quick_mode() ? quick : full; }

inline std::vector<zenflow::host::isa> available_tiers() {
  using zenflow::host::isa;
  std::vector<isa> out;
  for (isa t : zenflow::host::all_isas)
    if (zenflow::host::available(t)) out.push_back(t);
  return out;
}

inline std::uint32_t bits(float x) { std::uint32_t u; std::memcpy(&u, &x, 4); return u; }

// Values spread over many binades, both signs, with exact zeros now and then.
struct rng {
  std::mt19937_64 gen;
  explicit rng(std::uint64_t seed) : gen(seed) {}
  double uniform(double a, double b) { return std::uniform_real_distribution<double>(a, b)(gen); }
  std::uint64_t below(std::uint64_t n) { return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(gen); }
  float spread(double lo_exp, double hi_exp) {
    if (below(50) == 0) return 0.0f;
    const float mag = float(std::exp2(uniform(lo_exp, hi_exp)));
    return below(2) ? mag : -mag;
  }
  std::uint32_t u32() { return std::uint32_t(gen()); }
};

// A buffer whose data pointer sits `offset` elements past a 64-byte boundary, to exercise
// unaligned (but element-aligned) vector loads and stores.
template <class T>
struct offset_buffer {
  std::vector<T> storage;
  std::size_t offset;
  offset_buffer(std::size_t n, std::size_t off) : storage(n + off + 64 / sizeof(T)), offset(off) {
    const auto base = reinterpret_cast<std::uintptr_t>(storage.data());
    const std::size_t skip = ((64 - base % 64) % 64) / sizeof(T);
    offset += skip;
  }
  T* data() { return storage.data() + offset; }
  T& operator[](std::size_t i) { return data()[i]; }
};

}  // namespace zf_test
