// Uses the installed package's CUDA target from a .cu file: compiles only if zenflow::cuda gives
// nvcc C++20. Runs with or without a GPU: without one, initialize() must throw a cuda_error.
#include <cstdio>
#include <vector>

#include <zenflow/cuda.hpp>

int main() {
  int n = 0;
  const bool gpu = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  std::vector<float> host(64 * 64, 0.5f), host_grad(64 * 64, 0.0f);
  float* w = nullptr;
  float* g = nullptr;
  if (gpu) {
    if (cudaMalloc(&w, host.size() * 4) != cudaSuccess || cudaMalloc(&g, host.size() * 4) != cudaSuccess) return 1;
    cudaMemcpy(w, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
    cudaMemset(g, 0, host.size() * 4);
  } else {
    w = host.data();  // never dereferenced: initialize() fails first
    g = host_grad.data();
  }
  zenflow::optimizer<zenflow::cuda_space> opt(zenflow::config{});
  opt.add_matrix({w, g, 64, 64, zenflow::dtype::f32, zenflow::dtype::f32});
  try {
    opt.initialize();
    const zenflow::step_info info = opt.step(1.0f);
    std::printf("consumer_cuda ok: a step on the GPU (skipped: %d)\n", int(info.skipped));
    return info.skipped ? 1 : 0;
  } catch (const zenflow::cuda_error& e) {
    std::printf("consumer_cuda ok without a GPU: %s\n", e.what());
    return gpu ? 1 : 0;
  }
}
