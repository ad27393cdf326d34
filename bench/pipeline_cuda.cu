// bench/pipeline on a real GPU: the same model shapes, sweep and JSON lines as bench/pipeline,
// with cuda_space instead of the emulated device. The "forward/backward" is a kernel that keeps
// the GPU busy for the configured compute time after writing fresh random gradients (a new
// score order every step, so each reselection moves columns, as in the emulated bench); every
// transfer is a real one over this machine's PCIe/NVLink-C2C link.
//
// Stall (device idle) per step = step time - compute time - the gradient fill, i.e. the time the
// GPU spends on anything but the trainer's work: waiting for the host, and the optimizer's own
// kernels and copies (charged to both optimizers alike).
//
// The emulated twin: for the first T points (--twins, default 3: the base point and the two
// with uploads ahead), bench/pipeline's emulated device — its link, latency, device memory
// bandwidth and launch cost measured on this GPU first (the "calibration" line) — runs the same
// point at the same compute seconds on the same host, and an "agreement" line puts the two side
// by side (emulated / real), so one run says where the emulation's model is wrong.
//
//   pipeline_cuda [--layers N] [--hidden D] [--ffn F] [--steps M] [--quick] [--out FILE]
//                 [--sweeps NAME,...]   (only those sweeps' points, as in bench/pipeline)
//                 [--twins T]           (the emulated twin of the first T points; 0: none)
//                 [--pairs P]           (runs per point: ZeRO-Offload and ZenFlow alternated,
//                                        ratios per pair, median and range; default 3, 1 with --quick)
#include <cuda_runtime.h>
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include <zenflow/cuda.hpp>

#include "cuda_timer.hpp"
#include "pipeline_common.hpp"
#include "pipeline_twin.hpp"

using namespace zf_bench;
using clock_type = std::chrono::steady_clock;

namespace {

// bf16 gradients with a per-(column, step) random magnitude: the scores change every step.
__global__ void fill_grads(std::uint16_t* g, std::size_t rows, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint64_t x = (i / rows + 1) * 0x9e3779b97f4a7c15ull ^ seed;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    const float v = 1e-4f + float(x >> 40) * 0x1p-34f;  // (0, 1e-3]
    g[i] = zenflow::to_bfloat16(v).bits;
  }
}

struct gpu_model {
  std::vector<zenflow::device_array<std::uint16_t>> buffers;
  std::vector<std::pair<std::uint16_t*, std::pair<std::size_t, std::size_t>>> grads;  // ptr, (rows, n)
};

template <class Opt>
result run(const model& shape, const zenflow::config& cfg, double compute_s, int warm, int steps, bool ahead,
           cudaStream_t s) {
  gpu_model gm;
  bool is_grad = false;
  std::size_t rows_hint = 0;
  std::vector<std::size_t> rows_of;
  for (auto m : shape.mats) rows_of.push_back(m.rows), rows_of.push_back(m.rows);
  for (auto n : shape.vecs) rows_of.push_back(n), rows_of.push_back(n);
  std::size_t k = 0;
  Opt opt(cfg);
  if (ahead) opt.transport().upload_ahead(true);
  shape.register_with(opt, [&](std::size_t n, float v) {
    gm.buffers.emplace_back(n);
    const std::uint16_t bits = zenflow::to_bfloat16(v).bits;
    std::vector<std::uint16_t> h(n, bits);
    ZF_CUDA_TRY(cudaMemcpy(gm.buffers.back().data(), h.data(), 2 * n, cudaMemcpyHostToDevice));
    rows_hint = rows_of[k++];
    if (is_grad) gm.grads.push_back({gm.buffers.back().data(), {rows_hint, n}});
    is_grad = !is_grad;
    return static_cast<void*>(gm.buffers.back().data());
  });
  opt.initialize(s);
  std::uint64_t seed = 1;
  auto backward = [&] {
    for (auto& [p, rn] : gm.grads) fill_grads<<<1024, 256, 0, s>>>(p, rn.first, rn.second, ++seed);
    spin_ns<<<1, 1, 0, s>>>((unsigned long long)(compute_s * 1e9));
  };
  auto one = [&] {
    backward();
    opt.step(s, 1.0f);
  };
  for (int i = 0; i < warm; ++i) one();
  ZF_CUDA_TRY(cudaStreamSynchronize(s));
  // the gradient fill's own time, charged to compute
  const double fill_s = timer().seconds(s, [&] {
    for (auto& [p, rn] : gm.grads) fill_grads<<<1024, 256, 0, s>>>(p, rn.first, rn.second, ++seed);
  });
  const auto st0 = opt.stats();
  const auto t0 = clock_type::now();
  result r;
  time_steps(steps, one, [&] { return opt.stats(); }, r);
  ZF_CUDA_TRY(cudaStreamSynchronize(s));
  const double wall = std::chrono::duration<double>(clock_type::now() - t0).count();
  const auto st = opt.stats();
  r.step_s = wall / steps;
  r.device_work_s = fill_s;
  r.stall_s = std::max(0.0, r.step_s - compute_s - r.device_work_s);
  r.host_update_s = (st.host_update_seconds - st0.host_update_seconds) / steps;
  r.d2h_bytes = double(st.bytes_to_host - st0.bytes_to_host) / steps;
  r.h2d_bytes = double(st.bytes_to_device - st0.bytes_to_device) / steps;
  opt.synchronize();
  return r;
}

// The emulated device's parameters, measured here (median of each; CUDA events for the GPU's
// own times, the host's clock for the latency a caller waits).
link_calibration measure_link(cudaStream_t s) {
  const std::size_t big = std::size_t(256) << 20, small = 4096;
  void *host = nullptr, *dev = nullptr, *dev2 = nullptr;
  struct release {
    void **h, **d, **d2;
    ~release() {
      if (*h) cudaFreeHost(*h);
      if (*d) cudaFree(*d);
      if (*d2) cudaFree(*d2);
    }
  } guard{&host, &dev, &dev2};
  ZF_CUDA_TRY(cudaHostAlloc(&host, big, cudaHostAllocDefault));
  ZF_CUDA_TRY(cudaMalloc(&dev, big));
  ZF_CUDA_TRY(cudaMalloc(&dev2, big));
  std::memset(host, 1, big);
  ZF_CUDA_TRY(cudaMemset(dev, 2, big));
  timer events;
  auto gpu_seconds = [&](auto&& enqueue, int reps) {  // the median of reps timed enqueues
    std::vector<double> t;
    enqueue();  // warm
    for (int r = 0; r < reps; ++r) t.push_back(events.seconds(s, enqueue));
    return median(t);
  };
  link_calibration c;
  c.to_device_gbps = double(big) / gpu_seconds([&] { ZF_CUDA_TRY(cudaMemcpyAsync(dev, host, big, cudaMemcpyHostToDevice, s)); }, 9) / 1e9;
  c.to_host_gbps = double(big) / gpu_seconds([&] { ZF_CUDA_TRY(cudaMemcpyAsync(host, dev, big, cudaMemcpyDeviceToHost, s)); }, 9) / 1e9;
  c.memory_gbps = 2.0 * double(big) / gpu_seconds([&] { ZF_CUDA_TRY(cudaMemcpyAsync(dev2, dev, big, cudaMemcpyDeviceToDevice, s)); }, 9) / 1e9;
  constexpr int launches = 1000;
  c.launch_us = gpu_seconds([&] { for (int i = 0; i < launches; ++i) spin_ns<<<1, 1, 0, s>>>(0); }, 5) / launches * 1e6;
  std::vector<double> waits;
  for (int r = 0; r < 201; ++r) {
    const int d = r % 2;  // both directions, alternately
    const auto t0 = clock_type::now();
    ZF_CUDA_TRY(cudaMemcpyAsync(d ? dev : host, d ? host : dev, small, d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s));
    ZF_CUDA_TRY(cudaStreamSynchronize(s));
    waits.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  const double gbps = 0.5 * (c.to_host_gbps + c.to_device_gbps);
  c.latency_us = std::max(0.0, median(waits) - double(small) / (gbps * 1e9)) * 1e6;
  return c;
}

void print_calibration(FILE* out, const char* device, const link_calibration& c) {
  std::fprintf(out,
               "{%s\"bench\":\"pipeline_calibration\",\"device\":\"%s\",\"cpu\":\"%s\",\"to_host_gbps\":%.2f,"
               "\"to_device_gbps\":%.2f,\"latency_us\":%.2f,\"memory_gbps\":%.1f,\"launch_us\":%.3f}\n",
               zf_bench::run_fields(),
               device, cpu_model().c_str(), c.to_host_gbps, c.to_device_gbps, c.latency_us, c.memory_gbps, c.launch_us);
  std::fflush(out);
}

// The real run and its emulated twin at one point. The GPU's time on anything but the trainer's
// work is defined alike for both: the real step less compute and the gradient fill, the emulated
// step less compute (its optimizer's device work is modelled time inside the step, as the real
// one's kernels are). A ratio is emulated / real; the emulation agrees where the two optimizers'
// steps and the speedup are within 15% (the goal of bench/README.md).
void print_agreement(FILE* out, const point& p, double compute, const result& zf, const result& zo, const result& ezf,
                     const result& ezo) {
  const double busy_zf = zf.step_s - compute - zf.device_work_s, busy_zo = zo.step_s - compute - zo.device_work_s;
  const double ebusy_zf = ezf.step_s - compute, ebusy_zo = ezo.step_s - compute;
  const double speedup = zo.step_s / zf.step_s, espeedup = ezo.step_s / ezf.step_s;
  auto ratio = [](double e, double r) { return r > 0 ? e / r : 0.0; };
  // what the span's reselection added to its step (0: none measured), and of its step the wait
  // for host work (selection_stall_s)
  auto extra = [](const result& x) { return x.selection_step_s > 0 ? x.selection_step_s - x.median_step_s : 0.0; };
  const double q[3] = {ratio(ezf.step_s, zf.step_s), ratio(ezo.step_s, zo.step_s), ratio(espeedup, speedup)};
  bool agree = true;
  for (double x : q) agree = agree && x >= 0.85 && x <= 1.15;
  std::fprintf(out,
               "{%s\"bench\":\"pipeline_agreement\",\"sweep\":\"%s\",\"topk_ratio\":%g,\"update_interval\":%u,"
               "\"compute_s\":%.5f,\"host_threads\":%u,\"upload_ahead\":%s,"
               "\"real\":{\"zf_step_s\":%.5f,\"zo_step_s\":%.5f,\"zf_not_trainer_s\":%.5f,\"zo_not_trainer_s\":%.5f,"
               "\"zf_host_update_s\":%.5f,\"zo_host_update_s\":%.5f,\"speedup\":%.3f,\"zf_selection_extra_s\":%.5f,\"zf_selection_stall_s\":%.5f},"
               "\"emulated\":{\"zf_step_s\":%.5f,\"zo_step_s\":%.5f,\"zf_not_trainer_s\":%.5f,\"zo_not_trainer_s\":%.5f,"
               "\"zf_host_update_s\":%.5f,\"zo_host_update_s\":%.5f,\"speedup\":%.3f,\"zf_selection_extra_s\":%.5f,\"zf_selection_stall_s\":%.5f},"
               "\"emulated_over_real\":{\"zf_step\":%.3f,\"zo_step\":%.3f,\"speedup\":%.3f,\"zf_not_trainer\":%.3f,"
               "\"zo_not_trainer\":%.3f,\"zf_host_update\":%.3f,\"zo_host_update\":%.3f},\"within_15_percent\":%s}\n",
               zf_bench::run_fields(),
               p.sweep, p.r, p.U, compute, p.threads, p.upload_ahead ? "true" : "false", zf.step_s, zo.step_s, busy_zf,
               busy_zo, zf.host_update_s, zo.host_update_s, speedup, extra(zf), zf.selection_stall_s, ezf.step_s, ezo.step_s,
               ebusy_zf, ebusy_zo, ezf.host_update_s, ezo.host_update_s, espeedup, extra(ezf), ezf.selection_stall_s, q[0], q[1], q[2], ratio(ebusy_zf, busy_zf),
               ratio(ebusy_zo, busy_zo), ratio(ezf.host_update_s, zf.host_update_s),
               ratio(ezo.host_update_s, zo.host_update_s), agree ? "true" : "false");
  std::fflush(out);
}

}  // namespace

int main(int argc, char** argv) try {
  zf_bench::record_run(argc, argv);
  // 1 us timer slack, inherited by every thread started later (oneTBB's, the scheduler's): the
  // emulated twin's sleeps end within microseconds of their deadlines, as in bench/pipeline.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  const args a("pipeline_cuda", argc, argv, {"--layers", "--hidden", "--ffn", "--steps", "--out", "--twins", "--sweeps", "--pairs"},
               {"--quick"});
  const auto [quick, layers, hidden, ffn, steps, out_path] = read_model_args(a);
  const int twins = int(a.count("--twins", 3, 0, 1000));
  const int pairs = int(a.count("--pairs", quick ? 1 : 3, 1, 99));
  FILE* out = out_path.empty() ? stdout : std::fopen(out_path.c_str(), "w");
  if (!out) {
    std::fprintf(stderr, "pipeline_cuda: cannot open %s\n", out_path.c_str());
    return 2;
  }
  zenflow::cuda_space probe;
  probe.initialize();  // a clear error without a GPU
  cudaDeviceProp prop{};
  ZF_CUDA_TRY(cudaGetDeviceProperties(&prop, probe.device()));
  cudaStream_t s;
  ZF_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const model shape(layers, hidden, ffn);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string device = std::string("cuda: ") + prop.name;
  std::fprintf(stderr, "model: %.1fM params (bf16); %s; %u host cores\n", double(shape.params) / 1e6, prop.name, cores);
  std::vector<point> points = sweep_points(cores, false);
  keep_sweeps(points, a.text("--sweeps", ""), a);  // (before the measurements: a bad name fails at once)
  if (quick && points.size() > 2) points.resize(2);
  const link_calibration cal = measure_link(s);
  print_calibration(out, device.c_str(), cal);
  using zf_opt = zenflow::optimizer<zenflow::cuda_space>;
  using zo_opt = zenflow::zero_offload<zenflow::cuda_space>;
  const result calib = run<zo_opt>(shape, zero_offload_config(0), 0.0, 2, 4, false, s);
  const double t_host = calib.host_update_s;
  std::fprintf(stderr, "calibration: ZeRO-Offload host update %.4f s/step\n", t_host);
  const std::string twin_device = "emulated twin of " + device + " (link, latency, memory, launch as calibrated)";
  const int zo_steps = quick ? 3 : 16;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const point& p = points[i];
    const double compute = p.compute_frac * t_host;
    const paired pr = run_pairs(
        pairs, [&] { return run<zf_opt>(shape, zenflow_config(p, steps), compute, 16, steps, p.upload_ahead, s); },
        [&] { return run<zo_opt>(shape, zero_offload_config(p.threads), compute, 2, zo_steps, false, s); });
    const result &zf = pr.zf, &zo = pr.zo;
    print_line(out, device.c_str(), p, shape, compute, 0.0, 0.0, cores, zf, zo, &pr);
    if (int(i) < twins) {
      const auto [ezf, ezo] = emulated_twin(shape, p, compute, steps, zo_steps, cal);
      print_line(out, twin_device.c_str(), p, shape, compute, 0.5 * (cal.to_host_gbps + cal.to_device_gbps),
                 cal.latency_us, cores, ezf, ezo);
      print_agreement(out, p, compute, zf, zo, ezf, ezo);
    }
  }
  ZF_CUDA_TRY(cudaStreamDestroy(s));
  if (out != stdout) std::fclose(out);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "pipeline_cuda: %s\n", e.what());
  return 2;
}
