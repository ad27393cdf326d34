// Two translation units that both include <zenflow/cuda.hpp> and both instantiate the whole
// CUDA optimizer must link into one program (kernels defined in headers must not be external
// non-template functions, or the link fails with multiple definitions). This file and
// cuda_two_units_b.cu are the test: linking is the check; running needs no GPU (nothing touches
// CUDA before initialize()).
#include <cstdio>
#include <vector>

#include <zenflow/cuda.hpp>

std::size_t zf_two_units_b(int argc);

std::size_t zf_two_units_a(int argc) {
  std::vector<float> w(64), g(64);
  zenflow::optimizer<zenflow::cuda_space> opt(zenflow::config{});
  opt.add_matrix({w.data(), g.data(), 8, 8});
  if (argc > 1000) {  // never taken: instantiates step(), and with it every kernel
    opt.initialize();
    opt.step(1.0f);
  }
  return opt.stats().device_bytes;
}

int main(int argc, char**) {
  const std::size_t bytes = zf_two_units_a(argc) + zf_two_units_b(argc);
  std::printf("two translation units linked; nothing allocated before initialize(): %zu bytes\n", bytes);
  return bytes == 0 ? 0 : 1;
}
