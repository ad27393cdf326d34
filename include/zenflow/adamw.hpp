// The one definition of the AdamW math. Every path — host scalar code,
// the SIMD host kernels (F = an xsimd batch), the CUDA kernels — instantiates the templates
// below, so they evaluate exactly these IEEE operations in this order. Products go through
// mul_rn and are never fused with an add, so all paths agree bit for bit.
#pragma once

#include <cstdint>

#include "detail/macros.hpp"
#include "numeric.hpp"

namespace zenflow {

enum class adam_mode : std::uint8_t {
  adamw = 0,    // decoupled weight decay (torch.optim.AdamW)
  classic = 1,  // L2 decay folded into the gradient (torch.optim.Adam with weight_decay)
};

struct adamw_hyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  adam_mode mode = adam_mode::adamw;
  friend constexpr bool operator==(const adamw_hyper&, const adamw_hyper&) = default;
};

// A parameter group's scales: its tensors' lr and weight_decay are the config's times these
// (weight_decay_scale 0 exempts them from decay). Named groups live in the config
// (config::param_groups, "param_groups" in the JSON); a tensor joins one with .group(g).
struct param_group {
  float lr_scale = 1.0f;
  float weight_decay_scale = 1.0f;
  friend constexpr bool operator==(const param_group&, const param_group&) = default;
};

// The hyperparameters of one parameter group: the optimizer's lr and weight_decay times the
// tensor's scales (1 and 1 leave them exact: the default group is the config itself).
constexpr adamw_hyper group_hyper(adamw_hyper h, float lr_scale, float weight_decay_scale) noexcept {
  h.lr *= lr_scale;
  h.weight_decay *= weight_decay_scale;
  return h;
}

// The scalars of one update with Adam count n (the count after incrementing, n >= 1). F is
// float, or a SIMD batch holding the same value in every lane.
template <class F>
struct adamw_terms {
  F decay;         // 1 - lr*wd in adamw mode, 1 in classic mode
  F l2;            // wd in classic mode, 0 in adamw mode
  F one_minus_b1;  // 1 - beta1
  F beta2;
  F one_minus_b2;  // 1 - beta2
  F step_size;     // lr / (1 - beta1^n)
  F bc2_sqrt;      // sqrt(1 - beta2^n)
  F eps;
  bool classic;
};
using adamw_coeffs = adamw_terms<float>;

namespace detail {
// b^n by repeated squaring with unfused double products: the same bits on every compiler and on
// the device (std::pow differs between libm implementations).
ZF_HD ZF_FORCEINLINE double pow_n(double b, std::uint32_t n) noexcept {
  double r = 1.0;
  while (n) {
    if (n & 1u) r = mul_rn(r, b);
    b = mul_rn(b, b);
    n >>= 1;
  }
  return r;
}
ZF_HD ZF_FORCEINLINE double sqrt_rn(double x) noexcept {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(x);
#else
  return __builtin_sqrt(x);
#endif
}
}  // namespace detail

ZF_HD ZF_FORCEINLINE float sqrt_rn(float x) noexcept {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return __builtin_sqrtf(x);
#endif
}

// Scalars computed in double and rounded once to float, as PyTorch does with its Python floats.
ZF_HD ZF_FORCEINLINE adamw_coeffs make_coeffs(const adamw_hyper& h, std::uint32_t n) noexcept {
  const double lr = h.lr, b1 = h.beta1, b2 = h.beta2, wd = h.weight_decay;
  const bool classic = h.mode == adam_mode::classic;
  adamw_coeffs c;
  c.decay = classic ? 1.0f : float(1.0 - mul_rn(lr, wd));
  c.l2 = classic ? h.weight_decay : 0.0f;
  c.one_minus_b1 = float(1.0 - b1);
  c.beta2 = h.beta2;
  c.one_minus_b2 = float(1.0 - b2);
  c.step_size = float(lr / (1.0 - detail::pow_n(b1, n)));
  c.bc2_sqrt = float(detail::sqrt_rn(1.0 - detail::pow_n(b2, n)));
  c.eps = h.eps;
  c.classic = classic;
  return c;
}

// One AdamW update, elementwise:
//   classic: g += wd*p              adamw: p *= 1 - lr*wd
//   m += (1-b1)*(g - m);  v = b2*v + ((1-b2)*g)*g
//   p -= (step_size*m) / (sqrt(v)/sqrt(1-b2^n) + eps)
// (sqrt_rn, mul_rn and div_rn are found by overload resolution / ADL for SIMD batches.)
template <class F>
ZF_HD ZF_FORCEINLINE void adamw_update(F& p, F& m, F& v, F g, const adamw_terms<F>& c) noexcept {
  if (c.classic) g = g + mul_rn(c.l2, p);
  else p = mul_rn(p, c.decay);
  m = m + mul_rn(c.one_minus_b1, g - m);
  v = mul_rn(c.beta2, v) + mul_rn(mul_rn(c.one_minus_b2, g), g);
  const F denom = div_rn(sqrt_rn(v), c.bc2_sqrt) + c.eps;
  p = p - div_rn(mul_rn(c.step_size, m), denom);
}

// The gradient an update sees: raw * mul (loss unscale and clip factor), then / div when the
// gradient is a window sum being turned into a mean (div == 1 skips the division, which would
// be exact anyway).
template <class F>
ZF_HD ZF_FORCEINLINE F scaled_grad(F raw, F mul, F div, bool divide) noexcept {
  F g = mul_rn(raw, mul);
  if (divide) g = div_rn(g, div);
  return g;
}

// The host accumulator's per-step update: acc += raw * factor.
template <class F>
ZF_HD ZF_FORCEINLINE F accumulate_scaled(F acc, F raw, F factor) noexcept {
  return acc + mul_rn(raw, factor);
}

}  // namespace zenflow
