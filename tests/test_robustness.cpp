// Calls that must not poison the optimizer's state: a grad_scale whose reciprocal overflows, an
// error an earlier call left on the thread, a finite gradient that overflows once unscaled, a
// step that fails midway, impossible sizes, and
// concurrent saves to one path. Each case checks the state against a run without the bad call
// (the same bits) or checks that the optimizer refuses further work with a clear error.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <zenflow/zenflow.hpp>

#include "error_slot_space.hpp"

using namespace zenflow;
namespace json = zenflow::detail::json;

namespace {

constexpr std::size_t R = 8, C = 24;

config small_config(bool overlap) {
  config cfg;
  cfg.topk_ratio = 0.25;
  cfg.update_interval = interval::every(2);
  cfg.select_interval = interval::every(4);
  cfg.overlap_step = overlap;
  return cfg;
}

void gradients(std::vector<float>& dw, int s) {
  for (std::size_t i = 0; i < dw.size(); ++i) dw[i] = std::sin(float(i * 3 + std::size_t(s))) * 0.01f;
}

// The params and fp32 masters after `steps` good steps, with `bad(opt, dw)` called after the
// third one (it must leave no trace).
template <class Opt = optimizer<>, class Bad>
std::pair<std::vector<float>, std::vector<float>> run(bool overlap, int steps, Bad&& bad) {
  std::vector<float> w(R * C, 0.25f), dw(R * C);
  Opt opt(small_config(overlap));
  opt.add_matrix({w.data(), dw.data(), R, C});
  opt.initialize();
  for (int s = 0; s < steps; ++s) {
    gradients(dw, s);
    CHECK_FALSE(opt.step(2.0f).skipped);
    if (s == 2) {
      bad(opt, dw);
      gradients(dw, s + 1000);  // whatever the bad call left in the grads is overwritten anyway
    }
  }
  opt.synchronize();
  std::vector<float> master(R * C);
  opt.copy_master(matrix_id{0}, master.data());
  CHECK(opt.stats().steps == opt.applied_steps() + opt.stats().skipped_steps);
  return {w, master};
}

}  // namespace

TEST_CASE("a grad_scale whose reciprocal overflows fp32 is refused before anything changes") {
  for (bool overlap : {false, true}) {
    CAPTURE(overlap);
    const auto ref = run(overlap, 8, [](optimizer<>&, std::vector<float>&) {});
    const auto got = run(overlap, 8, [](optimizer<>& opt, std::vector<float>&) {
      const auto before = opt.stats().steps;
      // 1e-40f is a finite positive denormal: 1 / 1e-40 = 1e40 is not an fp32 number
      CHECK_THROWS_WITH_AS(opt.step(1e-40f),
                           doctest::Contains("is too small: 1 / grad_scale overflows fp32"), std::invalid_argument);
      CHECK(opt.stats().steps == before);
    });
    CHECK(ref == got);
  }
}

TEST_CASE("an error an earlier call left on the thread is refused before anything changes, until it is cleared") {
  // (CUDA's last-error slot: zenflow's launch checks would read the trainer's unchecked error as
  // their own kernel's failure; error_slot_space plays that slot on the host)
  using zf_test::error_slot_space;
  using slot_optimizer =
      optimizer<error_slot_space, column_topk, fused_adamw<error_slot_space>, simd_accumulator, host_copy, bounded_async>;
  for (bool overlap : {false, true}) {
    CAPTURE(overlap);
    const auto ref = run(overlap, 8, [](optimizer<>&, std::vector<float>&) {});
    const auto got = run<slot_optimizer>(overlap, 8, [](slot_optimizer& opt, std::vector<float>&) {
      const auto before = opt.stats();
      error_slot_space::left = 7;
      for (int i = 0; i < 2; ++i)  // refused as long as the error stays, usable all along
        CHECK_THROWS_WITH_AS(opt.step(2.0f), "step(): error 7 left by an earlier call", std::runtime_error);
      // every entry point that launches device work looks first (a load does not even open the file)
      std::vector<float> out(R * C);
      CHECK_THROWS_WITH_AS(opt.synchronize(), "synchronize(): error 7 left by an earlier call", std::runtime_error);
      CHECK_THROWS_WITH_AS(opt.save(std::string(ZF_TEST_TMP_DIR) + "/never-written.zfck"),
                           "save(): error 7 left by an earlier call", std::runtime_error);
      CHECK_THROWS_WITH_AS(opt.load(std::string(ZF_TEST_TMP_DIR) + "/no-such-file.zfck"),
                           "load(): error 7 left by an earlier call", std::runtime_error);
      CHECK_THROWS_WITH_AS(opt.copy_master(matrix_id{0}, out.data()), "copy_master(): error 7 left by an earlier call",
                           std::runtime_error);
      CHECK_THROWS_WITH_AS(opt.column_counts(matrix_id{0}), "column_counts(): error 7 left by an earlier call",
                           std::runtime_error);
      CHECK_THROWS_WITH_AS(opt.copy_params_synchronized(matrix_id{0}, out.data()),
                           "copy_params_synchronized(): error 7 left by an earlier call", std::runtime_error);
      error_slot_space::left = 0;
      std::FILE* f = std::fopen((std::string(ZF_TEST_TMP_DIR) + "/never-written.zfck").c_str(), "rb");
      CHECK(f == nullptr);
      if (f) std::fclose(f);
      CHECK(opt.stats().steps == before.steps);
      CHECK(opt.stats().skipped_steps == before.skipped_steps);
    });
    CHECK(ref == got);  // the run goes on as one without the refused calls, bit for bit
  }
  // initialize(): refused, nothing built; once cleared it initialises
  std::vector<float> w(R * C, 0.25f), dw(R * C);
  slot_optimizer opt(small_config(false));
  opt.add_matrix({w.data(), dw.data(), R, C});
  error_slot_space::left = 3;
  CHECK_THROWS_WITH_AS(opt.initialize(), "initialize(): error 3 left by an earlier call", std::runtime_error);
  CHECK_FALSE(opt.initialized());
  error_slot_space::left = 0;
  opt.initialize();
  CHECK(opt.initialized());
}

TEST_CASE("a finite gradient that overflows once unscaled skips the step and changes nothing") {
  for (bool overlap : {false, true}) {
    CAPTURE(overlap);
    const auto ref = run(overlap, 8, [](optimizer<>&, std::vector<float>&) {});
    const auto got = run(overlap, 8, [](optimizer<>& opt, std::vector<float>& dw) {
      // every value finite (1e10), but 1e10 / 1e-30 = 1e40 is not an fp32 number
      for (float& x : dw) x = 1e10f;
      const auto before = opt.stats();
      const auto applied = opt.applied_steps();
      const step_info info = opt.step(1e-30f);
      CHECK(info.skipped);
      CHECK(opt.stats().skipped_steps == before.skipped_steps + 1);
      CHECK(opt.applied_steps() == applied);
    });
    CHECK(ref == got);
  }
  // The guarantee is the norm's: ||g|| * factor < FLT_MAX bounds every |g_i| * factor. A large
  // gradient that fits is applied.
  std::vector<float> w(R * C, 0.25f), dw(R * C, 1e15f);
  optimizer<> opt(small_config(false));
  opt.add_matrix({w.data(), dw.data(), R, C});
  opt.initialize();
  CHECK_FALSE(opt.step(1.0f).skipped);
  for (float x : w) CHECK(std::isfinite(x));
}

TEST_CASE("a gradient whose square would overflow fp32 is skipped: no column's v becomes infinite") {
  // Without the bound, one element of 1e20 (finite, and finite times the factor) makes g^2 = inf,
  // so v = inf and m / sqrt(v) = 0 for that column forever: it would silently stop training.
  for (bool overlap : {false, true}) {
    CAPTURE(overlap);
    const auto ref = run(overlap, 8, [](optimizer<>&, std::vector<float>&) {});
    const auto got = run(overlap, 8, [](optimizer<>& opt, std::vector<float>& dw) {
      dw[5 * R + 3] = 2e20f;  // unscaled by grad_scale 2: 1e20 > 2^63 ~ 9.2e18
      const auto before = opt.stats();
      CHECK(opt.step(2.0f).skipped);
      CHECK(opt.stats().skipped_steps == before.skipped_steps + 1);
    });
    CHECK(ref == got);  // the same bits as a run that never saw it
  }
  // Just below the bound it is applied, and every second moment stays finite: the column keeps
  // training (its next steps move it).
  for (bool overlap : {false, true}) {
    CAPTURE(overlap);
    std::vector<float> w(R * C, 0.25f), dw(R * C, 0.0f);
    optimizer<> opt(small_config(overlap));
    opt.add_matrix({w.data(), dw.data(), R, C});
    opt.initialize();
    const std::size_t col = 5;
    dw[col * R + 3] = 9.0e18f;  // ||g|| = 9e18 <= 2^63
    CHECK_FALSE(opt.step().skipped);
    for (int s = 0; s < 6; ++s) {
      gradients(dw, s);
      CHECK_FALSE(opt.step().skipped);
    }
    opt.synchronize();
    std::vector<float> v(R * C), m1(R * C), m2(R * C);
    opt.copy_exp_avg_sq(matrix_id{0}, v.data());
    for (float x : v) CHECK(std::isfinite(x));
    opt.copy_master(matrix_id{0}, m1.data());
    for (int s = 0; s < 4; ++s) {
      gradients(dw, s + 50);
      opt.step();
    }
    opt.synchronize();
    opt.copy_master(matrix_id{0}, m2.data());
    CHECK(m1[col * R + 3] != m2[col * R + 3]);  // not frozen
  }
}

TEST_CASE("host_gradient = sum: the skip bound is 2^63 / U, so a window's sum squared stays finite") {
  // U = 2 (small_config). A host update applies the sum of the window's two gradients: each step
  // may carry at most 2^62 (~4.6e18), and a sum of two is then <= 2^63, whose square is finite.
  // On a column left on the host by the first selection: a step of 9e18 fits the mean's bound
  // (2^63) but not the sum's, so it is skipped with the sum and applied with the mean; steps of
  // 4.5e18 on the same element are applied, and v stays finite (and holds them: > 1e30).
  for (bool overlap : {false, true}) {
    CAPTURE(overlap);
    for (auto mode : {window_gradient::mean, window_gradient::sum}) {
      CAPTURE(int(mode));
      std::vector<float> w(R * C, 0.25f), dw(R * C, 0.0f);
      config cfg = small_config(overlap);
      cfg.host_gradient = mode;
      optimizer<> opt(cfg);
      opt.add_matrix({w.data(), dw.data(), R, C});
      opt.initialize();
      gradients(dw, 0);
      REQUIRE_FALSE(opt.step().skipped);  // t = 1: the selection
      const auto sel = opt.selected_columns(matrix_id{0});
      std::uint32_t col = 0;
      while (std::find(sel.begin(), sel.end(), col) != sel.end()) ++col;
      gradients(dw, 1);
      dw[col * R + 3] = 9.0e18f;
      CHECK(opt.step().skipped == (mode == window_gradient::sum));
      for (int s = 2; s < 5; ++s) {  // up to t = 4 (a boundary) or t = 5 (the next selection)
        gradients(dw, s);
        dw[col * R + 3] = 4.5e18f;  // <= 2^62 ~ 4.61e18
        CHECK_FALSE(opt.step().skipped);
      }
      opt.synchronize();
      std::vector<float> v(R * C);
      opt.copy_exp_avg_sq(matrix_id{0}, v.data());
      for (float x : v) CHECK(std::isfinite(x));
      CHECK(v[col * R + 3] > 1e30f);
    }
  }
  config auto_sum;
  auto_sum.update_interval = interval::auto_();
  auto_sum.host_gradient = window_gradient::sum;
  CHECK_THROWS_WITH_AS(auto_sum.validate(),
                       "zenflow config: host_gradient = sum needs an integer update_interval (not \"auto\"), got sum",
                       config_error);
}

namespace {
// A Scheduler whose host update fails: a step that reaches a boundary throws midway.
struct failing_update : synchronous {
  static inline bool fail = false;
  template <class Job>
  void launch(Job&& job) {
    if (fail) throw std::runtime_error("host update lane failed");
    synchronous::launch(std::forward<Job>(job));
  }
};
}  // namespace

TEST_CASE("a step that fails midway refuses further steps and saves until a checkpoint is loaded") {
  std::vector<float> w(R * C, 0.25f), dw(R * C);
  optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, failing_update> opt(
      small_config(false));
  opt.add_matrix({w.data(), dw.data(), R, C});
  opt.initialize();
  const std::string good = std::string(ZF_TEST_TMP_DIR) + "/midway-good.zfck";
  const std::string after = std::string(ZF_TEST_TMP_DIR) + "/midway-after.zfck";
  failing_update::fail = false;
  gradients(dw, 0);
  opt.step();  // t = 1: selection, mid-window
  opt.save(good);
  gradients(dw, 1);
  failing_update::fail = true;
  CHECK_THROWS_WITH_AS(opt.step(), "host update lane failed", std::runtime_error);  // t = 2: boundary
  failing_update::fail = false;
  // the state may be half-changed: no step, no checkpoint of it
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("failed midway (host update lane failed)"), std::logic_error);
  CHECK_THROWS_WITH_AS(opt.save(after), doctest::Contains("load a checkpoint to go on"), std::logic_error);
  CHECK_THROWS_AS(opt.synchronize(), std::logic_error);
  std::FILE* f = std::fopen(after.c_str(), "rb");
  CHECK(f == nullptr);  // nothing was written
  if (f) std::fclose(f);
  // loading a checkpoint makes it usable again, and the run goes on as one that never failed
  opt.load(good);
  gradients(dw, 1);
  CHECK_FALSE(opt.step().skipped);
  opt.synchronize();
  std::vector<float> w_ref(R * C, 0.25f), dw_ref(R * C);
  optimizer<> ref(small_config(false));
  ref.add_matrix({w_ref.data(), dw_ref.data(), R, C});
  ref.initialize();
  for (int s = 0; s < 2; ++s) {
    gradients(dw_ref, s);
    ref.step();
  }
  ref.synchronize();
  CHECK(w == w_ref);
  std::remove(good.c_str());
}

namespace {
// A Scheduler whose background host update fails: the failure surfaces in a later step, at the
// boundary that waits for it.
struct failing_async : bounded_async {
  static inline bool fail = false;
  template <class Job>
  void launch(Job&& job) {
    if (fail) bounded_async::launch([] { throw std::runtime_error("background host update failed"); });
    else bounded_async::launch(std::forward<Job>(job));
  }
};
}  // namespace

TEST_CASE("a background job that failed makes the optimizer refuse further work until a load") {
  std::vector<float> w(R * C, 0.25f), dw(R * C);
  optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, failing_async> opt(
      small_config(true));
  opt.add_matrix({w.data(), dw.data(), R, C});
  opt.initialize();
  const std::string good = std::string(ZF_TEST_TMP_DIR) + "/background-good.zfck";
  failing_async::fail = false;
  gradients(dw, 0);
  opt.step();  // t = 1
  opt.save(good);
  failing_async::fail = true;
  gradients(dw, 1);
  opt.step();  // t = 2: boundary: the failing update runs in the background; step() returns
  failing_async::fail = false;
  bool surfaced = false;
  for (int s = 2; s < 6 && !surfaced; ++s) {  // the next boundary (t = 4) waits for it at the latest
    gradients(dw, s);
    try {
      opt.step();
    } catch (const std::runtime_error& e) {
      surfaced = std::string(e.what()) == "background host update failed";
    }
  }
  CHECK(surfaced);
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("failed midway (background host update failed)"),
                       std::logic_error);
  CHECK_THROWS_AS(opt.save(good + ".after"), std::logic_error);
  opt.load(good);
  gradients(dw, 1);
  CHECK_NOTHROW(opt.step());
  std::remove(good.c_str());
}

namespace {
// A Scheduler whose next gradient offload, once armed, fails after a pause: long enough for the
// window's host update, launched behind it at a boundary, to be waiting for it.
struct failing_offload : bounded_async {
  static inline bool armed = false, fired = false;
  template <class Job>
  void launch_offload(Job&& job) {
    if (armed) {
      armed = false;
      fired = true;
      bounded_async::launch_offload([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        throw std::runtime_error("gradient offload failed");
      });
    } else {
      bounded_async::launch_offload(std::forward<Job>(job));
    }
  }
};
using failing_offload_optimizer =
    optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, failing_offload>;
}  // namespace

TEST_CASE("a failed offload fails the very next step, even with the host update waiting on it") {
  // The boundary at t = 2 launches the step's offload (which fails) and the window's host update,
  // whose first act is to wait for that offload. The update must leave the error to the training
  // thread (before, it took it and threw it on its own lane, so that the next step succeeded
  // and the failure surfaced only a window later) and must not update on a window short of its
  // last step. Then the optimizer refuses work until a load; destroying one right after such a
  // failure waits for both lanes (before, a failed offload wait skipped the update lane's).
  std::vector<float> w(R * C, 0.25f), dw(R * C);
  const std::string good = std::string(ZF_TEST_TMP_DIR) + "/offload-good.zfck";
  {
    failing_offload_optimizer opt(small_config(true));
    opt.add_matrix({w.data(), dw.data(), R, C});
    opt.initialize();
    gradients(dw, 0);
    opt.step();  // t = 1: selection
    opt.save(good);
    gradients(dw, 1);
    failing_offload::armed = true;
    failing_offload::fired = false;
    CHECK_NOTHROW(opt.step());  // t = 2: boundary; the offload runs (and fails) in the background
    CHECK(failing_offload::fired);
    gradients(dw, 2);
    // (the offload has failed by now and the update, waiting for it, has seen that first)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK_THROWS_WITH_AS(opt.step(), "gradient offload failed", std::runtime_error);  // t = 3
    CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("failed midway (gradient offload failed)"), std::logic_error);
    CHECK_THROWS_AS(opt.synchronize(), std::logic_error);
    // a load makes it usable again; the run goes on as one that never failed
    opt.load(good);
    for (int s = 1; s < 4; ++s) {
      gradients(dw, s);
      CHECK_FALSE(opt.step().skipped);
    }
    opt.synchronize();
    std::vector<float> w_ref(R * C, 0.25f), dw_ref(R * C);
    optimizer<> ref(small_config(true));
    ref.add_matrix({w_ref.data(), dw_ref.data(), R, C});
    ref.initialize();
    for (int s = 0; s < 4; ++s) {
      gradients(dw_ref, s);
      ref.step();
    }
    ref.synchronize();
    CHECK(w == w_ref);
  }
  {  // destroyed while the failing offload is still running and the host update waits for it
    failing_offload_optimizer opt(small_config(true));
    opt.add_matrix({w.data(), dw.data(), R, C});
    opt.initialize();
    gradients(dw, 0);
    opt.step();
    gradients(dw, 1);
    failing_offload::armed = true;
    failing_offload::fired = false;
    opt.step();
    CHECK(failing_offload::fired);  // (the failing offload is in flight as the optimizer goes)
  }  // (the destructor swallows the error; ASan and TSan see no job outliving the optimizer)
  std::remove(good.c_str());
}

TEST_CASE("a failed offload fails the next step when that step is skipped too") {
  // A loss scaler's overflow makes several skipped steps in a row: the error of an offload that
  // failed before them is thrown by the first, as by an applied step, not held until one is
  // applied (or a save). Then the optimizer refuses work.
  std::vector<float> w(R * C, 0.25f), dw(R * C);
  failing_offload_optimizer opt(small_config(true));
  opt.add_matrix({w.data(), dw.data(), R, C});
  opt.initialize();
  gradients(dw, 0);
  opt.step();  // t = 1: selection
  gradients(dw, 1);
  failing_offload::armed = true;
  failing_offload::fired = false;
  CHECK_NOTHROW(opt.step());  // t = 2: the offload runs (and fails) in the background
  CHECK(failing_offload::fired);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // (it has failed by now)
  dw[3] = std::numeric_limits<float>::infinity();  // an overflowed gradient: a skipped step
  CHECK_THROWS_WITH_AS(opt.step(), "gradient offload failed", std::runtime_error);
  CHECK_FALSE(opt.usable());
  CHECK_THROWS_AS(opt.step(), std::logic_error);
}

TEST_CASE("a param that is not finite at initialize() is named by step(), which refuses it until a load") {
  // A master taken from a NaN or an infinity would never become finite again, and no checkpoint
  // of the state could be saved or loaded (save and load refuse non-finite masters). initialize()
  // accepts it (a resume may initialize() over params that hold nothing yet, then load()), but
  // step() refuses to train it, naming where it was (row and column of the matrix whatever its
  // layout; a vector's element), with nothing changed, until a load replaces the masters; then
  // the run goes on as one that never saw it. Paths: a host-updated matrix of each dtype (its
  // master from the columns that come down), every column on the device from the start
  // (topk_ratio 1, no warm-up: an fp32 param, its own master, read back; a bf16 one converted),
  // vectors.
  constexpr std::size_t rows = 8, cols = 16;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::string path = std::string(ZF_TEST_TMP_DIR) + "/unfit_params.zfckpt";
  struct model {
    std::vector<float> w0 = std::vector<float>(rows * cols), g0 = std::vector<float>(rows * cols);
    std::vector<bfloat16> w1 = std::vector<bfloat16>(rows * cols), g1 = std::vector<bfloat16>(rows * cols);
    std::vector<float16> w2 = std::vector<float16>(rows * cols), g2 = std::vector<float16>(rows * cols);
    std::vector<float> b0 = std::vector<float>(5), gb0 = std::vector<float>(5);
    std::vector<bfloat16> b1 = std::vector<bfloat16>(7), gb1 = std::vector<bfloat16>(7);
    model() {
      for (std::size_t k = 0; k < rows * cols; ++k) {
        const float x = 0.25f + 0.01f * float(k % 13), g = 0.001f * float(int(k % 7) - 3) + 0.0005f * float(k % 11);
        w0[k] = x;
        w1[k] = to_bfloat16(x);
        w2[k] = to_float16(x);
        g0[k] = g;
        g1[k] = to_bfloat16(g);
        g2[k] = to_float16(g);
      }
      for (std::size_t k = 0; k < 5; ++k) b0[k] = 0.1f * float(k), gb0[k] = 0.01f;
      for (std::size_t k = 0; k < 7; ++k) b1[k] = to_bfloat16(0.2f * float(k)), gb1[k] = to_bfloat16(-0.01f);
    }
    void add_to(optimizer<>& o, bool first_row_major) {
      const matrix_param m0 = matrix(w0.data(), g0.data(), zenflow::rows{rows}, zenflow::cols{cols});
      o.add_matrix(first_row_major ? m0.row_major() : m0);
      o.add_matrix(matrix(w1.data(), g1.data(), zenflow::rows{rows}, zenflow::cols{cols}).row_major().dtypes(dtype::bf16, dtype::bf16));
      o.add_matrix(matrix(w2.data(), g2.data(), zenflow::rows{rows}, zenflow::cols{cols}).dtypes(dtype::f16, dtype::f16));
      o.add_vector({b0.data(), gb0.data(), 5});
      o.add_vector({b1.data(), gb1.data(), 7, dtype::bf16, dtype::bf16});
    }
  };
  struct poison {
    std::function<void(model&)> write;
    std::string want;
  };
  const std::vector<poison> poisons = {
      {[&](model& m) { m.w0[5 * rows + 3] = nan; }, "matrix 0's param held nan at row 3, column 5"},
      {[&](model& m) { m.w1[2 * cols + 7] = to_bfloat16(inf); }, "matrix 1's param held inf at row 2, column 7"},
      {[&](model& m) { m.w2[15 * rows + 7] = to_float16(-inf); }, "matrix 2's param held -inf at row 7, column 15"},
      {[&](model& m) { m.w2[0] = to_float16(70000.0f); }, "matrix 2's param held inf at row 0, column 0"},
      {[&](model& m) { m.b0[4] = inf; }, "vector 0's param held inf at element 4"},
      {[&](model& m) { m.b1[6] = to_bfloat16(nan); }, "vector 1's param held nan at element 6"},
  };
  for (const bool resident : {false, true}) {
    config cfg = small_config(false);
    if (resident) {
      cfg.topk_ratio = 1.0;
      cfg.full_warm_up_rounds = 0;
    }
    std::vector<poison> cases = poisons;
    if (resident)  // the first matrix row-major, its fp32 param read back as it lies
      cases.push_back({[&](model& m) { m.w0[6 * cols + 11] = -inf; },
                       "matrix 0's param held -inf at row 6, column 11"});
    for (std::size_t c = 0; c < cases.size(); ++c) {
      CAPTURE(resident);
      CAPTURE(c);
      const bool row_major = resident && c + 1 == cases.size();
      model m, ref;
      optimizer<> other(cfg);
      ref.add_to(other, row_major);
      other.initialize();
      other.save(path);  // the state a resume would load: good params, no step yet
      cases[c].write(m);
      const model poisoned = m;
      optimizer<> opt(cfg);
      m.add_to(opt, row_major);
      opt.initialize();
      const std::string want = "zenflow: step() refused: " + cases[c].want +
                               " at initialize(), and no checkpoint was loaded since: only finite params can be "
                               "trained (a master taken from it would never become finite again, and no checkpoint "
                               "of it could be saved); load a checkpoint, or register finite params with a new "
                               "optimizer. Nothing was changed";
      for (int attempt = 0; attempt < 2; ++attempt)
        CHECK_THROWS_WITH_AS(opt.step(), want.c_str(), std::invalid_argument);
      CHECK(opt.stats().steps == 0);
      CHECK(opt.usable());
      CHECK(std::memcmp(m.w0.data(), poisoned.w0.data(), m.w0.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(m.w1.data(), poisoned.w1.data(), m.w1.size() * sizeof(bfloat16)) == 0);
      CHECK(std::memcmp(m.w2.data(), poisoned.w2.data(), m.w2.size() * sizeof(float16)) == 0);
      CHECK(std::memcmp(m.b0.data(), poisoned.b0.data(), m.b0.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(m.b1.data(), poisoned.b1.data(), m.b1.size() * sizeof(bfloat16)) == 0);
      // a load that fails changes nothing, the refusal included; one that succeeds writes the
      // good params back and clears it
      CHECK_THROWS_AS(opt.load(path + ".missing"), checkpoint_error);
      CHECK_THROWS_WITH_AS(opt.step(), want.c_str(), std::invalid_argument);
      opt.load(path);
      for (int s = 0; s < 2; ++s) {
        opt.step();
        other.step();
      }
      opt.synchronize();
      other.synchronize();
      CHECK(m.w0 == ref.w0);
      CHECK(std::memcmp(m.w1.data(), ref.w1.data(), m.w1.size() * sizeof(bfloat16)) == 0);
      CHECK(std::memcmp(m.w2.data(), ref.w2.data(), m.w2.size() * sizeof(float16)) == 0);
      CHECK(m.b0 == ref.b0);
      CHECK(std::memcmp(m.b1.data(), ref.b1.data(), m.b1.size() * sizeof(bfloat16)) == 0);
      CHECK(m.w0 != model().w0);  // (the steps moved the params)
    }
  }
  // without the bad value, nothing is refused (the check names only what is there); with two,
  // the first found is named: matrices before vectors, in registration order
  {
    model m;
    optimizer<> opt(small_config(false));
    m.add_to(opt, false);
    opt.initialize();
    CHECK_NOTHROW(opt.step());
    model two;
    two.b0[1] = nan;
    two.w2[9] = to_float16(inf);
    optimizer<> named(small_config(false));
    two.add_to(named, false);
    named.initialize();
    CHECK_THROWS_WITH_AS(named.step(), doctest::Contains("matrix 2's param held inf at row 1, column 1 at initialize()"),
                         std::invalid_argument);
  }
  std::remove(path.c_str());
}

TEST_CASE("a param that is not finite at initialize(): in buffers of many blocks, the lowest index is named") {
  // The scans run in blocks on several threads (host_space: 2^16 values a block); whichever
  // block finishes first, the value named is the first in the buffer (a vector's element, or
  // a matrix's column-major position for the host's columns, its own layout's order for a
  // matrix the device updates alone). Three bad values each, in blocks 2, 5 and 11 of the
  // buffer, listed from the highest: a scan that kept whichever block answered last, or the
  // first value listed, would name another.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::size_t n = std::size_t(12) << 16, rows = 256, cols = n / rows;
  const std::vector<std::size_t> at = {std::size_t(11) << 16 | 5, std::size_t(5) << 16 | 77, std::size_t(2) << 16 | 1234};
  for (const bool resident : {false, true}) {
    CAPTURE(resident);
    config cfg = small_config(false);
    cfg.host_threads = 4;
    if (resident) {
      cfg.topk_ratio = 1.0;
      cfg.full_warm_up_rounds = 0;
    }
    std::vector<float> w(n, 0.5f), g(n, 0.01f), b(n, 0.25f), gb(n, 0.01f);
    {  // the vector
      for (const std::size_t k : at) b[k] = k == at[1] ? nan : inf;
      optimizer<> opt(cfg);
      opt.add_matrix(matrix(w.data(), g.data(), zenflow::rows{rows}, zenflow::cols{cols}).row_major());
      opt.add_vector({b.data(), gb.data(), n});
      opt.initialize();
      const std::string want = "vector 0's param held inf at element " + std::to_string(at[2]) + " at initialize()";
      CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains(want.c_str()), std::invalid_argument);
      std::fill(b.begin(), b.end(), 0.25f);
    }
    {  // the matrix, row-major: [rows][cols]
      for (const std::size_t k : at) w[k] = k == at[1] ? nan : -inf;
      optimizer<> opt(cfg);
      opt.add_matrix(matrix(w.data(), g.data(), zenflow::rows{rows}, zenflow::cols{cols}).row_major());
      opt.initialize();
      // host columns: the lowest column, then row; the device's own: the lowest row-major index
      std::size_t first = at[0];
      for (const std::size_t k : at)
        if (resident ? k < first : (k % cols < first % cols || (k % cols == first % cols && k / cols < first / cols)))
          first = k;
      const std::string want = "matrix 0's param held " + std::string(first == at[1] ? "nan" : "-inf") + " at row " +
                               std::to_string(first / cols) + ", column " + std::to_string(first % cols) + " at initialize()";
      CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains(want.c_str()), std::invalid_argument);
    }
  }
}

TEST_CASE("impossible vector sizes are refused at registration") {
  std::vector<float> b(16), gb(16);
  optimizer<> opt(config{});
  CHECK_THROWS_WITH_AS(opt.add_vector({b.data(), gb.data(), std::size_t(1) << 62}),
                       doctest::Contains("vector 0: n = 4611686018427387904 elements cannot be held"),
                       std::invalid_argument);
  CHECK(opt.add_vector({b.data(), gb.data(), 16}) == vector_id{0});  // still usable
}

TEST_CASE("concurrent saves to one path all succeed and leave a loadable checkpoint") {
  // four optimizers with four states (1 to 4 steps), each saving from its own thread to the
  // same path: the file left must be one of them whole (writers that shared a temporary file or
  // mixed their sections would leave a blend, or a file that does not load)
  struct one {
    std::vector<float> w = std::vector<float>(R * C, 0.25f), dw = std::vector<float>(R * C);
    optimizer<> opt{small_config(false)};
    explicit one(int steps) {
      opt.add_matrix({w.data(), dw.data(), R, C});
      opt.initialize();
      for (int s = 0; s < steps; ++s) {
        gradients(dw, s);
        opt.step();
      }
      opt.synchronize();
    }
    std::vector<float> master() {
      std::vector<float> m(R * C);
      opt.copy_master(matrix_id{0}, m.data());
      return m;
    }
  };
  std::vector<std::unique_ptr<one>> opts;
  for (int t = 0; t < 4; ++t) opts.push_back(std::make_unique<one>(t + 1));
  for (int a = 0; a < 4; ++a)
    for (int b = a + 1; b < 4; ++b) REQUIRE(opts[std::size_t(a)]->master() != opts[std::size_t(b)]->master());
  const std::string path = std::string(ZF_TEST_TMP_DIR) + "/concurrent.zfck";
  int failures[4] = {0, 0, 0, 0};
  std::vector<std::thread> savers;
  for (int t = 0; t < 4; ++t)
    savers.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) try {
          opts[std::size_t(t)]->opt.save(path);
        } catch (const std::exception&) {
          ++failures[t];
        }
    });
  for (auto& s : savers) s.join();
  for (int n : failures) CHECK(n == 0);
  std::vector<float> w2(R * C), dw2(R * C);
  optimizer<> other(small_config(false));
  other.add_matrix({w2.data(), dw2.data(), R, C});
  other.initialize();
  REQUIRE_NOTHROW(other.load(path));
  std::vector<float> m2(R * C);
  other.copy_master(matrix_id{0}, m2.data());
  int matches = 0;
  for (const auto& o : opts)
    if (m2 == o->master()) {
      ++matches;
      CHECK(w2 == o->w);
      CHECK(other.stats().steps == o->opt.stats().steps);
    }
  CHECK(matches == 1);
  std::remove(path.c_str());
}

TEST_CASE("magnitudes no run means are refused with the value printed exactly") {
  auto expect = [](config c, const char* msg) { CHECK_THROWS_WITH_AS(c.validate(), msg, config_error); };
  config c;
  c.adam.lr = 2.0f;
  expect(c, "zenflow config: lr must be at most 1, got 2");
  c = {};
  c.adam.weight_decay = 1e30f;
  expect(c, "zenflow config: weight_decay must be at most 10, got 1e+30");
  c = {};
  c.adam.lr = 0.5f;
  c.adam.weight_decay = 4.0f;
  expect(c, "zenflow config: weight_decay times lr (0.5) must be at most 1, got 4");
  c = {};
  c.host_threads = 4000000000u;
  expect(c, "zenflow config: host_threads must be at most 65536 (0 = all cores), got 4000000000");
  c = {};
  c.adam.eps = 1e-8f + 1e-15f;  // printed as the float it is, not as 0.000000
  c.adam.eps = -c.adam.eps;
  expect(c, "zenflow config: eps must be finite and > 0, got -1.0000001e-08");
  // set_lr applies the same bounds, and changes nothing when it refuses
  std::vector<float> w(R * C), dw(R * C);
  config cfg;
  cfg.adam.weight_decay = 2.0f;
  optimizer<> opt(cfg);
  opt.add_matrix({w.data(), dw.data(), R, C});
  opt.initialize();
  CHECK_THROWS_WITH_AS(opt.set_lr(0.75f), "zenflow config: weight_decay times lr (0.75) must be at most 1, got 2",
                       config_error);
  CHECK(opt.lr() == cfg.adam.lr);
}

TEST_CASE("a JSON object with many keys is read whole, duplicates still refused") {
  // 40,000 keys: the duplicate check is a hash set now (a pairwise check took ~11 s here)
  std::string text = "{";
  for (int i = 0; i < 40000; ++i) text += (i ? ",\"k" : "\"k") + std::to_string(i) + "\": " + std::to_string(i);
  text += "}";
  const json::value v = json::parse(text);
  REQUIRE(v.keys.size() == 40000);
  CHECK(v.keys[39999] == "k39999");
  CHECK_THROWS_WITH_AS(json::parse("{\"a\": 1, \"b\": 2, \"a\": 3}"), doctest::Contains("duplicate key \"a\""),
                       json::parse_error);
}

// A transport asked for pieces of 0 bytes would loop for ever (offset += 0): refused up front,
// before any piece is consumed.
TEST_CASE("host_copy refuses pieces of 0 bytes instead of looping") {
  host_copy t;
  const std::vector<unsigned char> a(64, 1), b(32, 2);
  int consumed = 0;
  struct no_event {} ready;
  CHECK_THROWS_AS(t.stream_to_host(ready, a.data(), a.size(), 0, [&](const void*, std::size_t, std::size_t) { ++consumed; }),
                  std::invalid_argument);
  const offload_block blocks[2] = {{a.data(), a.size(), 16}, {b.data(), b.size(), 0}};
  CHECK_THROWS_AS(t.stream_blocks_to_host(ready, blocks, 2, [&](std::size_t, const void*, std::size_t, std::size_t) { ++consumed; }),
                  std::invalid_argument);
  CHECK(consumed == 0);
  CHECK(t.bytes_to_host() == 0);
  // an empty block may have any piece; a whole one streams in its pieces
  const offload_block fine[2] = {{a.data(), a.size(), 16}, {b.data(), 0, 0}};
  t.stream_blocks_to_host(ready, fine, 2, [&](std::size_t, const void*, std::size_t, std::size_t) { ++consumed; });
  CHECK(consumed == 4);
  CHECK(t.bytes_to_host() == 64);
}

TEST_CASE("copy_* refuse a null or misaligned out, or one over a registered param or grad, and change nothing") {
  // An fp32 matrix's param held its selected columns' master: copying the master into it would
  // read columns it had just overwritten (and any copy into a registered buffer writes over the
  // trainer's model or gradients).
  std::vector<float> w(R * C, 0.25f), dw(R * C), b(C, 0.5f), db(C, 0.01f);
  optimizer<> opt(small_config(false));
  opt.add_matrix({w.data(), dw.data(), R, C});
  opt.add_vector({b.data(), db.data(), C});
  opt.initialize();
  for (int s = 0; s < 3; ++s) {
    gradients(dw, s);
    opt.step();
  }
  auto masters = [&] {
    std::vector<float> m(R * C), v(C);
    opt.copy_master(matrix_id{0}, m.data());
    opt.copy_vector_master(vector_id{0}, v.data());
    m.insert(m.end(), v.begin(), v.end());
    return m;
  };
  const auto before = masters();
  const auto w_before = w, dw_before = dw, b_before = b;
  const auto steps = opt.stats().steps;
  std::vector<float> room(R * C + 1);
  float* misaligned = reinterpret_cast<float*>(reinterpret_cast<char*>(room.data()) + 2);
  using copy_fn = void (*)(optimizer<>&, float*);
  const std::pair<const char*, copy_fn> calls[] = {
      {"copy_master()", [](optimizer<>& o, float* out) { o.copy_master(matrix_id{0}, out); }},
      {"copy_exp_avg()", [](optimizer<>& o, float* out) { o.copy_exp_avg(matrix_id{0}, out); }},
      {"copy_exp_avg_sq()", [](optimizer<>& o, float* out) { o.copy_exp_avg_sq(matrix_id{0}, out); }},
      {"copy_params_synchronized()", [](optimizer<>& o, float* out) { o.copy_params_synchronized(matrix_id{0}, out); }},
      {"copy_vector_master()", [](optimizer<>& o, float* out) { o.copy_vector_master(vector_id{0}, out); }},
  };
  for (const auto& [name, call] : calls) {
    CAPTURE(name);
    const std::string who = std::string("zenflow: ") + name + ": ";
    CHECK_THROWS_WITH_AS(call(opt, nullptr), (who + "out is null").c_str(), std::invalid_argument);
    CHECK_THROWS_WITH_AS(call(opt, misaligned), (who + "out is not aligned to its element size (4 bytes)").c_str(),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(call(opt, w.data()), (who + "out overlaps matrix 0 param, which the copy would write over").c_str(),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(call(opt, dw.data() + 3), doctest::Contains("out overlaps matrix 0 grad"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(call(opt, b.data()), doctest::Contains("out overlaps vector 0 param"), std::invalid_argument);
  }
  CHECK(w == w_before);
  CHECK(dw == dw_before);
  CHECK(b == b_before);
  CHECK(masters() == before);
  CHECK(opt.usable());
  CHECK(opt.stats().steps == steps);
  CHECK_NOTHROW(opt.copy_master(matrix_id{0}, room.data()));  // (a buffer of the caller's own)
  // the edges: a param registered as the front of a larger buffer; an out starting right after
  // it is the caller's, one starting on its last element overlaps it
  std::vector<float> big(2 * R * C, 0.25f), dbig(R * C);
  optimizer<> front(small_config(false));
  front.add_matrix({big.data(), dbig.data(), R, C});
  front.initialize();
  CHECK_NOTHROW(front.copy_master(matrix_id{0}, big.data() + R * C));
  CHECK_THROWS_WITH_AS(front.copy_master(matrix_id{0}, big.data() + R * C - 1),
                       doctest::Contains("out overlaps matrix 0 param"), std::invalid_argument);
}

namespace {
// Selectors of the trainer's own that break the contract (k distinct columns below cols,
// ascending; k() at most cols).
template <int Kind>
struct bad_selector {
  static std::size_t k(double, std::size_t cols) noexcept { return Kind == 3 ? cols + 1 : 4; }
  static constexpr bool needs_scores = true;
  static void select(const double*, std::size_t cols, std::size_t k, std::uint32_t* out) {
    for (std::size_t s = 0; s < k; ++s) out[s] = std::uint32_t(s);
    if (Kind == 0) out[k - 1] = std::uint32_t(cols);  // out of range
    if (Kind == 1) out[2] = out[1];                   // a column twice
    if (Kind == 2) std::swap(out[0], out[3]);         // not ascending
  }
};
template <int Kind>
using bad_selector_optimizer = optimizer<host_space, bad_selector<Kind>>;

template <int Kind>
void expect_refused_selection(const char* what) {
  CAPTURE(what);
  std::vector<float> w(R * C, 0.25f), dw(R * C);
  bad_selector_optimizer<Kind> opt(small_config(false));
  opt.add_matrix({w.data(), dw.data(), R, C});
  opt.initialize();
  gradients(dw, 0);
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("the Selector's choice for matrix 0 has column"), std::logic_error);
  CHECK(opt.stats().selections == 0);  // no column moved
  CHECK_FALSE(opt.usable());           // (a failed step: a load brings it back)
}
}  // namespace

TEST_CASE("a Selector's choice out of range, repeated or unordered is refused, and so is a k() above cols") {
  expect_refused_selection<0>("out of range");
  expect_refused_selection<1>("a column twice");
  expect_refused_selection<2>("not ascending");
  std::vector<float> w(R * C, 0.25f), dw(R * C);
  bad_selector_optimizer<3> opt(small_config(false));
  opt.add_matrix({w.data(), dw.data(), R, C});
  CHECK_THROWS_WITH_AS(opt.initialize(),
                       ("zenflow: the Selector's k() gives " + std::to_string(C + 1) + " columns for matrix 0 of " +
                        std::to_string(C))
                           .c_str(),
                       std::logic_error);
  CHECK_FALSE(opt.initialized());
}

#if ZENFLOW_HAS_MXCSR
// The same through the optimizer on the host space (its device-side loops, its background host
// update and offload): a run whose thread set flush-to-zero and denormals-are-zero before making
// the optimizer (its threads then start with them) ends bit-identical to one that did not, on
// gradients and params of subnormal size, which that setting would flush (detail/fp_env.hpp).
TEST_CASE("a run under the caller's flush-to-zero gives the bits of one without") {
  constexpr std::size_t R = 24, C = 16, N = 8;
  auto run = [&](bool flushing) {
    std::vector<float> w(R * C), dw(R * C), b(N), db(N);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = 1e-39f * float(1 + i % 9);  // (made before the setting)
    for (std::size_t i = 0; i < N; ++i) b[i] = 2e-39f * float(i % 4);
    std::vector<std::vector<float>> grads(9, std::vector<float>(R * C + N));
    for (std::size_t s = 0; s < grads.size(); ++s)
      for (std::size_t i = 0; i < grads[s].size(); ++i) grads[s][i] = 1e-40f * float(int((i * 7 + s * 3) % 17) - 8);
    const unsigned saved = _mm_getcsr();
    if (flushing) _mm_setcsr(saved | 0x8040u);
    std::vector<float> state;
    {
      config cfg;
      cfg.topk_ratio = 0.25;
      cfg.full_warm_up_rounds = 1;
      cfg.update_interval = interval::every(2);
      cfg.select_interval = interval::every(4);
      cfg.adam.weight_decay = 0.01f;
      optimizer<> opt(cfg);
      opt.add_matrix({w.data(), dw.data(), R, C});
      opt.add_vector({b.data(), db.data(), N});
      opt.initialize();
      for (const auto& g : grads) {
        std::memcpy(dw.data(), g.data(), R * C * sizeof(float));
        std::memcpy(db.data(), g.data() + R * C, N * sizeof(float));
        opt.step();
      }
      opt.synchronize();
      std::vector<float> master(R * C), m(R * C), v(R * C);
      opt.copy_master(matrix_id{0}, master.data());
      opt.copy_exp_avg(matrix_id{0}, m.data());
      opt.copy_exp_avg_sq(matrix_id{0}, v.data());
      for (const auto* x : {&w, &b, &master, &m, &v}) state.insert(state.end(), x->begin(), x->end());
    }
    _mm_setcsr(saved);
    return state;
  };
  const std::vector<float> ieee = run(false), flushed = run(true);
  REQUIRE(ieee.size() == flushed.size());
  CHECK(std::memcmp(ieee.data(), flushed.data(), ieee.size() * sizeof(float)) == 0);
  CHECK(std::any_of(ieee.begin(), ieee.end(), [](float x) { return x != 0 && std::fabs(x) < 1.17549435e-38f; }));
}
#endif
