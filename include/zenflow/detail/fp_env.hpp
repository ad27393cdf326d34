// zenflow's host loops run with IEEE subnormals whatever the calling thread's floating-point
// settings: x86's MXCSR flush-to-zero (FTZ) and denormals-are-zero (DAZ) bits are per thread and
// anyone may set them — a trainer for speed, or, process-wide at load, a shared library linked
// with -ffast-math (crtfastmath). With them set, a host AdamW would flush what the device keeps,
// and the same step would give other bits on another thread. Each loop body of zenflow's holds
// a keep_subnormals for its run: it clears the two bits if set and puts the caller's back after.
#pragma once

#if defined(__SSE__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 1)
#include <xmmintrin.h>
#define ZENFLOW_HAS_MXCSR 1
#else
#define ZENFLOW_HAS_MXCSR 0
#endif

namespace zenflow::detail {

class keep_subnormals {
 public:
#if ZENFLOW_HAS_MXCSR
  // (reading MXCSR is cheap; it is written only when a bit has to change, twice then)
  keep_subnormals() noexcept : saved_(_mm_getcsr()) {
    if (saved_ & flush_bits) _mm_setcsr(saved_ & ~flush_bits);
  }
  ~keep_subnormals() {  // (the control bits back; the status flags the loop raised are kept)
    if (saved_ & flush_bits) _mm_setcsr((saved_ & ~status_bits) | (_mm_getcsr() & status_bits));
  }
#else
  keep_subnormals() noexcept {}  // (other architectures: the thread's settings, as they are)
#endif
  keep_subnormals(const keep_subnormals&) = delete;
  keep_subnormals& operator=(const keep_subnormals&) = delete;

#if ZENFLOW_HAS_MXCSR
 private:
  static constexpr unsigned flush_bits = 0x8040u;  // FTZ (bit 15) | DAZ (bit 6)
  static constexpr unsigned status_bits = 0x3fu;   // the sticky exception flags (bits 0-5)
  unsigned saved_;
#endif
};

}  // namespace zenflow::detail
