// The optimizer's registration checks: what add_matrix / add_vector refuse before anything is
// allocated — zero or too large shapes, unknown layouts and dtypes, null or misaligned buffers,
// a param overlapping its own gradient or any buffer registered before. Each failure throws
// std::invalid_argument naming the parameter ("matrix 3: grad is null").
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "../numeric.hpp"
#include "../params.hpp"

namespace zenflow::detail {

[[noreturn]] inline void invalid(const std::string& what) { throw std::invalid_argument("zenflow: " + what); }

// Elements of a matrix parameter, once its shape and layout are known to be usable.
inline std::size_t checked_matrix_elements(const std::string& who, const matrix_param& p) {
  if (p.rows == 0 || p.cols == 0) invalid(who + ": rows and cols must be > 0");
  if (p.cols > std::numeric_limits<std::uint32_t>::max())
    invalid(who + ": " + std::to_string(p.cols) + " columns; at most 4294967295 (column lists are 32-bit)");
  if (p.layout != matrix_layout::column_contiguous && p.layout != matrix_layout::row_major)
    invalid(who + ": unknown layout");
  if (p.rows > std::numeric_limits<std::size_t>::max() / 4 / p.cols) invalid(who + ": rows * cols overflows");
  return p.rows * p.cols;
}

// Elements of a vector parameter: more than any buffer can hold is refused here, not later as a
// bare allocation failure.
inline std::size_t checked_vector_elements(const std::string& who, const vector_param& p) {
  if (p.n == 0) invalid(who + ": n must be > 0");
  if (p.n > std::numeric_limits<std::size_t>::max() / 16)
    invalid(who + ": n = " + std::to_string(p.n) + " elements cannot be held (its fp32 state alone overflows)");
  return p.n;
}

// The memory of every registered param and grad, so that a new one overlapping any of them is
// refused (an optimizer would otherwise update one buffer twice, or write into a gradient).
class registered_buffers {
 public:
  // Checks one parameter's two buffers of n elements and records them.
  void add(const std::string& who, const void* param, dtype pt, const void* grad, dtype gt, std::size_t n) {
    for (auto [p, t, what] : {std::tuple{param, pt, "param"}, std::tuple{grad, gt, "grad"}}) {
      if (t != dtype::f32 && t != dtype::bf16 && t != dtype::f16) invalid(who + ": unknown " + what + " dtype");
      if (!p) invalid(who + ": " + what + " is null");
      if (reinterpret_cast<std::uintptr_t>(p) % size_of(t))
        invalid(who + ": " + what + " is not aligned to its element size (" + std::to_string(size_of(t)) + " bytes)");
    }
    const extent mine[2] = {{param, n * size_of(pt), who + " param"}, {grad, n * size_of(gt), who + " grad"}};
    if (overlaps(mine[0], mine[1])) invalid(who + ": param and grad overlap");
    for (const extent& e : extents_)
      for (const extent& m : mine)
        if (overlaps(e, m)) invalid(m.name + " overlaps " + e.name);
    extents_.push_back(mine[0]);
    extents_.push_back(mine[1]);
  }

 private:
  struct extent {
    const void* p;
    std::size_t bytes;
    std::string name;
  };
  static bool overlaps(const extent& a, const extent& b) {
    const auto a0 = reinterpret_cast<std::uintptr_t>(a.p), b0 = reinterpret_cast<std::uintptr_t>(b.p);
    return a0 < b0 + b.bytes && b0 < a0 + a.bytes;
  }
  std::vector<extent> extents_;
};

}  // namespace zenflow::detail
