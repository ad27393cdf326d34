// A process killed (SIGKILL) while saving leaves the previous checkpoint loadable: saves go to a
// temporary file that is renamed over the target only when complete.
#include <doctest/doctest.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <zenflow/zenflow.hpp>

#include "checkpoint_models.hpp"
#include "support.hpp"

extern char** environ;

// The temporary files (path.tmp.*) that killed saves left. With `age`, they are made older than
// the minute after which a save removes the unlocked ones (as if the job restarted later).
static int temporaries(const std::string& path, bool age = false) {
  const std::filesystem::path p(path);
  const std::string prefix = p.filename().string() + ".tmp.";
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(p.parent_path()))
    if (e.path().filename().string().rfind(prefix, 0) == 0) {
      if (age) std::filesystem::last_write_time(e.path(), std::filesystem::file_time_type::clock::now() - std::chrono::minutes(2));
      ++n;
    }
  return n;
}
static void remove_temporaries(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string prefix = p.filename().string() + ".tmp.";
  for (const auto& e : std::filesystem::directory_iterator(p.parent_path()))
    if (e.path().filename().string().rfind(prefix, 0) == 0) std::filesystem::remove(e.path());
}

TEST_CASE("checkpoint: SIGKILL during a save leaves the previous checkpoint loadable") {
  const std::string path = std::string(ZF_TEST_TMP_DIR) + "/killed.zfckpt";
  int torn = 0;  // rounds where the kill left a partial temporary file behind
  // (4 rounds in the sanitizer runs, where the writer and each load of the big model are 10-100x
  // slower: 12 took more than two minutes under ThreadSanitizer)
  // Even rounds kill after a random few milliseconds, wherever the writer is (about 3 kills in 4
  // land inside a save on the build box). Odd rounds have the writer announce two saves that have
  // nothing to wait for, wait for their temporary file to appear and kill it: it is then writing
  // its file. The test's point needs at least one torn save, so it goes on past `rounds` until
  // one has (at most three times as many).
  const int rounds = zf_test::full_or_quick(12, 4);
  int round = 0;
  for (; round < rounds || (torn == 0 && round < 3 * rounds); ++round) {
    const bool announced = round % 2 == 1;
    CAPTURE(round);
    std::remove(path.c_str());
    int out[2];
    REQUIRE(pipe(out) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    const std::string steps = "100000";
    char announce[] = "announce";
    char* argv[] = {const_cast<char*>(ZF_CHECKPOINT_WRITER), const_cast<char*>(path.c_str()),
                    const_cast<char*>(steps.c_str()), announced ? announce : nullptr, nullptr};
    pid_t pid = 0;
    REQUIRE(posix_spawn(&pid, ZF_CHECKPOINT_WRITER, &fa, nullptr, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    char buf[8] = {};
    REQUIRE(read(out[0], buf, 6) == 6);  // "ready\n": one complete checkpoint exists
    if (announced) {  // a few step+save cycles, then the kill once the next saves' file is open
      for (int k = 0; k <= round % 3; ++k) REQUIRE(read(out[0], buf, 1) == 1);
      // (the code before the open takes a while in a sanitizer's -O0 build: a kill sent at once
      // met it there; up to a second's wait, 50 us at a time)
      for (int i = 0; i < 20000 && temporaries(path) == 0; ++i) std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else {  // a few more step+save cycles, then the kill wherever the writer is
      std::this_thread::sleep_for(std::chrono::milliseconds(2 + 3 * round));
    }
    REQUIRE(kill(pid, SIGKILL) == 0);
    close(out[0]);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFSIGNALED(status));  // it was still running: killed, not finished
    const int left = temporaries(path, true);
    torn += left;
    zf_ckpt_models::big m;
    zenflow::optimizer<> opt(zf_ckpt_models::big::config());
    m.register_with(opt);
    opt.initialize();
    REQUIRE_NOTHROW(opt.load(path));
    const std::uint64_t n = opt.applied_steps();
    CHECK(n >= 1);
    // exactly the state after n steps (the writer saves after each step, and saving changes
    // nothing): an in-process run of n steps, params and masters bit for bit
    {
      zf_ckpt_models::big rm;
      zenflow::optimizer<> ref(zf_ckpt_models::big::config());
      rm.register_with(ref);
      ref.initialize();
      for (std::uint64_t s = 0; s < n; ++s) {
        rm.gradients(int(s));
        ref.step();
      }
      const bool same_params = std::equal(m.w.begin(), m.w.end(), rm.w.begin(),
                                          [](zenflow::bfloat16 x, zenflow::bfloat16 y) { return x.bits == y.bits; });
      CHECK(same_params);
      std::vector<float> a(m.rows * m.cols), b(m.rows * m.cols);
      opt.copy_master(zenflow::matrix_id{0}, a.data());
      ref.copy_master(zenflow::matrix_id{0}, b.data());
      CHECK(a == b);
    }
    if (left > 0) {  // the resumed run's next save removes what the killed one left (its lock died with it)
      opt.save(path);
      CHECK(temporaries(path) == 0);
    }
  }
  MESSAGE(torn, " of ", round, " kills landed inside a save (a partial temporary file was left)");
  CHECK(torn > 0);
  std::remove(path.c_str());
  remove_temporaries(path);
}
