// The run that the committed checkpoints under tests/data/checkpoint were written from
// (tests/write_format_files.cpp) and that test_checkpoint_format replays to check them: the
// data-parallel tests' three tensors and gradients (data_parallel_model.hpp,
// data_parallel_support.hpp), with parameter groups and starting values of its own. Nothing here goes through libm (std::sin and the like
// differ between C libraries and CPUs), so the state these files hold is the state the same
// steps give on any machine: a file written on one is compared with a run on another.
#pragma once

#include <string>
#include <vector>

#include <zenflow/zenflow.hpp>

#include "data_parallel_model.hpp"
#include "data_parallel_support.hpp"

namespace zf_format {

using zf_dp_test::C0;
using zf_dp_test::C1;
using zf_dp_test::N2;
using zf_dp_test::R0;
using zf_dp_test::R1;

// Saved after steps [0, saved_after): selections at t = 1 and 5 behind it, a host-update window
// open (one step accumulated of two), overlap on: a state with every part filled.
inline constexpr int saved_after = 7;
// The set: written by this many ranks.
inline constexpr int set_ranks = 2;
// The files' names (the set's manifest; its shards are <name>.g<generation>.rank<r>-of-2).
inline const std::string one_process_file = "one_process.zfckpt";
inline const std::string set_file = "two_ranks.zfckpt";

// The data-parallel tests' config (overlap on, the mean), with weight decay.
inline zenflow::config make_config() {
  zenflow::config c = zf_dp_test::test_config(true);
  c.adam.weight_decay = 0.01f;
  return c;
}

// The data-parallel tests' buffers (data_parallel_model.hpp), with starting values of its own:
// the gradient hash of a rank no run uses, halved (exact; the base's come from libm).
struct model : zf_dp_test::model {
  model() {
    for (std::size_t i = 0; i < w0.size(); ++i) w0[i] = 0.5f * zf_dp_test::local(97, 0, 0, i);
    for (std::size_t i = 0; i < w1.size(); ++i) w1[i] = zenflow::bfloat16(0.5f * zf_dp_test::local(97, 0, 1, i));
    for (std::size_t i = 0; i < b2.size(); ++i) b2[i] = 0.5f * zf_dp_test::local(97, 0, 2, i);
  }
  // matrix 1 at half the learning rate without weight decay; the vector without weight decay
  template <class Opt>
  void add_to(Opt& opt) {
    using zenflow::dtype, zenflow::rows, zenflow::cols;
    opt.add_matrix(zenflow::matrix(w0.data(), g0.data(), rows{R0}, cols{C0}).dtypes(dtype::f32, dtype::bf16));
    opt.add_matrix(zenflow::matrix(w1.data(), g1.data(), rows{R1}, cols{C1})
                       .row_major()
                       .dtypes(dtype::bf16, dtype::f32)
                       .group(0.5f, 0.0f));
    opt.add_vector(zenflow::vector(b2.data(), g2.data(), N2).dtypes(dtype::f32, dtype::f16).no_weight_decay());
  }
};

// (params, masters, moments and column counts, as bytes: data_parallel_model.hpp)
using zf_dp_test::state_of;

// One process, steps [from, to), fed the reduced (mean) gradient of `ranks` ranks (0: rank 0's
// own gradient, as one process without ranks writes it).
template <class Opt>
void feed(Opt& opt, model& m, int ranks, int from, int to) {
  const zf_dp_test::gradient_source src;
  for (int s = from; s < to; ++s) {
    src.fill_all(m, s, 0, ranks, zenflow::reduce_op::mean);
    opt.step();
  }
}

}  // namespace zf_format
