// What the tests that run data-parallel ranks as threads share (test_data_parallel_threads,
// test_checkpoint_sync): the host-space optimizer over a hub communicator, and a set trained and
// saved by R such ranks.
#pragma once

#include <string>

#include <zenflow/zenflow.hpp>

#include "data_parallel_model.hpp"
#include "data_parallel_support.hpp"
#include "host_hub.hpp"

namespace zf_dp_test {

template <class Comm>
using thread_optimizer = zenflow::optimizer<zenflow::host_space, zenflow::column_topk, zenflow::fused_adamw<zenflow::host_space>,
                                            zenflow::simd_accumulator, zenflow::host_copy, zenflow::bounded_async, Comm>;

// R ranks as threads train steps [0, steps) on their own gradients (reduced by cfg's op) and save
// a set at path; rank 0's stats() right after the save.
inline zenflow::optimizer_stats save_set_on_threads(int R, const zenflow::config& cfg, const gradient_source& src,
                                                    int steps, const std::string& path) {
  zenflow::optimizer_stats rank0;
  zf_test::thread_hub hub(R);
  zf_test::on_ranks(hub, [&](int r) {
    model m;
    thread_optimizer<zf_test::hub_communicator> opt(cfg, zf_test::hub_communicator(hub, r));
    m.add_to(opt);
    opt.initialize();
    for (int s = 0; s < steps; ++s) {
      src.fill_all(m, s, r, 0, cfg.gradient_reduction);
      opt.step();
    }
    opt.save(path);
    if (r == 0) rank0 = opt.stats();
  });
  return rank0;
}

}  // namespace zf_dp_test
