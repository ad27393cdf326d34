// Writes the fuzzer's seed corpus: checkpoints of tests/checkpoint_models.hpp (small) after 0..9 steps
// (before and after selections, mid-window, with an update in flight), each prefixed by the
// fuzzer's mode byte (even and odd).
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../checkpoint_models.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1], tmp = dir + "/.ckpt";
  zf_ckpt_models::small m;
  zenflow::optimizer<> opt(zf_ckpt_models::small::config());
  m.register_with(opt);
  opt.initialize();
  for (int s = 0; s < 10; ++s) {
    opt.save(tmp);
    std::ifstream in(tmp, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (char mode : {char(0), char(1)}) {
      std::ofstream out(dir + "/seed-" + std::to_string(s) + "-" + std::to_string(int(mode)), std::ios::binary);
      out.put(mode);
      out.write(bytes.data(), std::streamsize(bytes.size()));
    }
    m.gradients(s);
    opt.step();
  }
  std::remove(tmp.c_str());
  return 0;
}
