// Data parallel across MPI ranks (mpi_communicator): ctest runs this program under mpirun with
// 1 to 4 ranks (label mpi). Each rank writes its own local gradients; the optimizer reduces them
// before each step, and each rank holds the host state of its block of every matrix's columns.
// Checked against an independent reference — one process, in this very rank, fed the reduced
// gradient computed here from every rank's local gradient (sum in rank order in fp32, divided by
// R for the mean, rounded to the grad dtype) — bit for bit, since the reduction's order is fixed
// and sharding moves state without arithmetic; every rank's state hashed and compared; bytes and
// host memory per rank; a NaN on one rank; the same run twice; checkpoints written by R ranks or
// one, resumed by R ranks or one; a failed save or load on one rank.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <new>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <zenflow/mpi.hpp>
#include <zenflow/zenflow.hpp>

#include "compaction_support.hpp"
#include "data_parallel_model.hpp"
#include "data_parallel_support.hpp"
#include "reference/reference.hpp"

using namespace zenflow;

// operator new for the whole program, so that a test can make one rank's allocations fail:
// while fail_new_from is set on a thread, requests of at least that many bytes throw there;
// while fail_nth is positive, it counts the thread's requests down and the one that takes it to
// 0 throws — those of zenflow (and the test), not those oneTBB makes for its own tasks (a
// request from code in the oneTBB library).
// (operator delete frees what this operator new took from malloc: the pair is replaced together,
// which GCC cannot see)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
namespace {
thread_local std::size_t fail_new_from = 0;
thread_local long fail_nth = 0;
bool from_tbb(void* caller) {
  Dl_info info{};
  return dladdr(caller, &info) && info.dli_fname && std::strstr(info.dli_fname, "libtbb");
}
}  // namespace
void* operator new(std::size_t n) {
  if (fail_new_from && n >= fail_new_from) throw std::bad_alloc();
  if (fail_nth > 0 && !from_tbb(__builtin_return_address(0)) && --fail_nth == 0) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

int world(int what) {
  int x = 0;
  if (what == 0) MPI_Comm_rank(MPI_COMM_WORLD, &x);
  else MPI_Comm_size(MPI_COMM_WORLD, &x);
  return x;
}
int my_rank() { return world(0); }
int ranks() { return world(1); }

// The three tensors of data_parallel_support.hpp, in host memory.
using zf_dp_test::R0, zf_dp_test::C0, zf_dp_test::R1, zf_dp_test::C1, zf_dp_test::N2;
using zf_dp_test::local;
using zf_dp_test::model;

// Each rank's gradients, and the reduced gradient written out (data_parallel_support.hpp).
struct gradient_source : zf_dp_test::gradient_source {
  void local_grads(model& m, int s) const { fill_all(m, s, my_rank(), 0, reduce_op::mean); }
  void reduced_grads(model& m, int s, reduce_op op) const { fill_all(m, s, 0, ranks(), op); }
};

using zf_dp_test::test_config;

using dp_optimizer =
    optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, bounded_async, mpi_communicator>;
static_assert(dp_optimizer::reduce_scatters &&
              !optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, bounded_async,
                         mpi_allreduce_communicator>::reduce_scatters);

// A space and communicator pair as the CUDA space and nccl_communicator are to the optimizer —
// the communicator works on the space's device memory, not the host space's — on host memory:
// every collective on host data (inspection, checkpoints) goes through the gather space (up,
// gathered, down), the path the NCCL communicator takes on a GPU.
struct staged_space : host_space {
  staged_space() : host_space(0) {}
};
struct staged_mpi : mpi_communicator {
  using space = staged_space;
  // reduction rounds of 100 elements: 19 for this model's 1,852, split inside and across tensors
  static constexpr std::size_t reduce_round = 100;
  using mpi_communicator::mpi_communicator;
};
using staged_optimizer = optimizer<staged_space, column_topk, fused_adamw<staged_space>, simd_accumulator, host_copy,
                                   bounded_async, staged_mpi>;

using zf_dp_test::state_of;

std::uint64_t fnv(const std::vector<unsigned char>& b) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : b) h = (h ^ c) * 1099511628211ull;
  return h;
}

constexpr std::size_t n_all = R0 * C0 + R1 * C1 + N2;  // the model's elements

std::string tmp_path(const std::string& name) { return std::string(ZF_TEST_TMP_DIR) + "/" + name; }
bool exists(const std::string& path) { return std::ifstream(path).good(); }
// The shard files (and their temporaries) of the sets saved at path, in its directory.
std::size_t shard_files_of(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string prefix = p.filename().string() + ".g";
  std::size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(p.parent_path()))
    if (e.path().filename().string().rfind(prefix, 0) == 0) ++n;
  return n;
}

// Registers m with a fresh optimizer, loads the checkpoint at path, takes steps [k, n) of this
// rank's own gradients and returns the state.
template <class Opt>
std::vector<unsigned char> resume(Opt& opt, model& m, const std::string& path, const gradient_source& src, int k, int n) {
  m.add_to(opt);
  opt.initialize();
  opt.load(path);
  for (int s = k; s < n; ++s) {
    src.local_grads(m, s);
    opt.step();
  }
  return state_of(opt, m);
}

std::uint64_t sum_over_ranks(std::uint64_t x) {
  std::uint64_t s = 0;
  MPI_Allreduce(&x, &s, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return s;
}

// Is x the same on every rank?
bool same_everywhere(std::uint64_t x) {
  std::vector<std::uint64_t> all(static_cast<std::size_t>(ranks()));
  MPI_Allgather(&x, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (auto y : all)
    if (y != x) return false;
  return true;
}

struct run_out {
  std::vector<unsigned char> synced;  // copy_params_synchronized of matrix 1 before the end
  std::vector<unsigned char> state;
  std::vector<bool> skipped;
  optimizer_stats stats;
  std::size_t comm_bytes = 0;  // what the communicator keeps between calls
  // per applied step, the grad bytes of the selected columns in this rank's blocks (what it
  // sends each other rank for the replicated device update)
  std::uint64_t own_selected_bytes = 0;
};

// This rank's block of a matrix's columns.
std::pair<std::size_t, std::size_t> own_block(std::size_t cols) {
  return {detail::shard_begin(cols, ranks(), my_rank()), detail::shard_begin(cols, ranks(), my_rank() + 1)};
}

// The bit-exactness runs' configs: with overlap or not; the sum variants also with two warm-up
// steps (every column through the host, then gathered), moments reset at reselection, the norm
// clipped (the summed gradient's norm is far above 1: every step clips) and a grad_scale of 4.
config variant(reduce_op op, bool overlap) {
  config c = test_config(overlap);
  if (op == reduce_op::sum) {
    c.full_warm_up_rounds = 2;
    c.reselect_moments = reselect_policy::reset;
    c.max_grad_norm = 1.0f;
  }
  return c;
}
float scale_for(reduce_op op) { return op == reduce_op::sum ? 4.0f : 1.0f; }

template <class Opt>
std::vector<unsigned char> synced_params(Opt& opt) {
  std::vector<unsigned char> out(2 * R1 * C1);
  opt.copy_params_synchronized(matrix_id{1}, out.data());
  return out;
}

run_out data_parallel_run(const gradient_source& src, reduce_op op, bool overlap, int steps, bool ahead = false) {
  model m;
  config cfg = variant(op, overlap);
  cfg.gradient_reduction = op;
  dp_optimizer opt(cfg, mpi_communicator(MPI_COMM_WORLD));
  opt.transport().upload_ahead(ahead);
  m.add_to(opt);
  opt.initialize();
  run_out out;
  for (int s = 0; s < steps; ++s) {
    src.local_grads(m, s);
    out.skipped.push_back(opt.step(scale_for(op)).skipped);
    if (out.skipped.back()) continue;
    for (auto [k, rows_, cols_, es] : {std::tuple{0, R0, C0, 2}, std::tuple{1, R1, C1, 4}}) {
      const auto [c0, c1] = own_block(cols_);
      std::uint64_t own = 0;
      for (std::uint32_t c : opt.selected_columns(matrix_id{std::size_t(k)}))
        if (c >= c0 && c < c1) ++own;
      // each matrix's piece padded to 16 bytes (R0 = 15 bf16 rows: 30 bytes a column, so an odd
      // count is padded)
      out.own_selected_bytes += (own * std::uint64_t(rows_) * std::uint64_t(es) + 15) / 16 * 16;
    }
  }
  out.synced = synced_params(opt);
  out.state = state_of(opt, m);
  out.stats = opt.stats();
  out.comm_bytes = opt.communicator().bytes_allocated();
  return out;
}

run_out reference_run(const gradient_source& src, reduce_op op, bool overlap, int steps, bool ahead = false) {
  model m;
  optimizer<> opt(variant(op, overlap));
  opt.transport().upload_ahead(ahead);
  m.add_to(opt);
  opt.initialize();
  run_out out;
  for (int s = 0; s < steps; ++s) {
    src.reduced_grads(m, s, op);
    out.skipped.push_back(opt.step(scale_for(op)).skipped);
  }
  out.synced = synced_params(opt);
  out.state = state_of(opt, m);
  out.stats = opt.stats();
  return out;
}

}  // namespace

// A communicator the optimizer cannot work over is refused at once, alike on every rank (local
// checks, before the duplication, a collective): MPI_COMM_NULL, and an intercommunicator, whose
// collectives join its two groups while rank() and size() would describe one of them.
TEST_CASE("data parallel: mpi_communicator refuses MPI_COMM_NULL and an intercommunicator") {
  CHECK_THROWS_WITH_AS(mpi_communicator{MPI_COMM_NULL}, "zenflow: mpi_communicator of MPI_COMM_NULL",
                       std::invalid_argument);
  if (ranks() < 2) {  // (an intercommunicator needs two groups: the runs with 2 to 4 ranks)
    MESSAGE("one rank: the intercommunicator half runs with 2 to 4 ranks");
    return;
  }
  const int color = my_rank() % 2;
  MPI_Comm half = MPI_COMM_NULL, inter = MPI_COMM_NULL, merged = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, my_rank(), &half);
  // the other group's leader, by its MPI_COMM_WORLD rank: 1 for the even ranks, 0 for the odd
  MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, color == 0 ? 1 : 0, 77, &inter);
  int is_inter = 0;
  MPI_Comm_test_inter(inter, &is_inter);
  REQUIRE(is_inter);
  CHECK_THROWS_WITH_AS(mpi_communicator{inter}, doctest::Contains("zenflow: mpi_communicator of an intercommunicator"),
                       std::invalid_argument);
  MPI_Intercomm_merge(inter, color, &merged);  // one group of every rank: taken
  {
    mpi_communicator all(merged);
    CHECK(all.size() == ranks());
    CHECK(all.all_agree(true));
  }
  MPI_Comm_free(&merged);
  MPI_Comm_free(&inter);
  MPI_Comm_free(&half);
}

TEST_CASE("data parallel: R ranks equal one process fed the reduced gradient, bit for bit, on every rank") {
  // selections at t = 1, 5, 9, 13 (3, 7, 11 after two warm-up steps); boundaries every 2; the
  // last one, at t = 12, is still pending at the end with overlap
  const int steps = 13;
  // (and with each rank's host updates uploaded ahead into the area, gathered at the boundary)
  for (reduce_op op : {reduce_op::mean, reduce_op::sum}) {
    for (auto [overlap, ahead] : {std::pair{false, false}, std::pair{true, false}, std::pair{false, true}, std::pair{true, true}}) {
      CAPTURE(int(op));
      CAPTURE(overlap);
      CAPTURE(ahead);
      const gradient_source src;
      const auto dp = data_parallel_run(src, op, overlap, steps, ahead);
      const auto ref = reference_run(src, op, overlap, steps, ahead);
      // (each rank uploads ahead its own block's part of every host update: one process's bytes)
      CHECK((sum_over_ranks(dp.stats.bytes_uploaded_ahead) > 0) == ahead);
      CHECK(sum_over_ranks(dp.stats.bytes_uploaded_ahead) == ref.stats.bytes_uploaded_ahead);
      CHECK(dp.state == ref.state);
      CHECK(dp.synced == ref.synced);
      CHECK(dp.skipped == ref.skipped);
      CHECK(same_everywhere(fnv(dp.state)));
      CHECK(dp.stats.selections == ref.stats.selections);
      CHECK(dp.stats.host_updates == ref.stats.host_updates);
      // Sharded host state: each column's traffic between device and host is its holder's alone,
      // so the ranks' bytes add up to one process's; each rank's own share is its blocks'.
      CHECK(sum_over_ranks(dp.stats.bytes_to_host) == ref.stats.bytes_to_host);
      CHECK(sum_over_ranks(dp.stats.bytes_to_device) == ref.stats.bytes_to_device);
      if (ranks() > 1) CHECK(dp.stats.bytes_to_host < ref.stats.bytes_to_host);
      // Host memory: one process's, less the host state of the columns outside this rank's
      // blocks (master, m, v, accumulators: 12 + 4 per accumulator bytes an element, 4 a column's
      // count), plus, with more than one rank, the reduction buffer (a round holds one grad
      // dtype: the largest of the bf16 g0, the fp32 g1 and the fp16 vector, in its bytes; the
      // round is the whole model here) and the communicator's own buffers (its receive buffer:
      // a rank's pieces of its segment of the largest round, at least its block's share of
      // that matrix's gradient), and the gather space, which holds at most one matrix's params
      // or its joining columns' state (<= 12 bytes an element of the widest matrix here: k =
      // cols / 4).
      const std::uint64_t accs = overlap ? 2 : 1;
      std::uint64_t others = 0;
      for (auto [rows_, cols_] : {std::pair{R0, C0}, std::pair{R1, C1}}) {
        const std::size_t own = detail::shard_begin(cols_, ranks(), my_rank() + 1) - detail::shard_begin(cols_, ranks(), my_rank());
        others += ((12 + 4 * accs) * rows_ + 4) * (cols_ - own);
      }
      if (ranks() > 1) {
        std::uint64_t received = 0;  // the pieces of this rank's block of a matrix, from every rank
        for (auto [rows_, cols_, es] : {std::tuple{R0, C0, 2}, std::tuple{R1, C1, 4}}) {
          const auto [c0, c1] = own_block(cols_);
          received = std::max<std::uint64_t>(received, es * std::uint64_t(ranks()) * rows_ * (c1 - c0));
        }
        CHECK(dp.comm_bytes >= received);
      } else {
        CHECK(dp.comm_bytes == 0);  // (one rank: no collective ever runs)
      }
      const std::uint64_t round_bytes = std::max({2 * R0 * C0, 4 * R1 * C1, 2 * N2});
      const std::uint64_t floor_ =
          ref.stats.host_pageable_bytes - others + (ranks() > 1 ? round_bytes : 0) + dp.comm_bytes;
      CHECK(dp.stats.host_pageable_bytes >= floor_);
      CHECK(dp.stats.host_pageable_bytes <= floor_ + 12 * R0 * C0);
      // What a rank uploads (its blocks' params after a host update, its joining columns' state)
      // it then sends to each of the others: nothing else crosses to the device during steps.
      CHECK(dp.stats.bytes_gathered == std::uint64_t(ranks() - 1) * dp.stats.bytes_to_device);
      // What this rank sent to agree on the gradient. Every step: the matrices' gradients
      // reduce-scattered by column blocks (the others' blocks, in the grad dtype: 2 bytes an
      // element of the bf16 g0, 4 of the fp32 g1), the vector all-reduced (the others' pieces of
      // its fp16 gradient, then its own shard to each of the others, 2 bytes an element) and its
      // blocks' column statistics to each of the others (17 bytes a column), and before all that
      // its grad_scale, lr and whether it can step (12 bytes to each of the others). Every applied step:
      // its blocks' selected columns' reduced gradients to each of the others (grad dtype, each
      // matrix's piece padded to 16 bytes).
      const std::uint64_t R = std::uint64_t(ranks());
      std::uint64_t per_step = 0;
      for (auto [rows_, cols_, es] : {std::tuple{R0, C0, 2}, std::tuple{R1, C1, 4}}) {
        const auto [c0, c1] = own_block(cols_);
        per_step += es * rows_ * (cols_ - (c1 - c0)) + 17 * (R - 1) * (c1 - c0);
      }
      const std::size_t mine = detail::shard_begin(N2, ranks(), my_rank() + 1) - detail::shard_begin(N2, ranks(), my_rank());
      per_step += 2 * ((N2 - mine) + mine * (R - 1)) + 12 * (R - 1);
      CHECK(dp.stats.bytes_reduced == std::uint64_t(steps) * per_step + (R - 1) * dp.own_selected_bytes);
      // and less than the all-reduce of every gradient would send (2 (R - 1) / R of it)
      if (R > 1) CHECK(dp.stats.bytes_reduced < std::uint64_t(steps) * 4 * 2 * (R - 1) * n_all / R);
      // the reduction's time is counted when there is one (a clock that advanced over 13
      // reductions); with one rank there is none (a sum of one: the identity, skipped), and
      // never in one process
      CHECK((dp.stats.reduce_seconds > 0) == (ranks() > 1));
      CHECK(ref.stats.reduce_seconds == 0);
    }
  }
}

// mpi_communicator without its typed members: the optimizer then widens every gradient to fp32
// for the reduction and rounds the result back itself (the path of communicators that have only
// the fp32 members, nccl_communicator's).
struct fp32_wire_mpi : mpi_communicator {
  using mpi_communicator::mpi_communicator;
  void reduce(void*, dtype, std::size_t, reduce_op) = delete;
  void reduce_scatter(void*, dtype, const std::size_t*, reduce_op) = delete;
  using mpi_communicator::reduce;
  using mpi_communicator::reduce_scatter;
};

TEST_CASE("data parallel: gradients reduced in their own dtypes give the bits of the fp32 reduction, for fewer bytes") {
  // Side by side, the same local gradients: mpi_communicator moves the bf16 g0 and the fp16 g2 in
  // 2 bytes an element and rounds the reduction back itself; fp32_wire_mpi moves every element
  // widened to 4 bytes and the optimizer rounds. After every step the grad buffers (the reduced
  // gradient where the rank used it, its own elsewhere) are equal, and at the end the state.
  // Bytes: per step, 2 bytes less for each bf16 element of the others' blocks of g0 and each
  // fp16 element of the vector's all-reduce (the others' pieces, then the own shard to each of
  // the others); g1 is fp32 either way.
  const gradient_source src;
  const int steps = 9;
  const config cfg = variant(reduce_op::mean, true);
  model a, b;
  dp_optimizer typed(cfg, mpi_communicator(MPI_COMM_WORLD));
  optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, bounded_async, fp32_wire_mpi>
      wide(cfg, fp32_wire_mpi(MPI_COMM_WORLD));
  a.add_to(typed);
  b.add_to(wide);
  typed.initialize();
  wide.initialize();
  bool grads_equal = true;
  for (int s = 0; s < steps; ++s) {
    src.local_grads(a, s);
    src.local_grads(b, s);
    CHECK(typed.step(scale_for(reduce_op::mean)).skipped == wide.step(scale_for(reduce_op::mean)).skipped);
    grads_equal = grads_equal && std::memcmp(a.g0.data(), b.g0.data(), 2 * R0 * C0) == 0 &&
                  std::memcmp(a.g1.data(), b.g1.data(), 4 * R1 * C1) == 0 && std::memcmp(a.g2.data(), b.g2.data(), 2 * N2) == 0;
  }
  CHECK(grads_equal);
  CHECK(state_of(typed, a) == state_of(wide, b));
  const std::uint64_t R = std::uint64_t(ranks());
  const auto [c0, c1] = own_block(C0);
  const std::size_t mine = detail::shard_begin(N2, ranks(), my_rank() + 1) - detail::shard_begin(N2, ranks(), my_rank());
  const std::uint64_t saved = 2 * R0 * (C0 - (c1 - c0)) + 2 * ((N2 - mine) + mine * (R - 1));
  CHECK(wide.stats().bytes_reduced - typed.stats().bytes_reduced == (R > 1 ? std::uint64_t(steps) * saved : 0));
  // The reduction buffer (host memory less the communicator's, the rest being alike): a round of
  // fp32 (the whole model here), against the largest single-dtype round — the fp32 g1 here, at
  // 4 bytes, the bf16 g0 and the fp16 vector at 2.
  if (R > 1) {
    const std::uint64_t wide_buf = wide.stats().host_pageable_bytes - wide.communicator().bytes_allocated();
    const std::uint64_t typed_buf = typed.stats().host_pageable_bytes - typed.communicator().bytes_allocated();
    CHECK(wide_buf - typed_buf == 4 * n_all - std::max({2 * R0 * C0, 4 * R1 * C1, 2 * N2}));
  }
}

// Counts the reductions' collectives a communicator makes (reduce, reduce_scatter; typed or not).
template <class Base>
struct counting_mpi : Base {
  using Base::Base;
  int calls = 0;
  template <class... A>
  auto reduce(A... a) -> decltype(this->Base::reduce(a...)) {
    ++calls;
    return Base::reduce(a...);
  }
  template <class... A>
  auto reduce_scatter(A... a) -> decltype(this->Base::reduce_scatter(a...)) {
    ++calls;
    return Base::reduce_scatter(a...);
  }
};

// Matrices bf16, fp32, bf16, fp32 (grads; fp32 params) and vectors fp16, fp32, fp16, fp32.
struct alternating {
  static constexpr std::size_t rows_ = 6, cols_ = 10, n = 12;
  std::vector<float> w[4], gf[2], b[4], vf[2];
  std::vector<zenflow::bfloat16> gb[2];
  std::vector<zenflow::float16> vh[2];
  alternating() {
    for (int k = 0; k < 4; ++k) {
      w[k].resize(rows_ * cols_);
      b[k].assign(n, 0.0f);
      for (std::size_t e = 0; e < w[k].size(); ++e) w[k][e] = 0.01f * float((e * 7 + std::size_t(k)) % 23) - 0.1f;
    }
    for (int k = 0; k < 2; ++k) {
      gf[k].resize(rows_ * cols_);
      gb[k].resize(rows_ * cols_);
      vf[k].resize(n);
      vh[k].resize(n);
    }
  }
  template <class Opt>
  void add_to(Opt& opt) {
    for (int k = 0; k < 4; ++k) {
      if (k % 2 == 0)
        opt.add_matrix(matrix(w[k].data(), gb[k / 2].data(), rows{rows_}, cols{cols_}).dtypes(dtype::f32, dtype::bf16));
      else
        opt.add_matrix(matrix(w[k].data(), gf[k / 2].data(), rows{rows_}, cols{cols_}));
    }
    for (int k = 0; k < 4; ++k) {
      if (k % 2 == 0) opt.add_vector(zenflow::vector(b[k].data(), vh[k / 2].data(), n).dtypes(dtype::f32, dtype::f16));
      else opt.add_vector(zenflow::vector(b[k].data(), vf[k / 2].data(), n));
    }
  }
  void grads(int s) {  // this rank's own: values of different exponents, so the sums round
    const int me = my_rank();
    for (int k = 0; k < 2; ++k)
      for (std::size_t e = 0; e < rows_ * cols_; ++e) {
        const float x = std::ldexp(1.0f + float((e * 5 + std::size_t(k + s)) % 9) / 8.0f, int((e + std::size_t(me)) % 7) - 5) *
                        ((e + std::size_t(me)) % 3 ? 1.0f : -1.0f);
        gf[k][e] = x;
        gb[k][e] = zenflow::bfloat16(x * 0.75f);
      }
    for (int k = 0; k < 2; ++k)
      for (std::size_t e = 0; e < n; ++e) {
        const float x = 0.01f * float((e * 3 + std::size_t(k + s + me)) % 11) - 0.05f;
        vf[k][e] = x;
        vh[k][e] = zenflow::float16(x * 1.5f);
      }
  }
  std::vector<unsigned char> grad_bytes() const {
    std::vector<unsigned char> out;
    auto put = [&](const void* p, std::size_t bytes) {
      const auto* c = static_cast<const unsigned char*>(p);
      out.insert(out.end(), c, c + bytes);
    };
    for (int k = 0; k < 2; ++k) {
      put(gf[k].data(), 4 * gf[k].size());
      put(gb[k].data(), 2 * gb[k].size());
      put(vf[k].data(), 4 * vf[k].size());
      put(vh[k].data(), 2 * vh[k].size());
    }
    return out;
  }
};

TEST_CASE("data parallel: gradients of alternating dtypes go in one round a dtype, with the bits of fp32") {
  // Matrices bf16, fp32, bf16, fp32 and vectors fp16, fp32, fp16, fp32, all of them within one
  // round (a small model): the typed reduction groups them by dtype — a reduce-scatter for the
  // bf16 matrices, one for the fp32 ones, an all-reduce for the fp16 vectors, one for the fp32
  // ones: 4 collectives a step, not one a tensor (8) — and gives the grads and state of the
  // fp32 reduction (2 collectives a step: a reduce-scatter, an all-reduce).
  config cfg = variant(reduce_op::mean, true);
  cfg.topk_ratio = 0.25;
  alternating a, b;
  constexpr std::size_t rows_ = alternating::rows_, cols_ = alternating::cols_;
  optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, bounded_async,
            counting_mpi<mpi_communicator>>
      typed(cfg, counting_mpi<mpi_communicator>(MPI_COMM_WORLD));
  optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, bounded_async,
            counting_mpi<fp32_wire_mpi>>
      wide(cfg, counting_mpi<fp32_wire_mpi>(MPI_COMM_WORLD));
  static_assert(decltype(typed)::reduce_scatters && decltype(wide)::reduce_scatters);
  a.add_to(typed);
  b.add_to(wide);
  typed.initialize();
  wide.initialize();
  const int steps = 7;
  bool grads_equal = true;
  for (int s = 0; s < steps; ++s) {
    a.grads(s);
    b.grads(s);
    CHECK(typed.step().skipped == wide.step().skipped);
    grads_equal = grads_equal && a.grad_bytes() == b.grad_bytes();
  }
  CHECK(grads_equal);
  for (std::size_t k = 0; k < 4; ++k) {
    std::vector<float> x(rows_ * cols_), y(rows_ * cols_);
    typed.copy_master(matrix_id{k}, x.data());
    wide.copy_master(matrix_id{k}, y.data());
    CHECK(std::memcmp(x.data(), y.data(), 4 * x.size()) == 0);
  }
  const bool one = ranks() == 1;  // (one rank reduces nothing)
  CHECK(typed.communicator().calls == (one ? 0 : 4 * steps));
  CHECK(wide.communicator().calls == (one ? 0 : 2 * steps));
}

TEST_CASE("data parallel: a NaN on one rank skips the step on every rank") {
  gradient_source src;
  src.nan_rank = ranks() - 1;
  src.nan_step = 6;
  const auto dp = data_parallel_run(src, reduce_op::mean, true, 10);
  CHECK(dp.skipped[6]);
  CHECK(dp.stats.skipped_steps == 1);
  CHECK(same_everywhere(fnv(dp.state)));
  const auto ref = reference_run(src, reduce_op::mean, true, 10);  // the reduced NaN skips there too
  CHECK(ref.skipped[6]);
  CHECK(dp.state == ref.state);
}

TEST_CASE("data parallel: matrices with fewer columns than ranks (some ranks hold none of them)") {
  // 3 x 2 and 9 x 1: with 3 or 4 ranks some blocks are empty, and the last rank, which owns
  // column 1 of the first and all of the second, holds 12 of the round's 15 elements (n = 15:
  // one round), more than twice its share at R = 3 and 4 (2 ceil(15 / R) = 10, 8), so the
  // communicator's reduce-scatter goes in two rounds there (at R = 2: 12 of 16, one round).
  // k = 1; warm-up, selections, boundaries and a checkpoint round trip, against one process fed
  // the reduced gradient.
  config cfg = test_config(true);
  cfg.topk_ratio = 0.5;
  cfg.full_warm_up_rounds = 1;
  auto run = [&](auto& opt, bool reduced) {
    const std::size_t sizes[2] = {6, 9};
    std::vector<float> w[2], g[2];
    for (int k = 0; k < 2; ++k) {
      w[k].resize(sizes[k]);
      g[k].resize(sizes[k]);
      for (std::size_t i = 0; i < sizes[k]; ++i) w[k][i] = 0.1f * float(i) - 0.2f + 0.05f * float(k);
    }
    opt.add_matrix(matrix(w[0].data(), g[0].data(), rows{3}, cols{2}));
    opt.add_matrix(matrix(w[1].data(), g[1].data(), rows{9}, cols{1}));
    opt.initialize();
    const std::string path = tmp_path("mpi_narrow.zfc");
    for (int s = 0; s < 9; ++s) {
      for (int k = 0; k < 2; ++k)
        for (std::size_t i = 0; i < sizes[k]; ++i) {
          if (!reduced) {
            g[k][i] = local(my_rank(), s, k, i);
          } else {
            float x = local(0, s, k, i);
            for (int r = 1; r < ranks(); ++r) x += local(r, s, k, i);
            g[k][i] = x / float(ranks());
          }
        }
      opt.step();
      if (s == 4) {
        opt.save(path);
        opt.load(path);
      }
    }
    opt.synchronize();
    std::vector<float> out;
    for (int k = 0; k < 2; ++k) {
      std::vector<float> master(sizes[k]);
      opt.copy_master(matrix_id{std::size_t(k)}, master.data());
      out.insert(out.end(), w[k].begin(), w[k].end());
      out.insert(out.end(), master.begin(), master.end());
    }
    return out;
  };
  dp_optimizer dp(cfg, mpi_communicator(MPI_COMM_WORLD));
  const auto a = run(dp, false);
  const auto* ab = reinterpret_cast<const unsigned char*>(a.data());
  CHECK(same_everywhere(fnv(std::vector<unsigned char>(ab, ab + 4 * a.size()))));  // every rank, not only rank 0
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(shard_files_of(tmp_path("mpi_narrow.zfc")) >= std::size_t(ranks()));  // (the ranks' set: saved over below)
  MPI_Barrier(MPI_COMM_WORLD);
  if (my_rank() == 0) {
    optimizer<> one(cfg);
    const auto b = run(one, true);
    CHECK(a == b);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(shard_files_of(tmp_path("mpi_narrow.zfc")) == 0);  // one process's save over the manifest removed them
  CHECK(dp.stats().steps == 9);
}

TEST_CASE("data parallel: the same inputs give the same bits run after run") {
  const gradient_source src;
  const auto a = data_parallel_run(src, reduce_op::mean, true, 9);
  const auto b = data_parallel_run(src, reduce_op::mean, true, 9);
  CHECK(a.state == b.state);
  CHECK(same_everywhere(fnv(a.state)));
}

// A data-parallel optimizer that has taken the first k steps of the ranks' gradients.
struct trained {
  model m;
  dp_optimizer opt;
  trained(const gradient_source& src, const config& cfg, int k, MPI_Comm comm = MPI_COMM_WORLD)
      : opt(cfg, mpi_communicator(comm)) {
    m.add_to(opt);
    opt.initialize();
    for (int s = 0; s < k; ++s) {
      src.local_grads(m, s);
      opt.step();
    }
  }
};

// One process fed, at each step s < n, the reduced gradient of every rank — or, from step k on
// when `alone`, this rank's own gradient (a rank that resumed by itself).
std::vector<unsigned char> reference_state(const gradient_source& src, const config& cfg, int k, int n, bool alone) {
  model r;
  optimizer<> ref(cfg);
  r.add_to(ref);
  ref.initialize();
  for (int s = 0; s < n; ++s) {
    if (s >= k && alone) src.local_grads(r, s);
    else src.reduced_grads(r, s, reduce_op::mean);
    ref.step();
  }
  return state_of(ref, r);
}

TEST_CASE("data parallel: at MPI_THREAD_FUNNELED, a call from another thread is refused before it calls MPI") {
  // main() below initialises MPI at MPI_THREAD_FUNNELED: only its thread may call MPI. zenflow
  // calls MPI from the thread that calls it, so from another thread the communicator's
  // construction, and each optimizer call that makes an MPI call (with one rank, a step makes
  // none, a save its votes), throw std::invalid_argument naming the level, alike on every rank
  // and before any change; the same optimizer then goes on from this thread as if nothing had been tried.
  int level = 0;
  MPI_Query_thread(&level);
  REQUIRE(level == MPI_THREAD_FUNNELED);
  auto on_thread = [](auto f) {
    std::exception_ptr e;
    std::thread([&] {
      try {
        f();
      } catch (...) {
        e = std::current_exception();
      }
    }).join();
    return e;
  };
  auto refused = [](std::exception_ptr e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::invalid_argument& x) {
      const std::string w = x.what();
      return w.find("MPI_THREAD_FUNNELED") != std::string::npos && w.find("MPI_THREAD_SERIALIZED") != std::string::npos;
    } catch (...) {
      return false;
    }
  };
  std::exception_ptr e = on_thread([] { mpi_communicator c(MPI_COMM_WORLD); });
  REQUIRE(e);
  CHECK(refused(e));
  const bool collective = ranks() > 1;
  const gradient_source src;
  const config cfg = test_config(true);
  const std::string path = tmp_path("mpi_thread.zfc");
  if (my_rank() == 0) std::filesystem::remove(path);  // (a file a killed run left)
  MPI_Barrier(MPI_COMM_WORLD);
  model m;
  dp_optimizer opt(cfg, mpi_communicator(MPI_COMM_WORLD));
  m.add_to(opt);
  e = on_thread([&] { opt.initialize(); });
  CHECK(bool(e) == collective);
  if (e) {
    CHECK(refused(e));
    CHECK(!opt.initialized());
    opt.initialize();
  }
  const int n = 6;
  for (int s = 0; s < n; ++s) {
    src.local_grads(m, s);
    if (s == 4) {  // (a boundary step, after the warm-up)
      e = on_thread([&] { opt.step(); });
      CHECK(bool(e) == collective);
      if (!e) continue;  // (one rank: the step was taken there)
      CHECK(refused(e));
    }
    opt.step();
  }
  // (a data-parallel save votes even with one rank: refused there too, before anything is written)
  e = on_thread([&] { opt.save(path); });
  REQUIRE(e);
  CHECK(refused(e));
  CHECK_FALSE(exists(path));
  CHECK(state_of(opt, m) == reference_state(src, cfg, 0, n, false));
  MPI_Barrier(MPI_COMM_WORLD);
  if (my_rank() == 0) std::filesystem::remove(path);
}

TEST_CASE("data parallel: a checkpoint resumes bit-exact, with all the ranks again or with one") {
  // The ranks save together: each rank its shard (its blocks of the host state), rank 0 the
  // manifest. Resuming on all the ranks, or on each rank alone (a communicator of one: a
  // different R, so the blocks are cut anew and every shard is read), or in a plain one-process
  // optimizer, equals one process fed the reduced gradient of the ranks in play at each step.
  const gradient_source src;
  const int k = 7, n = 12;
  const config cfg = test_config(true);
  const std::string path = tmp_path("mpi_resume.zfc");
  trained(src, cfg, k).opt.save(path);
  MPI_Barrier(MPI_COMM_WORLD);  // (the set is complete on every rank's return: save() agreed)
  for (bool alone : {false, true}) {
    CAPTURE(alone);
    MPI_Comm comm = MPI_COMM_WORLD;
    if (alone) MPI_Comm_split(MPI_COMM_WORLD, my_rank(), 0, &comm);
    model m;  // fresh weights: the checkpoint brings the saved ones
    dp_optimizer opt(cfg, mpi_communicator(comm));
    if (alone) MPI_Comm_free(&comm);  // (the communicator works on its own duplicate)
    CHECK(resume(opt, m, path, src, k, n) == reference_state(src, cfg, k, n, alone));
  }
  if (my_rank() == 0) {  // the set in a plain one-process optimizer
    model m;
    optimizer<> opt(cfg);
    CHECK(resume(opt, m, path, src, k, n) == reference_state(src, cfg, k, n, true));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("data parallel: a communicator on the space's device memory (staged collectives) gives the same bits") {
  // The run, every inspection and a checkpoint set written and resumed through the staged path,
  // the gradients reduced in rounds of 100 elements; against one process fed the reduced
  // gradient, and the set resumed by a plain optimizer.
  const gradient_source src;
  const int k = 7, n = 12;
  const config cfg = test_config(true);
  const std::string path = tmp_path("mpi_staged.zfc");
  std::vector<unsigned char> at_k;
  {
    model m;
    staged_optimizer opt(cfg, staged_mpi(MPI_COMM_WORLD));
    m.add_to(opt);
    opt.initialize();
    for (int s = 0; s < k; ++s) {
      src.local_grads(m, s);
      opt.step();
    }
    // the reduction buffer holds one round (100 elements), not the model (1,852): against the
    // same steps on mpi_communicator (the whole model in one round), everything else equal but
    // the communicators' receive buffers, which hold a round's pieces too (one rank: no buffer).
    // A round holds one grad dtype, in its bytes: the buffer is the largest such round — of the
    // bf16 g0, the fp32 g1 and the fp16 vector, each within the round's 100 elements or not.
    const trained whole(src, cfg, k);
    const std::size_t comm_staged = opt.communicator().bytes_allocated(), comm_whole = whole.opt.communicator().bytes_allocated();
    auto buffer = [](std::size_t round) {
      return std::max({2 * std::min(round, R0 * C0), 4 * std::min(round, R1 * C1), 2 * std::min(round, N2)});
    };
    CHECK((whole.opt.stats().host_pageable_bytes - comm_whole) - (opt.stats().host_pageable_bytes - comm_staged) ==
          (ranks() > 1 ? buffer(n_all) - buffer(100) : 0));
    if (ranks() > 1) CHECK(comm_staged < comm_whole);
    CHECK(synced_params(opt) == [&] {
      model r;
      optimizer<> ref(cfg);
      r.add_to(ref);
      ref.initialize();
      for (int s = 0; s < k; ++s) {
        src.reduced_grads(r, s, cfg.gradient_reduction);
        ref.step();
      }
      return synced_params(ref);
    }());
    at_k = state_of(opt, m);
    opt.save(path);
  }
  CHECK(at_k == reference_state(src, cfg, 0, k, false));
  CHECK(same_everywhere(fnv(at_k)));
  model m;
  staged_optimizer opt(cfg, staged_mpi(MPI_COMM_WORLD));
  CHECK(resume(opt, m, path, src, k, n) == reference_state(src, cfg, k, n, false));
  if (my_rank() == 0) {
    model p;
    optimizer<> plain(cfg);
    CHECK(resume(plain, p, path, src, k, n) == reference_state(src, cfg, k, n, true));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("data parallel: initialize() sizes the communicator's buffers, and a step allocates none") {
  // A growth refused inside a step's reduction would leave some gradients reduced in place and
  // others not. initialize() reserves the receive buffers for the largest round; the steps after
  // it (selections, boundaries, with the reduce-scatter, staged through the gather space, and
  // with the all-reduce) must not grow them. One rank: no collective, no buffer.
  const gradient_source src;
  auto check_steps = [&](auto& opt, const char* name) {
    CAPTURE(name);
    model m;
    m.add_to(opt);
    opt.initialize();
    const std::size_t after_init = opt.communicator().bytes_allocated();
    if (ranks() > 1) CHECK(after_init > 0);
    else CHECK(after_init == 0);
    for (int s = 0; s < 9; ++s) {  // (U = 2, select interval 4 in test_config: boundaries and reselections)
      src.local_grads(m, s);
      opt.step();
    }
    opt.synchronize();
    CHECK(opt.communicator().bytes_allocated() == after_init);
  };
  const config cfg = test_config(true);
  {
    dp_optimizer opt(cfg, mpi_communicator(MPI_COMM_WORLD));
    check_steps(opt, "reduce-scatter");
  }
  {
    staged_optimizer opt(cfg, staged_mpi(MPI_COMM_WORLD));
    check_steps(opt, "staged, rounds of 100");
  }
  {
    optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, bounded_async,
              mpi_allreduce_communicator>
        opt(cfg, mpi_allreduce_communicator(MPI_COMM_WORLD));
    check_steps(opt, "all-reduce");
  }
}

TEST_CASE("data parallel: mpi_allreduce_communicator all-reduces every gradient, with the same state") {
  // The other reduction: every grad buffer replaced by the whole reduced gradient (checked after
  // every step against the reference's), each rank sending the others' pieces of every gradient
  // and its own shard to each of the others (2 (R - 1) / R of the gradient); the state as
  // one process fed the reduced gradient, bit for bit.
  const gradient_source src;
  const int n = 13;
  const config cfg = variant(reduce_op::mean, true);
  model m, reduced;
  optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, bounded_async,
            mpi_allreduce_communicator>
      opt(cfg, mpi_allreduce_communicator(MPI_COMM_WORLD));
  m.add_to(opt);
  opt.initialize();
  for (int s = 0; s < n; ++s) {
    src.local_grads(m, s);
    src.reduced_grads(reduced, s, cfg.gradient_reduction);
    opt.step();
    CHECK(std::memcmp(m.g0.data(), reduced.g0.data(), 2 * R0 * C0) == 0);
    CHECK(std::memcmp(m.g1.data(), reduced.g1.data(), 4 * R1 * C1) == 0);
    CHECK(std::memcmp(m.g2.data(), reduced.g2.data(), 2 * N2) == 0);
  }
  CHECK(state_of(opt, m) == reference_run(src, reduce_op::mean, true, n).state);
  // The all-reduce's bytes: a round per tensor here (each has another grad dtype, and a round
  // travels in one), each sending the others' pieces and then its own shard to each of the
  // others in the grad dtype (bf16 g0, fp32 g1, fp16 g2); and each step's 12-byte vote to each of
  // the others.
  const std::size_t R = std::size_t(ranks());
  std::uint64_t per_step = 12 * (R - 1);
  for (auto [n_t, es] : {std::pair{R0 * C0, 2}, std::pair{R1 * C1, 4}, std::pair{N2, 2}}) {
    const std::size_t mine = detail::shard_begin(n_t, ranks(), my_rank() + 1) - detail::shard_begin(n_t, ranks(), my_rank());
    per_step += es * ((n_t - mine) + mine * (R - 1));
  }
  CHECK(opt.stats().bytes_reduced == std::uint64_t(n) * per_step);
  // With the whole gradient on every rank the offload's compaction can run in the gradient pass
  // (each rank places only its own block's unselected columns): forced on every step that can
  // (compaction_support.hpp), the same state.
  zf_test::counting_updater<>::compacting = 0;
  model f;
  optimizer<host_space, column_topk, zf_test::counting_updater<>, simd_accumulator, host_copy, zf_test::lane_idle,
            mpi_allreduce_communicator>
      fused(cfg, mpi_allreduce_communicator(MPI_COMM_WORLD));
  f.add_to(fused);
  fused.initialize();
  for (int s = 0; s < n; ++s) {
    src.local_grads(f, s);
    fused.step();
  }
  CHECK(zf_test::counting_updater<>::compacting > 0);
  CHECK(state_of(fused, f) == reference_run(src, reduce_op::mean, true, n).state);
}

// Reduction rounds of 16 elements: shorter than a row of either matrix (40 and 24 columns), so
// the reduce-scatter splits rows into column ranges across rounds, and the vector (20) spans two.
struct short_round_mpi : mpi_communicator {
  static constexpr std::size_t reduce_round = 16;
  using mpi_communicator::mpi_communicator;
};

TEST_CASE("data parallel: gradients reduce-scattered in rounds shorter than a row give the same bits") {
  // (mean and sum, the sum with warm-up steps; and Zen-auto's boundaries, decided from every
  // column's L1 — the gathered statistics)
  const gradient_source src;
  const int n = 13;
  for (int v = 0; v < 3; ++v) {
    CAPTURE(v);
    const reduce_op op = v == 1 ? reduce_op::sum : reduce_op::mean;
    config cfg = variant(op, true);
    cfg.gradient_reduction = op;
    if (v == 2) cfg.update_interval = interval::auto_();
    model m, r;
    optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, bounded_async,
              short_round_mpi>
        opt(cfg, short_round_mpi(MPI_COMM_WORLD));
    optimizer<> ref(cfg);
    m.add_to(opt);
    r.add_to(ref);
    opt.initialize();
    ref.initialize();
    std::vector<bool> boundaries, ref_boundaries;
    for (int s = 0; s < n; ++s) {
      src.local_grads(m, s);
      src.reduced_grads(r, s, op);
      boundaries.push_back(opt.step().boundary);
      ref_boundaries.push_back(ref.step().boundary);
    }
    CHECK(boundaries == ref_boundaries);
    CHECK(state_of(opt, m) == state_of(ref, r));
    CHECK(opt.stats().host_pageable_bytes < ref.stats().host_pageable_bytes + 4 * n_all);  // the buffer is a round
  }
}

TEST_CASE("data parallel: after step() the grad buffers hold the reduced gradient where this rank used it") {
  // Documented: the vectors' gradients, the columns of this rank's blocks and the selected
  // columns hold the reduced gradient (rounded to the grad dtype); the other columns keep this
  // rank's own gradient (they were never sent back to it).
  const gradient_source src;
  config cfg = test_config(false);
  model m, reduced, own;
  dp_optimizer opt(cfg, mpi_communicator(MPI_COMM_WORLD));
  m.add_to(opt);
  opt.initialize();
  for (int s = 0; s < 6; ++s) {
    src.local_grads(m, s);
    src.local_grads(own, s);
    src.reduced_grads(reduced, s, cfg.gradient_reduction);
    const step_info info = opt.step();
    REQUIRE_FALSE(info.skipped);
    CHECK(std::memcmp(m.g2.data(), reduced.g2.data(), 2 * N2) == 0);
    std::size_t used_other = 0, kept = 0;
    for (auto [k, rows_, cols_] : {std::tuple{0, R0, C0}, std::tuple{1, R1, C1}}) {
      const auto [c0, c1] = own_block(cols_);
      const auto sel = opt.selected_columns(matrix_id{std::size_t(k)});
      for (std::size_t c = 0; c < cols_; ++c) {
        const bool used = (c >= c0 && c < c1) || std::binary_search(sel.begin(), sel.end(), std::uint32_t(c));
        if (used && (c < c0 || c >= c1)) ++used_other;
        for (std::size_t r = 0; r < rows_; ++r) {
          // matrix 0 column-contiguous (bf16 grads), matrix 1 row-major (fp32 grads)
          const std::size_t e = k == 0 ? c * rows_ + r : r * cols_ + c;
          const float got = k == 0 ? to_float(m.g0[e]) : m.g1[e];
          const float want = k == 0 ? to_float((used ? reduced : own).g0[e]) : (used ? reduced : own).g1[e];
          if (!used) ++kept;
          CHECK(std::memcmp(&got, &want, 4) == 0);
        }
      }
    }
    // (every step here has a selection, made at t = 1) there are selected columns outside this
    // rank's blocks (R > 1), and columns neither selected nor its own
    if (ranks() > 1) {
      CHECK(used_other > 0);
      CHECK(kept > 0);
    }
  }
}

TEST_CASE("data parallel: host memory per rank is about 1/R of one process's, for a small model too") {
  // Four 1024 x 1024 matrices (bf16 params and grads): n = 2^22 elements, 64 MiB of host state in
  // one process (16 bytes an element: master, m, v, one accumulator). A rank holds 1/R of that
  // state (its blocks' columns: at most one column more than 1/R of each matrix, a 1/64 part at
  // R = 16; 1/8 is allowed). For the reduction it keeps a round's fp32 buffer and the
  // communicator's receive buffer of the ranks' pieces, about a round, and its shard of the
  // vectors' all-reduce (none here): 4 + 4 (1 + 1/R) bytes a round element, where the round, as
  // documented, is n / 4R (between the floors and the cap: 2^20 elements at R = 1, 2^18 at
  // R = 4) but at least 2^18 and R x 2^11 elements. Then the gather space, whatever R: at most one
  // matrix's unselected columns' bf16 params (< 2 MiB) or every matrix's selected columns'
  // gradients (< 1 MiB). With a fixed round of min(n, 2^24) elements the buffers alone would be
  // 32 MiB a rank — more than half of one process's — and the bound fails at R >= 2.
  constexpr std::size_t dim = 1024, nmat = 4;
  config cfg;
  cfg.topk_ratio = 0.1;
  cfg.update_interval = interval::every(2);
  cfg.select_interval = interval::every(4);
  cfg.overlap_step = false;
  cfg.host_threads = 1;
  std::vector<std::vector<bfloat16>> w(nmat, std::vector<bfloat16>(dim * dim)), g(nmat, std::vector<bfloat16>(dim * dim));
  std::vector<std::vector<bfloat16>> rw = w;
  for (std::size_t k = 0; k < nmat; ++k)
    for (std::size_t e = 0; e < dim * dim; ++e) {
      w[k][e] = rw[k][e] = bfloat16(0.01f * float((e * 7 + k) % 13) - 0.06f);
      g[k][e] = bfloat16(0.001f * float((e * 5 + k * 3) % 17) - 0.008f);
    }
  dp_optimizer opt(cfg, mpi_communicator(MPI_COMM_WORLD));
  optimizer<> ref(cfg);
  for (std::size_t k = 0; k < nmat; ++k) {
    opt.add_matrix(matrix(w[k].data(), g[k].data(), rows{dim}, cols{dim}).dtypes(dtype::bf16, dtype::bf16));
    ref.add_matrix(matrix(rw[k].data(), g[k].data(), rows{dim}, cols{dim}).dtypes(dtype::bf16, dtype::bf16));
  }
  opt.initialize();
  ref.initialize();
  // through a selection and two boundaries, so every buffer has been used (the gather space is
  // made at the first boundary, the communicator's at the first reduction); the gradients are
  // the same on every rank, so the reduced (mean) gradient is each rank's own and the trainer's
  // buffers need no reset between the two optimizers
  for (int s = 0; s < 4; ++s) {
    REQUIRE_FALSE(opt.step().skipped);
    REQUIRE_FALSE(ref.step().skipped);
  }
  const double one = double(ref.stats().host_pageable_bytes), mine = double(opt.stats().host_pageable_bytes);
  const double R = double(ranks());
  CAPTURE(one);
  CAPTURE(mine);
  CHECK(one >= 16.0 * double(nmat * dim * dim));  // (the state the bound is argued from)
  if (ranks() == 1) {  // one rank reduces nothing: no reduction buffers
    CHECK(mine >= one);
    CHECK(mine <= one + 2.0 * double(dim * dim));
  } else {
    const std::size_t n = nmat * dim * dim, Rs = std::size_t(ranks());
    const std::size_t round = std::min({n, std::size_t(1) << 24,
                                        std::max({(n + 4 * Rs - 1) / (4 * Rs), std::size_t(1) << 18, Rs << 11})});
    CHECK(mine <= (1.0 + 0.125) / R * one + (4.0 + 4.0 * (1.0 + 1.0 / R)) * double(round) + 2.0 * double(dim * dim));
    // The bf16 gradients travel as they are: against the same optimizer over fp32_wire_mpi, 2
    // bytes less a round element of the buffer, and 2 less an element of the receive buffer's
    // 2 ceil(round / R) pieces from each of the R ranks (no vector: no shard).
    std::vector<std::vector<bfloat16>> ww = rw;
    optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, bounded_async, fp32_wire_mpi>
        wide(cfg, fp32_wire_mpi(MPI_COMM_WORLD));
    for (std::size_t k = 0; k < nmat; ++k)
      wide.add_matrix(matrix(ww[k].data(), g[k].data(), rows{dim}, cols{dim}).dtypes(dtype::bf16, dtype::bf16));
    wide.initialize();
    for (int s = 0; s < 4; ++s) REQUIRE_FALSE(wide.step().skipped);  // (the same steps: the same gather space)
    const std::size_t pieces = 2 * ((round + Rs - 1) / Rs) * Rs;
    CHECK(wide.communicator().bytes_allocated() - opt.communicator().bytes_allocated() == 2 * pieces);
    CHECK(wide.stats().host_pageable_bytes - opt.stats().host_pageable_bytes == 2 * round + 2 * pieces);
  }
  // (and the training is the one process's: every rank's gradient is the same, so the mean is it,
  // exactly — 2x, 3x, 4x of a bf16 value are exact in fp32, and so is their division by R)
  std::vector<unsigned char> a(2 * dim * dim), b(2 * dim * dim);
  opt.copy_params_synchronized(matrix_id{0}, a.data());
  ref.copy_params_synchronized(matrix_id{0}, b.data());
  CHECK(a == b);
  CHECK(same_everywhere(fnv(a)));
}

TEST_CASE("data parallel: R ranks resume from the checkpoint of one process") {
  // Rank 0 alone, as a plain one-process optimizer, takes k steps of the reduced gradient and
  // saves; then every rank loads that file, each keeping its own blocks, and trains on.
  const gradient_source src;
  const int k = 5, n = 11;
  const config cfg = test_config(false);
  const std::string path = tmp_path("mpi_from_one.zfc");
  if (my_rank() == 0) {
    model r;
    optimizer<> one(cfg);
    r.add_to(one);
    one.initialize();
    for (int s = 0; s < k; ++s) {
      src.reduced_grads(r, s, reduce_op::mean);
      one.step();
    }
    one.save(path);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  model m;
  dp_optimizer opt(cfg, mpi_communicator(MPI_COMM_WORLD));
  const auto st = resume(opt, m, path, src, k, n);
  CHECK(st == reference_state(src, cfg, k, n, false));
  CHECK(same_everywhere(fnv(st)));
}

// A fresh set at `path`: the previous manifest is removed first, so the generation is 1.
// Saves a set at path with no earlier set or shard of its name around (generation 1).
template <class Opt>
void save_fresh(Opt& opt, const std::string& path) {
  if (my_rank() == 0) {
    std::remove(path.c_str());
    const std::filesystem::path p(path);
    const std::string prefix = p.filename().string() + ".g";
    for (const auto& e : std::filesystem::directory_iterator(p.parent_path()))
      if (e.path().filename().string().rfind(prefix, 0) == 0) std::filesystem::remove(e.path());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  opt.save(path);
  MPI_Barrier(MPI_COMM_WORLD);
}
std::string shard_name(const std::string& path, int generation, int r) {
  return path + ".g" + std::to_string(generation) + ".rank" + std::to_string(r) + "-of-" + std::to_string(ranks());
}

// The file with one payload byte flipped, written to `out`.
void damage(const std::string& in_path, const std::string& out) {
  std::ifstream in(in_path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bytes[bytes.size() / 2] ^= 0x10;
  std::ofstream(out, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST_CASE("data parallel: a save over a manifest that cannot be read leaves that set's shards alone") {
  // The manifest of set 1 is unreadable; the next save cannot learn the set's generation from it,
  // and must still not reuse it (writing over set 1's shards while the new set is not complete):
  // the shards of the directory decide (generation 2). Once the new manifest is in place, set 1's
  // shards — which no manifest names any more — are removed; the new set loads.
  const gradient_source src;
  const config cfg = test_config(true);
  const std::string path = tmp_path("mpi_unreadable.zfc");
  trained t(src, cfg, 5);
  save_fresh(t.opt, path);
  const std::vector<char> old_shard = file_bytes(shard_name(path, 1, my_rank()));
  REQUIRE(!old_shard.empty());
  if (my_rank() == 0) std::ofstream(path, std::ios::binary | std::ios::trunc).write("not a manifest", 14);
  MPI_Barrier(MPI_COMM_WORLD);
  for (int s = 5; s < 7; ++s) {
    src.local_grads(t.m, s);
    t.opt.step();
  }
  t.opt.save(path);
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(exists(shard_name(path, 2, my_rank())));
  CHECK(!exists(shard_name(path, 1, my_rank())));
  const auto saved = state_of(t.opt, t.m);
  trained u(src, cfg, 2);
  u.opt.load(path);
  CHECK(state_of(u.opt, u.m) == saved);
}

TEST_CASE("data parallel: a load that fails on one rank changes nothing on any rank") {
  // The last rank is handed a manifest that does not exist, then a damaged one; then every rank
  // loads sets whose last shard is missing, or damaged (with the same R, rank r reads shard r
  // only). Every rank throws and keeps its state (a load is committed only when every rank's
  // checks pass), and the ranks go on in step — a good load after it works everywhere.
  const gradient_source src;
  const config cfg = test_config(true);
  const std::string good = tmp_path("mpi_agree.zfc"), no_shard = tmp_path("mpi_agree_no_shard.zfc"),
                    bad_shard = tmp_path("mpi_agree_bad_shard.zfc"), damaged = tmp_path("mpi_agree_damaged.zfc");
  {
    trained t(src, cfg, 6);
    for (const std::string& p : {good, no_shard, bad_shard}) save_fresh(t.opt, p);
  }
  if (my_rank() == ranks() - 1) {
    std::remove(shard_name(no_shard, 1, ranks() - 1).c_str());
    damage(shard_name(good, 1, ranks() - 1), shard_name(bad_shard, 1, ranks() - 1));
  }
  if (my_rank() == 0) damage(good, damaged);
  MPI_Barrier(MPI_COMM_WORLD);
  trained t(src, cfg, 3);
  const auto before = state_of(t.opt, t.m);
  // the counters too (state_of has params, master, moments and counts: not the step counters,
  // the open window, the bytes)
  auto counters = [&] {
    const auto st = t.opt.stats();
    return std::vector<std::uint64_t>{st.steps,         st.skipped_steps,  st.selections,    st.host_updates,
                                      st.bytes_to_host, st.bytes_to_device, st.bytes_reduced, st.bytes_gathered};
  };
  const auto counted = counters();
  const bool last = my_rank() == ranks() - 1;
  for (const std::string& bad : {tmp_path("mpi_agree_missing.zfc"), damaged}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(t.opt.load(last ? bad : good), checkpoint_error);
    CHECK(state_of(t.opt, t.m) == before);
    CHECK(counters() == counted);
  }
  for (const std::string& bad : {no_shard, bad_shard}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(t.opt.load(bad), checkpoint_error);
    CHECK(state_of(t.opt, t.m) == before);
    CHECK(counters() == counted);
  }
  // and the run goes on from there as one that never tried (its open window, t = 3 with U = 2,
  // included): against the reference of steps [0, 6)
  for (int s = 3; s < 6; ++s) {
    src.local_grads(t.m, s);
    t.opt.step();
  }
  CHECK(state_of(t.opt, t.m) == reference_state(src, cfg, 0, 6, false));
  t.opt.load(good);
  for (int s = 6; s < 9; ++s) {
    src.local_grads(t.m, s);
    t.opt.step();
  }
  CHECK(state_of(t.opt, t.m) == reference_state(src, cfg, 6, 9, false));
}

TEST_CASE("data parallel: a save that fails on any rank leaves the previous set loadable") {
  // Generation 1 is saved after 5 steps. The next save cannot write the last rank's shard (a
  // directory stands at its name), as if that rank died: every rank throws, and the manifest
  // still names generation 1, whose files are all there. With the directory gone, the save
  // works and generation 1's shards are removed. A save to a directory that does not exist
  // fails on every rank too.
  const gradient_source src;
  const config cfg = test_config(true);
  const std::string path = tmp_path("mpi_save_fails.zfc");
  trained t(src, cfg, 5);
  save_fresh(t.opt, path);
  for (int s = 5; s < 8; ++s) {
    src.local_grads(t.m, s);
    t.opt.step();
  }
  const bool last = my_rank() == ranks() - 1;
  const std::string blocker = shard_name(path, 2, ranks() - 1);
  if (last) {
    std::filesystem::remove_all(blocker);  // (a shard an earlier run left there)
    std::filesystem::create_directory(blocker);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK_THROWS_AS(t.opt.save(path), std::runtime_error);
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(exists(shard_name(path, 1, my_rank())));
  if (!last) CHECK(!exists(shard_name(path, 2, my_rank())));  // a failed save leaves no shard of its own
  {
    model m;
    dp_optimizer o(cfg, mpi_communicator(MPI_COMM_WORLD));
    // generation 1: the state after 5 steps
    CHECK(resume(o, m, path, src, 5, 5) == reference_state(src, cfg, 5, 5, false));
  }
  if (last) std::filesystem::remove(blocker);
  // what a rank killed while writing its generation-1 shard leaves (its temporary file), and a
  // file of another name
  const std::string leftover = shard_name(path, 1, my_rank()) + ".tmp.12345.0", other = leftover + "x";
  std::ofstream(leftover) << "partial";
  std::ofstream(other) << "not a shard";
  MPI_Barrier(MPI_COMM_WORLD);
  t.opt.save(path);  // generation 2
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(exists(shard_name(path, 2, my_rank())));
  CHECK(!exists(shard_name(path, 1, my_rank())));
  CHECK(!exists(leftover));  // an older set's leftovers go with it
  CHECK(exists(other));
  std::remove(other.c_str());
  const auto st = state_of(t.opt, t.m);
  model m;
  dp_optimizer o(cfg, mpi_communicator(MPI_COMM_WORLD));
  CHECK(resume(o, m, path, src, 8, 8) == st);
  CHECK_THROWS_AS(t.opt.save(tmp_path("no-such-directory/x.zfc")), std::runtime_error);
}

TEST_CASE("data parallel: a save whose directory a rank cannot list is refused on every rank, and the set stands") {
  // A rank out of file descriptors (EMFILE) cannot list the directory, so it cannot know the
  // generations there; a guess could be the current set's, whose shards the new ones would be
  // renamed over before a failure removed them. Every rank refuses before writing anything.
  // The last rank here (rank 0 with one): every rank lists its own directory, since ranks may
  // have file systems of their own, where a leftover shard is seen by its rank only.
  const gradient_source src;
  const config cfg = test_config(true);
  const std::string path = tmp_path("mpi_unlisted.zfc");
  trained t(src, cfg, 5);
  save_fresh(t.opt, path);
  for (int s = 5; s < 8; ++s) {
    src.local_grads(t.m, s);
    t.opt.step();
  }
  rlimit was{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &was) == 0);
  const int blind = ranks() - 1;
  if (my_rank() == blind) {  // no descriptor above the three standard ones can be opened
    rlimit low = was;
    low.rlim_cur = 3;
    REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
  }
  // (nothing but the save while the limit holds: the sanitizers' own checks open files too)
  std::exception_ptr failed;
  try {
    t.opt.save(path);
  } catch (...) {
    failed = std::current_exception();
  }
  if (my_rank() == blind) REQUIRE(setrlimit(RLIMIT_NOFILE, &was) == 0);
  std::string msg;
  try {
    if (failed) std::rethrow_exception(failed);
  } catch (const std::runtime_error& e) {
    msg = e.what();
  }
  CHECK_MESSAGE(msg.find("rank " + std::to_string(blind) + " could not list the directory") != std::string::npos, msg);
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(exists(shard_name(path, 1, my_rank())));
  CHECK(!exists(shard_name(path, 2, my_rank())));
  model m;
  dp_optimizer o(cfg, mpi_communicator(MPI_COMM_WORLD));
  CHECK(resume(o, m, path, src, 5, 5) == reference_state(src, cfg, 5, 5, false));
}

TEST_CASE("data parallel: a set saved by R ranks resumes on R' ranks, 1 < R' < R, counters included") {
  // The other resumes cut the blocks anew for one rank (every shard read) or keep them; here a
  // rank's block starts inside one shard and ends inside another (R = 4, R' = 3: columns [13, 26)
  // of 40 from the blocks [10, 20) and [20, 30)). The first R' ranks resume the set saved by all
  // R and train on their own gradients; one process fed the reduced gradient of all R ranks
  // before the save and of the R' ranks after it is the reference. Right after the load every
  // rank reports rank 0's counters at the save, the communication ones included.
  if (ranks() < 3) {
    MESSAGE("needs 3 ranks or more (run by mpi_ranks_3 and mpi_ranks_4)");
    return;
  }
  const gradient_source src;
  const int k = 6, n = 10;
  const config cfg = test_config(true);
  const std::string path = tmp_path("mpi_reshard.zfc");
  double saved[4];  // rank 0's steps, bytes reduced, bytes gathered and reduction time at the save
  {
    trained t(src, cfg, k);
    t.opt.save(path);
    const optimizer_stats st = t.opt.stats();
    saved[0] = double(st.steps);
    saved[1] = double(st.bytes_reduced);
    saved[2] = double(st.bytes_gathered);
    saved[3] = st.reduce_seconds;
    REQUIRE(st.bytes_reduced > 0);
    REQUIRE(st.bytes_gathered > 0);
  }
  MPI_Bcast(saved, 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  for (int sub = 2; sub < ranks(); ++sub) {
    CAPTURE(sub);
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, my_rank() < sub ? 0 : MPI_UNDEFINED, my_rank(), &comm);
    if (comm != MPI_COMM_NULL) {
      model m;
      dp_optimizer opt(cfg, mpi_communicator(comm));
      MPI_Comm_free(&comm);
      m.add_to(opt);
      opt.initialize();
      opt.load(path);
      const optimizer_stats st = opt.stats();
      CHECK(double(st.steps) == saved[0]);
      CHECK(double(st.bytes_reduced) == saved[1]);
      CHECK(double(st.bytes_gathered) == saved[2]);
      CHECK(st.reduce_seconds == saved[3]);
      for (int s = k; s < n; ++s) {
        src.local_grads(m, s);
        opt.step();
      }
      const auto got = state_of(opt, m);
      model r;
      optimizer<> ref(cfg);
      r.add_to(ref);
      ref.initialize();
      for (int s = 0; s < n; ++s) {
        src.fill_all(r, s, 0, s < k ? ranks() : sub, reduce_op::mean);
        ref.step();
      }
      CHECK(got == state_of(ref, r));
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("data parallel: ranks that read different checkpoints refuse the load, every rank unchanged") {
  // Two complete sets pass every rank's own checks; loading one on some ranks and the other on
  // the rest (a save over the path while the ranks opened it, or copies out of step between
  // nodes) would leave the ranks' states apart with no error. Likewise a shard of another set
  // that has the same generation, rank, R and size as the one the manifest names. Both are
  // refused on every rank, nothing changed, and a good load then works.
  if (ranks() == 1) {
    MESSAGE("one rank: there is no other rank to disagree with");
    return;
  }
  const gradient_source src;
  const config cfg = test_config(true);
  const std::string a = tmp_path("mpi_which_a.zfc"), b = tmp_path("mpi_which_b.zfc"), mixed = tmp_path("mpi_which_mixed.zfc");
  {
    trained t(src, cfg, 4);
    save_fresh(t.opt, a);
    save_fresh(t.opt, mixed);  // set a again, under another name (generation 1 too)
  }
  {
    gradient_source other;  // another run: a NaN skips its second step (its counts pass a's checks)
    other.nan_rank = 0;
    other.nan_step = 1;
    trained t(other, cfg, 4);
    save_fresh(t.opt, b);  // generation 1 as well
  }
  const bool last = my_rank() == ranks() - 1;
  if (last) std::filesystem::copy_file(shard_name(b, 1, my_rank()), shard_name(mixed, 1, my_rank()),
                                       std::filesystem::copy_options::overwrite_existing);
  MPI_Barrier(MPI_COMM_WORLD);
  trained t(src, cfg, 3);  // (t = 3 with U = 2: a window open, its accumulator partly filled)
  const auto before = state_of(t.opt, t.m);
  const auto steps_before = t.opt.stats().steps;
  CHECK_THROWS_WITH_AS(t.opt.load(last ? b : a), doctest::Contains("read another checkpoint than rank 0"),
                       checkpoint_error);
  CHECK(state_of(t.opt, t.m) == before);
  if (last)
    CHECK_THROWS_WITH_AS(t.opt.load(mixed), doctest::Contains("is not the shard this manifest was saved with"),
                         checkpoint_error);
  else
    CHECK_THROWS_WITH_AS(t.opt.load(mixed), doctest::Contains("another rank could not load"), checkpoint_error);
  CHECK(state_of(t.opt, t.m) == before);
  CHECK(t.opt.stats().steps == steps_before);
  // the run goes on from there as one that never tried (the open window included)
  for (int s = 3; s < 5; ++s) {
    src.local_grads(t.m, s);
    t.opt.step();
  }
  CHECK(state_of(t.opt, t.m) == reference_state(src, cfg, 0, 5, false));
  t.opt.load(a);
  for (int s = 4; s < 7; ++s) {
    src.local_grads(t.m, s);
    t.opt.step();
  }
  CHECK(state_of(t.opt, t.m) == reference_state(src, cfg, 4, 7, false));
}

// An accumulator whose accumulation fails where fail_accumulate is set (on the offload lane, in
// the background: its error waits there for the next wait).
bool fail_accumulate = false;
struct flaky_accumulator : simd_accumulator {
  using simd_accumulator::simd_accumulator;
  void accumulate_from(const void* block, std::size_t i, int which, dtype t, const std::uint32_t* list, std::size_t n,
                       float factor) {
    if (fail_accumulate) throw std::runtime_error("test: the accumulation failed");
    simd_accumulator::accumulate_from(block, i, which, t, list, n, factor);
  }
  void accumulate(std::size_t i, int which, dtype t, const std::uint32_t* list, std::size_t n, float factor) {
    if (fail_accumulate) throw std::runtime_error("test: the accumulation failed");
    simd_accumulator::accumulate(i, which, t, list, n, factor);
  }
};
using flaky_optimizer =
    optimizer<host_space, column_topk, fused_adamw<host_space>, flaky_accumulator, host_copy, bounded_async, mpi_communicator>;

// What f threw ("" if nothing).
template <class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("data parallel: a rank that cannot step, or grad_scales or learning rates that differ, make every rank throw "
          "instead of hang") {
  // Before a step's first collective the ranks compare their grad_scale and whether each can
  // step; the collectives outside step() (save, synchronize, the copies) vote on the same before
  // theirs. Without that, a rank that throws alone leaves the others in a collective it never
  // joins (this job would hang until ctest's timeout), and different grad_scales would apply
  // different updates to what must stay one state. Here: scales that differ (the same words on
  // every rank), an invalid scale on the last rank, a learning rate set on the last rank only (also
  // -0 against 0), then a background accumulation that fails on
  // the last rank, met by the next step, and again by a save. Every rank throws each time; after
  // a failure every rank refuses work until a load on every rank, after which they go on in step
  // (the reference: one process fed the reduced gradient, resumed from the same set).
  if (ranks() == 1) {
    MESSAGE("one rank: there is no other rank to wait for");
    return;
  }
  const gradient_source src;
  const config cfg = test_config(true);
  const std::string path = tmp_path("mpi_refuse.zfc");
  const bool last = my_rank() == ranks() - 1;
  model m;
  flaky_optimizer opt(cfg, mpi_communicator(MPI_COMM_WORLD));
  m.add_to(opt);
  opt.initialize();
  auto run = [&](int from, int to) {
    for (int s = from; s < to; ++s) {
      src.local_grads(m, s);
      opt.step();
    }
  };
  run(0, 4);
  save_fresh(opt, path);
  src.local_grads(m, 4);
  const std::string differ = thrown([&] { opt.step(last ? 2.0f : 1.0f); });
  CHECK(differ.find("every rank must pass the same") != std::string::npos);
  CHECK(same_everywhere(fnv(std::vector<unsigned char>(differ.begin(), differ.end()))));
  const std::string invalid = thrown([&] { opt.step(last ? 0.0f : 1.0f); });
  CHECK(invalid.find(last ? "grad_scale must be finite and > 0" : "passed grad_scale 0") != std::string::npos);
  // a learning rate set on one rank only (a scheduler run per rank, say): refused alike
  const float lr = opt.lr();
  if (last) opt.set_lr(2 * lr);
  const std::string lr_differs = thrown([&] { opt.step(); });
  CHECK(lr_differs.find("the learning rate is " + zenflow::detail::exact(2 * lr) + " on rank " +
                        std::to_string(ranks() - 1)) != std::string::npos);
  CHECK(same_everywhere(fnv(std::vector<unsigned char>(lr_differs.begin(), lr_differs.end()))));
  // -0 on the last rank, 0 on the others: compared bit for bit (a step size of -0 turns a param
  // of -0 into 0 where one of 0 keeps it, so the ranks' params would part unseen)
  opt.set_lr(last ? -0.0f : 0.0f);
  const std::string zero_differs = thrown([&] { opt.step(); });
  CHECK(zero_differs.find("the learning rate is " + zenflow::detail::exact(-0.0f) + " on rank " +
                          std::to_string(ranks() - 1) + ", " + zenflow::detail::exact(0.0f) + " on rank 0") !=
        std::string::npos);
  CHECK(same_everywhere(fnv(std::vector<unsigned char>(zero_differs.begin(), zero_differs.end()))));
  opt.set_lr(lr);
  run(4, 6);  // (none of them changed anything, nor left the optimizer unusable)
  // a background failure on the last rank
  auto fail_behind = [&](int s) {
    opt.synchronize();  // (no offload in flight: the next one is the first to fail)
    fail_accumulate = last;
    src.local_grads(m, s);
    opt.step();  // the last rank's offload fails behind it
    if (last)
      for (int i = 0; i < 3000 && !opt.scheduler().failed(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK(opt.scheduler().failed() == last);
    fail_accumulate = false;
    MPI_Barrier(MPI_COMM_WORLD);
  };
  fail_behind(6);
  src.local_grads(m, 7);
  const std::string met = thrown([&] { opt.step(); });
  CHECK(met.find(last ? "test: the accumulation failed" : "background job failed") != std::string::npos);
  // every rank now refuses, every call throws on every rank (none waits for another)
  CHECK(!thrown([&] { opt.step(); }).empty());
  CHECK(!thrown([&] { opt.synchronize(); }).empty());
  CHECK(!thrown([&] { opt.save(path); }).empty());
  opt.load(path);  // on every rank: in step again
  run(4, 7);
  fail_behind(7);
  const std::string at_save = thrown([&] { opt.save(path); });
  CHECK(at_save.find(last ? "test: the accumulation failed" : "save() failed on another rank") != std::string::npos);
  CHECK(!thrown([&] { opt.step(); }).empty());
  opt.load(path);  // the set of step 4 still stands
  run(4, 9);
  CHECK(state_of(opt, m) == reference_state(src, cfg, 4, 9, false));
}

// What initialize() threw on this rank: its message ("" when it succeeded) and whether it was a
// config_error.
template <class Opt>
std::pair<std::string, bool> initialize_error(Opt& opt) {
  try {
    opt.initialize();
  } catch (const config_error& e) {
    return {e.what(), true};
  } catch (const std::exception& e) {
    return {e.what(), false};
  }
  return {"", false};
}

// initialize()'s error on this rank (empty: none) when the odd rank's optimizer runs over an
// OddComm and every other rank's over mpi_communicator.
template <class OddComm>
std::string error_with_communicator(bool odd, const config& cfg) {
  model m;
  if (odd) {
    optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, bounded_async, OddComm>
        opt(cfg, OddComm(MPI_COMM_WORLD));
    m.add_to(opt);
    return initialize_error(opt).first;
  }
  dp_optimizer opt(cfg, mpi_communicator(MPI_COMM_WORLD));
  m.add_to(opt);
  return initialize_error(opt).first;
}

// What initialize() threw on this rank, the odd ranks' optimizer being an OddOpt (other
// policies), every other rank's a dp_optimizer.
template <class OddOpt>
std::string error_with_optimizer(bool odd, const config& cfg) {
  model m;
  if (odd) {
    OddOpt opt(cfg, mpi_communicator(MPI_COMM_WORLD));
    m.add_to(opt);
    return initialize_error(opt).first;
  }
  dp_optimizer opt(cfg, mpi_communicator(MPI_COMM_WORLD));
  m.add_to(opt);
  return initialize_error(opt).first;
}

// An accumulator whose allocation fails where fail_allocation is set (a rank short of memory).
bool fail_allocation = false;
struct failing_accumulator : simd_accumulator {
  using simd_accumulator::simd_accumulator;
  void allocate(bool double_buffer) {
    if (fail_allocation) throw std::bad_alloc();
    simd_accumulator::allocate(double_buffer);
  }
};

TEST_CASE_TEMPLATE("data parallel: any allocation of a step failing on one rank throws on every rank, never hangs",
                   Opt, dp_optimizer, staged_optimizer,
                   optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy,
                             bounded_async, mpi_allreduce_communicator>) {
  // Each allocation (operator new) the training thread makes in a step, failed in turn on the
  // last rank: in the first step (the reduction's first rounds; a selection), the next ones (a
  // boundary: the host update's first start, the first overlapped offload) and a reselection.
  // A rank that throws alone would leave the others waiting in the step's next collective (this
  // job would hang until ctest's timeout); instead every rank throws there, or — where the step's
  // collectives were all behind it — the others finish the step and the next one refuses on
  // every rank. No hang, and no rank going on alone. The sweep ends at the first count past the
  // step's last allocation. The three communicator paths (reduce-scatter, staged through the
  // gather space, all-reduce), and with the reduce-scatter four update intervals: 2 with and
  // without overlap, 1, and automatic. (Not failed here: the space's own buffers, which come
  // from aligned_alloc — the gather space's growth is voted on, tested in
  // test_data_parallel_threads — and oneTBB's allocations for its tasks, below any vote.)
  const gradient_source src;
  const int R = ranks();
  const bool last = my_rank() == R - 1;
  std::vector<std::pair<const char*, config>> configs = {{"U 2, overlap", test_config(true)}};
  if constexpr (std::is_same_v<Opt, dp_optimizer>) {
    configs.push_back({"U 2, no overlap", test_config(false)});
    configs.push_back({"U 1", test_config(true)});
    configs.back().second.update_interval = interval::every(1);
    configs.push_back({"automatic U", test_config(true)});
    configs.back().second.update_interval = interval::auto_();
  }
  for (const auto& [name, cfg] : configs) {
    const std::string config_name = name;
    CAPTURE(config_name);
    long swept = 0, everywhere = 0;
    for (const int at : {0, 1, 2, 4}) {
      CAPTURE(at);
      for (long nth = 1;; ++nth) {
        CAPTURE(nth);
        model m;
        Opt opt(cfg, std::remove_cvref_t<decltype(std::declval<Opt&>().communicator())>(MPI_COMM_WORLD));
        m.add_to(opt);
        opt.initialize();
        for (int s = 0; s < at; ++s) {
          src.local_grads(m, s);
          opt.step();
        }
        src.local_grads(m, at);
        fail_nth = last ? nth : 0;
        const std::string what = thrown([&] { opt.step(); });
        const bool past_the_end = fail_nth > 0;
        fail_nth = 0;
        const std::uint64_t threw = sum_over_ranks(!what.empty());
        if (threw == std::uint64_t(R)) ++everywhere;
        if (threw > 0) {
          // The next step: the same outcome on every rank — it refuses everywhere after a
          // failure midway (until a load, which other tests take), or steps everywhere after a
          // refusal that changed nothing (the reduction's: it only rewrites the grad buffers);
          // where the failure came after the step's last collective, the others finished that
          // step, and the ranks, no longer in step, must all refuse.
          src.local_grads(m, at + 1);
          const bool again = !thrown([&] { opt.step(); }).empty();
          CHECK(same_everywhere(again));
          if (threw < std::uint64_t(R)) CHECK(again);
        }
        if (sum_over_ranks(past_the_end) > 0) break;
        ++swept;
      }
    }
    MESSAGE(std::string(name), ": ", swept, " allocations failed in turn on the last rank, ", everywhere,
            " of them threw on every rank");
    CHECK(swept > 0);
    CHECK(everywhere > 0);  // (a failure before a collective, met by the vote: with several ranks, the point)
  }
}

TEST_CASE_TEMPLATE("data parallel: each allocation of a save, then of a load, failing in turn on one rank throws on every "
                   "rank or on none, never hangs",
                   Opt, dp_optimizer, staged_optimizer) {
  // save(): each rank's listing of the directory, the path made absolute, the gathers' tables, the
  // shard's buffers, rank 0's manifest. A failure on one rank between two collectives would leave
  // the others waiting in the next (this job would hang until ctest's timeout). Each allocation
  // (operator new) of the calling thread is failed in turn, on rank 0 and on the last rank:
  // every rank throws, or none does (where the failure is absorbed: the clean-up of older shards
  // after the new set stands). Either way <path> names a complete set of this state: a fresh
  // optimizer loads it and holds opt's state.
  // load(): the same sweep, into an optimizer of another state: every rank throws or none; where
  // they threw, every rank refuses work or every rank is unchanged; and the load then succeeds
  // everywhere, giving opt's state. (staged_optimizer: the gathers through the gather space, the
  // NCCL communicator's path.)
  const gradient_source src;
  const int R = ranks(), me = my_rank();
  using comm_t = std::remove_cvref_t<decltype(std::declval<Opt&>().communicator())>;
  const std::string path = tmp_path(std::is_same_v<Opt, dp_optimizer> ? "alloc_sweep_mpi.ckpt" : "alloc_sweep_staged.ckpt");
  model m;
  Opt opt(test_config(true), comm_t(MPI_COMM_WORLD));
  m.add_to(opt);
  opt.initialize();
  for (int s = 0; s < 3; ++s) {
    src.local_grads(m, s);
    opt.step();
  }
  opt.save(path);
  const std::vector<unsigned char> want = state_of(opt, m);
  auto loaded = [&] {
    model m2;
    Opt o2(test_config(true), comm_t(MPI_COMM_WORLD));
    m2.add_to(o2);
    o2.initialize();
    o2.load(path);
    return state_of(o2, m2);
  };
  // call() with the calling thread's nth allocation failing on rank `failing`: whether any rank
  // threw (checked: every rank or none), and whether the nth allocation came on no rank (the
  // sweep's end)
  struct attempt_result {
    bool threw, past_the_end;
  };
  auto attempt = [&](int failing, long nth, auto&& call) {
    fail_nth = me == failing ? nth : 0;
    const std::string what = thrown(call);
    const bool past_the_end = fail_nth > 0;
    fail_nth = 0;
    CAPTURE(what);
    const std::uint64_t threw = sum_over_ranks(!what.empty());
    CHECK((threw == 0 || threw == std::uint64_t(R)));
    return attempt_result{threw > 0, sum_over_ranks(past_the_end) > 0};
  };
  for (int failing = 0; failing < R; failing += std::max(1, R - 1)) {
    CAPTURE(failing);
    long saves = 0, save_threw = 0, loads = 0, load_threw = 0;
    for (long nth = 1;; ++nth) {
      CAPTURE(nth);
      const attempt_result a = attempt(failing, nth, [&] { opt.save(path); });
      save_threw += a.threw;
      // (each check on a value every rank agrees on first: a rank alone leaving the loop, or
      // alone entering a collective, would hang the others instead of reporting the failure)
      const bool all_usable = sum_over_ranks(opt.usable()) == std::uint64_t(R);
      REQUIRE(all_usable);  // (a refused save changes nothing)
      CHECK(loaded() == want);
      // a save that goes through: it removes what the failure left (a shard whose clean-up
      // failed, say), so that each count starts from the same directory
      opt.save(path);
      MPI_Barrier(MPI_COMM_WORLD);  // (each rank removes its old shards after the save's last collective)
      CHECK(shard_files_of(path) == std::size_t(R));
      MPI_Barrier(MPI_COMM_WORLD);
      if (a.past_the_end) break;
      ++saves;
    }
    for (long nth = 1;; ++nth) {
      CAPTURE(nth);
      model m2;
      Opt o2(test_config(true), comm_t(MPI_COMM_WORLD));
      m2.add_to(o2);
      o2.initialize();
      src.local_grads(m2, 0);
      o2.step();  // (a state other than the file's)
      const std::vector<unsigned char> before = state_of(o2, m2);
      const attempt_result a = attempt(failing, nth, [&] { o2.load(path); });
      load_threw += a.threw;
      if (a.threw) {
        const std::uint64_t usable = sum_over_ranks(o2.usable());
        CHECK((usable == 0 || usable == std::uint64_t(R)));
        if (usable == std::uint64_t(R)) CHECK(state_of(o2, m2) == before);
      } else {
        CHECK(state_of(o2, m2) == want);
      }
      o2.load(path);
      CHECK(state_of(o2, m2) == want);
      if (a.past_the_end) break;
      ++loads;
    }
    MESSAGE("rank ", failing, " failing: ", saves, " allocations of a save (", save_threw, " thrown everywhere), ", loads,
            " of a load (", load_threw, ")");
    CHECK(save_threw > 0);
    CHECK(load_threw > 0);
  }
}

TEST_CASE("data parallel: a copy call's buffer that one rank cannot allocate: every rank refuses, then goes on") {
  // column_counts() and copy_params_synchronized() (with a host update in flight) allocate a
  // buffer for every rank's columns before gathering them; a rank that could not would throw
  // alone and leave the others in the gather. The allocation is in the call's first vote: every
  // rank refuses, nothing changed, and the same calls then succeed and give every rank the same.
  // (ref: the same run without the refused calls)
  const gradient_source src;
  const int R = ranks();
  const bool last = my_rank() == R - 1;
  model m, m_ref;
  dp_optimizer opt(test_config(true), mpi_communicator(MPI_COMM_WORLD)),
      ref(test_config(true), mpi_communicator(MPI_COMM_WORLD));
  m.add_to(opt);
  m_ref.add_to(ref);
  opt.initialize();
  ref.initialize();
  auto run = [&](int from, int to) {
    for (int s = from; s < to; ++s) {
      src.local_grads(m, s);
      opt.step();
      src.local_grads(m_ref, s);
      ref.step();
    }
  };
  run(0, 3);  // (a host update is in flight after step 2's boundary)
  // the buffers' sizes: matrix 0's counts (4 bytes a column), matrix 1's unselected columns'
  // bf16 params (2 bytes an element)
  const std::size_t counts_bytes = 4 * C0, params_bytes = (C1 - opt.selected_columns(matrix_id{1}).size()) * R1 * 2;
  auto refused = [&](std::size_t bytes, auto&& call) {
    fail_new_from = last ? bytes : 0;
    const std::string what = thrown(call);
    fail_new_from = 0;
    CAPTURE(what);
    if (last) CHECK(what == std::bad_alloc().what());
    else CHECK(what.find("could not allocate the call's host buffer") != std::string::npos);
  };
  refused(counts_bytes, [&] { (void)opt.column_counts(matrix_id{0}); });
  std::vector<unsigned char> params(2 * R1 * C1);
  refused(params_bytes, [&] { opt.copy_params_synchronized(matrix_id{1}, params.data()); });
  // the calls again: what the run without the refusals gives, the same on every rank
  std::vector<unsigned char> params_ref(params.size());
  const std::vector<std::uint32_t> counts = opt.column_counts(matrix_id{0});
  CHECK(counts == ref.column_counts(matrix_id{0}));
  opt.copy_params_synchronized(matrix_id{1}, params.data());
  ref.copy_params_synchronized(matrix_id{1}, params_ref.data());
  CHECK(params == params_ref);
  CHECK(same_everywhere(fnv(std::vector<unsigned char>(reinterpret_cast<const unsigned char*>(counts.data()),
                                                       reinterpret_cast<const unsigned char*>(counts.data() + counts.size())))));
  CHECK(same_everywhere(fnv(params)));
  run(3, 6);  // and the run goes on as if nothing had been refused
  const std::vector<unsigned char> state = state_of(opt, m);
  CHECK(state == state_of(ref, m_ref));
  CHECK(same_everywhere(fnv(state)));
}

TEST_CASE("data parallel: ranks that registered different tensors or configs all refuse initialize(), in the same words") {
  // The last rank differs from the others in one thing at a time. Without the comparison a
  // different shape would meet the others' collectives with other sizes (an MPI error or a hang),
  // and a different setting would let the replicated state drift apart with no error at all.
  // Every rank must throw, every rank the same message, naming what differs on which rank, and
  // the ranks must still be in step afterwards (checked at the end by training against the
  // reference). Exact expected words: the values are the test's own, printed exactly.
  const int last = ranks() - 1;
  const bool odd = my_rank() == last && ranks() > 1;
  const std::string them = "rank " + std::to_string(last);
  const config base = test_config(true);
  struct mismatch {
    const char* name;
    void (*conf)(config&);
    void (*reg)(dp_optimizer&, model&);  // the odd rank's registrations
    std::string expect;
    bool config_err;
  };
  auto plain = [](dp_optimizer& o, model& m) { m.add_to(o); };
  const std::string m1 = std::to_string(R1) + " x ", v0 = std::to_string(N2) + " elements, f32 params, f16 grads, lr_scale ";
  const std::vector<mismatch> cases = {
      {"topk_ratio", [](config& c) { c.topk_ratio = 0.5; }, plain, "topk_ratio is 0.5 on " + them + ", 0.25 on rank 0", true},
      {"lr", [](config& c) { c.adam.lr = 2e-2f; }, plain, "lr is 0.02 on " + them + ", 0.01 on rank 0", true},
      {"reduction", [](config& c) { c.gradient_reduction = reduce_op::sum; }, plain,
       "gradient_reduction is 1 on " + them + ", 0 on rank 0", true},
      {"overlap", [](config& c) { c.overlap_step = false; }, plain, "overlap_step is 0 on " + them + ", 1 on rank 0", true},
      // (the same number, other bits: a reason all the same, not "configs differ ()")
      {"-0", [](config& c) { c.max_grad_norm = -0.0; }, plain, "config differs in its bytes on " + them + " though every value compares equal", true},
      {"shape", [](config&) {},
       [](dp_optimizer& o, model& m) {
         o.add_matrix(matrix(m.w0.data(), m.g0.data(), rows{R0}, cols{C0}).dtypes(dtype::f32, dtype::bf16));
         o.add_matrix(matrix(m.w1.data(), m.g1.data(), rows{R1}, cols{C1 - 1}).row_major().dtypes(dtype::bf16, dtype::f32));
         o.add_vector(zenflow::vector(m.b2.data(), m.g2.data(), N2).dtypes(dtype::f32, dtype::f16));
       },
       "matrix 1: " + m1 + std::to_string(C1 - 1) + ", bf16 params, f32 grads, row-major, lr_scale 1, weight_decay_scale 1 on " +
           them + ", " + m1 + std::to_string(C1) + ", bf16 params, f32 grads, row-major, lr_scale 1, weight_decay_scale 1 on rank 0",
       false},
      {"group", [](config&) {},
       [](dp_optimizer& o, model& m) {
         o.add_matrix(matrix(m.w0.data(), m.g0.data(), rows{R0}, cols{C0}).dtypes(dtype::f32, dtype::bf16));
         o.add_matrix(matrix(m.w1.data(), m.g1.data(), rows{R1}, cols{C1}).row_major().dtypes(dtype::bf16, dtype::f32));
         o.add_vector(zenflow::vector(m.b2.data(), m.g2.data(), N2).dtypes(dtype::f32, dtype::f16).group(1.0f, 0.0f));
       },
       "vector 0: " + v0 + "1, weight_decay_scale 0 on " + them + ", " + v0 + "1, weight_decay_scale 1 on rank 0", false},
      {"count", [](config&) {},
       [](dp_optimizer& o, model& m) {
         m.add_to(o);
         static std::vector<float> b(N2), g(N2);  // (registered buffers must not overlap)
         o.add_vector(zenflow::vector(b.data(), g.data(), N2));
       },
       "registered different tensors: " + them + " 2 matrices and 2 vectors, rank 0 2 and 1", false},
  };
  for (const mismatch& c : cases) {
    CAPTURE(c.name);
    config cfg = base;
    if (odd) c.conf(cfg);
    model m;
    dp_optimizer opt(cfg, mpi_communicator(MPI_COMM_WORLD));
    if (odd) c.reg(opt, m);
    else m.add_to(opt);
    const auto [what, config_err] = initialize_error(opt);
    if (ranks() == 1) {  // one rank: nothing to compare, nothing differs
      CHECK(what.empty());
      continue;
    }
    CHECK(what.find(c.expect) != std::string::npos);
    CHECK(config_err == c.config_err);
    CHECK(same_everywhere(fnv(std::vector<unsigned char>(what.begin(), what.end()))));
    CHECK(!opt.initialized());
  }
  {  // host_threads may differ (a rank's own resources): initialize() succeeds everywhere
    config cfg = base;
    if (odd) cfg.host_threads = 2;
    model m;
    dp_optimizer opt(cfg, mpi_communicator(MPI_COMM_WORLD));
    m.add_to(opt);
    CHECK(initialize_error(opt).first.empty());
  }
  {  // a rank whose transport uploads ahead where the others' does not: a boundary would gather
     // other things on it (the others would wait in a vote it never joins)
    model m;
    dp_optimizer opt(base, mpi_communicator(MPI_COMM_WORLD));
    opt.transport().upload_ahead(odd);
    m.add_to(opt);
    const std::string what = initialize_error(opt).first;
    if (ranks() == 1) {
      CHECK(what.empty());
    } else {
      CHECK(what.find("transports differ: " + them + " uploads ahead, rank 0 does not") != std::string::npos);
      CHECK(same_everywhere(fnv(std::vector<unsigned char>(what.begin(), what.end()))));
      CHECK(!opt.initialized());
    }
  }
  // A rank built with another communicator type, which would cut the reduction differently and
  // meet the others' collectives with other sizes: one whose rounds are shorter, one that
  // all-reduces where the others reduce-scatter (the same round). Every rank refuses, naming both.
  // And one that widens the gradients to fp32 for the reduction where the others move them in
  // their own dtype: its rounds would hold other dtypes and sizes.
  const std::string other_comm[] = {
      error_with_communicator<short_round_mpi>(odd, base),
      error_with_communicator<mpi_allreduce_communicator>(odd, base),
      error_with_communicator<fp32_wire_mpi>(odd, base)};
  const std::string other_expect[] = {
      "reduce in rounds of at most 16 elements on " + them + ", 16777216 on rank 0",
      "the one on " + them + " all-reduces the matrices' gradients in their own dtypes, the one on rank 0 "
      "reduce-scatters the matrices' gradients in their own dtypes",
      "the one on " + them + " reduce-scatters the matrices' gradients in fp32, the one on rank 0 "
      "reduce-scatters the matrices' gradients in their own dtypes"};
  for (int c = 0; c < 3; ++c) {
    CAPTURE(c);
    const std::string& what = other_comm[c];
    if (ranks() == 1) {
      CHECK(what.empty());
    } else {
      CHECK(what.find(other_expect[c]) != std::string::npos);
      CHECK(same_everywhere(fnv(std::vector<unsigned char>(what.begin(), what.end()))));
    }
  }
  // A rank built from other policies (everything else alike): another Selector would pick other
  // columns, another Scheduler is harmless but still not the same program. Every rank refuses.
  const std::string other_type[] = {
      error_with_optimizer<optimizer<host_space, select_all, fused_adamw<host_space>, simd_accumulator, host_copy,
                                     bounded_async, mpi_communicator>>(odd, base),
      error_with_optimizer<optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy,
                                     synchronous, mpi_communicator>>(odd, base)};
  for (const std::string& what : other_type) {
    if (ranks() == 1) {
      CHECK(what.empty());
    } else {
      CHECK_MESSAGE(what.find("the ranks' optimizers are of different types (" + them) != std::string::npos, what);
      CHECK(same_everywhere(fnv(std::vector<unsigned char>(what.begin(), what.end()))));
    }
  }
  {  // a rank with nothing registered: it says so, the others that it failed
    model m;
    dp_optimizer opt(base, mpi_communicator(MPI_COMM_WORLD));
    if (!odd) m.add_to(opt);
    const std::string what = initialize_error(opt).first;
    if (ranks() > 1)
      CHECK(what.find(odd ? "no parameters registered" : "another rank's initialize() failed") != std::string::npos);
    else
      CHECK(what.empty());
  }
  {  // a rank whose allocation fails: its own error there, every other rank undoes its build
    using failing_optimizer =
        optimizer<host_space, column_topk, fused_adamw<host_space>, failing_accumulator, host_copy, bounded_async, mpi_communicator>;
    model m;
    failing_optimizer opt(base, mpi_communicator(MPI_COMM_WORLD));
    m.add_to(opt);
    fail_allocation = odd;
    std::string what;
    bool bad_alloc = false;
    try {
      opt.initialize();
    } catch (const std::bad_alloc&) {
      bad_alloc = true;
    } catch (const std::exception& e) {
      what = e.what();
    }
    fail_allocation = false;
    CHECK(bad_alloc == odd);
    if (ranks() > 1 && !odd) CHECK(what.find("another rank's initialize() failed") != std::string::npos);
    CHECK(opt.initialized() == (ranks() == 1));
    // and on every rank the same optimizer initializes once the memory is there
    if (!opt.initialized()) CHECK_NOTHROW(opt.initialize());
  }
  {  // the staged path (the comparison's gathers through the space's device memory)
    config cfg = base;
    if (odd) cfg.adam.beta2 = 0.95f;
    model m;
    staged_optimizer opt(cfg, staged_mpi(MPI_COMM_WORLD));
    m.add_to(opt);
    const auto [what, config_err] = initialize_error(opt);
    if (ranks() > 1) {
      CHECK(what.find("beta2 is 0.95 on " + them + ", 0.999 on rank 0") != std::string::npos);
      CHECK(config_err);
    }
  }
  // The ranks are still in step: an agreeing optimizer trains as the reference does.
  const gradient_source src;
  trained t(src, base, 6);
  CHECK(state_of(t.opt, t.m) == reference_state(src, base, 6, 6, false));
  if (ranks() > 1) CHECK(t.opt.stats().bytes_reduced > 0);  // (one rank reduces nothing)
}

TEST_CASE("data parallel: the reduction's shards cover every element once, whatever n and R") {
  for (std::size_t n : {0u, 1u, 3u, 7u, 1000u, 1000003u})
    for (int R = 1; R <= 9; ++R) {
      CHECK(detail::shard_begin(n, R, 0) == 0);
      CHECK(detail::shard_begin(n, R, R) == n);
      for (int r = 0; r < R; ++r) {
        const std::size_t size = detail::shard_begin(n, R, r + 1) - detail::shard_begin(n, R, r);
        CHECK(size >= n / std::size_t(R));  // balanced: n / R or one more
        CHECK(size <= n / std::size_t(R) + 1);
      }
    }
  // near 2^64: no overflow in n * r
  const std::size_t big = std::numeric_limits<std::size_t>::max() - 5;
  CHECK(detail::shard_begin(big, 4, 2) == big / 2);
}

// mpi_communicator with MPI's limits made small: a few elements a call, and "MPI's int" of 8, so
// that the rounds, reduce_scatter's packed copy and all_gather's broadcast pieces run here.
struct tight_mpi : mpi_communicator {
  tight_mpi(MPI_Comm c, std::size_t round, std::size_t int_max) : mpi_communicator(c, limits{round, int_max}) {}
};

TEST_CASE("data parallel: the optimizer over a communicator with small limits equals one process, bit for bit") {
  // The collectives' small-limit paths (reduction rounds of 3 elements, reduce_scatter's packed
  // copy, all_gather's broadcast pieces past an "int" of 8 bytes) under the whole optimizer: the
  // step's vote, the reduce-scatter, the statistics and selected columns' gathers, the published
  // params, the column state copies. Both reductions, with and without overlap.
  for (reduce_op op : {reduce_op::mean, reduce_op::sum}) {
    for (bool overlap : {false, true}) {
      CAPTURE(int(op));
      CAPTURE(overlap);
      const gradient_source src;
      const int steps = 9;
      config cfg = variant(op, overlap);
      cfg.gradient_reduction = op;
      model m;
      optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, bounded_async, tight_mpi>
          opt(cfg, tight_mpi(MPI_COMM_WORLD, 3, 8));
      m.add_to(opt);
      opt.initialize();
      std::vector<bool> skipped;
      for (int s = 0; s < steps; ++s) {
        src.local_grads(m, s);
        skipped.push_back(opt.step(scale_for(op)).skipped);
      }
      const auto synced = synced_params(opt);
      const auto state = state_of(opt, m);
      const auto ref = reference_run(src, op, overlap, steps);
      CHECK(state == ref.state);
      CHECK(synced == ref.synced);
      CHECK(skipped == ref.skipped);
      CHECK(same_everywhere(fnv(state)));
    }
  }
}

TEST_CASE("data parallel: mpi_communicator's collectives against their definitions, with small limits too") {
  // Values with different exponents, so that another order of the additions would round
  // differently; the rank-order fp32 sum (and the division for the mean) computed here element
  // by element.
  const int R = ranks(), me = my_rank();
  auto value = [](int r, int q, std::size_t j) {
    return std::ldexp(1.0f + float((j * 7 + std::size_t(q) * 3) % 11) / 16.0f, (r * 5 + int(j)) % 9 - 4) *
           (r % 2 ? -1.0f : 1.0f);
  };
  auto reduced = [&](int q, std::size_t j, reduce_op op) {
    float x = value(0, q, j);
    for (int r = 1; r < R; ++r) x += value(r, q, j);
    return op == reduce_op::mean ? x / float(R) : x;
  };
  auto same = [](float a, float b) { return std::memcmp(&a, &b, 4) == 0; };
  // reduce_scatter's input on this rank: segments of different lengths, one empty when R > 1,
  // rank q's segment holding this rank's element(q, j); where this rank's own segment starts, and
  // how many elements the others' segments hold
  struct scatter_input {
    std::vector<std::size_t> counts;
    std::size_t own = 0, others = 0;
  };
  auto segments = [&](auto& data, auto element) {
    scatter_input in;
    in.counts.resize(static_cast<std::size_t>(R));
    for (int q = 0; q < R; ++q) in.counts[std::size_t(q)] = R > 1 && q == 1 ? 0 : std::size_t(9 + 4 * q);
    for (int q = 0; q < R; ++q) {
      for (std::size_t j = 0; j < in.counts[std::size_t(q)]; ++j) data.push_back(element(q, j));
      if (q < me) in.own += in.counts[std::size_t(q)];
      if (q != me) in.others += in.counts[std::size_t(q)];
    }
    return in;
  };
  auto check_all = [&](mpi_communicator& comm) {
    for (reduce_op op : {reduce_op::sum, reduce_op::mean}) {
      CAPTURE(int(op));
      {  // reduce: 23 elements, every rank gets every one
        std::vector<float> data(23);
        for (std::size_t j = 0; j < data.size(); ++j) data[j] = value(me, 0, j);
        comm.reduce(data.data(), data.size(), op);
        bool ok = true;
        for (std::size_t j = 0; j < data.size(); ++j) ok = ok && same(data[j], reduced(0, j, op));
        CHECK(ok);
      }
      {  // reduce_scatter
        std::vector<float> data;
        const scatter_input in = segments(data, [&](int q, std::size_t j) { return value(me, q, j); });
        const std::uint64_t before = comm.bytes_sent();
        comm.reduce_scatter(data.data(), in.counts.data(), op);
        bool ok = true;
        for (std::size_t j = 0; j < in.counts[std::size_t(me)]; ++j) ok = ok && same(data[in.own + j], reduced(me, j, op));
        CHECK(ok);
        CHECK(comm.bytes_sent() - before == (R > 1 ? 4 * in.others : 0));  // the others' segments, once
      }
      {  // reduce_scatter, every element in the last rank's segment: in rounds of 2 ceil(37 / R)
        std::vector<std::size_t> counts(static_cast<std::size_t>(R), 0);
        counts.back() = 37;
        std::vector<float> data(37);
        for (std::size_t j = 0; j < data.size(); ++j) data[j] = value(me, R - 1, j);
        comm.reduce_scatter(data.data(), counts.data(), op);
        bool ok = true;
        for (std::size_t j = 0; me == R - 1 && j < data.size(); ++j) ok = ok && same(data[j], reduced(R - 1, j, op));
        CHECK(ok);
      }
    }
    // The typed members: bf16 and fp16 elements, widened exactly (from the formats' definitions),
    // summed in rank order in fp32, divided for the mean and rounded to the dtype by
    // tests/reference's nearest-even rounding. The values' exponents differ by up to 8, so the
    // fp32 sums carry more bits than the dtype and the rounding back decides the last one.
    for (zenflow::dtype t : {zenflow::dtype::bf16, zenflow::dtype::f16}) {
      CAPTURE(int(t));
      auto elem = [&](int r, int q, std::size_t j) {  // rank r's element j of segment q, as bits
        const float x = value(r, q, j);
        return t == zenflow::dtype::bf16 ? zf_ref::bf16_round(x) : zf_ref::f16_round(x);
      };
      auto widen = [&](std::uint16_t h) {
        return float(t == zenflow::dtype::bf16 ? zf_ref::bf16_value(h) : zf_ref::f16_value(h));
      };
      auto want = [&](int q, std::size_t j, reduce_op op) {
        float x = widen(elem(0, q, j));
        for (int r = 1; r < R; ++r) x += widen(elem(r, q, j));
        if (op == reduce_op::mean) x /= float(R);
        return t == zenflow::dtype::bf16 ? zf_ref::bf16_round(x) : zf_ref::f16_round(x);
      };
      for (reduce_op op : {reduce_op::sum, reduce_op::mean}) {
        CAPTURE(int(op));
        {  // reduce: 23 elements, every rank gets every one, 2 bytes each on the wire
          std::vector<std::uint16_t> data(23);
          for (std::size_t j = 0; j < data.size(); ++j) data[j] = elem(me, 0, j);
          std::uint64_t before = comm.bytes_sent();
          comm.reduce(data.data(), t, data.size(), op);
          const std::uint64_t sent = comm.bytes_sent() - before;
          bool ok = true;
          for (std::size_t j = 0; j < data.size(); ++j) ok = ok && data[j] == want(0, j, op);
          CHECK(ok);
          // the same elements as an fp32 reduce of 23 (its pieces and shards), at half the bytes
          std::vector<float> f(23, 1.0f);
          before = comm.bytes_sent();
          comm.reduce(f.data(), f.size(), op);
          CHECK(2 * sent == comm.bytes_sent() - before);
          CHECK((sent > 0) == (R > 1));
        }
        {  // reduce_scatter
          std::vector<std::uint16_t> data;
          const scatter_input in = segments(data, [&](int q, std::size_t j) { return elem(me, q, j); });
          const std::uint64_t before = comm.bytes_sent();
          comm.reduce_scatter(data.data(), t, in.counts.data(), op);
          bool ok = true;
          for (std::size_t j = 0; j < in.counts[std::size_t(me)]; ++j) ok = ok && data[in.own + j] == want(me, j, op);
          CHECK(ok);
          CHECK(comm.bytes_sent() - before == (R > 1 ? 2 * in.others : 0));  // the others' segments, 2 bytes each
        }
      }
    }
    {  // all_gather: rank r's block of 5 + 3r bytes
      std::vector<std::size_t> bytes(static_cast<std::size_t>(R));
      std::size_t total = 0, mine = 0;
      for (int r = 0; r < R; ++r) {
        bytes[std::size_t(r)] = 5 + 3 * std::size_t(r);
        if (r < me) mine += bytes[std::size_t(r)];
        total += bytes[std::size_t(r)];
      }
      std::vector<unsigned char> data(total, 0xee);
      for (std::size_t j = 0; j < bytes[std::size_t(me)]; ++j) data[mine + j] = static_cast<unsigned char>(me * 40 + int(j));
      comm.all_gather(data.data(), bytes.data());
      bool ok = true;
      for (int r = 0, at = 0; r < R; at += int(bytes[std::size_t(r)]), ++r)
        for (std::size_t j = 0; j < bytes[std::size_t(r)]; ++j) ok = ok && data[std::size_t(at) + j] == static_cast<unsigned char>(r * 40 + int(j));
      CHECK(ok);
    }
  };
  SUBCASE("MPI's limits") {
    mpi_communicator comm(MPI_COMM_WORLD);
    check_all(comm);
  }
  SUBCASE("rounds of 4 elements") {
    tight_mpi comm(MPI_COMM_WORLD, 4, std::size_t(1) << 20);
    check_all(comm);
  }
  SUBCASE("rounds of 3 and an int of 8: a packed copy, broadcast pieces") {
    tight_mpi comm(MPI_COMM_WORLD, 3, 8);
    check_all(comm);
  }
}

// The sums on a lent arena (use_arena, what the optimizer does each step): shards of over 2^15
// elements, past which the sum is split across the arena's threads, in fp32 and bf16, reduce
// and reduce_scatter, against the rank-order fp32 sum computed here element by element (bits),
// and the same calls on the calling thread alone. The values have 24-bit mantissas and exponents
// spanning 2^-8..2^8, so that the fp32 partial sums round, and at every 4th element ranks 0 and
// 1 hold +B and -B (B about 2^20), which cancel first in rank order and swallow the other ranks'
// small values in another: from 3 ranks on another order of the additions gives other bits
// (checked below, for fp32 and for bf16 after its rounding). (At one rank there is nothing to
// reduce: the calls return the data as it is.)
TEST_CASE("data parallel: mpi_communicator sums on a lent arena's threads with the bits of the rank-order sum") {
  const int R = ranks(), me = my_rank();
  const std::size_t share = (std::size_t(1) << 15) + 4096 + 5;  // a rank's shard
  const std::size_t n = share * std::size_t(R);
  auto value = [](int r, std::size_t j) {
    const bool cancel = j % 4 == 0 && r < 2;  // (B on rank 0, -B on rank 1)
    std::uint64_t h = (cancel ? 0 : std::uint64_t(r) + 1) * 0x9e3779b97f4a7c15ull + j * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 29;
    const float mant = 1.0f + float(h & 0x7fffffu) / float(1u << 23);  // 24 significant bits
    if (cancel) return std::ldexp(mant, 20) * (r == 0 ? 1.0f : -1.0f);
    return std::ldexp(mant, int((h >> 23) % 17) - 8) * ((h >> 40) & 1 ? -1.0f : 1.0f);
  };
  auto bf16 = [](float x) { return zf_ref::bf16_round(x); };
  auto wide = [](std::uint16_t h) { return float(zf_ref::bf16_value(h)); };
  if (R >= 3) {  // the values tell the orders apart
    std::size_t differ32 = 0, differ16 = 0;
    for (std::size_t j = 0; j < n; ++j) {
      float a = value(0, j), b = value(R - 1, j), a16 = wide(bf16(value(0, j))), b16 = wide(bf16(value(R - 1, j)));
      for (int r = 1; r < R; ++r) {
        a += value(r, j);
        a16 += wide(bf16(value(r, j)));
      }
      for (int r = R - 2; r >= 0; --r) {
        b += value(r, j);
        b16 += wide(bf16(value(r, j)));
      }
      differ32 += zf_ref::bits(a) != zf_ref::bits(b);
      differ16 += bf16(a16) != bf16(b16);
    }
    REQUIRE(differ32 > 0);
    REQUIRE(differ16 > 0);
  }
  tbb::task_arena arena(3);
  for (bool lend : {true, false}) {
    CAPTURE(lend);
    mpi_communicator comm(MPI_COMM_WORLD);
    comm.use_arena(lend ? &arena : nullptr);
    for (reduce_op op : {reduce_op::sum, reduce_op::mean}) {
      CAPTURE(int(op));
      auto want32 = [&](std::size_t j) {
        float x = value(0, j);
        for (int r = 1; r < R; ++r) x += value(r, j);
        return op == reduce_op::mean ? x / float(R) : x;
      };
      auto want16 = [&](std::size_t j) {
        float x = wide(bf16(value(0, j)));
        for (int r = 1; r < R; ++r) x += wide(bf16(value(r, j)));
        return bf16(op == reduce_op::mean ? x / float(R) : x);
      };
      {  // reduce, fp32: every rank gets every element
        std::vector<float> data(n);
        for (std::size_t j = 0; j < n; ++j) data[j] = value(me, j);
        comm.reduce(data.data(), n, op);
        std::size_t bad = 0;
        for (std::size_t j = 0; j < n; ++j) bad += zf_ref::bits(data[j]) != zf_ref::bits(want32(j));
        CHECK(bad == 0);
      }
      {  // reduce, bf16
        std::vector<std::uint16_t> data(n);
        for (std::size_t j = 0; j < n; ++j) data[j] = bf16(value(me, j));
        comm.reduce(data.data(), zenflow::dtype::bf16, n, op);
        std::size_t bad = 0;
        for (std::size_t j = 0; j < n; ++j) bad += data[j] != want16(j);
        CHECK(bad == 0);
      }
      {  // reduce_scatter, bf16: equal segments, this rank's is elements [me share, (me + 1) share)
        std::vector<std::uint16_t> data(n);
        for (std::size_t j = 0; j < n; ++j) data[j] = bf16(value(me, j));
        const std::vector<std::size_t> counts(std::size_t(R), share);
        comm.reduce_scatter(data.data(), zenflow::dtype::bf16, counts.data(), op);
        std::size_t bad = 0;
        for (std::size_t j = std::size_t(me) * share; j < std::size_t(me + 1) * share; ++j) bad += data[j] != want16(j);
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("data parallel: mpi_communicator's reduce_scatter keeps its receive buffer within about twice the data") {
  // T = 1000 elements, all in the last rank's segment (what a matrix narrower than R, or a row
  // longer than a round, gives the optimizer's reduce-scatter). That rank receives its segment
  // from every rank: in one call, R T floats; in rounds of P = 2 ceil(T / R), R P <= 2 T + 2 R.
  // The bound: that, the shard and packing buffers (none here), and the four count arrays.
  // (At R = 2 the two are the same; at R = 3 and 4 the one call exceeds the bound.)
  const int R = ranks(), me = my_rank();
  constexpr std::size_t T = 1000;
  mpi_communicator comm(MPI_COMM_WORLD);  // (fresh: its buffers hold this call's only)
  std::vector<std::size_t> counts(static_cast<std::size_t>(R), 0);
  counts.back() = T;
  std::vector<float> data(T);
  for (std::size_t j = 0; j < T; ++j) data[j] = float(me + 1) * float(j % 17);
  comm.reduce_scatter(data.data(), counts.data(), reduce_op::sum);
  const std::size_t Rs = std::size_t(R);
  if (me == R - 1) {
    bool ok = true;  // sum over r of (r + 1) x: R (R + 1) / 2 x, exact (small integers)
    for (std::size_t j = 0; j < T; ++j) ok = ok && data[j] == float(R * (R + 1) / 2) * float(j % 17);
    CHECK(ok);
  }
  CAPTURE(comm.bytes_allocated());
  CHECK(comm.bytes_allocated() <= sizeof(float) * (2 * T + 2 * Rs) + 4 * sizeof(int) * Rs);
}

// The communicator's buffers grow at a collective's first call; a rank that cannot allocate them
// must not leave the others in the collective (they waited in MPI_Alltoallv for ever): every
// rank throws before anything is sent, the data as it was, and the next call works.
TEST_CASE("data parallel: mpi_communicator: an allocation that fails on one rank throws on every rank, then goes on") {
  const int R = ranks(), me = my_rank();
  const std::size_t n = std::size_t(1) << 14;
  const int failing = R - 1;  // (with one rank nothing is reduced, nothing allocated: the call just works)
  auto expect = [&](const std::string& what) {
    if (R == 1) CHECK(what.empty());
    else if (me == failing) CHECK(what == std::bad_alloc().what());
    else
      CHECK(what == "zenflow: mpi_communicator: another rank could not allocate its buffers for this collective (it "
                    "threw its error); nothing was sent");
  };
  {  // reduce
    mpi_communicator comm(MPI_COMM_WORLD);
    std::vector<float> data(n, float(me + 1));
    std::string what;
    fail_new_from = me == failing ? 1024 : 0;
    try {
      comm.reduce(data.data(), n, reduce_op::sum);
    } catch (const std::exception& e) {
      what = e.what();
    }
    fail_new_from = 0;
    expect(what);
    CHECK(std::all_of(data.begin(), data.end(), [&](float x) { return x == float(R > 1 ? me + 1 : 1); }));
    CHECK(comm.bytes_sent() == 0);
    comm.reduce(data.data(), n, reduce_op::sum);  // 1 + 2 + ... + R, exact
    CHECK(std::all_of(data.begin(), data.end(), [&](float x) { return x == float(R * (R + 1) / 2); }));
  }
  {  // reduce_scatter: rank r's segment of n / R elements (the last one the rest)
    mpi_communicator comm(MPI_COMM_WORLD);
    std::vector<std::size_t> counts(static_cast<std::size_t>(R), n / std::size_t(R));
    counts.back() += n % std::size_t(R);
    std::vector<float> data(n, float(me + 1));
    std::string what;
    fail_new_from = me == failing ? 1024 : 0;
    try {
      comm.reduce_scatter(data.data(), counts.data(), reduce_op::sum);
    } catch (const std::exception& e) {
      what = e.what();
    }
    fail_new_from = 0;
    expect(what);
    CHECK(comm.bytes_sent() == 0);
    comm.reduce_scatter(data.data(), counts.data(), reduce_op::sum);
    const std::size_t own = n / std::size_t(R) * std::size_t(me);
    CHECK(std::all_of(data.begin() + std::ptrdiff_t(own), data.begin() + std::ptrdiff_t(own + counts[std::size_t(me)]),
                      [&](float x) { return x == float(R * (R + 1) / 2); }));
  }
}

// A rank killed (SIGKILL) in the middle of the ranks' saves: the job ends (mpirun takes the other
// ranks down with it), and a new job loads the last complete set, exactly, and goes on from it.
// Two phases, each its own mpirun (tests/mpi_rank_killed.sh, ctest mpi_rank_killed_mid_save):
// ZF_MPI_KILL=write takes a step and saves after each, until the last rank kills itself about
// 40 ms into the saves (a save of this model takes milliseconds: the kill lands inside one almost
// always, and wherever it lands the claim is the same); ZF_MPI_KILL=check loads the set. Skipped
// in the ordinary runs.
namespace {
bool kill_phase(const char* phase) {
  const char* p = std::getenv("ZF_MPI_KILL");
  return p && std::strcmp(p, phase) == 0;
}
const std::string killed_path() { return tmp_path("mpi_killed.zfc"); }
}  // namespace

TEST_CASE("data parallel: a rank killed mid-save: the writing job (dies)" * doctest::skip(!kill_phase("write"))) {
  const gradient_source src;
  const config cfg = test_config(true);
  trained t(src, cfg, 3);
  save_fresh(t.opt, killed_path());  // a complete set before anything dies
  if (my_rank() == ranks() - 1) {
    // (mpi_rank_killed.sh requires this line: the job died after the complete set, not before)
    std::printf("zf-kill: armed after the complete set\n");
    std::fflush(stdout);
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
      std::raise(SIGKILL);
    }).detach();
  }
  for (int s = 3; s < 100000; ++s) {
    src.local_grads(t.m, s);
    t.opt.step();
    t.opt.save(killed_path());
  }
  FAIL("the rank that was to die is still alive");
}

TEST_CASE("data parallel: a rank killed mid-save: the loading job" * doctest::skip(!kill_phase("check"))) {
  const gradient_source src;
  const config cfg = test_config(true);
  int n = 0;
  {
    model m;
    dp_optimizer opt(cfg, mpi_communicator(MPI_COMM_WORLD));
    m.add_to(opt);
    opt.initialize();
    opt.load(killed_path());
    n = int(opt.stats().steps);  // the steps the set holds
    MESSAGE("the last complete set holds " << n << " steps");
    CHECK(n >= 3);
    CHECK(state_of(opt, m) == reference_state(src, cfg, 0, n, false));
  }
  // planted before that save: stale shards of an older generation, this rank's and (rank 0's to
  // remove) one of a rank beyond R, which the save must remove; files it must leave alone
  const std::string stale = killed_path() + ".g0.rank" + std::to_string(my_rank()) + "-of-" + std::to_string(ranks());
  const std::string beyond = killed_path() + ".g1.rank" + std::to_string(ranks() + 1) + "-of-" + std::to_string(ranks() + 2);
  const std::string other_base = tmp_path("mpi_killed.zfcx.g0.rank0-of-1"), not_a_shard = stale + ".bak";
  std::ofstream(stale) << "stale";
  MPI_Barrier(MPI_COMM_WORLD);
  if (my_rank() == 0) {
    std::ofstream(beyond) << "stale";
    std::ofstream(other_base) << "keep";
    std::ofstream(not_a_shard) << "keep";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  {  // and the run goes on from it: a step, a save over what the dead job left, a load
    model m;
    dp_optimizer opt(cfg, mpi_communicator(MPI_COMM_WORLD));
    m.add_to(opt);
    opt.initialize();
    opt.load(killed_path());
    src.local_grads(m, n);
    opt.step();
    opt.save(killed_path());
  }
  model m;
  dp_optimizer opt(cfg, mpi_communicator(MPI_COMM_WORLD));
  CHECK(resume(opt, m, killed_path(), src, n + 1, n + 1) == reference_state(src, cfg, 0, n + 1, false));
  // the new set's shards are the only ones left: what the killed save and the set before it
  // left behind is gone
  MPI_Barrier(MPI_COMM_WORLD);
  if (my_rank() == 0) {
    const std::filesystem::path p(killed_path());
    const std::string prefix = p.filename().string() + ".g";
    std::vector<std::string> shards;
    for (const auto& e : std::filesystem::directory_iterator(p.parent_path())) {
      const std::string name = e.path().filename().string();
      if (name.rfind(prefix, 0) == 0 && name.find(".tmp") == std::string::npos) shards.push_back(name);
    }
    CAPTURE(shards.size());
    CHECK(shards.size() == std::size_t(ranks()) + 1);  // (and not_a_shard)
    CHECK(!exists(beyond));
    CHECK(exists(other_base));
    CHECK(exists(not_a_shard));
    std::remove(other_base.c_str());
    std::remove(not_a_shard.c_str());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(!exists(stale));
}

// An exception escaping a test case on one rank would leave the other ranks waiting in a
// collective until ctest's timeout (minutes); this listener ends the whole job at once instead,
// saying which rank and what.
struct abort_on_escape : doctest::IReporter {
  explicit abort_on_escape(const doctest::ContextOptions&) {}
  void test_case_exception(const doctest::TestCaseException& e) override {
    std::fprintf(stderr, "zenflow test_mpi: rank %d: an exception escaped a test case (%s); ending the job\n", my_rank(),
                 e.error_string.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("abort_on_escape", 1, abort_on_escape);

int main(int argc, char** argv) {
  int provided = 0;  // zenflow runs threads of its own; only this one calls MPI
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  {
    doctest::Context ctx(argc, argv);
    // one full report, rank 0's; the other ranks print their failures only (and a failure
    // anywhere fails the run)
    if (my_rank() != 0) ctx.setOption("minimal", true);
    rc = ctx.run();
    int any = 0;  // a failure on any rank fails every rank's exit status
    MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any != 0) {
      if (my_rank() == 0) std::printf("zenflow test_mpi: a check failed on at least one of %d ranks\n", ranks());
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}
