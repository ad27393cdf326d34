// Data parallel on the CUDA space over NCCL (nccl_communicator). One process drives R GPUs, a
// thread per rank, the communicators made by ncclCommInitAll: R = 1 (every NCCL call of the
// communicator still runs, to itself — but the optimizer skips the gradient reduction at one
// rank, so at R = 1 only the collectives test runs it) and R = every GPU present when there are
// several (NCCL refuses two ranks on one GPU; test_cuda_data_parallel.cu runs R > 1 on one GPU
// without NCCL). Checked against independent references computed here on the host: the collectives against the rank-order sum written out in the test, the optimizer
// against one host-space process fed the reduced gradient — bit for bit (the reduction's order
// is fixed, sharding moves state without arithmetic, and cuda_space gives the host space's bits).
// Without a GPU the program reports Skipped.
#include <doctest/doctest.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <zenflow/cuda.hpp>
#include <zenflow/nccl.hpp>

#include "cuda_dp_support.hpp"

using namespace zenflow;
using namespace zf_cuda_dp;

// NCCL checks a collective's buffer pointers only with NCCL_CHECK_POINTERS=1 (off by default:
// a null buffer would be used, a device fault that ends every later test of the program). The
// refusal test below needs it on; NCCL reads it once, at its first communicator, so it is set
// before main.
static const int nccl_check_pointers = setenv("NCCL_CHECK_POINTERS", "1", 1);
using zf_test::has_gpu;

namespace {

int gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
// The rank counts to test: 1, and every GPU when there are several. With one GPU, R = 1 only
// (a sum or mean of one rank is the identity, the order of ranks moot): said in the output, so
// that a run on one GPU is not taken for a check of the collectives' arithmetic.
std::vector<int> rank_counts() {
  std::vector<int> out{1};
  if (gpus() > 1) out.push_back(gpus());
  else MESSAGE("one GPU: the NCCL collectives run at R = 1 only; their arithmetic at R > 1 is not checked here");
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

using nccl_optimizer = dp_optimizer<nccl_communicator>;
static_assert(nccl_optimizer::reduce_scatters && !dp_optimizer<nccl_allreduce_communicator>::reduce_scatters);

// ranks_run over NCCL, rank r on GPU r
std::vector<run_out> nccl_run(const gradient_source& src, reduce_op op, bool overlap, int R, int steps,
                              int save_at = -1, const std::string& path = {}, bool ahead = false) {
  comms cs(R);
  return ranks_run<nccl_communicator>(
      src, op, overlap, R, steps, false, [&](int r) { return nccl_communicator(cs.c[std::size_t(r)]); }, save_at,
      path, ahead);
}

std::string tmp_path(const std::string& name) { return std::string(ZF_TEST_TMP_DIR) + "/" + name; }

// nccl_communicator with reduce_scatter rounds of at most `round` elements of a segment, so that
// the rounds run with one rank and even segments too.
struct tight_nccl : nccl_communicator {
  tight_nccl(ncclComm_t c, std::size_t round) : nccl_communicator(c, limits{round}) {}
};

}  // namespace

TEST_CASE("nccl: reduce, reduce_scatter, all_gather and all_agree against the rank-order reference" * doctest::skip(!has_gpu())) {
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
          // (CAPTURE is per thread: the checks on this rank's thread say their case themselves)
          INFO("rank ", r, " of ", R, ", n ", n, ", op ", int(op));
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
        // reduce_scatter of the same arrays cut into R segments: of even sizes (the last ones
        // empty when n < R), and all in the last rank's segment (with R > 2, in rounds of 2
        // ceil(n / R)); each in one round where it fits and in rounds of 64 elements: each
        // rank's own segment equals the reference's there
        for (bool skewed : {false, true})
          for (std::size_t round : {std::size_t(0), std::size_t(64)}) {
            CAPTURE(skewed);
            CAPTURE(round);
            std::vector<std::size_t> counts(static_cast<std::size_t>(R), 0), at(static_cast<std::size_t>(R) + 1, 0);
            for (int r = 0; r < R; ++r) {
              counts[std::size_t(r)] = skewed ? (r == R - 1 ? n : 0)
                                              : detail::shard_begin(n, R, r + 1) - detail::shard_begin(n, R, r);
              at[std::size_t(r) + 1] = at[std::size_t(r)] + counts[std::size_t(r)];
            }
            on_ranks(R, [&](int r) {
              INFO("rank ", r, " of ", R, ", n ", n, ", op ", int(op), ", skewed ", skewed, ", round ", round);
              auto run = [&](nccl_communicator& c) {
                device_array<float> d(n);
                ZF_CUDA_TRY(cudaMemcpy(d.data(), pieces.data() + std::size_t(r) * n, 4 * n, cudaMemcpyHostToDevice));
                c.reduce_scatter(d.data(), counts.data(), op);
                ZF_CUDA_TRY(cudaStreamSynchronize(c.stream()));
                const std::size_t m = counts[std::size_t(r)];
                std::vector<float> own(m);
                if (m) ZF_CUDA_TRY(cudaMemcpy(own.data(), d.data() + at[std::size_t(r)], 4 * m, cudaMemcpyDeviceToHost));
                CHECK(std::memcmp(own.data(), want.data() + at[std::size_t(r)], 4 * m) == 0);
                CHECK(c.bytes_sent() == 4 * (n - m));
                // the receive buffer: a round's piece from every rank, within about twice the data
                CHECK(c.bytes_allocated() <= 4 * (2 * n + 2 * std::size_t(R)));
              };
              if (round == 0) {
                nccl_communicator c(cs.c[std::size_t(r)]);
                run(c);
              } else {
                tight_nccl c(cs.c[std::size_t(r)], round);
                run(c);
              }
            });
          }
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

TEST_CASE("nccl: a call NCCL refuses inside a group closes the group, and the next collective runs" *
          doctest::skip(!has_gpu())) {
  // NCCL keeps its group per thread: a group left open by the error would take in the next
  // call's sends and receives, which would then never run (the reduction's sum would read a
  // receive buffer nothing was received into).
  comms cs(1);
  nccl_communicator c(cs.c[0]);
  device_array<float> d(5);
  std::vector<float> in = {1.5f, -2.0f, 3.25f, 0.5f, 7.0f}, out(5, 0.0f);
  ZF_CUDA_TRY(cudaMemcpy(d.data(), in.data(), 4 * in.size(), cudaMemcpyHostToDevice));
  c.reduce(d.data(), 5, reduce_op::sum);  // (the receive buffer is made here: the failing call allocates nothing)
  REQUIRE(nccl_check_pointers == 0);
  CHECK_THROWS_AS(c.reduce(nullptr, 5, reduce_op::sum), std::runtime_error);  // a null buffer: refused by NCCL (checked pointers)
  // other values than the receive buffer holds from the first call
  const std::vector<float> in2 = {-4.0f, 0.25f, 9.5f, -1.0f, 2.0f};
  ZF_CUDA_TRY(cudaMemcpy(d.data(), in2.data(), 4 * in2.size(), cudaMemcpyHostToDevice));
  c.reduce(d.data(), 5, reduce_op::sum);  // one rank: the sum of one is the input itself
  ZF_CUDA_TRY(cudaStreamSynchronize(c.stream()));
  ZF_CUDA_TRY(cudaMemcpy(out.data(), d.data(), 4 * out.size(), cudaMemcpyDeviceToHost));
  CHECK(out == in2);
  CHECK(c.all_agree(true));
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
