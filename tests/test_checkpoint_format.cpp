// Checkpoints that an earlier build wrote, committed under tests/data/checkpoint/v<version>: a
// file saved by one process and a set saved by two ranks, from the run of format_scenario.hpp
// after its first `saved_after` steps (written once by tests/write_format_files.cpp). Every
// other checkpoint test saves and loads with the same build, so a change to the writer and the
// reader together passes them all while every checkpoint users have saved no longer loads — or
// loads into the wrong places. Here the files are loaded into this build and the runs resumed;
// the reference is the same steps replayed in this process without a checkpoint, compared bit
// for bit right after the load and at the end (the run's arithmetic is the same on every
// machine: the host kernels' tiers give the same bits, and the scenario avoids libm).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <zenflow/zenflow.hpp>

#include "format_scenario.hpp"
#include "host_hub.hpp"
#include "thread_ranks.hpp"

using namespace zf_format;

namespace {

const std::string v3_dir = std::string(ZF_TEST_DATA_DIR) + "/checkpoint/v3";
const int resume_to = 14;  // steps [saved_after, 14): selections at t = 9 and 13, boundaries

// The committed files whose names start with `name` (a set: its manifest and shards), copied
// into the build's directory (the sources may be read-only); returns the copy's path.
std::string copied(const std::string& name) {
  const std::string to = std::string(ZF_TEST_TMP_DIR) + "/format_v3";
  std::filesystem::create_directories(to);
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(v3_dir))
    if (e.path().filename().string().rfind(name, 0) == 0) {
      // (a copy of a read-only source is read-only: the next run replaces it, not writes into it)
      const std::string copy = to + "/" + e.path().filename().string();
      std::filesystem::remove(copy);
      std::filesystem::copy_file(e.path(), copy);
      ++n;
    }
  REQUIRE(n > 0);
  return to + "/" + name;
}

// The state after steps [0, saved_after) fed `saved_by` ranks' reduced gradient (0: one
// process's own), then to `to` fed `resumed_by` ranks'.
std::vector<unsigned char> replayed(int saved_by, int resumed_by, int to) {
  model m;
  zenflow::optimizer<> opt(make_config());
  m.add_to(opt);
  opt.initialize();
  feed(opt, m, saved_by, 0, std::min(saved_after, to));
  feed(opt, m, resumed_by, saved_after, to);
  return state_of(opt, m);
}

std::uint32_t file_version(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  unsigned char head[12] = {};
  f.read(reinterpret_cast<char*>(head), 12);
  REQUIRE(f.gcount() == 12);
  std::uint32_t v = 0;
  std::memcpy(&v, head + 8, 4);
  return v;
}

}  // namespace

// When the format version changes, the v3 files stop loading and this says why: keep them,
// write the new version's with write_format_files into a directory of its own, and decide what
// a v3 file must do under the new build (load, or be refused with a message a test checks).
TEST_CASE("checkpoint format: the committed v3 files are of the version this build reads") {
  for (const std::string& name : {one_process_file, set_file}) {
    CAPTURE(name);
    CHECK(file_version(v3_dir + "/" + name) == 3);
  }
  CHECK(zenflow::ckpt::version == 3);
}

TEST_CASE("checkpoint format: a file one process saved with an earlier build loads, and the run resumes bit for bit") {
  const std::string path = copied(one_process_file);
  const auto at_load = replayed(0, 0, saved_after), want = replayed(0, 0, resume_to);
  REQUIRE(at_load != replayed(0, 0, saved_after - 1));  // (the last step before the save changed the state)
  model m;  // (its params are the starting values: the load replaces them)
  zenflow::optimizer<> opt(make_config());
  m.add_to(opt);
  opt.initialize();
  opt.load(path);
  CHECK(opt.stats().steps == std::uint64_t(saved_after));
  CHECK(state_of(opt, m) == at_load);
  feed(opt, m, 0, saved_after, resume_to);
  CHECK(state_of(opt, m) == want);
}

TEST_CASE("checkpoint format: a set two ranks saved with an earlier build resumes on 2 and 3 ranks and in one process, "
          "bit for bit") {
  const std::string path = copied(set_file);
  for (const int R : {2, 3}) {
    CAPTURE(R);
    const auto at_load = replayed(set_ranks, set_ranks, saved_after), want = replayed(set_ranks, R, resume_to);
    std::vector<std::vector<unsigned char>> loaded(static_cast<std::size_t>(R)), resumed(loaded);
    zf_test::thread_hub hub(R);
    zf_test::on_ranks(hub, [&](int r) {
      const zf_dp_test::gradient_source src;
      model m;
      zf_dp_test::thread_optimizer<zf_test::hub_communicator> opt(make_config(), zf_test::hub_communicator(hub, r));
      m.add_to(opt);
      opt.initialize();
      opt.load(path);
      loaded[std::size_t(r)] = state_of(opt, m);
      for (int s = saved_after; s < resume_to; ++s) {
        src.fill_all(m, s, r, 0, zenflow::reduce_op::mean);
        opt.step();
      }
      resumed[std::size_t(r)] = state_of(opt, m);
    });
    for (int r = 0; r < R; ++r) {
      CAPTURE(r);
      CHECK(loaded[std::size_t(r)] == at_load);
      CHECK(resumed[std::size_t(r)] == want);
    }
  }
  model m;
  zenflow::optimizer<> one(make_config());
  m.add_to(one);
  one.initialize();
  one.load(path);
  CHECK(state_of(one, m) == replayed(set_ranks, set_ranks, saved_after));
  feed(one, m, set_ranks, saved_after, resume_to);
  CHECK(state_of(one, m) == replayed(set_ranks, set_ranks, resume_to));
}
