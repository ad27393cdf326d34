// The emulated twin of a bench/pipeline_cuda point (pipeline_twin.hpp): a host translation unit
// of its own, so that the emulated device's host space and SIMD kernels are built by the host
// compiler, as in bench/pipeline.
#include "pipeline_twin.hpp"

#include <sys/prctl.h>

#include "emulated_device.hpp"
#include "pipeline_run.hpp"

namespace zf_bench {

std::pair<result, result> emulated_twin(const model& shape, const point& p, double compute_s, int steps, int zo_steps,
                                        const link_calibration& cal) {
  // 1 us timer slack, as in bench/pipeline: the emulation's sleeps end within microseconds of
  // their deadlines (the scheduler's threads, started by each run, inherit it).
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  device_model::link_gbps_dir[0] = cal.to_host_gbps;
  device_model::link_gbps_dir[1] = cal.to_device_gbps;
  device_model::link_latency_us = cal.latency_us;
  device_model::memory_gbps = cal.memory_gbps;
  device_model::launch_us = cal.launch_us;
  const result zo = run<emulated_zero_offload>(shape, zero_offload_config(p.threads), compute_s, 2, zo_steps, false);
  const result zf = run<emulated_zenflow>(shape, zenflow_config(p, steps), compute_s, 16, steps, p.upload_ahead);
  return {zf, zo};
}

}  // namespace zf_bench
