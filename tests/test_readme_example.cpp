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

TEST_CASE("the README example trains: a constant gradient moves a bias lr per step, and each column of w by lr per "
          "update it had") {
  std::vector<layer> layers(2);
  for (layer& l : layers) {
    l.in = 64;
    l.out = 16;
    // (zero: where bf16 resolves a move of lr = 1e-4; at 0.25 its spacing is 2e-3)
    l.w.assign(l.in * l.out, zenflow::to_bfloat16(0.0f));
    l.dw.resize(l.w.size());
    l.b.assign(l.out, zenflow::to_bfloat16(0.0f));
    l.db.resize(l.out);
  }
  train(layers, 10, constant_gradients);
  // With a constant gradient every Adam step moves a parameter by lr: m-hat = g and sqrt(v-hat) =
  // |g|, so the step is lr * g / (|g| + eps), 1 - 2e-8 of lr; the decay of a zero-started value
  // is second order (lr * wd * |p| < 1e-9 a step); the fp32 master's own rounding over 10 steps
  // is ~1e-10. What remains is the bf16 rounding of the visible value: half its spacing, 2^-18
  // (3.8e-6) near 1e-3 and 2^-21 (4.8e-7) near 2e-4. Tolerance 1e-5 > 3.8e-6 + those terms, and
  // an update too many or too few moves the value by lr = 1e-4.
  // Vectors are updated on the device every step: 10 steps.
  for (layer& l : layers)
    for (auto b : l.b) CHECK(std::fabs(zenflow::to_float(b) + 10 * 1e-4) < 1e-5);
  // Matrices: every column scores the same, so the top k = floor(0.1 * 64) = 6 are columns 0..5
  // (ties to the lower index), updated on the device at each of the 10 steps. The other 58 take
  // one host AdamW step per window of update_interval = 4 steps (the window's mean gradient is
  // g again): windows 1-4 and 5-8; synchronize() lands the host update of window 5-8 (one window
  // behind, with overlap), and the open window 9-10 is not applied.
  for (layer& l : layers)
    for (std::size_t o = 0; o < l.out; ++o)
      for (std::size_t c = 0; c < l.in; ++c) {
        CAPTURE(o);
        CAPTURE(c);
        const double moves = c < 6 ? 10 : 2;
        CHECK(std::fabs(zenflow::to_float(l.w[o * l.in + c]) + moves * 1e-4) < 1e-5);
      }
}
