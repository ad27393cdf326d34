// The shared AdamW math and the bf16/fp16 conversions evaluated on the GPU must give the same
// bits as on the host (adamw.hpp: one definition, unfused products, correctly rounded ops).
// Skipped where no GPU or driver is present (ctest shows "Skipped"); compiled in CI regardless.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include <zenflow/adamw.hpp>
#include <zenflow/numeric.hpp>

#include "cuda_support.hpp"
#include "support.hpp"

using zf_test::has_gpu;

namespace {

#define ZF_CUDA_CHECK(call)                                                                \
  do {                                                                                     \
    const cudaError_t e_ = (call);                                                         \
    REQUIRE_MESSAGE(e_ == cudaSuccess, #call ": ", cudaGetErrorString(e_));                \
  } while (0)

__global__ void adamw_kernel(float* p, float* m, float* v, const float* g,
                             const std::uint32_t* counts, zenflow::adamw_hyper h, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const zenflow::adamw_coeffs c = zenflow::make_coeffs(h, counts[i] + 1);
  zenflow::adamw_update(p[i], m[i], v[i], g[i], c);
}

__global__ void convert_kernel(const float* x, std::uint16_t* b, std::uint16_t* h, float* back, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  b[i] = zenflow::to_bfloat16(x[i]).bits;
  h[i] = zenflow::to_float16(x[i]).bits;
  back[i] = zenflow::to_float(zenflow::float16::from_bits(h[i]));
}

template <class T>
struct device_array {
  T* ptr = nullptr;
  explicit device_array(const std::vector<T>& host) {
    ZF_CUDA_CHECK(cudaMalloc(&ptr, host.size() * sizeof(T)));
    ZF_CUDA_CHECK(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~device_array() { cudaFree(ptr); }
  std::vector<T> get(std::size_t n) const {
    std::vector<T> out(n);
    cudaMemcpy(out.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return out;
  }
};

}  // namespace

TEST_CASE("cuda: AdamW on the device is bit-identical to the host" * doctest::skip(!has_gpu())) {
  const int n = 1 << 16;
  zf_test::rng r(3);
  std::vector<float> p(n), m(n), v(n), g(n);
  std::vector<std::uint32_t> counts(n);
  for (int i = 0; i < n; ++i) {
    p[i] = r.spread(-8, 2);
    m[i] = r.spread(-14, -2);
    v[i] = std::fabs(r.spread(-28, -4));
    g[i] = r.spread(-12, 0);
    counts[i] = std::uint32_t(r.below(100000));
  }
  for (zenflow::adam_mode mode : {zenflow::adam_mode::adamw, zenflow::adam_mode::classic}) {
    zenflow::adamw_hyper h;
    h.mode = mode;
    h.weight_decay = 0.05f;
    device_array<float> dp(p), dm(m), dv(v), dg(g);
    device_array<std::uint32_t> dc(counts);
    adamw_kernel<<<(n + 255) / 256, 256>>>(dp.ptr, dm.ptr, dv.ptr, dg.ptr, dc.ptr, h, n);
    ZF_CUDA_CHECK(cudaDeviceSynchronize());
    const auto gp = dp.get(n), gm = dm.get(n), gv = dv.get(n);
    for (int i = 0; i < n; ++i) {
      float hp = p[i], hm = m[i], hv = v[i];
      zenflow::adamw_update(hp, hm, hv, g[i], zenflow::make_coeffs(h, counts[i] + 1));
      REQUIRE(zf_test::bits(gp[i]) == zf_test::bits(hp));
      REQUIRE(zf_test::bits(gm[i]) == zf_test::bits(hm));
      REQUIRE(zf_test::bits(gv[i]) == zf_test::bits(hv));
    }
  }
}

TEST_CASE("cuda: bf16/f16 rounding on the device is bit-identical to the host" * doctest::skip(!has_gpu())) {
  const int n = 1 << 18;
  zf_test::rng r(4);
  std::vector<float> x(n);
  for (auto& e : x) {
    float f;
    const std::uint32_t u = r.u32();
    std::memcpy(&f, &u, 4);
    e = f;  // every class of float: NaN, inf, subnormal, ties
  }
  device_array<float> dx(x), dback(x);
  const std::vector<std::uint16_t> zeros(n);
  device_array<std::uint16_t> db(zeros), dh(zeros);
  convert_kernel<<<(n + 255) / 256, 256>>>(dx.ptr, db.ptr, dh.ptr, dback.ptr, n);
  ZF_CUDA_CHECK(cudaDeviceSynchronize());
  const auto b = db.get(n), h = dh.get(n);
  const auto back = dback.get(n);
  for (int i = 0; i < n; ++i) {
    REQUIRE(b[i] == zenflow::to_bfloat16(x[i]).bits);
    REQUIRE(h[i] == zenflow::to_float16(x[i]).bits);
    REQUIRE(zf_test::bits(back[i]) == zf_test::bits(zenflow::to_float(zenflow::float16::from_bits(h[i]))));
  }
}
