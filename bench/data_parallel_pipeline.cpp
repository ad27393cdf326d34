// The emulated pipeline (bench/pipeline: host space, an emulated device per process) at R ranks:
// ZenFlow and ZeRO-Offload, each data parallel over MPI with sharded host state, side by side in
// one run, at a forward/backward time fixed for every R; the gradients reduce-scattered by column
// blocks (mpi_communicator), and ZenFlow once more with them all-reduced, for comparison
// (mpi_allreduce_communicator), and once more reduce-scattered but widened to fp32 for the
// reduction (fp32_wire_mpi; the other runs move the bf16 gradients in their own dtype: the same
// bits, half the bytes). Run under mpirun with R ranks; each
// rank's "device" is its own (a sleep for compute, a link model for copies) and its host work is
// the real code on this machine's cores, so the ranks share the cores: on a box with fewer
// cores than R x threads the figures include that contention (say so when quoting them).
//
//   mpirun -np R data_parallel_pipeline [--layers N] [--hidden D] [--ffn F] [--steps M]
//                                       [--threads T] [--compute-frac X] [--calib-s S] [--upload-ahead]
//                                       [--rounds K]
//
// The four trainings run K times (default 3) in an order rotated each round; a JSON line per
// round (its "round"), whose ratios are within that round.
//
// Compute time: X (default 0.5) times ZeRO-Offload's host update of the whole model in ONE
// process with T threads — measured first by rank 0 alone (or given as --calib-s, so that runs
// at different R share it exactly). That is the paper's regime at R = 1; as R grows each rank's
// host update shrinks to about 1/R while the forward/backward stays, which is the question: how
// much of the stall is left. Rank 0 prints one JSON line with every rank's step and stall.
#include <mpi.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <zenflow/mpi.hpp>
#include <zenflow/zenflow.hpp>

#include "emulated_device.hpp"
#include "fp32_wire_mpi.hpp"
#include "pipeline_common.hpp"
#include "pipeline_run.hpp"

using namespace zf_bench;

namespace {

using zenflow_dp = zenflow::optimizer<emulated_space, zenflow::column_topk, emulated_updater, zenflow::simd_accumulator,
                                      emulated_link, zenflow::bounded_async, zenflow::mpi_communicator>;
// the same with every gradient all-reduced (the reduction before the reduce-scatter), side by side
using zenflow_dp_all_reduce =
    zenflow::optimizer<emulated_space, zenflow::column_topk, emulated_updater, zenflow::simd_accumulator, emulated_link,
                       zenflow::bounded_async, zenflow::mpi_allreduce_communicator>;
// and reduce-scattered in fp32 (the gradients widened for the reduction), side by side
using zenflow_dp_fp32_wire = zenflow::optimizer<emulated_space, zenflow::column_topk, emulated_updater,
                                                zenflow::simd_accumulator, emulated_link, zenflow::bounded_async,
                                                fp32_wire_mpi>;
using zero_offload_dp = zenflow::optimizer<emulated_space, zenflow::select_none, emulated_updater,
                                           zenflow::simd_accumulator, emulated_link, zenflow::synchronous,
                                           zenflow::mpi_communicator>;
using zero_offload_one = zenflow::optimizer<emulated_space, zenflow::select_none, emulated_updater,
                                            zenflow::simd_accumulator, emulated_link, zenflow::synchronous>;

// every rank's value of x, on rank 0
std::vector<double> gather(double x, int R) {
  std::vector<double> all(static_cast<std::size_t>(R));
  MPI_Gather(&x, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return all;
}

void print_array(const char* name, const std::vector<double>& v) {
  std::printf(",\"%s\":[", name);
  for (std::size_t i = 0; i < v.size(); ++i) std::printf("%s%.6g", i ? "," : "", v[i]);
  std::printf("]");
}

}  // namespace

int main(int argc, char** argv) {
  zf_bench::record_run(argc, argv);
  int provided = 0;  // zenflow runs threads of its own; only this one calls MPI
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // (see bench/pipeline)
  int rank = 0, R = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  const args a("data_parallel_pipeline", argc, argv,
               {"--layers", "--hidden", "--ffn", "--steps", "--threads", "--compute-frac", "--calib-s", "--rounds"},
               {"--upload-ahead"});
  const std::size_t layers = a.count("--layers", 2, 1, 1024);
  const std::size_t hidden = a.count("--hidden", 1024, 1, 1 << 20);
  const std::size_t ffn = a.count("--ffn", 2752, 1, 1 << 20);
  const int steps = int(a.count("--steps", 32, 1, 1 << 20));
  const unsigned threads = unsigned(a.count("--threads", 1, 0, 1024));
  const double frac = a.real("--compute-frac", 0.5, 0, 1e6);
  double t_host = a.real("--calib-s", 0, 0, 1e6);  // (0: measured here)
  const bool ahead = a.has("--upload-ahead");  // ZenFlow uploads a host update's params ahead
  const int rounds = int(a.count("--rounds", 3, 1, 1000));
  const model shape(layers, hidden, ffn);
  device_model::link_gbps = 25.0;

  // Calibration: one process's ZeRO-Offload host update (rank 0 alone; the others wait).
  if (t_host <= 0) {
    if (rank == 0) t_host = run<zero_offload_one>(shape, zero_offload_config(threads), 0.0, 2, 4, false).host_update_s;
    MPI_Bcast(&t_host, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  }
  const double compute = frac * t_host;
  const point p{0.1, 4, frac, 25.0, threads, "ranks"};

  // Each round trains the four once, in an order rotated round by round (the machine's drift and
  // a training's place in the job hit all alike); a line per round, ratios within it.
  for (int round = 0; round < rounds; ++round) {
    result zo, zf, za, zw;
    for (int i = 0; i < 4; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      switch ((i + round) % 4) {
        case 0:
          zo = run<zero_offload_dp>(shape, zero_offload_config(threads), compute, 2, std::max(4, steps / 4), false,
                                    zenflow::mpi_communicator(MPI_COMM_WORLD));
          break;
        case 1:
          zf = run<zenflow_dp>(shape, zenflow_config(p, steps), compute, 16, steps, ahead,
                               zenflow::mpi_communicator(MPI_COMM_WORLD));
          break;
        case 2:
          za = run<zenflow_dp_all_reduce>(shape, zenflow_config(p, steps), compute, 16, steps, ahead,
                                          zenflow::mpi_allreduce_communicator(MPI_COMM_WORLD));
          break;
        default:
          zw = run<zenflow_dp_fp32_wire>(shape, zenflow_config(p, steps), compute, 16, steps, ahead,
                                         fp32_wire_mpi(MPI_COMM_WORLD));
      }
    }

    const auto za_step = gather(za.step_s, R), za_stall = gather(za.stall_s, R), za_reduce = gather(za.reduce_s, R);
    const auto zw_step = gather(zw.step_s, R), zw_reduce = gather(zw.reduce_s, R);
    const auto zf_step = gather(zf.step_s, R), zf_stall = gather(zf.stall_s, R), zf_host = gather(zf.host_update_s, R);
    const auto zf_bytes = gather(zf.d2h_bytes + zf.h2d_bytes, R), zf_reduce = gather(zf.reduce_s, R);
    const auto zo_step = gather(zo.step_s, R), zo_stall = gather(zo.stall_s, R), zo_host = gather(zo.host_update_s, R);
    const auto zo_bytes = gather(zo.d2h_bytes + zo.h2d_bytes, R), zo_reduce = gather(zo.reduce_s, R);
    if (rank == 0) {
      const double model_bytes = double(shape.params) * 2;
      auto slowest = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
      std::printf("{%s\"bench\":\"data_parallel_pipeline\",\"device\":\"emulated (host space; sleep for compute, link "
                  "model), a device per rank\",\"cpu\":\"%s\",\"ranks\":%d,\"cores\":%u,\"threads_per_rank\":%u,\"params\":%zu,"
                  "\"model_bytes\":%.0f,\"topk_ratio\":0.1,\"update_interval\":4,\"link_gbps\":25,"
                  "\"one_process_zero_offload_host_update_s\":%.5f,\"compute_s\":%.5f,\"compute_frac\":%g,"
                  "\"upload_ahead\":%s,\"round\":%d",
                  zf_bench::run_fields(),
                  zf_bench::cpu_model().c_str(), R, std::max(1u, std::thread::hardware_concurrency()), threads, shape.params, model_bytes, t_host,
                  compute, frac, ahead ? "true" : "false", round);
      print_array("zenflow_step_s", zf_step);
      print_array("zenflow_stall_s", zf_stall);
      print_array("zenflow_host_update_s", zf_host);
      print_array("zenflow_link_bytes", zf_bytes);
      print_array("zenflow_reduce_s", zf_reduce);
      print_array("zenflow_all_reduce_step_s", za_step);
      print_array("zenflow_all_reduce_stall_s", za_stall);
      print_array("zenflow_all_reduce_reduce_s", za_reduce);
      print_array("zenflow_fp32_wire_step_s", zw_step);
      print_array("zenflow_fp32_wire_reduce_s", zw_reduce);
      print_array("zero_offload_step_s", zo_step);
      print_array("zero_offload_stall_s", zo_stall);
      print_array("zero_offload_host_update_s", zo_host);
      print_array("zero_offload_link_bytes", zo_bytes);
      print_array("zero_offload_reduce_s", zo_reduce);
      // a data-parallel step ends when its slowest rank's does
      std::printf(",\"speedup\":%.3f,\"stall_reduction\":%s}\n", slowest(zo_step) / slowest(zf_step),
                  json_number(1.0 - slowest(zf_stall) / slowest(zo_stall)).c_str());
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
