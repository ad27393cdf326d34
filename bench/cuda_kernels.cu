// The GPU kernels of cuda_space against the device's own copy speed, measured side by side in
// one run, as JSON lines:
//  - gradient_pass: the fused pass (finite check, norm partials, column scores) over one
//    matrix; bytes = the gradient read once. ratio = its GB/s over a device-to-device copy's
//    GB/s (bytes read + written) of the same bytes, timed alternately in the same run.
//  - fused_adamw: the selective AdamW with every column selected; bytes = fp32 master and both
//    moments read and written, the gradient read, the param written. The copy moves the same
//    number of bytes (half read, half written).
//  - topk: the column top-k of every matrix of a Llama-2-7B-shaped model (32 layers: q, k, v, o
//    4096x4096; gate, up 11008x4096; down 4096x11008; one score per input feature) in one call,
//    topk_ratio 0.1, from device scores to the host's sorted column lists.
// Usage: cuda_kernels [--quick]   (quick: 16M elements, 5 repetitions)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <zenflow/cuda.hpp>

using namespace zenflow;

namespace {

__global__ void fill_scores(double* s, std::size_t n, std::uint64_t seed) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  std::uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  s[i] = double(x >> 11) * 0x1p-53;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct timer {
  cudaEvent_t a, b;
  timer() {
    ZF_CUDA_TRY(cudaEventCreate(&a));
    ZF_CUDA_TRY(cudaEventCreate(&b));
  }
  ~timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  template <class F>
  double seconds(cudaStream_t s, F&& f) {
    ZF_CUDA_TRY(cudaEventRecord(a, s));
    f();
    ZF_CUDA_TRY(cudaEventRecord(b, s));
    ZF_CUDA_TRY(cudaEventSynchronize(b));
    float ms = 0;
    ZF_CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
    return ms * 1e-3;
  }
};

// Median seconds of `work` and of a device-to-device copy moving `copy_bytes` (read + write),
// alternated.
template <class F>
std::pair<double, double> side_by_side(cudaStream_t s, int reps, std::size_t copy_bytes, F&& work) {
  device_array<unsigned char> a(copy_bytes / 2), b(copy_bytes / 2);
  timer t;
  std::vector<double> tw, tc;
  for (int r = -1; r < reps; ++r) {
    const double w = t.seconds(s, work);
    const double c = t.seconds(s, [&] {
      ZF_CUDA_TRY(cudaMemcpyAsync(b.data(), a.data(), copy_bytes / 2, cudaMemcpyDeviceToDevice, s));
    });
    if (r >= 0) {
      tw.push_back(w);
      tc.push_back(c);
    }
  }
  return {median(tw), median(tc)};
}

const char* layout_name(matrix_layout l) { return l == matrix_layout::row_major ? "row_major" : "column_contiguous"; }

}  // namespace

int main(int argc, char** argv) try {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const int reps = quick ? 5 : 20;
  cuda_space space;
  space.initialize();
  cudaDeviceProp prop{};
  ZF_CUDA_TRY(cudaGetDeviceProperties(&prop, space.device()));
  cudaStream_t s;
  ZF_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  space.set_stream(s);
  const std::vector<std::size_t> sizes = quick ? std::vector<std::size_t>{16u << 20}
                                               : std::vector<std::size_t>{64u << 20, 128u << 20};

  // gradient pass
  for (std::size_t n : sizes)
    for (dtype gt : {dtype::bf16, dtype::f32})
      for (matrix_layout layout : {matrix_layout::column_contiguous, matrix_layout::row_major}) {
        const std::size_t rows = 8192, cols = n / rows, bytes = n * size_of(gt);
        device_array<unsigned char> g(bytes);
        ZF_CUDA_TRY(cudaMemset(g.data(), 0x3c, bytes));  // finite values in every dtype
        fused_adamw<cuda_space> u;
        u.add_matrix({nullptr, g.data(), rows, cols, dtype::bf16, gt, layout}, column_topk::k(0.1, cols));
        u.allocate();
        const auto [tw, tc] = side_by_side(s, reps, 2 * bytes, [&] { u.gradient_pass(space); });
        const double gbps = double(bytes) / tw / 1e9, copy = 2.0 * double(bytes) / tc / 1e9;
        std::printf("{\"kernel\":\"gradient_pass\",\"n\":%zu,\"grad\":\"%s\",\"layout\":\"%s\",\"seconds\":%.6g,"
                    "\"gbps\":%.4g,\"copy_gbps\":%.4g,\"ratio\":%.4f,\"gpu\":\"%s\",\"reps\":%d}\n",
                    n, std::string(name_of(gt)).c_str(), layout_name(layout), tw, gbps, copy, gbps / copy, prop.name,
                    reps);
        std::fflush(stdout);
      }

  // fused selective AdamW, every column selected
  for (std::size_t n : sizes)
    for (dtype t : {dtype::bf16, dtype::f32}) {
      const std::size_t rows = 4096, cols = n / rows;
      device_array<unsigned char> p(n * size_of(t)), g(n * size_of(t));
      ZF_CUDA_TRY(cudaMemset(g.data(), 0x3c, n * size_of(t)));
      fused_adamw<cuda_space> u;
      u.add_matrix({p.data(), g.data(), rows, cols, t, t, matrix_layout::column_contiguous}, cols);
      u.allocate();
      std::vector<std::uint32_t> all(cols);
      for (std::size_t c = 0; c < cols; ++c) all[c] = std::uint32_t(c);
      space.upload(u.matrix(0).columns[0].data(), all.data(), 4 * cols);
      u.matrix(0).active = cols;
      const std::size_t bytes = n * (24 + 2 * size_of(t));
      const adamw_hyper h;
      const auto [tw, tc] = side_by_side(s, reps, bytes, [&] { u.update(space, 1.0f, h); });
      const double gbps = double(bytes) / tw / 1e9, copy = double(bytes) / tc / 1e9;
      std::printf("{\"kernel\":\"fused_adamw\",\"n\":%zu,\"dtype\":\"%s\",\"seconds\":%.6g,\"gbps\":%.4g,"
                  "\"copy_gbps\":%.4g,\"ratio\":%.4f,\"gpu\":\"%s\",\"reps\":%d}\n",
                  n, std::string(name_of(t)).c_str(), tw, gbps, copy, gbps / copy, prop.name, reps);
      std::fflush(stdout);
    }

  // top-k over a Llama-2-7B-shaped model in one call
  {
    fused_adamw<cuda_space> u;
    const int layers = quick ? 4 : 32;
    std::size_t total = 0, nmat = 0;
    for (int l = 0; l < layers; ++l)
      for (auto [rows, cols] : {std::pair<std::size_t, std::size_t>{4096, 4096}, {4096, 4096}, {4096, 4096},
                                {4096, 4096}, {11008, 4096}, {11008, 4096}, {4096, 11008}}) {
        // the scores are written directly; the param and grad are never read
        u.add_matrix({nullptr, nullptr, rows, cols, dtype::bf16, dtype::bf16}, column_topk::k(0.1, cols));
        total += cols;
        ++nmat;
      }
    u.allocate();
    std::vector<double> times;
    std::vector<std::vector<std::uint32_t>> out;
    for (int r = -1; r < reps; ++r) {
      fill_scores<<<unsigned((total + 255) / 256), 256, 0, s>>>(u.device_scores(score_kind::l1), total, 77 + r);
      ZF_CUDA_TRY(cudaStreamSynchronize(s));
      const auto t0 = std::chrono::steady_clock::now();
      u.select_topk(space, score_kind::l1, out);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r >= 0) times.push_back(dt);
    }
    std::printf("{\"kernel\":\"topk\",\"model\":\"llama2-7b\",\"layers\":%d,\"matrices\":%zu,\"columns\":%zu,"
                "\"topk_ratio\":0.1,\"seconds\":%.6g,\"goal_seconds\":0.001,\"gpu\":\"%s\",\"reps\":%d}\n",
                layers, nmat, total, median(times), prop.name, reps);
  }
  ZF_CUDA_TRY(cudaStreamDestroy(s));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "cuda_kernels: %s\n", e.what());
  return 2;
}
