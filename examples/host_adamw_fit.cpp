// The smallest real use of zenflow's host kernels: fit a linear layer y = W x to a noisy teacher
// with AdamW, the way a mixed-precision trainer would — fp32 master weights and moments on the
// host, bf16 gradients in, a bf16 copy of the weights out (what the forward pass reads).
//
//   host_adamw_fit [--steps N] [--threads T] [--seed S]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <oneapi/tbb/parallel_for.h>

#include <zenflow/zenflow.hpp>

int main(int argc, char** argv) try {
  int steps = 300, threads = 2;
  unsigned seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--steps" || a == "--threads" || a == "--seed") && i + 1 < argc) {
      const int v = std::atoi(argv[++i]);
      if (v <= 0) throw std::invalid_argument(a + " must be a positive integer");
      if (a == "--steps") steps = v;
      else if (a == "--threads") threads = v;
      else seed = unsigned(v);
    } else {
      std::printf("usage: host_adamw_fit [--steps N] [--threads T] [--seed S]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  using namespace zenflow;
  const std::size_t rows = 64, cols = 512, batch = 256;  // W is [cols][rows]: column = input feature

  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> teacher(rows * cols), x(batch * cols), y(batch * rows);
  for (auto& w : teacher) w = normal(gen) / std::sqrt(float(cols));
  for (auto& v : x) v = normal(gen);
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t r = 0; r < rows; ++r) {
      float s = 0.05f * normal(gen);  // label noise
      for (std::size_t c = 0; c < cols; ++c) s += teacher[c * rows + r] * x[b * cols + c];
      y[b * rows + r] = s;
    }

  // Optimizer state (host), the bf16 weights the "device" uses, and a bf16 gradient buffer.
  host::host_array<float> master(rows * cols), m(rows * cols), v(rows * cols);
  host::host_array<bfloat16> weights(rows * cols), grad(rows * cols);
  std::vector<std::uint32_t> counts(cols, 0);  // one Adam count per column
  tbb::task_arena arena(threads);

  host::adamw_job job;
  job.param = master.data();
  job.exp_avg = m.data();
  job.exp_avg_sq = v.data();
  job.grad = grad.data();
  job.grad_type = dtype::bf16;
  job.param_copy = weights.data();
  job.copy_type = dtype::bf16;
  job.rows = rows;
  job.hyper.lr = 1e-2f;
  job.hyper.weight_decay = 0.0f;

  std::vector<float> err(batch * rows);
  for (int step = 1; step <= steps; ++step) {
    // forward with the bf16 weights, loss = mean over the batch of ||W x - y||^2 / 2
    double loss = 0;
    arena.execute([&] {
      tbb::parallel_for(std::size_t(0), batch, [&](std::size_t b) {
        for (std::size_t r = 0; r < rows; ++r) {
          float s = 0;
          for (std::size_t c = 0; c < cols; ++c) s += to_float(weights[c * rows + r]) * x[b * cols + c];
          err[b * rows + r] = s - y[b * rows + r];
        }
      });
      // backward: dW[c][r] = mean_b err[b][r] * x[b][c], stored as bf16 like a device gradient
      tbb::parallel_for(std::size_t(0), cols, [&](std::size_t c) {
        for (std::size_t r = 0; r < rows; ++r) {
          float s = 0;
          for (std::size_t b = 0; b < batch; ++b) s += err[b * rows + r] * x[b * cols + c];
          grad[c * rows + r] = to_bfloat16(s / float(batch));
        }
      });
    });
    for (float e : err) loss += 0.5 * double(e) * e;
    loss /= double(batch);
    host::adamw(arena, job, cols, counts.data());
    if (step == 1 || step % 50 == 0 || step == steps)
      std::printf("step %4d  loss %.5f\n", step, loss);
  }
  std::printf("host kernels: %s tier, %d threads, Adam count per column %u\n",
              std::string(host::name_of(host::best_isa())).c_str(), threads, counts[0]);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "host_adamw_fit: %s\n", e.what());
  return 2;
}
