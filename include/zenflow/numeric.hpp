// Number formats: bfloat16 / float16 storage types, their round-to-nearest-even conversions,
// and products that the compiler may not fuse into FMAs (so every path computes the same bits).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "detail/macros.hpp"

namespace zenflow {

// Storage-only 16-bit formats. Layout-compatible with __nv_bfloat16 / __half, so a user's
// device buffers can be passed with a reinterpret_cast. Made from a float they round to nearest
// even (bfloat16(0.02f)); from raw bits only through from_bits(); back to float exactly with
// float(h) (explicit, as to_float(h)). Anything else does not
// compile: a double would round twice, and an integer or braces used to be read as raw bits
// (bfloat16{0.02f} and bfloat16(0.02f) were the bits 0, i.e. zero).
struct bfloat16 {
  std::uint16_t bits;
  bfloat16() = default;  // trivial, like float (std::vector<bfloat16>(n) is zeros)
  ZF_HD explicit bfloat16(float x) noexcept;
  ZF_HD explicit operator float() const noexcept;  // exact (to_float): float(h), static_cast<float>(h)
  template <class T>
    requires(!std::is_same_v<std::remove_cvref_t<T>, bfloat16>)
  bfloat16(T) = delete;
  ZF_HD static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h{};
    h.bits = b;
    return h;
  }
};
struct float16 {
  std::uint16_t bits;
  float16() = default;
  ZF_HD explicit float16(float x) noexcept;
  ZF_HD explicit operator float() const noexcept;  // exact (to_float): float(h), static_cast<float>(h)
  template <class T>
    requires(!std::is_same_v<std::remove_cvref_t<T>, float16>)
  float16(T) = delete;
  ZF_HD static constexpr float16 from_bits(std::uint16_t b) noexcept {
    float16 h{};
    h.bits = b;
    return h;
  }
};
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2);
static_assert(sizeof(float16) == 2 && alignof(float16) == 2);
static_assert(std::is_trivially_copyable_v<bfloat16> && std::is_trivially_default_constructible_v<bfloat16>);
static_assert(std::is_trivially_copyable_v<float16> && std::is_trivially_default_constructible_v<float16>);

enum class dtype : std::uint8_t { f32 = 0, bf16 = 1, f16 = 2 };

constexpr std::size_t size_of(dtype t) noexcept { return t == dtype::f32 ? 4u : 2u; }
constexpr std::string_view name_of(dtype t) noexcept {
  return t == dtype::f32 ? "f32" : t == dtype::bf16 ? "bf16" : "f16";
}

template <class T> struct type_tag { using type = T; };

// Calls f(type_tag<T>{}) with the element type T of a dtype (float, bfloat16 or float16).
template <class F>
ZF_FORCEINLINE void visit_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::f32: return f(type_tag<float>{});
    case dtype::bf16: return f(type_tag<bfloat16>{});
    case dtype::f16: return f(type_tag<float16>{});
  }
}

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr dtype value = dtype::f32; };
template <> struct dtype_of<bfloat16> { static constexpr dtype value = dtype::bf16; };
template <> struct dtype_of<float16> { static constexpr dtype value = dtype::f16; };
template <class T> inline constexpr dtype dtype_of_v = dtype_of<T>::value;

namespace detail {

ZF_HD ZF_FORCEINLINE std::uint32_t bits_of(float x) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
ZF_HD ZF_FORCEINLINE float float_of(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

// Hide a value from the optimiser. A product passed through this cannot be contracted with a
// following add into an FMA, whatever -ffp-contract says; it costs no instruction. (By value:
// clang cannot tie a register operand to a variable it keeps in memory.)
template <class T>
ZF_FORCEINLINE T opaque(T x) noexcept {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+x"(x));
#elif defined(__GNUC__) && defined(__aarch64__)
  asm("" : "+w"(x));
#else
  volatile T v = x;
  x = v;
#endif
  return x;
}

}  // namespace detail

// Correctly rounded products that are never fused with a neighbouring add. Every multiply in
// the AdamW and accumulation math goes through these, so host scalar code, every SIMD tier and
// the CUDA kernels evaluate the same sequence of IEEE operations.
ZF_HD ZF_FORCEINLINE float mul_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return detail::opaque(a * b);
#endif
}
ZF_HD ZF_FORCEINLINE double mul_rn(double a, double b) noexcept {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return detail::opaque(a * b);
#endif
}
// Correctly rounded quotients: on the device __fdiv_rn, which -prec-div=false (implied by
// --use_fast_math) does not turn into an approximate division as it does a plain '/'. (Flush
// to zero, -ftz=true, would still change it; cuda_space::initialize() refuses such a build.)
ZF_HD ZF_FORCEINLINE float div_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// bfloat16 <-> float. Round to nearest, ties to even; NaN stays NaN (quiet bit set, sign and the
// top payload bits kept); overflow rounds to infinity; subnormals are kept, never flushed.
ZF_HD ZF_FORCEINLINE float to_float(bfloat16 h) noexcept {
  return detail::float_of(std::uint32_t(h.bits) << 16);
}
ZF_HD ZF_FORCEINLINE bfloat16 to_bfloat16(float x) noexcept {
  const std::uint32_t u = detail::bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bfloat16::from_bits(std::uint16_t((u >> 16) | 0x40u));
  return bfloat16::from_bits(std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
}

// float16 <-> float, same rounding rules. NaN: sign | 0x7e00 | top 9 payload bits, as the F16C
// instructions produce, so the scalar path and every SIMD tier agree bit for bit.
ZF_HD ZF_FORCEINLINE float to_float(float16 h) noexcept {
  const std::uint32_t sign = std::uint32_t(h.bits & 0x8000u) << 16;
  const std::uint32_t e = (h.bits >> 10) & 0x1fu;
  const std::uint32_t mant = h.bits & 0x3ffu;
  if (e == 0x1fu)  // inf, or NaN made quiet
    return detail::float_of(sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u));
  if (e == 0u)  // zero or subnormal: mant * 2^-24, exact
    return detail::float_of(sign | detail::bits_of(float(mant) * 5.9604644775390625e-8f));
  return detail::float_of(sign | ((e + 112u) << 23) | (mant << 13));
}
ZF_HD ZF_FORCEINLINE float16 to_float16(float x) noexcept {
  const std::uint32_t u = detail::bits_of(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  std::uint32_t h;
  if (a > 0x7f800000u) {
    h = 0x7e00u | ((a >> 13) & 0x3ffu);
  } else if (a >= 0x477ff000u) {  // >= 65520: rounds to infinity
    h = 0x7c00u;
  } else if (a >= 0x38800000u) {  // normal half: rebias the exponent, round the 13 dropped bits
    h = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  } else {
    // Subnormal half (or zero): adding 0.5f puts the 2^-24 quantum in the last mantissa bit,
    // so the hardware add does the round-to-nearest-even.
#if defined(__CUDA_ARCH__)
    const float f = __fadd_rn(detail::float_of(a), 0.5f);
#else
    const float f = detail::opaque(detail::float_of(a)) + 0.5f;
#endif
    h = detail::bits_of(f) - 0x3f000000u;
  }
  return float16::from_bits(std::uint16_t(sign | h));
}

ZF_HD inline bfloat16::bfloat16(float x) noexcept : bits(to_bfloat16(x).bits) {}
ZF_HD inline float16::float16(float x) noexcept : bits(to_float16(x).bits) {}
ZF_HD inline bfloat16::operator float() const noexcept { return to_float(*this); }
ZF_HD inline float16::operator float() const noexcept { return to_float(*this); }

template <class To> ZF_HD ZF_FORCEINLINE To from_float(float x) noexcept;
template <> ZF_HD ZF_FORCEINLINE float from_float<float>(float x) noexcept { return x; }
template <> ZF_HD ZF_FORCEINLINE bfloat16 from_float<bfloat16>(float x) noexcept { return to_bfloat16(x); }
template <> ZF_HD ZF_FORCEINLINE float16 from_float<float16>(float x) noexcept { return to_float16(x); }
ZF_HD ZF_FORCEINLINE float to_float(float x) noexcept { return x; }

namespace detail {
// Whether a value of a param dtype is a NaN or an infinity (from its fp32 bits: no comparison
// that a build told to assume finite arithmetic could fold away).
template <class P>
ZF_HD ZF_FORCEINLINE bool not_finite(P x) noexcept {
  return (bits_of(to_float(x)) & 0x7f800000u) == 0x7f800000u;
}
// The index of the first value of x[b, e) that is not finite, or e.
template <class P>
std::size_t first_non_finite_in(const P* x, std::size_t b, std::size_t e) noexcept {
  unsigned bad = 0;
  for (std::size_t k = b; k < e; ++k) bad |= unsigned(not_finite(x[k]));  // (branch-free: the common case)
  if (!bad) return e;
  while (!not_finite(x[b])) ++b;
  return b;
}
}  // namespace detail

}  // namespace zenflow
