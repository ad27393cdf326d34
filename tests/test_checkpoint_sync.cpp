// Checkpoint saves whose fsync fails: what the directory holds afterwards. A program of its own:
// it replaces the C library's fsync for the whole process (ELF interposition, as test_c_api_oom
// does with aligned_alloc) and fails it, on request of the calling thread, for directories (the
// sync that makes a rename durable) or for regular files (the sync of the written data: an I/O
// error or a full disk seen only then).
//
// What must hold (optimizer_checkpoint.hpp, checkpoint.hpp's commit):
// - a file whose data cannot be synced is never renamed over the path: the save throws, the
//   previous checkpoint keeps its bytes, no temporary file is left;
// - a rename whose directory cannot be synced is in place, and the save succeeds, but the files
//   the previous checkpoint referred to (a sharded set's shards) are kept: after a crash the
//   directory may still hold the old name's entry, and then its shards with it. The next save
//   that syncs removes them.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <zenflow/zenflow.hpp>

#include "thread_ranks.hpp"

namespace {
thread_local bool fail_dir_sync = false, fail_file_sync = false;
std::atomic<int> dir_failures{0}, file_failures{0};
}  // namespace

extern "C" int fsync(int fd) {
  struct stat st {};
  if ((fail_dir_sync || fail_file_sync) && ::fstat(fd, &st) == 0) {
    if (fail_dir_sync && S_ISDIR(st.st_mode)) {
      ++dir_failures;
      errno = EIO;
      return -1;
    }
    if (fail_file_sync && S_ISREG(st.st_mode)) {
      ++file_failures;
      errno = EIO;
      return -1;
    }
  }
  return static_cast<int>(::syscall(SYS_fsync, fd));
}

using namespace zenflow;
using namespace zf_dp_test;

namespace {

// An empty directory of this test's own under the build tree.
std::string fresh_dir(const std::string& name) {
  const std::filesystem::path d = std::filesystem::path(ZF_TEST_TMP_DIR) / ("sync-" + name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}
// The names in dir, sorted.
std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}
std::vector<char> bytes_of(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
// What a one-process optimizer holds after loading path (a file or a set).
std::vector<unsigned char> loaded(const config& cfg, const std::string& path) {
  model m;
  optimizer<> one(cfg);
  m.add_to(one);
  one.initialize();
  one.load(path);
  return state_of(one, m);
}
}  // namespace

TEST_CASE("one process: a save whose directory cannot be synced keeps the previous set's shards; data never synced "
          "is never renamed") {
  const config cfg = test_config(true);
  const gradient_source src;
  const std::string dir = fresh_dir("one"), path = dir + "/ckpt";
  save_set_on_threads(2, cfg, src, 3, path);  // a set of 2 ranks at path: its manifest and 2 shards
  const auto set_files = listing(dir);
  REQUIRE(set_files.size() == 3);

  model m;
  optimizer<> one(cfg);
  m.add_to(one);
  one.initialize();
  one.load(path);
  for (int s = 3; s < 5; ++s) {
    src.fill_all(m, s, 0, 2, cfg.gradient_reduction);
    one.step();
  }
  const int dir_before = dir_failures;
  fail_dir_sync = true;
  one.save(path);  // (returns: the file is in place)
  fail_dir_sync = false;
  CHECK(dir_failures > dir_before);  // (the interposed fsync was the one called)
  // the one file has replaced the manifest; the shards it named are still there
  CHECK(listing(dir) == set_files);
  const auto saved = state_of(one, m);
  CHECK(loaded(cfg, path) == saved);

  // the data's sync fails: the save throws, the file keeps its bytes, nothing else is left
  const auto before = bytes_of(path);
  src.fill_all(m, 5, 0, 2, cfg.gradient_reduction);
  one.step();
  const int file_before = file_failures;
  fail_file_sync = true;
  CHECK_THROWS_WITH_AS(one.save(path), doctest::Contains("failed (disk full?)"), std::runtime_error);
  fail_file_sync = false;
  CHECK(file_failures > file_before);
  CHECK(bytes_of(path) == before);
  CHECK(listing(dir) == set_files);
  CHECK(loaded(cfg, path) == saved);

  // a save that syncs removes the shards
  one.save(path);
  CHECK(listing(dir) == std::vector<std::string>{"ckpt"});
  CHECK(loaded(cfg, path) == state_of(one, m));
  std::filesystem::remove_all(dir);
}

TEST_CASE("two ranks: one rank's directory sync failing keeps every older shard; one rank's data sync failing keeps "
          "the previous set on every rank") {
  const config cfg = test_config(true);
  const gradient_source src;
  const std::string dir = fresh_dir("set"), path = dir + "/ckpt";
  constexpr int R = 2;
  // what rank 0 sees between the saves (the other rank waits in a barrier meanwhile)
  std::vector<std::string> after_a, after_b, after_failed, after_c;
  std::vector<unsigned char> state_b, loaded_b, loaded_b_again, state_c;
  std::vector<char> manifest_b, manifest_failed;
  std::vector<std::string> failures(R);
  const int dir_before = dir_failures, file_before = file_failures;
  zf_test::thread_hub hub(R);
  zf_test::on_ranks(hub, [&](int r) {
    model m;
    thread_optimizer<zf_test::hub_communicator> opt(cfg, zf_test::hub_communicator(hub, r));
    m.add_to(opt);
    opt.initialize();
    int s = 0;
    auto train = [&](int n) {
      for (int end = s + n; s < end; ++s) {
        src.fill_all(m, s, r, 0, cfg.gradient_reduction);
        opt.step();
      }
    };
    train(3);
    opt.save(path);  // set A
    hub.barrier();
    if (r == 0) after_a = listing(dir);
    hub.barrier();

    train(2);
    fail_dir_sync = r == 1;
    opt.save(path);  // set B: rank 1's shard rename is not durable
    fail_dir_sync = false;
    hub.barrier();
    if (r == 0) {
      after_b = listing(dir);
      manifest_b = bytes_of(path);
    }
    const auto b = state_of(opt, m);
    if (r == 0) {
      state_b = b;
      loaded_b = loaded(cfg, path);
    }
    hub.barrier();

    train(1);
    fail_file_sync = r == 1;
    try {
      opt.save(path);  // rank 1's shard cannot be synced: every rank throws
    } catch (const std::exception& e) {
      failures[std::size_t(r)] = e.what();
    }
    fail_file_sync = false;
    hub.barrier();
    if (r == 0) {
      after_failed = listing(dir);
      manifest_failed = bytes_of(path);
      loaded_b_again = loaded(cfg, path);
    }
    hub.barrier();

    opt.save(path);  // set C, synced
    hub.barrier();
    if (r == 0) after_c = listing(dir);
    const auto c = state_of(opt, m);
    if (r == 0) state_c = c;
  });
  CHECK(dir_failures > dir_before);
  CHECK(file_failures > file_before);

  // A: manifest and 2 shards. B: its 2 shards added, A's kept (rank 0's rename was durable, but
  // the set is one: its older shards go only when every rank's renames are)
  REQUIRE(after_a.size() == 3);
  CHECK(after_b.size() == 5);
  CHECK(std::includes(after_b.begin(), after_b.end(), after_a.begin(), after_a.end()));
  CHECK(loaded_b == state_b);
  // the failed save: every rank threw, rank 1 its own error; the directory and B are unchanged
  CHECK(failures[1].find("failed (disk full?)") != std::string::npos);
  CHECK(failures[0].find("the previous checkpoint stands") != std::string::npos);
  CHECK(after_failed == after_b);
  CHECK(manifest_failed == manifest_b);
  CHECK(loaded_b_again == state_b);
  // C, synced everywhere: the manifest and C's 2 shards only (A's and B's removed)
  CHECK(after_c.size() == 3);
  for (const auto& name : after_c) {
    CAPTURE(name);
    CHECK((name == "ckpt" || std::find(after_b.begin(), after_b.end(), name) == after_b.end()));
  }
  CHECK(loaded(cfg, path) == state_c);
  std::filesystem::remove_all(dir);
}
