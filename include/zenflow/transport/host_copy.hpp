// Transport policy for the host space: device and host memory are the same, so a transfer is a
// memcpy; it still goes through here so that the bytes crossing "the link" are counted exactly
// as a GPU transport would move them. Thread-safe for one caller per direction.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../params.hpp"

namespace zenflow {

class host_copy {
 public:
  // Device -> host: columns list[0..n) of a device matrix into a compact host buffer (column
  // after column, `rows` elements each).
  void columns_to_host(const void* src, dtype t, matrix_layout layout, std::size_t rows,
                       std::size_t cols, const std::uint32_t* list, std::size_t n, void* dst) {
    detail::gather_columns(src, size_of(t), layout, rows, cols, list, n, dst);
    to_host_.fetch_add(n * rows * size_of(t), std::memory_order_relaxed);
  }

  // Host -> device: columns list[0..n) of a host [cols][rows] block into a device matrix.
  void columns_to_device(const void* block, dtype t, void* dst, matrix_layout layout, std::size_t rows,
                         std::size_t cols, const std::uint32_t* list, std::size_t n) {
    const std::size_t es = size_of(t);
    const auto* in = static_cast<const unsigned char*>(block);
    auto* out = static_cast<unsigned char*>(dst);
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t c = list[k];
      if (layout == matrix_layout::column_contiguous) {
        std::memcpy(out + c * rows * es, in + c * rows * es, rows * es);
      } else {
        for (std::size_t i = 0; i < rows; ++i)
          std::memcpy(out + (i * cols + c) * es, in + (c * rows + i) * es, es);
      }
    }
    to_device_.fetch_add(n * rows * es, std::memory_order_relaxed);
  }

  // Plain buffers (optimizer state of columns changing sides).
  void to_host(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
    to_host_.fetch_add(bytes, std::memory_order_relaxed);
  }
  void to_device(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
    to_device_.fetch_add(bytes, std::memory_order_relaxed);
  }

  std::uint64_t bytes_to_host() const noexcept { return to_host_.load(std::memory_order_relaxed); }
  std::uint64_t bytes_to_device() const noexcept { return to_device_.load(std::memory_order_relaxed); }

 private:
  // atomic: the offload lane moves gradients while the training thread uploads params
  std::atomic<std::uint64_t> to_host_{0}, to_device_{0};
};

}  // namespace zenflow
