// Data parallel with sharded host state, per rank: host-update time, device<->host bytes and the
// collectives' bytes per step, host memory, step time. Run under mpirun with R ranks; rank 0
// prints one JSON line with every rank's figures. Compare R = 1, 2, 4 run one after the other:
//   for R in 1 2 4; do mpirun -np $R build/bench/data_parallel; done
// The model: --matrices square bf16 matrices (params and grads) of --dim rows and columns, one
// vector; ZenFlow's defaults but for topk_ratio 0.1, U = 4, S = 8, synchronous host updates (so
// that the host-update time is the update's own, not overlapped). Each run trains twice, side by
// side: the matrices' gradients reduce-scattered (mpi_communicator: each rank gets its block's
// reduced gradient, the rest from the column statistics and the selected columns gathered) and
// all-reduced (mpi_allreduce_communicator), one JSON line each; and the reduce-scatter once more
// with the gradients widened to fp32 for the reduction (reduction "reduce_scatter_fp32":
// fp32_wire_mpi) before the bf16 gradients travel in their own dtype ("reduce_scatter"): the same
// bits, twice the bytes. --rounds times (default 3), in an order rotated each round; the median
// step leaves out the first step.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <zenflow/mpi.hpp>
#include <zenflow/zenflow.hpp>

#include "args.hpp"
#include "fp32_wire_mpi.hpp"
#include "machine.hpp"

using namespace zenflow;

template <class Comm>
void run(const char* reduction, int round, std::size_t dim, std::size_t nmat, int steps, unsigned threads) {
  int rank = 0, R = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  {
    config cfg;
    cfg.topk_ratio = 0.1;
    cfg.update_interval = interval::every(4);
    cfg.select_interval = interval::every(8);
    cfg.overlap_step = false;
    cfg.host_threads = threads;
    using dp = optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, bounded_async,
                         Comm>;
    dp opt(cfg, Comm(MPI_COMM_WORLD));
    std::vector<std::vector<bfloat16>> w(nmat, std::vector<bfloat16>(dim * dim)), g(nmat, std::vector<bfloat16>(dim * dim));
    std::vector<float> b(dim, 0.0f), gb(dim);
    for (std::size_t m = 0; m < nmat; ++m) {
      for (std::size_t i = 0; i < dim * dim; ++i) w[m][i] = bfloat16(0.01f * float((i * 7 + m) % 101) - 0.5f);
      opt.add_matrix(matrix(w[m].data(), g[m].data(), rows{dim}, cols{dim}).dtypes(dtype::bf16, dtype::bf16));
    }
    opt.add_vector(zenflow::vector(b.data(), gb.data(), dim));
    opt.initialize();
    std::vector<double> step_s;
    for (int s = 0; s < steps; ++s) {
      for (std::size_t m = 0; m < nmat; ++m)  // a rank's own gradient: a cheap hash, columns of different weight
        for (std::size_t i = 0; i < dim * dim; ++i) {
          const std::uint32_t h = std::uint32_t(i * 2654435761u) ^ (std::uint32_t(s) * 40503u + std::uint32_t(rank) * 977u + std::uint32_t(m));
          g[m][i] = bfloat16((float(h % 2001) / 1000.0f - 1.0f) * (1.0f + float((i / dim + std::size_t(s)) % 7)));
        }
      for (std::size_t i = 0; i < dim; ++i) gb[i] = 0.001f * float(i % 13);
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      opt.step();
      // (the first step, which selects and touches every buffer first, is not in the median)
      if (s > 0 || steps == 1) step_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    opt.synchronize();
    std::sort(step_s.begin(), step_s.end());
    const optimizer_stats st = opt.stats();
    const double per_step = 1.0 / double(steps);
    const double mine[] = {st.host_update_seconds / double(std::max<std::uint64_t>(1, st.host_updates)),
                           double(st.bytes_to_host) * per_step,
                           double(st.bytes_to_device) * per_step,
                           double(st.bytes_reduced) * per_step,
                           double(st.bytes_gathered) * per_step,
                           double(st.host_pageable_bytes),
                           step_s[step_s.size() / 2],
                           st.reduce_seconds * per_step,
                           double(opt.communicator().bytes_allocated())};
    constexpr int nf = int(sizeof mine / sizeof mine[0]);
    std::vector<double> all(std::size_t(R) * nf);
    MPI_Gather(mine, nf, MPI_DOUBLE, all.data(), nf, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      const char* names[nf] = {"host_update_s",         "bytes_to_host_per_step", "bytes_to_device_per_step",
                               "bytes_reduced_per_step", "bytes_gathered_per_step", "host_pageable_bytes",
                               "median_step_s",          "reduce_s_per_step",     "communicator_bytes"};
      std::printf("{%s\"bench\":\"data_parallel\",\"cpu\":\"%s\",\"host_cores\":%u,\"reduction\":\"%s\",\"round\":%d,"
                  "\"ranks\":%d,\"params\":%zu,\"steps\":%d,\"threads_per_rank\":%u",
                  zf_bench::run_fields(),
                  zf_bench::cpu_model().c_str(), std::max(1u, std::thread::hardware_concurrency()), reduction, round,
                  R, nmat * dim * dim + dim, steps, threads);
      for (int f = 0; f < nf; ++f) {
        std::printf(",\"%s\":[", names[f]);
        for (int r = 0; r < R; ++r) std::printf("%s%.6g", r ? "," : "", all[std::size_t(r) * nf + std::size_t(f)]);
        std::printf("]");
      }
      std::printf("}\n");
    }
  }
}

int main(int argc, char** argv) {
  zf_bench::record_run(argc, argv);
  int provided = 0;  // zenflow runs threads of its own; only this one calls MPI
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  const zf_bench::args a("data_parallel", argc, argv, {"--dim", "--matrices", "--steps", "--threads", "--rounds"});
  const std::size_t dim = a.count("--dim", 1024, 1, 1 << 16), nmat = a.count("--matrices", 8, 1, 4096);
  const int steps = int(a.count("--steps", 32, 1, 1 << 20));
  const unsigned threads = unsigned(a.count("--threads", 1, 1, 1024));
  const int rounds = int(a.count("--rounds", 3, 1, 1000));
  // Each round trains every variant once, in an order rotated round by round, so that the
  // machine's drift and a variant's place in the job (first, after another's memory) hit all
  // alike; the lines carry their round, and ratios are to be taken within one.
  using variant = void (*)(const char*, int, std::size_t, std::size_t, int, unsigned);
  const std::pair<const char*, variant> variants[] = {
      {"all_reduce", &run<mpi_allreduce_communicator>},
      {"reduce_scatter_fp32", &run<zf_bench::fp32_wire_mpi>},
      {"reduce_scatter", &run<mpi_communicator>}};
  constexpr int nv = int(sizeof variants / sizeof variants[0]);
  for (int r = 0; r < rounds; ++r)
    for (int i = 0; i < nv; ++i) {
      const auto& v = variants[(i + r) % nv];
      v.second(v.first, r, dim, nmat, steps, threads);
    }
  MPI_Finalize();
  return 0;
}
