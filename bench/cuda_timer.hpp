// What the CUDA benches share: the median of a set of timings, CUDA-event timing of the work a
// function enqueues on a stream (the GPU's own time for it), and a kernel that spins for a time.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include <zenflow/cuda.hpp>

namespace zf_bench {

// One thread busy for `ns` of wall time, whatever the SM clock (the global timer counts
// nanoseconds; a cycle count would run long whenever the SM is below its maximum clock).
template <int = 0>
__global__ void spin_ns(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

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
