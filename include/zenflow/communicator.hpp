// The Communicator policy: how the ranks of a data-parallel job agree on one gradient before a
// step, and share what each rank's slice of the host state produced. single_process (the
// default) is no communication at all; mpi_communicator (<zenflow/mpi.hpp>) works across MPI
// ranks on the host space, nccl_communicator (<zenflow/nccl.hpp>) across NCCL ranks on the
// CUDA space.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "config.hpp"  // reduce_op

namespace zenflow {

// reduce(data, n, op) replaces data[0, n) on every rank by the reduction of every rank's data[0, n):
// element by element, the sum in rank order ((x_0 + x_1) + x_2) + ... in fp32, divided by the
// number of ranks for the mean. Every rank gets the same bits, and the same inputs give the same
// bits run after run, whatever the transport underneath does.
// all_gather(data, bytes): rank r's block of bytes[r] bytes starts at bytes[0] + ... + bytes[r-1]
// in data; afterwards every rank holds every rank's block there (a copy: no arithmetic).
// all_agree(ok): true on every rank when every rank passed true.
// Optional, reduce_scatter(data, counts, op): data holds one segment per rank, rank r's of
// counts[r] elements, one after the other; afterwards this rank's own segment holds the
// reduction of every rank's copy of it (reduce's order and bits), the others are unspecified.
// With it, an optimizer (host space or cuda_space) reduce-scatters the matrices' gradients by
// column blocks (each rank receives its own block's only) instead of all-reducing them.
// Optional, typed: reduce(data, t, n, op) and reduce_scatter(data, t, counts, op) take elements
// of dtype t (f32, bf16 or f16) in host memory and leave the reduction — the same fp32
// arithmetic over the widened values (widening is exact) — rounded to t (nearest even), where
// the fp32 members leave it in fp32 for the caller to round. The same bits, with the gradients
// moved in their own dtype: 2 bytes an element instead of 4 for 16-bit ones. An optimizer over
// the host space uses them when they are there (mpi_communicator has them).
// Optional, reserve(scatter, reduce[, scatter_bytes, reduce_bytes]): makes every later
// reduce_scatter of at most `scatter` elements in all, and reduce of at most `reduce`, run
// without allocating (the optimizer calls it once, from initialize(), with its largest rounds of
// each and, where the communicator takes the element sizes and has the typed members, the
// widest gradient element each kind of round moves: a growth refused inside a step would leave
// some gradients reduced in place and others not).
// Optional, use_arena(tbb::task_arena*) noexcept: an optimizer over the host space lends its
// space's arena (the device-side threads, which the step does not use during its reduction;
// with overlap_step a host update may be running on the accumulator's own threads meanwhile) for
// each step's reduction, and takes it back (nullptr) after, whatever it was before: a
// communicator that does arithmetic may run it there (mpi_communicator sums on it: the same bits
// on any number of threads). Not a collective.
// The others are collectives: every rank calls them, in the same order. A multi-process communicator
// names the memory space its data lives in (`using space = ...`): reduce and all_gather take
// that space's device memory (host memory for the host space, GPU memory for the CUDA space),
// and an optimizer over another space does not compile with it.
template <class T>
concept communicator_policy = requires(T& c, const T& cc, float* data, void* bytes, const std::size_t* counts) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  c.reduce(data, std::size_t{}, reduce_op::mean);
  c.all_gather(bytes, counts);
  { c.all_agree(true) } -> std::convertible_to<bool>;
  { cc.bytes_sent() } -> std::convertible_to<std::uint64_t>;
};

// One process: nothing to reduce, zero cost (step() does not even look at the gradients).
struct single_process {
  static constexpr bool single = true;
  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }
  void reduce(float*, std::size_t, reduce_op) noexcept {}
  void all_gather(void*, const std::size_t*) noexcept {}
  bool all_agree(bool ok) noexcept { return ok; }
  std::uint64_t bytes_sent() const noexcept { return 0; }
};

namespace detail {

template <class C>
constexpr bool single_process_v = requires { requires C::single; };

// The reduction's arithmetic, for every communicator (the tests write their own reference): the
// pieces[r][i] of ranks r = 0..R-1 summed in rank order, then the mean's division.
inline void reduce_in_rank_order(const float* pieces, std::size_t count, int ranks, reduce_op op, float* out) {
  const float div = float(ranks);
  for (std::size_t i = 0; i < count; ++i) {
    float s = pieces[i];
    for (int r = 1; r < ranks; ++r) s += pieces[std::size_t(r) * count + i];
    out[i] = op == reduce_op::mean ? s / div : s;
  }
}

// Rank r's shard of n elements split among `ranks`: [shard_begin(r), shard_begin(r + 1)).
// (floor(n r / R) without overflow: n = q R + m gives q r + floor(m r / R).)
constexpr std::size_t shard_begin(std::size_t n, int ranks, int r) noexcept {
  const std::size_t R = std::size_t(ranks), q = n / R, m = n % R;
  return q * std::size_t(r) + m * std::size_t(r) / R;
}

}  // namespace detail
}  // namespace zenflow
