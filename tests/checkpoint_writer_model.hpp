// The model shared by tests/checkpoint_writer.cpp and test_checkpoint_kill.cpp: big enough that
// a save takes a few milliseconds, so a kill lands inside one.
#pragma once

#include <cmath>
#include <vector>

#include <zenflow/zenflow.hpp>

namespace zf_kill_test {

inline zenflow::config make_config() {
  zenflow::config c;
  c.topk_ratio = 0.1;
  c.update_interval = zenflow::interval::every(2);
  c.select_interval = zenflow::interval::every(4);
  return c;
}

struct model {
  static constexpr std::size_t rows = 256, cols = 1024;
  std::vector<zenflow::bfloat16> w = std::vector<zenflow::bfloat16>(rows * cols, zenflow::to_bfloat16(0.5f));
  std::vector<zenflow::bfloat16> dw = std::vector<zenflow::bfloat16>(rows * cols);
  template <class Opt>
  void register_with(Opt& opt) {
    opt.add_matrix({w.data(), dw.data(), rows, cols, zenflow::dtype::bf16, zenflow::dtype::bf16});
  }
  void gradients(int step) {
    for (std::size_t i = 0; i < dw.size(); ++i) dw[i] = zenflow::to_bfloat16(std::sin(float(i + std::size_t(step))) * 1e-3f);
  }
};

}  // namespace zf_kill_test
