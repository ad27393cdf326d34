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

// The same for an optional output: no buffer visits discard.
template <class F>
ZF_FORCEINLINE void visit_optional(const void* p, dtype t, F&& f) {
  if (!p) return f(type_tag<discard>{});
  visit_dtype(t, f);
}

// Runs body(ptrs + i...) over [begin, end) in full vectors. The remainder goes through padded
// stack copies, so the tail runs the very same vector code (and gives the same bits). Arrays
// behind const pointers are inputs; the others are copied back. Null pointers (discarded
// outputs) stay null.
template <class V, class Body, class... T>
ZF_FORCEINLINE void for_each_vector(std::size_t begin, std::size_t end, Body&& body,
                                    T*... ptrs) noexcept {
  constexpr std::size_t w = V::width;
  std::size_t i = begin;
  for (; i + w <= end; i += w) body((ptrs ? ptrs + i : ptrs)...);
  if (i == end) return;
  const std::size_t rem = end - i;
  auto pad = [&](auto* p) {
    using E = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    struct padded { alignas(64) E v[w]; } b;
    if constexpr (!std::is_empty_v<E>) {
      std::memset(b.v, 0, sizeof b.v);
      if (p) std::memcpy(b.v, p + i, rem * sizeof(E));
    }
    return b;
  };
  auto bufs = std::make_tuple(pad(ptrs)...);
  std::apply(
      [&](auto&... b) {
        body((ptrs ? static_cast<T*>(b.v) : ptrs)...);
        (([&] {
           if constexpr (!std::is_const_v<T> && !std::is_empty_v<T>)
             if (ptrs) std::memcpy(ptrs + i, b.v, rem * sizeof(T));
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
    const F mul = V::broadcast(j.grad_mul), div = V::broadcast(j.grad_div);
    const G* grad = static_cast<const G*>(j.grad);
    C* copy = static_cast<C*>(j.param_copy);
    std::size_t col = begin / j.rows;
    std::uint32_t cached = 0;
    adamw_terms<F> t{};
    bool have = false;
    while (begin < end) {
      const std::size_t stop = std::min(end, (col + 1) * j.rows);
      const std::size_t phys_col = j.columns ? j.columns[col] : col;
      const std::size_t at = phys_col * j.rows + (begin - col * j.rows);  // physical element
      const std::uint32_t n = j.counts[phys_col] + 1u;
      if (!have || n != cached) {  // columns usually share a count: reuse the scalars
        const adamw_coeffs c = make_coeffs(j.hyper, n);
        t = {V::broadcast(c.decay),     V::broadcast(c.l2),        V::broadcast(c.one_minus_b1),
             V::broadcast(c.beta2),     V::broadcast(c.one_minus_b2), V::broadcast(c.step_size),
             V::broadcast(c.bc2_sqrt),  V::broadcast(c.eps),       c.classic};
        cached = n;
        have = true;
      }
      for_each_vector<V>(
          0, stop - begin,
          [&](float* p, float* m, float* v, const G* g, C* out) {
            F pp = V::load(p), mm = V::load(m), vv = V::load(v);
            adamw_update(pp, mm, vv, scaled_grad(V::load(g), mul, div, Divide), t);
            V::store(p, pp);
            V::store(m, mm);
            V::store(v, vv);
            V::store(out, pp);
          },
          j.param + at, j.exp_avg + at, j.exp_avg_sq + at, grad + at, copy ? copy + at : copy);
      begin = stop;
      ++col;
    }
  }
  static void adamw(const adamw_job& j, std::size_t b, std::size_t e) noexcept {
    visit_dtype(j.grad_type, [&](auto g) {
      visit_optional(j.param_copy, j.copy_type, [&](auto c) {
        using G = typename decltype(g)::type;
        using C = typename decltype(c)::type;
        if (j.grad_div != 1.0f) adamw_typed<G, C, true>(j, b, e);
        else adamw_typed<G, C, false>(j, b, e);
      });
    });
  }

  static void accumulate(const accumulate_job& j, std::size_t b, std::size_t e) noexcept {
    visit_dtype(j.grad_type, [&](auto tag) {
      using G = typename decltype(tag)::type;
      const F factor = V::broadcast(j.factor);
      const G* grad = static_cast<const G*>(j.grad);
      auto body = [&](float* acc, const G* g) {
        V::store(acc, accumulate_scaled(V::load(acc), V::load(g), factor));
      };
      if (!j.columns) return for_each_vector<V>(b, e, body, j.acc, grad);
      for (std::size_t col = b / j.rows; b < e; ++col) {  // compact source, scattered columns
        const std::size_t stop = std::min(e, (col + 1) * j.rows);
        float* dst = j.acc + std::size_t(j.columns[col]) * j.rows + (b - col * j.rows);
        for_each_vector<V>(0, stop - b, body, dst, grad + b);
        b = stop;
      }
    });
  }

  static void convert(const convert_job& j, std::size_t b, std::size_t e) noexcept {
    visit_dtype(j.src_type, [&](auto s) {
      visit_dtype(j.dst_type, [&](auto d) {
        using S = typename decltype(s)::type;
        using D = typename decltype(d)::type;
        for_each_vector<V>(b, e, [](const S* src, D* dst) { V::store(dst, V::load(src)); },
                           static_cast<const S*>(j.src), static_cast<D*>(j.dst));
      });
    });
  }

  // Roofline twins: the same loads and stores, values merely permuted (no arithmetic, and
  // nothing the compiler could drop). Gradients are loaded in their own dtype, as above; a
  // 16-bit param copy is stored unrounded (store_bits: a shift, not the rounding's ten
  // operations, which made the twin partly compute-bound at one thread).
  static void adamw_traffic(const adamw_job& j, std::size_t b, std::size_t e) noexcept {
    visit_dtype(j.grad_type, [&](auto g) {
      visit_optional(j.param_copy, j.copy_type, [&](auto c) {
        using G = typename decltype(g)::type;
        using C = typename decltype(c)::type;
        for_each_vector<V>(
            b, e,
            [](float* p, float* m, float* v, const G* gp, C* out) {
              const F pp = V::load(p), mm = V::load(m), vv = V::load(v), gg = V::load(gp);
              V::store(p, mm);
              V::store(m, vv);
              V::store(v, V::bit_xor(pp, gg));
              V::store_bits(out, pp);
            },
            j.param, j.exp_avg, j.exp_avg_sq, static_cast<const G*>(j.grad), static_cast<C*>(j.param_copy));
      });
    });
  }
  static void accumulate_traffic(const accumulate_job& j, std::size_t b, std::size_t e) noexcept {
    visit_dtype(j.grad_type, [&](auto tag) {
      using G = typename decltype(tag)::type;
      for_each_vector<V>(
          b, e, [](float* acc, const G* g) { V::store(acc, V::bit_xor(V::load(acc), V::load(g))); },
          j.acc, static_cast<const G*>(j.grad));
    });
  }
};

template <isa T>
constexpr kernel_table make_table() noexcept {
  using K = tier_kernels<typename ops_for<T>::type>;
  return {T, &K::adamw, &K::accumulate, &K::convert, &K::adamw_traffic, &K::accumulate_traffic};
}

}  // namespace ZF_KERNEL_NS
}  // namespace zenflow::host::detail
