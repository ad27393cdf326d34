// Uses the installed package's NCCL target from a .cu file: compiles and links only if
// zenflow::nccl brings NCCL's headers and library. With a GPU, one data-parallel step on one rank;
// without one, nothing NCCL can run.
#include <cstdio>
#include <vector>

#include <zenflow/cuda.hpp>
#include <zenflow/nccl.hpp>

using nccl_optimizer =
    zenflow::optimizer<zenflow::cuda_space, zenflow::column_topk, zenflow::fused_adamw<zenflow::cuda_space>,
                       zenflow::simd_accumulator, zenflow::cuda_pinned, zenflow::bounded_async, zenflow::nccl_communicator>;

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("consumer_nccl ok without a GPU (built and linked against NCCL %d)\n", NCCL_VERSION_CODE);
    return 0;
  }
  ncclComm_t comm = nullptr;
  int dev = 0;
  if (ncclCommInitAll(&comm, 1, &dev) != ncclSuccess) return 1;
  std::vector<float> host(64 * 64, 0.5f);
  float* w = nullptr;
  float* g = nullptr;
  if (cudaMalloc(&w, host.size() * 4) != cudaSuccess || cudaMalloc(&g, host.size() * 4) != cudaSuccess) return 1;
  cudaMemcpy(w, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(g, 0, host.size() * 4);
  int rc = 0;
  {
    nccl_optimizer opt(zenflow::config{}, zenflow::nccl_communicator(comm));
    opt.add_matrix({w, g, 64, 64, zenflow::dtype::f32, zenflow::dtype::f32});
    opt.initialize();
    const zenflow::step_info info = opt.step(1.0f);
    std::printf("consumer_nccl ok: a data-parallel step on one rank (skipped: %d)\n", int(info.skipped));
    rc = info.skipped ? 1 : 0;
  }
  ncclCommDestroy(comm);
  return rc;
}
