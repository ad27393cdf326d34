// host_space: the "device" side of the optimizer runs on host threads. It is how
// everything is tested without a GPU, and a CPU-only training backend in its own right.
#pragma once

#include <cstddef>
#include <cstring>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include "../host/buffer.hpp"
#include "../params.hpp"

namespace zenflow {

class host_space {
 public:
  static constexpr const char* name = "host";
  // Memory the "device" side owns.
  template <class T>
  using buffer = host::host_array<T>;

  // threads: size of the arena that runs device-side work (0 = all cores).
  explicit host_space(unsigned threads = 0)
      : arena_(threads ? int(threads) : tbb::task_arena::automatic) {}

  tbb::task_arena& arena() noexcept { return arena_; }

  // f(i) for i in [0, n), split across the arena's threads.
  template <class F>
  void parallel_for(std::size_t n, const F& f) {
    if (n == 0) return;
    if (n == 1) return f(std::size_t(0));
    arena_.execute([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t i = r.begin(); i != r.end(); ++i) f(i);
      });
    });
  }

  // Device memory <-> device memory and host <-> device copies are plain memcpy here.
  static void copy(void* dst, const void* src, std::size_t bytes) noexcept {
    if (bytes) std::memcpy(dst, src, bytes);
  }

  // Device-side compaction: columns list[0..n) of a device matrix into a compact [n][rows]
  // device block (what the offload then moves to the host in one piece).
  static void compact_columns(const void* src, dtype t, matrix_layout layout, std::size_t rows, std::size_t cols,
                              const std::uint32_t* list, std::size_t n, void* dst) noexcept {
    detail::gather_columns(src, size_of(t), layout, rows, cols, list, n, dst);
  }

 private:
  tbb::task_arena arena_;
};

}  // namespace zenflow
