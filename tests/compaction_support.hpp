// Test policies for the offload's compaction fused into the gradient pass. Two schedulers make
// the optimizer's choice deterministic: lane_idle finishes each gradient offload before step()
// returns (so the lane is idle at every next step, and every step that can fuse does), lane_busy
// reports its lane busy whenever asked (no step fuses; the optimizer still waits for the real
// job). counting_updater counts the gradient passes by kind, to show which path ran.
#pragma once

#include <utility>

#include <zenflow/zenflow.hpp>

namespace zf_test {

struct lane_idle : zenflow::bounded_async {
  template <class Job>
  void launch_offload(Job&& job) {
    bounded_async::launch_offload(std::forward<Job>(job));
    wait_offload_quiet();
  }
};

struct lane_busy : zenflow::bounded_async {
  bool offload_busy() const { return true; }
};

template <class Space = zenflow::host_space>
struct counting_updater : zenflow::fused_adamw<Space> {
  using base = zenflow::fused_adamw<Space>;
  static inline int compacting = 0, plain = 0;
  typename base::grad_summary gradient_pass(Space& s) { return gradient_pass(s, false); }
  typename base::grad_summary gradient_pass(Space& s, bool compact) {
    ++(compact ? compacting : plain);
    return base::gradient_pass(s, compact);
  }
};

}  // namespace zf_test
