// CUDA errors as exceptions: every runtime call zenflow makes is checked, and a failure throws
// zenflow::cuda_error naming the call, the file and line, and CUDA's error name and string.
// Plain C++ (compiles with a host compiler too).
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace zenflow {

class cuda_error : public std::runtime_error {
 public:
  cuda_error(cudaError_t code, const std::string& what) : std::runtime_error(what), code_(code) {}
  cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

namespace cuda_detail {
[[noreturn]] inline void throw_error(cudaError_t e, const char* call, const char* file, int line) {
  throw cuda_error(e, std::string("zenflow: ") + call + " failed at " + file + ":" + std::to_string(line) + ": " +
                          cudaGetErrorName(e) + " (" + std::to_string(int(e)) + "): " + cudaGetErrorString(e));
}
inline void check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess) throw_error(e, call, file, line);
}
// After a kernel launch: the thread's last error, cleared. cudaErrorNotReady is never what a
// launch produces: it is the answer of a stream or event query (the trainer's own, typically)
// that the runtime also keeps as the last error, so it is cleared and not thrown.
inline void check_launch_status(cudaError_t e, const char* file, int line) {
  if (e != cudaSuccess && e != cudaErrorNotReady) throw_error(e, "kernel launch", file, line);
}
inline void check_launch(const char* file, int line) { check_launch_status(cudaGetLastError(), file, line); }
}  // namespace cuda_detail

}  // namespace zenflow

#define ZF_CUDA_TRY(call) ::zenflow::cuda_detail::check((call), #call, __FILE__, __LINE__)
#define ZF_CUDA_CHECK_LAUNCH() ::zenflow::cuda_detail::check_launch(__FILE__, __LINE__)
