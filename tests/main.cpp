#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <oneapi/tbb/global_control.h>

#include "tbb_threads.hpp"

int main(int argc, char** argv) {
  // Let arenas of up to 8 threads really run that many (the default caps workers at the core
  // count), so thread-count invariance is tested with true oversubscription too.
  // ZENFLOW_TEST_TBB_THREADS overrides it (tbb_threads.hpp).
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, zf_test::tbb_threads_from_env().value_or(8));
  return doctest::Context(argc, argv).run();
}
