// nccl_communicator: data parallelism across NCCL ranks for the CUDA space, one GPU per rank.
// Each rank's trainer writes its local gradients; step() reduces them on the device so every
// rank applies the same gradient and keeps bit-identical optimizer state. The trainer keeps
// owning its ncclComm_t (a blocking one, the default, created on the optimizer's device and
// destroyed only after the optimizer).
// Include from a .cu file (compiled by nvcc) and link zenflow::nccl.
//
// Every collective is enqueued on the optimizer's stream (the optimizer hands it over with
// set_stream), so it is ordered with the optimizer's kernels and copies around it.
//
// The reduction is deterministic and gives the same bits as mpi_communicator's: each rank owns a
// contiguous shard of the elements; the ranks' pieces of a shard go to its owner (grouped
// ncclSend/ncclRecv), which sums them in rank order in fp32 ((x_0 + x_1) + x_2 ...; a kernel, the
// same arithmetic as detail::reduce_in_rank_order), and the reduced shards are broadcast from
// their owners in place (one ncclBroadcast per rank, grouped). No NCCL reduction operator touches
// the gradients, so the bits do not depend on NCCL's choice of algorithm, protocol or channel
// count. Each rank sends about 2 (R - 1) / R of the gradient's fp32 bytes per step. One rank
// (R = 1) runs the same calls (to itself).
// With reduce_scatter (the same pieces to the owners, the same sum, no broadcast) the optimizer
// reduce-scatters the matrices' gradients by column blocks, as over MPI: about (R - 1) / R of their
// bytes. nccl_allreduce_communicator, without it, keeps every grad buffer's whole reduced gradient.
#pragma once

#if !defined(__CUDACC__)
#  error "zenflow's NCCL communicator must be compiled by nvcc: include <zenflow/nccl.hpp> from a .cu file"
#endif

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "communicator.hpp"
#include "cuda/error.hpp"
#include "cuda/memory.hpp"
#include "space/cuda_space.hpp"

namespace zenflow {

namespace cuda_kernels {

// out[i] = pieces[0][i] + pieces[1][i] + ... in rank order (pieces[r] at pieces + r * m), then
// divided by `ranks` for the mean, rounded to nearest like the host's division (__fdiv_rn: the
// same bits whatever -prec-div says; a build that flushes subnormals, -ftz=true or
// --use_fast_math, is refused at initialize(): cuda_space::check_arithmetic).
template <int = 0>
__global__ void reduce_in_rank_order(const float* __restrict__ pieces, std::size_t m, int ranks, bool mean,
                                     float* __restrict__ out) {
  const float div = float(ranks);
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < m;
       i += std::size_t(gridDim.x) * blockDim.x) {
    float s = pieces[i];
    for (int r = 1; r < ranks; ++r) s = __fadd_rn(s, pieces[std::size_t(r) * m + i]);
    out[i] = mean ? __fdiv_rn(s, div) : s;
  }
}

}  // namespace cuda_kernels

class nccl_communicator {
 public:
  using space = cuda_space;  // reduce and all_gather take device memory

  // The ranks of `comm` (not owned). Allocates the vote's flag (below); enqueues nothing.
  explicit nccl_communicator(ncclComm_t comm) : comm_(comm) {
    if (!comm) throw std::invalid_argument("zenflow: nccl_communicator needs an ncclComm_t, got a null one");
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check(ncclCommCount(comm_, &size_), "ncclCommCount");
    // The vote's flag and the block offsets, made here, before any collective: in a call, a
    // rank that could not make them would throw alone and leave the others in the collective
    // (the vote itself needs the flag). On the communicator's device.
    int dev = 0, was = 0;
    check(ncclCommCuDevice(comm_, &dev), "ncclCommCuDevice");
    device_ = dev;
    ZF_CUDA_TRY(cudaGetDevice(&was));
    if (dev != was) ZF_CUDA_TRY(cudaSetDevice(dev));
    try {
      flag_ = device_array<int>(1);
      at_.reserve(std::size_t(size_) + 1);
    } catch (...) {
      if (dev != was) cudaSetDevice(was);
      throw;
    }
    if (dev != was) ZF_CUDA_TRY(cudaSetDevice(was));
  }
  nccl_communicator(nccl_communicator&& o) noexcept
      : comm_(std::exchange(o.comm_, nullptr)), stream_(o.stream_), rank_(o.rank_), size_(o.size_),
        device_(o.device_), sent_(o.sent_), lim_(o.lim_), pieces_(std::move(o.pieces_)), flag_(std::move(o.flag_)),
        at_(std::move(o.at_)) {}
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  nccl_communicator& operator=(nccl_communicator&&) = delete;
  ~nccl_communicator() = default;

 protected:
  // At most `round` elements of each rank's segment in one reduce_scatter round (besides
  // reduce_scatter's own rule): a small value makes the rounds run with one rank and even
  // segments (the tests).
  struct limits {
    std::size_t round = std::numeric_limits<std::size_t>::max();
  };
  nccl_communicator(ncclComm_t comm, limits lim) : nccl_communicator(comm) {
    if (lim.round == 0) throw std::invalid_argument("zenflow: nccl_communicator limits too small");
    lim_ = lim;
  }

 public:
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  // The GPU the communicator was made on (ncclCommCuDevice): the optimizer's initialize() refuses
  // a space on another one.
  int device() const noexcept { return device_; }
  std::uint64_t bytes_sent() const noexcept { return sent_; }
  // The device memory it keeps between calls (the ranks' pieces of a shard, the vote's flag; in
  // the optimizer's stats().device_bytes).
  std::size_t bytes_allocated() const noexcept { return sizeof(float) * pieces_.size() + sizeof(int) * flag_.size(); }
  // The stream the collectives run on (the optimizer passes its own).
  void set_stream(cudaStream_t s) noexcept { stream_ = s; }
  cudaStream_t stream() const noexcept { return stream_; }

  // See communicator_policy; data is device memory. Collective: every rank calls it with the
  // same n. Enqueued on the stream; returns without waiting.
  void reduce(float* data, std::size_t n, reduce_op op) {
    if (n == 0) return;
    const std::size_t R = std::size_t(size_), me = std::size_t(rank_);
    auto& at = at_;  // (a member: no allocation a call, and a step makes about 4R of them)
    at.resize(R + 1);
    for (std::size_t r = 0; r <= R; ++r) at[r] = detail::shard_begin(n, size_, int(r));
    const std::size_t m = at[me + 1] - at[me];
    float* pieces = pieces_for((n + R - 1) / R * R);  // (a bound of every rank's m R: see pieces_for)
    // every rank's piece of each shard to the shard's owner (mine to me too)
    nccl_group group(*this);
    for (std::size_t r = 0; r < R; ++r) {
      if (at[r + 1] > at[r])
        check(ncclSend(data + at[r], at[r + 1] - at[r], ncclFloat32, int(r), comm_, stream_), "ncclSend");
      if (m) check(ncclRecv(pieces + r * m, m, ncclFloat32, int(r), comm_, stream_), "ncclRecv");
    }
    group.end();
    sum_pieces(pieces, m, op, data + at[me]);
    broadcast_blocks(data, at.data(), ncclFloat32);
    sent_ += ((n - m) + m * (R - 1)) * sizeof(float);  // the others' pieces, then my shard to each
  }

  // See communicator_policy (the optional member); data is device memory. Enqueued on the stream.
  // Round j moves elements [j P, (j + 1) P) of every segment, P = 2 ceil(total / R) (as
  // mpi_communicator's; at most the limits' round): the receive buffer, P from every rank, stays
  // within about twice the data however the segments are split; segments within twice their
  // share go in one round.
  void reduce_scatter(float* data, const std::size_t* counts, reduce_op op) {
    const std::size_t R = std::size_t(size_), me = std::size_t(rank_);
    auto& at = at_;
    at.assign(R + 1, 0);
    std::size_t longest = 0;
    for (std::size_t r = 0; r < R; ++r) {
      at[r + 1] = at[r] + counts[r];
      longest = std::max(longest, counts[r]);
    }
    if (at[R] == 0) return;
    const std::size_t P = std::min(lim_.round, 2 * ((at[R] + R - 1) / R));
    // (the rounds reuse it: each round's receives are queued after the last round's sum, which
    // reads it, on the same stream)
    float* pieces = pieces_for(std::min(P, longest) * R);  // (every rank's bound: see pieces_for)
    for (std::size_t off = 0; off < longest; off += P) {
      const std::size_t m = counts[me] > off ? std::min(P, counts[me] - off) : 0;
      nccl_group group(*this);
      for (std::size_t r = 0; r < R; ++r) {
        const std::size_t len = counts[r] > off ? std::min(P, counts[r] - off) : 0;
        if (len) check(ncclSend(data + at[r] + off, len, ncclFloat32, int(r), comm_, stream_), "ncclSend");
        if (m) check(ncclRecv(pieces + r * m, m, ncclFloat32, int(r), comm_, stream_), "ncclRecv");
      }
      group.end();
      sum_pieces(pieces, m, op, data + at[me] + off);
    }
    sent_ += (at[R] - counts[me]) * sizeof(float);  // every other rank's segment to its owner
  }

  // See communicator_policy; data is device memory, in place. Enqueued on the stream.
  void all_gather(void* data, const std::size_t* bytes) {
    const std::size_t R = std::size_t(size_);
    auto& at = at_;
    at.assign(R + 1, 0);
    for (std::size_t r = 0; r < R; ++r) at[r + 1] = at[r] + bytes[r];
    broadcast_blocks(static_cast<unsigned char*>(data), at.data(), ncclUint8);
  }

  // See communicator_policy. Waits for the stream, polling NCCL's asynchronous error meanwhile:
  // a peer gone or a network failure throws here (the trainer can then ncclCommAbort) instead of
  // waiting for ever. On the communicator's GPU, made current for the call; on that GPU's
  // default stream when the stream set is on another GPU (an initialize() refused for that
  // still votes, and the other ranks refuse it too instead of waiting).
  bool all_agree(bool ok) {
    const on_device here(device_);
    const cudaStream_t s = vote_stream();
    // (a byte pattern: 0x01010101 or 0, whose minimum is 0 when any rank says no; no host memory
    // the copy would wait on the stream for)
    ZF_CUDA_TRY(cudaMemsetAsync(flag_.data(), ok ? 1 : 0, sizeof(int), s));
    check(ncclAllReduce(flag_.data(), flag_.data(), 1, ncclInt32, ncclMin, comm_, s), "ncclAllReduce");
    wait_for(s, "the ranks' vote (ncclAllReduce)");
    int all = 0;
    ZF_CUDA_TRY(cudaMemcpyAsync(&all, flag_.data(), sizeof all, cudaMemcpyDeviceToHost, s));  // (the stream is idle)
    return all != 0;
  }

  // See communicator_policy (the optional member): the receive buffer any later
  // reduce_scatter of at most `scatter` elements in all, and reduce of at most `reduce`, needs
  // (reduce: ceil(reduce / R) from every rank; reduce_scatter: at most 2 ceil(scatter / R)),
  // allocated now — a collective, voted on. The optimizer calls it from initialize(), so that
  // its steps allocate nothing here.
  void reserve(std::size_t scatter, std::size_t reduce) {
    const std::size_t R = std::size_t(size_), n = std::max(2 * ((scatter + R - 1) / R), (reduce + R - 1) / R) * R;
    if (n) pieces_for(n);
  }

 private:
  // An NCCL group around one collective's calls, closed on every way out: NCCL keeps the group
  // per thread, so one left open by an error inside it (a send NCCL refuses) would swallow the
  // thread's next NCCL calls, which would never run (a later vote would hang instead of fail).
  class nccl_group {
   public:
    explicit nccl_group(const nccl_communicator& c) : c_(c) { c_.check(ncclGroupStart(), "ncclGroupStart"); }
    nccl_group(const nccl_group&) = delete;
    nccl_group& operator=(const nccl_group&) = delete;
    void end() {
      open_ = false;
      c_.check(ncclGroupEnd(), "ncclGroupEnd");
    }
    ~nccl_group() {
      if (open_) ncclGroupEnd();  // (unwinding: the first error is the one thrown)
    }

   private:
    const nccl_communicator& c_;
    bool open_ = true;
  };

  // Rank r's block [at[r], at[r + 1]) (elements of `type`) of data broadcast from r, in place.
  template <class T>
  void broadcast_blocks(T* data, const std::size_t* at, ncclDataType_t type) {
    nccl_group group(*this);
    for (int r = 0; r < size_; ++r) {
      const std::size_t len = at[r + 1] - at[r];
      if (len) check(ncclBroadcast(data + at[r], data + at[r], len, type, r, comm_, stream_), "ncclBroadcast");
    }
    group.end();
  }

  // out[0, m) = the ranks' pieces (pieces + r * m) summed in rank order, on the stream
  void sum_pieces(const float* pieces, std::size_t m, reduce_op op, float* out) {
    if (!m) return;
    const unsigned b = cuda_kernels::blocks_for(m, cuda_kernels::threads);
    cuda_kernels::reduce_in_rank_order<<<b < 65536u ? b : 65535u, cuda_kernels::threads, 0, stream_>>>(
        pieces, m, size_, op == reduce_op::mean, out);
    ZF_CUDA_CHECK_LAUNCH("reduce_in_rank_order");
  }

  // The receive buffer, grown to n elements, n a bound every rank computes alike from the call's
  // arguments (the same on every rank), so that the ranks grow at the same calls — and vote on
  // it there: a rank whose device cannot allocate it throws its error and the others throw too,
  // instead of waiting for it in the collective (nothing is enqueued yet). When refused, every
  // rank drops it (they go on growing alike).
  float* pieces_for(std::size_t n) {
    if (pieces_.size() < n) {
      if (pieces_.size()) ZF_CUDA_TRY(cudaStreamSynchronize(stream_));  // the last reduction may still read it
      pieces_ = {};
      std::exception_ptr failed;
      try {
        pieces_ = device_array<float>(n);
      } catch (...) {
        failed = std::current_exception();
      }
      if (!all_agree(!failed)) {
        pieces_ = {};
        if (failed) std::rethrow_exception(failed);
        throw std::runtime_error("zenflow: nccl_communicator: another rank could not allocate its receive buffer "
                                 "(it threw its error); nothing was sent");
      }
    }
    return pieces_.data();
  }

  // The calling thread on GPU d while it lives (the previous device set back after).
  struct on_device {
    int was = 0, dev;
    explicit on_device(int d) : dev(d) {
      ZF_CUDA_TRY(cudaGetDevice(&was));
      if (was != dev) ZF_CUDA_TRY(cudaSetDevice(dev));
    }
    on_device(const on_device&) = delete;
    on_device& operator=(const on_device&) = delete;
    ~on_device() {
      if (was != dev) (void)cudaSetDevice(was);
    }
  };

  // The stream a vote runs on: the one set, unless it is on another GPU than the communicator's
  // (or cannot be asked), then the communicator's GPU's default stream.
  cudaStream_t vote_stream() const {
#if CUDART_VERSION >= 12080
    if (stream_) {
      int d = -1;
      if (cudaStreamGetDevice(stream_, &d) != cudaSuccess) {
        (void)cudaGetLastError();  // (not left for the next launch check)
        return nullptr;
      }
      if (d != device_) return nullptr;
    }
#endif
    return stream_;
  }

  // Blocks until s is idle, polling: a CUDA error of the stream's work throws, and so does an
  // asynchronous error of the communicator's (its kernels would otherwise wait for ever).
  void wait_for(cudaStream_t s, const char* what) const {
    for (unsigned polls = 0;; ++polls) {
      const cudaError_t q = cudaStreamQuery(s);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) ZF_CUDA_TRY(q);
      // (the runtime keeps that "not ready" as the thread's last error: not left for the next
      // launch check, CUB's among them, to report)
      cuda_detail::clear_answer();
      ncclResult_t async = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      if (async != ncclSuccess) check(async, what);
      if (polls < 4096)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void check(ncclResult_t rc, const char* what) const {
    if (rc == ncclSuccess) return;
    std::string msg = std::string("zenflow: ") + what + " failed: " + ncclGetErrorString(rc);
    if (comm_) {
      if (const char* last = ncclGetLastError(comm_); last && *last) msg += std::string(" (") + last + ")";
    }
    throw std::runtime_error(msg);
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
  std::uint64_t sent_ = 0;
  limits lim_;
  device_array<float> pieces_;  // the ranks' pieces of my shard
  device_array<int> flag_;      // all_agree's vote
  std::vector<std::size_t> at_;  // where each rank's block starts, in the call at hand
};

static_assert(communicator_policy<nccl_communicator>);
// (the optimizer detects the optional members with requires-expressions, where a private or
// misspelt one would silently count as absent)
static_assert(requires(nccl_communicator& c, const nccl_communicator& cc, float* d, const std::size_t* n) {
  c.reserve(std::size_t{}, std::size_t{});
  c.reduce_scatter(d, n, reduce_op::sum);
  c.set_stream(cudaStream_t{});  // (without it the collectives would run on the legacy stream)
  cc.bytes_allocated();
});

// nccl_communicator without reduce_scatter: the optimizer all-reduces every gradient, so that
// after step() every grad buffer holds the whole reduced gradient (for a trainer that reads it),
// at about twice the bytes.
class nccl_allreduce_communicator : public nccl_communicator {
 public:
  using nccl_communicator::nccl_communicator;
  void reduce_scatter(float*, const std::size_t*, reduce_op) = delete;
};
static_assert(communicator_policy<nccl_allreduce_communicator>);

}  // namespace zenflow
