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
//   pipeline_cuda [--layers N] [--hidden D] [--ffn F] [--steps M] [--quick] [--out FILE]
//                 [--sweeps NAME,...]   (only those sweeps' points, as in bench/pipeline)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <tuple>
#include <vector>

#include <zenflow/cuda.hpp>

#include "pipeline_common.hpp"

using namespace zf_bench;
using clock_type = std::chrono::steady_clock;

namespace {

// The forward/backward: busy for `ns` of wall time, whatever the SM clock (the global timer
// counts nanoseconds; a cycle count would run long whenever the SM is below its maximum clock).
__global__ void spin_ns(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

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
  cudaEvent_t a, b;
  ZF_CUDA_TRY(cudaEventCreate(&a));
  ZF_CUDA_TRY(cudaEventCreate(&b));
  ZF_CUDA_TRY(cudaEventRecord(a, s));
  for (auto& [p, rn] : gm.grads) fill_grads<<<1024, 256, 0, s>>>(p, rn.first, rn.second, ++seed);
  ZF_CUDA_TRY(cudaEventRecord(b, s));
  ZF_CUDA_TRY(cudaEventSynchronize(b));
  float fill_ms = 0;
  ZF_CUDA_TRY(cudaEventElapsedTime(&fill_ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  const auto st0 = opt.stats();
  const auto t0 = clock_type::now();
  for (int i = 0; i < steps; ++i) one();
  ZF_CUDA_TRY(cudaStreamSynchronize(s));
  const double wall = std::chrono::duration<double>(clock_type::now() - t0).count();
  const auto st = opt.stats();
  result r;
  r.step_s = wall / steps;
  r.device_work_s = fill_ms * 1e-3;
  r.stall_s = std::max(0.0, r.step_s - compute_s - r.device_work_s);
  r.host_update_s = (st.host_update_seconds - st0.host_update_seconds) / steps;
  r.d2h_bytes = double(st.bytes_to_host - st0.bytes_to_host) / steps;
  r.h2d_bytes = double(st.bytes_to_device - st0.bytes_to_device) / steps;
  opt.synchronize();
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  const bool quick = flag(argc, argv, "--quick");
  const std::size_t layers = std::stoul(arg(argc, argv, "--layers", quick ? "1" : "4"));
  const std::size_t hidden = std::stoul(arg(argc, argv, "--hidden", quick ? "512" : "2048"));
  const std::size_t ffn = std::stoul(arg(argc, argv, "--ffn", quick ? "1376" : "5504"));
  const int steps = std::stoi(arg(argc, argv, "--steps", quick ? "8" : "64"));
  const std::string out_path = arg(argc, argv, "--out", "");
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
  using zf_opt = zenflow::optimizer<zenflow::cuda_space>;
  using zo_opt = zenflow::zero_offload<zenflow::cuda_space>;
  const result calib = run<zo_opt>(shape, zero_offload_config(0), 0.0, 2, 4, false, s);
  const double t_host = calib.host_update_s;
  std::fprintf(stderr, "calibration: ZeRO-Offload host update %.4f s/step\n", t_host);
  std::vector<point> points = sweep_points(cores, false);
  if (quick) points.resize(2);
  keep_sweeps(points, arg(argc, argv, "--sweeps", ""));
  std::map<std::tuple<double, unsigned>, result> zo_cache;
  for (const point& p : points) {
    const double compute = p.compute_frac * t_host;
    const auto key = std::make_tuple(p.compute_frac, p.threads);
    if (!zo_cache.count(key)) zo_cache[key] = run<zo_opt>(shape, zero_offload_config(p.threads), compute, 2, quick ? 3 : 16, false, s);
    const result zf = run<zf_opt>(shape, zenflow_config(p, steps), compute, 16, steps, p.upload_ahead, s);
    print_line(out, device.c_str(), p, shape, compute, 0.0, 0.0, cores, zf, zo_cache[key]);
  }
  ZF_CUDA_TRY(cudaStreamDestroy(s));
  if (out != stdout) std::fclose(out);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "pipeline_cuda: %s\n", e.what());
  return 2;
}
