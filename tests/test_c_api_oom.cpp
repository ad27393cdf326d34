// The C API when memory runs out: no call may throw past the C boundary or abort, even when
// storing the error's own message fails. A program of its own, since it replaces the global
// operator new (which throws while `starve` is set on the thread); the C API's definitions are
// compiled in here, as a trainer without CMake would (c_impl.hpp in one C++ file).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <new>
#include <string>

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

TEST_CASE("C API: out of memory while failing returns a status and a fixed message, never throws or aborts") {
  zf_optimizer* opt = nullptr;
  REQUIRE(zf_create("zenflow", nullptr, &opt) == ZF_OK);
  const std::string fixed = "zenflow: out of memory (the error's own message could not be stored)";
  // The thread's message starts empty (no room for a long text): with nothing to allocate,
  // set_lr's own error cannot even be built (bad_alloc), and "out of memory" cannot be stored.
  starve = true;
  const zf_status lr = zf_set_lr(opt, NAN);
  const std::string lr_msg = (starve = false, zf_last_error());
  CHECK(lr == ZF_OUT_OF_MEMORY);
  // (libstdc++ keeps at most 15 characters without allocating, so "zenflow: out of memory"
  // cannot be stored either: the fallback; a library with a longer inline buffer stores it)
#if defined(__GLIBCXX__)
  CHECK(lr_msg == fixed);
#else
  CHECK((lr_msg == fixed || lr_msg == "zenflow: out of memory"));
#endif
  // an argument check outside any try block (a NULL handle), the same
  starve = true;
  const zf_status null = zf_step(nullptr, 1.0f, nullptr);
  const std::string null_msg = (starve = false, zf_last_error());
  CHECK(null == ZF_INVALID_ARGUMENT);
#if defined(__GLIBCXX__)
  CHECK(null_msg == fixed);
#else
  CHECK((null_msg == fixed || null_msg == "zenflow: the optimizer handle is NULL"));
#endif
  // with memory again, the messages are the real ones
  CHECK(zf_set_lr(opt, NAN) == ZF_INVALID_ARGUMENT);
  CHECK(std::string(zf_last_error()).find("lr must be finite and >= 0") != std::string::npos);
  // a message that fits what the thread already holds is stored even while starving
  starve = true;
  const zf_status again = zf_step(nullptr, 1.0f, nullptr);
  const std::string again_msg = (starve = false, zf_last_error());
  CHECK(again == ZF_INVALID_ARGUMENT);
  CHECK(again_msg == "zenflow: the optimizer handle is NULL");
  zf_destroy(opt);
}
