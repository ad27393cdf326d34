// GpuUpdater policy: everything that happens where the model trains. Per matrix it keeps the
// selected columns' fp32 master, moments and counts in compact [k][rows] arrays (two sets, so a
// reselection builds the new set without allocating; updater_state.hpp); per vector its whole
// optimizer state. An fp32 param is its own master (nothing is copied; the update is the same
// arithmetic in place).
// It runs the per-step gradient pass (finite check, sums for clipping, column scores) and the
// AdamW update of the selected columns and all vectors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "../adamw.hpp"
#include "../config.hpp"
#include "../host/kernel_table.hpp"
#include "../params.hpp"
#include "../policies.hpp"
#include "../space/host_space.hpp"
#include "functors.hpp"
#include "updater_state.hpp"

namespace zenflow {

namespace detail {
// fused_adamw's per-parameter state: the shared slot sets / AdamW state, plus this step's
// per-column (per-chunk for a vector) statistics of the raw gradient.
template <class Space>
struct fused_matrix_state : column_slots<Space> {
  template <class T>
  using buffer = detail::pooled_array<Space, T>;
  buffer<double> l1, sumsq;
  buffer<unsigned char> bad;
};
template <class Space>
struct fused_vector_state : vector_adamw_state<Space> {
  template <class T>
  using buffer = detail::pooled_array<Space, T>;
  buffer<double> sumsq;
  buffer<unsigned char> bad;
};
}  // namespace detail

template <class Space>
class fused_adamw : public updater_registry<detail::fused_matrix_state<Space>, detail::fused_vector_state<Space>> {
  using registry = updater_registry<detail::fused_matrix_state<Space>, detail::fused_vector_state<Space>>;
  using registry::matrices_;
  using registry::pool_;
  using registry::vectors_;

 public:
  template <class T>
  using buffer = typename Space::template buffer<T>;

  static constexpr std::size_t vector_chunk = 4096;

  using matrix_state = detail::fused_matrix_state<Space>;
  using vector_state = detail::fused_vector_state<Space>;
  struct grad_summary {
    bool finite;
    double sumsq;  // of the raw gradient, all params
  };

  void allocate() {
    std::size_t ngroups = 0;
    for (auto& s : matrices_) {
      s.param_master = s.p.param_type == dtype::f32;
      s.allocate_slots(pool_);
      pool_.request(s.l1, s.p.cols);
      pool_.request(s.sumsq, s.p.cols);
      pool_.request(s.bad, s.p.cols);
      ngroups += groups(s.p.cols);
    }
    for (auto& v : vectors_) {
      v.param_master = v.p.param_type == dtype::f32;
      v.allocate_state(pool_);
      const std::size_t chunks = (v.p.n + vector_chunk - 1) / vector_chunk;
      pool_.request(v.sumsq, chunks);
      pool_.request(v.bad, chunks);
      ngroups += groups(chunks);
    }
    pool_.commit();
    partials_ = std::vector<double>(ngroups);
    masses_.resize(matrices_.size());  // (sized here: no allocation in a step)
  }

  // The vectors' fp32 masters start as their params (an fp32 param is its own master).
  void load_vectors(Space& space) {
    for (auto& v : vectors_)
      if (!v.param_master) visit_dtype(v.p.param_type, [&](auto ptag) {
        using P = typename decltype(ptag)::type;
        const P* src = static_cast<const P*>(v.p.param);
        float* dst = v.master.data();
        space.parallel_for(v.p.n, [=](std::size_t i) { dst[i] = to_float(src[i]); });
      });
  }

  // One pass over every gradient: per-column L1 and sum of squares, non-finite flags; the total
  // sum of squares in the canonical order of functors.hpp (the same bits on every space and
  // thread count).
  grad_summary gradient_pass(Space& space) { return gradient_pass(space, false); }
  // The same pass, and with `compact` each matrix's columns copied to the places
  // set_compaction() gave (the gradient is read once for both). The statistics are the same bits.
  grad_summary gradient_pass(Space& space, bool compact) {
    for (std::size_t i = 0; i < matrices_.size(); ++i) column_stats(space, i, 0, matrices_[i].p.cols, compact);
    vector_stats(space);
    return summarize();
  }
  // One target per matrix (copied; the tables they point at are read at each compacting pass).
  void set_compaction(Space&, const compaction_target* targets) {
    targets_.assign(targets, targets + matrices_.size());
  }
  // The pass in parts, for a data-parallel optimizer whose rank holds the reduced gradient of
  // some columns only: the statistics of columns [c0, c1) of matrix i (those of the others it
  // writes into the per-column arrays itself: column_l1/column_sumsq/column_bad), of every
  // vector, and the summary once every column's are in place (the same bits as gradient_pass).
  // A pass in parts names every matrix once, before vector_stats (an empty range for one with
  // nothing of this rank's): the CUDA updater runs the ranges it was last given.
  void column_stats(Space& space, std::size_t i, std::size_t c0, std::size_t c1, bool compact = false) {
    auto& s = matrices_[i];
    // (a compacting pass with nowhere to compact to would leave the offload a stale buffer)
    if (compact && i >= targets_.size())
      throw std::logic_error("zenflow: a compacting gradient pass before set_compaction()");
    const compaction_target t = compact ? targets_[i] : compaction_target{};
    visit_dtype(s.p.grad_type, [&](auto gtag) {
      using G = typename decltype(gtag)::type;
      const device::column_stats_fn<G> f{static_cast<const G*>(s.p.grad), s.p.rows, s.p.cols, s.p.layout,
                                         s.l1.data(), s.sumsq.data(), s.bad.data()};
      if (!t.slot) {
        space.parallel_for(c1 - c0, [=](std::size_t c) { f(c0 + c); });
        return;
      }
      G* out = static_cast<G*>(t.dst);
      const std::uint32_t* slot = t.slot;
      const matrix_param p = s.p;
      space.parallel_for(c1 - c0, [=](std::size_t k) {
        const std::uint32_t c = std::uint32_t(c0 + k);
        f(c);
        if (slot[c] != no_slot)  // (the host space's compaction, one column)
          host_space::compact_columns(p.grad, p.grad_type, p.layout, p.rows, p.cols, &c, 1,
                                      out + std::size_t(slot[c]) * p.rows);
      });
    });
  }
  void vector_stats(Space& space) {
    for (auto& v : vectors_)
      visit_dtype(v.p.grad_type, [&](auto gtag) {
        using G = typename decltype(gtag)::type;
        space.parallel_for(v.sumsq.size(), device::chunk_stats_fn<G>{static_cast<const G*>(v.p.grad), v.p.n,
                                                                     vector_chunk, v.sumsq.data(), v.bad.data()});
      });
  }
  double* column_l1(std::size_t i) noexcept { return matrices_[i].l1.data(); }
  double* column_sumsq(std::size_t i) noexcept { return matrices_[i].sumsq.data(); }
  unsigned char* column_bad(std::size_t i) noexcept { return matrices_[i].bad.data(); }
  grad_summary summarize() {
    grad_summary r{true, 0.0};
    std::size_t at = 0;
    for (auto& s : matrices_) {
      for (std::size_t c = 0; c < s.p.cols; ++c) r.finite = r.finite && !s.bad[c];
      device::group_partials(s.sumsq.data(), s.p.cols, partials_.data() + at);
      at += groups(s.p.cols);
    }
    for (auto& v : vectors_) {
      for (std::size_t k = 0; k < v.sumsq.size(); ++k) r.finite = r.finite && !v.bad[k];
      device::group_partials(v.sumsq.data(), v.sumsq.size(), partials_.data() + at);
      at += groups(v.sumsq.size());
    }
    r.sumsq = device::canonical_total(partials_.data(), at);
    return r;
  }

  // Zen-auto's L1 masses of this step, per matrix: of the selected columns (slot order, which is
  // ascending) and of all columns, each summed in order in double. Called after the step's
  // selection; masses(i) reads them (here computed at once, where the scores are).
  void enqueue_masses(Space&) {
    masses_.resize(matrices_.size());
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const auto& s = matrices_[i];
      double sel = 0, all = 0;
      for (std::size_t k = 0; k < s.active; ++k) sel += s.l1[s.columns[s.cur][k]];
      for (std::size_t c = 0; c < s.p.cols; ++c) all += s.l1[c];
      masses_[i] = {sel, all};
    }
  }
  std::pair<double, double> masses(Space&, std::size_t i) const { return masses_[i]; }

  // This step's column scores of matrix i in host memory: fetch_scores() makes them readable
  // (a copy on a GPU space, nothing here), scores() points at them.
  void fetch_scores(Space&, score_kind) {}
  const double* scores(std::size_t i, score_kind kind) const noexcept {
    return kind == score_kind::l1 ? matrices_[i].l1.data() : matrices_[i].sumsq.data();
  }

  // AdamW of every vector (always) and of the selected columns of every matrix.
  void update(Space& space, float factor, const adamw_hyper& hyper) {
    for (auto& s : matrices_) {
      if (s.active == 0) continue;
      visit_dtype(s.p.param_type, [&](auto ptag) {
        visit_dtype(s.p.grad_type, [&](auto gtag) {
          using P = typename decltype(ptag)::type;
          using G = typename decltype(gtag)::type;
          const int b = s.cur;
          space.parallel_for(s.active, device::column_adamw_fn<P, G>{
                                           static_cast<P*>(s.p.param), static_cast<const G*>(s.p.grad),
                                           s.master_of(b), s.exp_avg[b].data(), s.exp_avg_sq[b].data(),
                                           s.counts[b].data(), s.columns[b].data(), s.p.rows, s.p.cols,
                                           s.p.layout, factor,
                                           group_hyper(hyper, s.p.lr_scale, s.p.weight_decay_scale)});
        });
      });
    }
    for (auto& v : vectors_) {
      visit_dtype(v.p.param_type, [&](auto ptag) {
        visit_dtype(v.p.grad_type, [&](auto gtag) {
          using P = typename decltype(ptag)::type;
          using G = typename decltype(gtag)::type;
          space.parallel_for(v.sumsq.size(), device::vector_adamw_fn<P, G>{
                                                 static_cast<P*>(v.p.param), static_cast<const G*>(v.p.grad),
                                                 v.master_ptr(), v.exp_avg.data(), v.exp_avg_sq.data(), v.p.n,
                                                 vector_chunk,
                                                 make_coeffs(group_hyper(hyper, v.p.lr_scale, v.p.weight_decay_scale),
                                                             v.count + 1u),
                                                 factor});
        });
      });
      ++v.count;
    }
  }

  // Bytes of device memory held: per matrix two slot sets of k columns (one when k = cols; fp32
  // master unless the param is fp32, moments, a count and an index each) and per-column
  // statistics (two doubles and a flag); per vector its moments, its fp32 master unless the
  // param is fp32, and per-chunk statistics.
  std::size_t records_bytes() const noexcept {
    return registry::records_bytes() + 8 * partials_.size() + sizeof(compaction_target) * targets_.capacity();
  }

  std::size_t bytes_allocated() const noexcept {
    std::size_t b = 0;
    for (const auto& s : matrices_) b += s.slot_bytes() + 8 * (s.l1.size() + s.sumsq.size()) + s.bad.size();
    for (const auto& v : vectors_) b += v.state_bytes() + 8 * v.sumsq.size() + v.bad.size();
    return b;
  }

 private:
  static std::size_t groups(std::size_t n) noexcept { return (n + device::column_lanes - 1) / device::column_lanes; }

  std::vector<std::pair<double, double>> masses_;  // Zen-auto, per matrix (selected, all)
  std::vector<compaction_target> targets_;          // per matrix (set_compaction)
  std::vector<double> partials_;  // host scratch of the total (8 bytes per 32 columns)
};

}  // namespace zenflow
