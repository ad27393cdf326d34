// Per-tier vector operations for the host kernels: xsimd batches for the arithmetic, a few
// intrinsics where xsimd has no 16-bit float support (widening and narrowing, F16C).
// Include only from a translation unit compiled for the tier it instantiates (see kernels.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "../../adamw.hpp"
#include "../../numeric.hpp"
#include "../isa.hpp"

#if defined(__x86_64__) || defined(__i386__)
#  include <immintrin.h>
#endif

// Kernel bodies built for runtime dispatch and those inlined into a header-only user's code are
// compiled with different ISA flags: distinct namespaces keep the linker from merging them.
#if defined(ZENFLOW_HOST_DISPATCH)
#  define ZF_KERNEL_NS dispatch_kernels
#else
#  define ZF_KERNEL_NS inline_kernels
#endif

namespace zenflow::host::detail {
inline namespace ZF_KERNEL_NS {

// ---- xsimd version shims (8.1 takes the batch type, 11+ the scalar type) -------------------
template <class To, class From, class A>
ZF_FORCEINLINE xsimd::batch<To, A> bit_cast(const xsimd::batch<From, A>& x) noexcept {
#if XSIMD_VERSION_MAJOR >= 11
  return xsimd::bitwise_cast<To>(x);
#else
  return xsimd::bitwise_cast<xsimd::batch<To, A>>(x);
#endif
}

// Destination of a store that is not wanted (an AdamW job without a param copy).
struct discard {};

// ---- the scalar tier: one element at a time, the reference every SIMD tier must match -------
struct scalar_ops {
  using F = float;
  static constexpr std::size_t width = 1;
  static ZF_FORCEINLINE F broadcast(float x) noexcept { return x; }
  static ZF_FORCEINLINE F load(const float* p) noexcept { return *p; }
  static ZF_FORCEINLINE F load(const bfloat16* p) noexcept { return to_float(*p); }
  static ZF_FORCEINLINE F load(const float16* p) noexcept { return to_float(*p); }
  static ZF_FORCEINLINE void store(float* p, F x) noexcept { *p = x; }
  static ZF_FORCEINLINE void store(bfloat16* p, F x) noexcept { *p = to_bfloat16(x); }
  static ZF_FORCEINLINE void store(float16* p, F x) noexcept { *p = to_float16(x); }
  static ZF_FORCEINLINE void store(discard*, F) noexcept {}
  // store_bits: the stores of store() without its arithmetic — a 16-bit destination gets the
  // float's upper 16 bits, unrounded (the roofline twins' stores: the same bytes moved).
  static ZF_FORCEINLINE void store_bits(float* p, F x) noexcept { *p = x; }
  static ZF_FORCEINLINE void store_bits(bfloat16* p, F x) noexcept { p->bits = std::uint16_t(zenflow::detail::bits_of(x) >> 16); }
  static ZF_FORCEINLINE void store_bits(float16* p, F x) noexcept { p->bits = std::uint16_t(zenflow::detail::bits_of(x) >> 16); }
  static ZF_FORCEINLINE void store_bits(discard*, F) noexcept {}
  static ZF_FORCEINLINE F bit_xor(F a, F b) noexcept {
    return zenflow::detail::float_of(zenflow::detail::bits_of(a) ^ zenflow::detail::bits_of(b));
  }
};

#if defined(__SSE2__) || defined(__x86_64__)

// Arithmetic common to the SIMD tiers; Self supplies widen16/narrow16 and the fp16 hooks.
template <class A>
struct simd_common {
  using F = xsimd::batch<float, A>;
  using I = xsimd::batch<std::int32_t, A>;
  static constexpr std::size_t width = F::size;

  static ZF_FORCEINLINE F broadcast(float x) noexcept { return F(x); }
  static ZF_FORCEINLINE F load(const float* p) noexcept { return F::load_unaligned(p); }
  static ZF_FORCEINLINE void store(float* p, F x) noexcept { x.store_unaligned(p); }
  static ZF_FORCEINLINE void store(discard*, F) noexcept {}
  static ZF_FORCEINLINE void store_bits(float* p, F x) noexcept { x.store_unaligned(p); }
  static ZF_FORCEINLINE void store_bits(discard*, F) noexcept {}
  // (the upper 16 bits of each lane in the low half, for a tier's narrow16: a shift and a mask)
  static ZF_FORCEINLINE I upper16(F x) noexcept { return (bit_cast<std::int32_t>(x) >> 16) & I(0xffff); }
  static ZF_FORCEINLINE F bit_xor(F a, F b) noexcept { return a ^ b; }
  // xsimd::select(c, a, b) on int lanes; for AVX-512 the 32-bit blend itself: xsimd 8.1's
  // avx512bw select instantiates its 8- and 16-bit blends too, whose forms GCC uses at -O0
  // (macros with vector casts) do not take a batch, so a header-only AVX-512 build at -O0 did
  // not compile.
  static ZF_FORCEINLINE I blend(const xsimd::batch_bool<std::int32_t, A>& c, const I& a, const I& b) noexcept {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<A, xsimd::avx512bw>)
      return I(_mm512_mask_blend_epi32(static_cast<__mmask16>(c), static_cast<__m512i>(b), static_cast<__m512i>(a)));
    else
#endif
      return xsimd::select(c, a, b);
  }

  // fp32 -> bf16 bits in the low half of each 32-bit lane (round to nearest even, quiet NaN).
  // Shifts are arithmetic on int32 lanes; the final mask keeps the 16 bits that matter.
  static ZF_FORCEINLINE I bf16_bits(F x) noexcept {
    const I u = bit_cast<std::int32_t>(x);
    const I rounded = ((u + I(0x7fff) + ((u >> 16) & I(1))) >> 16) & I(0xffff);
    const I quiet_nan = ((u >> 16) & I(0xffff)) | I(0x40);
    return blend((u & I(0x7fffffff)) > I(0x7f800000), quiet_nan, rounded);
  }
  // bf16 bits (low half of each lane) -> fp32: exact.
  static ZF_FORCEINLINE F from_bf16_bits(I h) noexcept { return bit_cast<float>(h << 16); }

  // Software fp32 <-> fp16 with the same rules as numeric.hpp (used where F16C is absent).
  static ZF_FORCEINLINE I f16_bits(F x) noexcept {
    const I u = bit_cast<std::int32_t>(x);
    const I sign = (u >> 16) & I(0x8000);
    const I a = u & I(0x7fffffff);
    const I nan = I(0x7e00) | ((a >> 13) & I(0x3ff));
    const I normal = (a - I(0x38000000) + I(0xfff) + ((a >> 13) & I(1))) >> 13;
    const F f(zenflow::detail::opaque(typename F::register_type(bit_cast<float>(a))));
    const I sub = bit_cast<std::int32_t>(f + F(0.5f)) - I(0x3f000000);
    I h = blend(a >= I(0x38800000), normal, sub);
    h = blend(a >= I(0x477ff000), I(0x7c00), h);
    h = blend(a > I(0x7f800000), nan, h);
    return sign | h;
  }
  static ZF_FORCEINLINE F from_f16_bits(I h) noexcept {
    const I sign = (h & I(0x8000)) << 16;
    const I e = (h >> 10) & I(0x1f);
    const I mant = h & I(0x3ff);
    const I normal = ((e + I(112)) << 23) | (mant << 13);
    const I special = I(0x7f800000) | (mant << 13) |
                      blend(mant != I(0), I(0x00400000), I(0));
    const I sub = bit_cast<std::int32_t>(xsimd::batch_cast<float>(mant) * F(5.9604644775390625e-8f));
    I r = blend(e == I(0), sub, normal);
    r = blend(e == I(0x1f), special, r);
    return bit_cast<float>(sign | r);
  }
};

struct sse2_ops : simd_common<xsimd::sse2> {
  using simd_common::load;
  using simd_common::store;
  using simd_common::store_bits;
  static ZF_FORCEINLINE I widen16(const void* p) noexcept {
    const __m128i h = _mm_loadl_epi64(static_cast<const __m128i*>(p));
    return I(_mm_unpacklo_epi16(h, _mm_setzero_si128()));
  }
  static ZF_FORCEINLINE void narrow16(void* p, I x) noexcept {
    // sign-extend the low 16 bits so the signed saturating pack keeps them unchanged
    const __m128i t = _mm_srai_epi32(_mm_slli_epi32(__m128i(x), 16), 16);
    _mm_storel_epi64(static_cast<__m128i*>(p), _mm_packs_epi32(t, t));
  }
  static ZF_FORCEINLINE F load(const bfloat16* p) noexcept { return from_bf16_bits(widen16(p)); }
  static ZF_FORCEINLINE F load(const float16* p) noexcept { return from_f16_bits(widen16(p)); }
  static ZF_FORCEINLINE void store(bfloat16* p, F x) noexcept { narrow16(p, bf16_bits(x)); }
  static ZF_FORCEINLINE void store_bits(bfloat16* p, F x) noexcept { narrow16(p, upper16(x)); }
  static ZF_FORCEINLINE void store_bits(float16* p, F x) noexcept { narrow16(p, upper16(x)); }
  static ZF_FORCEINLINE void store(float16* p, F x) noexcept { narrow16(p, f16_bits(x)); }
};

#if defined(__AVX2__) && defined(__F16C__)
struct avx2_ops : simd_common<xsimd::avx2> {
  using simd_common::load;
  using simd_common::store;
  using simd_common::store_bits;
  static ZF_FORCEINLINE I widen16(const void* p) noexcept {
    return I(_mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p))));
  }
  static ZF_FORCEINLINE void narrow16(void* p, I x) noexcept {
    const __m256i v = x;
    _mm_storeu_si128(static_cast<__m128i*>(p),
                     _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
  }
  static ZF_FORCEINLINE F load(const bfloat16* p) noexcept { return from_bf16_bits(widen16(p)); }
  static ZF_FORCEINLINE F load(const float16* p) noexcept {
    return F(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static ZF_FORCEINLINE void store(bfloat16* p, F x) noexcept { narrow16(p, bf16_bits(x)); }
  static ZF_FORCEINLINE void store_bits(bfloat16* p, F x) noexcept { narrow16(p, upper16(x)); }
  static ZF_FORCEINLINE void store_bits(float16* p, F x) noexcept { narrow16(p, upper16(x)); }
  static ZF_FORCEINLINE void store(float16* p, F x) noexcept {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};
#endif

#if defined(__AVX512F__) && defined(__AVX512CD__) && defined(__AVX512DQ__) && \
    defined(__AVX512BW__) && defined(__F16C__)
struct avx512_ops : simd_common<xsimd::avx512bw> {
  using simd_common::load;
  using simd_common::store;
  using simd_common::store_bits;
  static ZF_FORCEINLINE I widen16(const void* p) noexcept {
    return I(_mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(p))));
  }
  static ZF_FORCEINLINE void narrow16(void* p, I x) noexcept {
    _mm256_storeu_si256(static_cast<__m256i*>(p), _mm512_cvtepi32_epi16(x));
  }
  static ZF_FORCEINLINE F load(const bfloat16* p) noexcept { return from_bf16_bits(widen16(p)); }
  static ZF_FORCEINLINE F load(const float16* p) noexcept {
    return F(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  }
  static ZF_FORCEINLINE void store(bfloat16* p, F x) noexcept { narrow16(p, bf16_bits(x)); }
  static ZF_FORCEINLINE void store_bits(bfloat16* p, F x) noexcept { narrow16(p, upper16(x)); }
  static ZF_FORCEINLINE void store_bits(float16* p, F x) noexcept { narrow16(p, upper16(x)); }
  static ZF_FORCEINLINE void store(float16* p, F x) noexcept {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};
#if defined(__AVX512BF16__)
// avx512 with the bf16 rounding done by vcvtneps2bf16: round to nearest even and quiet NaNs
// as bf16_bits does, but a subnormal input becomes a zero of its sign. A vector holding a
// subnormal lane (rare: |x| < 2^-126) therefore takes bf16_bits, so that every lane gets the
// bits of every other tier. The test is on the integer bits, which MXCSR's denormals-are-zero
// cannot touch (vfpclassps would see a subnormal as a zero under it, as the conversion does).
struct avx512_bf16_ops : avx512_ops {
  using avx512_ops::store;
  static ZF_FORCEINLINE void store(bfloat16* p, F x) noexcept {
    const __m512i a = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
    // 1 <= |bits| <= 0x7fffff, unsigned: a subnormal (zeros, which both round alike, excluded)
    if (_mm512_cmplt_epu32_mask(_mm512_sub_epi32(a, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fffff)))
        [[unlikely]]
      return avx512_ops::store(p, x);
    const __m256bh h = _mm512_cvtneps_pbh(x);
    _mm256_storeu_si256(static_cast<__m256i*>(static_cast<void*>(p)), (__m256i)h);
  }
};
#endif
#endif

#endif  // x86

template <isa T> struct ops_for;
template <> struct ops_for<isa::scalar> { using type = scalar_ops; };
#if defined(__SSE2__) || defined(__x86_64__)
template <> struct ops_for<isa::sse2> { using type = sse2_ops; };
#endif
#if defined(__AVX2__) && defined(__F16C__)
template <> struct ops_for<isa::avx2> { using type = avx2_ops; };
#endif
#if defined(__AVX512F__) && defined(__AVX512CD__) && defined(__AVX512DQ__) && \
    defined(__AVX512BW__) && defined(__F16C__)
template <> struct ops_for<isa::avx512> { using type = avx512_ops; };
#  if defined(__AVX512BF16__)
template <> struct ops_for<isa::avx512_bf16> { using type = avx512_bf16_ops; };
#  endif
#endif

}  // namespace ZF_KERNEL_NS
}  // namespace zenflow::host::detail

namespace xsimd {
// The unfused product, the square root and the quotient of adamw.hpp, for batches (found by ADL).
template <class A>
ZF_FORCEINLINE batch<float, A> mul_rn(const batch<float, A>& a, const batch<float, A>& b) noexcept {
  return batch<float, A>(zenflow::detail::opaque(typename batch<float, A>::register_type(a * b)));
}
template <class A>
ZF_FORCEINLINE batch<float, A> sqrt_rn(const batch<float, A>& x) noexcept { return xsimd::sqrt(x); }
template <class A>
ZF_FORCEINLINE batch<float, A> div_rn(const batch<float, A>& a, const batch<float, A>& b) noexcept { return a / b; }
}  // namespace xsimd
