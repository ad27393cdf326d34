// libFuzzer target: the JSON configuration reader. Every input is read both as a "zenflow" block
// (config_from_json) and as a whole DeepSpeed config (config_from_deepspeed_json). Each call
// must return a config or throw zenflow::config_error — any other exception, a crash, a
// sanitizer report or a hang is a finding. A returned config must pass validate(), and
// to_json() of it must read back to an equal config.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <zenflow/config.hpp>

namespace {
bool same(const zenflow::config& a, const zenflow::config& b) {
  return a.topk_ratio == b.topk_ratio && a.select_interval == b.select_interval &&
         a.update_interval == b.update_interval && a.full_warm_up_rounds == b.full_warm_up_rounds &&
         a.overlap_step == b.overlap_step && a.auto_ratio == b.auto_ratio &&
         a.steps_per_epoch == b.steps_per_epoch && a.score == b.score && a.adam.lr == b.adam.lr &&
         a.adam.beta1 == b.adam.beta1 && a.adam.beta2 == b.adam.beta2 && a.adam.eps == b.adam.eps &&
         a.adam.weight_decay == b.adam.weight_decay && a.adam.mode == b.adam.mode &&
         a.max_grad_norm == b.max_grad_norm && a.host_threads == b.host_threads;
}

void check(const zenflow::config& c) {
  c.validate();  // throws (a finding: uncaught) if the reader let a bad value through
  if (!same(zenflow::config_from_deepspeed_json(zenflow::to_json(c)), c)) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  zenflow::config base;
  base.steps_per_epoch = 64;  // so that "auto" and "epoch" selections are reachable
  try {
    check(zenflow::config_from_json(text, base));
  } catch (const zenflow::config_error&) {
  }
  try {
    check(zenflow::config_from_deepspeed_json(text, base));
  } catch (const zenflow::config_error&) {
  }
  return 0;
}
