// Trains a least-squares fit with zenflow for a few dozen steps through the package Conan built;
// exits non-zero unless the loss falls to under a tenth.
#include <cmath>
#include <cstdio>
#include <vector>

#include <zenflow/zenflow.hpp>

int main() {
  const std::size_t rows = 16, cols = 32;
  std::vector<float> w(rows * cols, 0.0f), g(rows * cols), target(rows * cols);
  for (std::size_t i = 0; i < target.size(); ++i) target[i] = std::sin(0.1f * float(i));
  auto loss = [&] {
    double l = 0;
    for (std::size_t i = 0; i < w.size(); ++i) l += 0.5 * double(w[i] - target[i]) * double(w[i] - target[i]);
    return l;
  };
  zenflow::config cfg;
  cfg.adam.lr = 0.05f;
  cfg.adam.weight_decay = 0.0f;
  cfg.topk_ratio = 0.25;
  zenflow::optimizer<> opt(cfg);
  opt.add_matrix(zenflow::matrix(w.data(), g.data(), zenflow::rows{rows}, zenflow::cols{cols}));
  opt.initialize();
  const double before = loss();
  for (int t = 0; t < 200; ++t) {
    for (std::size_t i = 0; i < w.size(); ++i) g[i] = w[i] - target[i];
    opt.step();
  }
  opt.synchronize();
  const double after = loss();
  std::printf("zenflow %d.%d.%d from Conan: loss %.4f -> %.4f\n", ZENFLOW_VERSION_MAJOR, ZENFLOW_VERSION_MINOR,
              ZENFLOW_VERSION_PATCH, before, after);
  return after < 0.1 * before ? 0 : 1;
}
