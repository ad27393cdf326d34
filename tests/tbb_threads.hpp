// The oneTBB thread count a test program asks for in ZENFLOW_TEST_TBB_THREADS, if any: the
// ThreadSanitizer run sets 1, because TSan cannot see the synchronisation inside the
// uninstrumented oneTBB library and would report every parallel_for hand-off; with oneTBB on
// the calling thread, TSan checks zenflow's own threads. (tests/main.cpp, checkpoint_writer.cpp)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <optional>

namespace zf_test {
inline std::optional<std::size_t> tbb_threads_from_env() {
  const char* env = std::getenv("ZENFLOW_TEST_TBB_THREADS");
  if (!env) return std::nullopt;
  return std::size_t(std::max(1, std::atoi(env)));
}
}  // namespace zf_test
