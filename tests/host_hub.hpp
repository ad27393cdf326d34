// R data-parallel ranks as threads of one process, without MPI: hub_communicator is a host-space
// Communicator whose collectives meet in shared memory under a barrier, with the communicator
// contract's arithmetic (the rank-order fp32 sum of communicator.hpp, detail::reduce_in_rank_order)
// and mpi_communicator's byte counts; with reduce_scatter (the optimizer then reduce-scatters the
// matrices' gradients by column blocks), hub_allreduce_communicator without. Used where MPI is
// not at hand or not wanted: the checkpoint fuzzer's seed writer (sharded sets of 2 and 3 ranks),
// and test_data_parallel_threads, which runs the data-parallel path in one process — so also
// under ThreadSanitizer, which cannot follow MPI. The same collectives over GPU memory
// (basic_hub_communicator with another Staging) run test_cuda_data_parallel's ranks.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <zenflow/zenflow.hpp>

namespace zf_test {

// What a rank meets in a collective after another rank failed (not the cause: on_ranks reports
// the failing rank's own error instead).
struct hub_aborted : std::runtime_error {
  hub_aborted() : std::runtime_error("thread_hub: another rank failed") {}
};

class thread_hub {
 public:
  explicit thread_hub(int ranks) : R(ranks), slots(static_cast<std::size_t>(ranks)) {
    if (ranks < 1) throw std::invalid_argument("thread_hub: ranks must be >= 1");
  }
  const int R;
  std::vector<std::vector<unsigned char>> slots;  // each rank's contribution to the collective

  // Every rank waits here until all have arrived; throws once a rank has failed (abort()).
  void barrier() {
    std::unique_lock lock(mu_);
    if (aborted_) throw hub_aborted();
    const std::uint64_t g = gen_;
    if (++arrived_ == R) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen_ != g || aborted_; });
    if (gen_ == g) throw hub_aborted();
  }
  void abort() {
    std::lock_guard lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t gen_ = 0;
  bool aborted_ = false;
};

// The hub's collectives over any memory space: Staging copies a rank's data between where the
// optimizer keeps it and host memory (down: to the host, up: back; complete on return) and names
// the space (`using space`). The arithmetic and the byte counts are the same for every space.
template <class Staging>
class basic_hub_communicator : public Staging {
 public:
  basic_hub_communicator(thread_hub& h, int rank) : h_(&h), rank_(rank) {}
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return h_->R; }
  std::uint64_t bytes_sent() const noexcept { return sent_; }

  void reduce(float* data, std::size_t n, zenflow::reduce_op op) {
    const std::size_t R = std::size_t(h_->R);
    if (R == 1 || n == 0) return;
    auto& mine = h_->slots[std::size_t(rank_)];
    mine.resize(4 * n);
    this->down(mine.data(), data, 4 * n);
    h_->barrier();
    std::vector<float> pieces(R * n), out(n);
    for (std::size_t r = 0; r < R; ++r) std::memcpy(pieces.data() + r * n, h_->slots[r].data(), 4 * n);
    h_->barrier();  // (every rank has read every slot before any writes its next one)
    zenflow::detail::reduce_in_rank_order(pieces.data(), n, h_->R, op, out.data());
    this->up(data, out.data(), 4 * n);
    const std::size_t m = zenflow::detail::shard_begin(n, h_->R, rank_ + 1) - zenflow::detail::shard_begin(n, h_->R, rank_);
    sent_ += ((n - m) + m * (R - 1)) * sizeof(float);
  }
  // (the optional member) data holds R segments, rank r's of counts[r] elements; this rank's
  // gets the rank-order reduction of every rank's segment at its place
  void reduce_scatter(float* data, const std::size_t* counts, zenflow::reduce_op op) {
    const std::size_t R = std::size_t(h_->R), me = std::size_t(rank_);
    if (R == 1) return;
    std::vector<std::size_t> at(R + 1, 0);
    for (std::size_t r = 0; r < R; ++r) at[r + 1] = at[r] + counts[r];
    auto& mine = h_->slots[me];
    mine.resize(4 * at[R]);
    this->down(mine.data(), data, 4 * at[R]);
    h_->barrier();
    const std::size_t m = counts[me];
    std::vector<float> pieces(R * m), out(m);
    for (std::size_t r = 0; r < R && m; ++r) std::memcpy(pieces.data() + r * m, h_->slots[r].data() + 4 * at[me], 4 * m);
    h_->barrier();
    if (m) zenflow::detail::reduce_in_rank_order(pieces.data(), m, h_->R, op, out.data());
    this->up(data + at[me], out.data(), 4 * m);
    sent_ += (at[R] - m) * sizeof(float);
  }
  void all_gather(void* data, const std::size_t* bytes) {
    const std::size_t R = std::size_t(h_->R), me = std::size_t(rank_);
    if (R == 1) return;
    std::vector<std::size_t> at(R + 1, 0);
    for (std::size_t r = 0; r < R; ++r) at[r + 1] = at[r] + bytes[r];
    auto* d = static_cast<unsigned char*>(data);
    auto& mine = h_->slots[me];
    mine.resize(bytes[me]);
    this->down(mine.data(), d + at[me], bytes[me]);
    h_->barrier();
    for (std::size_t r = 0; r < R; ++r)
      if (r != me) this->up(d + at[r], h_->slots[r].data(), bytes[r]);
    h_->barrier();
  }
  bool all_agree(bool ok) {
    h_->slots[std::size_t(rank_)].assign(1, ok ? 1 : 0);
    h_->barrier();
    bool all = true;
    for (const auto& x : h_->slots) all = all && x[0] != 0;
    h_->barrier();
    return all;
  }

 private:
  thread_hub* h_;
  int rank_;
  std::uint64_t sent_ = 0;
};
// ... without reduce_scatter: the optimizer all-reduces every gradient
template <class Staging>
struct basic_hub_allreduce_communicator : basic_hub_communicator<Staging> {
  using basic_hub_communicator<Staging>::basic_hub_communicator;
  void reduce_scatter(float*, const std::size_t*, zenflow::reduce_op) = delete;
};

// The host space: the data already is in host memory.
struct host_staging {
  using space = zenflow::host_space;
  static void down(void* host, const void* data, std::size_t n) {
    if (n) std::memcpy(host, data, n);
  }
  static void up(void* data, const void* host, std::size_t n) {
    if (n) std::memcpy(data, host, n);
  }
};
using hub_communicator = basic_hub_communicator<host_staging>;
using hub_allreduce_communicator = basic_hub_allreduce_communicator<host_staging>;
static_assert(zenflow::communicator_policy<hub_communicator>);

// Runs body(rank) on R threads; if one throws, the others are released from the hub's barriers
// and the lowest rank's own error is rethrown here (a released rank's hub_aborted only if no
// rank has another).
inline void on_ranks(thread_hub& hub, const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> errors(std::size_t(hub.R));
  std::vector<std::thread> threads;
  for (int r = 0; r < hub.R; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[std::size_t(r)] = std::current_exception();
        hub.abort();
      }
    });
  for (auto& t : threads) t.join();
  std::exception_ptr released;
  for (auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const hub_aborted&) {
      if (!released) released = e;
    } catch (...) {
      throw;
    }
  }
  if (released) std::rethrow_exception(released);
}

}  // namespace zf_test
