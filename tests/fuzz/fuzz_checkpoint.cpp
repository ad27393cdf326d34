// libFuzzer target: the checkpoint loader. Every input must either load or be refused with
// zenflow::checkpoint_error — never crash, hang or corrupt memory — and an accepted checkpoint
// must leave an optimizer that can keep training. If the input's first byte is odd, the section
// checksums are recomputed first, so mutations also reach the checks behind the CRCs.
#include <cstdint>
#include <cstring>
#include <vector>

#include "../checkpoint_models.hpp"

namespace {
zenflow::optimizer<>& target() {
  static zf_ckpt_models::small m;
  static zenflow::optimizer<>* opt = [] {
    auto* o = new zenflow::optimizer<>(zf_ckpt_models::small::config());
    m.register_with(*o);
    o->initialize();
    return o;
  }();
  return *opt;
}

// Recomputes every section's CRC-32 in place (stops quietly at the first malformed length).
void fix_checksums(std::vector<unsigned char>& b) {
  std::size_t at = 24;
  while (b.size() >= at + 16) {
    std::uint64_t len;
    std::memcpy(&len, b.data() + at + 8, 8);
    at += 16;
    if (len > b.size() - at || b.size() - at - len < 4) return;
    const std::uint32_t crc = zenflow::ckpt::crc32(b.data() + at, std::size_t(len));
    std::memcpy(b.data() + at + len, &crc, 4);
    at += std::size_t(len) + 4;
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::vector<unsigned char> image(data + 1, data + size);
  if (data[0] & 1) fix_checksums(image);
  zenflow::optimizer<>& opt = target();
  try {
    opt.load_image(image.data(), image.size());
  } catch (const zenflow::checkpoint_error&) {
    return 0;
  }
  opt.step();  // an accepted checkpoint must be trainable
  return 0;
}
