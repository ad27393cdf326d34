// bounded_async: the host update of a window runs in the background while the next steps go
// on. Its results must not depend on timing: a deliberately slow host update, the real
// background thread and inline execution give the same bits, all equal to the reference model
// (whose visible values lag a host update by exactly one window), and the slow run shows
// steps proceeding during the update and the wait for it counted as stall.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <zenflow/zenflow.hpp>

#include "compaction_support.hpp"
#include "optimizer_harness.hpp"

using namespace zenflow;
using namespace zf_test;

// The optimizer's scheduler is read-only to its caller: a wait of the caller's own would take a
// background job's error (the job half done) that the optimizer must see to refuse what follows;
// with a mutable accessor, a caller who caught it went on training on a half-applied update.
template <class Opt>
concept scheduler_readable = requires(Opt& o) { o.scheduler().busy(); };
template <class Opt>
concept scheduler_waitable = requires(Opt& o) { o.scheduler().wait(); } || requires(Opt& o) { o.scheduler().wait_offload(); };
static_assert(scheduler_readable<optimizer<>>);
static_assert(!scheduler_waitable<optimizer<>>);
// So is its space: a stream set on it directly would bypass the checks and the communicator's
// stream (initialize(stream) / step(stream, ...) set both).
static_assert(std::is_const_v<std::remove_reference_t<decltype(std::declval<optimizer<>&>().space())>>);

namespace {

// A Scheduler policy of the test's own: bounded_async whose host updates take at least 30 ms
// longer and whose gradient offloads at least 3 ms longer (the trainer meanwhile writes the next
// step's gradients into the same buffers).
using slow_async = late_lanes<30, 3>;

template <class Sched>
using zf_with = optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, Sched>;

scenario overlap_scenario(std::uint64_t seed) {
  scenario sc = random_scenario(seed);
  sc.cfg.overlap_step = true;
  sc.ref.overlap = true;
  sc.steps = 24;
  return sc;
}

}  // namespace

TEST_CASE("bounded_async: the same bits whatever the timing, and one window of staleness at most") {
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    CAPTURE(seed);
    const scenario sc = overlap_scenario(seed);
    std::vector<std::vector<std::vector<float>>> fast, inline_run, slow, slow_ahead;
    {
      zf_with<bounded_async> opt(sc.cfg);
      run_scenario(sc, opt, &fast);  // also checked against the reference at every step
    }
    {
      zf_with<synchronous> opt(sc.cfg);
      run_scenario(sc, opt, &inline_run);
    }
    {
      zf_with<slow_async> opt(sc.cfg);
      run_scenario(sc, opt, &slow);
    }
    {  // the host update's params uploaded ahead, by a job that is late as well
      zf_with<slow_async> opt(sc.cfg);
      opt.transport().upload_ahead(true);
      run_scenario(sc, opt, &slow_ahead);
    }
    REQUIRE(fast == inline_run);
    REQUIRE(fast == slow);
    REQUIRE(fast == slow_ahead);
  }
}

// bounded_async with one lane held at a gate the test opens, for deterministic overlap: the host
// updates (gated_async) or the gradient offloads (gated_offload); the other lane runs as usual.
enum class gated_lane { update, offload };
template <gated_lane Lane>
struct gated : bounded_async {
  static inline std::atomic<bool> open{false};
  template <class Job>
  void launch(Job&& job) {
    if constexpr (Lane == gated_lane::update) bounded_async::launch(held(std::forward<Job>(job)));
    else bounded_async::launch(std::forward<Job>(job));
  }
  template <class Job>
  void launch_offload(Job&& job) {
    if constexpr (Lane == gated_lane::offload) bounded_async::launch_offload(held(std::forward<Job>(job)));
    else bounded_async::launch_offload(std::forward<Job>(job));
  }

 private:
  template <class Job>
  static auto held(Job&& job) {
    return [job = std::forward<Job>(job)]() mutable {
      while (!open.load()) std::this_thread::sleep_for(std::chrono::microseconds(200));
      job();
    };
  }
};
using gated_async = gated<gated_lane::update>;
using gated_offload = gated<gated_lane::offload>;

TEST_CASE("bounded_async: steps proceed while the host update runs; waiting for it is stall") {
  const std::size_t R = 32, C = 64;
  std::vector<float> w(R * C, 0.5f), dw(R * C, 0.01f);
  config cfg;
  cfg.topk_ratio = 0.1;
  cfg.update_interval = interval::every(2);
  cfg.select_interval = interval::every(64);
  gated_async::open = false;
  zf_with<gated_async> opt(cfg);
  opt.add_matrix({w.data(), dw.data(), R, C});
  opt.initialize();
  opt.step();                      // t = 1: selection
  REQUIRE(opt.step().boundary);    // t = 2: the host update is launched, and held at the gate
  // equal scores: ties go to the lower index, so columns 0..5 are selected and the last column
  // is changed by host updates only
  REQUIRE(opt.selected_columns(matrix_id{0}) == std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5});
  const std::size_t last = (C - 1) * R;
  const float before = w[last];
  opt.step();                      // t = 3: returns although the update cannot have run
  CHECK(opt.scheduler().busy());
  CHECK(w[last] == before);        // its result is not visible yet
  // (t = 3 did not wait for the update: the gate opens only below, so a wait would never have
  // returned. It may have waited for t = 2's gradient offload; no bound on that wall time here,
  // on a loaded machine a thread's wake-up may take any time.)
  const double stall_before = opt.stats().stall_seconds;
  std::atomic<bool> calling{false};
  std::thread opener([&calling] {
    while (!calling.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gated_async::open = true;
  });
  calling = true;
  opt.step();                      // t = 4: boundary: waits for the update, then applies it
  opener.join();
  CHECK(w[last] != before);
  // it really waited: the gate opened 50 ms after the call began (less than 5 ms of waiting only
  // if this thread took 45 ms to get from the call to the wait)
  CHECK(opt.stats().stall_seconds - stall_before > 0.005);
  CHECK(opt.stats().host_updates == 2);
  opt.synchronize();
}

TEST_CASE("warm-up's host AdamW runs inline in step(): all of its time is stall, as ZeRO-Offload's is") {
  // W = 3 steps of host AdamW on every column, on the training thread: the device waits for each
  // (no offload or background update yet, so the warm-up is all the stall there is); a larger
  // matrix makes the time well above the clock's resolution
  const std::size_t R = 256, C = 512;
  std::vector<float> w(R * C, 0.5f), dw(R * C, 0.01f);
  config cfg;
  cfg.topk_ratio = 0.1;
  cfg.full_warm_up_rounds = 3;
  optimizer<> opt(cfg);
  opt.add_matrix({w.data(), dw.data(), R, C});
  opt.initialize();
  for (int s = 0; s < 3; ++s) opt.step();
  const optimizer_stats st = opt.stats();
  REQUIRE(st.host_updates == 3);
  CHECK(st.host_update_seconds > 0);
  // the same clock readings, summed once in whole nanoseconds and once in seconds: at most
  // 1 ns a step apart (3 ns), well under the 10 ns allowed
  CHECK(std::abs(st.stall_seconds - st.host_update_seconds) < 1e-8);
}

TEST_CASE("bounded_async: the gradient offload runs behind step(); the grad buffers are free when it returns") {
  const std::size_t R = 32, C = 64;
  auto grads = [&](int t, std::vector<float>& dw) {
    for (std::size_t e = 0; e < dw.size(); ++e) dw[e] = 0.001f * float((e * 7 + std::size_t(t) * 13) % 29) - 0.01f;
  };
  config cfg;
  cfg.topk_ratio = 0.1;
  cfg.update_interval = interval::every(2);
  cfg.select_interval = interval::every(64);
  // reference: everything inline, on the same gradient sequence
  std::vector<float> w_ref(R * C, 0.5f), dw_ref(R * C);
  std::vector<optimizer_stats> ref_stats;  // after each step
  {
    zf_with<synchronous> ref(cfg);
    ref.add_matrix({w_ref.data(), dw_ref.data(), R, C});
    ref.initialize();
    for (int t = 1; t <= 4; ++t) {
      grads(t, dw_ref);
      ref.step();
      ref_stats.push_back(ref.stats());
    }
    ref.synchronize();
  }
  std::vector<float> w(R * C, 0.5f), dw(R * C);
  gated_offload::open = false;
  zf_with<gated_offload> opt(cfg);
  opt.add_matrix({w.data(), dw.data(), R, C});
  opt.initialize();
  grads(1, dw);
  opt.step();                     // t = 1: its offload is launched and held at the gate
  CHECK(opt.scheduler().busy());  // step() returned without the transfer
  // stats() is a snapshot of every step returned so far: the held transfer's bytes count already,
  // as in the inline run, and host updates count when they start
  CHECK(opt.stats().bytes_to_host == ref_stats[0].bytes_to_host);
  CHECK(opt.stats().bytes_to_device == ref_stats[0].bytes_to_device);
  CHECK(opt.stats().host_updates == ref_stats[0].host_updates);
  grads(2, dw);                   // the trainer's next backward overwrites the grads
  std::atomic<bool> calling{false};
  std::thread opener([&calling] {
    while (!calling.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gated_offload::open = true;
  });
  calling = true;
  opt.step();                     // t = 2: must wait for t = 1's offload before compacting its own
  opener.join();
  // that wait is device idle time, and counted (the gate opened 50 ms after the call began)
  CHECK(opt.stats().stall_seconds > 0.005);
  for (int t = 3; t <= 4; ++t) {
    grads(t, dw);
    opt.step();
    CHECK(opt.stats().bytes_to_host == ref_stats[std::size_t(t - 1)].bytes_to_host);
  }
  opt.synchronize();
  CHECK(w == w_ref);  // bit for bit what the inline run computed from the same gradients
}

TEST_CASE("bounded_async: a wait that rethrows a job's error still counts the time it blocked as stall") {
  // The device idles while the training thread waits, whether the job then succeeds or fails.
  // Each job sleeps 200 ms before throwing and the wait starts right after the launch, so the
  // wait blocks for most of that: more than 100 ms unless the test thread is descheduled for
  // longer than 100 ms between the two calls. A wait that dropped its time on the throw counts 0.
  bounded_async s;
  s.launch_offload([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    throw std::runtime_error("offload failed");
  });
  CHECK_THROWS_WITH(s.wait_offload(), "offload failed");
  const double after_offload = s.stall_seconds();
  CHECK(after_offload > 0.1);
  s.launch([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    throw std::runtime_error("update failed");
  });
  CHECK_THROWS_WITH(s.wait(), "update failed");
  CHECK(s.stall_seconds() - after_offload > 0.1);
  s.wait();  // the error was taken by the first wait: nothing in flight, nothing held
  s.wait_offload();
  CHECK(!s.busy());
}

TEST_CASE("bounded_async: a failed job's error is kept for its wait, not taken or overwritten by a new job") {
  // A job launched while the last one's error waits would either have that error thrown at its
  // own wait (a success reported as a failure) or, failing too, overwrite it (the first cause
  // lost): the launch is refused instead, and the wait then throws the first error.
  bounded_async s;
  s.launch_offload([] { throw std::runtime_error("first offload failed"); });
  CHECK_FALSE(s.wait_offload_quiet());  // done, its error held
  CHECK_THROWS_WITH_AS(s.launch_offload([] { throw std::runtime_error("second"); }),
                       doctest::Contains("failed and its error has not been waited for"), std::logic_error);
  CHECK_THROWS_WITH(s.wait_offload(), "first offload failed");
  s.launch_offload([] {});  // taken: a new job is accepted
  CHECK_NOTHROW(s.wait_offload());
  s.launch([] { throw std::runtime_error("update failed"); });
  while (s.busy()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK_THROWS_AS(s.launch([] {}), std::logic_error);
  CHECK_THROWS_WITH(s.wait(), "update failed");
  s.launch([] {});
  CHECK_NOTHROW(s.wait());
}

TEST_CASE("bounded_async: a host job's wait for the offloads ends with those launched before it") {
  // The window's host update waits (wait_offload_quiet) for the window's last offload. The
  // training thread, blocked on that offload as well, may launch the next step's offload before
  // the update's thread runs again; a wait for "no offload in flight" then waited for that one
  // too, and at a slow link for the next, and so on. Here offload 1 is held while a host job
  // waits; then it finishes and the training thread, waiting as well, launches offload 2, held
  // at its own gate: the job's wait must end without it. (A wait for the idle lane fails this
  // when the training thread relaunches before the job's thread wakes; often, not always.)
  bounded_async s;
  std::atomic<bool> gate1{false}, gate2{false}, job_done{false}, quiet_ok{false};
  s.launch_offload([&] {
    while (!gate1.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  });
  s.launch([&] {
    quiet_ok = s.wait_offload_quiet();  // offload 1, not offload 2
    job_done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // (the job is waiting by now)
  gate1 = true;
  s.wait_offload();  // the training thread's wait for offload 1
  s.launch_offload([&] {
    while (!gate2.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!job_done.load() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(job_done.load());  // while offload 2 is still held
  CHECK(quiet_ok.load());
  CHECK(s.offload_busy());
  gate2 = true;
  s.wait();
  s.wait_offload();
  // a job that starts after an offload was launched waits for that one
  std::atomic<bool> gate3{false};
  s.launch_offload([&] {
    while (!gate3.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  });
  std::atomic<bool> waited{false};
  s.launch([&] {
    s.wait_offload_quiet();
    waited = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(waited.load());
  gate3 = true;
  s.wait();
  CHECK(waited.load());
  s.wait_offload();
}

TEST_CASE("bounded_async: a host update waits for the offloads launched before it was, even when its thread starts late") {
  // The window's update is launched after the window's last offload; its thread may start only
  // after the training thread has launched the next step's offload (a busy box). Its wait must
  // still end with the window's offload — not wait for the next one (a stall the device sees,
  // at the next boundary's drain) nor take that one's failure for its window's (an update
  // skipped though its window's accumulation was whole). The update's late start is a gate at
  // its first statement. (Both failed when the offloads to wait for were counted when the
  // update's thread called the wait.)
  for (const bool next_fails : {false, true}) {
    CAPTURE(next_fails);
    bounded_async s;
    std::atomic<bool> start{false}, gate2{false}, job_done{false}, quiet_ok{false};
    s.launch_offload([] {});  // the window's last offload
    s.launch([&] {            // the window's update
      while (!start.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
      quiet_ok = s.wait_offload_quiet();
      job_done = true;
    });
    s.wait_offload();  // the next step: its wait for the window's offload, then its own offload
    if (next_fails)
      s.launch_offload([] { throw std::runtime_error("next offload failed"); });
    else
      s.launch_offload([&] {
        while (!gate2.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
      });
    if (next_fails)
      while (s.offload_busy()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    start = true;  // the update's thread starts now
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!job_done.load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(job_done.load());  // (with the next offload still held, when it is held)
    CHECK(quiet_ok.load());  // the window's offload succeeded
    gate2 = true;
    s.wait();
    if (next_fails) CHECK_THROWS_WITH(s.wait_offload(), "next offload failed");  // held for the training thread
    else s.wait_offload();
  }
  // from another thread than the update's, a wait covers the offloads launched before the call
  bounded_async s;
  std::atomic<bool> gate{false};
  s.launch_offload([&] {
    while (!gate.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    throw std::runtime_error("offload failed");
  });
  std::atomic<bool> returned{false}, result{true};
  std::thread other([&] {
    result = s.wait_offload_quiet();
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(returned.load());
  gate = true;
  other.join();
  CHECK_FALSE(result.load());
  CHECK_THROWS_WITH(s.wait_offload(), "offload failed");
}

TEST_CASE("synchronous: a job that throws still counts its time as stall") {
  synchronous s;
  CHECK_THROWS_WITH(s.launch([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    throw std::runtime_error("update failed");
  }),
                    "update failed");
  CHECK(s.stall_seconds() > 0.04);  // (it slept 50 ms; the clock cannot run slow)
}

namespace {
// host_copy whose transfers take 5 ms each more (the link), counted
struct slow_link : host_copy {
  inline static std::atomic<int> transfers{0};
  static void pause() {
    ++transfers;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  void to_host(void* d, const void* s, std::size_t n) {
    pause();
    host_copy::to_host(d, s, n);
  }
  void to_device(void* d, const void* s, std::size_t n) {
    pause();
    host_copy::to_device(d, s, n);
  }
  template <class Fill>
  void fill_to_device(void* d, std::size_t n, Fill&& fill) {
    pause();
    host_copy::fill_to_device(d, n, std::forward<Fill>(fill));
  }
};
}  // namespace

TEST_CASE("warm-up and ZeRO-Offload count the same region as stall and host update: the host AdamW, not the transfers") {
  // Over a link that takes 5 ms a transfer, the transfers are most of a warm-up step's time;
  // stall_seconds and host_update_seconds are both the host AdamW's alone, in the warm-up as in
  // zero_offload's synchronous update: equal to each other, and well under the link's time.
  const std::size_t R = 64, C = 96;
  auto run = [&](const config& cfg, int steps) {
    std::vector<float> w(R * C, 0.5f), dw(R * C, 0.01f);
    optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, slow_link, synchronous> opt(cfg);
    opt.add_matrix({w.data(), dw.data(), R, C});
    opt.initialize();
    slow_link::transfers = 0;
    for (int t = 0; t < steps; ++t) opt.step();
    return opt.stats();
  };
  config warm;
  warm.topk_ratio = 0.1;
  warm.full_warm_up_rounds = 3;
  warm.overlap_step = false;
  const optimizer_stats a = run(warm, 3);
  const int warm_transfers = slow_link::transfers;
  config zo = warm;
  zo.topk_ratio = 0;
  zo.full_warm_up_rounds = 0;
  zo.update_interval = interval::every(1);
  zo.select_interval = interval::every(1);
  const optimizer_stats b = run(zo, 3);
  const int zo_transfers = slow_link::transfers;
  REQUIRE(a.host_updates == 3);
  REQUIRE(b.host_updates == 3);
  REQUIRE(warm_transfers >= 6);  // (each step: its gradients down, its params up)
  REQUIRE(zo_transfers >= 6);
  CHECK(a.host_update_seconds > 0);
  // the warm-up: one clock reading pair per matrix, summed once in nanoseconds and once in
  // seconds (at most 1 ns apart a step)
  CHECK(std::abs(a.stall_seconds - a.host_update_seconds) < 1e-8);
  // the link's 5 ms a transfer counted in neither (the AdamW of 6,144 elements takes well under
  // 1 ms a step here; half the link's time leaves room for a slow machine)
  CHECK(a.stall_seconds < 0.5 * 0.005 * warm_transfers);
  CHECK(b.stall_seconds < 0.5 * 0.005 * zo_transfers);
  // zero_offload's stall is its update job (the update and the job's own few instructions)
  CHECK(b.stall_seconds >= b.host_update_seconds);
}

TEST_CASE("copy_params_synchronized: what synchronize() would show, without changing the run") {
  // Three identical overlapped runs: A reads its params "as synchronized" mid-window, B calls
  // synchronize() at the same point and reads its params, C does neither. A's copy equals B's
  // params; A ends bit-identical to C (B does not have to: its update landed a window early).
  const std::size_t R1 = 8, C1 = 20, R2 = 6, C2 = 10;
  struct run {
    std::vector<bfloat16> w1, g1;  // row-major bf16
    std::vector<float> w2, g2;     // column-contiguous fp32
    optimizer<> opt;
    explicit run(const config& cfg) : w1(R1 * C1), g1(R1 * C1), w2(R2 * C2), g2(R2 * C2), opt(cfg) {
      for (std::size_t i = 0; i < w1.size(); ++i) w1[i] = bfloat16(0.01f * float(i % 13));
      for (std::size_t i = 0; i < w2.size(); ++i) w2[i] = 0.02f * float(i % 7);
      opt.add_matrix(zenflow::matrix(w1.data(), g1.data(), rows{R1}, cols{C1}).row_major().dtypes(dtype::bf16, dtype::bf16));
      opt.add_matrix(zenflow::matrix(w2.data(), g2.data(), rows{R2}, cols{C2}));
      opt.initialize();
    }
    void step(int t) {
      for (std::size_t i = 0; i < g1.size(); ++i) g1[i] = bfloat16(std::sin(float(i * 3 + std::size_t(t))) * 0.01f);
      for (std::size_t i = 0; i < g2.size(); ++i) g2[i] = std::cos(float(i + std::size_t(t) * 5)) * 0.01f;
      opt.step();
    }
  };
  config cfg;
  cfg.topk_ratio = 0.2;
  cfg.update_interval = interval::every(2);
  cfg.select_interval = interval::every(4);
  cfg.overlap_step = true;
  run a(cfg), b(cfg), c(cfg);
  for (int t = 0; t < 7; ++t) {  // t = 7 applied steps: a boundary at 6 left its update in flight
    a.step(t);
    b.step(t);
    c.step(t);
  }
  std::vector<bfloat16> s1(R1 * C1);
  std::vector<float> s2(R2 * C2);
  const std::vector<bfloat16> visible1 = a.w1;
  a.opt.copy_params_synchronized(matrix_id{0}, s1.data());
  a.opt.copy_params_synchronized(matrix_id{1}, s2.data());
  CHECK(std::memcmp(a.w1.data(), visible1.data(), 2 * s1.size()) == 0);  // nothing was applied to A's params
  b.opt.synchronize();
  CHECK(std::memcmp(s1.data(), b.w1.data(), 2 * s1.size()) == 0);
  CHECK(s2 == b.w2);
  CHECK(std::memcmp(s1.data(), visible1.data(), 2 * s1.size()) != 0);  // an update really was in flight
  for (int t = 7; t < 15; ++t) {
    a.step(t);
    c.step(t);
  }
  a.opt.synchronize();
  c.opt.synchronize();
  CHECK(std::memcmp(a.w1.data(), c.w1.data(), 2 * a.w1.size()) == 0);
  CHECK(a.w2 == c.w2);
}

static_assert(compacting_updater<fused_adamw<host_space>, host_space> && offload_aware_scheduler<bounded_async> &&
              !offload_aware_scheduler<synchronous>);

namespace {
using counted = zf_test::counting_updater<>;
template <class Sched>
using zf_counted = optimizer<host_space, column_topk, counted, simd_accumulator, host_copy, Sched>;
}  // namespace

// The offload's compaction fused into the gradient pass (compaction_support.hpp's policies make
// the choice deterministic): with the lane idle at every step, every step that can fuse does,
// checked against the reference model at every step; with the lane reported busy, none does; the
// two runs are bit-identical.
TEST_CASE("the offload's compaction fused into the gradient pass: the reference's bits, the same as compacting after the update") {
  int fused_somewhere = 0;
  for (std::uint64_t seed = 1; seed <= 16; ++seed) {
    CAPTURE(seed);
    const scenario sc = overlap_scenario(seed);
    std::vector<std::vector<std::vector<float>>> fused, after;
    counted::compacting = counted::plain = 0;
    {
      zf_counted<lane_idle> opt(sc.cfg);
      run_scenario(sc, opt, &fused);  // against the reference model at every step
    }
    const int compacting = counted::compacting;
    CHECK(compacting + counted::plain == sc.steps);
    // every step that neither warms up nor selects, once the unselected columns fit the buffer
    // (after the first selection; from the start with topk 0), fuses: in these 16 scenarios 10
    // to 24 of the 24 steps
    fused_somewhere += compacting > 0;
    counted::compacting = counted::plain = 0;
    {
      zf_counted<lane_busy> opt(sc.cfg);
      run_scenario(sc, opt, &after);
    }
    CHECK(counted::compacting == 0);
    REQUIRE(fused == after);
  }
  CHECK(fused_somewhere == 16);
}
