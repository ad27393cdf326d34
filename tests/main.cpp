#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <oneapi/tbb/global_control.h>

int main(int argc, char** argv) {
  // Let arenas of up to 8 threads really run that many (the default caps workers at the
  // core count), so thread-count invariance is tested with true oversubscription too.
  tbb::global_control threads(tbb::global_control::max_allowed_parallelism, 8);
  return doctest::Context(argc, argv).run();
}
