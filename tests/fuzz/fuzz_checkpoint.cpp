// libFuzzer target: the checkpoint loader. Every input must either load or be refused with
// zenflow::checkpoint_error — never crash, hang or corrupt memory — and an accepted checkpoint
// must leave an optimizer that can keep training. If the input's first byte is odd, the section
// checksums are recomputed first, so mutations also reach the checks behind the CRCs.
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::vector<unsigned char> image(data + 1, data + size);
  if (data[0] & 1) zf_fuzz::fix_checksums(image);
  zenflow::optimizer<>& opt = zf_fuzz::target();
  try {
    opt.load_image(image.data(), image.size());
  } catch (const zenflow::checkpoint_error&) {
    return 0;
  }
  opt.step();  // an accepted checkpoint must be trainable
  return 0;
}
