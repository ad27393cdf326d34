// Uses the installed package: runtime-dispatched AdamW, checked against a closed form.
#include <cmath>
#include <cstdio>
#include <vector>

#include <zenflow/zenflow.hpp>

#if !defined(ZENFLOW_HOST_DISPATCH)
#  error "the CMake package should give runtime dispatch"
#endif

int main() {
  using namespace zenflow;
  std::vector<float> p(1000, 1.0f), m(1000, 0.0f), v(1000, 0.0f), g(1000, 0.25f);
  std::uint32_t count = 0;
  host::adamw_job job;
  job.param = p.data(); job.exp_avg = m.data(); job.exp_avg_sq = v.data(); job.grad = g.data();
  job.rows = p.size();
  job.hyper.lr = 0.01f; job.hyper.weight_decay = 0.0f; job.hyper.eps = 1e-12f;
  tbb::task_arena arena(2);
  host::adamw(arena, job, 1, &count);
  // First bias-corrected Adam step moves every parameter by lr against the gradient's sign.
  for (float x : p)
    if (std::fabs(x - 0.99f) > 1e-6f) { std::printf("wrong value %.9g\n", x); return 1; }
  std::printf("consumer ok: tier %s, count %u\n", std::string(host::name_of(host::best_isa())).c_str(), count);
  return count == 1 ? 0 : 1;
}
