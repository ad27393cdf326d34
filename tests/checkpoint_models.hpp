// The models that checkpoints are written from in the crash and fuzz tests, with deterministic
// gradients: `big` (test_checkpoint_kill and its helper checkpoint_writer: one bf16 matrix, big
// enough that a save takes a few milliseconds, so a kill lands inside one) and `small`
// (the checkpoint fuzzer loads into it, its seed writer saves from it: two matrices, one
// row-major, and a vector).
#pragma once

#include <cmath>
#include <type_traits>
#include <vector>

#include <zenflow/zenflow.hpp>

namespace zf_ckpt_models {

// Selections every 4 steps and host updates every 2, so a checkpoint lands inside open windows
// and after reselections.
inline zenflow::config make_config(double topk_ratio, unsigned host_threads) {
  zenflow::config c;
  c.topk_ratio = topk_ratio;
  c.update_interval = zenflow::interval::every(2);
  c.select_interval = zenflow::interval::every(4);
  c.host_threads = host_threads;
  return c;
}

// g[i] = scale * sin(i * stride + step) (or cos), stored in g's type.
template <class T>
void wave(std::vector<T>& g, int step, std::size_t stride, float scale, bool cosine = false) {
  for (std::size_t i = 0; i < g.size(); ++i) {
    const float x = float(i * stride + std::size_t(step));
    const float v = (cosine ? std::cos(x) : std::sin(x)) * scale;
    if constexpr (std::is_same_v<T, float>) g[i] = v;
    else g[i] = zenflow::to_bfloat16(v);
  }
}

struct big {
  static zenflow::config config() { return make_config(0.1, 0); }
  static constexpr std::size_t rows = 256, cols = 1024;
  std::vector<zenflow::bfloat16> w = std::vector<zenflow::bfloat16>(rows * cols, zenflow::to_bfloat16(0.5f));
  std::vector<zenflow::bfloat16> dw = std::vector<zenflow::bfloat16>(rows * cols);
  template <class Opt>
  void register_with(Opt& opt) {
    opt.add_matrix({w.data(), dw.data(), rows, cols, zenflow::dtype::bf16, zenflow::dtype::bf16});
  }
  void gradients(int step) { wave(dw, step, 1, 1e-3f); }
};

struct small {
  static zenflow::config config() { return make_config(0.25, 1); }
  std::vector<zenflow::bfloat16> w1 = std::vector<zenflow::bfloat16>(8 * 12), g1 = w1;
  std::vector<float> w2 = std::vector<float>(6 * 5), g2 = w2, b = std::vector<float>(7), gb = b;
  template <class Opt>
  void register_with(Opt& opt) {
    opt.add_matrix({w1.data(), g1.data(), 8, 12, zenflow::dtype::bf16, zenflow::dtype::bf16});
    opt.add_matrix({w2.data(), g2.data(), 6, 5, zenflow::dtype::f32, zenflow::dtype::f32,
                    zenflow::matrix_layout::row_major});
    opt.add_vector({b.data(), gb.data(), 7});
  }
  void gradients(int step) {
    wave(g1, step, 1, 0.1f);
    wave(g2, step, 3, 0.1f, true);
    wave(gb, step, 7, 0.1f);
  }
};

}  // namespace zf_ckpt_models
