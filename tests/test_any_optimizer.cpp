// zenflow::any_optimizer: each kind, chosen by name at run time, gives the same bits and stats as
// the concrete optimizer type it stands for, run in lockstep on the same gradients; its
// checkpoints are the concrete type's; bad names and misuse are clear errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <zenflow/zenflow.hpp>

using namespace zenflow;

namespace {

// The trainer's buffers: a bf16 row-major matrix, an fp32 column-contiguous one, a vector.
struct buffers {
  std::vector<bfloat16> w1, g1;
  std::vector<float> w2, g2, b, gb;
  buffers() : w1(12 * 20), g1(12 * 20), w2(6 * 10), g2(6 * 10), b(12), gb(12) {
    for (std::size_t i = 0; i < w1.size(); ++i) w1[i] = bfloat16(std::sin(float(i)) * 0.1f);
    for (std::size_t i = 0; i < w2.size(); ++i) w2[i] = std::cos(float(i)) * 0.1f;
  }
  template <class Opt>
  void add_to(Opt& o) {
    o.add_matrix(zenflow::matrix(w1.data(), g1.data(), rows{12}, cols{20}).row_major().dtypes(dtype::bf16, dtype::bf16));
    o.add_matrix(zenflow::matrix(w2.data(), g2.data(), rows{6}, cols{10}));
    o.add_vector(zenflow::vector(b.data(), gb.data(), b.size()));
  }
  void gradients(int s) {
    for (std::size_t i = 0; i < g1.size(); ++i) g1[i] = bfloat16(std::sin(float(i * 3 + std::size_t(s) * 7)) * 0.01f);
    for (std::size_t i = 0; i < g2.size(); ++i) g2[i] = std::cos(float(i * 5 + std::size_t(s))) * 0.01f;
    for (std::size_t i = 0; i < gb.size(); ++i) gb[i] = std::sin(float(i + std::size_t(s) * 3)) * 0.01f;
  }
  bool operator==(const buffers& o) const {
    return std::memcmp(w1.data(), o.w1.data(), 2 * w1.size()) == 0 && w2 == o.w2 && b == o.b;
  }
};

config test_config() {
  config c;
  c.topk_ratio = 0.2;
  c.update_interval = interval::every(2);
  c.select_interval = interval::every(4);
  c.full_warm_up_rounds = 1;
  return c;
}

template <class Concrete>
void lockstep(const char* kind) {
  CAPTURE(kind);
  buffers ba, bc;
  any_optimizer a = any_optimizer::create(kind, test_config());
  Concrete c(test_config());
  CHECK(a.name() == kind);
  ba.add_to(a);
  bc.add_to(c);
  a.initialize();
  c.initialize();
  for (int s = 0; s < 11; ++s) {
    ba.gradients(s);
    bc.gradients(s);
    const step_info x = a.step(2.0f), y = c.step(2.0f);
    REQUIRE(x.selection == y.selection);
    REQUIRE(x.boundary == y.boundary);
    REQUIRE(ba == bc);
  }
  a.synchronize();
  c.synchronize();
  CHECK(ba == bc);
  const optimizer_stats sa = a.stats(), sc = c.stats();
  CHECK(sa.steps == sc.steps);
  CHECK(sa.selections == sc.selections);
  CHECK(sa.host_updates == sc.host_updates);
  CHECK(sa.bytes_to_host == sc.bytes_to_host);
  CHECK(sa.bytes_to_device == sc.bytes_to_device);
  std::vector<float> ma(60), mc(60);
  a.copy_master(matrix_id{1}, ma.data());
  c.copy_master(matrix_id{1}, mc.data());
  CHECK(ma == mc);
  CHECK(a.selected_columns(matrix_id{0}) == c.selected_columns(matrix_id{0}));
  CHECK(a.get_config().topk_ratio == c.get_config().topk_ratio);  // the kind's adjusted config
}

}  // namespace

TEST_CASE("any_optimizer: each kind gives the concrete type's bits and stats") {
  lockstep<optimizer<>>("zenflow");
  lockstep<zero_offload<>>("zero_offload");
  lockstep<device_adam<>>("device_adam");
}

TEST_CASE("any_optimizer: checkpoints are the concrete type's, both ways") {
  const std::string path = std::string(ZF_TEST_TMP_DIR) + "/any.zfckpt";
  buffers b1, b2;
  any_optimizer a = any_optimizer::create(optimizer_kind::zenflow, test_config());
  b1.add_to(a);
  a.initialize();
  for (int s = 0; s < 5; ++s) {
    b1.gradients(s);
    a.step();
  }
  a.save(path);
  optimizer<> c(test_config());
  b2.add_to(c);
  c.initialize();
  c.load(path);
  CHECK(b1 == b2);
  for (int s = 5; s < 9; ++s) {  // and they go on in lockstep
    b1.gradients(s);
    b2.gradients(s);
    a.step();
    c.step();
  }
  a.synchronize();
  c.synchronize();
  CHECK(b1 == b2);
  CHECK(a.applied_steps() == 9);
  // the other way: the concrete type's checkpoint into a fresh any_optimizer
  c.save(path);
  buffers b3;
  any_optimizer d = any_optimizer::create(optimizer_kind::zenflow, test_config());
  b3.add_to(d);
  d.initialize();
  d.load(path);
  CHECK(b3 == b2);
  CHECK(d.applied_steps() == 9);
  for (int s = 9; s < 13; ++s) {
    b2.gradients(s);
    b3.gradients(s);
    c.step();
    d.step();
  }
  c.synchronize();
  d.synchronize();
  CHECK(b3 == b2);
  std::remove(path.c_str());
}

TEST_CASE("any_optimizer: bad names and misuse are clear errors") {
  CHECK_THROWS_WITH_AS(any_optimizer::create("adam", config{}),
                       "zenflow: unknown optimizer 'adam' (one of: zenflow, zero_offload, device_adam)",
                       std::invalid_argument);
  CHECK(parse_optimizer_kind("zero_offload") == optimizer_kind::zero_offload);
  config bad;
  bad.topk_ratio = 2;
  CHECK_THROWS_AS(any_optimizer::create("zenflow", bad), config_error);
  buffers b;
  any_optimizer a = any_optimizer::create("device_adam", config{});
  b.add_to(a);
  int not_a_stream = 0;
  CHECK_THROWS_WITH_AS(a.initialize(&not_a_stream), "zenflow: this optimizer's space has no streams; pass no stream",
                       std::invalid_argument);
  CHECK_FALSE(a.initialized());
  a.initialize();
  CHECK_THROWS_WITH_AS(a.copy_master(matrix_id{5}, nullptr), "zenflow: no matrix 5", std::invalid_argument);
  // a custom combination of policies, by type
  any_optimizer s = any_optimizer::make<optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator,
                                                  host_copy, synchronous>>("zenflow-synchronous", test_config());
  CHECK(s.name() == "zenflow-synchronous");
  // a moved-from any_optimizer holds nothing: a clear error, not a crash
  any_optimizer moved = std::move(a);
  CHECK(moved.initialized());
  CHECK(moved.usable());
  CHECK_THROWS_WITH_AS(a.step(), "zenflow: this any_optimizer was moved from", std::logic_error);
  CHECK_THROWS_WITH_AS(a.get_config(), "zenflow: this any_optimizer was moved from", std::logic_error);
  CHECK_FALSE(a.initialized());
  CHECK_FALSE(a.usable());
  CHECK(a.applied_steps() == 0);
}

// By name with a communicator: the same optimizer as by kind (trained in lockstep, the same bits
// and name); a bad name is the same clear error as without one.
TEST_CASE("any_optimizer: create by name with a communicator is create by kind") {
  for (const auto kind : {optimizer_kind::zenflow, optimizer_kind::zero_offload, optimizer_kind::device_adam}) {
    const std::string name(name_of(kind));
    CAPTURE(name);
    buffers bn, bk;
    any_optimizer n = any_optimizer::create<host_space>(name, test_config(), single_process{});
    any_optimizer k = any_optimizer::create<host_space>(kind, test_config(), single_process{});
    CHECK(n.name() == name);
    bn.add_to(n);
    bk.add_to(k);
    n.initialize();
    k.initialize();
    for (int s = 0; s < 9; ++s) {
      bn.gradients(s);
      bk.gradients(s);
      n.step();
      k.step();
    }
    n.synchronize();
    k.synchronize();
    CHECK(bn == bk);
    CHECK(n.stats().host_updates == k.stats().host_updates);
  }
  CHECK_THROWS_WITH_AS(any_optimizer::create<host_space>("adam", config{}, single_process{}),
                       "zenflow: unknown optimizer 'adam' (one of: zenflow, zero_offload, device_adam)",
                       std::invalid_argument);
}

namespace {
// A host space whose streams are pointers, as cuda_space's (cudaStream_t) are, noting the stream
// the optimizer sets last.
struct pointer_stream_space : host_space {
  using host_space::host_space;
  using stream_type = int*;
  inline static int* current = nullptr;
  inline static int sets = 0;
  void set_stream(int* s) noexcept {
    current = s;
    ++sets;
  }
  int* stream() const noexcept { return current; }
};
}  // namespace

TEST_CASE("any_optimizer: a call without a stream keeps the optimizer's stream; one with a stream, nullptr too, sets it") {
  // (on cuda_space a step(grad_scale) that passed nullptr on would move the optimizer's kernels
  // to the default stream, unordered with a non-blocking trainer stream)
  using opt_t = optimizer<pointer_stream_space, column_topk, fused_adamw<pointer_stream_space>, simd_accumulator,
                          host_copy, synchronous>;
  buffers b;
  any_optimizer a = any_optimizer::make<opt_t>("pointer streams", test_config());
  b.add_to(a);
  int s1 = 0, s2 = 0;
  pointer_stream_space::sets = 0;
  a.initialize(&s1);
  CHECK(pointer_stream_space::current == &s1);
  b.gradients(0);
  a.step();
  CHECK(pointer_stream_space::current == &s1);
  b.gradients(1);
  a.step(0.5f);
  CHECK(pointer_stream_space::current == &s1);
  b.gradients(2);
  a.step(&s2);
  CHECK(pointer_stream_space::current == &s2);
  b.gradients(3);
  a.step(2.0f);
  CHECK(pointer_stream_space::current == &s2);
  b.gradients(4);
  a.step(nullptr, 1.0f);  // the default stream, given
  CHECK(pointer_stream_space::current == nullptr);
  CHECK(pointer_stream_space::sets == 3);
  CHECK(a.applied_steps() == 5);
  // initialize() without a stream sets none
  buffers b2;
  any_optimizer c = any_optimizer::make<opt_t>("pointer streams", test_config());
  b2.add_to(c);
  pointer_stream_space::sets = 0;
  c.initialize();
  CHECK(pointer_stream_space::sets == 0);
}

// A refused call changes nothing, its stream included: on cuda_space a refused step(s, NaN) that
// had switched to s (as it did) made the next step(grad_scale) run on s, a stream the trainer may
// have destroyed since, the call having failed.
TEST_CASE("any_optimizer: a refused call, or an initialize() that fails, leaves the optimizer's stream as it was") {
  using opt_t = optimizer<pointer_stream_space, column_topk, fused_adamw<pointer_stream_space>, simd_accumulator,
                          host_copy, synchronous>;
  int s1 = 0, scratch = 0;
  {  // initialize() that fails (nothing registered), then one refused before it runs
    any_optimizer a = any_optimizer::make<opt_t>("pointer streams", test_config());
    pointer_stream_space::current = &s1;
    CHECK_THROWS_WITH_AS(a.initialize(&scratch), "zenflow: initialize(): no parameters registered",
                         std::invalid_argument);
    CHECK(pointer_stream_space::current == &s1);
    CHECK_THROWS_WITH_AS(a.step(&scratch, 1.0f), "zenflow: step() before initialize()", std::invalid_argument);
    CHECK(pointer_stream_space::current == &s1);
  }
  buffers b;
  any_optimizer a = any_optimizer::make<opt_t>("pointer streams", test_config());
  b.add_to(a);
  a.initialize(&s1);
  CHECK_THROWS_WITH_AS(a.initialize(&scratch), "zenflow: initialize() called twice", std::invalid_argument);
  CHECK(pointer_stream_space::current == &s1);
  b.gradients(0);
  for (float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 1e-39f}) {
    CAPTURE(bad);
    pointer_stream_space::sets = 0;
    CHECK_THROWS_AS(a.step(&scratch, bad), std::invalid_argument);
    CHECK(pointer_stream_space::current == &s1);
    CHECK(pointer_stream_space::sets == 0);
  }
  CHECK(a.applied_steps() == 0);
  a.step(1.0f);  // on s1, as before the refused calls
  CHECK(pointer_stream_space::current == &s1);
  CHECK(a.applied_steps() == 1);
  b.gradients(1);
  a.step(&scratch, 1.0f);  // a call that runs switches
  CHECK(pointer_stream_space::current == &scratch);
  CHECK(a.applied_steps() == 2);
}
