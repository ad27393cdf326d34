// A small trainer on zenflow from vcpkg: fits y = W x for a fixed random W with ZenFlow and
// reports the loss; exits non-zero unless it fell tenfold.
#include <cstdio>
#include <random>
#include <vector>

#include <zenflow/zenflow.hpp>

int main() {
  const std::size_t out = 8, in = 64, batch = 32;
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> truth(out * in), w(out * in, 0.0f), dw(out * in);
  for (auto& x : truth) x = 0.2f * normal(gen);
  zenflow::config cfg;
  cfg.adam.lr = 0.02f;
  zenflow::optimizer<> opt(cfg);
  // row-major [out][in], as PyTorch stores a linear layer: a column is an input feature
  opt.add_matrix(zenflow::matrix(w.data(), dw.data(), zenflow::rows{out}, zenflow::cols{in}).row_major());
  opt.initialize();
  double first = 0, last = 0;
  std::vector<float> x(in), err(out);
  for (int step = 0; step < 300; ++step) {
    std::fill(dw.begin(), dw.end(), 0.0f);
    double loss = 0;
    for (std::size_t b = 0; b < batch; ++b) {
      for (auto& v : x) v = normal(gen);
      for (std::size_t o = 0; o < out; ++o) {
        float y = 0;
        for (std::size_t i = 0; i < in; ++i) y += (w[o * in + i] - truth[o * in + i]) * x[i];
        err[o] = y;
        loss += 0.5 * double(y) * double(y) / double(batch);
      }
      for (std::size_t o = 0; o < out; ++o)
        for (std::size_t i = 0; i < in; ++i) dw[o * in + i] += err[o] * x[i] / float(batch);
    }
    if (step == 0) first = loss;
    last = loss;
    opt.step();
  }
  opt.synchronize();
  std::printf("zenflow from vcpkg: loss %.4f -> %.4f\n", first, last);
  return last < 0.1 * first ? 0 : 1;
}
