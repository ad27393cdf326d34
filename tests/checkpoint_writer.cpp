// Helper process of test_checkpoint_kill: trains a small model and saves a checkpoint after
// every step, forever (until killed). Prints "ready" after the first complete save. With a third
// argument, "announce", it saves three times after each later step and prints "s" after the
// first: the next two have nothing to wait for (the first waited for the host update in flight),
// so a kill sent on reading the "s" lands while one of them writes its file (but for the few
// system calls before the first opens it).
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <oneapi/tbb/global_control.h>

#include <zenflow/zenflow.hpp>

#include "checkpoint_models.hpp"
#include "tbb_threads.hpp"

int main(int argc, char** argv) {
  if (argc != 3 && !(argc == 4 && std::string(argv[3]) == "announce")) {
    std::fprintf(stderr, "usage: checkpoint_writer PATH STEPS [announce]\n");
    return 2;
  }
  const bool announce = argc == 4;
  // As the tests' own main, ZENFLOW_TEST_TBB_THREADS (tbb_threads.hpp): under ThreadSanitizer,
  // oneTBB's hand-offs reported one after another slowed this writer so much that the kills met
  // its reports, not its saves.
  std::optional<tbb::global_control> limit;
  if (const auto n = zf_test::tbb_threads_from_env()) limit.emplace(tbb::global_control::max_allowed_parallelism, *n);
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
    } else if (announce) {
      std::fputs("s", stdout);
      std::fflush(stdout);
      opt.save(argv[1]);
      opt.save(argv[1]);
    }
  }
  return 0;
}
