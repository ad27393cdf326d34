// One configuration of the emulated pipeline (bench/pipeline, bench/data_parallel_pipeline):
// warm-up steps, then measured steps of forward/backward (a sleep) and opt.step().
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include <zenflow/zenflow.hpp>

#include "emulated_device.hpp"
#include "pipeline_common.hpp"

namespace zf_bench {

// Runs `warm` steps, then measures `steps` steps: each is forward/backward (the device busy for
// compute_s) followed by opt.step(). Device idle = step time - compute - modelled device work.
// The optimizer is made from cfg and `extra` (a communicator, say); `ahead`: its transport
// uploads a host update's params ahead of the boundary.
template <class Opt, class... Extra>
result run(const model& shape, const zenflow::config& cfg, double compute_s, int warm, int steps, bool ahead,
           Extra&&... extra) {
  std::vector<std::unique_ptr<zenflow::bfloat16[]>> storage;
  Opt opt(cfg, std::forward<Extra>(extra)...);
  if (ahead) opt.transport().upload_ahead(true);
  shape.register_with(opt, [&](std::size_t n, float v) {
    storage.emplace_back(new zenflow::bfloat16[n]);
    for (std::size_t i = 0; i < n; ++i) storage.back()[i] = zenflow::bfloat16(v);
    return static_cast<void*>(storage.back().get());
  });
  opt.initialize();
  auto one = [&] {
    std::this_thread::sleep_for(std::chrono::duration<double>(compute_s));
    opt.step();
  };
  for (int s = 0; s < warm; ++s) one();
  const auto st0 = opt.stats();
  const auto dev0 = device_model::device_ns.load();
  const std::uint64_t l0[2] = {device_model::link_ns[0].load(), device_model::link_ns[1].load()};
  const auto t0 = clock_type::now();
  result r;
  time_steps(steps, one, [&] { return opt.stats(); }, r);
  const double wall = std::chrono::duration<double>(clock_type::now() - t0).count();
  const auto st = opt.stats();
  r.step_s = wall / steps;
  r.device_work_s = double(device_model::device_ns.load() - dev0) * 1e-9 / steps;
  r.stall_s = std::max(0.0, r.step_s - compute_s - r.device_work_s);
  r.host_update_s = (st.host_update_seconds - st0.host_update_seconds) / steps;
  r.d2h_bytes = double(st.bytes_to_host - st0.bytes_to_host) / steps;
  r.h2d_bytes = double(st.bytes_to_device - st0.bytes_to_device) / steps;
  r.reduce_s = (st.reduce_seconds - st0.reduce_seconds) / steps;
  for (int d = 0; d < 2; ++d) r.link_model_s[d] = double(device_model::link_ns[d].load() - l0[d]) * 1e-9 / steps;
  opt.synchronize();
  return r;
}

}  // namespace zf_bench
