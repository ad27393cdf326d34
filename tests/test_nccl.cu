// Data parallel on the CUDA space over NCCL (nccl_communicator). One process drives R GPUs, a
// thread per rank, the communicators made by ncclCommInitAll: R = 1 (every NCCL call of the
// communicator still runs, to itself — but the optimizer skips the gradient reduction at one
// rank, so at R = 1 only the collectives test runs it) and R = every GPU present when there are
// several (NCCL refuses two ranks on one GPU). On one GPU, R = 2 and 3 ranks also run with a
// test communicator whose collectives go through host memory (hub_communicator), so the
// optimizer's own data-parallel CUDA code runs at R > 1 there too. Checked against independent references computed here on the
// host: the collectives against the rank-order sum written out in the test, the optimizer
// against one host-space process fed the reduced gradient — bit for bit (the reduction's order
// is fixed, sharding moves state without arithmetic, and cuda_space gives the host space's bits).
// Without a GPU the program reports Skipped.
#include <doctest/doctest.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <zenflow/cuda.hpp>
#include <zenflow/nccl.hpp>

#include "cuda_support.hpp"
#include "data_parallel_support.hpp"

using namespace zenflow;
using zf_test::has_gpu;

namespace {

int gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
// The rank counts to test: 1, and every GPU when there are several.
std::vector<int> rank_counts() {
  std::vector<int> out{1};
  if (gpus() > 1) out.push_back(gpus());
  return out;
}

// R communicators, rank r on GPU r.
struct comms {
  std::vector<ncclComm_t> c;
  explicit comms(int R) : c(static_cast<std::size_t>(R)) {
    std::vector<int> devs(static_cast<std::size_t>(R));
    std::iota(devs.begin(), devs.end(), 0);
    REQUIRE(ncclCommInitAll(c.data(), R, devs.data()) == ncclSuccess);
  }
  ~comms() {
    for (auto x : c) ncclCommDestroy(x);
  }
};

// f(r) on a thread per rank, GPU r current (GPU 0 for every rank with one_gpu); the first
// exception is rethrown here.
template <class F>
void on_ranks(int R, F f, bool one_gpu = false) {
  std::vector<std::exception_ptr> err(static_cast<std::size_t>(R));
  std::vector<std::thread> t;
  for (int r = 0; r < R; ++r)
    t.emplace_back([&, r] {
      try {
        ZF_CUDA_TRY(cudaSetDevice(one_gpu ? 0 : r));
        f(r);
      } catch (...) {
        err[std::size_t(r)] = std::current_exception();
      }
    });
  for (auto& x : t) x.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
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
  template <class D, class H>
  static void up(D& d, const H& h) {
    ZF_CUDA_TRY(cudaMemcpy(d.data(), h.data(), sizeof(h[0]) * h.size(), cudaMemcpyHostToDevice));
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

config test_config(reduce_op op, bool overlap) {
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
using nccl_optimizer = dp_optimizer<nccl_communicator>;

// R ranks on ONE GPU, a thread each, without NCCL (which refuses two ranks on one GPU): the
// collectives go through host memory under a barrier, with the communicator contract's arithmetic
// (the rank-order fp32 sum of communicator.hpp) and nccl_communicator's byte count. It runs the
// optimizer's data-parallel CUDA path (sharded host state, gathers, uploads ahead, the fused
// compaction's per-rank places) at R > 1 where only one GPU is present.
struct hub {
  explicit hub(int ranks) : R(ranks), slots(static_cast<std::size_t>(ranks)) {}
  const int R;
  std::vector<std::vector<unsigned char>> slots;  // each rank's contribution, in host memory
  void barrier() {
    std::unique_lock lock(mu);
    const std::uint64_t g = gen;
    if (++arrived == R) {
      arrived = 0;
      ++gen;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return gen != g; });
    }
  }

 private:
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  std::uint64_t gen = 0;
};
class hub_communicator {
 public:
  using space = cuda_space;
  hub_communicator(hub& h, int rank) : h_(&h), rank_(rank) {}
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return h_->R; }
  std::uint64_t bytes_sent() const noexcept { return sent_; }
  void set_stream(cudaStream_t s) noexcept { stream_ = s; }
  void reduce(float* data, std::size_t n, reduce_op op) {
    if (n == 0) return;
    const std::size_t R = std::size_t(h_->R);
    auto& mine = h_->slots[std::size_t(rank_)];
    mine.resize(4 * n);
    down(mine.data(), data, 4 * n);
    h_->barrier();
    std::vector<float> pieces(R * n), out(n);
    for (std::size_t r = 0; r < R; ++r) std::memcpy(pieces.data() + r * n, h_->slots[r].data(), 4 * n);
    h_->barrier();  // (every rank has read every slot)
    detail::reduce_in_rank_order(pieces.data(), n, h_->R, op, out.data());
    up(data, out.data(), 4 * n);
    const std::size_t m = detail::shard_begin(n, h_->R, rank_ + 1) - detail::shard_begin(n, h_->R, rank_);
    sent_ += ((n - m) + m * (R - 1)) * sizeof(float);
  }
  void all_gather(void* data, const std::size_t* bytes) {
    const std::size_t R = std::size_t(h_->R);
    std::vector<std::size_t> at(R + 1, 0);
    for (std::size_t r = 0; r < R; ++r) at[r + 1] = at[r] + bytes[r];
    auto* d = static_cast<unsigned char*>(data);
    auto& mine = h_->slots[std::size_t(rank_)];
    mine.resize(bytes[rank_]);
    down(mine.data(), d + at[std::size_t(rank_)], bytes[rank_]);
    h_->barrier();
    for (std::size_t r = 0; r < R; ++r)
      if (r != std::size_t(rank_)) up(d + at[r], h_->slots[r].data(), bytes[r]);
    h_->barrier();
  }
  bool all_agree(bool ok) {
    h_->slots[std::size_t(rank_)].assign(1, ok ? 1 : 0);
    h_->barrier();
    bool all = true;
    for (const auto& x : h_->slots) all = all && x[0] != 0;
    h_->barrier();
    return all;
  }

 private:
  // copies ordered on the optimizer's stream, complete on return
  void down(void* host, const void* dev, std::size_t n) {
    if (!n) return;
    ZF_CUDA_TRY(cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, stream_));
    ZF_CUDA_TRY(cudaStreamSynchronize(stream_));
  }
  void up(void* dev, const void* host, std::size_t n) {
    if (!n) return;
    ZF_CUDA_TRY(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, stream_));
    ZF_CUDA_TRY(cudaStreamSynchronize(stream_));
  }
  hub* h_;
  int rank_;
  cudaStream_t stream_ = nullptr;
  std::uint64_t sent_ = 0;
};
static_assert(communicator_policy<hub_communicator>);

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
  std::vector<unsigned char> out;
  auto add = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    out.insert(out.end(), b, b + n);
  };
  add(m.w0.data(), 4 * m.w0.size());
  add(m.w1.data(), 2 * m.w1.size());
  add(m.b2.data(), 4 * m.b2.size());
  for (std::size_t k = 0; k < 2; ++k) {
    std::vector<float> x(k == 0 ? R0 * C0 : R1 * C1);
    for (int what = 0; what < 3; ++what) {
      if (what == 0) opt.copy_master(matrix_id{k}, x.data());
      if (what == 1) opt.copy_exp_avg(matrix_id{k}, x.data());
      if (what == 2) opt.copy_exp_avg_sq(matrix_id{k}, x.data());
      add(x.data(), 4 * x.size());
    }
    const auto counts = opt.column_counts(matrix_id{k});
    add(counts.data(), 4 * counts.size());
  }
  return out;
}

struct run_out {
  std::vector<unsigned char> state;
  std::vector<bool> skipped;
  optimizer_stats stats{};
};

run_out reference_run(const gradient_source& src, reduce_op op, bool overlap, int ranks, int steps) {
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
                               bool ahead = false) {
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
  }, one_gpu);
  return out;
}
// ... over NCCL, rank r on GPU r
std::vector<run_out> nccl_run(const gradient_source& src, reduce_op op, bool overlap, int R, int steps,
                              int save_at = -1, const std::string& path = {}, bool ahead = false) {
  comms cs(R);
  return ranks_run<nccl_communicator>(
      src, op, overlap, R, steps, false, [&](int r) { return nccl_communicator(cs.c[std::size_t(r)]); }, save_at,
      path, ahead);
}
// ... through the hub, every rank on GPU 0
std::vector<run_out> hub_run(const gradient_source& src, reduce_op op, bool overlap, int R, int steps, bool ahead = false) {
  hub h(R);
  return ranks_run<hub_communicator>(src, op, overlap, R, steps, true, [&](int r) { return hub_communicator(h, r); },
                                     -1, {}, ahead);
}

// The data-parallel runs against one host-space process fed the reduced gradient: every rank's
// state bit for bit, the same decisions, and each column's traffic its holder's alone.
void check_ranks(const std::vector<run_out>& dp, const run_out& ref, int R, bool ahead) {
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

std::string tmp_path(const std::string& name) { return std::string(ZF_TEST_TMP_DIR) + "/" + name; }

}  // namespace

TEST_CASE("nccl: reduce, all_gather and all_agree against the rank-order reference" * doctest::skip(!has_gpu())) {
  for (int R : rank_counts()) {
    CAPTURE(R);
    comms cs(R);
    for (std::size_t n : {std::size_t(1), std::size_t(3), std::size_t(1000), (std::size_t(1) << 20) + 7}) {
      for (reduce_op op : {reduce_op::mean, reduce_op::sum}) {
        CAPTURE(n);
        CAPTURE(int(op));
        auto input = [](int r, std::size_t i) { return std::sin(float(i) * 0.37f + float(r)) * float(1 + r); };
        // the reference: every rank's array in rank order, summed by the shared host routine
        // and, independently, by the loop written here
        std::vector<float> pieces(n * std::size_t(R)), want(n);
        for (int r = 0; r < R; ++r)
          for (std::size_t i = 0; i < n; ++i) pieces[std::size_t(r) * n + i] = input(r, i);
        for (std::size_t i = 0; i < n; ++i) {
          float s = pieces[i];
          for (int r = 1; r < R; ++r) s += pieces[std::size_t(r) * n + i];
          want[i] = op == reduce_op::mean ? s / float(R) : s;
        }
        std::vector<std::vector<float>> got(static_cast<std::size_t>(R), std::vector<float>(n, 0.0f));
        on_ranks(R, [&](int r) {
          nccl_communicator c(cs.c[std::size_t(r)]);
          device_array<float> d(n);
          std::vector<float> mine(pieces.begin() + std::ptrdiff_t(std::size_t(r) * n),
                                  pieces.begin() + std::ptrdiff_t(std::size_t(r + 1) * n));
          ZF_CUDA_TRY(cudaMemcpy(d.data(), mine.data(), 4 * n, cudaMemcpyHostToDevice));
          c.reduce(d.data(), n, op);
          ZF_CUDA_TRY(cudaMemcpy(got[std::size_t(r)].data(), d.data(), 4 * n, cudaMemcpyDeviceToHost));
          const std::size_t m = detail::shard_begin(n, R, r + 1) - detail::shard_begin(n, R, r);
          CHECK(c.bytes_sent() == 4 * ((n - m) + m * std::size_t(R - 1)));
        });
        for (int r = 0; r < R; ++r) CHECK(std::memcmp(got[std::size_t(r)].data(), want.data(), 4 * n) == 0);
      }
    }
    // all_gather: rank r's block of 3 r + 1 bytes (empty blocks too when r is large enough)
    std::vector<std::size_t> bytes(static_cast<std::size_t>(R));
    std::size_t total = 0;
    for (int r = 0; r < R; ++r) total += bytes[std::size_t(r)] = (r % 3 == 2) ? 0 : 3 * std::size_t(r) + 1;
    std::vector<unsigned char> want(total);
    for (std::size_t r = 0, off = 0; r < std::size_t(R); off += bytes[r], ++r)
      for (std::size_t i = 0; i < bytes[r]; ++i) want[off + i] = (unsigned char)(17 * r + i);
    std::vector<std::vector<unsigned char>> got(static_cast<std::size_t>(R));
    on_ranks(R, [&](int r) {
      nccl_communicator c(cs.c[std::size_t(r)]);
      std::vector<unsigned char> h(total, 0xEE);  // only my block is right before the gather
      std::size_t off = 0;
      for (int q = 0; q < r; ++q) off += bytes[std::size_t(q)];
      std::memcpy(h.data() + off, want.data() + off, bytes[std::size_t(r)]);
      device_array<unsigned char> d(total ? total : 1);
      ZF_CUDA_TRY(cudaMemcpy(d.data(), h.data(), total, cudaMemcpyHostToDevice));
      c.all_gather(d.data(), bytes.data());
      got[std::size_t(r)].resize(total);
      ZF_CUDA_TRY(cudaStreamSynchronize(c.stream()));
      ZF_CUDA_TRY(cudaMemcpy(got[std::size_t(r)].data(), d.data(), total, cudaMemcpyDeviceToHost));
    });
    for (int r = 0; r < R; ++r) CHECK(got[std::size_t(r)] == want);
    // all_agree: true only when every rank says true
    for (int naysayer : {-1, R - 1}) {
      std::vector<int> agreed(static_cast<std::size_t>(R), -1);
      on_ranks(R, [&](int r) {
        nccl_communicator c(cs.c[std::size_t(r)]);
        agreed[std::size_t(r)] = c.all_agree(r != naysayer) ? 1 : 0;
      });
      for (int r = 0; r < R; ++r) CHECK(agreed[std::size_t(r)] == (naysayer < 0 ? 1 : 0));
    }
  }
}

TEST_CASE("nccl: R ranks on cuda_space equal one host-space process fed the reduced gradient" *
          doctest::skip(!has_gpu())) {
  const int steps = 13;  // selections at 1, 5, 9, 13 (3, 7, 11 after warm-up); boundaries every 2
  for (int R : rank_counts()) {
    for (reduce_op op : {reduce_op::mean, reduce_op::sum}) {
      for (auto [overlap, ahead] : {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
        CAPTURE(R);
        CAPTURE(int(op));
        CAPTURE(overlap);
        CAPTURE(ahead);  // (each rank's host updates uploaded ahead, gathered at the boundary)
        const gradient_source src;
        check_ranks(nccl_run(src, op, overlap, R, steps, -1, {}, ahead), reference_run(src, op, overlap, R, steps), R,
                    ahead);
      }
    }
  }
}

TEST_CASE("data parallel on one GPU: R ranks through host-memory collectives equal one host-space process" *
          doctest::skip(!has_gpu())) {
  const int steps = 13;
  for (int R : {2, 3}) {
    for (reduce_op op : {reduce_op::mean, reduce_op::sum}) {
      for (auto [overlap, ahead] : {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
        CAPTURE(R);
        CAPTURE(int(op));
        CAPTURE(overlap);
        CAPTURE(ahead);
        const gradient_source src;
        check_ranks(hub_run(src, op, overlap, R, steps, ahead), reference_run(src, op, overlap, R, steps), R, ahead);
      }
    }
  }
  // a NaN on one rank skips the step on every rank
  gradient_source src;
  src.nan_rank = 1;
  src.nan_step = 6;
  const auto dp = hub_run(src, reduce_op::mean, true, 2, 9);
  const auto ref = reference_run(src, reduce_op::mean, true, 2, 9);
  REQUIRE(ref.skipped[6]);
  for (const auto& x : dp) {
    CHECK(x.skipped == ref.skipped);
    CHECK(x.state == ref.state);
  }
}

TEST_CASE("nccl: a NaN on one rank skips the step on every rank" * doctest::skip(!has_gpu())) {
  for (int R : rank_counts()) {
    CAPTURE(R);
    gradient_source src;
    src.nan_rank = R - 1;
    src.nan_step = 6;
    const auto dp = nccl_run(src, reduce_op::mean, true, R, 9);
    const auto ref = reference_run(src, reduce_op::mean, true, R, 9);
    REQUIRE(ref.skipped[6]);
    for (const auto& x : dp) {
      CHECK(x.skipped == ref.skipped);
      CHECK(x.state == ref.state);
    }
  }
}

TEST_CASE("nccl: a checkpoint set written by R ranks resumes on R ranks and in one host-space process" *
          doctest::skip(!has_gpu())) {
  for (int R : rank_counts()) {
    CAPTURE(R);
    const std::string path = tmp_path("nccl_ckpt_" + std::to_string(R) + ".zf");
    const gradient_source src;
    const int save_at = 6, steps = 13;
    const auto whole = nccl_run(src, reduce_op::mean, true, R, steps, save_at, path);
    // R ranks again from the set
    comms cs(R);
    std::vector<std::vector<unsigned char>> resumed(static_cast<std::size_t>(R));
    on_ranks(R, [&](int r) {
      model m(true);
      nccl_optimizer opt(test_config(reduce_op::mean, true), nccl_communicator(cs.c[std::size_t(r)]));
      m.add_to(opt);
      opt.initialize();
      opt.load(path);
      ZF_CUDA_TRY(cudaDeviceSynchronize());
      for (int s = save_at + 1; s < steps; ++s) {
        m.grads(src, s, r, 0, reduce_op::mean);
        opt.step();
        ZF_CUDA_TRY(cudaDeviceSynchronize());
      }
      resumed[std::size_t(r)] = state_of(opt, m);
    });
    for (int r = 0; r < R; ++r) CHECK(resumed[std::size_t(r)] == whole[std::size_t(r)].state);
    // one host-space process from the same set, fed the reduced gradients
    model m(false);
    optimizer<> one(test_config(reduce_op::mean, true));
    m.add_to(one);
    one.initialize();
    one.load(path);
    for (int s = save_at + 1; s < steps; ++s) {
      m.grads(src, s, 0, R, reduce_op::mean);
      one.step();
    }
    CHECK(state_of(one, m) == whole[0].state);
  }
}
