// The README's usage example, compiled and run (tests/readme_in_sync.cmake checks that the
// README shows exactly the code between the markers).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

// example-begin
#include <zenflow/zenflow.hpp>

struct layer {  // the trainer's own buffers; w and dw are [out][in], as in PyTorch and llm.c
  std::vector<zenflow::bfloat16> w, dw, b, db;
  std::size_t in, out;
};

void train(std::vector<layer>& layers, int steps, void (*forward_backward)(std::vector<layer>&)) {
  using zenflow::dtype;
  zenflow::config cfg;  // topk_ratio 0.1, update_interval 4, overlap on; AdamW weight_decay 0.01
  cfg.adam.lr = 1e-4f;
  zenflow::optimizer<> opt(cfg);  // the host space: the "device" runs on host threads
  for (layer& l : layers) {
    // rows = output features, cols = input features: a column (what ZenFlow selects) is an input
    opt.add_matrix(zenflow::matrix(l.w.data(), l.dw.data(), zenflow::rows{l.out}, zenflow::cols{l.in})
                       .row_major()
                       .dtypes(dtype::bf16, dtype::bf16));
    opt.add_vector(zenflow::vector(l.b.data(), l.db.data(), l.out).dtypes(dtype::bf16, dtype::bf16));
  }
  opt.initialize();  // fp32 masters and Adam moments: selected columns on the device, the rest on the host
  for (int s = 0; s < steps; ++s) {
    forward_backward(layers);  // the trainer writes dw and db
    opt.step();                // top-k columns now; the rest accumulate, updated in the background
  }
  opt.synchronize();  // land the last host update (before saving the weights, say)
}
// example-end

namespace {
void constant_gradients(std::vector<layer>& layers) {
  for (layer& l : layers) {
    for (auto& g : l.dw) g = zenflow::to_bfloat16(0.5f);
    for (auto& g : l.db) g = zenflow::to_bfloat16(0.5f);
  }
}
}  // namespace

TEST_CASE("the README example trains: a constant gradient moves a bias lr per step") {
  std::vector<layer> layers(2);
  for (layer& l : layers) {
    l.in = 64;
    l.out = 16;
    l.w.assign(l.in * l.out, zenflow::to_bfloat16(0.25f));
    l.dw.resize(l.w.size());
    l.b.assign(l.out, zenflow::to_bfloat16(0.0f));
    l.db.resize(l.out);
  }
  train(layers, 10, constant_gradients);
  // Vectors are updated on the device every step: with a constant gradient, Adam's bias-corrected
  // step is lr (times 1 - tiny eps terms), and the decay of a zero-started bias is second order.
  for (layer& l : layers)
    for (auto b : l.b) CHECK(std::fabs(zenflow::to_float(b) + 10 * 1e-4) < 1e-5);
}
