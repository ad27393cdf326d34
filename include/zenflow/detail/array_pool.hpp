// Many small arrays in one allocation. A model of very many small tensors (norms, biases, small
// heads) would otherwise pay an allocation per array — its header and alignment slack, several
// times the array itself for a tensor of a few elements (and on a GPU, a cudaMalloc each). A
// component requests all its arrays, then commits: the small ones are carved from one zeroed
// block of exactly their total size (each at its type's alignment: no padding to count, since
// the kernels do not need more), a large one gets an allocation of its
// own, also held by the pool. A pooled_array is a view of its elements (a pointer and a count)
// with the interface of a buffer (data, size, operator[]), valid while its pool lives.
//
// Family is anything with `template <class T> using buffer = ...` (a Space, or host_family).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "../host/buffer.hpp"

namespace zenflow::detail {

struct host_family {
  template <class T>
  using buffer = host::host_array<T>;
};

template <class Family>
class array_pool;

template <class Family, class T>
class pooled_array {
 public:
  T* data() noexcept { return p_; }
  const T* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  T& operator[](std::size_t i) noexcept { return p_[i]; }
  const T& operator[](std::size_t i) const noexcept { return p_[i]; }

 private:
  friend class array_pool<Family>;
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

template <class Family>
class array_pool {
 public:
  // Arrays of at most this many bytes share the block; a larger one's own allocation costs
  // under 2% in header and slack.
  static constexpr std::size_t small_bytes = 4096;

  // n elements (zeroed) for `a`, placed by commit() if small, now if large. `a` must stay where
  // it is until commit().
  template <class T>
  void request(pooled_array<Family, T>& a, std::size_t n) {
    a.n_ = n;
    a.p_ = nullptr;
    if (n == 0) return;
    if (n > small_bytes / sizeof(T)) {
      if (n > ~std::size_t(0) / sizeof(T)) throw std::bad_alloc();
      a.p_ = reinterpret_cast<T*>(blocks_.emplace_back(n * sizeof(T)).data());
      return;
    }
    total_ = (total_ + alignof(T) - 1) / alignof(T) * alignof(T);
    pending_.push_back({&a, &place<T>, total_});
    total_ += n * sizeof(T);
  }

  // Allocates the block of every small array requested so far and places them.
  void commit() {
    if (pending_.empty()) return;
    blocks_.emplace_back(total_);
    unsigned char* base = blocks_.back().data();
    for (const auto& r : pending_) r.place(r.array, base + r.at);
    std::vector<request_t>().swap(pending_);  // (a request list can be large: freed, not kept)
    total_ = 0;
  }

 private:
  template <class T>
  static void place(void* array, unsigned char* at) noexcept {
    auto& a = *static_cast<pooled_array<Family, T>*>(array);
    a.p_ = reinterpret_cast<T*>(at);
  }
  struct request_t {
    void* array;
    void (*place)(void*, unsigned char*) noexcept;
    std::size_t at;
  };
  std::vector<request_t> pending_;
  std::size_t total_ = 0;
  std::vector<typename Family::template buffer<unsigned char>> blocks_;  // the shared ones and the large ones
};

}  // namespace zenflow::detail
