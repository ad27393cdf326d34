// A slow, sequential, double-precision model of the optimizer's rules (README.md, "The
// optimizer"), written from that description alone: no
// library code, no shared helpers beyond the AdamW formula of reference.hpp. It keeps, per matrix
// column, the optimizer state (master, m, v, count) and the value the trainer sees ("visible"),
// which with overlap lags a host update until it is published at the next boundary or drain.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "reference.hpp"

namespace zf_ref {

struct zf_config {
  double topk_ratio = 0.1;
  std::uint64_t select_interval = 4;  // in applied steps (already resolved from "auto")
  std::uint64_t update_interval = 4;  // 0 = "auto"
  std::uint64_t warm_up = 0;
  bool overlap = true;
  double auto_ratio = 0.99;
  bool score_l2sq = false;
  bool reset_moments = false;  // a joining column starts with zero moments and count
  bool window_sum = false;     // a host update applies the window's sum, not its mean
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  bool classic = false;
  double max_grad_norm = 0;
  enum { topk, none, all } selector = topk;
};

struct zf_matrix {
  std::size_t rows, cols, k = 0;
  std::size_t param_bytes, grad_bytes;  // element sizes
  std::vector<double> master, m, v, acc, visible;  // [c * rows + i]
  std::vector<std::uint64_t> count;
  std::vector<bool> selected, pending;
  double A = 0, B = 0;  // Zen-auto sums of the current window
};

struct zf_vector {
  std::size_t n;
  std::vector<double> master, m, v;
  std::uint64_t count = 0;
};

class zenflow_model {
 public:
  zf_config cfg;
  std::vector<zf_matrix> mats;
  std::vector<zf_vector> vecs;
  std::uint64_t steps = 0, skipped = 0, applied = 0, selections = 0, host_updates = 0;
  std::uint64_t to_host = 0, to_device = 0;

  void add_matrix(std::size_t rows, std::size_t cols, const std::vector<double>& init, std::size_t pbytes,
                  std::size_t gbytes) {
    zf_matrix x;
    x.rows = rows;
    x.cols = cols;
    x.param_bytes = pbytes;
    x.grad_bytes = gbytes;
    x.master = init;
    x.visible = init;
    x.m.assign(rows * cols, 0);
    x.v.assign(rows * cols, 0);
    x.acc.assign(rows * cols, 0);
    x.count.assign(cols, 0);
    x.selected.assign(cols, false);
    x.pending.assign(cols, false);
    if (cfg.selector == zf_config::all) x.k = cols;
    else if (cfg.selector == zf_config::topk && cfg.topk_ratio > 0)
      x.k = std::max<std::size_t>(1, std::size_t(std::floor(cfg.topk_ratio * double(cols))));
    // every column selected and no warm-up (a host phase): on the device from the start
    if (x.k == cols && cfg.warm_up == 0) x.selected.assign(cols, true);
    mats.push_back(std::move(x));
  }
  void add_vector(const std::vector<double>& init) {
    zf_vector x;
    x.n = init.size();
    x.master = init;
    x.m.assign(x.n, 0);
    x.v.assign(x.n, 0);
    vecs.push_back(std::move(x));
  }

  // raw gradients as the trainer wrote them (decoded), [c * rows + i] for matrices.
  // Returns false when the step was skipped.
  bool step(const std::vector<std::vector<double>>& mg, const std::vector<std::vector<double>>& vg,
            double grad_scale) {
    ++steps;
    double sumsq = 0;
    for (const auto* set : {&mg, &vg})
      for (const auto& gr : *set)
        for (double x : gr) {
          if (!std::isfinite(x)) {
            ++skipped;
            return false;
          }
          sumsq += (x / grad_scale) * (x / grad_scale);
        }
    const std::uint64_t t = applied + 1;
    double coef = 1;
    if (cfg.max_grad_norm > 0) coef = std::min(1.0, cfg.max_grad_norm / (std::sqrt(sumsq) + 1e-6));
    // g^2 could overflow fp32 and freeze a column: skipped (a window's sum applied whole: its
    // gradients' bound is 2^63 / U, so that their sum is within 2^63)
    if (std::sqrt(sumsq) * coef > 0x1p63 / (cfg.window_sum ? double(cfg.update_interval) : 1.0)) {
      ++skipped;
      return false;
    }
    auto g_of = [&](double raw) { return raw / grad_scale * coef; };

    if (t <= cfg.warm_up) {  // plain ZeRO-Offload: every column on the host, synchronously
      for (auto& x : mats) {
        const std::size_t mi = std::size_t(&x - mats.data());
        for (std::size_t c = 0; c < x.cols; ++c) adam_column(x, c, [&](std::size_t e) { return g_of(mg[mi][e]); });
        x.visible = x.master;
        to_host += x.rows * x.cols * x.grad_bytes;
        to_device += x.rows * x.cols * x.param_bytes;
      }
      if (!mats.empty()) ++host_updates;  // a pass that updates columns
      update_vectors(vg, g_of);
      applied = t;
      return true;
    }

    const bool any_k = std::any_of(mats.begin(), mats.end(), [](const zf_matrix& x) { return x.k > 0; });
    if (window_steps_ == 0 && any_k && (!selected_once_ || t - last_selection_ >= cfg.select_interval)) {
      publish();  // drain
      for (auto& x : mats) {
        if (x.k == 0) continue;
        const std::size_t mi = std::size_t(&x - mats.data());
        std::vector<double> score(x.cols, 0);
        for (std::size_t c = 0; c < x.cols; ++c)
          for (std::size_t i = 0; i < x.rows; ++i) {
            const double g = g_of(mg[mi][c * x.rows + i]);
            score[c] += cfg.score_l2sq ? g * g : std::fabs(g);
          }
        std::vector<std::size_t> order(x.cols);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return score[a] > score[b]; });
        std::vector<bool> next(x.cols, false);
        for (std::size_t j = 0; j < x.k; ++j) next[order[j]] = true;
        for (std::size_t c = 0; c < x.cols; ++c) {
          if (cfg.reset_moments && !x.selected[c] && next[c]) {
            for (std::size_t i = 0; i < x.rows; ++i) x.m[c * x.rows + i] = x.v[c * x.rows + i] = 0;
            x.count[c] = 0;
          }
          if (x.selected[c] && !next[c]) to_host += 12 * x.rows + 4;
          // (an fp32 param is its own master on the device: the master does not cross)
          if (!x.selected[c] && next[c]) to_device += (x.param_bytes == 4 ? 8 : 12) * x.rows + 4;
        }
        x.selected = next;
      }
      ++selections;
      last_selection_ = t;
      selected_once_ = true;
    }

    // device: selected columns and vectors, now
    for (auto& x : mats) {
      const std::size_t mi = std::size_t(&x - mats.data());
      for (std::size_t c = 0; c < x.cols; ++c) {
        if (x.selected[c]) {
          adam_column(x, c, [&](std::size_t e) { return g_of(mg[mi][e]); });
          for (std::size_t i = 0; i < x.rows; ++i) x.visible[c * x.rows + i] = x.master[c * x.rows + i];
        } else {  // offload
          for (std::size_t i = 0; i < x.rows; ++i) x.acc[c * x.rows + i] += g_of(mg[mi][c * x.rows + i]);
          to_host += x.rows * x.grad_bytes;
        }
      }
    }
    update_vectors(vg, g_of);
    ++window_steps_;

    bool boundary;
    if (cfg.update_interval == 0) {
      std::size_t eligible = 0, needing = 0;
      for (auto& x : mats) {
        if (x.k == 0 || x.k == x.cols) continue;
        const std::size_t mi = std::size_t(&x - mats.data());
        double sel = 0, uns = 0;
        for (std::size_t e = 0; e < x.rows * x.cols; ++e)
          (x.selected[e / x.rows] ? sel : uns) += std::fabs(g_of(mg[mi][e]));
        x.A += sel / double(x.k);
        x.B += uns / double(x.cols - x.k);
        ++eligible;
        if (x.B >= x.A / double(window_steps_)) ++needing;
      }
      boundary = eligible == 0 || double(needing) / double(eligible) >= cfg.auto_ratio;  // the share, at least
    } else {
      boundary = (t - cfg.warm_up) % cfg.update_interval == 0;
    }
    if (boundary) {
      if (cfg.overlap) publish();  // the previous window's update lands first
      for (auto& x : mats) {
        for (std::size_t c = 0; c < x.cols; ++c) {
          if (x.selected[c]) continue;
          const double div = cfg.window_sum ? 1.0 : double(window_steps_);
          adam_column(x, c, [&](std::size_t e) { return x.acc[e] / div; });
          for (std::size_t i = 0; i < x.rows; ++i) x.acc[c * x.rows + i] = 0;
          x.pending[c] = true;
        }
        x.A = x.B = 0;
      }
      // counted when some column is updated on the host
      if (std::any_of(mats.begin(), mats.end(), [](const zf_matrix& x) {
            return std::any_of(x.selected.begin(), x.selected.end(), [](auto s) { return !s; });
          }))
        ++host_updates;
      if (!cfg.overlap) publish();
      window_steps_ = 0;
    }
    applied = t;
    return true;
  }

  // Makes every host-updated column visible (a drain, a boundary with overlap, synchronize()).
  void publish() {
    for (auto& x : mats)
      for (std::size_t c = 0; c < x.cols; ++c)
        if (x.pending[c]) {
          for (std::size_t i = 0; i < x.rows; ++i) x.visible[c * x.rows + i] = x.master[c * x.rows + i];
          to_device += x.rows * x.param_bytes;
          x.pending[c] = false;
        }
  }

 private:
  template <class G>
  void adam_column(zf_matrix& x, std::size_t c, G grad) {
    const std::uint64_t n = ++x.count[c];
    for (std::size_t i = 0; i < x.rows; ++i) {
      const std::size_t e = c * x.rows + i;
      const adam_state s = adamw({x.master[e], x.m[e], x.v[e]}, grad(e), cfg.lr, cfg.beta1, cfg.beta2, cfg.eps,
                                 cfg.weight_decay, !cfg.classic, n);
      x.master[e] = s.p;
      x.m[e] = s.m;
      x.v[e] = s.v;
    }
  }
  template <class G>
  void update_vectors(const std::vector<std::vector<double>>& vg, G g_of) {
    for (auto& x : vecs) {
      const std::size_t vi = std::size_t(&x - vecs.data());
      const std::uint64_t n = ++x.count;
      for (std::size_t i = 0; i < x.n; ++i) {
        const adam_state s = adamw({x.master[i], x.m[i], x.v[i]}, g_of(vg[vi][i]), cfg.lr, cfg.beta1, cfg.beta2,
                                   cfg.eps, cfg.weight_decay, !cfg.classic, n);
        x.master[i] = s.p;
        x.m[i] = s.m;
        x.v[i] = s.v;
      }
    }
  }

  std::uint64_t window_steps_ = 0, last_selection_ = 0;
  bool selected_once_ = false;
};

}  // namespace zf_ref
