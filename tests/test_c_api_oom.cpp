// The C API when memory runs out: no call may throw past the C boundary or abort, even when
// storing the error's own message fails. A program of its own, since it replaces the global
// operator new (which throws while `starve` is set on the thread); the C API's definitions are
// compiled in here, as a trainer without CMake would (c_impl.hpp in one C++ file).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <new>
#include <string>
#include <utility>

#include <zenflow/c_impl.hpp>

namespace {
thread_local bool starve = false;
}

// (operator delete frees what this operator new took from malloc: GCC cannot see the pairing)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (starve) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

// A C API call made while no memory can be had; its status and the thread's message after it.
template <class Call>
std::pair<zf_status, std::string> starved(Call call) {
  starve = true;
  const zf_status st = call();
  starve = false;
  return {st, zf_last_error()};
}

const std::string fixed = "zenflow: out of memory (the error's own message could not be stored)";
// The fallback, where storing `real` needs memory. libstdc++ keeps at most 15 characters
// without allocating, so every message here needs it; a library with a longer inline buffer may
// store a short one.
bool fallback_or(const std::string& got, const std::string& real) {
#if defined(__GLIBCXX__)
  (void)real;
  return got == fixed;
#else
  return got == fixed || got == real;
#endif
}

TEST_CASE("C API: out of memory while failing returns a status and a fixed message, never throws or aborts") {
  zf_optimizer* opt = nullptr;
  REQUIRE(zf_create("zenflow", nullptr, &opt) == ZF_OK);
  // The thread's message starts empty (no room for a long text): with nothing to allocate,
  // set_lr's own error cannot even be built (bad_alloc), and "out of memory" cannot be stored.
  const auto lr = starved([&] { return zf_set_lr(opt, NAN); });
  CHECK(lr.first == ZF_OUT_OF_MEMORY);
  CHECK(fallback_or(lr.second, "zenflow: out of memory"));
  // an argument check outside any try block (a NULL handle), the same
  const auto null = starved([] { return zf_step(nullptr, 1.0f, nullptr); });
  CHECK(null.first == ZF_INVALID_ARGUMENT);
  CHECK(fallback_or(null.second, "zenflow: the optimizer handle is NULL"));
  // with memory again, the messages are the real ones
  CHECK(zf_set_lr(opt, NAN) == ZF_INVALID_ARGUMENT);
  CHECK(std::string(zf_last_error()).find("lr must be finite and >= 0") != std::string::npos);
  // a message that fits what the thread already holds is stored even while starving
  const auto again = starved([] { return zf_step(nullptr, 1.0f, nullptr); });
  CHECK(again.first == ZF_INVALID_ARGUMENT);
  CHECK(again.second == "zenflow: the optimizer handle is NULL");
  zf_destroy(opt);
}
