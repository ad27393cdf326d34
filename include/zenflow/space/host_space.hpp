// host_space: the "device" side of the optimizer runs on host threads. It is how
// everything is tested without a GPU, and a CPU-only training backend in its own right.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include "../detail/fp_env.hpp"
#include "../host/buffer.hpp"
#include "../params.hpp"

namespace zenflow {

class host_space {
 public:
  static constexpr const char* name = "host";
  // Memory the "device" side owns.
  template <class T>
  using buffer = host::host_array<T>;

  // threads: size of the arena that runs device-side work (0 = all cores). The arena is set up
  // here, not at its first use in a step: oneTBB's set-up cannot fail safely (a failed
  // allocation inside it leaves the arena, or oneTBB itself, spinning at every later use), so a
  // failure there is the constructor's exception, before any training.
  explicit host_space(unsigned threads = 0)
      : arena_(threads ? int(threads) : tbb::task_arena::automatic) {
    arena_.initialize();
  }
  // (a copy, or a moved-to space, gets an arena of the same size, set up here too: oneTBB's copy
  // of an arena is not set up)
  host_space(const host_space& o) : arena_(o.arena_) { arena_.initialize(); }
  host_space(host_space&& o) : host_space(static_cast<const host_space&>(o)) {}

  tbb::task_arena& arena() noexcept { return arena_; }

  // f(i) for i in [0, n), split across the arena's threads (subnormals kept: detail/fp_env.hpp).
  template <class F>
  void parallel_for(std::size_t n, const F& f) {
    if (n == 0) return;
    if (n == 1) {
      const detail::keep_subnormals ieee;
      return f(std::size_t(0));
    }
    arena_.execute([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n), [&](const tbb::blocked_range<std::size_t>& r) {
        const detail::keep_subnormals ieee;
        for (std::size_t i = r.begin(); i != r.end(); ++i) f(i);
      });
    });
  }

  // The index of the first of n values of dtype t at p that is not finite (a NaN, an
  // infinity), or n: initialize()'s check of the params it takes masters from (read in place,
  // on the space's threads).
  std::size_t first_non_finite(const void* p, dtype t, std::size_t n) {
    std::size_t first = n;
    visit_dtype(t, [&](auto tag) { first = first_non_finite(arena_, static_cast<const typename decltype(tag)::type*>(p), n); });
    return first;
  }
  // The same for host memory, on the threads of `arena`.
  template <class P>
  static std::size_t first_non_finite(tbb::task_arena& arena, const P* x, std::size_t n) {
    constexpr std::size_t block = std::size_t(1) << 16;
    if (n <= block) return detail::first_non_finite_in(x, 0, n);
    std::atomic<std::size_t> lowest{n};
    arena.execute([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, (n + block - 1) / block), [&](const tbb::blocked_range<std::size_t>& r) {
        const std::size_t e = std::min(n, r.end() * block), k = detail::first_non_finite_in(x, r.begin() * block, e);
        std::size_t seen = lowest.load(std::memory_order_relaxed);
        while (k < e && k < seen && !lowest.compare_exchange_weak(seen, k, std::memory_order_relaxed)) {
        }
      });
    });
    return lowest.load();
  }

  // ---- the primitives the optimizer orders (a GPU space enqueues them on its stream) ----------
  struct no_stream {};
  using stream_type = no_stream;  // host work is ordered by the calling thread
  struct event {                  // a point in the device's work (nothing to wait for here)
    void create() noexcept {}     // (a GPU space creates its event here, not during a step)
  };
  void initialize() {}            // a GPU space checks its device here
  void set_stream(stream_type) noexcept {}
  void record(event&) noexcept {}
  void fence() noexcept {}  // every device operation ordered so far has finished

  // Device -> host memory, complete on return; host -> device, the host buffer reusable on
  // return. Control data only (column lists, checkpoints): the bytes of training traffic go
  // through the Transport, which counts them.
  static void download(void* host_dst, const void* src, std::size_t bytes) noexcept {
    if (bytes) std::memcpy(host_dst, src, bytes);
  }
  static void upload(void* dst, const void* host_src, std::size_t bytes) noexcept {
    if (bytes) std::memcpy(dst, host_src, bytes);
  }

  // Columns list[0..n) of a device matrix into a compact [n][rows] device block (list in device
  // memory), and back: the block's columns into the listed columns of a matrix.
  static void compact_columns(const void* src, dtype t, matrix_layout layout, std::size_t rows, std::size_t cols,
                              const std::uint32_t* list, std::size_t n, void* dst) noexcept {
    move_columns<false>(src, dst, size_of(t), layout, rows, cols, list, n);
  }
  static void scatter_columns(const void* block, dtype t, void* dst, matrix_layout layout, std::size_t rows,
                              std::size_t cols, const std::uint32_t* list, std::size_t n) noexcept {
    move_columns<true>(block, dst, size_of(t), layout, rows, cols, list, n);
  }
  // table[0..n) of pieces (see copy_piece), the table in host memory too.
  static void copy_pieces(const copy_piece* table, std::size_t n) noexcept {
    for (std::size_t k = 0; k < n; ++k)
      if (table[k].bytes) std::memcpy(table[k].dst, table[k].src, table[k].bytes);
  }
  // Fixed-width slots (a selected column's state): dst[dst_slot[k]] = src[src_slot[k]] for k < n,
  // a null slot list meaning the identity (slot k).
  static void move_slots(void* dst, const std::uint32_t* dst_slot, const void* src, const std::uint32_t* src_slot,
                         std::size_t n, std::size_t width) noexcept {
    auto* out = static_cast<unsigned char*>(dst);
    const auto* in = static_cast<const unsigned char*>(src);
    for (std::size_t k = 0; k < n; ++k)
      std::memcpy(out + (dst_slot ? dst_slot[k] : k) * width, in + (src_slot ? src_slot[k] : k) * width, width);
  }

 private:
  // Between column list[k] of a [rows] x [cols] matrix of es-byte elements and column k of a
  // compact [n][rows] block: gather (matrix -> block) or scatter (block -> matrix).
  template <bool Scatter>
  static void move_columns(const void* src, void* dst, std::size_t es, matrix_layout layout, std::size_t rows,
                           std::size_t cols, const std::uint32_t* list, std::size_t n) noexcept {
    const auto* in = static_cast<const unsigned char*>(src);
    auto* out = static_cast<unsigned char*>(dst);
    auto move = [&](std::size_t at, std::size_t block, std::size_t len) {  // byte offsets
      if (Scatter) std::memcpy(out + at, in + block, len);
      else std::memcpy(out + block, in + at, len);
    };
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t c = list[k];
      if (layout == matrix_layout::column_contiguous) move(c * rows * es, k * rows * es, rows * es);
      else
        for (std::size_t i = 0; i < rows; ++i) move((i * cols + c) * es, (k * rows + i) * es, es);
    }
  }

  tbb::task_arena arena_;
};

}  // namespace zenflow
