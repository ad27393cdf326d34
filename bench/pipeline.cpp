// bench/pipeline: ZenFlow against ZeRO-Offload on the same model, side by side in one run, on
// the host space with an emulated device (bench/emulated_device.hpp): per step the trainer's
// forward/backward keeps the "device" busy for a configured time without using the CPU, the
// optimizer's device-side work takes its modelled time, and every host<->device copy takes the
// time of a link model. Everything on the host — the optimizer, the SIMD kernels, the
// scheduler's threads, the transport code — is the real code, on this machine's cores.
//
// Per configuration one JSON line (see bench/README.md): step seconds, device-idle (stall)
// seconds per step, host-update seconds per step, bytes each way per step and as a multiple of
// the model size in the param dtype, speedup and stall_reduction against ZeRO-Offload at the same
// compute time, link and host threads. Each point is measured as P pairs of runs (--pairs,
// default 3; 1 with --quick), ZeRO-Offload and ZenFlow alternated, each run a fresh optimizer:
// the ratios are per pair, reported as their median and range (this machine drifts by tens of
// percent within minutes).
//
//   pipeline [--layers N] [--hidden D] [--ffn F] [--steps M] [--quick] [--out FILE]
//            [--sweeps NAME,...] [--launch-us L] [--pairs P]
// M (default 64, a multiple of 8) is both the measured span and the select interval. --sweeps
// keeps only the named sweeps' points (base, topk_ratio, update_interval, compute, link,
// host_threads, upload_ahead). L: the modelled latency of each device-side launch (default 5 us).
#include <sys/prctl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <zenflow/zenflow.hpp>

#include "emulated_device.hpp"
#include "pipeline_common.hpp"
#include "pipeline_run.hpp"

using namespace zf_bench;
using zenflow::bfloat16;
using zenflow::dtype;

int main(int argc, char** argv) {
  zf_bench::record_run(argc, argv);
  // 1 us timer slack (inherited by the scheduler's threads): sleeps of the device and link
  // emulation end within microseconds of their deadline.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  const args a("pipeline", argc, argv, {"--layers", "--hidden", "--ffn", "--steps", "--out", "--sweeps", "--launch-us", "--pairs"},
               {"--quick"});
  const auto [quick, layers, hidden, ffn, steps, out_path] = read_model_args(a);
  const std::string sweeps = a.text("--sweeps", "");
  device_model::launch_us = a.real("--launch-us", 5, 0, 1e6);
  const int pairs = int(a.count("--pairs", quick ? 1 : 3, 1, 99));
  FILE* out = out_path.empty() ? stdout : std::fopen(out_path.c_str(), "w");
  if (!out) {
    std::fprintf(stderr, "pipeline: cannot open %s\n", out_path.c_str());
    return 2;
  }
  const model shape(layers, hidden, ffn);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::fprintf(stderr, "model: %zu layers, hidden %zu, ffn %zu: %.1fM params (bf16); %u cores\n", layers, hidden, ffn,
               double(shape.params) / 1e6, cores);

  std::vector<point> points = sweep_points(cores, true);
  keep_sweeps(points, sweeps, a);  // (before the calibration: a bad name fails at once)
  if (quick && points.size() > 2) points.resize(2);

  // Calibration: ZeRO-Offload's host update of the whole model, per step, on all cores. The
  // paper's regime is a forward/backward shorter than that; compute times are given as
  // fractions of it.
  device_model::link_gbps = 25.0;
  const result calib = run<emulated_zero_offload>(shape, zero_offload_config(0), 0.0, 2, 4, false);
  const double t_host = calib.host_update_s;
  std::fprintf(stderr, "calibration: ZeRO-Offload host update %.4f s/step\n", t_host);


  for (const point& p : points) {
    device_model::link_gbps = p.gbps;
    const double compute = p.compute_frac * t_host;
    const paired pr = run_pairs(
        pairs, [&] { return run<emulated_zenflow>(shape, zenflow_config(p, steps), compute, 16, steps, p.upload_ahead); },
        [&] { return run<emulated_zero_offload>(shape, zero_offload_config(p.threads), compute, 2, quick ? 3 : 16, false); });
    print_line(out, "emulated (host space; sleep for compute, link model)", p, shape, compute, p.gbps,
               device_model::link_latency_us, cores, pr.zf, pr.zo, &pr);
  }
  if (out != stdout) std::fclose(out);
  return 0;
}
