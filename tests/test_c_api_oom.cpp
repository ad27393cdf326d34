// The C API when memory runs out: no call may throw past the C boundary or abort, even when
// storing the error's own message fails. A program of its own, since it replaces the global
// operator new (which throws while `starve` is set on the thread), for the whole program: the
// C API's library, zenflow::c, included.
#include <doctest/doctest.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <zenflow/c.h>
#include <zenflow/detail/c_status.hpp>
#include <zenflow/zenflow.hpp>

namespace {
thread_local bool starve = false;
thread_local int fail_nth = 0;  // > 0: the fail_nth-th allocation from now on fails, that one only
}

// (operator delete frees what this operator new took from malloc: GCC cannot see the pairing)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (starve || (fail_nth > 0 && --fail_nth == 0)) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

// The host arrays' aligned_alloc (the optimizer state on the host space) counts as an
// allocation too: this definition takes the C library's place in the process (ELF
// interposition; the sanitizers' own versions included) and fails like operator new. What it
// hands out comes from posix_memalign, so free() takes it back whoever provides free.
namespace {
thread_local int aligned_failures = 0;  // the aligned_allocs this thread has failed
}
extern "C" void* aligned_alloc(std::size_t alignment, std::size_t size) noexcept {
  if (starve || (fail_nth > 0 && --fail_nth == 0)) {
    ++aligned_failures;
    errno = ENOMEM;
    return nullptr;
  }
  void* p = nullptr;
  const std::size_t a = alignment < sizeof(void*) ? sizeof(void*) : alignment;
  return posix_memalign(&p, a, size ? size : 1) == 0 ? p : nullptr;
}

// A C API call made while no memory can be had; its status and the thread's message after it.
template <class Call>
std::pair<zf_status, std::string> starved(Call call) {
  starve = true;
  const zf_status st = call();
  starve = false;
  return {st, zf_last_error()};
}

const std::string fixed = "zenflow: out of memory (the error's own message could not be stored)";
// The fallback, where storing `real` needs memory. libstdc++ keeps at most 15 characters
// without allocating, so every message here needs it; a library with a longer inline buffer may
// store a short one.
bool fallback_or(const std::string& got, const std::string& real) {
#if defined(__GLIBCXX__)
  (void)real;
  return got == fixed;
#else
  return got == fixed || got == real;
#endif
}

TEST_CASE("C API: out of memory while failing returns a status and a fixed message, never throws or aborts") {
  zf_optimizer* opt = nullptr;
  REQUIRE(zf_create("zenflow", nullptr, &opt) == ZF_OK);
  // The thread's message starts empty (no room for a long text): with nothing to allocate,
  // set_lr's own error cannot even be built (bad_alloc), and "out of memory" cannot be stored.
  const auto lr = starved([&] { return zf_set_lr(opt, NAN); });
  CHECK(lr.first == ZF_OUT_OF_MEMORY);
  CHECK(fallback_or(lr.second, "zenflow: out of memory"));
  // an argument check outside any try block (a NULL handle), the same
  const auto null = starved([] { return zf_step(nullptr, 1.0f, nullptr); });
  CHECK(null.first == ZF_INVALID_ARGUMENT);
  CHECK(fallback_or(null.second, "zenflow: the optimizer handle is NULL"));
  // with memory again, the messages are the real ones
  CHECK(zf_set_lr(opt, NAN) == ZF_INVALID_ARGUMENT);
  CHECK(std::string(zf_last_error()).find("lr must be finite and >= 0") != std::string::npos);
  // a message that fits what the thread already holds is stored even while starving
  const auto again = starved([] { return zf_step(nullptr, 1.0f, nullptr); });
  CHECK(again.first == ZF_INVALID_ARGUMENT);
  CHECK(again.second == "zenflow: the optimizer handle is NULL");
  zf_destroy(opt);
}

TEST_CASE("C API: each exception type maps to its status; an internal logic error is not taken for an unusable optimizer") {
  using zenflow::c_api::guarded;
  auto status_of = [](auto thrower) { return guarded([&] { thrower(); }); };
  CHECK(status_of([] {}) == ZF_OK);
  CHECK(status_of([] { throw zenflow::checkpoint_error("c"); }) == ZF_CHECKPOINT_ERROR);
  CHECK(status_of([] { throw zenflow::config_error("c"); }) == ZF_INVALID_ARGUMENT);
  CHECK(status_of([] { throw std::invalid_argument("c"); }) == ZF_INVALID_ARGUMENT);
  CHECK(status_of([] { throw zenflow::unusable_error("c"); }) == ZF_UNUSABLE);
  CHECK(status_of([] { throw std::bad_alloc(); }) == ZF_OUT_OF_MEMORY);
  CHECK(status_of([] { throw std::runtime_error("c"); }) == ZF_IO_ERROR);
  // a thread the system could not start (std::thread's error), or its memory: out of resources;
  // another system error stays an I/O error
  CHECK(status_of([] { throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again)); }) ==
        ZF_OUT_OF_MEMORY);
  CHECK(status_of([] { throw std::system_error(std::make_error_code(std::errc::not_enough_memory)); }) ==
        ZF_OUT_OF_MEMORY);
  CHECK(status_of([] { throw std::system_error(std::make_error_code(std::errc::no_space_on_device)); }) == ZF_IO_ERROR);
  // what no valid call should meet: a fault of zenflow's own, not "load a checkpoint"
  CHECK(status_of([] { throw std::logic_error("c"); }) == ZF_INTERNAL_ERROR);
  CHECK(status_of([] { throw std::out_of_range("c"); }) == ZF_INTERNAL_ERROR);
  CHECK(status_of([] { throw 42; }) == ZF_INTERNAL_ERROR);
  CHECK(std::string(zf_last_error()) == "zenflow: an unknown exception");
}

TEST_CASE("C API: the call that fails midway returns ZF_UNUSABLE, and so does work until a load succeeds") {
  const std::string path = std::string(ZF_TEST_TMP_DIR) + "/c_api_unusable.zfckpt";
  const std::string bad = std::string(ZF_TEST_TMP_DIR) + "/c_api_unusable-bad.zfckpt";
  std::vector<float> w(8 * 16, 0.5f), g(8 * 16, 0.01f);
  zf_optimizer* opt = nullptr;
  REQUIRE(zf_create("zenflow", "{\"topk_ratio\": 0.25, \"update_interval\": 1, \"select_interval\": 2}", &opt) == ZF_OK);
  REQUIRE(zf_add_matrix(opt, w.data(), g.data(), 8, 16, ZF_F32, ZF_F32, ZF_ROW_MAJOR, nullptr) == ZF_OK);
  REQUIRE(zf_initialize(opt) == ZF_OK);
  REQUIRE(zf_step(opt, 1.0f, nullptr) == ZF_OK);
  REQUIRE(zf_save(opt, path.c_str()) == ZF_OK);
  const std::vector<float> saved = w;
  // A step whose n-th allocation fails, n = 1, 2, ...: until one fails after the step began
  // changing the state (today its first allocation already comes after its checks). A failure
  // before that would be ZF_OUT_OF_MEMORY with the optimizer unchanged (the next step works); the
  // one after it is ZF_UNUSABLE, from that very call, naming the cause.
  zf_status st = ZF_OK;
  std::string msg;
  std::vector<float> master_before(w.size()), master_after(w.size());
  for (int n = 1; n < 10000 && st != ZF_UNUSABLE; ++n) {
    CAPTURE(n);
    REQUIRE(zf_copy_master(opt, 0, master_before.data(), master_before.size()) == ZF_OK);
    const std::vector<float> w_before = w;
    fail_nth = n;
    st = zf_step(opt, 1.0f, nullptr);
    const bool failed = fail_nth == 0;  // (the n-th allocation came)
    fail_nth = 0;
    msg = zf_last_error();
    if (st == ZF_OK) {
      REQUIRE(!failed);  // a step that met its failure says so
      REQUIRE(zf_step(opt, 1.0f, nullptr) == ZF_OK);  // the next step: a selection again
      continue;
    }
    REQUIRE(failed);  // (a failure status only from the failed allocation)
    if (st == ZF_OUT_OF_MEMORY) {  // usable, and nothing changed: the params and the masters
      REQUIRE(zf_copy_master(opt, 0, master_after.data(), master_after.size()) == ZF_OK);
      CHECK(w == w_before);
      CHECK(master_after == master_before);
      REQUIRE(zf_step(opt, 1.0f, nullptr) == ZF_OK);
    } else {
      REQUIRE(st == ZF_UNUSABLE);
    }
  }
  REQUIRE(st == ZF_UNUSABLE);
  CHECK_MESSAGE(msg.find("out of memory") != std::string::npos, msg);
  CHECK_MESSAGE(msg.find("unusable until zf_load succeeds") != std::string::npos, msg);
  // then every call that works on the state refuses, with that status
  CHECK(zf_step(opt, 1.0f, nullptr) == ZF_UNUSABLE);
  CHECK(std::string(zf_last_error()).find("load a checkpoint to go on") != std::string::npos);
  CHECK(zf_synchronize(opt) == ZF_UNUSABLE);
  CHECK(zf_save(opt, bad.c_str()) == ZF_UNUSABLE);
  // a load that fails its checks says why (and the handle stays unusable)
  { std::ofstream(bad) << "not a checkpoint"; }
  CHECK(zf_load(opt, bad.c_str()) == ZF_CHECKPOINT_ERROR);
  CHECK(zf_step(opt, 1.0f, nullptr) == ZF_UNUSABLE);
  // a load that succeeds brings it back: the state of the save
  CHECK(zf_load(opt, path.c_str()) == ZF_OK);
  CHECK(w == saved);
  int applied = 0;
  CHECK(zf_step(opt, 1.0f, &applied) == ZF_OK);
  CHECK(applied == 1);
  zf_destroy(opt);
  std::remove(path.c_str());
  std::remove(bad.c_str());
}

TEST_CASE("C API: a registration that runs out of memory leaves nothing behind, and the same buffers register on retry") {
  // Each allocation of zf_add_matrix, then of zf_add_vector, failing in turn: the call returns
  // ZF_OUT_OF_MEMORY and records nothing, so the retry with the same buffers succeeds (no
  // "overlaps matrix 0" from a half-made record), the ids stay in sequence, and the optimizer
  // trains.
  std::vector<float> w(4 * 6, 0.5f), g(4 * 6, 0.01f), b(3, 1.0f), gb(3, 0.02f);
  auto add_matrix = [&](zf_optimizer* opt, std::size_t* id) {
    return zf_add_matrix(opt, w.data(), g.data(), 4, 6, ZF_F32, ZF_F32, ZF_ROW_MAJOR, id);
  };
  auto add_vector = [&](zf_optimizer* opt, std::size_t* id) { return zf_add_vector(opt, b.data(), gb.data(), 3, ZF_F32, ZF_F32, id); };
  for (int which = 0; which < 2; ++which) {
    int failures = 0;
    for (int n = 1;; ++n) {
      CAPTURE(which);
      CAPTURE(n);
      zf_optimizer* opt = nullptr;
      REQUIRE(zf_create("zenflow", nullptr, &opt) == ZF_OK);
      if (which == 1) REQUIRE(add_matrix(opt, nullptr) == ZF_OK);
      fail_nth = n;
      const zf_status st = which == 0 ? add_matrix(opt, nullptr) : add_vector(opt, nullptr);
      const bool met = fail_nth == 0;  // the call made an n-th allocation, which failed
      fail_nth = 0;
      std::size_t mid = 9, vid = 9;
      if (met) {
        ++failures;
        CHECK(st == ZF_OUT_OF_MEMORY);
        if (which == 0) CHECK(add_matrix(opt, &mid) == ZF_OK);
        else CHECK(add_vector(opt, &vid) == ZF_OK);
      } else {
        CHECK(st == ZF_OK);
      }
      if (which == 0) CHECK(add_vector(opt, &vid) == ZF_OK);
      if (met) CHECK((which == 0 ? mid : vid) == 0);
      CHECK(zf_initialize(opt) == ZF_OK);
      CHECK(zf_step(opt, 1.0f, nullptr) == ZF_OK);
      zf_destroy(opt);
      if (!met) break;  // fewer than n allocations: each one has failed once
    }
    CHECK(failures >= 2);  // (the records of both buffers, at least)
  }
}

TEST_CASE("C API: an initialize that runs out of memory, the host arrays included, can be retried and trains as if it had not") {
  // Each allocation of zf_initialize failing in turn (operator new and the aligned_alloc of the
  // host-space state arrays): ZF_OUT_OF_MEMORY, and the retry succeeds, after which four steps
  // give the bits of an optimizer that never failed (no half-made state kept, none leaked into
  // the retry). Every allocation is a failure point: the loop ends at the first n the call
  // does not reach.
  const char* conf = "{\"topk_ratio\": 0.25, \"update_interval\": 2, \"select_interval\": 2}";
  const std::size_t rows = 8, cols = 16, n_w = rows * cols;
  auto train = [&](zf_optimizer* opt, std::vector<float>& w, std::vector<float>& g) {
    for (int t = 0; t < 4; ++t) {
      for (std::size_t i = 0; i < n_w; ++i) g[i] = 0.01f * float((i * 7 + std::size_t(t) * 3) % 11) - 0.05f + 0.001f * w[i];
      REQUIRE(zf_step(opt, 1.0f, nullptr) == ZF_OK);
    }
    REQUIRE(zf_synchronize(opt) == ZF_OK);
  };
  std::vector<float> ref_w(n_w, 0.5f), ref_g(n_w, 0.0f), ref_b(5, 1.0f), ref_gb(5, 0.0f);
  {
    zf_optimizer* ref = nullptr;
    REQUIRE(zf_create("zenflow", conf, &ref) == ZF_OK);
    REQUIRE(zf_add_matrix(ref, ref_w.data(), ref_g.data(), rows, cols, ZF_F32, ZF_F32, ZF_ROW_MAJOR, nullptr) == ZF_OK);
    REQUIRE(zf_add_vector(ref, ref_b.data(), ref_gb.data(), 5, ZF_F32, ZF_F32, nullptr) == ZF_OK);
    REQUIRE(zf_initialize(ref) == ZF_OK);
    train(ref, ref_w, ref_g);
    zf_destroy(ref);
  }
  int failures = 0;
  aligned_failures = 0;
  for (int n = 1;; ++n) {
    CAPTURE(n);
    std::vector<float> w(n_w, 0.5f), g(n_w, 0.0f), b(5, 1.0f), gb(5, 0.0f);
    zf_optimizer* opt = nullptr;
    REQUIRE(zf_create("zenflow", conf, &opt) == ZF_OK);
    REQUIRE(zf_add_matrix(opt, w.data(), g.data(), rows, cols, ZF_F32, ZF_F32, ZF_ROW_MAJOR, nullptr) == ZF_OK);
    REQUIRE(zf_add_vector(opt, b.data(), gb.data(), 5, ZF_F32, ZF_F32, nullptr) == ZF_OK);
    fail_nth = n;
    const zf_status st = zf_initialize(opt);
    const bool met = fail_nth == 0;
    fail_nth = 0;
    if (met) {
      ++failures;
      CHECK(st == ZF_OUT_OF_MEMORY);
      CHECK(zf_step(opt, 1.0f, nullptr) == ZF_INVALID_ARGUMENT);  // not initialized
      REQUIRE(zf_initialize(opt) == ZF_OK);
    } else {
      REQUIRE(st == ZF_OK);
    }
    train(opt, w, g);
    CHECK(w == ref_w);
    CHECK(b == ref_b);
    zf_destroy(opt);
    if (!met) break;
  }
  MESSAGE(failures, " allocations of zf_initialize, ", aligned_failures, " of them host arrays' aligned_alloc");
  CHECK(failures >= 5);
  CHECK(aligned_failures >= 2);  // (the params' masters and moments, at least)
}

TEST_CASE("C API: a save whose allocation fails leaves the previous file, and one that returns ZF_OK the new one") {
  // Each allocation of zf_save failing in turn, over a file holding state A while the optimizer
  // holds state B (a step later): ZF_OUT_OF_MEMORY must leave A at the path, loadable; ZF_OK
  // must mean B is there (a failure it absorbed, the clean-up after the rename, changes
  // nothing). A save that reported a failure after its rename would leave B behind a failure
  // status. The optimizer stays usable throughout. (The file is put back to A before each try.)
  const std::string path = std::string(ZF_TEST_TMP_DIR) + "/c_api_save_oom.zfckpt";
  const char* conf = "{\"topk_ratio\": 0.25, \"update_interval\": 1, \"select_interval\": 2}";
  std::vector<float> w(8 * 16, 0.5f), g(8 * 16, 0.01f), w2(w.size(), 0.0f), g2(g.size(), 0.0f);
  zf_optimizer *opt = nullptr, *other = nullptr;
  REQUIRE(zf_create("zenflow", conf, &opt) == ZF_OK);
  REQUIRE(zf_create("zenflow", conf, &other) == ZF_OK);
  REQUIRE(zf_add_matrix(opt, w.data(), g.data(), 8, 16, ZF_F32, ZF_F32, ZF_ROW_MAJOR, nullptr) == ZF_OK);
  REQUIRE(zf_add_matrix(other, w2.data(), g2.data(), 8, 16, ZF_F32, ZF_F32, ZF_ROW_MAJOR, nullptr) == ZF_OK);
  REQUIRE(zf_initialize(opt) == ZF_OK);
  REQUIRE(zf_initialize(other) == ZF_OK);
  REQUIRE(zf_step(opt, 1.0f, nullptr) == ZF_OK);
  REQUIRE(zf_save(opt, path.c_str()) == ZF_OK);
  const std::vector<float> a = w;
  std::string a_bytes;
  {
    std::ifstream in(path, std::ios::binary);
    a_bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  REQUIRE(zf_step(opt, 1.0f, nullptr) == ZF_OK);
  REQUIRE(zf_synchronize(opt) == ZF_OK);
  const std::vector<float> b = w;
  REQUIRE(a != b);
  int failures = 0, absorbed = 0;
  for (int n = 1;; ++n) {
    CAPTURE(n);
    { std::ofstream(path, std::ios::binary | std::ios::trunc) << a_bytes; }
    fail_nth = n;
    const zf_status st = zf_save(opt, path.c_str());
    const bool met = fail_nth == 0;
    fail_nth = 0;
    REQUIRE(zf_load(other, path.c_str()) == ZF_OK);
    if (st == ZF_OK) {
      CHECK(w2 == b);
      absorbed += met;
    } else {
      CHECK(st == ZF_OUT_OF_MEMORY);
      CHECK(w2 == a);
      ++failures;
    }
    CHECK(zf_synchronize(opt) == ZF_OK);  // usable
    if (!met) break;
  }
  CHECK(failures >= 3);
  MESSAGE(failures, " allocations of a save failed it, ", absorbed, " were absorbed");
  zf_destroy(opt);
  zf_destroy(other);
  std::remove(path.c_str());
}

TEST_CASE("C API: a load whose allocation fails leaves the optimizer as it was, usable; never unusable") {
  // Each allocation of zf_load failing in turn. The file holds a state with a selection made
  // (selected columns on the device side, a host update's accumulator); the optimizer loading it
  // holds another (fresh from initialize: no selection, so nothing of the file's size is
  // allocated yet). A failure must come before the load changes anything (ZF_OUT_OF_MEMORY,
  // params and masters as they were, the optimizer usable), or the load succeeds with the file's
  // state: an allocation failure never leaves it half loaded (ZF_UNUSABLE).
  const std::string path = std::string(ZF_TEST_TMP_DIR) + "/c_api_load_oom.zfckpt";
  const char* conf = "{\"topk_ratio\": 0.25, \"update_interval\": 2, \"select_interval\": 2}";
  std::vector<float> w(8 * 16, 0.5f), g(8 * 16, 0.01f), w2(w.size(), 0.25f), g2(g.size(), 0.0f);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = 0.001f * float(i % 13) - 0.005f;
  zf_optimizer *opt = nullptr, *other = nullptr;
  REQUIRE(zf_create("zenflow", conf, &opt) == ZF_OK);
  REQUIRE(zf_add_matrix(opt, w.data(), g.data(), 8, 16, ZF_F32, ZF_F32, ZF_ROW_MAJOR, nullptr) == ZF_OK);
  REQUIRE(zf_initialize(opt) == ZF_OK);
  for (int s = 0; s < 3; ++s) REQUIRE(zf_step(opt, 1.0f, nullptr) == ZF_OK);  // a selection, a window open
  REQUIRE(zf_save(opt, path.c_str()) == ZF_OK);
  std::vector<float> saved_master(w.size());
  REQUIRE(zf_copy_master(opt, 0, saved_master.data(), saved_master.size()) == ZF_OK);
  const std::vector<float> saved = w;
  int failures = 0;
  for (int n = 1;; ++n) {
    CAPTURE(n);
    REQUIRE(zf_create("zenflow", conf, &other) == ZF_OK);
    REQUIRE(zf_add_matrix(other, w2.data(), g2.data(), 8, 16, ZF_F32, ZF_F32, ZF_ROW_MAJOR, nullptr) == ZF_OK);
    REQUIRE(zf_initialize(other) == ZF_OK);
    std::vector<float> before(w.size()), after(w.size());
    REQUIRE(zf_copy_master(other, 0, before.data(), before.size()) == ZF_OK);
    const std::vector<float> w2_before = w2;
    fail_nth = n;
    const zf_status st = zf_load(other, path.c_str());
    const bool met = fail_nth == 0;
    fail_nth = 0;
    const std::string msg = zf_last_error();
    CHECK_MESSAGE((st == ZF_OK || st == ZF_OUT_OF_MEMORY), "status ", int(st), ": ", msg);
    const zf_status copied = zf_copy_master(other, 0, after.data(), after.size());
    if (st == ZF_OK || st == ZF_OUT_OF_MEMORY) REQUIRE(copied == ZF_OK);
    if (st == ZF_OK) {
      CHECK(w2 == saved);
      CHECK(after == saved_master);
    } else if (st == ZF_OUT_OF_MEMORY) {
      CHECK(w2 == w2_before);
      CHECK(after == before);
      CHECK(zf_step(other, 1.0f, nullptr) == ZF_OK);  // usable
      ++failures;
    }
    zf_destroy(other);
    w2.assign(w.size(), 0.25f);
    if (!met) break;  // (the load needed fewer than n allocations: every one has failed once)
  }
  CHECK(failures >= 3);
  MESSAGE(failures, " allocations of a load failed it");
  zf_destroy(opt);
  std::remove(path.c_str());
}

namespace {
// A Scheduler whose host-update launch fails with a message longer than any string holds inline
// (the optimizer must copy it to keep it), and with no memory left from then on.
struct starving_update : zenflow::synchronous {
  static inline bool fail = false;
  template <class Job>
  void launch(Job&& job) {
    if (fail) {
      std::runtime_error e("the host update lane failed, and then memory ran out as well");
      starve = true;
      throw e;
    }
    zenflow::synchronous::launch(std::forward<Job>(job));
  }
};
}  // namespace

TEST_CASE("a step that fails midway while no memory is left is still marked unusable, with a fixed reason") {
  // The optimizer keeps why it refuses work in a string; where copying the error's message needs
  // memory that cannot be had, it keeps "out of memory" (which needs none) instead: it must never
  // look usable after a step that failed midway.
  using namespace zenflow;
  config cfg;
  cfg.topk_ratio = 0.25;
  cfg.update_interval = interval::every(2);
  cfg.overlap_step = false;
  std::vector<float> w(8 * 16, 0.5f), g(8 * 16, 0.01f);
  optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, starving_update> opt(cfg);
  opt.add_matrix({w.data(), g.data(), 8, 16});
  opt.initialize();
  opt.step();  // t = 1: mid-window
  starving_update::fail = true;
  bool threw = false;
  try {
    opt.step();  // t = 2: the boundary's launch throws
  } catch (const std::runtime_error&) {
    threw = true;
  }
  starve = false;
  starving_update::fail = false;
  REQUIRE(threw);
  CHECK_FALSE(opt.usable());
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("failed midway (out of memory)"), std::logic_error);
}
