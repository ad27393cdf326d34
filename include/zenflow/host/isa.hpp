// Instruction-set tiers of the host kernels, and what the running CPU supports.
#pragma once

#include <string_view>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#  include <cpuid.h>
#endif

namespace zenflow::host {

// Ordered worst to best. Every tier computes bit-identical results; they differ only in speed.
enum class isa : int {
  scalar = 0,  // portable C++, any CPU
  sse2 = 1,    // x86-64 baseline
  avx2 = 2,    // AVX2 + F16C
  avx512 = 3,  // AVX-512 F/CD/DQ/BW + F16C
};

constexpr std::string_view name_of(isa t) noexcept {
  switch (t) {
    case isa::scalar: return "scalar";
    case isa::sse2: return "sse2";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
  }
  return "?";
}

namespace detail {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
// F16C from CPUID leaf 1 (ECX bit 29): not every compiler's __builtin_cpu_supports knows it.
inline bool has_f16c() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif
}  // namespace detail

// Whether the running CPU (and OS, for the wider register state) can execute a tier.
inline bool cpu_supports(isa t) noexcept {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  switch (t) {
    case isa::scalar: return true;
    case isa::sse2: return __builtin_cpu_supports("sse2");
    case isa::avx2: return __builtin_cpu_supports("avx2") && detail::has_f16c();
    case isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
             detail::has_f16c();
  }
  return false;
#else
  return t == isa::scalar;
#endif
}

// The best tier the current translation unit is compiled for (what a header-only user gets).
#if defined(__AVX512F__) && defined(__AVX512CD__) && defined(__AVX512DQ__) && \
    defined(__AVX512BW__) && defined(__F16C__)
inline constexpr isa compiled_isa = isa::avx512;
#elif defined(__AVX2__) && defined(__F16C__)
inline constexpr isa compiled_isa = isa::avx2;
#elif defined(__SSE2__) || defined(__x86_64__)
inline constexpr isa compiled_isa = isa::sse2;
#else
inline constexpr isa compiled_isa = isa::scalar;
#endif

}  // namespace zenflow::host
