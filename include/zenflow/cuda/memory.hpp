// RAII CUDA memory: device arrays (the cuda_space's buffers) and page-locked host arrays (the
// transport's staging). Allocation failures throw zenflow::cuda_error; a moved-from or
// default-constructed array is empty and owns nothing. Plain C++ (compiles with a host compiler).
#pragma once

#include <cstddef>
#include <utility>

#include "error.hpp"

namespace zenflow::cuda_detail {

// Enqueues work with enqueue(stream) on a non-blocking stream of its own and waits for it:
// complete on return, and waiting for nothing else on the device. (The legacy default stream
// would also wait for every blocking stream of the device, such as a trainer's NCCL collective
// that waits for this very rank: a deadlock.) The first error, or cudaSuccess.
template <class Enqueue>
cudaError_t run_alone(Enqueue&& enqueue) noexcept {
  cudaStream_t s = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return e;
  e = enqueue(s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  const cudaError_t d = cudaStreamDestroy(s);
  return e != cudaSuccess ? e : d;
}

template <class T, bool Pinned>
class raw_array {
 public:
  raw_array() = default;
  explicit raw_array(std::size_t n) : n_(n) {
    if (n == 0) return;
    void* p = nullptr;
    if constexpr (Pinned) ZF_CUDA_TRY(cudaMallocHost(&p, n * sizeof(T)));
    else ZF_CUDA_TRY(cudaMalloc(&p, n * sizeof(T)));
    p_ = static_cast<T*>(p);
    if constexpr (!Pinned) {
      // zeroed like the host space's arrays, so no state ever starts as garbage; complete on
      // return, so the zeroing cannot land after a later copy or kernel on another stream
      const cudaError_t e = run_alone([&](cudaStream_t s) { return cudaMemsetAsync(p_, 0, n * sizeof(T), s); });
      if (e != cudaSuccess) {
        release();
        throw_error(e, "zeroing new device memory", __FILE__, __LINE__);
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) p_[i] = T{};
    }
  }
  raw_array(raw_array&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  raw_array& operator=(raw_array&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  raw_array(const raw_array&) = delete;
  raw_array& operator=(const raw_array&) = delete;
  ~raw_array() { release(); }

  T* data() noexcept { return p_; }
  const T* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

 private:
  void release() noexcept {
    if (!p_) return;
    if constexpr (Pinned) cudaFreeHost(p_);
    else cudaFree(p_);
    p_ = nullptr;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace zenflow::cuda_detail

namespace zenflow {
template <class T>
using device_array = cuda_detail::raw_array<T, false>;  // device memory
template <class T>
using pinned_array = cuda_detail::raw_array<T, true>;   // page-locked host memory
}  // namespace zenflow
