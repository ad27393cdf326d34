// What the data-parallel tests share (test_mpi over MPI on the host space, test_nccl over NCCL
// on the CUDA space): the model's shapes and the gradients every rank writes, with the reduced
// gradient written out here, independently of the communicators, as the reference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include <zenflow/config.hpp>
#include <zenflow/numeric.hpp>
#include <zenflow/params.hpp>

namespace zf_dp_test {

// Three tensors with three grad dtypes: an fp32 R0 x C0 matrix with bf16 grads, a bf16 row-major
// R1 x C1 matrix with fp32 grads, an fp32 vector of N2 with fp16 grads.
// R0 is odd: 30 bytes a bf16 column, so the pieces of selected columns that the ranks gather
// come in sizes that are not multiples of 4 (the next matrix's fp32 piece must still start on
// its grid on a GPU).
inline constexpr std::size_t R0 = 15, C0 = 40, R1 = 8, C1 = 24, N2 = 20;

// Rank r's local gradient at step s, element i of tensor k (a hash mapped to [-1, 1), with a
// per-column scale so that the top-k selection has something to find).
inline float local(int r, int s, int k, std::size_t i) {
  std::uint64_t h = (std::uint64_t(r) * 1000003u + std::uint64_t(s)) * 7919u + std::uint64_t(k) * 104729u + i;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  const float u = float(h >> 40) / float(1u << 24) * 2.0f - 1.0f;
  return u * (1.0f + float((i / 8 + std::size_t(s)) % 5));
}

// Each grad buffer as the trainer of rank r writes it at step s (NaN where asked), or (ranks >
// 0) the reduced gradient of `ranks` ranks: every rank's value rounded to the grad dtype,
// widened, summed in rank order in fp32, divided by the number of ranks for the mean, rounded to
// the dtype.
struct gradient_source {
  int nan_rank = -1, nan_step = -1;
  float value(int r, int s, int k, std::size_t i) const {
    if (r == nan_rank && s == nan_step && k == 0 && i == 5) return std::numeric_limits<float>::quiet_NaN();
    return local(r, s, k, i);
  }
  template <class T>
  static float as_written(float x) {
    if constexpr (std::is_same_v<T, float>) return x;
    else return zenflow::to_float(T(x));
  }
  template <class T>
  void fill(std::vector<T>& g, int k, int s, int rank, int ranks, zenflow::reduce_op op) const {
    for (std::size_t i = 0; i < g.size(); ++i) {
      float x = 0;
      if (ranks == 0) {
        x = value(rank, s, k, i);
      } else {
        x = as_written<T>(value(0, s, k, i));
        for (int r = 1; r < ranks; ++r) x += as_written<T>(value(r, s, k, i));
        if (op == zenflow::reduce_op::mean) x /= float(ranks);
      }
      if constexpr (std::is_same_v<T, float>) g[i] = x;
      else g[i] = T(x);
    }
  }
  // the model's three grad buffers (m.g0, m.g1, m.g2)
  template <class Model>
  void fill_all(Model& m, int s, int rank, int ranks, zenflow::reduce_op op) const {
    fill(m.g0, 0, s, rank, ranks, op);
    fill(m.g1, 1, s, rank, ranks, op);
    fill(m.g2, 2, s, rank, ranks, op);
  }
};

// A run's state as bytes, to compare bit for bit: the three params (host copies: w0, w1, b2 in
// the order above), then each matrix's master, moments and column counts read through the
// optimizer (collectives with a multi-process communicator: every rank calls this). The caller
// has synchronized the optimizer and brought device params to the host.
template <class Opt, class W0, class W1, class B2>
std::vector<unsigned char> state_bytes(Opt& opt, const W0& w0, const W1& w1, const B2& b2) {
  std::vector<unsigned char> out;
  auto add = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    out.insert(out.end(), b, b + n);
  };
  add(w0.data(), sizeof(w0[0]) * w0.size());
  add(w1.data(), sizeof(w1[0]) * w1.size());
  add(b2.data(), sizeof(b2[0]) * b2.size());
  for (std::size_t k = 0; k < 2; ++k) {
    std::vector<float> x(k == 0 ? R0 * C0 : R1 * C1);
    for (int what = 0; what < 3; ++what) {
      if (what == 0) opt.copy_master(zenflow::matrix_id{k}, x.data());
      if (what == 1) opt.copy_exp_avg(zenflow::matrix_id{k}, x.data());
      if (what == 2) opt.copy_exp_avg_sq(zenflow::matrix_id{k}, x.data());
      add(x.data(), 4 * x.size());
    }
    const auto counts = opt.column_counts(zenflow::matrix_id{k});
    add(counts.data(), 4 * counts.size());
  }
  return out;
}

}  // namespace zf_dp_test
