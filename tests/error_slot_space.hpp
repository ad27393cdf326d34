// A host space whose threads each have an error slot, as CUDA's last-error slot is per thread:
// a test leaves an "error from an earlier call" there, and the optimizer meets it as it would a
// CUDA error nobody checked (cuda_space::error_pending / check_no_pending_error). So the host
// suite runs the optimizer's handling of such an error — refused before anything changes, on
// every rank when data parallel — which no GPU-less machine could otherwise reach.
#pragma once

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

}  // namespace zf_test
