// What the CUDA benches share: the median of a set of timings, and CUDA-event timing of the work
// a function enqueues on a stream (the GPU's own time for it).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include <zenflow/cuda.hpp>

namespace zf_bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct timer {
  cudaEvent_t a, b;
  timer() {
    ZF_CUDA_TRY(cudaEventCreate(&a));
    ZF_CUDA_TRY(cudaEventCreate(&b));
  }
  timer(const timer&) = delete;
  timer& operator=(const timer&) = delete;
  ~timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  // Seconds between an event before f's work on s and one after it.
  template <class F>
  double seconds(cudaStream_t s, F&& f) {
    ZF_CUDA_TRY(cudaEventRecord(a, s));
    f();
    ZF_CUDA_TRY(cudaEventRecord(b, s));
    ZF_CUDA_TRY(cudaEventSynchronize(b));
    float ms = 0;
    ZF_CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
    return ms * 1e-3;
  }
};

}  // namespace zf_bench
