// The reselection plan: given a matrix's selected columns before and after a selection (both
// ascending), which device slots leave for the host, which stay (and move to which slot of the
// next slot set), and which columns join from the host. Pure bookkeeping, no memory moves: the
// optimizer carries the plan out (optimizer.hpp, swap_columns).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zenflow::detail {

struct swap_plan {
  std::vector<std::uint32_t> leave_slot, leave_col;  // slot in the current set, its column
  std::vector<std::uint32_t> stay_src, stay_dst;     // slot in the current set -> slot in the next
  std::vector<std::uint32_t> join_slot, join_col;    // slot in the next set, its column
};

// old_cols[s] is the column in slot s of the current set, next_cols[s] the one in slot s of the
// next set; a column's slot is its rank in its list. One merge pass over each list.
inline swap_plan plan_swap(const std::vector<std::uint32_t>& old_cols, const std::vector<std::uint32_t>& next_cols) {
  swap_plan p;
  for (std::size_t s = 0, j = 0; s < old_cols.size(); ++s) {
    while (j < next_cols.size() && next_cols[j] < old_cols[s]) ++j;
    if (j < next_cols.size() && next_cols[j] == old_cols[s]) continue;
    p.leave_slot.push_back(std::uint32_t(s));
    p.leave_col.push_back(old_cols[s]);
  }
  for (std::size_t s = 0, j = 0; s < next_cols.size(); ++s) {
    while (j < old_cols.size() && old_cols[j] < next_cols[s]) ++j;
    if (j < old_cols.size() && old_cols[j] == next_cols[s]) {
      p.stay_src.push_back(std::uint32_t(j));
      p.stay_dst.push_back(std::uint32_t(s));
    } else {
      p.join_slot.push_back(std::uint32_t(s));
      p.join_col.push_back(next_cols[s]);
    }
  }
  return p;
}

}  // namespace zenflow::detail
