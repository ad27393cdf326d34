// The host-space model of the data-parallel tests (test_mpi: ranks as MPI processes;
// test_data_parallel_threads: ranks as threads): the three tensors of data_parallel_support.hpp in
// host memory, and the optimizer state a run leaves, as bytes, to compare bit for bit.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include <zenflow/zenflow.hpp>

#include "data_parallel_support.hpp"

namespace zf_dp_test {

// The tests' config: selections at t = 1, 5, 9, 13; host updates every 2 steps; lr 1e-2 (so
// that 13 steps move the state well away from its start); one host thread a rank.
inline zenflow::config test_config(bool overlap, zenflow::reduce_op op = zenflow::reduce_op::mean) {
  zenflow::config c;
  c.topk_ratio = 0.25;
  c.update_interval = zenflow::interval::every(2);
  c.select_interval = zenflow::interval::every(4);
  c.overlap_step = overlap;
  c.adam.lr = 1e-2f;
  c.host_threads = 1;
  c.gradient_reduction = op;
  return c;
}

struct model {
  std::vector<float> w0 = std::vector<float>(R0 * C0);
  std::vector<zenflow::bfloat16> g0 = std::vector<zenflow::bfloat16>(R0 * C0);
  std::vector<zenflow::bfloat16> w1 = std::vector<zenflow::bfloat16>(R1 * C1);
  std::vector<float> g1 = std::vector<float>(R1 * C1);
  std::vector<float> b2 = std::vector<float>(N2);
  std::vector<zenflow::float16> g2 = std::vector<zenflow::float16>(N2);
  model() {
    for (std::size_t i = 0; i < w0.size(); ++i) w0[i] = std::sin(float(i)) * 0.5f;
    for (std::size_t i = 0; i < w1.size(); ++i) w1[i] = zenflow::bfloat16(std::cos(float(i)) * 0.5f);
    for (std::size_t i = 0; i < b2.size(); ++i) b2[i] = 0.01f * float(i);
  }
  template <class Opt>
  void add_to(Opt& opt) {
    using zenflow::dtype, zenflow::rows, zenflow::cols;
    opt.add_matrix(zenflow::matrix(w0.data(), g0.data(), rows{R0}, cols{C0}).dtypes(dtype::f32, dtype::bf16));
    opt.add_matrix(zenflow::matrix(w1.data(), g1.data(), rows{R1}, cols{C1}).row_major().dtypes(dtype::bf16, dtype::f32));
    opt.add_vector(zenflow::vector(b2.data(), g2.data(), N2).dtypes(dtype::f32, dtype::f16));
  }
};

// Params, masters, moments and counts after a run, as bytes (synchronize and the copies are
// collectives with a multi-process communicator: every rank calls this).
template <class Opt>
std::vector<unsigned char> state_of(Opt& opt, model& m) {
  opt.synchronize();
  return state_bytes(opt, m.w0, m.w1, m.b2);
}

}  // namespace zf_dp_test
