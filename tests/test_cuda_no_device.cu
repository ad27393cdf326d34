// Without a usable GPU (here: no driver, CUDA error 35) cuda_space fails cleanly: a
// zenflow::cuda_error naming the call and CUDA's error at initialize(), the optimizer left
// uninitialised with its registrations, never a crash. Runs where there is no GPU; skipped
// (exit 77) where there is one, but for the cases of the "anywhere" suite (main, below).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <concepts>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <zenflow/cuda.hpp>
#include <zenflow/detail/c_status.hpp>

using namespace zenflow;

namespace {
const char* zf_last_error_text() { return c_api::last_error().c_str(); }
}  // namespace

// The optional policy extras the optimizer detects at compile time are detected for CUDA: a
// false detection would silently skip the transport's reserve() or the device top-k.
static_assert(reservable_transport<cuda_pinned, cuda_space>);
static_assert(pinned_transport<cuda_pinned>);
static_assert(filling_transport<cuda_pinned> && filling_transport<host_copy>);
static_assert(block_streaming_transport<cuda_pinned, cuda_space> && block_streaming_transport<host_copy, host_space>);
static_assert(ahead_transport<cuda_pinned> && ahead_transport<host_copy>);
static_assert(device_topk_updater<fused_adamw<cuda_space>, cuda_space>);
static_assert(compacting_updater<fused_adamw<cuda_space>, cuda_space> && offload_aware_scheduler<bounded_async>);
static_assert(std::is_same_v<default_transport_t<cuda_space>, cuda_pinned>);
// (host_copy's reserve reserves nothing: it fixes the upload-ahead setting at initialize())
static_assert(reservable_transport<host_copy, host_space> && !device_topk_updater<fused_adamw<host_space>, host_space>);
// and the members the optimizer detects inline (a private or misspelt one would count as absent):
// the transport's reserve with the lane piece and its release, the space's activation, its
// pending-error checks and its forgetting of queued work, the updater's pass in parts and
// zen-auto's masses, its host and pinned bytes, the host side's reservations and clean-up
static_assert(requires(cuda_pinned& t, cuda_space& s) {
  t.reserve(s, std::size_t{}, std::size_t{});
  t.release();
});
static_assert(requires(cuda_space& s, const cuda_space& cs) {
  s.activate();
  s.forget_queued_work();
  { cs.error_pending() } -> std::convertible_to<bool>;
  cs.check_no_pending_error("call");
  cs.check_registered_memory(static_cast<const void*>(nullptr), std::size_t{}, std::string{});
  cs.check_host_memory(static_cast<const void*>(nullptr), std::string{});
});
static_assert(requires(fused_adamw<cuda_space>& u, cuda_space& s, const std::pair<std::size_t, std::size_t>* r) {
  u.prepare_parts(s, r);
  u.enqueue_masses(s);
  u.masses(s, std::size_t{});
  u.reserve(std::size_t{}, std::size_t{});
});
static_assert(requires(const fused_adamw<cuda_space>& u) {
  { u.records_bytes() } -> std::convertible_to<std::size_t>;
  { u.pinned_bytes() } -> std::convertible_to<std::size_t>;
});
static_assert(requires(simd_accumulator& h, const simd_accumulator& ch, bounded_async& b) {
  h.reserve(std::size_t{});
  h.clear();
  ch.records_bytes();
  b.failed();
  b.settle_offload();
});

namespace {
bool gpu_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
}  // namespace

TEST_CASE("cuda_space without a GPU: initialize() throws a clear cuda_error and changes nothing") {
  std::vector<float> w(64), g(64);
  config cfg;
  optimizer<cuda_space> opt(cfg);
  opt.add_matrix({w.data(), g.data(), 8, 8});
  try {
    opt.initialize();
    FAIL("initialize() succeeded without a GPU");
  } catch (const cuda_error& e) {
    const std::string what = e.what();
    CAPTURE(what);
    CHECK(what.find("cuda_space needs a CUDA GPU") != std::string::npos);
    CHECK(what.find("cudaGetDeviceCount") != std::string::npos);
    CHECK(what.find(cudaGetErrorName(e.code())) != std::string::npos);
    CHECK(e.code() != cudaSuccess);
  }
  CHECK_FALSE(opt.initialized());
  CHECK_THROWS_WITH_AS(opt.step(1.0f), "zenflow: step() before initialize()", std::invalid_argument);
  CHECK(opt.stats().device_bytes == 0);
  // the registrations are kept: a second attempt fails the same way
  CHECK_THROWS_AS(opt.initialize(), cuda_error);
}

TEST_CASE("any_optimizer on cuda_space: the stream is the space's, and no GPU is the same clear error") {
  std::vector<float> w(64), g(64);
  for (const char* kind : {"zenflow", "zero_offload", "device_adam"}) {
    CAPTURE(kind);
    any_optimizer opt = any_optimizer::create<cuda_space>(kind, config{});
    opt.add_matrix({w.data(), g.data(), 8, 8});
    cudaStream_t stream = nullptr;  // the legacy default stream, passed through as void*
    CHECK_THROWS_WITH_AS(opt.initialize(static_cast<void*>(stream)), doctest::Contains("cuda_space needs a CUDA GPU"),
                         cuda_error);
    CHECK_FALSE(opt.initialized());
  }
}

// The reference is CUDA's own code and std::errc's meaning: only cudaErrorMemoryAllocation is
// "not enough memory" (a trainer can free memory and retry); any other CUDA error is not.
TEST_CASE("cuda_error: out of memory is std::errc::not_enough_memory, and ZF_OUT_OF_MEMORY in C" * doctest::test_suite("anywhere")) {
  const cuda_error oom(cudaErrorMemoryAllocation, "zenflow: cudaMalloc(...) failed: out of memory");
  CHECK(oom.code() == cudaErrorMemoryAllocation);
  CHECK(oom.error_code() == std::errc::not_enough_memory);
  CHECK(std::string(oom.what()) == "zenflow: cudaMalloc(...) failed: out of memory");  // whole, nothing appended
  CHECK(std::string(oom.error_code().category().name()) == "cuda");
  const cuda_error fault(cudaErrorIllegalAddress, "zenflow: a kernel faulted");
  CHECK_FALSE(fault.error_code() == std::errc::not_enough_memory);
  CHECK(fault.error_code().message().find("cudaErrorIllegalAddress") != std::string::npos);
  const cuda_error copy = oom;  // an exception copies without throwing
  CHECK(std::string(copy.what()) == oom.what());

  CHECK(c_api::guarded([&] { throw oom; }) == ZF_OUT_OF_MEMORY);
  CHECK(std::string(zf_last_error_text()) == oom.what());
  CHECK(c_api::guarded([&] { throw fault; }) == ZF_IO_ERROR);
  CHECK(std::string(zf_last_error_text()) == fault.what());
  CHECK(c_api::guarded([] { throw cuda_error(cudaErrorNoDevice, "zenflow: no device"); }) == ZF_IO_ERROR);
}

TEST_CASE("cuda memory without a GPU: allocation throws cuda_error naming the call") {
  try {
    device_array<float> a(1024);
    FAIL("cudaMalloc succeeded without a GPU");
  } catch (const cuda_error& e) {
    CHECK(std::string(e.what()).find("cudaMalloc") != std::string::npos);
  }
  CHECK_THROWS_AS(pinned_array<float>(16), cuda_error);
  // work on a stream of its own (zeroing, table uploads): no stream, so nothing is enqueued and
  // the error comes back
  bool enqueued = false;
  CHECK(cuda_detail::run_alone([&](cudaStream_t) {
          enqueued = true;
          return cudaSuccess;
        }) != cudaSuccess);
  CHECK_FALSE(enqueued);
  device_array<float> empty;  // nothing allocated, nothing to free
  CHECK(empty.size() == 0);
  CHECK(empty.data() == nullptr);
}

TEST_CASE("cuda transport used before the optimizer reserved it: a logic_error, not a crash" * doctest::test_suite("anywhere")) {
  cuda_pinned t;
  float x = 0, y = 0;
  CHECK_THROWS_AS(t.to_host(&x, &y, 4), std::logic_error);
  CHECK_THROWS_AS(t.to_device(&x, &y, 4), std::logic_error);
  CHECK(t.bytes_to_host() == 0);
  // uploads ahead: off by default; asked for before initialize (reserve) only; unusable before
  CHECK_FALSE(t.uploads_ahead());
  t.upload_ahead(true);
  CHECK(t.uploads_ahead());
  CHECK_THROWS_AS(t.ahead_begin(), std::logic_error);
  CHECK_THROWS_AS(t.fill_ahead(&x, 4, [](void*) {}), std::logic_error);
  CHECK_THROWS_AS(t.await_ahead(), std::logic_error);
  CHECK(t.pinned_bytes() == 0);
}

// The launch check (the same logic on any machine): a launch's failure throws, naming CUDA's
// error; cudaErrorNotReady, a stream or event query's answer that the runtime may keep as the
// thread's last error, is not a launch failure and must not fail the optimizer's next step; nor
// is the "already" of a call whose work was done (peer access, host registration), which
// trainers commonly leave unread. The same statuses are no pending error at step() either.
TEST_CASE("launch check: a query's NotReady passes, a launch error throws naming the kernel" * doctest::test_suite("anywhere")) {
  CHECK_NOTHROW(cuda_detail::check_launch_status(cudaSuccess, "k", "f.cu", 1));
  CHECK_NOTHROW(cuda_detail::check_launch_status(cudaErrorNotReady, "k", "f.cu", 1));
  CHECK_NOTHROW(cuda_detail::check_launch_status(cudaErrorPeerAccessAlreadyEnabled, "k", "f.cu", 1));
  CHECK_NOTHROW(cuda_detail::check_launch_status(cudaErrorHostMemoryAlreadyRegistered, "k", "f.cu", 1));
  for (cudaError_t e : {cudaSuccess, cudaErrorNotReady, cudaErrorPeerAccessAlreadyEnabled, cudaErrorHostMemoryAlreadyRegistered})
    CHECK_FALSE(cuda_detail::is_failure(e));
  for (cudaError_t e : {cudaErrorInvalidConfiguration, cudaErrorMemoryAllocation, cudaErrorIllegalAddress, cudaErrorLaunchFailure})
    CHECK(cuda_detail::is_failure(e));
  try {
    cuda_detail::check_launch_status(cudaErrorInvalidConfiguration, "gradient_pass", "f.cu", 7);
    FAIL("an invalid launch configuration passed the check");
  } catch (const cuda_error& e) {
    CHECK(e.code() == cudaErrorInvalidConfiguration);
    const std::string what = e.what();
    CHECK(what.find("kernel gradient_pass launch failed at f.cu:7") != std::string::npos);
    CHECK(what.find("cudaErrorInvalidConfiguration") != std::string::npos);
  }
}

// The debug sync check: off by default, on from the environment variable or the switch; when on,
// a launch check also synchronises the device and names the kernel if that fails (here it fails:
// there is no driver).
TEST_CASE("debug sync check: switched by ZENFLOW_CUDA_SYNC_CHECK or set_cuda_sync_check") {
  CHECK_FALSE(cuda_detail::sync_check_from_env(nullptr));
  CHECK_FALSE(cuda_detail::sync_check_from_env(""));
  CHECK_FALSE(cuda_detail::sync_check_from_env("0"));
  CHECK(cuda_detail::sync_check_from_env("1"));
  CHECK(cuda_detail::sync_check_from_env("yes"));
  const bool before = cuda_detail::sync_check_enabled();
  set_cuda_sync_check(true);
  CHECK(cuda_detail::sync_check_enabled());
  (void)cudaGetLastError();  // whatever an earlier test left
  try {
    cuda_detail::check_launch("fused_update", "f.cu", 9);
    FAIL("the sync check passed without a driver");
  } catch (const cuda_error& e) {
    CHECK(std::string(e.what()).find("kernel fused_update") != std::string::npos);
  }
  set_cuda_sync_check(before);
  CHECK(cuda_detail::sync_check_enabled() == before);
}

// The judgement behind cuda_space::check_registered_memory (which gathers the facts from the
// runtime and the driver, and runs at initialize() on a GPU: tests/test_cuda_space.cu), case by
// case against what the README promises: which kinds of memory a GPU's kernels can use, and the
// length check against the allocation's extent, exact at its end.
TEST_CASE("registered memory: device memory of the GPU, managed and mapped memory pass; the rest is refused" * doctest::test_suite("anywhere")) {
  using cuda_detail::memory_facts;
  using cuda_detail::memory_refusal;
  alignas(16) static char arena[4096];
  const void* p = arena + 1024;  // 3072 bytes to the allocation's end below
  auto facts = [&](cudaMemoryType type, int device) {
    memory_facts f;
    f.type = type;
    f.device = device;
    f.range_known = true;
    f.range_begin = reinterpret_cast<std::uintptr_t>(arena);
    f.range_end = f.range_begin + sizeof arena;
    return f;
  };
  // device memory: this GPU's, as long as the shape, or longer
  CHECK(memory_refusal(facts(cudaMemoryTypeDevice, 2), p, 3072, 2).empty());
  CHECK(memory_refusal(facts(cudaMemoryTypeDevice, 2), p, 8, 2).empty());
  CHECK(memory_refusal(facts(cudaMemoryTypeDevice, 2), p, 3073, 2) ==
        "needs 3073 bytes by its shape, and its allocation ends 3072 bytes after its start");
  CHECK(memory_refusal(facts(cudaMemoryTypeDevice, 1), p, 8, 2) ==
        "is device memory of GPU 1, and this optimizer runs on GPU 2");
  // no extent from the driver (or one the pointer is not in): the length goes unchecked
  memory_facts unknown = facts(cudaMemoryTypeDevice, 0);
  unknown.range_known = false;
  CHECK(memory_refusal(unknown, p, 1 << 20, 0).empty());
  memory_facts other = facts(cudaMemoryTypeDevice, 0);
  other.range_begin += 2048;
  CHECK(memory_refusal(other, p, 1 << 20, 0).empty());
  // managed memory: on any device, its length checked
  CHECK(memory_refusal(facts(cudaMemoryTypeManaged, -1), p, 3072, 0).empty());
  CHECK(memory_refusal(facts(cudaMemoryTypeManaged, -1), p, 4096, 0) ==
        "needs 4096 bytes by its shape, and its allocation ends 3072 bytes after its start");
  // page-locked host memory: where the GPU reaches it at its host address
  memory_facts locked = facts(cudaMemoryTypeHost, 0);
  CHECK(memory_refusal(locked, p, 8, 0) == "is page-locked host memory that GPU 0 does not reach at its host address");
  locked.same_address = true;
  CHECK(memory_refusal(locked, p, 8, 0).empty());
  CHECK_FALSE(memory_refusal(locked, p, 3080, 0).empty());
  // plain host memory: only where the GPU reaches pageable memory (and then no extent is known)
  memory_facts plain;
  CHECK(memory_refusal(plain, p, 8, 3) ==
        "is host memory, which GPU 3 cannot reach: the params and grads must be memory it can use (device memory "
        "from cudaMalloc or cudaMallocAsync, managed memory, or page-locked host memory)");
  plain.pageable_access = true;
  CHECK(memory_refusal(plain, p, 1 << 20, 3).empty());
}

// The judgement behind cuda_space::check_host_memory (the destination of a copy out of the
// optimizer; on a GPU: tests/test_cuda_space.cu).
TEST_CASE("copy destinations: device memory is refused where the host cannot reach it, host memory of any kind passes" * doctest::test_suite("anywhere")) {
  using cuda_detail::host_refusal;
  CHECK(host_refusal(cudaMemoryTypeDevice, 1, false) ==
        "is device memory of GPU 1: the copies write host memory (pageable, page-locked or managed)");
  CHECK(host_refusal(cudaMemoryTypeDevice, 1, true).empty());  // (a hardware-coherent system)
  for (cudaMemoryType t : {cudaMemoryTypeUnregistered, cudaMemoryTypeHost, cudaMemoryTypeManaged}) {
    CAPTURE(int(t));
    CHECK(host_refusal(t, 0, false).empty());
  }
}

// ctest runs this program twice: as cuda_logic with --test-suite=anywhere (the cases above that
// need no particular machine: run everywhere, a GPU machine too), and as cuda_no_device with
// --test-suite-exclude=anywhere (the cases that need the GPU to be missing: skipped where there
// is one).
int main(int argc, char** argv) {
  bool anywhere = false;
  for (int i = 1; i < argc; ++i) anywhere = anywhere || std::string(argv[i]) == "--test-suite=anywhere";
  if (!anywhere && gpu_present()) {
    std::printf("zenflow cuda tests: a GPU is present: the no-device tests are skipped\n");
    return 77;
  }
  return doctest::Context(argc, argv).run();
}
