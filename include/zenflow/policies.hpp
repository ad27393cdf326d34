// The policy roles of zenflow::optimizer as C++20 concepts: each is a small type the optimizer
// only orders calls on.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "adamw.hpp"
#include "config.hpp"
#include "params.hpp"
#include "transport/offload_block.hpp"

namespace zenflow {

template <class T>
concept selector_policy = requires(const double* scores, std::uint32_t* out) {
  { T::k(0.1, std::size_t{}) } -> std::convertible_to<std::size_t>;
  { T::needs_scores } -> std::convertible_to<bool>;
  T::select(scores, std::size_t{}, std::size_t{}, out);
};

namespace detail {
struct noop_job {  // (a named type: nvcc's front end rejects lambdas inside requires-expressions)
  void operator()() const noexcept {}
};
}  // namespace detail

// A scheduler whose jobs' errors wait for the next wait (bounded_async) may also have
// `bool failed() const`, a poll: the data-parallel optimizer's ranks compare it before a step.
template <class T>
concept scheduler_policy = requires(T& s) {
  s.launch(detail::noop_job{});
  s.wait();
  s.launch_offload(detail::noop_job{});
  s.wait_offload();
  { s.wait_offload_quiet() } -> std::convertible_to<bool>;
  { T::concurrent } -> std::convertible_to<bool>;
  { s.busy() } -> std::convertible_to<bool>;
  { s.stall_seconds() } -> std::convertible_to<double>;
};

// Moves contiguous blocks between device and host memory and counts the bytes (column gathers
// and scatters are device-side work of the Space). A transport may also have
// reserve(space, chunk_bytes), called once by initialize() with the largest piece it will move.
template <class T>
concept transport_policy = requires(T& t, const void* src, void* dst) {
  t.to_host(dst, src, std::size_t{});
  t.to_device(dst, src, std::size_t{});
  { t.bytes_to_host() } -> std::convertible_to<std::uint64_t>;
  { t.bytes_to_device() } -> std::convertible_to<std::uint64_t>;
};

// Optional extras, detected at compile time (a CUDA build pins them with static_asserts, since a
// silently false detection would skip them):
// a Transport that needs the space and the largest piece before use (cuda_pinned)
template <class T, class Space>
concept reservable_transport = requires(T& t, Space& s, std::size_t n) { t.reserve(s, n); };
// a Transport that holds page-locked memory, reported by stats()
template <class T>
concept pinned_transport = requires(const T& t) {
  { t.pinned_bytes() } -> std::convertible_to<std::size_t>;
};
// a Transport whose host -> device staging the caller fills in place (fill(staging) writes the
// bytes there, then they go to dst): one host copy fewer than staging elsewhere and to_device
namespace detail {
// callables standing for the caller's in the concepts below (named types: nvcc does not take a
// lambda inside a requires-expression, and a concept that quietly fails would skip the path)
struct fill_probe {
  void operator()(void*) const noexcept {}
};
struct consume_probe {
  void operator()(std::size_t, const void*, std::size_t, std::size_t) const noexcept {}
};
}  // namespace detail
template <class T>
concept filling_transport = requires(T& t, void* dst, std::size_t n) { t.fill_to_device(dst, n, detail::fill_probe{}); };
// a Transport that streams a list of blocks in one go (the offload: no drain between matrices)
template <class T, class Space>
concept block_streaming_transport =
    requires(T& t, const typename Space::event& e, const offload_block* b, std::size_t n) {
      t.stream_blocks_to_host(e, b, n, detail::consume_probe{});
    };
// a Transport that can upload a host update's params ahead of the boundary that applies them
// (opt-in, uploads_ahead()): from the update lane, in pieces the caller fills in place, into a
// device area the optimizer keeps for them; the boundary then only waits on the device for
// those copies (await_ahead) and scatters. Bytes so moved are counted when applied
// (account_to_device): bytes_to_device counts what reached the params.
template <class T>
concept ahead_transport = requires(T& t, const T& ct, void* dst, std::size_t n) {
  { ct.uploads_ahead() } -> std::convertible_to<bool>;
  { ct.ahead_piece() } -> std::convertible_to<std::size_t>;
  t.ahead_begin();
  t.fill_ahead(dst, n, detail::fill_probe{});
  t.ahead_done();
  t.await_ahead();
  t.ahead_consumed();
  t.account_to_device(n);
};
// a GpuUpdater that selects the top-k columns of every matrix on the device
template <class T, class Space>
concept device_topk_updater =
    requires(T& u, Space& s, std::vector<std::vector<std::uint32_t>>& out) { u.select_topk(s, score_kind::l1, out); };

template <class T>
concept host_accumulator_policy = requires(T& h, const void* src, void* dst, const std::uint32_t* list,
                                           const adamw_hyper& hyper) {
  { h.add_matrix(std::size_t{}, std::size_t{}, dtype::f32, true) } -> std::convertible_to<std::size_t>;
  h.stage_params(std::size_t{}, list, std::size_t{}, dst);
  h.allocate(true);
  { h.bytes_allocated() } -> std::convertible_to<std::size_t>;
  h.accumulate(std::size_t{}, 0, dtype::f32, list, std::size_t{}, 1.0f);
  h.accumulate_from(src, std::size_t{}, 0, dtype::f32, list, std::size_t{}, 1.0f);
  h.update(std::size_t{}, 0, list, std::size_t{}, 1.0f, hyper);
  { h.stage_columns(std::size_t{}) } -> std::convertible_to<std::size_t>;
  { h.stage() } -> std::convertible_to<void*>;
};

// Where the gradient pass may also compact a matrix's gradient columns (the offload's
// compaction, fused into the pass on steps whose selection is already known): column c goes to
// column slot[c] of the compact [n][rows] block at dst (grad dtype, each column contiguous), or
// nowhere when slot[c] is no_slot. Both pointers are the space's device memory; a null slot
// table: nothing of this matrix.
struct compaction_target {
  void* dst = nullptr;
  const std::uint32_t* slot = nullptr;
};
inline constexpr std::uint32_t no_slot = 0xffffffffu;

// a GpuUpdater whose gradient pass can also do the offload's compaction (fused_adamw)
template <class T, class Space>
concept compacting_updater = requires(T& u, Space& s, const compaction_target* t) {
  u.gradient_pass(s, true);
  u.set_compaction(s, t);
};
// a Scheduler that tells whether a gradient offload is in flight (bounded_async)
template <class T>
concept offload_aware_scheduler = requires(const T& s) {
  { s.offload_busy() } -> std::convertible_to<bool>;
};

template <class T, class Space>
concept gpu_updater_policy = requires(T& u, Space& space, const matrix_param& m, const vector_param& v,
                                      const adamw_hyper& hyper) {
  { u.add_matrix(m, std::size_t{}) } -> std::convertible_to<std::size_t>;
  { u.add_vector(v) } -> std::convertible_to<std::size_t>;
  u.allocate();
  { u.bytes_allocated() } -> std::convertible_to<std::size_t>;
  u.gradient_pass(space);
  u.update(space, 1.0f, hyper);
  u.fetch_scores(space, score_kind::l1);
  { u.scores(std::size_t{}, score_kind::l1) } -> std::convertible_to<const double*>;
};

}  // namespace zenflow
