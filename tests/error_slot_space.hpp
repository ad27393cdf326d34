// A host space whose threads each have an error slot, as CUDA's last-error slot is per thread:
// a test leaves an "error from an earlier call" there, and the optimizer meets it as it would a
// CUDA error nobody checked (cuda_space::error_pending / check_no_pending_error). So the host
// suite runs the optimizer's handling of such an error — refused before anything changes, on
// every rank when data parallel — which no GPU-less machine could otherwise reach.
#pragma once

#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>

#include <zenflow/zenflow.hpp>

namespace zf_test {

struct error_slot_space : zenflow::host_space {
  using zenflow::host_space::host_space;
  error_slot_space() = default;  // (not an aggregate: built as the host space is)
  static inline thread_local int left = 0;  // the error an earlier call left on this thread (0: none)
  static bool error_pending() noexcept { return left != 0; }
  static void check_no_pending_error(const char* call) {
    if (left) throw std::runtime_error(std::string(call) + ": error " + std::to_string(left) + " left by an earlier call");
  }
};

// A host space whose "device" allocations fail on the threads that ask for it (fail_alloc): one
// rank's device running out of memory in the middle of a step, which data parallel must meet on
// every rank alike (the optimizer's gather space grows mid-step).
struct alloc_fail_space : zenflow::host_space {
  using zenflow::host_space::host_space;
  alloc_fail_space() = default;
  static inline thread_local bool fail_alloc = false;
  template <class T>
  struct buffer : zenflow::host::host_array<T> {
    buffer() = default;
    explicit buffer(std::size_t n) : zenflow::host::host_array<T>(allowed(n)) {}

   private:
    static std::size_t allowed(std::size_t n) {
      if (fail_alloc) throw std::bad_alloc();
      return n;
    }
  };
};

}  // namespace zf_test
