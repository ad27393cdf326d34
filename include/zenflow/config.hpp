// zenflow::config: every knob of the optimizer, and validate(), which rejects out-of-range or
// inconsistent values with a message naming the key and the allowed range.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <cctype>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#  include <sched.h>
#endif

#include "adamw.hpp"
#include "detail/format.hpp"
#include "detail/json.hpp"
#include "detail/registration.hpp"

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

// What a column joining the selection brings to the device: its fp32 master always; its Adam
// moments and count kept (lossless, zenflow's default) or reset to zero (an ablation knob; the
// original implementation instead zeroes every selected column's moments at a reselection and
// keeps its step count — README, "Semantics").
enum class reselect_policy : std::uint8_t {
  keep = 0,
  reset = 1,
};

// The gradient a host update applies to an unselected column: the mean of the window's
// gradients (zenflow's default, and the original implementation's with a fixed interval) or
// their sum (what the original's "auto" interval ends up applying: an ablation knob).
enum class window_gradient : std::uint8_t {
  mean = 0,
  sum = 1,
};

// Data parallel (a multi-process Communicator): what step() makes of the ranks' gradients, their
// mean (the gradient of the mean loss over the global batch) or their sum.
enum class reduce_op : std::uint8_t {
  mean = 0,
  sum = 1,
};

enum class score_kind : std::uint8_t {
  l1 = 0,    // s_j = sum_i |g_ij|
  l2sq = 1,  // s_j = sum_i g_ij^2
};

// A parameter group with a name, so that a config file can define it and the trainer's code
// refer to it: opt.add_vector(zenflow::vector(b, db, n).group(cfg.group("no_decay"))).
struct named_param_group {
  std::string name;
  param_group scales;
  friend bool operator==(const named_param_group&, const named_param_group&) = default;
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
  reselect_policy reselect_moments = reselect_policy::keep;
  window_gradient host_gradient = window_gradient::mean;
  reduce_op gradient_reduction = reduce_op::mean;  // data parallel only
  // --- the update -------------------------------------------------------------------------
  adamw_hyper adam{};
  double max_grad_norm = 0.0;  // global L2 clip of the unscaled gradient; 0 = off
  // --- resources --------------------------------------------------------------------------
  unsigned host_threads = 0;   // threads of the host arena; 0 = all cores
  // --- named parameter groups (a tensor's scales belong to its registration; these only name
  // them: not part of a checkpoint's config) -----------------------------------------------
  std::vector<named_param_group> param_groups;

  // The scales of the group called `name`; config_error if there is none.
  param_group group(std::string_view name) const {
    std::string known;
    for (const auto& g : param_groups) {
      if (g.name == name) return g.scales;
      known += (known.empty() ? "" : ", ") + g.name;
    }
    throw config_error("zenflow config: no parameter group \"" + std::string(name) + "\" (defined: " +
                       (known.empty() ? std::string("none") : known) + ")");
  }

  // Field by field (numbers compare as values: a NaN field makes configs unequal).
  friend bool operator==(const config&, const config&) = default;

  // Throws config_error naming the first bad key.
  void validate() const {
    validate_as([](const std::string& key) { return key; }, [](const std::string&) { return std::string(); });
  }
  // validate() with each key shown as name(key) and followed by note(key): a reader of another
  // format names its own keys, and says where a value was rounded on the way in.
  template <class Name, class Note>
  void validate_as(Name name, Note note) const {
    auto bad = [&](const std::string& key, const std::string& rule, const std::string& got) {
      throw config_error("zenflow config: " + name(key) + " " + rule + ", got " + got + note(key));
    };
    auto num = [](auto x) { return detail::exact(x); };
    if (!(topk_ratio >= 0.0 && topk_ratio <= 1.0)) bad("topk_ratio", "must be in [0, 1]", num(topk_ratio));
    if (!update_interval.automatic && update_interval.steps < 1)
      bad("update_interval", "must be >= 1 or \"auto\"", std::to_string(update_interval.steps));
    if (!select_interval.automatic && select_interval.steps < 1)
      bad("select_interval", "must be >= 1 or \"auto\"", std::to_string(select_interval.steps));
    if (select_interval.automatic && steps_per_epoch < 1)
      bad("steps_per_epoch", "must be >= 1 when select_interval is \"auto\"", std::to_string(steps_per_epoch));
    const std::uint32_t s = select_interval.automatic ? steps_per_epoch : select_interval.steps;
    if (!update_interval.automatic && s % update_interval.steps != 0) {
      const std::string u = std::to_string(update_interval.steps);
      if (select_interval.automatic)  // (the interval is the epoch: its length is what to change)
        bad("steps_per_epoch", "must be a multiple of update_interval (" + u + ") when select_interval is \"auto\"",
            std::to_string(s));
      bad("select_interval", "must be a multiple of update_interval (" + u + ")", std::to_string(s));
    }
    // (0: every step a boundary, as in DeepSpeed, whose range this is)
    if (!(auto_ratio >= 0.0 && auto_ratio <= 1.0)) bad("auto_ratio", "must be in [0, 1]", num(auto_ratio));
    if (score != score_kind::l1 && score != score_kind::l2sq) bad("score", "must be l1 or l2sq", "?");
    if (reselect_moments != reselect_policy::keep && reselect_moments != reselect_policy::reset)
      bad("reselect_moments", "must be keep or reset", "?");
    if (host_gradient != window_gradient::mean && host_gradient != window_gradient::sum)
      bad("host_gradient", "must be mean or sum", "?");
    if (gradient_reduction != reduce_op::mean && gradient_reduction != reduce_op::sum)
      bad("gradient_reduction", "must be mean or sum", "?");
    // a sum of U gradients must stay finite when squared: the skip bound becomes 2^63 / U, which
    // needs a known U
    if (host_gradient == window_gradient::sum && update_interval.automatic)
      bad("host_gradient", "= sum needs an integer update_interval (not \"auto\")", "sum");
    if (!(std::isfinite(adam.lr) && adam.lr >= 0)) bad("lr", "must be finite and >= 0", num(adam.lr));
    if (!(adam.beta1 >= 0 && adam.beta1 < 1)) bad("beta1", "must be in [0, 1)", num(adam.beta1));
    if (!(adam.beta2 >= 0 && adam.beta2 < 1)) bad("beta2", "must be in [0, 1)", num(adam.beta2));
    if (!(std::isfinite(adam.eps) && adam.eps > 0)) bad("eps", "must be finite and > 0", num(adam.eps));
    if (!(std::isfinite(adam.weight_decay) && adam.weight_decay >= 0))
      bad("weight_decay", "must be finite and >= 0", num(adam.weight_decay));
    if (adam.mode != adam_mode::adamw && adam.mode != adam_mode::classic) bad("adam_mode", "must be adamw or classic", "?");
    if (!(std::isfinite(max_grad_norm) && max_grad_norm >= 0))
      bad("max_grad_norm", "must be finite and >= 0 (0 = no clipping)", num(max_grad_norm));
    // Magnitudes no run means: an AdamW step moves a weight by about lr; decoupled decay
    // multiplies it by 1 - lr * weight_decay, which must not go below zero.
    if (adam.lr > 1) bad("lr", "must be at most 1", num(adam.lr));
    if (adam.weight_decay > 10) bad("weight_decay", "must be at most 10", num(adam.weight_decay));
    if (double(adam.lr) * double(adam.weight_decay) > 1)
      bad("weight_decay", "times lr (" + num(adam.lr) + ") must be at most 1", num(adam.weight_decay));
    // named groups: distinct non-empty names, scales within the same bounds as a tensor's
    for (std::size_t i = 0; i < param_groups.size(); ++i) {
      const named_param_group& g = param_groups[i];
      if (g.name.empty()) bad("param_groups", "must have non-empty names", "\"\" (group " + std::to_string(i) + ")");
      // (to_json writes the names as they are, and JSON takes only UTF-8)
      if (!detail::json::is_utf8(g.name))
        bad("param_groups", "must have names in UTF-8", "a name that is not (group " + std::to_string(i) + ")");
      for (std::size_t j = 0; j < i; ++j)
        if (param_groups[j].name == g.name) {
          std::string shown;  // (quoted, any control character escaped)
          detail::json::write_string(shown, g.name);
          bad("param_groups", "must have distinct names", shown + " twice");
        }
      if (!detail::group_ok(adam, g.scales.lr_scale, g.scales.weight_decay_scale)) {
        try {
          detail::check_group("param_groups." + g.name, adam, g.scales.lr_scale, g.scales.weight_decay_scale);
        } catch (const std::invalid_argument& e) {
          const std::string what = e.what();  // "zenflow: param_groups.x: ..."
          throw config_error("zenflow config: " + name("param_groups") + what.substr(what.find('.')) + note("param_groups"));
        }
      }
    }
    if (host_threads > 65536) bad("host_threads", "must be at most 65536 (0 = all cores)", std::to_string(host_threads));
  }

  // The select interval in applied steps.
  std::uint32_t select_steps() const noexcept {
    return select_interval.automatic ? steps_per_epoch : select_interval.steps;
  }
};


// ---------------------------------------------------------------------------------------------
// JSON configuration. Two entry points:
//  - config_from_json(text, base): the "zenflow" block itself, e.g.
//        {"topk_ratio": 0.1, "select_strategy": "step", "select_interval": 64, "update_interval": 4}
//    Strict: an unknown key, a wrong type or a bad value throws config_error naming the key.
//    Keys that are absent keep their value from `base` (by default zenflow's defaults, which
//    differ from DeepSpeed's: see README).
//  - config_from_deepspeed_json(text, base): a whole DeepSpeed config. Reads
//    zero_optimization.zenflow (required) as above, optimizer.params (lr, betas, eps,
//    weight_decay, adam_w_mode) and gradient_clipping; every other key belongs to DeepSpeed and
//    is ignored.
// Both finish with validate(). to_json(c) writes the DeepSpeed-shaped document that
// config_from_deepspeed_json reads back to an equal config.
//
// The zenflow block's keys:
//   topk_ratio            number in [0, 1]
//   select_strategy       "step" | "epoch" | "auto"   (absent: "step" for an integer
//                         select_interval, "auto" for "auto")
//   select_interval       integer >= 1, or "auto" (only with strategy "auto": S = steps_per_epoch);
//                         with "epoch", S = select_interval * steps_per_epoch
//   update_interval       integer >= 1, or "auto"
//   full_warm_up_rounds   integer >= 0
//   overlap_step          boolean
//   auto_ratio            number in [0, 1]
//   steps_per_epoch       integer >= 0 (>= 1 needed by select_interval "auto" and strategy "epoch")
//   offload               false only (device moments in host memory are not supported)
//   pt_reserved_cores_perc number in [0, 1]: host_threads = cores - ceil(p * cores), or 0 (all
//                         cores) when that leaves either side none or overlap_step is off
//   score                 "l1" | "l2sq"        (zenflow's own key)
//   host_threads          integer >= 0         (zenflow's own key; not with pt_reserved_cores_perc)
//   reselect_moments      "keep" | "reset"     (zenflow's own key: what a joining column's Adam
//                         moments and count become; neither is the original implementation's)
//   host_gradient         "mean" | "sum"       (zenflow's own key: the window's gradients a host
//                         update applies, averaged or summed)
//   gradient_reduction    "mean" | "sum"       (zenflow's own key: data parallel, what step() makes
//                         of the ranks' gradients)
//   param_groups          object of named groups (zenflow's own key), each an object with
//                         "lr_scale" and/or "weight_decay_scale" (numbers, default 1):
//                         {"no_decay": {"weight_decay_scale": 0}}; the trainer puts a tensor in
//                         one with .group(cfg.group("no_decay")) (C: zf_set_group)
// Integers may be written as integral numbers (3, 3.0, 3e0); 3.5 is an error.
namespace detail {

[[noreturn]] inline void json_bad(const std::string& key, const std::string& what) {
  throw config_error("zenflow config: " + key + " " + what);
}

inline const json::value& json_expect(const json::value& v, json::kind k, const std::string& key) {
  if (v.type != k)
    json_bad(key, std::string("must be ") + json::kind_name(k) + ", got " + json::kind_name(v.type) +
                      (v.type == json::kind::number || v.type == json::kind::string ? " " + v.text : std::string()) +
                      " (line " + std::to_string(v.line) + ")");
  return v;
}

// Whether a JSON number's text is nonzero: a digit 1-9 before its exponent.
inline bool json_text_nonzero(std::string_view text) {
  for (const char c : text) {
    if (c == 'e' || c == 'E') break;
    if (c >= '1' && c <= '9') return true;
  }
  return false;
}
// A number; one whose text is not 0 but that reads as 0 (below a double's smallest subnormal) is
// refused, naming the key: taken as 0 it would mean something else (no clipping, no decay).
inline double json_number(const json::value& v, const std::string& key) {
  const double d = json_expect(v, json::kind::number, key).number;
  if (d == 0 && json_text_nonzero(v.text))
    json_bad(key, "is " + v.text + ", which is not 0 but reads as 0 (below the smallest double); write 0 for 0");
  return d;
}
// A number held in fp32 (the AdamW hyperparameters, the group scales): as json_number, and one
// that is not 0 but rounds to 0 in fp32 (below about 1.4e-45) is refused too, naming the key.
// (One that rounds to infinity is left to the value checks, which name it as written.)
inline float json_fp32(const json::value& v, const std::string& key) {
  const double d = json_number(v, key);
  if (d != 0 && float(d) == 0)
    json_bad(key, "is " + v.text + ", which is not 0 but rounds to 0 in fp32 (below about 1.4e-45); write 0 for 0");
  return float(d);
}

// (what the key takes, for the message: an interval's 0 is refused by validate(), in its words)
// A string of the document, quoted and escaped as JSON writes it, for a message (a control
// character in it would otherwise break the message's line).
inline std::string json_quoted(std::string_view s) {
  std::string out;
  json::write_string(out, s);
  return out;
}
// A member name for a key path: as it is, unless it holds a control character (then quoted).
inline std::string json_name(const std::string& s) {
  for (const char c : s)
    if (static_cast<unsigned char>(c) < 0x20) return json_quoted(s);
  return s;
}
inline std::uint32_t json_uint32(const json::value& v, const std::string& key,
                                 const char* takes = "an integer in [0, 4294967295]") {
  const double x = json_expect(v, json::kind::number, key).number;
  // (integral judged on the literal: a fraction too small for the double, or an underflow to 0,
  // is no count, and says what the key takes)
  if (!(x >= 0.0 && x <= 4294967295.0 && x == std::floor(x) && json::integral(v.text)))
    json_bad(key, std::string("must be ") + takes + ", got " + v.text);
  return std::uint32_t(x);
}
inline constexpr const char* interval_takes = "an integer in [1, 4294967295] or \"auto\"";

inline const std::string& json_string(const json::value& v, const std::string& key) {
  return json_expect(v, json::kind::string, key).text;
}

inline json::value json_parse(std::string_view text) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw config_error(std::string("zenflow config: invalid JSON: ") + e.what());
  }
}

// The cores this process may run on (its affinity mask where the system has one; else every
// core the system reports).
inline unsigned available_cores() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return unsigned(n);
  }
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

// Applies a "zenflow" block (an object) to c; `where` prefixes key names in messages.
inline void apply_zenflow_block(config& c, const json::value& block, const std::string& where) {
  json_expect(block, json::kind::object, where.empty() ? "the zenflow block" : where);
  static constexpr std::string_view known[] = {
      "topk_ratio", "select_strategy", "select_interval", "update_interval", "full_warm_up_rounds",
      "overlap_step", "auto_ratio", "steps_per_epoch", "offload", "pt_reserved_cores_perc",
      "score", "host_threads", "param_groups", "reselect_moments", "host_gradient",
      "gradient_reduction"};
  for (const auto& k : block.keys) {
    bool ok = false;
    for (auto n : known) ok = ok || k == n;
    if (!ok) {
      std::string list;
      for (auto n : known) list += (list.empty() ? "" : ", ") + std::string(n);
      std::string shown;
      json::write_string(shown, k);
      throw config_error("zenflow config: unknown key " + shown + " in " +
                         (where.empty() ? std::string("the zenflow block") : where) + " (known: " + list + ")");
    }
  }
  auto key = [&](std::string_view k) { return where.empty() ? std::string(k) : where + "." + std::string(k); };
  const json::value* v;
  if ((v = block.find("topk_ratio"))) c.topk_ratio = json_number(*v, key("topk_ratio"));
  if ((v = block.find("update_interval"))) {
    if (v->type == json::kind::string) {
      if (v->text != "auto") json_bad(key("update_interval"), "must be an integer or \"auto\", got " + json_quoted(v->text));
      c.update_interval = interval::auto_();
    } else {
      c.update_interval = interval::every(json_uint32(*v, key("update_interval"), interval_takes));
    }
  }
  if ((v = block.find("full_warm_up_rounds"))) c.full_warm_up_rounds = json_uint32(*v, key("full_warm_up_rounds"));
  if ((v = block.find("overlap_step"))) c.overlap_step = json_expect(*v, json::kind::boolean, key("overlap_step")).boolean;
  if ((v = block.find("auto_ratio"))) c.auto_ratio = json_number(*v, key("auto_ratio"));
  if ((v = block.find("steps_per_epoch"))) c.steps_per_epoch = json_uint32(*v, key("steps_per_epoch"));
  if ((v = block.find("offload")) && json_expect(*v, json::kind::boolean, key("offload")).boolean)
    json_bad(key("offload"), "= true is not supported (zenflow keeps the device moments on the device)");
  if ((v = block.find("reselect_moments"))) {
    const std::string& s = json_string(*v, key("reselect_moments"));
    if (s == "keep") c.reselect_moments = reselect_policy::keep;
    else if (s == "reset") c.reselect_moments = reselect_policy::reset;
    else json_bad(key("reselect_moments"), "must be \"keep\" or \"reset\", got " + json_quoted(s));
  }
  if ((v = block.find("host_gradient"))) {
    const std::string& s = json_string(*v, key("host_gradient"));
    if (s == "mean") c.host_gradient = window_gradient::mean;
    else if (s == "sum") c.host_gradient = window_gradient::sum;
    else json_bad(key("host_gradient"), "must be \"mean\" or \"sum\", got " + json_quoted(s));
  }
  if ((v = block.find("gradient_reduction"))) {
    const std::string& s = json_string(*v, key("gradient_reduction"));
    if (s == "mean") c.gradient_reduction = reduce_op::mean;
    else if (s == "sum") c.gradient_reduction = reduce_op::sum;
    else json_bad(key("gradient_reduction"), "must be \"mean\" or \"sum\", got " + json_quoted(s));
  }
  if ((v = block.find("score"))) {
    const std::string& s = json_string(*v, key("score"));
    if (s == "l1") c.score = score_kind::l1;
    else if (s == "l2sq") c.score = score_kind::l2sq;
    else json_bad(key("score"), "must be \"l1\" or \"l2sq\", got " + json_quoted(s));
  }
  if ((v = block.find("param_groups"))) {
    // {"no_decay": {"weight_decay_scale": 0}, "embed": {"lr_scale": 0.5}}: replaces base's groups
    json_expect(*v, json::kind::object, key("param_groups"));
    c.param_groups.clear();
    for (std::size_t i = 0; i < v->keys.size(); ++i) {
      const std::string gk = key("param_groups") + "." + json_name(v->keys[i]);
      const json::value& g = json_expect(v->items[i], json::kind::object, gk);
      named_param_group ng{v->keys[i], {}};
      for (const auto& k : g.keys)
        if (k != "lr_scale" && k != "weight_decay_scale") {
          std::string shown;
          json::write_string(shown, k);
          throw config_error("zenflow config: unknown key " + shown + " in " + gk + " (known: lr_scale, weight_decay_scale)");
        }
      // (a scale is an fp32: one that rounds to infinity there is named as written)
      auto scale = [&](const json::value& x, const std::string& k) {
        const float f = json_fp32(x, k);
        if (std::isfinite(x.number) && !std::isfinite(f))
          json_bad(k, "must be finite and >= 0, got " + x.text + " (infinite once rounded to fp32)");
        return f;
      };
      if (const json::value* x = g.find("lr_scale")) ng.scales.lr_scale = scale(*x, gk + ".lr_scale");
      if (const json::value* x = g.find("weight_decay_scale"))
        ng.scales.weight_decay_scale = scale(*x, gk + ".weight_decay_scale");
      c.param_groups.push_back(std::move(ng));
    }
  }
  const json::value* threads = block.find("host_threads");
  const json::value* reserved = block.find("pt_reserved_cores_perc");
  if (threads && reserved) json_bad(key("host_threads"), "and pt_reserved_cores_perc are exclusive; give one");
  if (threads) c.host_threads = json_uint32(*threads, key("host_threads"));
  if (reserved) {
    const double p = json_number(*reserved, key("pt_reserved_cores_perc"));
    if (!(p >= 0.0 && p <= 1.0)) json_bad(key("pt_reserved_cores_perc"), "must be in [0, 1], got " + reserved->text);
    // DeepSpeed's split of the cores this process may run on: the first ceil(p n) to training,
    // the rest to the optimizer; when that leaves either side none, both get all. It applies
    // with overlap_step only (without, DeepSpeed's optimizer runs in the training process).
    const bool overlap = [&] {
      const json::value* o = block.find("overlap_step");
      return o ? json_expect(*o, json::kind::boolean, key("overlap_step")).boolean : c.overlap_step;
    }();
    const unsigned n = available_cores();
    const auto training = unsigned(std::ceil(p * double(n)));
    c.host_threads = !overlap || training == 0 || training >= n ? 0u : n - training;
  }
  // Selection: strategy x interval (DeepSpeed's combinations; S = 0, "select once", has no
  // equivalent and is refused by validate()).
  const json::value* strategy = block.find("select_strategy");
  const json::value* sel = block.find("select_interval");
  if (strategy || sel) {
    std::string strat;
    if (strategy) {
      strat = json_string(*strategy, key("select_strategy"));
      if (strat != "auto" && strat != "step" && strat != "epoch")
        json_bad(key("select_strategy"), "must be \"auto\", \"step\" or \"epoch\", got " + json_quoted(strat));
    }
    const bool sel_auto = sel && sel->type == json::kind::string;
    if (sel_auto && sel->text != "auto")
      json_bad(key("select_interval"), "must be an integer or \"auto\", got " + json_quoted(sel->text));
    if (strat.empty()) strat = sel_auto ? "auto" : "step";
    if (strat == "auto") {
      if (sel && !sel_auto)
        json_bad(key("select_interval"), "must be \"auto\" with select_strategy \"auto\" (use \"step\" for a fixed interval), got " + sel->text);
      c.select_interval = interval::auto_();
    } else {
      if (!sel) json_bad(key("select_interval"), "must be given (an integer) with select_strategy \"" + strat + "\"");
      if (sel_auto) json_bad(key("select_interval"), "\"auto\" needs select_strategy \"auto\", got " + json_quoted(strat));
      const std::uint32_t n = json_uint32(*sel, key("select_interval"), strat == "step" ? interval_takes : "an integer in [1, 4294967295]");
      if (strat == "step") {
        c.select_interval = interval::every(n);
      } else {
        if (c.steps_per_epoch < 1) json_bad(key("steps_per_epoch"), "must be >= 1 with select_strategy \"epoch\"");
        const std::uint64_t s = std::uint64_t(n) * c.steps_per_epoch;
        if (s > 4294967295u) json_bad(key("select_interval"), "* steps_per_epoch overflows 32 bits");
        if (!c.update_interval.automatic && c.update_interval.steps > 0 && s % c.update_interval.steps != 0)
          json_bad(key("select_interval"), "(" + std::to_string(n) + " epochs of steps_per_epoch " +
                                               std::to_string(c.steps_per_epoch) + " = " + std::to_string(s) +
                                               " steps) must be a multiple of update_interval (" +
                                               std::to_string(c.update_interval.steps) + ")");
        c.select_interval = interval::every(std::uint32_t(s));
      }
    }
  }
}

}  // namespace detail

namespace detail {

// The two readers below over a parsed document (the C API parses once to tell them apart).
inline config config_from_zenflow_doc(const json::value& doc, config c) {
  apply_zenflow_block(c, doc, "");
  c.validate();
  return c;
}

inline config config_from_deepspeed_doc(const json::value& doc, config c) {
  using detail::json::kind;
  detail::json_expect(doc, kind::object, "the DeepSpeed config");
  const detail::json::value* zero = doc.find("zero_optimization");
  const detail::json::value* block = zero && zero->type == kind::object ? zero->find("zenflow") : nullptr;
  if (!block) throw config_error("zenflow config: the DeepSpeed config has no zero_optimization.zenflow block (ZenFlow is off in it)");
  detail::apply_zenflow_block(c, *block, "zero_optimization.zenflow");
  if (const auto* opt = doc.find("optimizer")) {
    detail::json_expect(*opt, kind::object, "optimizer");
    // (strict, as the blocks below: a misspelt "params" would lose the learning rate unseen;
    // legacy_fusion is DeepSpeed's choice of a fused implementation, nothing zenflow computes)
    for (const auto& k : opt->keys)
      if (k != "type" && k != "params" && k != "legacy_fusion") {
        std::string shown;
        detail::json::write_string(shown, k);
        throw config_error("zenflow config: unknown key " + shown + " in optimizer (known: type, params, legacy_fusion)");
      }
    if (const auto* fusion = opt->find("legacy_fusion")) detail::json_expect(*fusion, kind::boolean, "optimizer.legacy_fusion");
    bool adamw = true, type_adamw = false;
    if (const auto* type = opt->find("type")) {
      std::string t = detail::json_string(*type, "optimizer.type");
      for (auto& ch : t) ch = char(std::tolower(static_cast<unsigned char>(ch)));
      if (t != "adam" && t != "adamw")
        detail::json_bad("optimizer.type", "must be \"Adam\" or \"AdamW\" (ZenFlow's update is Adam), got " + detail::json_quoted(type->text));
      // DeepSpeed's "Adam" defaults to adam_w_mode = true, like "AdamW"; its params may turn it
      // off, but "AdamW" stays AdamW whatever they say (DeepSpeed: type is AdamW or adam_w_mode)
      type_adamw = t == "adamw";
    }
    if (const auto* params = opt->find("params")) {
      detail::json_expect(*params, kind::object, "optimizer.params");
      static constexpr std::string_view known[] = {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam", "bias_correction"};
      for (const auto& k : params->keys) {
        bool ok = false;
        for (auto n : known) ok = ok || k == n;
        if (!ok) {
          std::string shown;
          detail::json::write_string(shown, k);
          throw config_error("zenflow config: unknown key " + shown + " in optimizer.params (known: lr, betas, eps, weight_decay, adam_w_mode, torch_adam, bias_correction)");
        }
      }
      const detail::json::value* v;
      if ((v = params->find("lr"))) c.adam.lr = detail::json_fp32(*v, "optimizer.params.lr");
      if ((v = params->find("eps"))) c.adam.eps = detail::json_fp32(*v, "optimizer.params.eps");
      if ((v = params->find("weight_decay"))) c.adam.weight_decay = detail::json_fp32(*v, "optimizer.params.weight_decay");
      if ((v = params->find("betas"))) {
        detail::json_expect(*v, kind::array, "optimizer.params.betas");
        if (v->items.size() != 2) detail::json_bad("optimizer.params.betas", "must hold two numbers, got " + std::to_string(v->items.size()));
        c.adam.beta1 = detail::json_fp32(v->items[0], "optimizer.params.betas[0]");
        c.adam.beta2 = detail::json_fp32(v->items[1], "optimizer.params.betas[1]");
      }
      if ((v = params->find("adam_w_mode"))) adamw = detail::json_expect(*v, kind::boolean, "optimizer.params.adam_w_mode").boolean;
      if ((v = params->find("torch_adam"))) detail::json_expect(*v, kind::boolean, "optimizer.params.torch_adam");  // picks an implementation only
      if ((v = params->find("bias_correction")) && !detail::json_expect(*v, kind::boolean, "optimizer.params.bias_correction").boolean)
        detail::json_bad("optimizer.params.bias_correction", "= false is not supported");
    }
    c.adam.mode = adamw || type_adamw ? adam_mode::adamw : adam_mode::classic;
  }
  if (const auto* clip = doc.find("gradient_clipping")) c.max_grad_norm = detail::json_number(*clip, "gradient_clipping");
  // errors name the keys of this document; a value that fp32 rounded says so
  auto ds_key = [](const std::string& k) -> std::string {
    if (k == "max_grad_norm") return "gradient_clipping";
    if (k == "lr" || k == "eps" || k == "weight_decay") return "optimizer.params." + k;
    if (k == "beta1") return "optimizer.params.betas[0]";
    if (k == "beta2") return "optimizer.params.betas[1]";
    return "zero_optimization.zenflow." + k;
  };
  auto rounded = [&](const std::string& k) -> std::string {
    const detail::json::value* v = nullptr;
    if (const auto* opt = doc.find("optimizer"))
      if (const auto* params = opt->find("params")) {
        if (k == "lr" || k == "eps" || k == "weight_decay") v = params->find(k);
        const auto* betas = params->find("betas");
        if (betas && betas->items.size() == 2 && (k == "beta1" || k == "beta2")) v = &betas->items[k == "beta1" ? 0 : 1];
      }
    if (!v || v->type != detail::json::kind::number || double(float(v->number)) == v->number) return "";
    return " (" + v->text + " in the JSON, rounded to fp32)";
  };
  c.validate_as(ds_key, rounded);
  return c;
}

}  // namespace detail

inline config config_from_json(std::string_view text, config base = {}) {
  return detail::config_from_zenflow_doc(detail::json_parse(text), std::move(base));
}

inline config config_from_deepspeed_json(std::string_view text, config base = {}) {
  return detail::config_from_deepspeed_doc(detail::json_parse(text), std::move(base));
}

// The DeepSpeed-shaped document holding every field of c; config_from_deepspeed_json reads it
// back to an equal config (numbers are written with enough digits to round-trip exactly).
inline std::string to_json(const config& c) {
  auto num = [](double x) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", x);
    return std::string(buf);
  };
  auto iv = [](const interval& i) { return i.automatic ? std::string("\"auto\"") : std::to_string(i.steps); };
  // (classic Adam is "Adam" with adam_w_mode false: "AdamW" is AdamW whatever the flag says)
  std::string s = std::string("{\n  \"optimizer\": {\"type\": ") +
                  (c.adam.mode == adam_mode::adamw ? "\"AdamW\"" : "\"Adam\"") + ", \"params\": {";
  s += "\"lr\": " + num(c.adam.lr) + ", \"betas\": [" + num(c.adam.beta1) + ", " + num(c.adam.beta2) + "], ";
  s += "\"eps\": " + num(c.adam.eps) + ", \"weight_decay\": " + num(c.adam.weight_decay) + ", ";
  s += std::string("\"adam_w_mode\": ") + (c.adam.mode == adam_mode::adamw ? "true" : "false") + "}},\n";
  s += "  \"gradient_clipping\": " + num(c.max_grad_norm) + ",\n";
  s += "  \"zero_optimization\": {\"zenflow\": {\n";
  s += "    \"topk_ratio\": " + num(c.topk_ratio) + ",\n";
  s += std::string("    \"select_strategy\": ") + (c.select_interval.automatic ? "\"auto\"" : "\"step\"") + ",\n";
  s += "    \"select_interval\": " + iv(c.select_interval) + ",\n";
  s += "    \"update_interval\": " + iv(c.update_interval) + ",\n";
  s += "    \"full_warm_up_rounds\": " + std::to_string(c.full_warm_up_rounds) + ",\n";
  s += std::string("    \"overlap_step\": ") + (c.overlap_step ? "true" : "false") + ",\n";
  s += "    \"auto_ratio\": " + num(c.auto_ratio) + ",\n";
  s += "    \"steps_per_epoch\": " + std::to_string(c.steps_per_epoch) + ",\n";
  s += std::string("    \"score\": ") + (c.score == score_kind::l1 ? "\"l1\"" : "\"l2sq\"") + ",\n";
  s += std::string("    \"reselect_moments\": ") +
       (c.reselect_moments == reselect_policy::keep ? "\"keep\"" : "\"reset\"") + ",\n";
  s += std::string("    \"host_gradient\": ") + (c.host_gradient == window_gradient::mean ? "\"mean\"" : "\"sum\"") + ",\n";
  s += std::string("    \"gradient_reduction\": ") + (c.gradient_reduction == reduce_op::mean ? "\"mean\"" : "\"sum\"") + ",\n";
  s += "    \"host_threads\": " + std::to_string(c.host_threads);
  if (!c.param_groups.empty()) {
    s += ",\n    \"param_groups\": {";
    for (std::size_t i = 0; i < c.param_groups.size(); ++i) {
      const auto& g = c.param_groups[i];
      std::string name;
      detail::json::write_string(name, g.name);
      s += (i ? ", " : "") + name + ": {\"lr_scale\": " + num(g.scales.lr_scale) +
           ", \"weight_decay_scale\": " + num(g.scales.weight_decay_scale) + "}";
    }
    s += "}";
  }
  s += "\n";
  s += "  }}\n}\n";
  return s;
}

}  // namespace zenflow
