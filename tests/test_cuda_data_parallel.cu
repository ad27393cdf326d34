// Data parallel on the CUDA space at R = 2 and 3 ranks on ONE GPU. NCCL refuses two ranks on one
// GPU, and the GPU machines at hand have one, so without this the optimizer's data-parallel CUDA
// code (sharded host state, the gathers, uploads ahead across ranks, the fused compaction's
// per-rank places) would only run at R = 1, where the reduction is skipped. A test communicator,
// hub_communicator, runs the ranks as threads on GPU 0 with collectives through host memory under
// a barrier, with the communicator contract's arithmetic (communicator.hpp's rank-order fp32 sum)
// and nccl_communicator's byte count; with its reduce_scatter the optimizer reduce-scatters the
// matrices' gradients (cuda_space's strided conversions, the updater's pass in parts and device
// summary, the selected columns gathered), without it (hub_allreduce_communicator) it all-reduces
// them. Every rank is checked bit for bit against one host-space process fed the reduced
// gradient. Without a GPU the program reports Skipped.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <zenflow/cuda.hpp>

#include "cuda_dp_support.hpp"
#include "host_hub.hpp"

using namespace zenflow;
using namespace zf_cuda_dp;
using zf_test::has_gpu;

namespace {

// R ranks on ONE GPU, a thread each, without NCCL (which refuses two ranks on one GPU): host_hub's
// collectives (the communicator contract's arithmetic, the rank-order fp32 sum of
// communicator.hpp; nccl_communicator's byte counts), each rank's data staged through host memory
// on the optimizer's stream. It runs the optimizer's data-parallel CUDA path (sharded host state,
// gathers, uploads ahead, the fused compaction's per-rank places) at R > 1 where only one GPU is
// present.
using hub = zf_test::thread_hub;
struct device_staging {
  using space = cuda_space;
  void set_stream(cudaStream_t s) noexcept { stream_ = s; }
  // copies ordered on the optimizer's stream, complete on return
  void down(void* host, const void* dev, std::size_t n) {
    if (!n) return;
    ZF_CUDA_TRY(cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, stream_));
    ZF_CUDA_TRY(cudaStreamSynchronize(stream_));
  }
  void up(void* dev, const void* host, std::size_t n) {
    if (!n) return;
    ZF_CUDA_TRY(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, stream_));
    ZF_CUDA_TRY(cudaStreamSynchronize(stream_));
  }
  cudaStream_t stream_ = nullptr;
};
// (with reduce_scatter the optimizer reduce-scatters the matrices' gradients; without, it
// all-reduces every gradient)
using hub_communicator = zf_test::basic_hub_communicator<device_staging>;
using hub_allreduce_communicator = zf_test::basic_hub_allreduce_communicator<device_staging>;
static_assert(communicator_policy<hub_communicator>);

static_assert(dp_optimizer<hub_communicator>::reduce_scatters && !dp_optimizer<hub_allreduce_communicator>::reduce_scatters);

// ranks_run through the hub, every rank on GPU 0 (Comm: hub_communicator, which reduce-scatters
// the matrices' gradients, or hub_allreduce_communicator)
template <class Comm = hub_communicator>
std::vector<run_out> hub_run(const gradient_source& src, reduce_op op, bool overlap, int R, int steps, bool ahead = false) {
  hub h(R);
  return ranks_run<Comm>(src, op, overlap, R, steps, true, [&](int r) { return Comm(h, r); }, -1, {}, ahead,
                         [&] { h.abort(); });
}
}  // namespace

TEST_CASE("data parallel on one GPU: R ranks through host-memory collectives equal one host-space process" *
          doctest::skip(!has_gpu())) {
  const int steps = 13;
  for (int R : {2, 3}) {
    for (reduce_op op : {reduce_op::mean, reduce_op::sum}) {
      for (auto [overlap, ahead] : {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
        CAPTURE(R);
        CAPTURE(int(op));
        CAPTURE(overlap);
        CAPTURE(ahead);
        const gradient_source src;
        const run_out ref = reference_run(src, op, overlap, R, steps);
        // the matrices' gradients reduce-scattered by column blocks (the pass in parts, the
        // statistics and the selected columns gathered), and all-reduced: the same state
        const auto scattered = hub_run(src, op, overlap, R, steps, ahead);
        const auto all = hub_run<hub_allreduce_communicator>(src, op, overlap, R, steps, ahead);
        check_ranks(scattered, ref, R, ahead);
        check_ranks(all, ref, R, ahead);
        for (int r = 0; r < R; ++r) CHECK(scattered[std::size_t(r)].stats.bytes_reduced < all[std::size_t(r)].stats.bytes_reduced);
      }
    }
  }
  // a NaN on one rank skips the step on every rank
  gradient_source src;
  src.nan_rank = 1;
  src.nan_step = 6;
  const auto ref = reference_run(src, reduce_op::mean, true, 2, 9);
  REQUIRE(ref.skipped[6]);
  for (const auto& dp : {hub_run(src, reduce_op::mean, true, 2, 9), hub_run<hub_allreduce_communicator>(src, reduce_op::mean, true, 2, 9)})
    for (const auto& x : dp) {
      CHECK(x.skipped == ref.skipped);
      CHECK(x.state == ref.state);
    }
}

namespace {
// A hub communicator that says which GPU it is bound to, as nccl_communicator does (device()).
struct hub_on_device : hub_communicator {
  hub_on_device(hub& h, int rank, int device) : hub_communicator(h, rank), gpu(device) {}
  int device() const noexcept { return gpu; }
  int gpu;
};
static_assert(communicator_policy<hub_on_device>);
}  // namespace

// A communicator bound to another GPU than the optimizer's would run its collectives on this
// GPU's buffers from there: initialize() refuses it, naming both GPUs, and builds nothing; the
// same communicator on the optimizer's GPU is accepted. (One GPU suffices: the claim is the
// communicator's.)
TEST_CASE("a communicator on another GPU than the optimizer's is refused at initialize()" * doctest::skip(!has_gpu())) {
  int current = 0;
  ZF_CUDA_TRY(cudaGetDevice(&current));
  hub h(1);
  model m(true);
  {
    dp_optimizer<hub_on_device> opt(test_config(reduce_op::mean, false), hub_on_device(h, 0, current + 1));
    m.add_to(opt);
    const std::string what = "zenflow: initialize(): the communicator is on GPU " + std::to_string(current + 1) +
                             ", the optimizer on GPU " + std::to_string(current);
    CHECK_THROWS_WITH_AS(opt.initialize(), doctest::Contains(what.c_str()), std::invalid_argument);
    CHECK_FALSE(opt.initialized());
  }
  dp_optimizer<hub_on_device> opt(test_config(reduce_op::mean, false), hub_on_device(h, 0, current));
  m.add_to(opt);
  opt.initialize();
  CHECK(opt.initialized());
  model::up(m.dg0, m.g0);  // (zero gradients: a finite step)
  model::up(m.dg1, m.g1);
  model::up(m.dg2, m.g2);
  CHECK_FALSE(opt.step().skipped);
}
