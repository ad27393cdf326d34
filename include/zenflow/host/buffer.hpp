// Page-aligned host arrays for large optimizer state: 2 MiB alignment and a transparent huge
// page hint for big buffers (fewer TLB misses in bandwidth-bound kernels), zero-initialised.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#if defined(__linux__)
#  include <sys/mman.h>
#endif

namespace zenflow::host {

template <class T>
class host_array {
 public:
  host_array() = default;
  explicit host_array(std::size_t n) : n_(n) {
    if (n == 0) return;
    if (n > (~std::size_t(0) - huge_page) / sizeof(T)) throw std::bad_alloc();
    const std::size_t bytes = round_up(n * sizeof(T));
    data_ = static_cast<T*>(std::aligned_alloc(bytes >= huge_page ? huge_page : 64, bytes));
    if (!data_) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (bytes >= huge_page) ::madvise(data_, bytes, MADV_HUGEPAGE);  // a hint; failure is harmless
#endif
    std::memset(static_cast<void*>(data_), 0, bytes);
  }
  host_array(host_array&& o) noexcept : data_(std::exchange(o.data_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  host_array& operator=(host_array&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(n_, o.n_);
    return *this;
  }
  host_array(const host_array&) = delete;
  host_array& operator=(const host_array&) = delete;
  ~host_array() { std::free(data_); }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return n_; }
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  static constexpr std::size_t huge_page = std::size_t(2) << 20;
  static std::size_t round_up(std::size_t bytes) noexcept {
    const std::size_t a = bytes >= huge_page ? huge_page : 64;
    return (bytes + a - 1) / a * a;
  }
  T* data_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace zenflow::host
