// The README's usage example, compiled and run (tests/readme_in_sync.cmake checks that the
// README shows exactly the code between the markers).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

// example-begin
#include <zenflow/zenflow.hpp>

void adamw_on_host(std::vector<float>& params, std::vector<float>& exp_avg,
                   std::vector<float>& exp_avg_sq, const std::vector<zenflow::bfloat16>& grads,
                   std::vector<zenflow::bfloat16>& params_bf16, std::uint32_t& count) {
  zenflow::host::adamw_job job;
  job.param = params.data();            // fp32 master, updated in place
  job.exp_avg = exp_avg.data();         // Adam moments, in place
  job.exp_avg_sq = exp_avg_sq.data();
  job.grad = grads.data();              // gradient as the device produced it
  job.grad_type = zenflow::dtype::bf16;
  job.param_copy = params_bf16.data();  // the new params, rounded, for the device
  job.copy_type = zenflow::dtype::bf16;
  job.rows = params.size();             // one flat block with one Adam count
  job.hyper = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};

  static tbb::task_arena arena(2);      // the threads the update may use
  zenflow::host::adamw(arena, job, /*cols=*/1, &count);  // best ISA tier of this CPU
}
// example-end

TEST_CASE("the README example runs and updates like AdamW's first step") {
  const std::size_t n = 100000;
  std::vector<float> p(n, 1.0f), m(n, 0.0f), v(n, 0.0f);
  std::vector<zenflow::bfloat16> g(n, zenflow::to_bfloat16(-0.5f)), out(n);
  std::uint32_t count = 0;
  adamw_on_host(p, m, v, g, out, count);
  CHECK(count == 1);
  // First step: decay by 1 - lr*wd, then move lr along -sign(g) (bias-corrected m/sqrt(v) = -1).
  const double expect = 1.0 * (1 - 1e-3 * 0.01) + 1e-3;
  for (std::size_t i = 0; i < n; i += 997) {
    CHECK(std::fabs(p[i] - expect) < 1e-7);
    CHECK(out[i].bits == zenflow::to_bfloat16(p[i]).bits);
  }
}
