// The optimizer the checkpoint fuzzer loads into, and the seed writer saves from: two matrices
// (one row-major, bf16), a vector, overlap on.
#pragma once

#include <cmath>
#include <vector>

#include <zenflow/zenflow.hpp>

namespace zf_fuzz {

inline zenflow::config make_config() {
  zenflow::config c;
  c.topk_ratio = 0.25;
  c.update_interval = zenflow::interval::every(2);
  c.select_interval = zenflow::interval::every(4);
  c.host_threads = 1;
  return c;
}

struct model {
  std::vector<zenflow::bfloat16> w1 = std::vector<zenflow::bfloat16>(8 * 12), g1 = w1;
  std::vector<float> w2 = std::vector<float>(6 * 5), g2 = w2, b = std::vector<float>(7), gb = b;
  template <class Opt>
  void register_with(Opt& opt) {
    opt.add_matrix({w1.data(), g1.data(), 8, 12, zenflow::dtype::bf16, zenflow::dtype::bf16});
    opt.add_matrix({w2.data(), g2.data(), 6, 5, zenflow::dtype::f32, zenflow::dtype::f32,
                    zenflow::matrix_layout::row_major});
    opt.add_vector({b.data(), gb.data(), 7});
  }
  void gradients(int s) {
    for (std::size_t i = 0; i < g1.size(); ++i) g1[i] = zenflow::to_bfloat16(std::sin(float(i + std::size_t(s))) * 0.1f);
    for (std::size_t i = 0; i < g2.size(); ++i) g2[i] = std::cos(float(i * 3 + std::size_t(s))) * 0.1f;
    for (std::size_t i = 0; i < gb.size(); ++i) gb[i] = std::sin(float(i * 7 + std::size_t(s))) * 0.1f;
  }
};

}  // namespace zf_fuzz
