// The reselection plan (detail/swap_plan.hpp) against set arithmetic: for random old and new
// selections, every column is classified by membership alone (the slow, obvious way), and
// carrying the plan out on a slot array must give exactly the new selection.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include <zenflow/detail/swap_plan.hpp>

namespace {
std::vector<std::uint32_t> random_selection(std::mt19937& gen, std::uint32_t cols, std::uint32_t k) {
  std::vector<std::uint32_t> all(cols);
  for (std::uint32_t c = 0; c < cols; ++c) all[c] = c;
  std::shuffle(all.begin(), all.end(), gen);
  all.resize(k);
  std::sort(all.begin(), all.end());
  return all;
}
std::size_t rank_of(const std::vector<std::uint32_t>& v, std::uint32_t c) {
  return std::size_t(std::find(v.begin(), v.end(), c) - v.begin());
}
bool has(const std::vector<std::uint32_t>& v, std::uint32_t c) { return std::find(v.begin(), v.end(), c) != v.end(); }
}  // namespace

TEST_CASE("reselection plan: leave, stay and join by membership; carrying it out gives the new set") {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 400; ++trial) {
    const std::uint32_t cols = 1 + gen() % 40;
    // k from 0 (nothing selected yet) to cols (everything), old and new sizes drawn separately:
    // a first selection starts from an empty list
    const auto old_cols = random_selection(gen, cols, trial % 7 == 0 ? 0 : gen() % (cols + 1));
    const auto next_cols = random_selection(gen, cols, gen() % (cols + 1));
    CAPTURE(trial);
    const zenflow::detail::swap_plan p = zenflow::detail::plan_swap(old_cols, next_cols);

    std::vector<std::uint32_t> want_leave_col, want_leave_slot, want_join_col, want_join_slot, want_src, want_dst;
    for (std::uint32_t c : old_cols)
      if (!has(next_cols, c)) {
        want_leave_col.push_back(c);
        want_leave_slot.push_back(std::uint32_t(rank_of(old_cols, c)));
      }
    for (std::uint32_t c : next_cols) {
      if (has(old_cols, c)) {
        want_src.push_back(std::uint32_t(rank_of(old_cols, c)));
        want_dst.push_back(std::uint32_t(rank_of(next_cols, c)));
      } else {
        want_join_col.push_back(c);
        want_join_slot.push_back(std::uint32_t(rank_of(next_cols, c)));
      }
    }
    CHECK(p.leave_col == want_leave_col);
    CHECK(p.leave_slot == want_leave_slot);
    CHECK(p.stay_src == want_src);
    CHECK(p.stay_dst == want_dst);
    CHECK(p.join_col == want_join_col);
    CHECK(p.join_slot == want_join_slot);

    // carry it out: the current slot set holds old_cols; staying slots move, joining ones come
    // from the "host"; every slot of the next set is written exactly once
    std::vector<std::int64_t> next_slots(next_cols.size(), -1);
    for (std::size_t s = 0; s < p.stay_src.size(); ++s) {
      REQUIRE(next_slots[p.stay_dst[s]] == -1);
      next_slots[p.stay_dst[s]] = old_cols[p.stay_src[s]];
    }
    for (std::size_t s = 0; s < p.join_slot.size(); ++s) {
      REQUIRE(next_slots[p.join_slot[s]] == -1);
      next_slots[p.join_slot[s]] = p.join_col[s];
    }
    for (std::size_t s = 0; s < next_cols.size(); ++s) CHECK(next_slots[s] == std::int64_t(next_cols[s]));
    // and every old column either stays or leaves, never both
    CHECK(p.leave_col.size() + p.stay_src.size() == old_cols.size());
  }
}
