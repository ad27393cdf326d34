// The CUDA data-parallel tests' common parts (test_nccl.cu, test_cuda_data_parallel.cu): R ranks as
// threads of one process, each with its own stream and optimizer over cuda_space, against one
// host-space process fed the reduced gradient (data_parallel_support.hpp's tensors and gradients).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <zenflow/cuda.hpp>

#include "cuda_support.hpp"
#include "data_parallel_support.hpp"

namespace zf_cuda_dp {

using namespace zenflow;

// f(r) on a thread per rank, GPU r current (GPU 0 for every rank with one_gpu). on_error runs on
// a rank's thread when its f threw (so that the others, waiting in a collective for it, can be
// released instead of hanging the test). The exception rethrown here is the one caught first: a
// rank released by on_error throws only after the rank at fault has caught its own, so the
// failure reported is the cause, not "another rank failed"; the others go to stderr.
template <class F>
inline void on_ranks(int R, F f, bool one_gpu = false, const std::function<void()>& on_error = {}) {
  std::vector<std::exception_ptr> err(static_cast<std::size_t>(R));
  std::vector<int> order(static_cast<std::size_t>(R), -1);
  std::atomic<int> caught{0};
  std::vector<std::thread> t;
  for (int r = 0; r < R; ++r)
    t.emplace_back([&, r] {
      try {
        ZF_CUDA_TRY(cudaSetDevice(one_gpu ? 0 : r));
        f(r);
      } catch (...) {
        order[std::size_t(r)] = caught.fetch_add(1);
        err[std::size_t(r)] = std::current_exception();
        if (on_error) on_error();
      }
    });
  for (auto& x : t) x.join();
  std::exception_ptr first;
  for (int r = 0; r < R; ++r) {
    if (!err[std::size_t(r)]) continue;
    if (order[std::size_t(r)] == 0) first = err[std::size_t(r)];
    if (caught.load() > 1) {
      try {
        std::rethrow_exception(err[std::size_t(r)]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "on_ranks: rank %d (caught %d of %d): %s\n", r, order[std::size_t(r)] + 1, caught.load(), e.what());
      } catch (...) {
        std::fprintf(stderr, "on_ranks: rank %d (caught %d of %d): a non-standard exception\n", r, order[std::size_t(r)] + 1, caught.load());
      }
    }
  }
  if (first) std::rethrow_exception(first);
}

using zf_dp_test::gradient_source;

// The three tensors of data_parallel_support.hpp: host arrays, and (on a device) their device
// copies that the optimizer works on.
using zf_dp_test::R0, zf_dp_test::C0, zf_dp_test::R1, zf_dp_test::C1, zf_dp_test::N2;
struct model {
  std::vector<float> w0 = std::vector<float>(R0 * C0);
  std::vector<bfloat16> g0 = std::vector<bfloat16>(R0 * C0);
  std::vector<bfloat16> w1 = std::vector<bfloat16>(R1 * C1);
  std::vector<float> g1 = std::vector<float>(R1 * C1);
  std::vector<float> b2 = std::vector<float>(N2);
  std::vector<float16> g2 = std::vector<float16>(N2);
  bool device = false;
  device_array<float> dw0, dg1, db2;
  device_array<bfloat16> dg0, dw1;
  device_array<float16> dg2;
  explicit model(bool on_device) : device(on_device) {
    for (std::size_t i = 0; i < w0.size(); ++i) w0[i] = std::sin(float(i)) * 0.5f;
    for (std::size_t i = 0; i < w1.size(); ++i) w1[i] = bfloat16(std::cos(float(i)) * 0.5f);
    for (std::size_t i = 0; i < b2.size(); ++i) b2[i] = 0.01f * float(i);
    if (!device) return;
    dw0 = device_array<float>(w0.size());
    dg0 = device_array<bfloat16>(g0.size());
    dw1 = device_array<bfloat16>(w1.size());
    dg1 = device_array<float>(g1.size());
    db2 = device_array<float>(b2.size());
    dg2 = device_array<float16>(g2.size());
    up(dw0, w0);
    up(dw1, w1);
    up(db2, b2);
  }
  // Complete on return: a cudaMemcpy from pageable memory may return before the data has
  // landed, and the optimizer reads it on another (non-blocking) stream.
  template <class D, class H>
  static void up(D& d, const H& h) {
    ZF_CUDA_TRY(cudaMemcpyAsync(d.data(), h.data(), sizeof(h[0]) * h.size(), cudaMemcpyHostToDevice, cudaStreamLegacy));
    ZF_CUDA_TRY(cudaStreamSynchronize(cudaStreamLegacy));
  }
  template <class H, class D>
  static void down(H& h, const D& d) {
    ZF_CUDA_TRY(cudaMemcpy(h.data(), d.data(), sizeof(h[0]) * h.size(), cudaMemcpyDeviceToHost));
  }
  template <class Opt>
  void add_to(Opt& opt) {
    void* p0 = device ? static_cast<void*>(dw0.data()) : w0.data();
    void* q0 = device ? static_cast<void*>(dg0.data()) : g0.data();
    void* p1 = device ? static_cast<void*>(dw1.data()) : w1.data();
    void* q1 = device ? static_cast<void*>(dg1.data()) : g1.data();
    void* p2 = device ? static_cast<void*>(db2.data()) : b2.data();
    void* q2 = device ? static_cast<void*>(dg2.data()) : g2.data();
    opt.add_matrix(matrix(p0, q0, rows{R0}, cols{C0}).dtypes(dtype::f32, dtype::bf16));
    opt.add_matrix(matrix(p1, q1, rows{R1}, cols{C1}).row_major().dtypes(dtype::bf16, dtype::f32));
    opt.add_vector(zenflow::vector(p2, q2, N2).dtypes(dtype::f32, dtype::f16));
  }
  // this step's gradients: rank r's own (ranks == 0) or the reduced ones
  void grads(const gradient_source& src, int s, int rank, int ranks, reduce_op op) {
    src.fill_all(*this, s, rank, ranks, op);
    if (!device) return;
    up(dg0, g0);
    up(dg1, g1);
    up(dg2, g2);
  }
};

inline config test_config(reduce_op op, bool overlap) {
  config c;
  c.topk_ratio = 0.25;
  c.update_interval = interval::every(2);
  c.select_interval = interval::every(4);
  c.overlap_step = overlap;
  c.adam.lr = 1e-2f;
  c.host_threads = 1;
  c.gradient_reduction = op;
  if (op == reduce_op::sum) {  // also warm-up steps (every column through the host) and moment reset
    c.full_warm_up_rounds = 2;
    c.reselect_moments = reselect_policy::reset;
  }
  return c;
}

template <class Comm>
using dp_optimizer = optimizer<cuda_space, column_topk, fused_adamw<cuda_space>, simd_accumulator, cuda_pinned,
                               bounded_async, Comm>;

// Params, masters, moments and counts after a run, as bytes.
template <class Opt>
std::vector<unsigned char> state_of(Opt& opt, model& m) {
  opt.synchronize();
  if (m.device) {
    ZF_CUDA_TRY(cudaDeviceSynchronize());
    model::down(m.w0, m.dw0);
    model::down(m.w1, m.dw1);
    model::down(m.b2, m.db2);
  }
  return zf_dp_test::state_bytes(opt, m.w0, m.w1, m.b2);
}

struct run_out {
  std::vector<unsigned char> state;
  std::vector<bool> skipped;
  optimizer_stats stats{};
};

inline run_out reference_run(const gradient_source& src, reduce_op op, bool overlap, int ranks, int steps) {
  model m(false);
  optimizer<> opt(test_config(op, overlap));
  m.add_to(opt);
  opt.initialize();
  run_out out;
  for (int s = 0; s < steps; ++s) {
    m.grads(src, s, 0, ranks, op);
    out.skipped.push_back(opt.step().skipped);
  }
  out.state = state_of(opt, m);
  out.stats = opt.stats();
  return out;
}

// R ranks, each on its own stream, its communicator made by make_comm(r), on GPU r (GPU 0 with
// one_gpu); steps [0, steps), with a checkpoint written by every rank after step `save_at` (when
// >= 0) at `path`.
template <class Comm, class MakeComm>
std::vector<run_out> ranks_run(const gradient_source& src, reduce_op op, bool overlap, int R, int steps,
                               bool one_gpu, MakeComm make_comm, int save_at = -1, const std::string& path = {},
                               bool ahead = false, const std::function<void()>& on_error = {}) {
  std::vector<run_out> out(static_cast<std::size_t>(R));
  on_ranks(R, [&](int r) {
    cudaStream_t stream = nullptr;
    ZF_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    {
      model m(true);
      dp_optimizer<Comm> opt(test_config(op, overlap), make_comm(r));
      opt.transport().upload_ahead(ahead);
      m.add_to(opt);
      opt.initialize(stream);
      for (int s = 0; s < steps; ++s) {
        ZF_CUDA_TRY(cudaStreamSynchronize(stream));  // the last step's work has read the grads
        m.grads(src, s, r, 0, op);
        out[std::size_t(r)].skipped.push_back(opt.step(stream).skipped);
        if (s == save_at) opt.save(path);
      }
      out[std::size_t(r)].state = state_of(opt, m);
      out[std::size_t(r)].stats = opt.stats();
    }
    cudaStreamDestroy(stream);
  }, one_gpu, on_error);
  return out;
}
// The data-parallel runs against one host-space process fed the reduced gradient: every rank's
// state bit for bit, the same decisions, and each column's traffic its holder's alone.
inline void check_ranks(const std::vector<run_out>& dp, const run_out& ref, int R, bool ahead) {
  std::uint64_t uploaded_ahead = 0;
  for (const auto& x : dp) uploaded_ahead += x.stats.bytes_uploaded_ahead;
  CHECK((uploaded_ahead > 0) == ahead);
  for (int r = 0; r < R; ++r) {
    const run_out& x = dp[std::size_t(r)];
    CHECK(x.state == ref.state);
    CHECK(x.skipped == ref.skipped);
    CHECK(x.stats.selections == ref.stats.selections);
    CHECK(x.stats.host_updates == ref.stats.host_updates);
    CHECK(x.stats.bytes_gathered == std::uint64_t(R - 1) * x.stats.bytes_to_device);
  }
  std::uint64_t to_host = 0, to_device = 0;
  for (const auto& x : dp) {
    to_host += x.stats.bytes_to_host;
    to_device += x.stats.bytes_to_device;
  }
  CHECK(to_host == ref.stats.bytes_to_host);
  CHECK(to_device == ref.stats.bytes_to_device);
}

}  // namespace zf_cuda_dp
