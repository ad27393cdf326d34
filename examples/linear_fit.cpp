// The smallest real training run with zenflow: a two-layer model y = W2 relu(W1 x) + b fitted to
// a noisy teacher, trained the way a mixed-precision trainer would — bf16 weights and gradients
// on the "device", fp32 optimizer state — once with ZenFlow (host space) and once with plain
// AdamW (device_adam), from the same initialisation and the same batches.
//
// From a random start every weight has far to travel, and Adam moves a weight about lr per
// update whatever its gradient: ZenFlow's host-side columns, updated once per window, get there
// later. This run shows the integration and what moves where; the cost in loss it prints is the
// price of delayed updates on a from-scratch toy (--topk 1 gives AdamW exactly).
//
//   linear_fit [--steps N] [--threads T] [--seed S] [--topk R] [--update-interval U]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <oneapi/tbb/parallel_for.h>

#include <zenflow/zenflow.hpp>

using namespace zenflow;

namespace {

struct options {
  int steps = 300, threads = 2;
  unsigned seed = 1;
  double topk = 0.1;
  unsigned update_interval = 4;
};

// Layer shapes: [cols][rows] (column-contiguous: a column is one input feature).
constexpr std::size_t in = 256, hidden = 128, out = 32, batch = 256;

struct model {
  std::vector<bfloat16> w1, w2, b, gw1, gw2, gb;
  model() : w1(hidden * in), w2(out * hidden), b(out), gw1(w1.size()), gw2(w2.size()), gb(b.size()) {}
};

struct data {
  std::vector<float> x, y;  // [batch][in], [batch][out]
};

// Forward and backward of one batch: loss = mean over the batch of ||y_hat - y||^2 / 2.
double forward_backward(model& m, const data& d, tbb::task_arena& arena) {
  std::vector<float> h(batch * hidden), err(batch * out);
  double loss = 0;
  arena.execute([&] {
    tbb::parallel_for(std::size_t(0), batch, [&](std::size_t s) {
      for (std::size_t r = 0; r < hidden; ++r) {
        float a = 0;
        for (std::size_t c = 0; c < in; ++c) a += to_float(m.w1[c * hidden + r]) * d.x[s * in + c];
        h[s * hidden + r] = a > 0 ? a : 0;
      }
      for (std::size_t r = 0; r < out; ++r) {
        float a = to_float(m.b[r]);
        for (std::size_t c = 0; c < hidden; ++c) a += to_float(m.w2[c * out + r]) * h[s * hidden + c];
        err[s * out + r] = a - d.y[s * out + r];
      }
    });
    tbb::parallel_for(std::size_t(0), hidden, [&](std::size_t c) {  // dW2[c][r] = mean_s err[s][r] h[s][c]
      for (std::size_t r = 0; r < out; ++r) {
        float g = 0;
        for (std::size_t s = 0; s < batch; ++s) g += err[s * out + r] * h[s * hidden + c];
        m.gw2[c * out + r] = to_bfloat16(g / batch);
      }
    });
    for (std::size_t r = 0; r < out; ++r) {
      float g = 0;
      for (std::size_t s = 0; s < batch; ++s) g += err[s * out + r];
      m.gb[r] = to_bfloat16(g / batch);
    }
    std::vector<float> back(batch * hidden);  // d loss / d (W1 x), through the relu
    tbb::parallel_for(std::size_t(0), batch, [&](std::size_t s) {
      for (std::size_t r = 0; r < hidden; ++r) {
        float a = 0;
        if (h[s * hidden + r] > 0)
          for (std::size_t o = 0; o < out; ++o) a += err[s * out + o] * to_float(m.w2[r * out + o]);
        back[s * hidden + r] = a;
      }
    });
    tbb::parallel_for(std::size_t(0), in, [&](std::size_t c) {  // dW1[c][r] = mean_s back[s][r] x[s][c]
      std::vector<float> acc(hidden, 0.0f);
      for (std::size_t s = 0; s < batch; ++s) {
        const float xc = d.x[s * in + c];
        for (std::size_t r = 0; r < hidden; ++r) acc[r] += back[s * hidden + r] * xc;
      }
      for (std::size_t r = 0; r < hidden; ++r) m.gw1[c * hidden + r] = to_bfloat16(acc[r] / batch);
    });
  });
  for (float e : err) loss += 0.5 * double(e) * e;
  return loss / double(batch);
}

template <class Opt>
double train(const char* name, Opt& opt, model m, const std::vector<data>& batches, const data& held_out,
             const options& o, tbb::task_arena& arena) {
  // The integration: register raw buffers once, then one step() after each backward pass.
  using zenflow::rows, zenflow::cols;
  opt.add_matrix(zenflow::matrix(m.w1.data(), m.gw1.data(), rows{hidden}, cols{in}).dtypes(dtype::bf16, dtype::bf16));
  opt.add_matrix(zenflow::matrix(m.w2.data(), m.gw2.data(), rows{out}, cols{hidden}).dtypes(dtype::bf16, dtype::bf16));
  opt.add_vector(zenflow::vector(m.b.data(), m.gb.data(), out).dtypes(dtype::bf16, dtype::bf16));
  opt.initialize();
  double loss = 0;
  for (int step = 1; step <= o.steps; ++step) {
    loss = forward_backward(m, batches[std::size_t(step) % batches.size()], arena);
    opt.step();
    if (step == 1 || step % 100 == 0) std::printf("  %-11s step %4d  train loss %.5f\n", name, step, loss);
  }
  opt.synchronize();
  model probe = m;
  return forward_backward(probe, held_out, arena);
}

}  // namespace

int main(int argc, char** argv) try {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> double {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      char* end = nullptr;
      const double v = std::strtod(argv[++i], &end);
      if (end == argv[i] || *end || !(v >= 0)) throw std::invalid_argument(a + ": not a non-negative number: " + argv[i]);
      return v;
    };
    // An integer in [lo, hi], checked before it is converted (a double out of an int's range
    // converts to nothing defined; 2.9 steps is no count either).
    auto integer = [&](double lo, double hi) -> long {
      const double v = value();
      if (!(v >= lo && v <= hi && v == std::floor(v)))
        throw std::invalid_argument(a + " expects an integer in [" + std::to_string(long(lo)) + ", " +
                                    std::to_string(long(hi)) + "], got " + argv[i]);
      return long(v);
    };
    if (a == "--steps") o.steps = int(integer(1, 1e9));
    else if (a == "--threads") o.threads = int(integer(1, 65536));  // (host_threads' bound)
    else if (a == "--seed") o.seed = unsigned(integer(0, 4294967295.0));
    else if (a == "--topk") o.topk = value();
    else if (a == "--update-interval") o.update_interval = unsigned(integer(1, 1e6));  // (16 U, the select interval, fits)
    else if (a == "--help" || a == "-h") {
      std::puts("linear_fit [--steps N] [--threads T] [--seed S] [--topk R] [--update-interval U]");
      return 0;
    } else {
      throw std::invalid_argument("unknown argument " + a + " (try --help)");
    }
  }
  if (o.steps < 1 || o.threads < 1) throw std::invalid_argument("--steps and --threads must be >= 1");

  std::mt19937 gen(o.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> teacher(out * in);
  for (auto& t : teacher) t = normal(gen) / std::sqrt(float(in));
  auto make = [&] {
    data d{std::vector<float>(batch * in), std::vector<float>(batch * out)};
    for (auto& v : d.x) v = normal(gen);
    for (std::size_t s = 0; s < batch; ++s)
      for (std::size_t r = 0; r < out; ++r) {
        float y = 0.05f * normal(gen);
        for (std::size_t c = 0; c < in; ++c) y += teacher[r * in + c] * d.x[s * in + c];
        d.y[s * out + r] = y;
      }
    return d;
  };
  std::vector<data> batches;
  for (int i = 0; i < 16; ++i) batches.push_back(make());
  const data held_out = make();
  model init;
  for (auto& w : init.w1) w = to_bfloat16(normal(gen) * std::sqrt(2.0f / in));
  for (auto& w : init.w2) w = to_bfloat16(normal(gen) / std::sqrt(float(hidden)));

  tbb::task_arena arena(o.threads);
  config cfg;
  cfg.adam.lr = 2e-3f;
  cfg.topk_ratio = o.topk;
  cfg.update_interval = interval::every(o.update_interval);
  cfg.select_interval = interval::every(16 * o.update_interval);
  cfg.host_threads = unsigned(o.threads);

  cfg.validate();  // (a bad --topk is refused before anything is printed or trained)
  std::printf("zenflow: topk_ratio %.2f, update_interval %u, overlap on\n", o.topk, o.update_interval);
  optimizer<> zf(cfg);
  const double zf_loss = train("zenflow", zf, init, batches, held_out, o, arena);
  device_adam<> adam(cfg);
  const double adam_loss = train("adamw", adam, init, batches, held_out, o, arena);
  const auto st = zf.stats();
  const double model_bytes = double((init.w1.size() + init.w2.size()) * 2);
  std::printf("\nheld-out loss: zenflow %.5f, adamw %.5f (relative difference %+.2f%%)\n", zf_loss, adam_loss,
              100.0 * (zf_loss - adam_loss) / adam_loss);
  std::printf("zenflow moved %.3fx the matrices' size per step (down %.3f, up %.3f); %llu host updates, "
              "%.3f s host update time, %.3f s stall\n",
              double(st.bytes_to_host + st.bytes_to_device) / o.steps / model_bytes,
              double(st.bytes_to_host) / o.steps / model_bytes, double(st.bytes_to_device) / o.steps / model_bytes,
              (unsigned long long)st.host_updates, st.host_update_seconds, st.stall_seconds);
  std::printf("host kernels: %s tier\n", std::string(host::name_of(host::best_isa())).c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "linear_fit: %s\n", e.what());
  return 2;
}
