// main() of the CUDA test programs. Without a usable GPU (no device, or no driver: error 35) the
// GPU test cases skip themselves, and the program exits with 77, which ctest reports as
// "Skipped" — never as passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdio>

#include "cuda_support.hpp"

bool zf_test::has_gpu() {
  static const bool yes = [] {
    int n = 0;  // left unwritten when there is no driver
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) std::printf("zenflow cuda tests: %s: GPU test cases skipped\n", cudaGetErrorString(e));
    else if (n == 0) std::printf("zenflow cuda tests: no CUDA device: GPU test cases skipped\n");
    return e == cudaSuccess && n > 0;
  }();
  return yes;
}

int main(int argc, char** argv) {
  const int rc = doctest::Context(argc, argv).run();
  if (rc == 0 && !zf_test::has_gpu()) return 77;
  return rc;
}
