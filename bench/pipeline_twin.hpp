// bench/pipeline_cuda's emulated twin: bench/pipeline's emulated device, its link, latency,
// device memory bandwidth and launch cost set to what bench/pipeline_cuda measured on the GPU
// at hand, run at the same point and the same compute seconds on the same host. Side by side
// with the real run, it says where the emulation's model is wrong (bench/README.md).
#pragma once

#include <utility>

#include "pipeline_common.hpp"

namespace zf_bench {

// The machine's costs as the emulated device models them (bench/emulated_device.hpp).
struct link_calibration {
  double to_host_gbps = 0;    // pinned device -> host copy of 256 MiB
  double to_device_gbps = 0;  // pinned host -> device copy of 256 MiB
  double latency_us = 0;      // a small pinned copy, issued and waited for by the host, less its bytes' time
  double memory_gbps = 0;     // a device-to-device copy: bytes read + written over its time
  double launch_us = 0;       // one kernel launch's share of many back to back (GPU time)
};

// ZeRO-Offload (zo_warm + zo_steps steps), then ZenFlow (16 warm + steps), on the emulated device
// calibrated to `cal`, forward/backward `compute_s`: {zenflow, zero_offload}. (Defined in
// pipeline_twin.cpp: host code, built without nvcc.)
std::pair<result, result> emulated_twin(const model& shape, const point& p, double compute_s, int steps, int zo_steps,
                                        const link_calibration& cal);

}  // namespace zf_bench
