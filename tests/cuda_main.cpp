// main() of the CUDA test programs. Without a GPU — no device, or no NVIDIA driver installed at
// all (error 35 with no /dev/nvidiactl) — the GPU test cases skip themselves, and the program
// exits with 77, which ctest reports as "Skipped", never as passed. Any other CUDA error (a
// driver older than the runtime, a device unavailable or failing to initialise) is a broken GPU
// machine, not a machine without one: the program fails, saying which.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdio>

#include "cuda_support.hpp"

namespace {
enum class gpu_state { usable, absent, broken };
gpu_state probe_gpu() {
  static const gpu_state state = [] {
    int n = 0;  // left unwritten when there is no driver
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0) return gpu_state::usable;
    if (e == cudaSuccess || e == cudaErrorNoDevice) {
      std::printf("zenflow cuda tests: no CUDA device: GPU test cases skipped\n");
      return gpu_state::absent;
    }
    if (e == cudaErrorInsufficientDriver && !zf_test::nvidia_driver_present()) {
      std::printf("zenflow cuda tests: no NVIDIA driver (%s): GPU test cases skipped\n", cudaGetErrorString(e));
      return gpu_state::absent;
    }
    std::printf("zenflow cuda tests: the GPU cannot be used: %s (%s, %d): a broken GPU set-up, not a machine "
                "without a GPU\n",
                cudaGetErrorString(e), cudaGetErrorName(e), int(e));
    return gpu_state::broken;
  }();
  return state;
}
}  // namespace

bool zf_test::has_gpu() { return probe_gpu() == gpu_state::usable; }

int main(int argc, char** argv) {
  const int rc = doctest::Context(argc, argv).run();
  if (rc != 0) return rc;
  switch (probe_gpu()) {
    case gpu_state::usable: return 0;
    case gpu_state::absent: return 77;
    case gpu_state::broken: return 1;
  }
  return 1;
}
