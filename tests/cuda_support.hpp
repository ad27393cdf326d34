// Helpers of the CUDA test programs.
#pragma once

#include <unistd.h>

namespace zf_test {
bool has_gpu();  // a CUDA device is present and usable (defined in cuda_main.cpp)
// Whether an NVIDIA kernel driver is installed: its control device or its /proc entry exists.
// (Without one the runtime says "driver insufficient", error 35, as it does for a driver too old.)
inline bool nvidia_driver_present() {
  return access("/dev/nvidiactl", F_OK) == 0 || access("/proc/driver/nvidia/version", F_OK) == 0;
}
}  // namespace zf_test
