// Bodies of the host kernels, written once over a tier's vector operations (simd.hpp).
// Compiled per tier: by the kernels library (one translation unit per ISA, runtime dispatch)
// or inline in a header-only user's translation unit for the ISA it is compiled for.
#pragma once

#include <algorithm>
#include <cstring>
#include <tuple>
#include <type_traits>

#include "../kernel_table.hpp"
#include "simd.hpp"

namespace zenflow::host::detail {
inline namespace ZF_KERNEL_NS {

// Runs body(ptrs + i...) over [begin, end) in full vectors. The remainder goes through padded
// stack copies, so the tail runs the very same vector code (and gives the same bits). Arrays
// behind const pointers are inputs; the others are copied back.
template <class V, class Body, class... T>
ZF_FORCEINLINE void for_each_vector(std::size_t begin, std::size_t end, Body&& body,
                                    T*... ptrs) noexcept {
  constexpr std::size_t w = V::width;
  std::size_t i = begin;
  for (; i + w <= end; i += w) body((ptrs + i)...);
  if (i == end) return;
  const std::size_t rem = end - i;
  auto pad = [&](auto* p) {
    using E = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    struct padded { alignas(64) E v[w]; } b;
    std::memset(b.v, 0, sizeof b.v);
    std::memcpy(b.v, p + i, rem * sizeof(E));
    return b;
  };
  auto bufs = std::make_tuple(pad(ptrs)...);
  std::apply(
      [&](auto&... b) {
        body(static_cast<T*>(b.v)...);
        (([&] {
           if constexpr (!std::is_const_v<T>) std::memcpy(ptrs + i, b.v, rem * sizeof(T));
         }()),
         ...);
      },
      bufs);
}

template <class V>
struct tier_kernels {
  using F = typename V::F;

  template <class G, class C, bool Divide>
  static void adamw_typed(const adamw_job& j, std::size_t begin, std::size_t end) noexcept {
    const G* grad = static_cast<const G*>(j.grad);
    const F mul = V::broadcast(j.grad_mul), div = V::broadcast(j.grad_div);
    std::size_t col = begin / j.rows;
    std::uint32_t cached = 0;
    adamw_terms<F> t{};
    bool have = false;
    while (begin < end) {
      const std::size_t stop = std::min(end, (col + 1) * j.rows);
      const std::uint32_t n = j.counts[col] + 1u;
      if (!have || n != cached) {  // columns usually share a count: reuse the scalars
        const adamw_coeffs c = make_coeffs(j.hyper, n);
        t = {V::broadcast(c.decay),     V::broadcast(c.l2),        V::broadcast(c.one_minus_b1),
             V::broadcast(c.beta2),     V::broadcast(c.one_minus_b2), V::broadcast(c.step_size),
             V::broadcast(c.bc2_sqrt),  V::broadcast(c.eps),       c.classic};
        cached = n;
        have = true;
      }
      if constexpr (std::is_void_v<C>) {
        for_each_vector<V>(
            begin, stop,
            [&](float* p, float* m, float* v, const G* g) {
              F pp = V::load(p), mm = V::load(m), vv = V::load(v);
              adamw_update(pp, mm, vv, scaled_grad(V::load(g), mul, div, Divide), t);
              V::store(p, pp);
              V::store(m, mm);
              V::store(v, vv);
            },
            j.param, j.exp_avg, j.exp_avg_sq, grad);
      } else {
        for_each_vector<V>(
            begin, stop,
            [&](float* p, float* m, float* v, const G* g, C* out) {
              F pp = V::load(p), mm = V::load(m), vv = V::load(v);
              adamw_update(pp, mm, vv, scaled_grad(V::load(g), mul, div, Divide), t);
              V::store(p, pp);
              V::store(m, mm);
              V::store(v, vv);
              V::store(out, pp);
            },
            j.param, j.exp_avg, j.exp_avg_sq, grad, static_cast<C*>(j.param_copy));
      }
      begin = stop;
      ++col;
    }
  }

  template <class G, class C>
  static void adamw_by_div(const adamw_job& j, std::size_t b, std::size_t e) noexcept {
    if (j.grad_div != 1.0f) adamw_typed<G, C, true>(j, b, e);
    else adamw_typed<G, C, false>(j, b, e);
  }
  template <class G>
  static void adamw_by_copy(const adamw_job& j, std::size_t b, std::size_t e) noexcept {
    if (!j.param_copy) return adamw_by_div<G, void>(j, b, e);
    switch (j.copy_type) {
      case dtype::f32: return adamw_by_div<G, float>(j, b, e);
      case dtype::bf16: return adamw_by_div<G, bfloat16>(j, b, e);
      case dtype::f16: return adamw_by_div<G, float16>(j, b, e);
    }
  }
  static void adamw(const adamw_job& j, std::size_t b, std::size_t e) noexcept {
    switch (j.grad_type) {
      case dtype::f32: return adamw_by_copy<float>(j, b, e);
      case dtype::bf16: return adamw_by_copy<bfloat16>(j, b, e);
      case dtype::f16: return adamw_by_copy<float16>(j, b, e);
    }
  }

  template <class G>
  static void accumulate_typed(const accumulate_job& j, std::size_t b, std::size_t e) noexcept {
    const F factor = V::broadcast(j.factor);
    for_each_vector<V>(
        b, e,
        [&](float* acc, const G* g) { V::store(acc, accumulate_scaled(V::load(acc), V::load(g), factor)); },
        j.acc, static_cast<const G*>(j.grad));
  }
  static void accumulate(const accumulate_job& j, std::size_t b, std::size_t e) noexcept {
    switch (j.grad_type) {
      case dtype::f32: return accumulate_typed<float>(j, b, e);
      case dtype::bf16: return accumulate_typed<bfloat16>(j, b, e);
      case dtype::f16: return accumulate_typed<float16>(j, b, e);
    }
  }

  template <class S, class D>
  static void convert_typed(const convert_job& j, std::size_t b, std::size_t e) noexcept {
    for_each_vector<V>(b, e, [](const S* s, D* d) { V::store(d, V::load(s)); },
                       static_cast<const S*>(j.src), static_cast<D*>(j.dst));
  }
  template <class S>
  static void convert_to(const convert_job& j, std::size_t b, std::size_t e) noexcept {
    switch (j.dst_type) {
      case dtype::f32: return convert_typed<S, float>(j, b, e);
      case dtype::bf16: return convert_typed<S, bfloat16>(j, b, e);
      case dtype::f16: return convert_typed<S, float16>(j, b, e);
    }
  }
  static void convert(const convert_job& j, std::size_t b, std::size_t e) noexcept {
    switch (j.src_type) {
      case dtype::f32: return convert_to<float>(j, b, e);
      case dtype::bf16: return convert_to<bfloat16>(j, b, e);
      case dtype::f16: return convert_to<float16>(j, b, e);
    }
  }

  // Roofline twins: the same loads and stores, values merely permuted (no arithmetic, and
  // nothing the compiler could drop). Gradients are loaded in their own dtype, as above.
  template <class G, class C>
  static void adamw_traffic_typed(const adamw_job& j, std::size_t b, std::size_t e) noexcept {
    const G* grad = static_cast<const G*>(j.grad);
    if constexpr (std::is_void_v<C>) {
      for_each_vector<V>(
          b, e,
          [](float* p, float* m, float* v, const G* g) {
            const F pp = V::load(p), mm = V::load(m), vv = V::load(v), gg = V::load(g);
            V::store(p, mm);
            V::store(m, vv);
            V::store(v, V::bit_xor(pp, gg));
          },
          j.param, j.exp_avg, j.exp_avg_sq, grad);
    } else {
      for_each_vector<V>(
          b, e,
          [](float* p, float* m, float* v, const G* g, C* out) {
            const F pp = V::load(p), mm = V::load(m), vv = V::load(v), gg = V::load(g);
            V::store(p, mm);
            V::store(m, vv);
            V::store(v, V::bit_xor(pp, gg));
            V::store(out, pp);
          },
          j.param, j.exp_avg, j.exp_avg_sq, grad, static_cast<C*>(j.param_copy));
    }
  }
  template <class G>
  static void adamw_traffic_by_copy(const adamw_job& j, std::size_t b, std::size_t e) noexcept {
    if (!j.param_copy) return adamw_traffic_typed<G, void>(j, b, e);
    switch (j.copy_type) {
      case dtype::f32: return adamw_traffic_typed<G, float>(j, b, e);
      case dtype::bf16: return adamw_traffic_typed<G, bfloat16>(j, b, e);
      case dtype::f16: return adamw_traffic_typed<G, float16>(j, b, e);
    }
  }
  static void adamw_traffic(const adamw_job& j, std::size_t b, std::size_t e) noexcept {
    switch (j.grad_type) {
      case dtype::f32: return adamw_traffic_by_copy<float>(j, b, e);
      case dtype::bf16: return adamw_traffic_by_copy<bfloat16>(j, b, e);
      case dtype::f16: return adamw_traffic_by_copy<float16>(j, b, e);
    }
  }
  template <class G>
  static void accumulate_traffic_typed(const accumulate_job& j, std::size_t b, std::size_t e) noexcept {
    for_each_vector<V>(
        b, e, [](float* acc, const G* g) { V::store(acc, V::bit_xor(V::load(acc), V::load(g))); },
        j.acc, static_cast<const G*>(j.grad));
  }
  static void accumulate_traffic(const accumulate_job& j, std::size_t b, std::size_t e) noexcept {
    switch (j.grad_type) {
      case dtype::f32: return accumulate_traffic_typed<float>(j, b, e);
      case dtype::bf16: return accumulate_traffic_typed<bfloat16>(j, b, e);
      case dtype::f16: return accumulate_traffic_typed<float16>(j, b, e);
    }
  }
};

template <isa T>
constexpr kernel_table make_table() noexcept {
  using K = tier_kernels<typename ops_for<T>::type>;
  return {T, &K::adamw, &K::accumulate, &K::convert, &K::adamw_traffic, &K::accumulate_traffic};
}

}  // namespace ZF_KERNEL_NS
}  // namespace zenflow::host::detail
