// Helper process of test_checkpoint_kill: trains a small model and saves a checkpoint after
// every step, forever (until killed). Prints "ready" after the first complete save.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <zenflow/zenflow.hpp>

#include "checkpoint_models.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: checkpoint_writer PATH STEPS\n");
    return 2;
  }
  zf_ckpt_models::big m;
  zenflow::optimizer<> opt(zf_ckpt_models::big::config());
  m.register_with(opt);
  opt.initialize();
  const long steps = std::atol(argv[2]);
  for (long s = 0; s < steps; ++s) {
    m.gradients(int(s));
    opt.step();
    opt.save(argv[1]);
    if (s == 0) {
      std::puts("ready");
      std::fflush(stdout);
    }
  }
  return 0;
}
