// What every GpuUpdater keeps per registered parameter, whatever the space: for a matrix, the
// selected columns' fp32 master, moments and Adam counts in two compact [k][rows] slot sets (a
// reselection builds the new set without allocating; one set when every column is selected,
// since that selection never changes); for a vector, its whole AdamW state. An updater may set
// param_master for an fp32 param: the param itself is then the master (no copy is held). And
// the registry of both, with the accessors the optimizer and its checkpoint format use. Each
// updater adds its own per-step scratch by deriving from these. The arrays come from the
// registry's array_pool (one allocation for all the small ones).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../detail/array_pool.hpp"
#include "../params.hpp"

namespace zenflow {

template <class Space>
struct column_slots {
  using space_type = Space;
  using pool = detail::array_pool<Space>;
  template <class T>
  using buffer = detail::pooled_array<Space, T>;
  matrix_param p;
  std::size_t k = 0;       // selected columns (fixed by topk_ratio)
  std::size_t active = 0;  // columns selected now: 0 before the first selection, then k
  int cur = 0;             // which of the two slot sets is live
  bool param_master = false;  // the (fp32) param is the master: master[] stays empty
  buffer<std::uint32_t> columns[2];
  buffer<float> master[2], exp_avg[2], exp_avg_sq[2];
  buffer<std::uint32_t> counts[2];

  // Every column selected: the selection is fixed, and one slot set holds it.
  bool all_selected() const noexcept { return k == p.cols; }
  // The live master of slot set b, or nullptr when the param is the master.
  float* master_of(int b) noexcept { return param_master ? nullptr : master[b].data(); }

  void allocate_slots(pool& from) {
    for (int b = 0; b < (all_selected() ? 1 : 2); ++b) {
      from.request(columns[b], k);
      if (!param_master) from.request(master[b], k * p.rows);
      from.request(exp_avg[b], k * p.rows);
      from.request(exp_avg_sq[b], k * p.rows);
      from.request(counts[b], k);
    }
  }
  std::size_t slot_bytes() const noexcept {
    std::size_t b = 0;
    for (int s = 0; s < 2; ++s)
      b += 4 * (columns[s].size() + master[s].size() + exp_avg[s].size() + exp_avg_sq[s].size() + counts[s].size());
    return b;
  }
};

template <class Space>
struct vector_adamw_state {
  using pool = detail::array_pool<Space>;
  template <class T>
  using buffer = detail::pooled_array<Space, T>;
  vector_param p;
  bool param_master = false;  // the (fp32) param is the master: master stays empty
  buffer<float> master, exp_avg, exp_avg_sq;
  std::uint32_t count = 0;

  float* master_ptr() noexcept { return param_master ? nullptr : master.data(); }

  void allocate_state(pool& from) {
    if (!param_master) from.request(master, p.n);
    from.request(exp_avg, p.n);
    from.request(exp_avg_sq, p.n);
  }
  std::size_t state_bytes() const noexcept { return 4 * (master.size() + exp_avg.size() + exp_avg_sq.size()); }
};

// The registered parameters of an updater, in registration order (indices as the optimizer's).
template <class MatrixState, class VectorState>
class updater_registry {
 public:
  // Room for every registration at once (initialize knows the counts: no growth, no copies).
  void reserve(std::size_t matrices, std::size_t vectors) {
    matrices_.reserve(matrices);
    vectors_.reserve(vectors);
  }
  std::size_t add_matrix(const matrix_param& p, std::size_t k) {
    auto& s = matrices_.emplace_back();
    s.p = p;
    s.k = k;
    return matrices_.size() - 1;
  }
  std::size_t add_vector(const vector_param& p) {
    vectors_.emplace_back().p = p;
    return vectors_.size() - 1;
  }
  MatrixState& matrix(std::size_t i) noexcept { return matrices_[i]; }
  const MatrixState& matrix(std::size_t i) const noexcept { return matrices_[i]; }
  VectorState& vector(std::size_t i) noexcept { return vectors_[i]; }
  const VectorState& vector(std::size_t i) const noexcept { return vectors_[i]; }
  std::size_t matrices() const noexcept { return matrices_.size(); }
  std::size_t vectors() const noexcept { return vectors_.size(); }
  // Host memory of the per-parameter records (the state descriptors themselves; a vector's
  // unused capacity is left out: never touched, it is not resident either).
  std::size_t records_bytes() const noexcept {
    return matrices_.size() * sizeof(MatrixState) + vectors_.size() * sizeof(VectorState);
  }

 protected:
  std::vector<MatrixState> matrices_;
  std::vector<VectorState> vectors_;
  detail::array_pool<typename MatrixState::space_type> pool_;  // every small per-parameter array
};

}  // namespace zenflow
