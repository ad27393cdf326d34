// zenflow::config: every knob of the optimizer, and validate(), which rejects out-of-range or
// inconsistent values with a message naming the key and the allowed range.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "adamw.hpp"

namespace zenflow {

// Thrown by config::validate(); a std::invalid_argument, so one catch handles all bad input.
struct config_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// An interval in applied steps, or "auto" (select_interval: one epoch; update_interval:
// the Zen-auto rule, see optimizer.hpp).
struct interval {
  std::uint32_t steps = 1;
  bool automatic = false;
  static constexpr interval every(std::uint32_t n) noexcept { return {n, false}; }
  static constexpr interval auto_() noexcept { return {0, true}; }
  friend constexpr bool operator==(const interval&, const interval&) = default;
};

enum class score_kind : std::uint8_t {
  l1 = 0,    // s_j = sum_i |g_ij|
  l2sq = 1,  // s_j = sum_i g_ij^2
};

struct config {
  // --- ZenFlow ----------------------------------------------------------------------------
  double topk_ratio = 0.1;                         // r: fraction of columns updated on the device
  interval select_interval = interval::every(64);  // S: applied steps between selections
  interval update_interval = interval::every(4);  // U: window length (host update period)
  std::uint32_t full_warm_up_rounds = 0;           // W: initial steps of plain host AdamW
  bool overlap_step = true;                        // host update in the background
  double auto_ratio = 0.99;                        // share of matrices for an "auto" boundary
  std::uint32_t steps_per_epoch = 0;               // S when select_interval is "auto"
  score_kind score = score_kind::l1;
  // --- the update -------------------------------------------------------------------------
  adamw_hyper adam{};
  double max_grad_norm = 0.0;  // global L2 clip of the unscaled gradient; 0 = off
  // --- resources --------------------------------------------------------------------------
  unsigned host_threads = 0;   // threads of the host arena; 0 = all cores

  // Throws config_error naming the first bad key.
  void validate() const {
    auto bad = [](const std::string& key, const std::string& rule, const std::string& got) {
      throw config_error("zenflow config: " + key + " " + rule + ", got " + got);
    };
    auto num = [](double x) {
      std::string s = std::to_string(x);
      return s;
    };
    if (!(topk_ratio >= 0.0 && topk_ratio <= 1.0)) bad("topk_ratio", "must be in [0, 1]", num(topk_ratio));
    if (!update_interval.automatic && update_interval.steps < 1)
      bad("update_interval", "must be >= 1 or \"auto\"", std::to_string(update_interval.steps));
    if (!select_interval.automatic && select_interval.steps < 1)
      bad("select_interval", "must be >= 1 or \"auto\"", std::to_string(select_interval.steps));
    if (select_interval.automatic && steps_per_epoch < 1)
      bad("steps_per_epoch", "must be >= 1 when select_interval is \"auto\"", std::to_string(steps_per_epoch));
    const std::uint32_t s = select_interval.automatic ? steps_per_epoch : select_interval.steps;
    if (!update_interval.automatic && s % update_interval.steps != 0)
      bad("select_interval", "must be a multiple of update_interval (" +
                                 std::to_string(update_interval.steps) + ")", std::to_string(s));
    if (!(auto_ratio > 0.0 && auto_ratio <= 1.0)) bad("auto_ratio", "must be in (0, 1]", num(auto_ratio));
    if (score != score_kind::l1 && score != score_kind::l2sq) bad("score", "must be l1 or l2sq", "?");
    if (!(std::isfinite(adam.lr) && adam.lr >= 0)) bad("lr", "must be finite and >= 0", num(adam.lr));
    if (!(adam.beta1 >= 0 && adam.beta1 < 1)) bad("beta1", "must be in [0, 1)", num(adam.beta1));
    if (!(adam.beta2 >= 0 && adam.beta2 < 1)) bad("beta2", "must be in [0, 1)", num(adam.beta2));
    if (!(std::isfinite(adam.eps) && adam.eps > 0)) bad("eps", "must be finite and > 0", num(adam.eps));
    if (!(std::isfinite(adam.weight_decay) && adam.weight_decay >= 0))
      bad("weight_decay", "must be finite and >= 0", num(adam.weight_decay));
    if (adam.mode != adam_mode::adamw && adam.mode != adam_mode::classic) bad("adam_mode", "must be adamw or classic", "?");
    if (!(std::isfinite(max_grad_norm) && max_grad_norm >= 0))
      bad("max_grad_norm", "must be finite and >= 0 (0 = no clipping)", num(max_grad_norm));
  }

  // The select interval in applied steps.
  std::uint32_t select_steps() const noexcept {
    return select_interval.automatic ? steps_per_epoch : select_interval.steps;
  }
};

}  // namespace zenflow
