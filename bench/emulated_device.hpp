// The device of bench/pipeline, emulated on the host space: the optimizer, the host kernels,
// the scheduler and the transport code are the real ones; what a GPU would do is replaced by
// time during which the "device" is busy without using the CPU (a sleep), and every
// host<->device copy takes the time a link model gives it.
//
//  - emulated_space: host_space whose device-side column and slot moves are modelled (bytes /
//    device memory bandwidth) instead of being CPU memcpys (their values are not moved).
//  - emulated_updater: the device-side gradient pass (with the offload's compaction fused into it
//    where the optimizer asks) and selective AdamW, modelled the same way (their values are not
//    computed: every gradient counts as finite, and the column scores are random, so every
//    reselection moves columns between host and device).
//  - emulated_link: host_copy (the real copies and byte counts) plus, per transfer (a block, or
//    a piece of a streamed block), the link's latency + bytes / bandwidth, each direction a separate link (PCIe is full duplex). A
//    transfer's end is tracked on a per-direction clock, so sleep overshoot does not accumulate.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include <zenflow/zenflow.hpp>

namespace zf_bench {

using clock_type = std::chrono::steady_clock;

struct device_model {
  static inline double memory_gbps = 2000.0;  // device memory bandwidth for device-side passes
  static inline double link_gbps = 25.0;      // effective host<->device bandwidth per direction
  // Per direction (to host, to device) where a bench measured them (bench/pipeline_cuda's twin);
  // 0: link_gbps.
  static inline double link_gbps_dir[2] = {0.0, 0.0};
  static inline double link_latency_us = 10.0;  // per copy (a DMA's set-up and completion)
  static inline double launch_us = 5.0;         // per device-side launch (kernel launch and scheduling)
  // Seconds the emulated device spent on device-side work (not counting forward/backward).
  static inline std::atomic<std::uint64_t> device_ns{0};
  static inline std::atomic<std::uint64_t> link_ns[2] = {0, 0};  // modelled link time per direction

  // One launch of device work moving `bytes` (read + written) through device memory.
  static void busy_device(double bytes) {
    const double s = launch_us * 1e-6 + bytes / (memory_gbps * 1e9);
    device_ns += std::uint64_t(s * 1e9);
    std::this_thread::sleep_for(std::chrono::duration<double>(s));
  }
};

class emulated_space : public zenflow::host_space {
 public:
  using host_space::host_space;
  static void compact_columns(const void*, zenflow::dtype t, zenflow::matrix_layout, std::size_t rows, std::size_t,
                              const std::uint32_t*, std::size_t n, void*) noexcept {
    device_model::busy_device(2.0 * double(n * rows * zenflow::size_of(t)));  // read + write
  }
  static void scatter_columns(const void*, zenflow::dtype t, void*, zenflow::matrix_layout, std::size_t rows,
                              std::size_t, const std::uint32_t*, std::size_t n) noexcept {
    device_model::busy_device(2.0 * double(n * rows * zenflow::size_of(t)));
  }
  static void move_slots(void*, const std::uint32_t*, const void*, const std::uint32_t*, std::size_t n,
                         std::size_t width) noexcept {
    device_model::busy_device(2.0 * double(n * width));
  }
};

class emulated_updater : public zenflow::fused_adamw<emulated_space> {
  using base = zenflow::fused_adamw<emulated_space>;
  std::uint64_t rng_ = 0x9e3779b97f4a7c15ull;
  double pass_bytes_ = 0;  // this pass's gradient bytes so far
  std::vector<zenflow::compaction_target> targets_;

 public:
  // The pass as the optimizer runs it, whole (one process) or in parts (data parallel with the
  // gradients reduce-scattered: each rank its own blocks of columns, then every rank's scores
  // gathered): the device time of reading the gradients, charged once per pass (one launch),
  // and fresh random column scores every step: each reselection picks a new random set, so the
  // bench pays the full cost of nearly all k columns changing sides (the worst case).
  base::grad_summary gradient_pass(emulated_space& space) { return gradient_pass(space, false); }
  // With `compact`, the offload's compaction in the same launch (as on a GPU): the columns that
  // have a place are written once more (their values are not moved), instead of a compaction
  // launch per matrix that reads them again.
  base::grad_summary gradient_pass(emulated_space& space, bool compact) {
    if (compact)
      for (std::size_t i = 0; i < matrices() && i < targets_.size(); ++i) {
        if (!targets_[i].slot) continue;
        std::size_t n = 0;
        for (std::size_t c = 0; c < matrix(i).p.cols; ++c) n += targets_[i].slot[c] != zenflow::no_slot;
        pass_bytes_ += double(n * matrix(i).p.rows * zenflow::size_of(matrix(i).p.grad_type));
      }
    for (std::size_t i = 0; i < matrices(); ++i) column_stats(space, i, 0, matrix(i).p.cols);
    vector_stats(space);
    return summarize();
  }
  void set_compaction(emulated_space&, const zenflow::compaction_target* t) { targets_.assign(t, t + matrices()); }
  void column_stats(emulated_space&, std::size_t i, std::size_t c0, std::size_t c1) {
    auto& s = matrix(i);
    for (std::size_t c = c0; c < c1; ++c) {
      rng_ ^= rng_ << 13;
      rng_ ^= rng_ >> 7;
      rng_ ^= rng_ << 17;
      s.l1[c] = s.sumsq[c] = double(rng_ >> 11);
      s.bad[c] = 0;
    }
    pass_bytes_ += double(s.p.rows * (c1 - c0) * zenflow::size_of(s.p.grad_type));
  }
  void vector_stats(emulated_space&) {
    for (std::size_t i = 0; i < vectors(); ++i)
      pass_bytes_ += double(vector(i).p.n * zenflow::size_of(vector(i).p.grad_type));
    device_model::busy_device(pass_bytes_);
    pass_bytes_ = 0;
  }
  base::grad_summary summarize() { return {true, 0.0}; }  // every gradient counts as finite
  void update(emulated_space&, float, const zenflow::adamw_hyper&) {
    // fp32 master and both moments read and written, the grad read, the param written
    double bytes = 0;
    for (std::size_t i = 0; i < matrices(); ++i) {
      const auto& s = matrix(i);
      bytes += double(s.active * s.p.rows) * (24.0 + double(zenflow::size_of(s.p.grad_type) + zenflow::size_of(s.p.param_type)));
    }
    for (std::size_t i = 0; i < vectors(); ++i)
      bytes += double(vector(i).p.n) * (24.0 + double(zenflow::size_of(vector(i).p.grad_type) + zenflow::size_of(vector(i).p.param_type)));
    device_model::busy_device(bytes);
  }
};

class emulated_link {
 public:
  // Every transfer is a contiguous block (the optimizer batches column moves), charged latency
  // plus bytes / bandwidth.
  void to_host(void* dst, const void* src, std::size_t bytes) {
    const auto t0 = clock_type::now();
    inner_.to_host(dst, src, bytes);
    occupy(0, t0, double(bytes));
  }
  void to_device(void* dst, const void* src, std::size_t bytes) {
    const auto t0 = clock_type::now();
    inner_.to_device(dst, src, bytes);
    occupy(1, t0, double(bytes));
  }
  template <class Fill>
  void fill_to_device(void* dst, std::size_t bytes, Fill&& fill) {
    const auto t0 = clock_type::now();
    inner_.fill_to_device(dst, bytes, fill);
    occupy(1, t0, double(bytes));
  }
  // Uploads ahead (opt-in, as cuda_pinned's): each piece, filled in place by the update lane's
  // job, occupies the host -> device link on that job's thread (behind the next forward/backward,
  // as a copy on an upload stream of its own would), in pieces of a GPU's 32 MiB.
  emulated_link& upload_ahead(bool on) noexcept {
    inner_.upload_ahead(on);
    return *this;
  }
  bool uploads_ahead() const noexcept { return inner_.uploads_ahead(); }
  static constexpr std::size_t ahead_piece() noexcept { return std::size_t(32) << 20; }
  void ahead_begin() noexcept {}
  template <class Fill>
  void fill_ahead(void* dst, std::size_t bytes, Fill&& fill) {
    const auto t0 = clock_type::now();
    inner_.fill_ahead(dst, bytes, fill);
    occupy(1, t0, double(bytes));
  }
  void ahead_done() noexcept {}
  void await_ahead() noexcept {}
  void ahead_consumed() noexcept {}
  void account_to_device(std::size_t bytes) noexcept { inner_.account_to_device(bytes); }

  // The offload lane's stream, pipelined as cuda_pinned's: up to `lanes` pieces in flight, piece
  // k's copy queued as soon as the buffer of piece k - lanes has been consumed, the copies one
  // after another on the link; each piece is consumed once its copy has ended. (So the lane costs
  // about the larger of the link's time and the consumer's, not their sum.)
  template <class Event, class Consume>
  void stream_to_host(const Event& ready, const void* src, std::size_t bytes, std::size_t chunk, Consume&& consume) {
    in_flight lane;
    inner_.stream_to_host(ready, src, bytes, chunk, [&](const void* piece, std::size_t off, std::size_t len) {
      lane.piece(*this, double(len), [&] { consume(piece, off, len); });
    });
  }
  template <class Event, class Consume>
  void stream_blocks_to_host(const Event& ready, const zenflow::offload_block* blocks, std::size_t n, Consume&& consume) {
    in_flight lane;
    inner_.stream_blocks_to_host(ready, blocks, n, [&](std::size_t b, const void* piece, std::size_t off, std::size_t len) {
      lane.piece(*this, double(len), [&] { consume(b, piece, off, len); });
    });
  }
  std::uint64_t bytes_to_host() const noexcept { return inner_.bytes_to_host(); }
  std::uint64_t bytes_to_device() const noexcept { return inner_.bytes_to_device(); }

 private:
  struct in_flight {
    static constexpr int lanes = 3;  // (cuda_pinned::lanes)
    clock_type::time_point freed[lanes];
    std::size_t k = 0;
    in_flight() {
      const auto t0 = clock_type::now();
      for (auto& f : freed) f = t0;
    }
    template <class Consume>
    void piece(emulated_link& link, double bytes, Consume&& consume) {
      clock_type::time_point& slot = freed[k++ % lanes];
      link.occupy(0, slot, bytes);  // queued when its buffer was freed; returns when the copy has ended
      consume();
      slot = clock_type::now();
    }
  };

  // The transfer occupies direction d from max(its start, the end of the previous transfer) for
  // latency + bytes / bandwidth; the caller returns when it ends.
  void occupy(int d, clock_type::time_point start, double bytes) {
    if (bytes <= 0) return;
    const double gbps = device_model::link_gbps_dir[d] > 0 ? device_model::link_gbps_dir[d] : device_model::link_gbps;
    const double s = device_model::link_latency_us * 1e-6 + bytes / (gbps * 1e9);
    device_model::link_ns[d] += std::uint64_t(s * 1e9);
    clock_type::time_point end;
    {
      std::lock_guard lock(mu_);
      const auto begin = std::max(start, free_at_[d]);
      end = begin + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(s));
      free_at_[d] = end;
    }
    std::this_thread::sleep_until(end);
  }

  zenflow::host_copy inner_;
  std::mutex mu_;
  clock_type::time_point free_at_[2]{};
};

// ZenFlow (column top-k, background host updates, overlap) and ZeRO-Offload (no selection, host
// updates in the step) on the emulated device.
using emulated_zenflow = zenflow::optimizer<emulated_space, zenflow::column_topk, emulated_updater,
                                            zenflow::simd_accumulator, emulated_link, zenflow::bounded_async>;
using emulated_zero_offload = zenflow::optimizer<emulated_space, zenflow::select_none, emulated_updater,
                                                 zenflow::simd_accumulator, emulated_link, zenflow::synchronous>;

}  // namespace zf_bench
