// Helpers of the CUDA test programs.
#pragma once

namespace zf_test {
bool has_gpu();  // a CUDA device is present and usable (defined in cuda_main.cpp)
}  // namespace zf_test
