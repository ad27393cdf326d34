// Transport policy for cuda_space: every transfer goes through page-locked double buffers, so
// each copy is an asynchronous DMA transfer (pageable memory would be staged by the driver) and
// the host copies one buffer while the other is in flight.
//  - to_host / to_device / fill_to_device: from the training thread, on the space's stream
//    (ordered with the device work around them). to_device returns once the host data sits in a
//    pinned buffer; fill_to_device lets the caller write it there in the first place.
//  - fill_ahead (opt-in, upload_ahead): from the scheduler's update lane, on an upload stream of
//    its own, into the optimizer's device area; the boundary's compute stream waits on an event.
//  - stream_to_host / stream_blocks_to_host: from the scheduler's offload lane, on a copy stream
//    of its own that waits for an event of the compute stream (the compaction), so the transfer
//    runs behind the next forward/backward; up to three pieces are in flight, across the blocks
//    of all matrices, and each is handed to the consumer as soon as its copy has completed (a
//    blocking-sync event: the lane sleeps, never spins, and nothing synchronizes the device).
// Bytes are counted as they are moved (atomics: the two threads move concurrently).
#pragma once

#if !defined(__CUDACC__)
#  error "zenflow's CUDA transport must be compiled by nvcc: include <zenflow/cuda.hpp> from a .cu file"
#endif

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>

#include "../cuda/error.hpp"
#include "../cuda/memory.hpp"
#include "../space/cuda_space.hpp"
#include "offload_block.hpp"

namespace zenflow {

class cuda_pinned {
 public:
  cuda_pinned() = default;
  cuda_pinned(const cuda_pinned&) = delete;
  cuda_pinned& operator=(const cuda_pinned&) = delete;
  ~cuda_pinned() {
    // the training thread's last uploads (fill_to_device, to_device) may still read the pinned
    // buffers on the compute stream when the optimizer goes: wait for them before the buffers
    // are freed (their events are ours; the stream may be the trainer's, already destroyed)
    for (int b = 0; b < 2; ++b)
      if (train_used_[b] && train_ev_[b].get()) cudaEventSynchronize(train_ev_[b].get());
    for (cudaStream_t st : {copy_stream_, up_stream_})
      if (st) {
        cudaStreamSynchronize(st);
        cudaStreamDestroy(st);
      }
  }

  // Opt-in, before the optimizer's initialize(): a host update's params go up from the update
  // lane as soon as each matrix is updated, on an upload stream of their own (concurrent with the
  // offload's device -> host copies: PCIe is full duplex), into a device area the optimizer keeps
  // for them (the param bytes of every unselected column); the boundary that applies them only
  // makes the compute stream wait for those copies and scatters. Costs that device memory and
  // two more pinned lane buffers; saves the boundary's host rounding and its copy time.
  cuda_pinned& upload_ahead(bool on) {
    if (space_) throw std::logic_error("zenflow: cuda_pinned::upload_ahead must be set before initialize()");
    ahead_ = on;
    return *this;
  }
  bool uploads_ahead() const noexcept { return ahead_; }

  // Called once by initialize(): pieces of at most `chunk` bytes for the training thread's
  // transfers and of at most `lane` bytes (default: chunk) for the offload lane's, on `space`'s
  // device.
  void reserve(cuda_space& space, std::size_t chunk, std::size_t lane = 0) {
    space_ = &space;
    chunk_ = chunk ? chunk : 1;
    lane_chunk_ = lane ? lane : chunk_;
    for (int b = 0; b < 2; ++b) {
      train_[b] = pinned_array<unsigned char>(chunk_);
      train_ev_[b].create();
      train_used_[b] = false;
    }
    for (int b = 0; b < lanes; ++b) {
      lane_[b] = pinned_array<unsigned char>(lane_chunk_);
      lane_ev_[b].create();
    }
    if (!copy_stream_) ZF_CUDA_TRY(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    if (ahead_) {
      for (int b = 0; b < 2; ++b) {
        up_[b] = pinned_array<unsigned char>(lane_chunk_);
        up_ev_[b].create();
        up_used_[b] = false;
      }
      up_done_.create();
      consumed_.create();
      if (!up_stream_) ZF_CUDA_TRY(cudaStreamCreateWithFlags(&up_stream_, cudaStreamNonBlocking));
    }
  }

  // What reserve() took, given back (the optimizer's initialize() failed): the pinned buffers
  // freed once no copy of this transport is in flight; upload_ahead may be set again. The
  // streams and events stay for the next reserve(). A wait that fails (a sticky device fault:
  // nothing runs any more) still leaves the transport released, then throws.
  void release() {
    std::exception_ptr failed;
    auto attempt = [&](auto&& f) {
      try {
        f();
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
    };
    for (int b = 0; b < 2; ++b) attempt([&] { wait_train(b); });  // (uploads on the compute stream, as in the destructor)
    for (cudaStream_t st : {copy_stream_, up_stream_})
      if (st) attempt([&] { ZF_CUDA_TRY(cudaStreamSynchronize(st)); });
    for (auto& b : train_) b = {};
    for (auto& b : lane_) b = {};
    for (auto& b : up_) b = {};
    train_used_[0] = train_used_[1] = up_used_[0] = up_used_[1] = false;
    done_recorded_ = consumed_recorded_ = false;
    next_ = up_next_ = 0;
    chunk_ = lane_chunk_ = 0;
    space_ = nullptr;
    if (failed) std::rethrow_exception(failed);
  }

  // ---- uploads ahead (the optimizer's update lane; see upload_ahead) ----------------------
  // The largest piece fill_ahead takes.
  std::size_t ahead_piece() const noexcept { return lane_chunk_; }
  // A job's first call, on the update lane's thread: its copies into the device area wait until
  // the compute stream has read what the last job put there (ahead_consumed).
  void ahead_begin() {
    ready_ahead();
    ZF_CUDA_TRY(cudaSetDevice(space_->device()));
    if (consumed_recorded_) ZF_CUDA_TRY(cudaStreamWaitEvent(up_stream_, consumed_.get(), 0));
  }
  // fill(pinned) writes `bytes` (at most ahead_piece()) into one of two page-locked buffers,
  // which then go to dst on the upload stream; the buffer's previous copy has completed first.
  // Not counted until applied (account_to_device).
  template <class Fill>
  void fill_ahead(void* dst, std::size_t bytes, Fill&& fill) {
    ready_ahead();
    if (bytes > lane_chunk_) throw std::invalid_argument("zenflow: cuda_pinned: piece larger than reserved");
    if (bytes == 0) return;
    const int b = up_next_;
    up_next_ ^= 1;
    if (up_used_[b]) up_ev_[b].wait();
    up_used_[b] = false;
    fill(static_cast<void*>(up_[b].data()));
    copy_marked(dst, up_[b].data(), bytes, cudaMemcpyHostToDevice, up_stream_, up_ev_[b]);
    up_used_[b] = true;
  }
  // The job's last call: marks the end of its copies.
  void ahead_done() {
    ready_ahead();
    ZF_CUDA_TRY(cudaEventRecord(up_done_.get(), up_stream_));
    done_recorded_ = true;
  }
  // The training thread, at the boundary: the compute stream waits (on the device, the host
  // goes on) for the last job's copies.
  void await_ahead() {
    ready_ahead();
    if (done_recorded_) ZF_CUDA_TRY(cudaStreamWaitEvent(space_->stream(), up_done_.get(), 0));
  }
  // The training thread, after the launches that read the device area: the next job's copies
  // wait for them.
  void ahead_consumed() {
    ready_ahead();
    ZF_CUDA_TRY(cudaEventRecord(consumed_.get(), space_->stream()));
    consumed_recorded_ = true;
  }
  void account_to_device(std::size_t bytes) noexcept { to_device_.fetch_add(bytes, std::memory_order_relaxed); }

  // Device -> host on the compute stream, complete on return.
  void to_host(void* dst, const void* src, std::size_t bytes) {
    ready();
    auto* out = static_cast<unsigned char*>(dst);
    const auto* in = static_cast<const unsigned char*>(src);
    std::size_t prev_off = 0, prev_len = 0;
    int b = 0;
    for (std::size_t off = 0; off < bytes; off += chunk_) {
      const std::size_t len = bytes - off < chunk_ ? bytes - off : chunk_;
      wait_train(b);  // an earlier to_device may still read this buffer
      copy_marked(train_[b].data(), in + off, len, cudaMemcpyDeviceToHost, space_->stream(), train_ev_[b]);
      train_used_[b] = true;
      if (prev_len) {  // the previous piece, copied out while this one is in flight
        wait_train(b ^ 1);
        std::memcpy(out + prev_off, train_[b ^ 1].data(), prev_len);
      }
      prev_off = off;
      prev_len = len;
      b ^= 1;
    }
    if (prev_len) {
      wait_train(b ^ 1);
      std::memcpy(out + prev_off, train_[b ^ 1].data(), prev_len);
    }
    to_host_.fetch_add(bytes, std::memory_order_relaxed);
  }

  // Host -> device on the compute stream; the host buffer may be reused on return.
  void to_device(void* dst, const void* src, std::size_t bytes) {
    ready();
    auto* out = static_cast<unsigned char*>(dst);
    const auto* in = static_cast<const unsigned char*>(src);
    for (std::size_t off = 0; off < bytes; off += chunk_) {
      const std::size_t len = bytes - off < chunk_ ? bytes - off : chunk_;
      const int b = next_;
      next_ ^= 1;
      wait_train(b);
      std::memcpy(train_[b].data(), in + off, len);
      copy_marked(out + off, train_[b].data(), len, cudaMemcpyHostToDevice, space_->stream(), train_ev_[b]);
      train_used_[b] = true;
    }
    to_device_.fetch_add(bytes, std::memory_order_relaxed);
  }

  // Host -> device on the compute stream: fill(pinned) writes the bytes (at most the reserved
  // piece) into a page-locked buffer, which the DMA then reads — no copy through pageable
  // memory. The buffer's previous transfer has completed first; the caller may go on while this
  // one is in flight (the next fill goes to the other buffer).
  template <class Fill>
  void fill_to_device(void* dst, std::size_t bytes, Fill&& fill) {
    ready();
    if (bytes > chunk_) throw std::invalid_argument("zenflow: cuda_pinned: piece larger than reserved");
    if (bytes == 0) return;
    const int b = next_;
    next_ ^= 1;
    wait_train(b);
    fill(static_cast<void*>(train_[b].data()));
    copy_marked(dst, train_[b].data(), bytes, cudaMemcpyHostToDevice, space_->stream(), train_ev_[b]);
    train_used_[b] = true;
    to_device_.fetch_add(bytes, std::memory_order_relaxed);
  }

  // A device block to the host in pieces of at most `chunk` bytes, on the copy stream, after the
  // compute stream has reached `ready`: consume(host_piece, offset, bytes) for each piece in
  // order on the calling thread, while the next pieces are in flight.
  template <class Consume>
  void stream_to_host(const cuda_space::event& ready_at, const void* src, std::size_t bytes, std::size_t chunk,
                      Consume&& consume) {
    const offload_block one{src, bytes, chunk};
    stream_blocks_to_host(ready_at, &one, 1, [&](std::size_t, const void* piece, std::size_t off, std::size_t len) {
      consume(piece, off, len);
    });
  }

  // Blocks [0, n) in turn, each in pieces of at most its `piece` bytes (<= the reserved lane
  // piece), on the copy stream after the compute stream has reached `ready`: consume(block,
  // host_piece, offset, bytes) for each piece in order on the calling thread. Up to `lanes`
  // pieces are in flight, across block boundaries (the queue never drains between blocks); a
  // piece's buffer is refilled only after its consumer has returned.
  template <class Consume>
  void stream_blocks_to_host(const cuda_space::event& ready_at, const offload_block* blocks, std::size_t n,
                             Consume&& consume) {
    ready();
    for (std::size_t b = 0; b < n; ++b)
      if (blocks[b].bytes && (blocks[b].piece > lane_chunk_ || blocks[b].piece == 0))
        throw std::invalid_argument(blocks[b].piece ? "zenflow: cuda_pinned: piece larger than reserved"
                                                    : "zenflow: cuda_pinned: pieces of 0 bytes");
    ZF_CUDA_TRY(cudaSetDevice(space_->device()));  // this runs on the scheduler's own thread
    if (ready_at.get()) ZF_CUDA_TRY(cudaStreamWaitEvent(copy_stream_, ready_at.get(), 0));
    struct at {
      std::size_t block, off, len;
    };
    // the pieces in order, walked by `next`: the piece after (block, off), skipping empty blocks
    auto first_from = [&](std::size_t b, std::size_t off) -> at {
      while (b < n && off >= blocks[b].bytes) {
        ++b;
        off = 0;
      }
      if (b == n) return {n, 0, 0};
      return {b, off, std::min(blocks[b].piece, blocks[b].bytes - off)};
    };
    at inflight[lanes];
    int queued = 0;
    at cursor = first_from(0, 0);
    auto enqueue = [&](int slot) {
      const at p = cursor;
      const auto* in = static_cast<const unsigned char*>(blocks[p.block].src) + p.off;
      copy_marked(lane_[slot].data(), in, p.len, cudaMemcpyDeviceToHost, copy_stream_, lane_ev_[slot]);
      inflight[slot] = p;
      ++queued;
      cursor = first_from(p.block, p.off + p.len);
    };
    try {
      for (int slot = 0; slot < lanes && cursor.block < n; ++slot) enqueue(slot);
      for (int slot = 0; queued > 0; slot = (slot + 1) % lanes) {
        const at p = inflight[slot];
        lane_ev_[slot].wait();
        --queued;
        to_host_.fetch_add(p.len, std::memory_order_relaxed);
        consume(p.block, static_cast<const void*>(lane_[slot].data()), p.off, p.len);
        if (cursor.block < n) enqueue(slot);  // the buffer just consumed takes the next piece
      }
    } catch (...) {
      // pieces may be in flight: let them land before anyone reuses the source blocks or the
      // lane buffers (the caller may retry the step)
      cudaStreamSynchronize(copy_stream_);
      throw;
    }
  }

  // The stream the offload lane's copies run on (ordered after the compaction by an event).
  cudaStream_t copy_stream() const noexcept { return copy_stream_; }

  std::uint64_t bytes_to_host() const noexcept { return to_host_.load(std::memory_order_relaxed); }
  std::uint64_t bytes_to_device() const noexcept { return to_device_.load(std::memory_order_relaxed); }
  std::size_t pinned_bytes() const noexcept {
    return space_ ? 2 * chunk_ + std::size_t(lanes + (ahead_ ? 2 : 0)) * lane_chunk_ : 0;
  }
  // The pinned buffers of the offload lane: `lanes` of the lane piece each.
  static constexpr int lanes = 3;

 private:
  void ready() const {
    if (!space_) throw std::logic_error("zenflow: cuda_pinned used before reserve() (optimizer not initialised)");
  }
  void ready_ahead() const {
    ready();
    if (!ahead_) throw std::logic_error("zenflow: cuda_pinned: an upload ahead without upload_ahead(true)");
  }
  // An asynchronous copy on `st`, then `done` recorded after it: the buffer's mark that the copy
  // has landed. Should the record fail with the copy queued, nothing would mark it and the
  // pinned buffer would be refilled (or read) under the DMA: the stream is drained first, then
  // the error thrown, so a failed call leaves no copy in flight.
  static void copy_marked(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t st,
                          const cuda_space::event& done) {
    ZF_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, st));
    if (const cudaError_t e = cudaEventRecord(done.get(), st); e != cudaSuccess) {
      cudaStreamSynchronize(st);
      cuda_detail::check(e, "cudaEventRecord", __FILE__, __LINE__);
    }
  }
  void wait_train(int b) {
    if (train_used_[b]) train_ev_[b].wait();
    train_used_[b] = false;
  }

  cuda_space* space_ = nullptr;
  std::size_t chunk_ = 0, lane_chunk_ = 0;
  pinned_array<unsigned char> train_[2], lane_[lanes];
  cuda_space::event train_ev_[2], lane_ev_[lanes];
  bool train_used_[2] = {false, false};
  int next_ = 0;
  cudaStream_t copy_stream_ = nullptr;
  // uploads ahead: two pinned buffers and a stream of their own; the job's end, and the compute
  // stream's last read of the device area
  bool ahead_ = false;
  pinned_array<unsigned char> up_[2];
  cuda_space::event up_ev_[2], up_done_, consumed_;
  bool up_used_[2] = {false, false}, done_recorded_ = false, consumed_recorded_ = false;
  int up_next_ = 0;
  cudaStream_t up_stream_ = nullptr;
  std::atomic<std::uint64_t> to_host_{0}, to_device_{0};
};

}  // namespace zenflow
