// The optimizer's registration checks: what add_matrix / add_vector refuse before anything is
// allocated — zero or too large shapes, unknown layouts and dtypes, null or misaligned buffers,
// a param overlapping its own gradient or any buffer registered before. Each failure throws
// std::invalid_argument naming the parameter ("matrix 3: grad is null").
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "../adamw.hpp"
#include "../numeric.hpp"
#include "format.hpp"
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

// A parameter group's scales, and the hyperparameters they make with the config's: finite,
// non-negative, and within the config's own bounds (lr <= 1, weight_decay <= 10, their product
// <= 1), so that no group's decoupled decay overshoots zero.
// Whether check_group would pass (no message built).
inline bool group_ok(const adamw_hyper& h, float lr_scale, float weight_decay_scale) noexcept {
  if (!(std::isfinite(lr_scale) && lr_scale >= 0 && std::isfinite(weight_decay_scale) && weight_decay_scale >= 0))
    return false;
  const adamw_hyper g = group_hyper(h, lr_scale, weight_decay_scale);
  return g.lr <= 1 && g.weight_decay <= 10 && double(g.lr) * double(g.weight_decay) <= 1;
}
inline void check_group(const std::string& who, const adamw_hyper& h, float lr_scale, float weight_decay_scale) {
  if (!(std::isfinite(lr_scale) && lr_scale >= 0))
    invalid(who + ": lr_scale must be finite and >= 0, got " + exact(lr_scale));
  if (!(std::isfinite(weight_decay_scale) && weight_decay_scale >= 0))
    invalid(who + ": weight_decay_scale must be finite and >= 0, got " + exact(weight_decay_scale));
  const adamw_hyper g = group_hyper(h, lr_scale, weight_decay_scale);
  if (!(g.lr <= 1))
    invalid(who + ": lr " + exact(h.lr) + " times lr_scale " + exact(lr_scale) + " must be at most 1");
  if (!(g.weight_decay <= 10))
    invalid(who + ": weight_decay " + exact(h.weight_decay) + " times weight_decay_scale " + exact(weight_decay_scale) +
            " must be at most 10");
  if (double(g.lr) * double(g.weight_decay) > 1)
    invalid(who + ": its lr (" + exact(g.lr) + ") times its weight_decay (" + exact(g.weight_decay) + ") must be at most 1");
}

// Room for one more element, growing geometrically (a push_back after it cannot throw).
template <class Vec>
void room_for_one(Vec& v) {
  if (v.size() == v.capacity()) v.reserve(v.size() < 8 ? 8 : 2 * v.size());
}

// The memory of every registered param and grad, so that a new one overlapping any of them is
// refused (an optimizer would otherwise update one buffer twice, or write into a gradient). The
// recorded extents never overlap each other, so they are kept ordered by start address and a new
// extent need only be compared with its two neighbours: O(log n) per registration.
class registered_buffers {
 public:
  // Checks one parameter's two buffers of n elements and records them: the parameter is `who`,
  // vector or matrix number `index` (what a later message calls it).
  void add(const std::string& who, bool is_vector, std::size_t index, const void* param, dtype pt, const void* grad,
           dtype gt, std::size_t n) {
    for (auto [p, t, what] : {std::tuple{param, pt, "param"}, std::tuple{grad, gt, "grad"}}) {
      if (t != dtype::f32 && t != dtype::bf16 && t != dtype::f16) invalid(who + ": unknown " + what + " dtype");
      if (!p) invalid(who + ": " + what + " is null");
      if (reinterpret_cast<std::uintptr_t>(p) % size_of(t))
        invalid(who + ": " + what + " is not aligned to its element size (" + std::to_string(size_of(t)) + " bytes)");
      // (n * 4 bytes fits a size_t: checked_*_elements; the end must fit the address space too,
      // else the extents below wrap and the overlap checks compare nonsense)
      if (at(p) > std::numeric_limits<std::uintptr_t>::max() - n * size_of(t))
        invalid(who + ": " + what + " of " + std::to_string(n * size_of(t)) +
                " bytes would run past the end of the address space");
    }
    const span mine[2] = {{at(param), at(param) + n * size_of(pt)}, {at(grad), at(grad) + n * size_of(gt)}};
    if (mine[0].begin < mine[1].end && mine[1].begin < mine[0].end) invalid(who + ": param and grad overlap");
    const char* what[2] = {" param", " grad"};
    for (int k = 0; k < 2; ++k)
      if (const auto hit = overlapping(mine[k]); hit != extents_.end())
        invalid(who + what[k] + " overlaps " + name(hit->second.owner));
    const std::uint64_t owner = std::uint64_t(index) * 4 + (is_vector ? 2 : 0);
    // both or neither (an allocation failing on the second leaves no record of a tensor that was
    // never registered)
    const auto first = extents_.emplace(mine[0].begin, extent{mine[0].end, owner}).first;
    try {
      extents_.emplace(mine[1].begin, extent{mine[1].end, owner + 1});
    } catch (...) {
      extents_.erase(first);
      throw;
    }
  }

  // The destination of a copy out of the optimizer (copy_master and the like), `bytes` long:
  // refused if null, misaligned for its elements, or overlapping a registered param or grad —
  // the copy would write over what it reads (an fp32 param holds its selected columns' master)
  // or over the trainer's model.
  void check_out(const std::string& who, const void* out, std::size_t bytes, std::size_t align) const {
    if (!out) invalid(who + ": out is null");
    if (at(out) % align) invalid(who + ": out is not aligned to its element size (" + std::to_string(align) + " bytes)");
    if (bytes == 0) return;
    if (const auto hit = overlapping({at(out), at(out) + bytes}); hit != extents_.end())
      invalid(who + ": out overlaps " + name(hit->second.owner) + ", which the copy would write over");
  }

  // f(start, bytes, name) for each recorded buffer, in address order.
  template <class F>
  void for_each(F&& f) const {
    for (const auto& [begin, e] : extents_)
      f(reinterpret_cast<const void*>(begin), std::size_t(e.end - begin), name(e.owner));
  }

  // Host memory of the records: a tree node each (the entry after 32 bytes of colour and links),
  // as the heap block it occupies (rounded up to 16 bytes with an 8-byte header).
  std::size_t bytes() const noexcept { return extents_.size() * ((32 + sizeof(map::value_type) + 8 + 15) / 16 * 16); }

 private:
  struct span {
    std::uintptr_t begin, end;
  };
  struct extent {
    std::uintptr_t end;
    std::uint64_t owner;  // index * 4 + 2 for a vector + 1 for a grad (a name only when needed)
  };
  static std::string name(std::uint64_t owner) {
    return std::string(owner & 2 ? "vector " : "matrix ") + std::to_string(owner / 4) + (owner & 1 ? " grad" : " param");
  }
  using map = std::map<std::uintptr_t, extent>;
  static std::uintptr_t at(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

  // A recorded extent overlapping s, or end(): the last one starting at or before s.begin, or
  // the first one starting after it.
  map::const_iterator overlapping(const span& s) const {
    auto next = extents_.upper_bound(s.begin);
    if (next != extents_.begin()) {
      auto prev = std::prev(next);
      if (prev->second.end > s.begin) return prev;
    }
    if (next != extents_.end() && next->first < s.end) return next;
    return extents_.end();
  }
  map extents_;
};

}  // namespace zenflow::detail
