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
  // avx512 + AVX-512 BF16: the bf16 rounding in one instruction (vcvtneps2bf16), with the
  // integer rounding kept for the vectors it would round differently (subnormal lanes)
  avx512_bf16 = 4,
};

// Every tier, worst to best.
inline constexpr isa all_isas[] = {isa::scalar, isa::sse2, isa::avx2, isa::avx512, isa::avx512_bf16};

constexpr std::string_view name_of(isa t) noexcept {
  switch (t) {
    case isa::scalar: return "scalar";
    case isa::sse2: return "sse2";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
    case isa::avx512_bf16: return "avx512_bf16";
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
// AVX512_BF16 from CPUID leaf 7, sub-leaf 1 (EAX bit 5), for the same reason.
inline bool has_avx512_bf16() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
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
    case isa::avx512_bf16: return cpu_supports(isa::avx512) && detail::has_avx512_bf16();
  }
  return false;
#else
  return t == isa::scalar;
#endif
}

// The best tier the current translation unit is compiled for (what a header-only user gets).
#if defined(__AVX512F__) && defined(__AVX512CD__) && defined(__AVX512DQ__) && \
    defined(__AVX512BW__) && defined(__F16C__) && defined(__AVX512BF16__)
inline constexpr isa compiled_isa = isa::avx512_bf16;
#elif defined(__AVX512F__) && defined(__AVX512CD__) && defined(__AVX512DQ__) && \
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
