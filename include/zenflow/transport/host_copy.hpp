// Transport policy for the host space: device and host memory are the same, so a transfer is a
// memcpy (or, for a streamed block, no copy at all); it still goes through here so that the
// bytes crossing "the link" are counted exactly as a GPU transport moves them. Thread-safe for
// one caller per direction.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "offload_block.hpp"

namespace zenflow {

class host_copy {
 public:
  // Device -> host, complete on return.
  void to_host(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
    to_host_.fetch_add(bytes, std::memory_order_relaxed);
  }
  // Host -> device; the host buffer may be reused on return.
  void to_device(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
    to_device_.fetch_add(bytes, std::memory_order_relaxed);
  }
  // Host -> device, the bytes written by fill(staging) straight into dst (no copy here).
  template <class Fill>
  void fill_to_device(void* dst, std::size_t bytes, Fill&& fill) {
    if (bytes) fill(dst);
    to_device_.fetch_add(bytes, std::memory_order_relaxed);
  }
  // A device block to the host in pieces of at most `chunk` bytes, once the device work before
  // `ready` is done: consume(host_piece, offset, bytes) for each piece, in order, on the calling
  // thread. Here the piece is the block itself (no copy).
  template <class Event, class Consume>
  void stream_to_host(const Event&, const void* src, std::size_t bytes, std::size_t chunk, Consume&& consume) {
    if (bytes && chunk == 0) throw std::invalid_argument("zenflow: host_copy: pieces of 0 bytes");
    const auto* in = static_cast<const unsigned char*>(src);
    for (std::size_t off = 0; off < bytes; off += chunk) {
      const std::size_t len = bytes - off < chunk ? bytes - off : chunk;
      to_host_.fetch_add(len, std::memory_order_relaxed);
      consume(static_cast<const void*>(in + off), off, len);
    }
  }

  // Blocks [0, n) in turn, each in its pieces, as stream_to_host: consume(block, piece, offset,
  // bytes).
  template <class Event, class Consume>
  void stream_blocks_to_host(const Event& ready, const offload_block* blocks, std::size_t n, Consume&& consume) {
    for (std::size_t b = 0; b < n; ++b)  // (refused before any piece is consumed, as cuda_pinned does)
      if (blocks[b].bytes && blocks[b].piece == 0) throw std::invalid_argument("zenflow: host_copy: pieces of 0 bytes");
    for (std::size_t b = 0; b < n; ++b)
      stream_to_host(ready, blocks[b].src, blocks[b].bytes, blocks[b].piece,
                     [&](const void* piece, std::size_t off, std::size_t len) { consume(b, piece, off, len); });
  }

  // Uploads ahead of the boundary (ahead_transport; off unless asked for before initialize():
  // the optimizer then keeps a "device" area of the unselected params' bytes). Here the update
  // lane's fill writes straight into that area and nothing needs ordering; the bytes count when
  // the boundary applies them.
  host_copy& upload_ahead(bool on) {
    if (fixed_) throw std::logic_error("zenflow: host_copy::upload_ahead must be set before initialize()");
    ahead_ = on;
    return *this;
  }
  // Called by the optimizer's initialize(), which reads the setting then (nothing to reserve
  // here): a later upload_ahead() is refused, as cuda_pinned's is, instead of being ignored.
  template <class Space>
  void reserve(Space&, std::size_t, std::size_t = 0) noexcept {
    fixed_ = true;
  }
  bool uploads_ahead() const noexcept { return ahead_; }
  static constexpr std::size_t ahead_piece() noexcept { return std::size_t(-1); }
  void ahead_begin() noexcept {}
  template <class Fill>
  void fill_ahead(void* dst, std::size_t bytes, Fill&& fill) {
    if (bytes) fill(dst);
  }
  void ahead_done() noexcept {}
  void await_ahead() noexcept {}
  void ahead_consumed() noexcept {}
  void account_to_device(std::size_t bytes) noexcept { to_device_.fetch_add(bytes, std::memory_order_relaxed); }

  std::uint64_t bytes_to_host() const noexcept { return to_host_.load(std::memory_order_relaxed); }
  std::uint64_t bytes_to_device() const noexcept { return to_device_.load(std::memory_order_relaxed); }

 private:
  // atomic: the offload lane moves gradients while the training thread uploads params
  std::atomic<std::uint64_t> to_host_{0}, to_device_{0};
  bool ahead_ = false, fixed_ = false;
};

}  // namespace zenflow
