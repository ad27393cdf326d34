// This program is compiled with -ftz=true (tests/CMakeLists.txt), as --use_fast_math would: its
// CUDA code flushes subnormal floats to zero, which would change the device's AdamW, norms and
// scores against the host space's bits, and cuda_space::check_arithmetic() (which the optimizer
// calls at initialize()) must refuse it. test_cuda_space checks that a normal build passes the
// same probe. Skipped (ctest: "Skipped") without a GPU.
#include <doctest/doctest.h>

#include <stdexcept>

#include <zenflow/space/cuda_space.hpp>

#include "cuda_support.hpp"

using zf_test::has_gpu;

TEST_CASE("cuda: a build that flushes subnormals to zero is refused, naming the flags" * doctest::skip(!has_gpu())) {
  zenflow::cuda_space s;
  s.initialize();
  CHECK_THROWS_WITH_AS(s.check_arithmetic(),
                       doctest::Contains("flushes subnormal floats to zero (compiled with -ftz=true or --use_fast_math)"),
                       std::logic_error);
  // (the probe left no error behind: a refusal, not a failure)
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}
