// Test harness for the optimizer: trainer-side buffers in any dtype and layout, a gradient
// generator, and a step-by-step comparison with the reference model of the optimizer's rules.
#pragma once

#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include <zenflow/zenflow.hpp>

#include "reference/reference.hpp"
#include "reference/zenflow_reference.hpp"
#include "support.hpp"

namespace zf_test {
using namespace zenflow;


inline float load_as_float(const std::vector<unsigned char>& buf, dtype t, std::size_t i) {
  switch (t) {
    case dtype::f32: { float x; std::memcpy(&x, buf.data() + 4 * i, 4); return x; }
    case dtype::bf16: { std::uint16_t h; std::memcpy(&h, buf.data() + 2 * i, 2); return float(zf_ref::bf16_value(h)); }
    case dtype::f16: { std::uint16_t h; std::memcpy(&h, buf.data() + 2 * i, 2); return float(zf_ref::f16_value(h)); }
  }
  return 0;
}
// Stores x (exactly representable, or rounded by the reference rounding) in dtype t.
inline void store_float(std::vector<unsigned char>& buf, dtype t, std::size_t i, float x) {
  switch (t) {
    case dtype::f32: std::memcpy(buf.data() + 4 * i, &x, 4); return;
    case dtype::bf16: { const std::uint16_t h = std::isfinite(x) ? zf_ref::bf16_round(x) : std::uint16_t(zf_ref::bits(x) >> 16); std::memcpy(buf.data() + 2 * i, &h, 2); return; }
    case dtype::f16: {
      std::uint16_t h = std::isnan(x) ? 0x7e00 : std::isinf(x) ? (x > 0 ? 0x7c00 : 0xfc00) : zf_ref::f16_round(x);
      std::memcpy(buf.data() + 2 * i, &h, 2);
      return;
    }
  }
}
inline double half_ulp(dtype t, double x) {  // half the spacing of dtype t at |x|: rounding error of a store
  const int mant = t == dtype::f32 ? 23 : t == dtype::bf16 ? 7 : 10;
  int e;
  std::frexp(std::max(std::fabs(x), 1e-30), &e);
  return std::ldexp(1.0, e - 1 - mant - 1) + (t == dtype::f16 ? std::ldexp(1.0, -25) : 0.0);
}

struct matrix_shape {
  std::size_t rows, cols;
  dtype pt, gt;
  matrix_layout layout;
};
struct vector_shape {
  std::size_t n;
  dtype pt, gt;
};

struct scenario {
  config cfg;
  zf_ref::zf_config ref;
  std::vector<matrix_shape> mats;
  std::vector<vector_shape> vecs;
  int steps = 30;
  double nan_rate = 0;
  bool vary_scale = false;
  // set_lr before every step, to lr x (1 + sin(0.9 step) / 2): a schedule's lr changing
  // mid-window (the reference applies a window's host update with the lr of its boundary step,
  // as the optimizer does: README, "The optimizer")
  bool vary_lr = false;
  std::uint64_t seed = 1;
};

// Trainer-side buffers plus the gradient generator. Column scores are made well separated
// (|g| = s_c exactly, distinct s_c per column) so the top-k set is the same in float and double
// and the test compares semantics, not tie-breaking luck.
struct trainer {
  const scenario& sc;
  zf_test::rng r;
  std::vector<std::vector<unsigned char>> mp, mg, vp, vgb;
  trainer(const scenario& s) : sc(s), r(s.seed) {
    for (const auto& m : sc.mats) {
      mp.emplace_back(m.rows * m.cols * size_of(m.pt));
      mg.emplace_back(m.rows * m.cols * size_of(m.gt));
      for (std::size_t e = 0; e < m.rows * m.cols; ++e) store_float(mp.back(), m.pt, e, float(r.uniform(-1, 1)));
    }
    for (const auto& v : sc.vecs) {
      vp.emplace_back(v.n * size_of(v.pt));
      vgb.emplace_back(v.n * size_of(v.gt));
      for (std::size_t e = 0; e < v.n; ++e) store_float(vp.back(), v.pt, e, float(r.uniform(-1, 1)));
    }
  }
  std::size_t at(const matrix_shape& m, std::size_t i, std::size_t c) const {
    return element_offset(m.layout, m.rows, m.cols, i, c);
  }
  // Initial values in the reference's [c * rows + i] order.
  std::vector<double> matrix_values(std::size_t mi) const {
    const auto& m = sc.mats[mi];
    std::vector<double> out(m.rows * m.cols);
    for (std::size_t c = 0; c < m.cols; ++c)
      for (std::size_t i = 0; i < m.rows; ++i) out[c * m.rows + i] = load_as_float(mp[mi], m.pt, at(m, i, c));
    return out;
  }
  std::vector<double> vector_values(std::size_t vi) const {
    std::vector<double> out(sc.vecs[vi].n);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = load_as_float(vp[vi], sc.vecs[vi].pt, i);
    return out;
  }
  // Writes the next gradients; returns them decoded for the reference, and the loss scale.
  double next(std::vector<std::vector<double>>& gm, std::vector<std::vector<double>>& gv) {
    const double scale = sc.vary_scale ? std::ldexp(1.0, int(r.below(3)) * 4 - 2) : 1.0;
    gm.assign(sc.mats.size(), {});
    gv.assign(sc.vecs.size(), {});
    for (std::size_t mi = 0; mi < sc.mats.size(); ++mi) {
      const auto& m = sc.mats[mi];
      std::vector<std::size_t> perm(m.cols);
      std::iota(perm.begin(), perm.end(), 0);
      for (std::size_t c = m.cols; c > 1; --c) std::swap(perm[c - 1], perm[r.below(c)]);
      gm[mi].resize(m.rows * m.cols);
      // A continuous factor per step and matrix keeps sums of different steps from tying
      // exactly (the Zen-auto rule compares such sums); within a step two columns' magnitudes
      // differ by a factor of at least 64/63 (1.6%: (1 + q/32) steps by 1/32 within a binade,
      // and 2 against 63/32 across one), more than two bf16 roundings can close (2 · 2^-8 =
      // 0.78%), so the top-k order is unambiguous in any dtype.
      const double jitter = 1.0 + r.uniform(0, 0.5);
      for (std::size_t c = 0; c < m.cols; ++c) {
        const std::size_t q = perm[c];
        const double s = (1.0 + double(q % 32) / 32.0) * std::ldexp(1.0, int(q / 32) - 4) * scale * jitter;
        for (std::size_t i = 0; i < m.rows; ++i) {
          const float g = float(r.below(2) ? s : -s);
          store_float(mg[mi], m.gt, at(m, i, c), g);
          gm[mi][c * m.rows + i] = load_as_float(mg[mi], m.gt, at(m, i, c));
        }
      }
    }
    for (std::size_t vi = 0; vi < sc.vecs.size(); ++vi) {
      const auto& v = sc.vecs[vi];
      gv[vi].resize(v.n);
      for (std::size_t i = 0; i < v.n; ++i) {
        store_float(vgb[vi], v.gt, i, float(r.uniform(-0.5, 0.5) * scale));
        gv[vi][i] = load_as_float(vgb[vi], v.gt, i);
      }
    }
    if (sc.nan_rate > 0 && r.uniform(0, 1) < sc.nan_rate) {  // poison one gradient value
      const float bad = r.below(2) ? NAN : -INFINITY;
      if (!sc.vecs.empty() && r.below(2)) {
        const std::size_t vi = r.below(sc.vecs.size()), i = r.below(sc.vecs[vi].n);
        store_float(vgb[vi], sc.vecs[vi].gt, i, bad);
        gv[vi][i] = bad;
      } else {
        const std::size_t mi = r.below(sc.mats.size());
        const auto& m = sc.mats[mi];
        const std::size_t i = r.below(m.rows), c = r.below(m.cols);
        store_float(mg[mi], m.gt, at(m, i, c), bad);
        gm[mi][c * m.rows + i] = bad;
      }
    }
    return scale;
  }
};

// The master tolerance: float vs double over tens of steps. Each step rounds the master once
// (relative 2^-24) and the update (at most about lr in size) with relative error ~1e-6; over
// <= 60 steps that stays below 1e-5 (|p| + 1) with a wide margin. A missing, repeated or stale
// update usually moves a value by more (an Adam step is about lr >= 1e-3 where |m^| ~ sqrt(v^)),
// but not always (where |m^| << sqrt(v^) it is far smaller): the tolerance is what float vs
// double allows, not a detector of staleness. Staleness is caught exactly instead: the selected
// columns, counts and stats are compared exactly with the reference model's, and each visible
// param bit for bit with the optimizer's own master of the step the reference shows (run_scenario).
// (The visible params' tolerance against the reference adds half a unit of their dtype.)
inline double master_tol(double ref) { return 1e-5 * (1.0 + std::fabs(ref)); }

// Where the optimizer's params and grads live: for the host space, the trainer's own buffers.
// A GPU test supplies device copies (device(buf) gives the copy of a trainer buffer, push copies
// the gradients there before a step, pull brings the params back before they are checked).
struct host_buffers {
  void* device(std::vector<unsigned char>& buf) { return buf.data(); }
  void push(trainer&) {}
  void pull(trainer&) {}
};

template <class Opt, class Buffers = host_buffers>
inline void run_scenario(const scenario& sc, Opt& opt, std::vector<std::vector<std::vector<float>>>* trace = nullptr,
                         Buffers&& buffers = Buffers{}) {
  trainer tr(sc);
  zf_ref::zenflow_model model;
  model.cfg = sc.ref;
  for (std::size_t mi = 0; mi < sc.mats.size(); ++mi) {
    const auto& m = sc.mats[mi];
    opt.add_matrix({buffers.device(tr.mp[mi]), buffers.device(tr.mg[mi]), m.rows, m.cols, m.pt, m.gt, m.layout});
    model.add_matrix(m.rows, m.cols, tr.matrix_values(mi), size_of(m.pt), size_of(m.gt));
  }
  for (std::size_t vi = 0; vi < sc.vecs.size(); ++vi) {
    const auto& v = sc.vecs[vi];
    opt.add_vector({buffers.device(tr.vp[vi]), buffers.device(tr.vgb[vi]), v.n, v.pt, v.gt});
    model.add_vector(tr.vector_values(vi));
  }
  opt.initialize();
  // The masters, the reference's and the optimizer's, after each step so far (the first:
  // initialize's). A visible param is checked bit for bit against the optimizer's own master of
  // the step whose reference master the reference shows (the last step's, or an older one while
  // a host update is not yet visible), rounded to the param dtype: a value published a host
  // update early or late differs there, where the tolerance against the reference (half a unit
  // of a 16-bit dtype) could let it pass.
  std::vector<std::vector<std::vector<double>>> ref_masters(sc.mats.size());
  std::vector<std::vector<std::vector<float>>> opt_masters(sc.mats.size());
  for (std::size_t mi = 0; mi < sc.mats.size(); ++mi) {
    ref_masters[mi].push_back(model.mats[mi].master);
    opt_masters[mi].emplace_back(sc.mats[mi].rows * sc.mats[mi].cols);
    opt.copy_master(matrix_id{mi}, opt_masters[mi].back().data());
  }
  // the bytes of x rounded to dtype t (the rounding the optimizer must use: to nearest even)
  auto rounded = [](dtype t, float x) {
    std::vector<unsigned char> b(4);
    store_float(b, t, 0, x);
    b.resize(size_of(t));
    return b;
  };
  auto bytes_at = [](const std::vector<unsigned char>& buf, dtype t, std::size_t i) {
    const std::size_t n = size_of(t);
    return std::vector<unsigned char>(buf.begin() + std::ptrdiff_t(i * n), buf.begin() + std::ptrdiff_t((i + 1) * n));
  };
  std::vector<std::vector<double>> gm, gv;
  for (int step = 0; step < sc.steps; ++step) {
    CAPTURE(step);
    if (sc.vary_lr) {
      const float lr = float(double(sc.cfg.adam.lr) * (1.0 + 0.5 * std::sin(0.9 * step)));
      opt.set_lr(lr);
      model.cfg.lr = lr;  // (the float the optimizer holds, exactly)
    }
    const double scale = tr.next(gm, gv);
    buffers.push(tr);
    const step_info info = opt.step(float(scale));
    buffers.pull(tr);
    const bool applied = model.step(gm, gv, scale);
    REQUIRE(info.skipped == !applied);
    if (trace) trace->emplace_back();
    for (std::size_t mi = 0; mi < sc.mats.size(); ++mi) {
      CAPTURE(mi);
      const auto& m = sc.mats[mi];
      const auto& x = model.mats[mi];
      std::vector<std::uint32_t> want;
      for (std::size_t c = 0; c < m.cols; ++c)
        if (x.selected[c]) want.push_back(std::uint32_t(c));
      REQUIRE(opt.selected_columns(matrix_id{mi}) == want);
      const auto counts = opt.column_counts(matrix_id{mi});
      for (std::size_t c = 0; c < m.cols; ++c) REQUIRE(counts[c] == x.count[c]);
      std::vector<float> master(m.rows * m.cols), visible(m.rows * m.cols);
      opt.copy_master(matrix_id{mi}, master.data());
      ref_masters[mi].push_back(x.master);
      opt_masters[mi].push_back(master);
      for (std::size_t e = 0; e < master.size(); ++e) {
        CAPTURE(e);
        REQUIRE(std::fabs(master[e] - x.master[e]) <= master_tol(x.master[e]));
        const std::size_t c = e / m.rows, i = e % m.rows;
        const float seen = load_as_float(tr.mp[mi], m.pt, tr.at(m, i, c));
        visible[e] = seen;
        // what the trainer sees: the reference's visible value, rounded to the param dtype
        REQUIRE(std::fabs(seen - x.visible[e]) <= master_tol(x.visible[e]) + half_ulp(m.pt, x.visible[e]));
        // and exactly the optimizer's master of the step the reference shows, rounded
        std::size_t t = ref_masters[mi].size();
        while (t > 0 && ref_masters[mi][t - 1][e] != x.visible[e]) --t;
        REQUIRE(t > 0);  // (the reference's visible value is always one of its masters)
        CAPTURE(ref_masters[mi].size() - t);  // (steps behind)
        REQUIRE(bytes_at(tr.mp[mi], m.pt, tr.at(m, i, c)) == rounded(m.pt, opt_masters[mi][t - 1][e]));
      }
      if (trace) {
        trace->back().push_back(master);
        trace->back().push_back(visible);
      }
    }
    for (std::size_t vi = 0; vi < sc.vecs.size(); ++vi) {
      const auto& x = model.vecs[vi];
      std::vector<float> master(x.n);
      opt.copy_vector_master(vector_id{vi}, master.data());
      for (std::size_t i = 0; i < x.n; ++i) {
        REQUIRE(std::fabs(master[i] - x.master[i]) <= master_tol(x.master[i]));
        const float seen = load_as_float(tr.vp[vi], sc.vecs[vi].pt, i);
        REQUIRE(std::fabs(seen - x.master[i]) <= master_tol(x.master[i]) + half_ulp(sc.vecs[vi].pt, x.master[i]));
        // (a vector is updated on the device every step: its param is its master, rounded)
        REQUIRE(bytes_at(tr.vp[vi], sc.vecs[vi].pt, i) == rounded(sc.vecs[vi].pt, master[i]));
      }
    }
    const optimizer_stats st = opt.stats();
    REQUIRE(st.steps == model.steps);
    REQUIRE(st.skipped_steps == model.skipped);
    REQUIRE(st.selections == model.selections);
    REQUIRE(st.host_updates == model.host_updates);
    REQUIRE(st.bytes_to_host == model.to_host);
    REQUIRE(st.bytes_to_device == model.to_device);
  }
}

inline scenario random_scenario(std::uint64_t seed) {
  zf_test::rng r(seed);
  scenario sc;
  sc.seed = seed * 7919 + 1;
  const dtype types[] = {dtype::f32, dtype::bf16, dtype::f16};
  const std::size_t nm = 1 + r.below(3);
  for (std::size_t i = 0; i < nm; ++i)
    sc.mats.push_back({1 + r.below(24), 1 + r.below(90), types[r.below(3)], types[r.below(3)],
                       r.below(2) ? matrix_layout::row_major : matrix_layout::column_contiguous});
  const std::size_t nv = r.below(3);
  for (std::size_t i = 0; i < nv; ++i) sc.vecs.push_back({1 + r.below(40), types[r.below(3)], types[r.below(3)]});
  const double ratios[] = {0.0, 0.05, 0.1, 0.3, 1.0};
  const double ratio = ratios[r.below(5)];
  const std::uint32_t u = std::uint32_t(r.below(5));  // 0 = auto
  // Zen-auto compares sums of gradient magnitudes over steps: with a bf16/fp16 gradient the
  // 8-11 bit grid makes exact ties (decided differently in float and double) likely, so those
  // scenarios use fp32 gradients; other scenarios cover the 16-bit gradient paths.
  if (u == 0)
    for (auto& m : sc.mats) m.gt = dtype::f32;
  config& c = sc.cfg;
  c.topk_ratio = ratio;
  c.update_interval = u ? interval::every(u) : interval::auto_();
  if (r.below(4) == 0) {
    c.steps_per_epoch = std::uint32_t((u ? u : 1) * (1 + r.below(4)));
    c.select_interval = interval::auto_();
  } else {
    c.select_interval = interval::every(std::uint32_t((u ? u : 1) * (1 + r.below(3))));
  }
  c.full_warm_up_rounds = std::uint32_t(r.below(3) == 0 ? r.below(4) : 0);
  c.overlap_step = r.below(3) != 0;
  c.auto_ratio = r.below(2) ? 0.99 : 0.5;
  c.score = r.below(2) ? score_kind::l1 : score_kind::l2sq;
  c.adam.lr = float(std::exp2(r.uniform(-10, -7)));
  // eps bounds Adam's sensitivity to its gradient: |d update / d g| <= lr / eps. A window mean
  // that cancels to exactly 0 in double keeps a float residue of ~1e-9; with eps = 1e-8 Adam
  // would blow that up to a whole lr, with eps >= 1e-4 it stays below 1e-7, far inside the
  // tolerance. Gradients are ~2^-4..2^-1, well above eps, so updates are still normalised.
  c.adam.eps = r.below(2) ? 1e-4f : 1e-3f;
  c.adam.weight_decay = r.below(2) ? 0.0f : 0.05f;
  c.adam.mode = r.below(3) == 0 ? adam_mode::classic : adam_mode::adamw;
  c.max_grad_norm = r.below(2) ? 0.0 : std::exp2(r.uniform(-2, 4));
  c.host_threads = unsigned(1 + r.below(2));
  sc.steps = 25 + int(r.below(20));
  sc.nan_rate = r.below(2) ? 0.0 : 0.15;
  sc.vary_scale = r.below(2) != 0;
  c.reselect_moments = r.below(3) == 0 ? reselect_policy::reset : reselect_policy::keep;
  // (drawn last; the sum needs a fixed U)
  c.host_gradient = r.below(4) == 0 && u != 0 ? window_gradient::sum : window_gradient::mean;
  sc.vary_lr = seed % 2 == 0;  // (no draw: the scenarios above stay the seeds' own)

  zf_ref::zf_config& f = sc.ref;
  f.topk_ratio = ratio;
  f.update_interval = u;
  f.select_interval = c.select_steps();
  f.warm_up = c.full_warm_up_rounds;
  f.overlap = c.overlap_step;
  f.auto_ratio = c.auto_ratio;
  f.score_l2sq = c.score == score_kind::l2sq;
  f.reset_moments = c.reselect_moments == reselect_policy::reset;
  f.window_sum = c.host_gradient == window_gradient::sum;
  f.lr = c.adam.lr;
  f.beta1 = c.adam.beta1;
  f.beta2 = c.adam.beta2;
  f.eps = c.adam.eps;
  f.weight_decay = c.adam.weight_decay;
  f.classic = c.adam.mode == adam_mode::classic;
  f.max_grad_norm = c.max_grad_norm;
  return sc;
}


// bounded_async whose background jobs start late — a host update by HostMs, a gradient offload
// by OffloadMs milliseconds —, so that they are still running when a step() that does not wait
// for them returns, and meet whatever the trainer does meanwhile.
template <int HostMs, int OffloadMs>
struct late_lanes : bounded_async {
  template <class Job>
  void launch(Job&& job) {
    bounded_async::launch([job = std::forward<Job>(job)]() mutable {
      std::this_thread::sleep_for(std::chrono::milliseconds(HostMs));
      job();
    });
  }
  template <class Job>
  void launch_offload(Job&& job) {
    bounded_async::launch_offload([job = std::forward<Job>(job)]() mutable {
      std::this_thread::sleep_for(std::chrono::milliseconds(OffloadMs));
      job();
    });
  }
};

}  // namespace zf_test
