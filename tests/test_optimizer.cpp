// The ZenFlow optimizer on the host space against the independent double-precision model of
// its rules (tests/reference/zenflow_reference.hpp): random configurations, shapes, layouts
// and dtypes, tens of steps, every parameter, master, count, selection and byte count compared
// after every step.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include <zenflow/zenflow.hpp>

#include "optimizer_harness.hpp"

using namespace zenflow;
using namespace zf_test;

// the optional transport paths the optimizer detects are detected for the host transport (the
// CUDA build checks cuda_pinned the same way in test_cuda_no_device)
static_assert(filling_transport<host_copy> && block_streaming_transport<host_copy, host_space>);

TEST_CASE("zenflow on the host space matches the reference model, step by step") {
  const std::uint64_t seeds = full_or_quick<std::uint64_t>(400, 40);
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    const scenario sc = random_scenario(seed);
    optimizer<> opt(sc.cfg);
    run_scenario(sc, opt);
  }
}
