// CUDA errors as exceptions: every runtime call zenflow makes is checked, and a failure throws
// zenflow::cuda_error naming the call, the file and line, and CUDA's error name and string.
// Plain C++ (compiles with a host compiler too).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <system_error>

namespace zenflow {

// CUDA's error codes as a std::error_category: out of memory (cudaErrorMemoryAllocation) is
// equivalent to std::errc::not_enough_memory, so a trainer (and the C API, which returns
// ZF_OUT_OF_MEMORY for it) tells a device or pinned memory shortage it can act on from a failure.
class cuda_error_category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "cuda"; }
  std::string message(int c) const override {
    const auto e = static_cast<cudaError_t>(c);
    return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  }
  std::error_condition default_error_condition(int c) const noexcept override {
    if (c == int(cudaErrorMemoryAllocation)) return std::make_error_condition(std::errc::not_enough_memory);
    return std::error_condition(c, *this);
  }
};
inline const std::error_category& cuda_category() noexcept {
  static const cuda_error_category category;
  return category;
}

// what() is the message given, whole (it names the call and CUDA's error already); code() is the
// cudaError_t, error_code() the same as a std::error_code of cuda_category().
class cuda_error : public std::system_error {
 public:
  cuda_error(cudaError_t code, const std::string& what)
      : std::system_error(int(code), cuda_category()), code_(code), what_(what) {}
  cudaError_t code() const noexcept { return code_; }
  const std::error_code& error_code() const noexcept { return std::system_error::code(); }
  const char* what() const noexcept override { return what_.what(); }

 private:
  cudaError_t code_;
  std::runtime_error what_;  // (its copy cannot throw, as an exception's must not)
};

namespace cuda_detail {
// The error is also taken off the thread's last-error slot (where a failed runtime call leaves
// it, as a failed launch does): it is reported here, and left there the next launch check would
// report it again as that kernel's failure — a cudaMalloc that failed in initialize(), retried
// after the trainer freed memory, would make the first kernel "fail" with out of memory. (A
// sticky error, a device fault, stays: every later call returns it anyway.)
[[noreturn]] inline void throw_error(cudaError_t e, const char* call, const char* file, int line) {
  (void)cudaGetLastError();
  throw cuda_error(e, std::string("zenflow: ") + call + " failed at " + file + ":" + std::to_string(line) + ": " +
                          cudaGetErrorName(e) + " (" + std::to_string(int(e)) + "): " + cudaGetErrorString(e));
}
inline void check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess) throw_error(e, call, file, line);
}
// Debug mode: when on, every launch check also waits for the device and checks again, so an
// asynchronous fault (an illegal address, say) is reported at the launch of the kernel that made
// it, by name, instead of at some later synchronisation. Off unless the environment variable
// ZENFLOW_CUDA_SYNC_CHECK is set to anything but "" or "0" when first asked, or
// set_sync_check(true) is called. Slow: for bring-up and debugging only.
inline bool sync_check_from_env(const char* v) noexcept { return v && *v && !(v[0] == '0' && v[1] == 0); }
inline std::atomic<bool>& sync_check_flag() noexcept {
  static std::atomic<bool> on{sync_check_from_env(std::getenv("ZENFLOW_CUDA_SYNC_CHECK"))};
  return on;
}
inline bool sync_check_enabled() noexcept { return sync_check_flag().load(std::memory_order_relaxed); }

// Statuses that a launch never produces and that the runtime still keeps as the thread's last
// error: the answer of a stream or event query (cudaErrorNotReady), and the "already" of a call
// whose work was already done (peer access already enabled, host memory already registered),
// which trainers commonly ignore. Neither a launch failure nor a pending error.
inline bool answer_not_failure(cudaError_t e) noexcept {
  return e == cudaErrorNotReady || e == cudaErrorPeerAccessAlreadyEnabled || e == cudaErrorHostMemoryAlreadyRegistered;
}
// Whether `e`, read from the thread's last-error slot, is an error (not success, not one of the
// answers above).
inline bool is_failure(cudaError_t e) noexcept { return e != cudaSuccess && !answer_not_failure(e); }

// Clears the thread's last-error slot if it holds one of the answers above (a stream query's
// "not ready" that zenflow's own polling left, say), and only then: a library that checks its
// launches by peeking at the slot (CUB does) would otherwise report that answer as its failure.
inline void clear_answer() noexcept {
  if (answer_not_failure(cudaPeekAtLastError())) (void)cudaGetLastError();
}

// After a kernel launch: the thread's last error, cleared; thrown unless it is one of the
// answers above (the trainer's own, typically), which are cleared and not thrown.
inline void check_launch_status(cudaError_t e, const char* kernel, const char* file, int line) {
  if (is_failure(e)) throw_error(e, (std::string("kernel ") + kernel + " launch").c_str(), file, line);
}
inline void check_launch(const char* kernel, const char* file, int line) {
  check_launch_status(cudaGetLastError(), kernel, file, line);
  if (sync_check_enabled()) {
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) throw_error(e, (std::string("kernel ") + kernel + " (debug sync check)").c_str(), file, line);
  }
}
}  // namespace cuda_detail

// Turns the debug sync check (see cuda_detail::sync_check_flag) on or off for the process.
inline void set_cuda_sync_check(bool on) noexcept {
  cuda_detail::sync_check_flag().store(on, std::memory_order_relaxed);
}

}  // namespace zenflow

#define ZF_CUDA_TRY(call) ::zenflow::cuda_detail::check((call), #call, __FILE__, __LINE__)
#define ZF_CUDA_CHECK_LAUNCH(kernel) ::zenflow::cuda_detail::check_launch((kernel), __FILE__, __LINE__)
