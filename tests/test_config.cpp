// Bad input: every out-of-range or inconsistent config value, every registration error and
// every misuse of the life cycle throws std::invalid_argument with a message naming the
// problem, and changes no state.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <zenflow/zenflow.hpp>

using namespace zenflow;

namespace {
void expect_config_error(const config& c, const std::string& msg) {
  CAPTURE(msg);
  CHECK_THROWS_WITH_AS(c.validate(), msg.c_str(), config_error);
  CHECK_THROWS_AS(optimizer<>{c}, std::invalid_argument);  // config_error is one
}
}  // namespace

TEST_CASE("config: the defaults are valid") {
  CHECK_NOTHROW(config{}.validate());
}

TEST_CASE("config: each bad value is named with its allowed range") {
  config c;
  c.topk_ratio = 1.5;
  expect_config_error(c, "zenflow config: topk_ratio must be in [0, 1], got 1.5");
  c = {}; c.topk_ratio = NAN;
  expect_config_error(c, "zenflow config: topk_ratio must be in [0, 1], got nan");
  c = {}; c.update_interval = interval::every(0);
  expect_config_error(c, "zenflow config: update_interval must be >= 1 or \"auto\", got 0");
  c = {}; c.select_interval = interval::every(0);
  expect_config_error(c, "zenflow config: select_interval must be >= 1 or \"auto\", got 0");
  c = {}; c.select_interval = interval::every(6); c.update_interval = interval::every(4);
  expect_config_error(c, "zenflow config: select_interval must be a multiple of update_interval (4), got 6");
  c = {}; c.select_interval = interval::auto_();
  expect_config_error(c, "zenflow config: steps_per_epoch must be >= 1 when select_interval is \"auto\", got 0");
  c = {}; c.select_interval = interval::auto_(); c.steps_per_epoch = 10;  // (the epoch's length is to change)
  expect_config_error(c, "zenflow config: steps_per_epoch must be a multiple of update_interval (4) when select_interval "
                         "is \"auto\", got 10");
  c = {}; c.auto_ratio = -0.25;
  expect_config_error(c, "zenflow config: auto_ratio must be in [0, 1], got -0.25");
  c = {}; c.auto_ratio = 1.5;
  expect_config_error(c, "zenflow config: auto_ratio must be in [0, 1], got 1.5");
  c = {}; c.auto_ratio = 0;  // every step a boundary (DeepSpeed's range includes it)
  CHECK_NOTHROW(c.validate());
  c = {}; c.adam.lr = -1;
  expect_config_error(c, "zenflow config: lr must be finite and >= 0, got -1");
  c = {}; c.adam.beta1 = 1;
  expect_config_error(c, "zenflow config: beta1 must be in [0, 1), got 1");
  c = {}; c.adam.beta2 = 1.5f;
  expect_config_error(c, "zenflow config: beta2 must be in [0, 1), got 1.5");
  c = {}; c.adam.eps = 0;
  expect_config_error(c, "zenflow config: eps must be finite and > 0, got 0");
  c = {}; c.adam.weight_decay = -0.1f;
  expect_config_error(c, "zenflow config: weight_decay must be finite and >= 0, got -0.1");
  c = {}; c.max_grad_norm = -1;
  expect_config_error(c, "zenflow config: max_grad_norm must be finite and >= 0 (0 = no clipping), got -1");
  // "auto" update interval: any select interval goes
  c = {}; c.update_interval = interval::auto_(); c.select_interval = interval::every(7);
  CHECK_NOTHROW(c.validate());
}

TEST_CASE("registration errors are clear and leave the optimizer usable") {
  std::vector<float> a(64), ga(64), b(16), gb(16);
  optimizer<> opt(config{});
  auto expect = [&](auto&& call, const char* msg) {
    CHECK_THROWS_WITH_AS(call(), msg, std::invalid_argument);
  };
  expect([&] { opt.add_matrix({nullptr, ga.data(), 8, 8}); }, "zenflow: matrix 0: param is null");
  expect([&] { opt.add_matrix({a.data(), nullptr, 8, 8}); }, "zenflow: matrix 0: grad is null");
  expect([&] { opt.add_matrix({a.data(), ga.data(), 0, 8}); }, "zenflow: matrix 0: rows and cols must be > 0");
  expect([&] { opt.add_matrix({reinterpret_cast<char*>(a.data()) + 2, ga.data(), 4, 4}); },
         "zenflow: matrix 0: param is not aligned to its element size (4 bytes)");
  expect([&] { opt.add_matrix({a.data(), a.data() + 8, 4, 4}); }, "zenflow: matrix 0: param and grad overlap");
  expect([&] { opt.add_matrix({a.data(), ga.data(), std::size_t(1) << 62, 8}); }, "zenflow: matrix 0: rows * cols overflows");
  {  // a buffer whose end would pass the address space's (never dereferenced: refused first)
    float* const top = reinterpret_cast<float*>(std::numeric_limits<std::uintptr_t>::max() - 63);
    expect([&] { opt.add_matrix({top, ga.data(), 1 << 10, 8}); },
           "zenflow: matrix 0: param of 32768 bytes would run past the end of the address space");
    expect([&] { opt.add_vector({b.data(), top, 17}); },
           "zenflow: vector 0: grad of 68 bytes would run past the end of the address space");
  }
  // column lists are 32-bit: more columns than that is refused before the buffers are looked at
  expect([&] { opt.add_matrix({a.data(), ga.data(), 1, std::size_t(1) << 32}); },
         "zenflow: matrix 0: 4294967296 columns; at most 4294967295 (column lists are 32-bit)");
  expect([&] { opt.add_vector({b.data(), gb.data(), 0}); }, "zenflow: vector 0: n must be > 0");
  expect([&] { opt.step(); }, "zenflow: step() before initialize()");
  expect([&] { opt.synchronize(); }, "zenflow: synchronize() before initialize()");
  expect([&] { opt.initialize(); }, "zenflow: initialize(): no parameters registered");
  CHECK(opt.add_matrix({a.data(), ga.data(), 8, 8}) == matrix_id{0});
  // a second registration over the same memory, or over the first one's gradient
  expect([&] { opt.add_vector({a.data() + 4, gb.data(), 4}); }, "zenflow: vector 0 param overlaps matrix 0 param");
  expect([&] { opt.add_vector({b.data(), ga.data(), 4}); }, "zenflow: vector 0 grad overlaps matrix 0 grad");
  CHECK(opt.add_vector({b.data(), gb.data(), 16}) == vector_id{0});
  opt.initialize();
  expect([&] { opt.initialize(); }, "zenflow: initialize() called twice");
  expect([&] { opt.add_vector({b.data(), gb.data(), 16}); }, "zenflow: vector 1: cannot register after initialize()");
  expect([&] { opt.step(0.0f); }, "zenflow: grad_scale must be finite and > 0, got 0");
  expect([&] { opt.step(-2.0f); }, "zenflow: grad_scale must be finite and > 0, got -2");
  expect([&] { opt.step(INFINITY); }, "zenflow: grad_scale must be finite and > 0, got inf");
  expect([&] { opt.set_lr(NAN); }, "zenflow: lr must be finite and >= 0, got nan");
  CHECK(opt.stats().steps == 0);  // none of the bad calls counted as a step
  CHECK(opt.lr() == config{}.adam.lr);
  opt.step();
  CHECK(opt.stats().steps == 1);
}

// Named registration: zenflow::matrix takes rows and cols as distinct types, and the ids that
// add_matrix / add_vector return are distinct types, so the mix-ups below do not compile.
template <class Opt, class Id>
concept copies_master_of = requires(Opt& o, Id id, float* out) { o.copy_master(id, out); };
template <class Opt, class Id>
concept copies_vector_master_of = requires(Opt& o, Id id, float* out) { o.copy_vector_master(id, out); };
template <class R, class C>
concept builds_matrix = requires(R r, C c) { zenflow::matrix(nullptr, nullptr, r, c); };

static_assert(builds_matrix<zenflow::rows, zenflow::cols>);
static_assert(!builds_matrix<zenflow::cols, zenflow::rows>);  // swapped extents
static_assert(!builds_matrix<std::size_t, std::size_t>);      // bare numbers
static_assert(copies_master_of<optimizer<>, matrix_id>);
static_assert(!copies_master_of<optimizer<>, vector_id>);
static_assert(!copies_master_of<optimizer<>, std::size_t>);
static_assert(copies_vector_master_of<optimizer<>, vector_id>);
static_assert(!copies_vector_master_of<optimizer<>, matrix_id>);
static_assert(!std::is_convertible_v<std::size_t, matrix_id>);

TEST_CASE("named registration fills the same fields and returns typed ids") {
  std::vector<float> w(6 * 10), dw(6 * 10), b(6), db(6);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.25f * float(i) - 3.0f;
  const matrix_param m = zenflow::matrix(w.data(), dw.data(), zenflow::rows{6}, zenflow::cols{10})
                             .row_major()
                             .dtypes(dtype::bf16, dtype::f16);
  CHECK(m.param == w.data());
  CHECK(m.grad == dw.data());
  CHECK(m.rows == 6);
  CHECK(m.cols == 10);
  CHECK(m.layout == matrix_layout::row_major);
  CHECK(m.param_type == dtype::bf16);
  CHECK(m.grad_type == dtype::f16);
  // the defaults: fp32, column-contiguous; each option changes only its own fields
  const matrix_param d = zenflow::matrix(w.data(), dw.data(), zenflow::rows{6}, zenflow::cols{10});
  CHECK(d.layout == matrix_layout::column_contiguous);
  CHECK(d.param_type == dtype::f32);
  CHECK(d.grad_type == dtype::f32);
  CHECK(m.column_contiguous().layout == matrix_layout::column_contiguous);
  CHECK(m.column_contiguous().param_type == dtype::bf16);
  const vector_param v = zenflow::vector(b.data(), db.data(), 6).dtypes(dtype::f32, dtype::bf16);
  CHECK(v.param == b.data());
  CHECK(v.grad == db.data());
  CHECK(v.n == 6);
  CHECK(v.param_type == dtype::f32);
  CHECK(v.grad_type == dtype::bf16);

  optimizer<> opt(config{});
  const matrix_id a = opt.add_matrix(d);
  const vector_id c = opt.add_vector(zenflow::vector(b.data(), db.data(), 6));
  CHECK(a.index() == 0);
  CHECK(c.index() == 0);  // numbered separately
  std::vector<float> early(60);  // registered but not initialised: said so, not "no matrix"
  CHECK_THROWS_WITH_AS(opt.copy_master(a, early.data()), "zenflow: matrix 0: not before initialize()", std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.copy_vector_master(c, early.data()), "zenflow: vector 0: not before initialize()",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.copy_master(matrix_id{1}, early.data()), "zenflow: no matrix 1", std::invalid_argument);
  opt.initialize();
  std::vector<float> out(60);
  opt.copy_master(a, out.data());
  CHECK(out == w);  // the masters are the registered params before any step
  CHECK_THROWS_WITH_AS(opt.copy_master(matrix_id{1}, out.data()), "zenflow: no matrix 1", std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.copy_vector_master(vector_id{1}, out.data()), "zenflow: no vector 1",
                       std::invalid_argument);
}

TEST_CASE("overlap refusal matches a pairwise check of every registered buffer") {
  // Random registrations into one arena of floats: each is refused exactly when its param or grad
  // shares a byte with its own other buffer or with any buffer accepted before (checked the slow
  // way, against all of them), and the optimizer takes the rest.
  std::mt19937 gen(11);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> arena(4096);
    optimizer<> opt(config{});
    std::vector<std::pair<std::size_t, std::size_t>> taken;  // [begin, end) in elements
    auto clash = [&](std::size_t b, std::size_t e) {
      for (auto [tb, te] : taken)
        if (b < te && tb < e) return true;
      return false;
    };
    std::size_t accepted = 0;
    for (int r = 0; r < 300; ++r) {
      const std::size_t n = 1 + gen() % 24, pb = gen() % (arena.size() - n), gb = gen() % (arena.size() - n);
      const bool self = pb < gb + n && gb < pb + n;
      const bool refuse = self || clash(pb, pb + n) || clash(gb, gb + n);
      CAPTURE(trial);
      CAPTURE(r);
      if (refuse) {
        CHECK_THROWS_AS(opt.add_vector({arena.data() + pb, arena.data() + gb, n}), std::invalid_argument);
      } else {
        CHECK(opt.add_vector({arena.data() + pb, arena.data() + gb, n}) == vector_id{accepted});
        ++accepted;
        taken.push_back({pb, pb + n});
        taken.push_back({gb, gb + n});
      }
    }
    CHECK(accepted > 10);  // the draw leaves room for some (else the test would check only refusals)
  }
}

TEST_CASE("a failed initialize leaves nothing half-built") {
  // A matrix too large to allocate: registration only checks the pointers, the allocation fails.
  optimizer<> opt(config{});
  auto* fake = reinterpret_cast<float*>(std::uintptr_t(1) << 40);
  opt.add_matrix({fake, fake + (std::size_t(1) << 38), std::size_t(1) << 19, std::size_t(1) << 19});
  CHECK_THROWS_AS(opt.initialize(), std::bad_alloc);
  CHECK_FALSE(opt.initialized());
  CHECK_THROWS_WITH_AS(opt.step(), "zenflow: step() before initialize()", std::invalid_argument);
}

// A space with activate() (a CUDA space sets its device there) is made current by every public
// entry point that touches the device after initialize(), on whatever thread calls it; one
// without needs nothing. Each call here runs on a thread of its own, which must have activated
// the space itself (a count per thread: an activation by the background host-update worker, or
// by the thread that initialised, does not count).
namespace {
struct counting_space : host_space {
  counting_space() : host_space(0) {}
  static inline thread_local int activations_here = 0;
  void activate() { ++activations_here; }
};
}  // namespace

TEST_CASE("every device-touching entry point activates the space on the calling thread") {
  std::vector<float> w(64, 0.5f), g(64, 0.01f), b(8, 0.25f), gb(8, 0.01f), out(64);
  config cfg;
  cfg.update_interval = interval::every(1);
  optimizer<counting_space> opt(cfg);
  opt.add_matrix({w.data(), g.data(), 8, 8});
  opt.add_vector({b.data(), gb.data(), 8});
  opt.initialize();  // the space's own initialize() chooses and sets the device
  const std::string path = std::string(ZF_TEST_TMP_DIR) + "/activate.zfck";
  // whether `call`, run on a new thread, activated the space on that thread
  auto on_own_thread = [](auto&& call) {
    bool activated = false;
    std::thread([&] {
      call();
      activated = counting_space::activations_here > 0;
    }).join();
    return activated;
  };
  CHECK(on_own_thread([&] { opt.step(); }));
  CHECK(on_own_thread([&] { opt.synchronize(); }));
  CHECK(on_own_thread([&] { opt.copy_master(matrix_id{0}, out.data()); }));
  CHECK(on_own_thread([&] { opt.copy_exp_avg(matrix_id{0}, out.data()); }));
  CHECK(on_own_thread([&] { opt.copy_exp_avg_sq(matrix_id{0}, out.data()); }));
  CHECK(on_own_thread([&] { (void)opt.column_counts(matrix_id{0}); }));
  CHECK(on_own_thread([&] { opt.copy_params_synchronized(matrix_id{0}, out.data()); }));
  CHECK(on_own_thread([&] { opt.copy_vector_master(vector_id{0}, out.data()); }));
  CHECK(on_own_thread([&] { opt.save(path); }));
  CHECK(on_own_thread([&] { opt.load(path); }));
  CHECK_FALSE(on_own_thread([] {}));  // (a thread that calls nothing has not)
  std::remove(path.c_str());
}
