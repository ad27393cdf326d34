// Writes the checkpoints that test_checkpoint_format loads (tests/data/checkpoint): the run of
// format_scenario.hpp saved after `saved_after` steps, by one process and by a set of two ranks
// (threads over the tests' hub communicator). Run once per checkpoint format version, into a
// directory of its own:
//   write_format_files tests/data/checkpoint/v<version>
// The files of earlier versions stay: they are what users of those versions have saved.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "format_scenario.hpp"
#include "host_hub.hpp"
#include "thread_ranks.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <directory>\n", argv[0]);
    return 2;
  }
  try {
    const std::string dir = argv[1];
    std::filesystem::create_directories(dir);
    using namespace zf_format;
    const zenflow::config cfg = make_config();
    {
      model m;
      zenflow::optimizer<> opt(cfg);
      m.add_to(opt);
      opt.initialize();
      feed(opt, m, 0, 0, saved_after);
      opt.save(dir + "/" + one_process_file);
    }
    zf_test::thread_hub hub(set_ranks);
    zf_test::on_ranks(hub, [&](int r) {
      const zf_dp_test::gradient_source src;
      model m;
      zf_dp_test::thread_optimizer<zf_test::hub_communicator> opt(cfg, zf_test::hub_communicator(hub, r));
      m.add_to(opt);
      opt.initialize();
      for (int s = 0; s < saved_after; ++s) {
        src.fill_all(m, s, r, 0, zenflow::reduce_op::mean);
        opt.step();
      }
      opt.save(dir + "/" + set_file);
    });
    std::printf("checkpoint format %u: written to %s\n", unsigned(zenflow::ckpt::version), dir.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "write_format_files: %s\n", e.what());
    return 1;
  }
}
