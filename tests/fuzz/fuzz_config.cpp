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
// Called outside the callers' catch of config_error: any exception here is a finding.
void check(const zenflow::config& c) noexcept {
  try {
    c.validate();  // the reader let a bad value through
    if (!(zenflow::config_from_deepspeed_json(zenflow::to_json(c)) == c)) std::abort();  // no round trip
  } catch (...) {
    std::abort();
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  zenflow::config base;
  base.steps_per_epoch = 64;  // so that "auto" and "epoch" selections are reachable
  zenflow::config c;
  try {
    c = zenflow::config_from_json(text, base);
    check(c);
  } catch (const zenflow::config_error&) {
  }
  try {
    c = zenflow::config_from_deepspeed_json(text, base);
    check(c);
  } catch (const zenflow::config_error&) {
  }
  return 0;
}
