// The second translation unit of the two-unit link test (see cuda_two_units_a.cu).
#include <vector>

#include <zenflow/cuda.hpp>

std::size_t zf_two_units_b(int argc) {
  std::vector<float> w(64), g(64);
  zenflow::config cfg;
  cfg.overlap_step = true;
  zenflow::optimizer<zenflow::cuda_space> opt(cfg);
  opt.add_matrix({w.data(), g.data(), 8, 8, zenflow::dtype::f32, zenflow::dtype::f32, zenflow::matrix_layout::row_major});
  zenflow::zero_offload<zenflow::cuda_space> zo(zenflow::config{});
  if (argc > 1000) {  // never taken: instantiates step(), and with it every kernel
    opt.initialize();
    opt.step(1.0f);
    zo.initialize();
    zo.step(1.0f);
  }
  return opt.stats().device_bytes + zo.stats().device_bytes;
}
