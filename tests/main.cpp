#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>

#include <oneapi/tbb/global_control.h>

int main(int argc, char** argv) {
  // Let arenas of up to 8 threads really run that many (the default caps workers at the core
  // count), so thread-count invariance is tested with true oversubscription too.
  // ZENFLOW_TEST_TBB_THREADS overrides it: the ThreadSanitizer run sets 1, because TSan cannot
  // see the synchronisation inside the uninstrumented oneTBB library and would report every
  // parallel_for hand-off; with TBB on the calling thread, TSan checks zenflow's own threads.
  const char* env = std::getenv("ZENFLOW_TEST_TBB_THREADS");
  const std::size_t threads = env ? std::size_t(std::max(1, std::atoi(env))) : 8;
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
  return doctest::Context(argc, argv).run();
}
