// zenflow::optimizer: ZenFlow (README.md, "The optimizer") written once against an execution space and five
// policies. The optimizer owns the schedule — warm-up, windows, selections, boundaries, the
// Zen-auto rule — and only orders calls on its policies, which own all state.
//
//   zenflow::optimizer<> opt(cfg);              // host space, the paper's system
//   const zenflow::matrix_id wq =
//       opt.add_matrix(zenflow::matrix(w, dw, zenflow::rows{out}, zenflow::cols{in}).row_major().dtypes(bf16, bf16));
//   opt.add_vector(zenflow::vector(b, db, n).dtypes(bf16, bf16));
//   opt.initialize();
//   for (...) { /* forward, backward into dw, db */ opt.step(loss_scale); }
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "checkpoint.hpp"
#include "optimizer_checkpoint.hpp"
#include "config.hpp"
#include "detail/array_pool.hpp"
#include "detail/format.hpp"
#include "communicator.hpp"
#include "detail/registration.hpp"
#include "detail/swap_plan.hpp"
#include "device_update/fused_adamw.hpp"
#include "host/accumulator.hpp"
#include "params.hpp"
#include "policies.hpp"
#include "schedule/bounded_async.hpp"
#include "schedule/synchronous.hpp"
#include "selector/column_topk.hpp"
#include "space/host_space.hpp"
#include "transport/host_copy.hpp"

namespace zenflow {

// What a call throws when the optimizer refuses work because an earlier call failed midway (a
// step, a transfer, a background job, a load's commit; data parallel: on any rank): its state may
// be inconsistent, and only a load that succeeds makes it usable again (optimizer::usable()).
struct unusable_error : std::logic_error {
  using std::logic_error::logic_error;
};

struct optimizer_stats {
  std::uint64_t steps = 0;          // calls of step()
  std::uint64_t skipped_steps = 0;  // of which skipped: a non-finite gradient, or one whose norm exceeds 2^63 once unscaled
  std::uint64_t selections = 0;
  std::uint64_t host_updates = 0;   // host AdamW passes that update a column (warm-up included), counted at their start
  std::uint64_t bytes_to_host = 0;  // device -> host, applied steps only
  std::uint64_t bytes_to_device = 0;
  // Of bytes_to_device, those a host update's job uploaded ahead of the boundary that applied them
  // (a transport's upload_ahead(true)); carried by checkpoints, as the other counters.
  std::uint64_t bytes_uploaded_ahead = 0;
  double stall_seconds = 0;         // time step() waited for host work (a late host update, the last
                                    // step's offload, warm-up's host AdamW, which runs inline)
  double host_update_seconds = 0;   // time spent in host updates (foreground or background; with uploads
                                    // ahead, their rounding and copies too)
  // Memory the optimizer holds, by kind (element counts times sizes; 0 before initialize()).
  std::uint64_t host_pageable_bytes = 0;
  std::uint64_t host_pinned_bytes = 0;  // page-locked: the transport's staging, the updater's small
                                        // tables (none on the host space)
  std::uint64_t device_bytes = 0;       // on the device (host memory too, on the host space)
  // Host memory of the per-tensor records: registrations, shapes and groups, column lists, the
  // state descriptors (registrations count from the first one; the rest from initialize()); on
  // the CUDA space also the per-column scores a host-side selection downloads (8 bytes a column
  // and kind). Small next to the state unless a model has very many small tensors.
  std::uint64_t host_bookkeeping_bytes = 0;
  // Data parallel (a multi-process Communicator): the bytes this rank sent to agree on the
  // gradient (its pieces of the reduction; with the gradients reduce-scattered also its blocks'
  // column statistics and its selected columns' reduced gradients), and to share what its slice
  // of the host state produced with the other ranks (the params its host updates changed, the
  // state of columns joining the selection).
  std::uint64_t bytes_reduced = 0;
  std::uint64_t bytes_gathered = 0;
  // Data parallel: seconds step() spent reducing gradients, as the calling thread waited for it
  // (widening, the collective, the sums on the space's threads, rounding back; the gathers of column statistics and selected columns; on the
  // CUDA space the enqueueing, the device runs it in order); carried by checkpoints, as the other
  // counters.
  double reduce_seconds = 0;
};

struct step_info {
  bool skipped = false;    // non-finite gradient, or a norm past 2^63 (see step()): no state changed
  bool warm_up = false;
  bool selection = false;  // columns were (re)selected at this step
  bool boundary = false;   // a window ended: a host update was started (or done, if synchronous)
  std::uint64_t t = 0;     // applied steps so far
};

namespace detail {
// Zen-auto's "at least `share` of the eligible matrices" (DESIGN §3.9). As a quotient: both sides
// are then the correctly rounded values of fractions, so part/whole equal to the decimal share
// the user wrote gives equal doubles (the product share·whole was inexact: 0.55·100 >
// 55 made 55 of 100 "not enough").
inline bool at_least_share(std::size_t part, std::size_t whole, double share) noexcept {
  return whole == 0 || double(part) / double(whole) >= share;
}
}  // namespace detail

// The Transport a space uses unless told otherwise (cuda_pinned for cuda_space, <zenflow/cuda.hpp>).
template <class Space>
struct default_transport {
  using type = host_copy;
};
template <class Space>
using default_transport_t = typename default_transport<Space>::type;

template <class Space = host_space, selector_policy Selector = column_topk,
          class GpuUpdater = fused_adamw<Space>, host_accumulator_policy HostAccumulator = simd_accumulator,
          transport_policy Transport = default_transport_t<Space>, scheduler_policy Scheduler = bounded_async,
          communicator_policy Communicator = single_process>
  requires gpu_updater_policy<GpuUpdater, Space>
class optimizer {
  static constexpr bool data_parallel = !detail::single_process_v<Communicator>;
  static constexpr bool comm_on_space = [] {
    if constexpr (data_parallel) return std::is_base_of_v<typename Communicator::space, Space>;
    else return true;
  }();
  static_assert(comm_on_space, "zenflow: this Communicator works on another memory space than the optimizer's "
                               "(mpi_communicator: host_space; nccl_communicator: cuda_space)");
  // Data parallel with the gradients reduce-scattered: each rank receives the reduced gradient
  // of its own block of every matrix's columns only (see reduce_gradients). Needs a
  // communicator with reduce_scatter, an updater whose gradient pass runs in parts, and a space
  // that packs the blocks: the host space (on host threads) or one with strided conversions and
  // batched device copies (cuda_space); otherwise the gradients are all-reduced.
  static constexpr bool sharded_reduction = [] {
    if constexpr (data_parallel)
      return requires(Communicator& c, GpuUpdater& u, Space& sp, float* d, const std::size_t* n) {
        c.reduce_scatter(d, n, reduce_op::mean);
        u.column_stats(sp, std::size_t{}, std::size_t{}, std::size_t{});
        u.vector_stats(sp);
        u.summarize();
        { u.column_l1(std::size_t{}) } -> std::same_as<double*>;
        { u.column_sumsq(std::size_t{}) } -> std::same_as<double*>;
        { u.column_bad(std::size_t{}) } -> std::same_as<unsigned char*>;
      } && (std::is_base_of_v<host_space, Space> || requires(Space& sp, const void* src, void* dst, const copy_piece* t) {
        sp.convert_lines(src, dtype::f32, std::size_t{}, dst, dtype::f32, std::size_t{}, std::size_t{}, std::size_t{});
        sp.copy_pieces(t, std::size_t{});
      });
    else return false;
  }();
  // Data parallel on the host space with a communicator that has the typed reduce (and
  // reduce_scatter, where the matrices' gradients are reduce-scattered): the gradients travel in
  // their own dtype and come back rounded to it (2 bytes an element for bf16 and fp16, where the
  // fp32 members move 4), the same bits. A reduction round then holds one dtype.
  static constexpr bool typed_wire = [] {
    if constexpr (data_parallel && std::is_base_of_v<host_space, Space>)
      return requires(Communicator& c, void* d) { c.reduce(d, dtype::bf16, std::size_t{}, reduce_op::mean); } &&
             (!sharded_reduction || requires(Communicator& c, void* d, const std::size_t* n) {
               c.reduce_scatter(d, dtype::bf16, n, reduce_op::mean);
             });
    else return false;
  }();
  // what a gradient of dtype g travels as in the reduction, and every such dtype, in the order the
  // reduction takes them (a round holds one)
  static constexpr dtype wire_of(dtype g) noexcept { return typed_wire ? g : dtype::f32; }
  static constexpr dtype wire_dtypes[3] = {dtype::f32, dtype::bf16, dtype::f16};
  // The offload's compaction fused into the gradient pass (see step_checked): an updater whose
  // pass can also compact and a scheduler that tells whether its offload lane is idle; with the
  // gradients reduce-scattered only at one rank (the pass in parts does not compact).
  static constexpr bool fusable_compaction = compacting_updater<GpuUpdater, Space> && offload_aware_scheduler<Scheduler>;

 public:
  // Whether step() reduce-scatters the matrices' gradients by column blocks (data parallel, see
  // sharded_reduction) rather than all-reducing every gradient.
  static constexpr bool reduce_scatters = sharded_reduction;

  explicit optimizer(const config& cfg = {})
    requires std::default_initializable<Communicator>
      : cfg_(checked(cfg)), host_(cfg.host_threads) {}
  // Data parallel: `comm` reduces every rank's gradients before each step (communicator.hpp).
  optimizer(const config& cfg, Communicator comm)
      : cfg_(checked(cfg)), host_(cfg.host_threads), comm_(std::move(comm)) {}
  optimizer(const optimizer&) = delete;
  optimizer& operator=(const optimizer&) = delete;
  // Waits for the work in flight, then frees everything — on the space's device, made current
  // first (as every entry point does, and left current), so that the frees are not made on
  // whatever device the destroying thread last used (a context created there for nothing).
  ~optimizer() {
    try {
      enter();
    } catch (...) {
    }
    try {
      quiesce();
    } catch (...) {
    }
  }

  // ---- registration (before initialize) -------------------------------------------------
  // Each returns the tensor's id, numbered from 0 in registration order (matrices and vectors
  // separately); the inspection calls below take it.
  matrix_id add_matrix(const matrix_param& p) {
    const std::string who = "matrix " + std::to_string(matrices_.size());
    check_registration(who);
    detail::check_group(who, cfg_.adam, p.lr_scale, p.weight_decay_scale);
    detail::room_for_one(matrices_);  // (so that nothing fails after the buffers are recorded)
    buffers_.add(who, false, matrices_.size(), p.param, p.param_type, p.grad, p.grad_type,
                 detail::checked_matrix_elements(who, p));
    matrices_.push_back(p);
    return matrix_id{matrices_.size() - 1};
  }
  vector_id add_vector(const vector_param& p) {
    const std::string who = "vector " + std::to_string(vectors_.size());
    check_registration(who);
    detail::check_group(who, cfg_.adam, p.lr_scale, p.weight_decay_scale);
    detail::room_for_one(vectors_);  // (so that nothing fails after the buffers are recorded)
    buffers_.add(who, true, vectors_.size(), p.param, p.param_type, p.grad, p.grad_type,
                 detail::checked_vector_elements(who, p));
    vectors_.push_back(p);
    return vector_id{vectors_.size() - 1};
  }

  // Allocates all state and takes the fp32 masters from the current params. On failure nothing
  // is left half-built: the optimizer stays uninitialised with its registrations.
  // Data parallel, a collective: every rank calls it, and it succeeds on every rank or on none
  // (a rank whose build failed tells the others, which undo theirs). Every rank must have
  // registered the same tensors in the same order (shapes, dtypes, layouts, group scales) under
  // the same config (host_threads and the groups' names aside): the ranks compare theirs, and on
  // a difference every rank throws the same error naming the first rank that differs from rank 0
  // and what differs — instead of collectives that do not match, or replicated state that drifts
  // apart unseen.
  void initialize() { initialize_or_refuse(nullptr); }
  // A wrapper's refusal of an argument of this rank's initialize() or step() (any_optimizer: a
  // stream for a space without streams): throws std::invalid_argument("zenflow: " + why) with
  // nothing changed — data parallel after this rank's part in the call's first vote, so that the
  // other ranks refuse the call too (naming this rank) instead of waiting for this one in it.
  [[noreturn]] void refuse_initialize(const std::string& why) {
    initialize_or_refuse(&why);
    fail(why);  // (not reached: the call above throws)
  }
  [[noreturn]] void refuse_step(const std::string& why) {
    if (!initialized_) fail("step() before initialize()");
    enter();
    if (distributed()) agree_to_step(1.0f, &why);  // (throws)
    fail(why);
  }

 private:
  void initialize_or_refuse(const std::string* refused) {
    if (initialized_) fail("initialize() called twice");
    // (no enter(): space_.initialize() checks the device and makes it current, with a clear
    // error and a rollback when there is none)
    std::exception_ptr failed;
    try {
      if (refused) fail(*refused);
      if (matrices_.empty() && vectors_.empty()) fail("initialize(): no parameters registered");
      build();
    } catch (...) {
      unbuild();
      if (!distributed()) throw;
      failed = std::current_exception();
    }
    if constexpr (data_parallel) {
      if (distributed()) {
        bool everyone = false;
        try {
          everyone = comm_.all_agree(!failed);
        } catch (...) {
          if (failed) std::rethrow_exception(failed);  // (this rank's own error says more)
          unbuild();
          throw;
        }
        if (failed) std::rethrow_exception(failed);
        if (!everyone) {
          unbuild();
          fail("initialize(): another rank's initialize() failed; nothing was built on this rank either");
        }
        try {
          check_ranks_match();
          // the communicator's buffers for the step's reduction rounds, now (a collective, voted
          // on): a growth inside a step, refused, would leave some gradients reduced in place.
          // Reduce-scattered matrices: rounds of up to a round; all-reduced tensors (the vectors
          // then, else everything): up to a round or all of their elements, the smaller.
          if constexpr (requires { comm_.reserve(std::size_t{}, std::size_t{}); }) {
            const std::size_t round = reduce_round_;
            if constexpr (typed_wire && requires { comm_.reserve(std::size_t{}, std::size_t{}, std::size_t{}, std::size_t{}); }) {
              // (a round holds one dtype: for each, its largest rounds of each kind, in its bytes)
              for (dtype d : wire_dtypes) {
                const auto [scattered, reduced] = wire_elements(d);
                comm_.reserve(std::min(round, scattered), std::min(round, reduced), size_of(d), size_of(d));
              }
            } else {
              std::size_t all_reduced = 0;
              if constexpr (!sharded_reduction)
                for (const auto& p : matrices_) all_reduced += p.rows * p.cols;
              for (const auto& p : vectors_) all_reduced += p.n;
              comm_.reserve(sharded_reduction ? round : 0, std::min(round, all_reduced));
            }
          }
        } catch (...) {
          unbuild();
          throw;
        }
      }
    }
    initialized_ = true;
  }

 public:
  // initialize() with the device work ordered on `stream` (a cudaStream_t on cuda_space).
  // A call refused, or an initialize() that fails, leaves the optimizer's stream as it was.
  void initialize(typename Space::stream_type stream) {
    if (initialized_) fail("initialize() called twice");
    if constexpr (requires { space_.stream(); }) {
      const auto before = space_.stream();
      use_stream(stream);
      try {
        initialize();
      } catch (...) {
        use_stream(before);  // (nothing queued after a failed initialize(): it only sets it back)
        throw;
      }
    } else {
      use_stream(stream);
      initialize();
    }
  }

  // ---- training ---------------------------------------------------------------------------
  // step() on `stream`: the optimizer's device work is ordered after what the trainer enqueued
  // there (its backward) and before what it enqueues next. The stream changes once the call's
  // arguments and the optimizer's state are checked (data parallel: voted on): a refused call
  // leaves the stream as it was.
  step_info step(typename Space::stream_type stream, float grad_scale = 1.0f) { return step_on(&stream, grad_scale); }

  // One optimizer step with the gradients currently in the registered grad buffers, which hold
  // the loss scaled by grad_scale. Returns what happened; a gradient that is not finite, or that
  // would overflow fp32 once unscaled and clipped, skips the step (no state changes). Arguments
  // are checked before anything changes (so is the calling thread's CUDA error slot: an error
  // an earlier call left there throws, see check_no_pending_error); if the step still fails
  // midway (a device or transfer error), the optimizer refuses step(), synchronize(), save()
  // and copy_params_synchronized() until a checkpoint is loaded. Data
  // parallel, every rank calls it (a collective) with the same grad_scale (compared first, with
  // whether every rank can step: agree_to_step): the ranks' gradients are reduced first, so
  // every rank takes the same decisions and keeps the same state. Afterwards the grad buffers
  // hold the reduced gradient (rounded to their dtype) where this rank used it — the vectors,
  // the columns of its blocks, the selected columns (a skipped step stops before it gathers
  // those: there only the vectors and its blocks' columns) — and its own gradient elsewhere (all
  // of them reduced with a communicator that has no reduce_scatter: mpi_allreduce_communicator,
  // nccl_allreduce_communicator).
  step_info step(float grad_scale = 1.0f) { return step_on(nullptr, grad_scale); }

 private:
  step_info step_on(const typename Space::stream_type* stream, float grad_scale) {
    if (!initialized_) fail("step() before initialize()");
    enter();
    // a stream the space cannot take (cuda_space: another GPU's) is an argument refused, as the
    // grad_scale is: before anything changes (data parallel: in the vote, on every rank)
    std::string refused_stream;
    if constexpr (requires(const Space& s, typename Space::stream_type t) {
                    { s.stream_refusal(t) } -> std::convertible_to<std::string>;
                  })
      if (stream) {
        refused_stream = space_.stream_refusal(*stream);
        if (!refused_stream.empty()) refused_stream = "step(stream): " + refused_stream;
      }
    // (the vote carries a pending error: below, one process)
    if (distributed()) agree_to_step(grad_scale, refused_stream.empty() ? nullptr : &refused_stream);
    check_usable();
    if (!distributed()) check_no_pending_error("step()");
    check_grad_scale(grad_scale);
    if (!refused_stream.empty()) fail(refused_stream);
    check_fit_params();
    // (the same on every rank: applied_ is replicated)
    if (applied_ >= max_applied_steps)
      throw std::overflow_error("zenflow: step() refused: " + std::to_string(applied_) +
                                " steps applied, the most a run takes (a column's 32-bit Adam count would wrap); "
                                "nothing changed");
    // (a hand-over the runtime refuses throws here, nothing changed but what set_stream says)
    if (stream) use_stream(*stream);
    // (one rank: the reduction is the identity — a sum of one, a division by 1 — and is skipped)
    if (data_parallel && comm_.size() > 1) {  // changes no optimizer state
      const auto t0 = std::chrono::steady_clock::now();
      lend_arena lent(*this);
      reduce_gradients();
      reduce_ns_ += std::uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    }
    return guarded([&] { return step_checked(grad_scale); });
  }

 public:
  // Finishes any host update in flight and makes its result visible in the params (on the CUDA
  // space: the uploads enqueued on the optimizer's stream, current in that stream's order).
  void synchronize() {
    if (!initialized_) fail("synchronize() before initialize()");
    enter();
    enter_collective("synchronize()", [&] {
      check_usable();
      quiesce();
    });
    guarded([&] { drain(); });  // (nothing in flight: publishes the last host update)
  }

  void set_lr(float lr) {
    check_lr(lr);
    cfg_.adam.lr = lr;
  }
  float lr() const noexcept { return cfg_.adam.lr; }
  const config& get_config() const noexcept { return cfg_; }
  bool initialized() const noexcept { return initialized_; }
  // False once a call failed midway (its exception was the first sign; step(), save(),
  // synchronize() and copy_params_synchronized() then throw unusable_error), until a load
  // succeeds.
  bool usable() const noexcept { return broken_.empty(); }
  std::uint64_t applied_steps() const noexcept { return applied_; }

  optimizer_stats stats() const {
    optimizer_stats s;
    s.steps = steps_;
    s.skipped_steps = skipped_;
    s.selections = selections_;
    s.host_updates = host_updates_;
    // every step returned so far, the offload still on its way included
    s.bytes_to_host = std::max(transport_.bytes_to_host(), owed_to_host_) - base_to_host_;
    s.bytes_to_device = transport_.bytes_to_device() - base_to_device_;
    s.bytes_uploaded_ahead = ahead_bytes_;
    s.stall_seconds = (scheduler_.stall_seconds() - base_stall_) + stall_carried_;
    s.host_update_seconds = double(host_ns_.load()) * 1e-9;
    s.host_bookkeeping_bytes = bookkeeping_bytes();
    s.bytes_reduced = comm_.bytes_sent() - setup_sent_ + shared_;
    s.bytes_gathered = gathered_;
    s.reduce_seconds = double(reduce_ns_) * 1e-9;
    if (initialized_) {
      // (the reduction buffer and the gather space are the space's device memory: host memory
      // on the host space)
      // and what the communicator keeps between calls (its receive buffers) in its space's memory
      std::size_t comm_bytes = reduce_buf_.size() + gather_buf_.size();
      if constexpr (requires { comm_.bytes_allocated(); }) comm_bytes += comm_.bytes_allocated();
      const bool on_host = std::is_base_of_v<host_space, Space>;
      s.host_pageable_bytes = host_.bytes_allocated() + (on_host ? comm_bytes : 0);
      if constexpr (pinned_transport<Transport>) s.host_pinned_bytes = transport_.pinned_bytes();
      if constexpr (requires { updater_.pinned_bytes(); }) s.host_pinned_bytes += updater_.pinned_bytes();
      s.device_bytes = updater_.bytes_allocated() + grad_compact_.size() + dev_stage_.size() + ahead_.size() +
                       4 * slots_dev_.size() + 4 * compact_slot_.size() +
                       sizeof(copy_piece) * (stats_out_.table.size() + stats_in_.table.size()) +
                       (on_host ? 0 : comm_bytes);
      for (const auto& l : lists_dev_) s.device_bytes += 4 * l.size();
    }
    return s;
  }

  // ---- inspection (waits for a host update in flight; changes nothing) ---------------------
  // The fp32 master of a matrix, column after column ([cols][rows]).
  void copy_master(matrix_id matrix, float* out) {
    column_state("copy_master()", matrix.index(), out, [](auto& st, int b) { return st.master_of(b); },
                 [](auto& hs) { return hs.master.data(); }, true);
  }
  void copy_exp_avg(matrix_id matrix, float* out) {
    column_state("copy_exp_avg()", matrix.index(), out, [](auto& st, int b) { return st.exp_avg[b].data(); },
                 [](auto& hs) { return hs.exp_avg.data(); });
  }
  void copy_exp_avg_sq(matrix_id matrix, float* out) {
    column_state("copy_exp_avg_sq()", matrix.index(), out, [](auto& st, int b) { return st.exp_avg_sq[b].data(); },
                 [](auto& hs) { return hs.exp_avg_sq.data(); });
  }
  std::vector<std::uint32_t> column_counts(matrix_id id) {
    const std::size_t matrix = id.index();
    enter();
    std::vector<std::uint32_t> out;  // (no host state: every column is selected)
    // (out is allocated in the first vote: a rank that cannot would not join the gather)
    enter_collective("column_counts()", [&] { quiesce(); }, [&] {
      check_matrix(matrix);
      out.resize(matrices_[matrix].cols);
    });
    const auto& hs = host_.matrix(matrix);
    if (hs.on_host) {
      std::copy_n(hs.counts.data(), hs.cols, out.data() + col_begin(matrix, comm_.rank()));
      gather_blocks_host(matrix, out.data(), 4);
    }
    const auto& d = updater_.matrix(matrix);
    const std::vector<std::uint32_t> dev = download<std::uint32_t>(d.counts[d.cur].data(), d.active);
    for (std::size_t s = 0; s < d.active; ++s) out[selected_[matrix][s]] = dev[s];
    return out;
  }
  std::vector<std::uint32_t> selected_columns(matrix_id matrix) const {
    check_matrix(matrix.index());
    return selected_[matrix.index()];
  }
  // A matrix's params as synchronize() would leave them — rows*cols elements of its param dtype,
  // in its registered layout — without changing the run: a host update in flight is waited for
  // (counted as stall) but not applied; it lands at the next boundary as it would have. For
  // evaluating mid-run: synchronize() applies the update a window early, and the rest of the run
  // then differs from one that never called it. (Vectors are updated on the device every step:
  // their registered params are always current.)
  void copy_params_synchronized(matrix_id id, void* out) {
    const std::size_t i = id.index();
    enter();
    // data parallel: every rank's unselected columns' params, gathered; allocated in the first
    // vote (a rank that cannot would not join the gather)
    std::vector<unsigned char> all;
    enter_collective(
        "copy_params_synchronized()",
        [&] {
          check_usable();
          quiesce();
        },
        [&] {
          check_matrix(i);
          const matrix_param& m = matrices_[i];
          check_out("copy_params_synchronized()", out, m.rows * m.cols * size_of(m.param_type), size_of(m.param_type));
          if (data_parallel && pending_)
            all.resize(unselected_[i].size() * matrices_[i].rows * size_of(matrices_[i].param_type));
        });
    const matrix_param& p = matrices_[i];
    const std::size_t es = size_of(p.param_type);
    space_.download(out, p.param, p.rows * p.cols * es);
    if (!pending_) return;
    // the host update's result for the unselected columns, rounded from the master as the next
    // upload will, a bounded chunk at a time (data parallel: this rank's part, then every rank's
    // gathered, all at once)
    const auto& un = unselected_[i];
    auto* o = static_cast<unsigned char*>(out);
    auto place = [&](const unsigned char* staged, std::size_t c0, std::size_t m) {  // un[c0, c0 + m)
      for (std::size_t k = 0; k < m; ++k)
        for (std::size_t r = 0; r < p.rows; ++r)
          std::memcpy(o + element_offset(p.layout, p.rows, p.cols, r, un[c0 + k]) * es, staged + (k * p.rows + r) * es, es);
    };
    if constexpr (data_parallel) {
      const std::size_t cb = p.rows * es;
      host_.stage_params(i, host_unselected(i), host_unselected_count(i), all.data() + own_from_[i] * cb);
      gather_list_host(i, un.data(), un.size(), all.data(), cb);
      place(all.data(), 0, un.size());
    } else {
      const std::size_t chunk = host_.stage_columns(i);
      std::vector<unsigned char> staged(std::min(chunk, un.size()) * p.rows * es);
      for (std::size_t c0 = 0; c0 < un.size(); c0 += chunk) {
        const std::size_t m = std::min(chunk, un.size() - c0);
        host_.stage_params(i, un.data() + c0, m, staged.data());
        place(staged.data(), c0, m);
      }
    }
  }
  void copy_vector_master(vector_id id, float* out) {
    const std::size_t vec = id.index();
    if (vec >= vectors_.size()) fail("no vector " + std::to_string(vec));
    if (!initialized_) fail("vector " + std::to_string(vec) + ": not before initialize()");
    enter();
    check_out("copy_vector_master()", out, 4 * vectors_[vec].n, 4);
    const auto& v = updater_.vector(vec);
    space_.download(out, v.param_master ? v.p.param : v.master.data(), 4 * v.p.n);  // (an fp32 param is its master)
  }

  // The execution space, read-only (its stream(), device()): the stream is set through
  // initialize(stream) / step(stream, ...), which also hand it to the communicator.
  const Space& space() const noexcept { return space_; }
  // The scheduler, read-only (busy(), failed(), stall_seconds()): a wait of the caller's own
  // would take a background job's error that the optimizer must see to refuse what follows.
  const Scheduler& scheduler() const noexcept { return scheduler_; }
  // The transport, e.g. to opt in to uploads ahead before initialize():
  // opt.transport().upload_ahead(true) (cuda_pinned, host_copy).
  Transport& transport() noexcept { return transport_; }
  // The communicator (its rank, size, bytes_sent(); read-only: its collectives are the optimizer's).
  const Communicator& communicator() const noexcept { return comm_; }
  // Data parallel: true on every rank when every rank passed true — a collective, every rank
  // calls it at the same point — for a caller's own checks before one of the optimizer's
  // collectives (a wrapper's argument checks), so that a call one rank refuses is refused on
  // every rank instead of leaving the others waiting in it. One process: ok, no communication.
  bool all_agree(bool ok) {
    if (!distributed()) return ok;
    return comm_.all_agree(ok);
  }

  // ---- checkpoints ------------------------------------------------------------------------
  // Saves the complete state — config, registrations, counters, selections, per-column counts,
  // fp32 masters and moments on both sides, the open window's accumulator, a host update that
  // has run but is not yet visible, the Zen-auto sums, and the registered params themselves —
  // atomically (a crash mid-save leaves the previous file intact). A host update in flight is
  // waited for, not applied early: saving does not change the run. Throws std::runtime_error
  // on I/O failure, with the optimizer unchanged. Data parallel: a collective that writes a
  // sharded checkpoint, a shard per rank and a manifest at `path` (optimizer_checkpoint.hpp).
  void save(const std::string& path) {
    if (!initialized_) fail("save() before initialize()");
    enter();
    enter_collective(
        "save()",
        [&] {
          check_usable();  // never a checkpoint of a state a failed step left half-changed
          quiesce();
        },
        [&] {
          if (path.empty()) fail("save(): the path is empty");
        });
    detail::optimizer_checkpoint<optimizer>::save(*this, path);
  }

  // Restores a checkpoint written by save() into this initialised optimizer, whose config and
  // registrations must match the file's (lr is taken from the file; host_threads may differ).
  // The registered params are overwritten with the saved ones. Everything is read and checked
  // first — the header and the file's size before any payload, then every checksum — through
  // bounded buffers (the file is read twice, never held whole): a file that is unreadable,
  // corrupt or mismatched throws zenflow::checkpoint_error naming the problem, and the optimizer
  // is left exactly as it was. (Only a file rewritten in place during the load can fail the
  // second pass; the optimizer then refuses further work until a load succeeds.)
  void load(const std::string& path) {
    if (!initialized_) fail("load() before initialize()");
    collective_load([&] {
      check_no_pending_error("load()");  // (data parallel: every rank then refuses, nothing changed)
      ckpt::input in(path);
      load_from(in);
    });
  }

  // load() from a checkpoint image in memory (a file's bytes); `name` appears in the messages.
  void load_image(const void* data, std::size_t size, const std::string& name = "(memory)") {
    if (!initialized_) fail("load() before initialize()");
    collective_load([&] {
      check_no_pending_error("load()");
      ckpt::input in(data, size, name);
      load_from(in);
    });
  }

 private:
  template <class>
  friend struct detail::optimizer_checkpoint;

  void load_from(ckpt::input& in) {
    enter();
    try {
      quiesce();
    } catch (...) {
      // a background job failed: the state it left is what this load replaces
    }
    detail::optimizer_checkpoint<optimizer>::load(*this, in);
    broken_.clear();  // a complete, checked state again
    unfit_params_.clear();  // (its masters are the file's, checked finite)
  }

  // Data parallel, a load is a collective with two votes: every rank checks its file completely
  // and commits only if every rank's checks passed (else every rank throws, each unchanged);
  // if a commit then fails on any rank (a file rewritten while it was read), every rank refuses
  // further work until a load succeeds. (load_vote_: 0, the first vote is owed; 1, the second;
  // 2, none.)
  template <class F>
  void collective_load(F&& f) {
    if constexpr (!data_parallel) {
      f();
    } else {
      load_vote_ = 0;
      try {
        f();
      } catch (...) {
        if (load_vote_ < 2) comm_.all_agree(false);
        throw;
      }
      if (!comm_.all_agree(true)) {
        mark_broken([] { return std::string("another rank's checkpoint load failed while committing"); });
        throw std::runtime_error("zenflow: " + broken_);
      }
    }
  }
  // Called by the checkpoint's load between its checks and its commit (`in`: the file every
  // rank read, its check pass done). Then the ranks compare what they read: two complete
  // checkpoints at one path (one saved over it while the ranks opened it, or copies out of step
  // between nodes) would pass every rank's checks and leave the ranks' states apart.
  // What the digests' gather needs is got on each side of the first vote, so that no rank can
  // fail between its two votes while the others wait in the gather: the tables before it (a rank
  // that cannot allocate them votes no), the device's gather space after it, before the second
  // vote is owed (a collective of its own, failing on every rank alike).
  void agree_to_commit(const ckpt::input& in) {
    if constexpr (data_parallel) {
      const std::size_t R = std::size_t(comm_.size());
      std::vector<std::uint64_t> digests(R, 0);
      std::vector<std::size_t> bytes(R, sizeof(std::uint64_t));
      load_vote_ = 2;
      if (!comm_.all_agree(true)) in.fail("another rank could not load its checkpoint; nothing was changed");
      if (distributed()) reserve_gather_host(R * sizeof(std::uint64_t));
      load_vote_ = 1;
      digests[std::size_t(comm_.rank())] = in.digest();
      all_gather_host(digests.data(), bytes.data());
      for (std::size_t r = 1; r < R; ++r)
        if (digests[r] != digests[0])
          in.fail("rank " + std::to_string(r) + " read another checkpoint than rank 0 (was it saved over during the "
                  "load, or do the ranks see different copies?); nothing was changed");
    }
  }

  [[noreturn]] static void fail(const std::string& what) { detail::invalid(what); }

  // The device work, the communicator's collectives included, goes on `stream` from now on.
  // (The communicator follows the space's stream, which stays as it was while a CUDA error is
  // pending: the two never differ.)
  void use_stream(typename Space::stream_type stream) {
    space_.set_stream(stream);
    if constexpr (requires { comm_.set_stream(stream); }) comm_.set_stream(space_.stream());
  }

  // A communicator that sums on threads (use_arena: mpi_communicator) borrows the host space's
  // arena, the device-side threads, which the step does not use while the gradients are reduced,
  // for as long as this lives, and is handed nullptr after (it keeps no pointer into the
  // optimizer between steps; an exception from the reduction included).
  struct lend_arena {
    explicit lend_arena(optimizer& o) noexcept : c(o.comm_) {
      if constexpr (lends) c.use_arena(&o.space_.arena());
    }
    ~lend_arena() {
      if constexpr (lends) c.use_arena(nullptr);
    }
    lend_arena(const lend_arena&) = delete;
    lend_arena& operator=(const lend_arena&) = delete;
    static constexpr bool lends = std::is_base_of_v<host_space, Space> && requires(Communicator& cm, Space& sp) {
      cm.use_arena(&sp.arena());
      cm.use_arena(nullptr);
    };
    // (the taking back runs while an exception unwinds: it must not throw)
    static constexpr bool takes_back_quietly() {
      if constexpr (lends) return noexcept(std::declval<Communicator&>().use_arena(nullptr));
      else return true;
    }
    static_assert(takes_back_quietly(), "zenflow: a communicator's use_arena must be noexcept");
    Communicator& c;
  };

  // Data parallel: the ranks' gradients reduced. With sharded_reduction the matrices' are
  // reduce-scattered — each rank gets the reduced gradient of its own block of columns only
  // (scatter_matrix_gradients), the columns it offloads; the other columns' statistics and the
  // selected columns' reduced gradients come from their owners during the step
  // (sharded_gradient_pass, gather_selected_grads) — and the vectors all-reduced; otherwise
  // every gradient is all-reduced.
  void reduce_gradients() {
    if constexpr (sharded_reduction) {
      scatter_matrix_gradients();
      all_reduce_gradients(matrices_.size());
    } else {
      all_reduce_gradients(0);
    }
  }
  // The grad buffers from tensor `first` on (matrices, then vectors, in registration order),
  // taken as one sequence of elements, reduced across the ranks a round at a time: at most
  // reduce_round_ elements (reduce_round_for) packed into reduce_buf_ — widened to fp32, or
  // in their own dtype with typed_wire (a round then holds one dtype: the tensors go grouped by
  // it, each group in registration order, so that alternating dtypes still fill the rounds) —
  // reduced, and written back rounded to their dtype (nearest even; with typed_wire the
  // communicator rounded them). The reduction is element by element, so the rounds do not
  // change a bit; they bound the buffer. A NaN or Inf on any rank makes the reduced element
  // non-finite on every rank, so every rank skips the step. (On the host space by the host
  // kernels in the space's own arena — device-side work, never queued behind a host update
  // running in the accumulator's — on a device space by its convert(): the same bits.)
  void all_reduce_gradients(std::size_t first) {
    unsigned char* buf = reduce_buf_.data();
    const std::size_t round = reduce_round_;
    auto convert = [&](const void* src, dtype st, void* dst, dtype dt, std::size_t n) {
      if constexpr (std::is_base_of_v<host_space, Space>) host::convert(space_.arena(), {src, st, dst, dt}, n);
      else space_.convert(src, st, dst, dt, n);
    };
    std::size_t fill = 0;  // elements of this round in buf
    dtype wt = dtype::f32;  // and their dtype there
    auto& pieces = reduce_pieces_;  // this round's pieces of tensors, in buf order
    pieces.clear();
    auto grad = [&](std::size_t t) -> std::pair<unsigned char*, dtype> {
      if (t < matrices_.size()) return {static_cast<unsigned char*>(const_cast<void*>(matrices_[t].grad)), matrices_[t].grad_type};
      const auto& v = vectors_[t - matrices_.size()];
      return {static_cast<unsigned char*>(const_cast<void*>(v.grad)), v.grad_type};
    };
    auto flush = [&] {
      if (!fill) return;
      if constexpr (typed_wire) comm_.reduce(static_cast<void*>(buf), wt, fill, cfg_.gradient_reduction);
      else comm_.reduce(reinterpret_cast<float*>(buf), fill, cfg_.gradient_reduction);
      std::size_t at = 0;
      for (const reduce_piece& pc : pieces) {
        const auto [g, t] = grad(pc.tensor);
        convert(buf + at * size_of(wt), wt, g + pc.first * size_of(t), t, pc.len);
        at += pc.len;
      }
      fill = 0;
      pieces.clear();
    };
    const std::size_t tensors = matrices_.size() + vectors_.size();
    for (dtype d : wire_dtypes) {  // (the tensors that travel as d, in registration order)
      wt = d;
      for (std::size_t t = first; t < tensors; ++t) {
        const auto [g, ty] = grad(t);
        if (wire_of(ty) != d) continue;
        const std::size_t n = t < matrices_.size() ? matrices_[t].rows * matrices_[t].cols : vectors_[t - matrices_.size()].n;
        for (std::size_t e = 0; e < n;) {
          const std::size_t len = std::min(n - e, round - fill);
          convert(g + e * size_of(ty), ty, buf + fill * size_of(wt), wt, len);
          pieces.push_back({t, e, len});
          fill += len;
          e += len;
          if (fill == round) flush();
        }
      }
      flush();
    }
  }
  // sharded_reduction: every matrix's gradient reduce-scattered by column blocks, a round of at
  // most reduce_round_ elements at a time. A round is a list of rectangles of matrices
  // (rows [r0, r1) by columns [a, b): whole rows, or a part of one row when a row alone is
  // longer than the round) of one wire dtype (wire_of: with typed_wire the matrices go grouped by
  // it, each group in registration order); rank q's segment of the round holds, rectangle after
  // rectangle, the part in q's block of columns, in the wire dtype. Each rank then gets its
  // segment reduced (the sum in rank order, as the all-reduce's: the same bits) and writes it
  // back rounded to the grad dtype; the other columns of its grad buffers keep the rank's own
  // gradient.
  void scatter_matrix_gradients() {
    const std::size_t round = reduce_round_;
    std::size_t fill = 0;
    dtype wt = dtype::f32;
    scatter_items_.clear();
    auto flush = [&] {
      flush_scatter(wt);
      fill = 0;
    };
    for (dtype d : wire_dtypes) {  // (the matrices that travel as d, in registration order)
      wt = d;
      for (std::size_t i = 0; i < matrices_.size(); ++i) {
        if (wire_of(matrices_[i].grad_type) != d) continue;
        const std::size_t rows = matrices_[i].rows, cols = matrices_[i].cols;
        if (cols <= round) {
          for (std::size_t r = 0; r < rows;) {
            const std::size_t take = std::min(rows - r, (round - fill) / cols);
            if (take == 0) {
              flush();
              continue;
            }
            scatter_items_.push_back({i, r, r + take, 0, cols});
            fill += take * cols;
            r += take;
          }
        } else {
          for (std::size_t r = 0; r < rows; ++r)
            for (std::size_t a = 0; a < cols;) {
              if (fill == round) flush();
              const std::size_t len = std::min(cols - a, round - fill);
              scatter_items_.push_back({i, r, r + 1, a, a + len});
              fill += len;
              a += len;
            }
        }
      }
      flush();
    }
  }
  // One round of scatter_matrix_gradients, its elements travelling as wt.
  void flush_scatter(dtype wt) {
    if (scatter_items_.empty()) return;
    const std::size_t R = std::size_t(comm_.size()), me = std::size_t(comm_.rank()), es = size_of(wt);
    // the part of a rectangle in rank q's block: columns [lo, hi)
    auto part = [&](const scatter_item& it, std::size_t q) {
      const std::size_t lo = std::max(it.a, col_begin(it.matrix, int(q))), hi = std::min(it.b, col_begin(it.matrix, int(q) + 1));
      return std::pair{lo, std::max(lo, hi)};
    };
    scatter_counts_.assign(R, 0);
    for (std::size_t q = 0; q < R; ++q)
      for (const scatter_item& it : scatter_items_) {
        const auto [lo, hi] = part(it, q);
        scatter_counts_[q] += (it.r1 - it.r0) * (hi - lo);
      }
    unsigned char* buf = reduce_buf_.data();
    std::size_t at = 0, own = 0;
    for (std::size_t q = 0; q < R; ++q) {
      if (q == me) own = at;
      for (const scatter_item& it : scatter_items_) {
        const auto [lo, hi] = part(it, q);
        grad_rectangle(it.matrix, it.r0, it.r1, lo, hi, buf + at * es, wt, true);
        at += (it.r1 - it.r0) * (hi - lo);
      }
    }
    if constexpr (typed_wire) comm_.reduce_scatter(static_cast<void*>(buf), wt, scatter_counts_.data(), cfg_.gradient_reduction);
    else comm_.reduce_scatter(reinterpret_cast<float*>(buf), scatter_counts_.data(), cfg_.gradient_reduction);
    at = own;
    for (const scatter_item& it : scatter_items_) {
      const auto [lo, hi] = part(it, me);
      grad_rectangle(it.matrix, it.r0, it.r1, lo, hi, buf + at * es, wt, false);
      at += (it.r1 - it.r0) * (hi - lo);
    }
    scatter_items_.clear();
  }
  // Rows [r0, r1) by columns [lo, hi) of matrix i's grad buffer, in its memory order (column
  // after column, or row after row for a row-major matrix), to dtype wt at w (out) or back from
  // w (in), converted (fp32 one way, rounded to the grad dtype, nearest even, the other, as
  // host::convert) or copied (wt the grad dtype).
  void grad_rectangle(std::size_t i, std::size_t r0, std::size_t r1, std::size_t lo, std::size_t hi, void* w, dtype wt,
                      bool out) {
    if (r0 == r1 || lo == hi) return;
    const matrix_param& p = matrices_[i];
    const bool by_col = p.layout == matrix_layout::column_contiguous;
    // lines: contiguous runs of len elements in the grad buffer
    const std::size_t lines = by_col ? hi - lo : r1 - r0, len = by_col ? r1 - r0 : hi - lo;
    const std::size_t first = element_offset(p.layout, p.rows, p.cols, r0, lo);
    const std::size_t stride = by_col ? p.rows : p.cols;
    auto* g = static_cast<unsigned char*>(const_cast<void*>(p.grad));
    const std::size_t es = size_of(p.grad_type);
    if constexpr (!std::is_base_of_v<host_space, Space>) {  // on the device, by the space
      if (out) space_.convert_lines(g + first * es, p.grad_type, stride, w, wt, len, lines, len);
      else space_.convert_lines(w, wt, len, g + first * es, p.grad_type, stride, lines, len);
    } else if (lines == 1 || len == stride) {  // one run: the vectorised conversion
      if (out) host::convert(space_.arena(), {g + first * es, p.grad_type, w, wt}, lines * len);
      else host::convert(space_.arena(), {w, wt, g + first * es, p.grad_type}, lines * len);
    } else if (wt == p.grad_type) {  // lines copied
      auto* x = static_cast<unsigned char*>(w);
      space_.parallel_for(lines, [=](std::size_t l) {
        unsigned char* run = g + (first + l * stride) * es;
        if (out) std::memcpy(x + l * len * es, run, len * es);
        else std::memcpy(run, x + l * len * es, len * es);
      });
    } else {
      visit_dtype(p.grad_type, [&](auto gtag) {
        using G = typename decltype(gtag)::type;
        G* base = reinterpret_cast<G*>(g) + first;
        float* f = static_cast<float*>(w);
        space_.parallel_for(lines, [=](std::size_t l) {
          G* run = base + l * stride;
          float* x = f + l * len;
          if (out)
            for (std::size_t j = 0; j < len; ++j) x[j] = to_float(run[j]);
          else
            for (std::size_t j = 0; j < len; ++j) run[j] = from_float<G>(x[j]);
        });
      });
    }
  }
  // sharded_reduction: the gradient pass over this rank's block of every matrix (and every
  // vector), then every rank's block statistics gathered (17 bytes a column: L1 and sum of
  // squares in double, the non-finite flag), so that every rank has every column's, as one
  // process computes them from the reduced gradient, and the same summary (canonical order).
  auto sharded_gradient_pass(bool fuse) {
    const std::size_t R = std::size_t(comm_.size()), me = std::size_t(comm_.rank());
    if (R == 1) {
      if constexpr (fusable_compaction) return updater_.gradient_pass(space_, fuse);
      else return updater_.gradient_pass(space_);
    }
    for (std::size_t i = 0; i < matrices_.size(); ++i)
      updater_.column_stats(space_, i, col_begin(i, int(me)), col_begin(i, int(me) + 1));
    updater_.vector_stats(space_);
    const auto t0 = std::chrono::steady_clock::now();
    constexpr std::size_t per_col = 2 * sizeof(double) + 1;
    counts_.assign(R, 0);
    std::size_t total = 0;
    for (std::size_t r = 0; r < R; ++r) {
      for (std::size_t i = 0; i < matrices_.size(); ++i)
        counts_[r] += per_col * (col_begin(i, int(r) + 1) - col_begin(i, int(r)));
      total += counts_[r];
    }
    unsigned char* base = gather_space(total);
    // rank r's block: per matrix, its columns' L1s, then sums of squares, then flags; this
    // rank's block out of the updater's arrays, then the others' in, each as one batched copy
    // (3 pieces a matrix and rank: thousands of copies a step for a large model and R)
    stats_out_.pieces.clear();
    stats_in_.pieces.clear();
    for (std::size_t r = 0, at = 0; r < R; ++r) {
      for (std::size_t i = 0; i < matrices_.size(); ++i) {
        const std::size_t c0 = col_begin(i, int(r)), n = col_begin(i, int(r) + 1) - c0;
        auto io = [&](void* arr, std::size_t width) {
          auto* a = static_cast<unsigned char*>(arr) + c0 * width;
          if (n) {
            if (r == me) stats_out_.pieces.push_back({a, base + at, n * width});
            else stats_in_.pieces.push_back({base + at, a, n * width});
          }
          at += n * width;
        };
        io(updater_.column_l1(i), sizeof(double));
        io(updater_.column_sumsq(i), sizeof(double));
        io(updater_.column_bad(i), 1);
      }
    }
    copy_batch(stats_out_);
    comm_.all_gather(base, counts_.data());
    copy_batch(stats_in_);
    shared_ += std::uint64_t(R - 1) * counts_[me];
    reduce_ns_ += std::uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    return updater_.summarize();
  }
  // sharded_gradient_pass's copy lists and tables at their bounds, by build(): how many pieces a
  // rank has depends on its blocks (a rank with no columns of a matrix has none there), so
  // growing them as needed could fail on one rank alone, which would then never join the
  // all-gather; the bounds — 3 pieces a matrix for this rank's block out, and for each of the
  // R - 1 others' in — are the same on every rank.
  void reserve_stats_tables(std::size_t R) {
    const std::size_t out = 3 * matrices_.size(), in = out * (R - 1);
    for (auto [b, n] : {std::pair{&stats_out_, out}, std::pair{&stats_in_, in}}) {
      b->pieces.reserve(n);
      if constexpr (!std::is_base_of_v<host_space, Space>) {
        b->last.reserve(n);  // (copy_batch's `last = pieces` then keeps its storage)
        if (b->table.size() < n) b->table = typename Space::template buffer<copy_piece>(n);
      }
    }
  }
  // A batched copy between places of the space's device memory (copy_piece), with its table
  // kept in the space's memory: uploaded only when the pieces differ from the last batch's
  // (a step's statistics tables change only when the gather space moves).
  struct piece_batch {
    std::vector<copy_piece> pieces;  // this time's, built on the host
    std::vector<copy_piece> last;    // those in `table`
    typename Space::template buffer<copy_piece> table;
  };
  void copy_batch(piece_batch& b) {
    if (b.pieces.empty()) return;
    if constexpr (std::is_base_of_v<host_space, Space>) {
      space_.copy_pieces(b.pieces.data(), b.pieces.size());
    } else {
      const std::size_t bytes = b.pieces.size() * sizeof(copy_piece);
      if (b.last.size() != b.pieces.size() || std::memcmp(b.last.data(), b.pieces.data(), bytes) != 0) {
        if (b.table.size() < b.pieces.size()) {
          if (b.table.size()) space_.fence();  // the device may still read the old one
          b.table = {};
          b.table = typename Space::template buffer<copy_piece>(b.pieces.size());
        }
        space_.upload(b.table.data(), b.pieces.data(), bytes);  // (complete on return: after the last batch's copy)
        b.last = b.pieces;
      }
      space_.copy_pieces(b.table.data(), b.pieces.size());
    }
  }
  // matrix i's selected columns (ascending) in the space's memory: the host mirror on the host
  // space, else the updater's list of the live slot set (the same columns, uploaded at the
  // selection)
  const std::uint32_t* selected_on_space(std::size_t i) {
    if constexpr (std::is_base_of_v<host_space, Space>) return selected_[i].data();
    else return updater_.matrix(i).columns[updater_.matrix(i).cur].data();
  }
  // sharded_reduction: the selected columns' reduced gradients, from the ranks whose blocks hold
  // them to every rank (the grad dtype's bytes, exact), for the replicated device update.
  void gather_selected_grads() {
    const std::size_t R = std::size_t(comm_.size()), me = std::size_t(comm_.rank());
    if (R == 1) return;
    const auto t0 = std::chrono::steady_clock::now();
    // rank r's part: per matrix, its selected columns in r's block, column after column, each
    // matrix's piece padded to 16 bytes: a device space moves a piece in words of its dtype (16
    // bytes where it can), so a piece must not start off that grid after an odd-sized 2-byte one
    auto range = [&](std::size_t i, std::size_t r) { return rank_part(i, selected_[i].data(), selected_[i].size(), int(r)); };
    auto piece = [&](std::size_t i, std::size_t r) {
      const auto [from, to] = range(i, r);
      return ((to - from) * matrices_[i].rows * size_of(matrices_[i].grad_type) + 15) / 16 * 16;
    };
    counts_.assign(R, 0);
    std::size_t total = 0;
    for (std::size_t r = 0; r < R; ++r) {
      for (std::size_t i = 0; i < matrices_.size(); ++i) counts_[r] += piece(i, r);
      total += counts_[r];
    }
    if (total == 0) return;  // (the same on every rank: the selections are replicated)
    unsigned char* base = gather_space(total);
    std::size_t at = 0;
    for (std::size_t r = 0; r < R; ++r)
      for (std::size_t i = 0; i < matrices_.size(); ++i) {
        const matrix_param& p = matrices_[i];
        const auto [from, to] = range(i, r);
        if (r == me && to > from)
          space_.compact_columns(p.grad, p.grad_type, p.layout, p.rows, p.cols, selected_on_space(i) + from, to - from,
                                 base + at);
        at += piece(i, r);
      }
    comm_.all_gather(base, counts_.data());
    at = 0;
    for (std::size_t r = 0; r < R; ++r)
      for (std::size_t i = 0; i < matrices_.size(); ++i) {
        const matrix_param& p = matrices_[i];
        const auto [from, to] = range(i, r);
        if (r != me && to > from)
          space_.scatter_columns(base + at, p.grad_type, const_cast<void*>(p.grad), p.layout, p.rows, p.cols,
                                 selected_on_space(i) + from, to - from);
        at += piece(i, r);
      }
    shared_ += std::uint64_t(R - 1) * counts_[me];
    reduce_ns_ += std::uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  }

  // Data parallel: the elements the reduction moves as dtype d (wire_of), reduce-scattered (the
  // matrices, with sharded_reduction) and all-reduced (the rest).
  std::pair<std::size_t, std::size_t> wire_elements(dtype d) const {
    std::size_t scattered = 0, reduced = 0;
    for (const auto& p : matrices_)
      if (wire_of(p.grad_type) == d) (sharded_reduction ? scattered : reduced) += p.rows * p.cols;
    for (const auto& p : vectors_)
      if (wire_of(p.grad_type) == d) reduced += p.n;
    return {scattered, reduced};
  }
  // The elements of a reduction round, for n elements over R ranks (build() sizes reduce_buf_
  // with it): a quarter of a rank's share, n / 4R, but at least 2^18 elements (1 MiB of fp32)
  // and at least R x 2^11 (so that a round's piece for each peer is about 8 KiB or more: the
  // rounds are all-to-alls), at most reduce_round(), never more than n. The rank keeps 4 bytes a
  // round element (the buffer) plus the communicator's receive buffer of twice as much (reserved
  // by initialize() for a reduce-scatter round's bound): between the floors and the cap,
  // 12 bytes x n / 4R = 3 bytes a parameter / R — half that where every gradient is 16-bit and
  // travels as it is (typed_wire) — under a fifth of the 16 bytes a parameter / R
  // of its sharded host state — so host memory per rank stays about 1/R of
  // one process's for a small model too (a fixed round of up to 2^24 elements ate what sharding
  // saved below a few tens of millions of parameters). The price is the number of rounds, each a
  // collective: about 4R a step between the floors and the cap, n / floor below the floors, n /
  // cap above the cap (past 2^24 x 4R elements, where the fixed buffers are small next to the
  // state). The rounds change no bit. Every rank computes the same round (n and R are compared
  // by initialize(), reduce_round() too).
  static constexpr std::size_t reduce_round_for(std::size_t n, std::size_t R) {
    const std::size_t share = (n + 4 * R - 1) / (4 * R);
    const std::size_t floor_ = std::max(std::size_t(1) << 18, R << 11);
    return std::min({n, reduce_round(), std::max(share, floor_)});
  }
  // The most elements a reduction round holds: the communicator's choice (reduce_round, which
  // replaces the default as the cap, and wins over the floors), else 2^24 (a 64 MiB fp32 buffer).
  static constexpr std::size_t reduce_round() {
    if constexpr (requires { Communicator::reduce_round; }) {
      static_assert(Communicator::reduce_round > 0, "zenflow: a Communicator's reduce_round must be positive");
      return std::size_t(Communicator::reduce_round);
    }
    else return std::size_t(1) << 24;
  }

  // The largest ||g|| (unscaled, clipped) a step applies: every |g_i| <= ||g|| <= 2^63, so g_i^2 <=
  // 2^126 stays finite in fp32 (FLT_MAX is about 2^128), and so does Adam's second moment v, its
  // window mean on the host included (a mean of values each <= 2^63). A larger gradient would make
  // v infinite and freeze the column for the rest of the run (its update m / sqrt(v) is 0 from
  // then on, what PyTorch's AdamW does); such a step is skipped instead, like a non-finite one.
  // With host_gradient = sum a host update applies the sum of U steps' gradients, so the bound
  // is 2^63 / U (the config requires a fixed U then).
  static constexpr double max_applied_norm = 0x1p63;
  // The most steps a run applies: a column's Adam count (32 bits) counts at most every applied
  // step, so one more would wrap it to 0 (a bias correction dividing by zero). step() refuses
  // the next one; at one step a millisecond, that is 49 days of steps.
  static constexpr std::uint64_t max_applied_steps = std::numeric_limits<std::uint32_t>::max();
  double applied_norm_limit() const {
    return cfg_.host_gradient == window_gradient::sum ? max_applied_norm / double(cfg_.update_interval.steps)
                                                      : max_applied_norm;
  }

  // step() once its arguments are checked: everything up to the gradient pass's verdict changes
  // nothing; a step whose gradient is not finite, or whose norm once unscaled and clipped exceeds
  // max_applied_norm (which also keeps every element and its square finite), is skipped.
  step_info step_checked(float grad_scale) {
    const bool fuse = fuse_compaction();
    if (fuse && slots_stale_) write_slots();
    const auto summary = [&] {
      if constexpr (sharded_reduction) return sharded_gradient_pass(fuse);
      else if constexpr (fusable_compaction) return updater_.gradient_pass(space_, fuse);
      else return updater_.gradient_pass(space_);
    }();
    if (fuse) space_.record(compacted_);  // (a skipped step leaves the compacted block unused)
    const double inv = 1.0 / double(grad_scale);
    double clip = 1.0;
    if (cfg_.max_grad_norm > 0) {
      const double norm = std::sqrt(summary.sumsq) * inv;
      clip = std::min(1.0, cfg_.max_grad_norm / (norm + 1e-6));
    }
    const float factor = float(inv * clip);
    ++steps_;
    if (!summary.finite || !(std::sqrt(summary.sumsq) * double(factor) <= applied_norm_limit())) {
      // a background job's error already held fails this step as it would an applied one (the
      // ranks of a data-parallel run have voted on it before the step)
      if (!distributed() && scheduler_failed()) quiesce();
      ++skipped_;
      return {true, false, false, false, applied_};
    }
    step_info info;
    info.t = applied_ + 1;

    if (info.t <= cfg_.full_warm_up_rounds) {
      warm_up(factor);
      if constexpr (sharded_reduction) gather_selected_grads();  // (none selected during the warm-up)
      updater_.update(space_, factor, cfg_.adam);  // vectors
      info.warm_up = true;
      applied_ = info.t;
      return info;
    }
    if (window_steps_ == 0 && any_selected_ &&
        (!selected_once_ || info.t - last_selection_ >= cfg_.select_steps())) {
      scheduler_.wait_offload();  // the last step's accumulation reads the column lists
      drain();
      select();
      last_selection_ = info.t;
      selected_once_ = true;
      info.selection = true;
    }
    if constexpr (requires { updater_.enqueue_masses(space_); })
      if (cfg_.update_interval.automatic) updater_.enqueue_masses(space_);  // (this step's selection)
    if constexpr (sharded_reduction) gather_selected_grads();
    updater_.update(space_, factor, cfg_.adam);
    if (async_offload_) offload_async(factor, fuse);
    else offload(factor);
    ++window_steps_;
    if (cfg_.update_interval.automatic ? auto_boundary(factor)
                                       : (info.t - cfg_.full_warm_up_rounds) % cfg_.update_interval.steps == 0) {
      boundary();
      info.boundary = true;
    }
    applied_ = info.t;
    return info;
  }

  // Whether this step's gradient pass also does the offload's compaction. That needs the step's
  // unselected columns known before the pass — an overlapped offload after the first selection,
  // on a step that neither warms up nor selects (both decided by counters the pass does not
  // change; a step the pass then skips just leaves its compacted block unused) — and the
  // compaction buffer free: the offload lane idle, so no transfer of the last step still reads
  // it. A lane still busy is not waited for here (the pass would wait with it); that step
  // compacts after its update as before, which copies the same bytes to the same places.
  bool fuse_compaction() const {
    if constexpr (fusable_compaction) {
      if (!async_offload_ || !compact_fits()) return false;
      if (sharded_reduction && comm_.size() > 1) return false;  // (the pass runs in parts)
      const std::uint64_t t = applied_ + 1;
      if (t <= cfg_.full_warm_up_rounds) return false;  // (step_checked's conditions, as they will be)
      if (window_steps_ == 0 && any_selected_ && (!selected_once_ || t - last_selection_ >= cfg_.select_steps()))
        return false;
      return !scheduler_.offload_busy();
    } else {
      return false;
    }
  }

  // Runs f; if it throws, the optimizer may be half-way through a step or a transfer, so it
  // refuses further work (step, save; see check_usable) until a checkpoint is loaded: never a
  // checkpoint of an inconsistent state.
  template <class F>
  auto guarded(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const std::exception& e) {
      mark_broken([&] { return std::string(e.what()); });
      throw;
    } catch (...) {
      mark_broken([] { return std::string("an unknown exception"); });
      throw;
    }
  }
  // Marks the optimizer unusable, why() saying why; where that text cannot be had (no memory),
  // with a short fixed one that needs none (held inside the string: libstdc++ keeps 15
  // characters so), so that a failure never leaves it looking usable.
  template <class Why>
  void mark_broken(Why&& why) noexcept {
    try {
      broken_ = why();
    } catch (...) {
      broken_ = "out of memory";
    }
  }
  static bool grad_scale_ok(float s) noexcept {
    return std::isfinite(s) && s > 0 && std::isfinite(float(1.0 / double(s)));
  }
  static void check_grad_scale(float s) {
    if (grad_scale_ok(s)) return;
    if (!(std::isfinite(s) && s > 0)) fail("grad_scale must be finite and > 0, got " + detail::exact(s));
    if (!std::isfinite(float(1.0 / double(s))))
      fail("grad_scale " + detail::exact(s) + " is too small: 1 / grad_scale overflows fp32");
  }
  // Data parallel, before a step's first collective: each rank's grad_scale, its learning rate
  // (set_lr) and whether it can step (no step failed midway there; no background job's error
  // already waiting; no error an earlier call left on its thread; no argument refused; no param
  // that was not finite at initialize() since the last load), gathered (12 bytes a rank, in
  // bytes_reduced), so that every rank decides alike. A rank that cannot step, a grad_scale that
  // is invalid on some rank, or grad_scales or learning rates that differ (the ranks would apply
  // different updates to what must stay the same state) make every rank throw here, nothing
  // changed — instead of the others waiting in a
  // collective that rank never joins, or the states drifting apart. The rank at fault throws its
  // own error. (The last step's offload is finished first, so its error is in the vote; the host
  // update's wait later in the step is voted on in drain().)
  struct step_vote {
    float scale;
    float lr;
    // 1: a step failed midway; 2: a background job's error waits; 3: an earlier call left an
    // error on the thread (error_pending: a CUDA error nobody checked); 4: a wrapper refused an
    // argument of this rank's call (refuse_step, or step(stream)'s stream); 5: a param that was
    // not finite at initialize(), no load since (check_fit_params)
    std::uint32_t cannot;
  };
  static_assert(sizeof(step_vote) == 12);
  bool scheduler_failed() {
    if constexpr (requires { scheduler_.failed(); }) return scheduler_.failed();
    else return false;
  }
  void agree_to_step(float grad_scale, const std::string* refused = nullptr) {
    const std::size_t R = std::size_t(comm_.size()), me = std::size_t(comm_.rank());
    // the last step's offload finished first, so that its error, if any, is in this vote (one
    // found later in the step would be this rank's alone; the step waits for it anyway before
    // its own offload)
    if constexpr (requires { scheduler_.settle_offload(); }) scheduler_.settle_offload();
    auto& votes = votes_;  // (members: sized once, no allocation a step)
    votes.assign(R, step_vote{0.0f, 0.0f, 0});
    votes[me].scale = grad_scale;
    votes[me].lr = cfg_.adam.lr;
    if (!broken_.empty()) votes[me].cannot = 1;
    else if (scheduler_failed()) votes[me].cannot = 2;
    else if (error_pending()) votes[me].cannot = 3;
    else if (refused) votes[me].cannot = 4;
    else if (!unfit_params_.empty()) votes[me].cannot = 5;
    vote_bytes_.assign(R, sizeof(step_vote));
    all_gather_host(votes.data(), vote_bytes_.data());
    shared_ += std::uint64_t(R - 1) * sizeof(step_vote);
    // this rank's own failure first, so that it keeps and throws its own reason, not that of
    // another failed rank numbered before it
    if (votes[me].cannot == 1 || votes[me].cannot == 2) {
      if (votes[me].cannot == 2) quiesce();  // throws the job's error (and marks this rank)
      check_usable();
    }
    for (std::size_t r = 0; r < R; ++r) {
      if (votes[r].cannot != 1 && votes[r].cannot != 2) continue;
      mark_broken([&] {
        return "rank " + std::to_string(r) + (votes[r].cannot == 1 ? "'s optimizer failed midway" : "'s background job failed");
      });
      throw std::runtime_error("zenflow: step() refused on every rank: " + broken_ +
                               "; the ranks are no longer in step: load a checkpoint on every rank to go on");
    }
    // An error an earlier call left on a rank's thread is that call's, not the state's: every
    // rank refuses this step with nothing changed, and steps again once it is cleared. (Such a
    // rank throws its own error; the others name the first of them.)
    if (votes[me].cannot == 3) check_no_pending_error("step()");
    for (std::size_t r = 0; r < R; ++r) {
      if (votes[r].cannot != 3) continue;
      throw std::runtime_error("zenflow: step() refused on every rank: rank " + std::to_string(r) +
                               " has an error left on its thread by an earlier call, not zenflow's (it throws "
                               "that error); nothing was changed: step again once that rank has cleared it");
    }
    if (votes[me].cannot == 4) fail(*refused);
    for (std::size_t r = 0; r < R; ++r)
      if (votes[r].cannot == 4)
        fail("step() refused on every rank: rank " + std::to_string(r) +
             "'s call passed an argument it refuses (that rank throws why); nothing was changed");
    if (votes[me].cannot == 5) check_fit_params();
    for (std::size_t r = 0; r < R; ++r)
      if (votes[r].cannot == 5)
        fail("step() refused on every rank: rank " + std::to_string(r) +
             " found a param that is not finite at initialize(), and no checkpoint was loaded since (that rank "
             "throws where); nothing was changed");
    for (std::size_t r = 0; r < R; ++r) {
      if (grad_scale_ok(votes[r].scale)) continue;
      if (r == me) check_grad_scale(grad_scale);
      fail("step() refused on every rank: rank " + std::to_string(r) + " passed grad_scale " +
           detail::exact(votes[r].scale) + " (it must be finite and > 0, 1 / grad_scale finite in fp32)");
    }
    for (std::size_t r = 1; r < R; ++r)
      if (std::memcmp(&votes[r].scale, &votes[0].scale, sizeof(float)) != 0)
        fail("step() refused on every rank: grad_scale is " + detail::exact(votes[r].scale) + " on rank " +
             std::to_string(r) + ", " + detail::exact(votes[0].scale) +
             " on rank 0; every rank must pass the same (the ranks apply one reduced gradient)");
    for (std::size_t r = 1; r < R; ++r)
      // (bit for bit, as initialize() compares the configs: a step size of -0 where another rank
      // has 0 turns a param of -0 into 0 on one rank only)
      if (std::memcmp(&votes[r].lr, &votes[0].lr, sizeof votes[r].lr) != 0)
        fail("step() refused on every rank: the learning rate is " + detail::exact(votes[r].lr) + " on rank " +
             std::to_string(r) + ", " + detail::exact(votes[0].lr) +
             " on rank 0; every rank must set the same (set_lr: the ranks keep one replicated state)");
  }
  // Data parallel, the calls that are collectives besides step() (synchronize, save, the state
  // copies, column_counts): `check` checks this call's arguments (a matrix id), `local` does what
  // may fail on this rank alone — the check that no step failed midway here, the wait for the
  // background jobs (their errors are this rank's) — and the ranks vote on each before any
  // collective, so that a failure on one rank throws on every rank instead of leaving the others
  // waiting in a collective it never joins. A refused argument, or an error an earlier call left
  // on a rank's thread (as step() checks), is refused on every rank with nothing changed and no
  // rank out of step (the rank at fault throws its own error). A failure in `local` is not: the
  // failing rank throws its own error, the others throw too and, their state no longer in step
  // with that rank's, refuse further work until a load (on every rank) succeeds.
  struct nothing {
    void operator()() const noexcept {}
  };
  template <class Local, class Check = nothing>
  void enter_collective(const char* call, Local&& local, Check&& check = {}) {
    constexpr bool checks_arguments = !std::is_same_v<std::decay_t<Check>, nothing>;
    // (an error an earlier call left on the thread first: the argument checks may ask the
    // runtime, cuda_space's where a copy's destination lives, which would report it as theirs)
    if (!distributed()) {
      if constexpr (reports_pending_errors) check_no_pending_error(call);
      check();
      return local();
    }
    if constexpr (checks_arguments || reports_pending_errors)
      on_every_rank(
          [&] {
            if constexpr (reports_pending_errors) check_no_pending_error(call);
            check();
          },
          [&] {
            return "zenflow: " + std::string(call) + " refused on every rank: another rank " +
                   (checks_arguments ? "refused its arguments, could not allocate the call's host buffer or has an "
                                       "error left on its thread by an earlier call, not zenflow's"
                                     : "has an error left on its thread by an earlier call, not zenflow's") +
                   " (it throws that error); nothing was changed";
          });
    on_every_rank(
        local,
        [&] {
          return "zenflow: " + std::string(call) +
                 " failed on another rank (which threw its error); the ranks are no longer in step: load a "
                 "checkpoint on every rank to go on";
        },
        [&] { mark_broken([&] { return std::string(call) + " failed on another rank"; }); });
  }
  // A part of a step that could fail on this rank alone (its allocations) before the step's
  // next collective: voted on, so that every rank throws there (and, the step having failed
  // midway, refuses work until a load).
  template <class F>
  void step_part(F&& f) {
    on_every_rank(f, [] {
      return std::string("zenflow: step() failed on another rank (it threw its error); the ranks are no longer in "
                         "step: load a checkpoint on every rank to go on");
    });
  }
  // f() on this rank, then (data parallel) a vote on whether it threw on any rank, so that a
  // failure on one rank throws on every rank at the same point instead of leaving the others
  // waiting in the next collective: where it threw, its error; elsewhere `refused()`, then a
  // runtime_error saying elsewhere().
  template <class F, class Elsewhere, class Refused = nothing>
  void on_every_rank(F&& f, Elsewhere&& elsewhere, Refused&& refused = {}) {
    if (!distributed()) return f();
    std::exception_ptr mine;
    try {
      f();
    } catch (...) {
      mine = std::current_exception();
    }
    if (comm_.all_agree(!mine)) return;
    if (mine) std::rethrow_exception(mine);
    refused();
    throw std::runtime_error(elsewhere());
  }
  // The bounds that involve lr, for the config and every parameter group (set_lr, and load for
  // the file's lr: group scales are not stored, so a file's lr may not fit this optimizer's).
  void check_lr(float lr) const {
    if (!(std::isfinite(lr) && lr >= 0)) fail("lr must be finite and >= 0, got " + detail::exact(lr));
    config c = cfg_;
    c.adam.lr = lr;
    c.validate();
    // (set_lr may run every step: a tensor's name is only built for the message of a failure)
    for (std::size_t i = 0; i < matrices_.size(); ++i)
      if (!detail::group_ok(c.adam, matrices_[i].lr_scale, matrices_[i].weight_decay_scale))
        detail::check_group("matrix " + std::to_string(i), c.adam, matrices_[i].lr_scale, matrices_[i].weight_decay_scale);
    for (std::size_t i = 0; i < vectors_.size(); ++i)
      if (!detail::group_ok(c.adam, vectors_[i].lr_scale, vectors_[i].weight_decay_scale))
        detail::check_group("vector " + std::to_string(i), c.adam, vectors_[i].lr_scale, vectors_[i].weight_decay_scale);
  }
  void check_usable() const {
    if (!broken_.empty())
      throw unusable_error("zenflow: a step or transfer failed midway (" + broken_ +
                             "); the optimizer's state may be inconsistent: load a checkpoint to go on");
  }

  static const config& checked(const config& c) {
    c.validate();
    return c;
  }

  // The destination of a copy out of the optimizer: not null, aligned, over no registered
  // buffer (registered_buffers::check_out), and memory the host writes (cuda_space: not device
  // memory, which the copy's host side would fault on).
  void check_out(const std::string& who, const void* out, std::size_t bytes, std::size_t align) const {
    buffers_.check_out(who, out, bytes, align);
    if constexpr (requires(const Space& s) { s.check_host_memory(out, who); }) space_.check_host_memory(out, who);
  }
  void check_registration(const std::string& who) const {
    if (initialized_) fail(who + ": cannot register after initialize()");
    // (a checkpoint counts its sections, 3 + one a tensor, in 32 bits, and the device's launches
    // their tensors in an int: a limit no model comes near, refused rather than wrapped)
    if (matrices_.size() + vectors_.size() >= max_tensors)
      fail(who + ": at most " + std::to_string(max_tensors) + " tensors can be registered");
  }
  static constexpr std::size_t max_tensors = (std::size_t(1) << 31) - 8;
  // Every public entry point that touches the device after initialize() first makes the space
  // current on the calling thread (a CUDA space sets its device: a trainer may drive the optimizer from another
  // thread than the one that initialised it). Spaces without activate() need nothing.
  void enter() {
    if constexpr (requires(Space& s) { s.activate(); }) space_.activate();
  }
  // A space whose errors wait on the calling thread from call to call (CUDA's last-error slot)
  // reports one that an earlier call, not zenflow's, left there before an entry point
  // (initialize, step, synchronize, save, load, the copies) changes anything: zenflow's own checks
  // would otherwise pin it on zenflow's next kernel.
  // (cuda_space::check_no_pending_error; other spaces have nothing to report.)
  static constexpr bool reports_pending_errors =
      requires(const Space& s) { { s.error_pending() } -> std::convertible_to<bool>; };
  bool error_pending() const noexcept {
    if constexpr (reports_pending_errors) return space_.error_pending();
    else return false;
  }
  void check_no_pending_error(const char* call) const {
    if constexpr (requires(const Space& s) { s.check_no_pending_error(call); }) space_.check_no_pending_error(call);
  }
  // Matrix i's parameter group applied to the optimizer's hyperparameters.
  adamw_hyper matrix_hyper(std::size_t i, const adamw_hyper& h) const noexcept {
    return group_hyper(h, matrices_[i].lr_scale, matrices_[i].weight_decay_scale);
  }
  void check_matrix(std::size_t m) const {
    if (m >= matrices_.size()) fail("no matrix " + std::to_string(m));
    if (!initialized_) fail("matrix " + std::to_string(m) + ": not before initialize()");
  }

  void build() {
    space_.initialize();
    check_no_pending_error("initialize()");
    // (cuda_space: a program built to flush subnormals to zero is refused; see check_arithmetic)
    if constexpr (requires(const Space& s) { s.check_arithmetic(); }) space_.check_arithmetic();
    // where each registered buffer lives, and its length where the space can tell (cuda_space:
    // a host pointer or a short allocation is refused here, not a fault at the first kernel)
    if constexpr (requires(const Space& s, const void* p, const std::string& who) {
                    s.check_registered_memory(p, std::size_t{}, who);
                  })
      buffers_.for_each([&](const void* p, std::size_t bytes, const std::string& who) {
        space_.check_registered_memory(p, bytes, who);
      });
    // a communicator bound to a GPU (nccl_communicator) must be on the space's: its collectives
    // would otherwise read and write this GPU's buffers from another one (a CUDA or NCCL error
    // at the first step, naming neither)
    if constexpr (requires(const Communicator& c, const Space& s) {
                    { c.device() } -> std::convertible_to<int>;
                    { s.device() } -> std::convertible_to<int>;
                  })
      if (comm_.device() != space_.device())
        throw std::invalid_argument("zenflow: initialize(): the communicator is on GPU " + std::to_string(comm_.device()) +
                                    ", the optimizer on GPU " + std::to_string(space_.device()) +
                                    " (the GPU current when initialize() ran, unless the cuda_space was given one): "
                                    "make the communicator's GPU current first");
    if constexpr (requires { updater_.reserve(std::size_t{}, std::size_t{}); })
      updater_.reserve(matrices_.size(), vectors_.size());
    if constexpr (requires { host_.reserve(std::size_t{}); }) host_.reserve(matrices_.size());
    selected_.reserve(matrices_.size());
    unselected_.reserve(matrices_.size());
    for (const matrix_param& p : matrices_) {
      const std::size_t k = Selector::k(cfg_.topk_ratio, p.cols);
      if (k > p.cols)  // (a Selector of the trainer's own)
        throw std::logic_error("zenflow: the Selector's k() gives " + std::to_string(k) + " columns for matrix " +
                               std::to_string(std::size_t(&p - matrices_.data())) +
                               " of " + std::to_string(p.cols));
      const std::size_t i = updater_.add_matrix(p, k);
      // this rank's block of columns (all of them in one process); a resident matrix: nothing on
      // the host, ever
      host_.add_matrix(p.rows, col_begin(i, comm_.rank() + 1) - col_begin(i, comm_.rank()), p.param_type, !resident(i));
      any_selected_ = any_selected_ || k > 0;
    }
    for (const vector_param& p : vectors_) updater_.add_vector(p);
    host_.allocate(cfg_.overlap_step);
    updater_.allocate();
    // Device-side column lists ([all columns | unselected columns] per matrix), the swap plans'
    // slot lists, and the device end of chunked transfers (the host staging area's size).
    std::size_t stage = 0, max_k = 0, widest = 0;
    for (const matrix_param& p : matrices_) widest = std::max(widest, p.cols);
    iota_.resize(widest);
    for (std::size_t c = 0; c < widest; ++c) iota_[c] = std::uint32_t(c);
    lists_dev_.resize(matrices_.size());
    for (std::size_t i = 0; i < matrices_.size(); ++i) lists_pool_.request(lists_dev_[i], 2 * matrices_[i].cols);
    lists_pool_.commit();
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const matrix_param& p = matrices_[i];
      stage = std::max(stage, host_.stage_columns(i) * p.rows * 4);
      if (!resident(i)) max_k = std::max(max_k, updater_.matrix(i).k);
      space_.upload(lists_dev_[i].data(), iota_.data(), 4 * p.cols);
      selected_.emplace_back();
      set_unselected(i);  // until the first selection every column lives on the host
    }
    dev_stage_ = typename Space::template buffer<unsigned char>(stage);
    // a swap plan's four slot lists (at most 2k entries: leaving + staying <= k, staying +
    // joining <= k) and the leaving columns' indices (<= k, for a param that is its master)
    slots_dev_ = typename Space::template buffer<std::uint32_t>(4 * max_k);
    // The offload lane's pieces: whole columns, up to 32 MiB (fewer, larger copies than the
    // stage's; a piece holds at least one column, which a stage holds too), no more than the
    // largest block a matrix can offload.
    {
      std::size_t block = 0;
      for (std::size_t i = 0; i < matrices_.size(); ++i) {
        const matrix_param& p = matrices_[i];
        block = std::max(block, std::min(p.cols - updater_.matrix(i).k, host_.matrix(i).cols) * p.rows * size_of(p.grad_type));
      }
      lane_piece_ = std::max(stage, std::min(max_lane_piece, block));
    }
    if constexpr (requires { transport_.reserve(space_, stage, lane_piece_); }) transport_.reserve(space_, stage, lane_piece_);
    else if constexpr (reservable_transport<Transport, Space>) transport_.reserve(space_, stage);
    if constexpr (ahead_transport<Transport>) {
      if (transport_.uploads_ahead()) {
        ahead_at_.assign(matrices_.size() + 1, 0);
        for (std::size_t i = 0; i < matrices_.size(); ++i) {
          const matrix_param& p = matrices_[i];
          const std::size_t most = resident(i) ? 0 : p.cols - updater_.matrix(i).k;  // a host update's columns
          ahead_at_[i + 1] = ahead_at_[i] + align_up(most * p.rows * size_of(p.param_type));
        }
        ahead_ = typename Space::template buffer<unsigned char>(ahead_at_.back());
        ahead_on_ = ahead_at_.back() > 0;
      }
    }
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      if (resident(i)) place_resident(i);
      else load_master(i);
    }
    bool all_resident = true;
    for (std::size_t i = 0; i < matrices_.size(); ++i) all_resident = all_resident && resident(i);
    if (all_resident) {  // device AdamW: no column will ever cross again
      dev_stage_ = {};
      host_.release_stage();
    }
    note_non_finite_vectors();
    updater_.load_vectors(space_);
    if constexpr (Scheduler::concurrent) {
      if (cfg_.overlap_step) {
        // Room for the unselected gradient columns of every matrix (of this rank's blocks),
        // compacted on the device so the offload can run behind the next forward/backward (the
        // grad buffers are free again).
        // Each matrix's block has a fixed place: room for the most columns it can offload once
        // the first selection is made (before it, the offload is synchronous).
        compact_offset_.assign(matrices_.size() + 1, 0);
        for (std::size_t i = 0; i < matrices_.size(); ++i) {
          const matrix_param& p = matrices_[i];
          const std::size_t most = std::min(p.cols - updater_.matrix(i).k, host_.matrix(i).cols);
          compact_offset_[i + 1] = compact_offset_[i] + align_up(most * p.rows * size_of(p.grad_type));
        }
        grad_compact_ = typename Space::template buffer<unsigned char>(compact_offset_.back());
        compacted_.create();
        async_offload_ = true;
        if constexpr (fusable_compaction) {
          // each column's place in its matrix's block (4 bytes a column; written before the first
          // fused pass after each change of the unselected lists: write_slots)
          std::size_t cols = 0;
          for (const matrix_param& p : matrices_) cols += p.cols;
          compact_slot_ = typename Space::template buffer<std::uint32_t>(cols);
          slot_scratch_.reserve(cols);  // (write_slots' host copy: no allocation in a step)
          std::vector<compaction_target> targets(matrices_.size());
          for (std::size_t i = 0, at = 0; i < matrices_.size(); at += matrices_[i].cols, ++i)
            if (!resident(i)) targets[i] = {grad_compact_.data() + compact_offset_[i], compact_slot_.data() + at};
          updater_.set_compaction(space_, targets.data());
          slots_stale_ = true;
        }
      }
    }
    if (distributed()) {  // (one rank reduces nothing: step() skips the identity)
      std::size_t n = 0;
      for (const auto& p : matrices_) n += p.rows * p.cols;
      for (const auto& p : vectors_) n += p.n;
      reduce_round_ = reduce_round_for(n, std::size_t(comm_.size()));
      // (a round of fp32; with typed_wire a round holds one dtype: the largest round of any,
      // at most that dtype's elements of its kind, in its bytes — 2 an element where the
      // gradients are 16-bit but for a few small fp32 vectors)
      std::size_t bytes = 4 * reduce_round_;
      if constexpr (typed_wire) {
        bytes = 0;
        for (dtype d : wire_dtypes) {
          const auto [scattered, reduced] = wire_elements(d);
          bytes = std::max(bytes, std::min(reduce_round_, std::max(scattered, reduced)) * size_of(d));
        }
      }
      reduce_buf_ = typename Space::template buffer<unsigned char>(bytes);
      // the host-side lists a step fills, at their sizes now: a step's own allocations would
      // fail on one rank alone, which would then miss the next collective (initialize()'s
      // failures are voted on)
      const std::size_t R = std::size_t(comm_.size());
      votes_.resize(R);
      vote_bytes_.resize(R);
      counts_.reserve(R);
      // (a round holds at most one piece of each tensor, and of each matrix at most one block of
      // whole rows, or the parts of two rows when a row is longer than the round)
      reduce_pieces_.reserve(matrices_.size() + vectors_.size());
      scatter_items_.reserve(2 * matrices_.size());
      scatter_counts_.reserve(R);
      if constexpr (sharded_reduction) {
        reserve_stats_tables(R);
        // (an updater whose pass in parts keeps a launch table: built now, for this rank's blocks)
        using range = std::pair<std::size_t, std::size_t>;
        if constexpr (requires(const range* r) { updater_.prepare_parts(space_, r); }) {
          std::vector<range> blocks(matrices_.size());
          for (std::size_t i = 0; i < matrices_.size(); ++i)
            blocks[i] = {col_begin(i, comm_.rank()), col_begin(i, comm_.rank() + 1)};
          updater_.prepare_parts(space_, blocks.data());
        }
      }
    }
    offload_blocks_.resize(matrices_.size());  // (the overlapped offload's per-matrix blocks)
    auto_a_.assign(matrices_.size(), 0.0);     // (zen-auto's window sums)
    auto_b_.assign(matrices_.size(), 0.0);
    space_.fence();
    base_to_host_ = transport_.bytes_to_host();  // the initial load is not a training step
    base_to_device_ = transport_.bytes_to_device();
    base_stall_ = scheduler_.stall_seconds();
    stall_carried_ = 0;
  }

  // What build() made, undone (initialize() failed): the optimizer as registered.
  void unbuild() {
    if constexpr (requires { space_.forget_queued_work(); }) space_.forget_queued_work();
    // (called where initialize() failed, before the ranks' vote on it: it must not throw)
    if constexpr (requires { host_.clear(); }) host_.clear();
    else host_ = HostAccumulator(cfg_.host_threads);
    updater_ = GpuUpdater{};
    grad_compact_ = {};
    compact_slot_ = {};
    compact_offset_.clear();
    dev_stage_ = {};
    slots_dev_ = {};
    compacted_ = {};
    lists_dev_.clear();
    lists_pool_ = {};
    ahead_ = {};
    ahead_at_.clear();
    ahead_on_ = false;
    if constexpr (requires { transport_.release(); }) {  // (reserved again by the next initialize())
      try {
        transport_.release();
      } catch (...) {  // (the error that failed initialize() is the one to report)
      }
    }
    async_offload_ = false;
    any_selected_ = false;
    unfit_params_.clear();
    unselected_.clear();
    selected_.clear();
    iota_.clear();
    if constexpr (data_parallel) {
      reduce_buf_ = {};
      reduce_round_ = 0;
      gather_buf_ = {};
      stats_out_ = {};
      stats_in_ = {};
    }
  }

  // A matrix whose every column is selected (topk_ratio 1: device AdamW) and that has no warm-up
  // (which runs on the host) lives on the device from the start: its selection cannot change, so
  // it is made here, once, and the host holds nothing for it.
  bool resident(std::size_t i) const noexcept {
    return updater_.matrix(i).all_selected() && cfg_.full_warm_up_rounds == 0;
  }
  // Every column selected already: a reselection could only pick them all again.
  bool fixed_selection(std::size_t i) const noexcept {
    return updater_.matrix(i).all_selected() && updater_.matrix(i).active == matrices_[i].cols;
  }
  void place_resident(std::size_t i) {
    const matrix_param& p = matrices_[i];
    auto& d = updater_.matrix(i);
    selected_[i].assign(iota_.begin(), iota_.begin() + std::ptrdiff_t(p.cols));
    set_unselected(i);
    space_.upload(d.columns[0].data(), selected_[i].data(), 4 * p.cols);
    d.cur = 0;
    d.active = p.cols;
    if (d.param_master) {  // the fp32 param is the master already: only checked
      first_non_finite(p.param, p.param_type, p.rows * p.cols, [&](std::size_t k, float x) {
        const bool by_column = p.layout == matrix_layout::column_contiguous;
        note_non_finite_matrix(i, x, by_column ? k % p.rows : k / p.cols, by_column ? k / p.rows : k % p.cols);
      });
      return;
    }
    // the master from the params, through the staging areas a chunk at a time
    std::vector<float> master;
    columns_down(i, p.param, p.param_type, all_dev(i), p.cols, [&](std::size_t c0, std::size_t m) {
      master.resize(m * p.rows);
      host::convert(host_.arena(), {host_.stage(), p.param_type, master.data(), dtype::f32}, m * p.rows);
      note_non_finite(master.data(), m * p.rows, i, c0);
      transport_.to_device(dev_stage_.data(), master.data(), 4 * m * p.rows);
      space_.move_slots(d.master[0].data() + c0 * p.rows, nullptr, dev_stage_.data(), nullptr, m, 4 * p.rows);
    });
  }

  // What stats() reports as host_bookkeeping_bytes: the records' elements (a large vector's unused
  // capacity is never touched, so not resident either), and each small per-matrix list as the heap
  // block it occupies (its capacity rounded up to 16 bytes plus an 8-byte header, at least 32:
  // glibc's malloc).
  std::uint64_t bookkeeping_bytes() const noexcept {
    auto heap = [](std::size_t bytes) -> std::uint64_t { return bytes ? std::max<std::size_t>(32, (bytes + 8 + 15) / 16 * 16) : 0; };
    auto vec = [](const auto& v) -> std::uint64_t { return v.size() * sizeof(*v.data()); };
    // (the registrations grow one at a time: what their growth freed stays with the process)
    auto grown = [](const auto& v) -> std::uint64_t { return 2 * v.capacity() * sizeof(*v.data()); };
    std::uint64_t b = grown(matrices_) + grown(vectors_) + buffers_.bytes() + vec(unselected_) + vec(selected_) +
                      vec(iota_) + vec(lists_dev_) + vec(compact_offset_) + vec(auto_a_) + vec(auto_b_);
    for (const auto& l : unselected_) b += heap(l.capacity() * 4);
    for (const auto& l : selected_) b += heap(l.capacity() * 4);
    b += heap(slot_scratch_.capacity() * 4);
    // data parallel: this rank's unselected lists, and the statistics copies' tables (3 pieces a
    // matrix and rank: host copies of what the space holds)
    b += vec(own_unselected_) + vec(own_from_);
    for (const auto& l : own_unselected_) b += heap(l.capacity() * 4);
    for (const piece_batch* pb : {&stats_out_, &stats_in_})
      b += heap(pb->pieces.capacity() * sizeof(copy_piece)) + heap(pb->last.capacity() * sizeof(copy_piece));
    // and the collectives' small tables: the step's vote, counts a rank, a round's pieces
    for (std::size_t x : {votes_.capacity() * sizeof(step_vote), vote_bytes_.capacity() * sizeof(std::size_t),
                          counts_.capacity() * sizeof(std::size_t), scatter_counts_.capacity() * sizeof(std::size_t),
                          reduce_pieces_.capacity() * sizeof(reduce_piece),
                          scatter_items_.capacity() * sizeof(scatter_item)})
      b += heap(x);
    if constexpr (requires { updater_.records_bytes(); }) b += updater_.records_bytes();
    if constexpr (requires { host_.records_bytes(); }) b += host_.records_bytes();
    return b;
  }

  // Blocks in the compaction buffer start 256-byte aligned (any element type, vector loads).
  static constexpr std::size_t align_up(std::size_t bytes) noexcept { return (bytes + 255) / 256 * 256; }

  // Sharded host state: rank r of R holds the host state (master, moments, counts, accumulators)
  // of the columns [col_begin(i, r), col_begin(i, r + 1)) of every matrix i — a contiguous block,
  // floor(cols * r / R) on — and offloads, accumulates and updates only those; one process holds
  // them all. The device side (selected columns, vectors) is replicated.
  std::size_t col_begin(std::size_t i, int r) const noexcept {
    return detail::shard_begin(matrices_[i].cols, comm_.size(), r);
  }
  // The entries of list[0, n) — ascending columns of matrix i — in rank r's block: [first, last).
  std::pair<std::size_t, std::size_t> rank_part(std::size_t i, const std::uint32_t* list, std::size_t n, int r) const {
    const std::uint32_t* from = std::lower_bound(list, list + n, col_begin(i, r));
    return {std::size_t(from - list), std::size_t(std::lower_bound(from, list + n, col_begin(i, r + 1)) - list)};
  }
  // The host side's view of matrix i's unselected columns: this rank's, as host-state indices;
  // on the device, the same columns' part of the unselected list.
  const std::uint32_t* host_unselected(std::size_t i) const noexcept {
    if constexpr (data_parallel) return own_unselected_[i].data();
    else return unselected_[i].data();
  }
  std::size_t host_unselected_count(std::size_t i) const noexcept {
    if constexpr (data_parallel) return own_unselected_[i].size();
    else return unselected_[i].size();
  }
  const std::uint32_t* host_unselected_dev(std::size_t i) const noexcept {
    if constexpr (data_parallel) return unselected_dev(i) + own_from_[i];
    else return unselected_dev(i);
  }
  // Data parallel: every rank's part of list[0, n) — sorted columns of matrix i; a rank's part is
  // the entries in its block — `per_col` bytes an entry, laid out entry after entry from base
  // (rank r's part at its place in the list), gathered onto every rank. base is the space's
  // device memory, where the communicator works. `count`: traffic of a step
  // (stats().bytes_gathered), not of an inspection.
  void gather_list(std::size_t i, const std::uint32_t* list, std::size_t n, void* base, std::size_t per_col,
                   bool count) {
    if constexpr (data_parallel) {
      list_counts(i, list, n, per_col);
      comm_.all_gather(base, counts_.data());
      if (count) gathered_ += std::uint64_t(comm_.size() - 1) * counts_[std::size_t(comm_.rank())];
    }
  }
  // The same into host memory (inspection and checkpoints).
  void gather_list_host(std::size_t i, const std::uint32_t* list, std::size_t n, void* base, std::size_t per_col) {
    if constexpr (data_parallel) {
      list_counts(i, list, n, per_col);
      all_gather_host(base, counts_.data());
    }
  }
  // Every rank's block of matrix i's columns (all of its host state's columns), laid out from
  // base in host memory.
  void gather_blocks_host(std::size_t i, void* base, std::size_t per_col) {
    gather_list_host(i, iota_.data(), matrices_[i].cols, base, per_col);
  }
  // counts_[r]: the bytes of rank r's part of list[0, n).
  void list_counts(std::size_t i, const std::uint32_t* list, std::size_t n, std::size_t per_col) {
    const int R = comm_.size();
    counts_.resize(std::size_t(R));
    for (int r = 0; r < R; ++r) {
      const auto [from, to] = rank_part(i, list, n, r);
      counts_[std::size_t(r)] = (to - from) * per_col;
    }
  }
  // Communicator::all_gather on host memory: in place when the communicator works on the host
  // space, else through the gather space in the space's device memory (this rank's block up,
  // every block down).
  static constexpr bool gathers_in_place = [] {
    if constexpr (data_parallel) return std::is_same_v<typename Communicator::space, host_space>;
    else return true;  // (single_process names no space, and gathers nothing)
  }();
  // What an all_gather_host of `total` bytes allocates, got ahead (where nothing may fail later).
  void reserve_gather_host(std::size_t total) {
    if constexpr (!gathers_in_place) (void)gather_space(total);
  }
  void all_gather_host(void* data, const std::size_t* bytes) {
    if constexpr (data_parallel) {
      if constexpr (gathers_in_place) {
        comm_.all_gather(data, bytes);
      } else {
        const std::size_t rank = std::size_t(comm_.rank());
        std::size_t total = 0, mine = 0;
        for (std::size_t r = 0; r < std::size_t(comm_.size()); ++r) {
          if (r == rank) mine = total;
          total += bytes[r];
        }
        auto* at = static_cast<unsigned char*>(data);
        unsigned char* all = gather_space(total);
        space_.upload(all + mine, at + mine, bytes[rank]);
        comm_.all_gather(all, bytes);
        space_.download(at, all, total);
      }
    }
  }
  // More than one rank: the optimizer's collectives run.
  bool distributed() const noexcept {
    if constexpr (data_parallel) return comm_.size() > 1;
    else return false;
  }

  // Whether the transport uploads a host update's params ahead (compared across the ranks).
  bool uploads_ahead_set() const noexcept {
    if constexpr (ahead_transport<Transport>) return transport_.uploads_ahead();
    else return false;
  }
  // A digest of this optimizer's type — its space and every policy — so that ranks built from
  // different policies (another Selector picks other columns, and the swaps' gathers would meet
  // with other counts; another updater or accumulator drifts apart) refuse initialize()
  // together. The type's name as the C++ runtime gives it (the same for GCC and Clang); 0, not
  // compared, in a build without RTTI.
  static std::uint64_t type_digest() noexcept {
#if defined(__cpp_rtti) || defined(__GXX_RTTI)
    const char* name = typeid(optimizer).name();
    return ckpt::fnv1a64(reinterpret_cast<const unsigned char*>(name), std::strlen(name));
#else
    return 0;
#endif
  }
  // initialize()'s comparison of the ranks (see there): each rank's config (as a checkpoint
  // writes it, host_threads zeroed), its tensor counts and a digest of its registrations are
  // gathered onto every rank; where the digests differ, the registrations themselves are
  // gathered next, to name the tensor. Every rank sees the same bytes, so every rank reaches the
  // same verdict (and the same collectives). Its bytes are not a step's: not in bytes_reduced.
  void check_ranks_match() {
    using ckpt_io = detail::optimizer_checkpoint<optimizer>;
    const std::size_t R = std::size_t(comm_.size()), me = std::size_t(comm_.rank());
    const std::uint64_t sent_before = comm_.bytes_sent();
    // this rank's part, written where it may fail alone (allocations), voted on before the gather
    std::vector<unsigned char> all;
    std::size_t per = 0, csize = 0;
    ckpt::writer conf, tensors;
    on_every_rank([&] {
      config mine = cfg_;
      mine.host_threads = 0;  // a rank's own resources
      ckpt_io::write_config(conf, mine);
      for (const matrix_param& p : matrices_) {
        tensors.put<std::uint64_t>(p.rows);
        tensors.put<std::uint64_t>(p.cols);
        for (dtype t : {p.param_type, p.grad_type}) tensors.put<std::uint8_t>(std::uint8_t(t));
        tensors.put<std::uint8_t>(std::uint8_t(p.layout));
        tensors.put(p.lr_scale);
        tensors.put(p.weight_decay_scale);
      }
      for (const vector_param& p : vectors_) {
        tensors.put<std::uint64_t>(p.n);
        for (dtype t : {p.param_type, p.grad_type}) tensors.put<std::uint8_t>(std::uint8_t(t));
        tensors.put(p.lr_scale);
        tensors.put(p.weight_decay_scale);
      }
      csize = conf.data().size();
      per = csize + 56;
      all.resize(per * R);
      {
        unsigned char* at = all.data() + per * me;
        std::memcpy(at, conf.data().data(), csize);
        // (and how the communicator reduces: its largest round, whether the matrices' gradients
        // are reduce-scattered and whether in their own dtype — a rank built with another
        // communicator type would cut the reduction differently and meet the others' collectives
        // with other sizes; and
        // whether the transport uploads ahead: a boundary then gathers other things; and the
        // optimizer's type)
        const std::uint64_t tail[7] = {matrices_.size(), vectors_.size(),
                                       ckpt::fnv1a64(tensors.data().data(), tensors.data().size()), reduce_round(),
                                       (sharded_reduction ? 1u : 0u) | (typed_wire ? 2u : 0u),
                                       uploads_ahead_set() ? 1u : 0u, type_digest()};
        std::memcpy(at + csize, tail, sizeof tail);
      }
      counts_.assign(R, per);
    }, [] {
      return std::string("zenflow: initialize(): another rank could not write its part of the ranks' comparison (it "
                         "threw its error); nothing was built on this rank either");
    });
    all_gather_host(all.data(), counts_.data());
    auto rank_bytes = [&](std::size_t r) { return all.data() + per * r; };
    std::size_t odd = 0;  // the first rank unlike rank 0
    for (std::size_t r = 1; r < R && !odd; ++r)
      if (std::memcmp(rank_bytes(r), rank_bytes(0), per) != 0) odd = r;
    const std::string them = "rank " + std::to_string(odd);
    if (odd && std::memcmp(rank_bytes(odd), rank_bytes(0), csize) != 0) {
      auto read = [&](std::size_t r) {
        ckpt::reader in(rank_bytes(r), csize, "config");
        return ckpt_io::read_config(in);
      };
      const config theirs = read(odd), first = read(0);
      std::string what;
      ckpt_io::compare_config(first, theirs, [&](const std::string& m) { if (what.empty()) what = m; },
                              "on " + them, "on rank 0");
      if (what.empty() && !(theirs.adam.lr == first.adam.lr))
        what = "config differs: lr is " + detail::exact(theirs.adam.lr) + " on " + them + ", " +
               detail::exact(first.adam.lr) + " on rank 0";
      if (what.empty())  // (every value compares equal, the bytes do not: -0 against 0, or the unused step
                         // count of an automatic interval)
        what = "config differs in its bytes on " + them + " though every value compares equal: a -0 where the "
               "other has 0, or an automatic interval's unused steps; the ranks compare their configs bit for bit";
      throw config_error("zenflow: initialize(): the ranks' configs differ (" + what +
                         "); every rank needs the same config, host_threads aside");
    }
    std::uint64_t tail[2][7];
    if (odd) {
      std::memcpy(tail[0], rank_bytes(0) + csize, sizeof tail[0]);
      std::memcpy(tail[1], rank_bytes(odd) + csize, sizeof tail[1]);
      if (tail[0][5] != tail[1][5]) {
        fail("initialize(): the ranks' transports differ: " + them + (tail[1][5] ? " uploads ahead, rank 0 does not"
                                                                                : " does not upload ahead, rank 0 does") +
             "; every rank needs the same upload_ahead() setting");
      }
      if (tail[0][4] != tail[1][4]) {
        auto how = [](std::uint64_t v) {
          return std::string(v & 1 ? "reduce-scatters" : "all-reduces") + " the matrices' gradients" +
                 (v & 2 ? " in their own dtypes" : " in fp32");
        };
        fail("initialize(): the ranks' communicators differ: the one on " + them + " " + how(tail[1][4]) +
             ", the one on rank 0 " + how(tail[0][4]) + "; every rank needs the same communicator type");
      }
      if (tail[0][3] != tail[1][3])
        fail("initialize(): the ranks' communicators reduce in rounds of at most " + std::to_string(tail[1][3]) +
             " elements on " + them + ", " + std::to_string(tail[0][3]) +
             " on rank 0 (reduce_round); every rank needs the same communicator type");
      if (tail[0][6] != tail[1][6] && tail[0][6] != 0 && tail[1][6] != 0)  // (0: built without RTTI)
        fail("initialize(): the ranks' optimizers are of different types (" + them +
             "'s space or policies differ from rank 0's: a digest of the type's name); every rank needs the same "
             "optimizer<...> type");
      if (tail[0][0] != tail[1][0] || tail[0][1] != tail[1][1])
        fail("initialize(): the ranks registered different tensors: " + them + " " + std::to_string(tail[1][0]) +
             " matrices and " + std::to_string(tail[1][1]) + " vectors, rank 0 " + std::to_string(tail[0][0]) +
             " and " + std::to_string(tail[0][1]));
      // Same counts, so the registrations have the same size on every rank: gathered to name the
      // first tensor that differs.
      const std::size_t tsize = tensors.data().size();
      std::vector<unsigned char> regs;
      on_every_rank(
          [&] {
            regs.resize(tsize * R);
            std::memcpy(regs.data() + tsize * me, tensors.data().data(), tsize);
            counts_.assign(R, tsize);
          },
          [] {
            return std::string("zenflow: initialize(): another rank could not allocate the ranks' registrations (it "
                               "threw its error); nothing was built on this rank either");
          });
      all_gather_host(regs.data(), counts_.data());
      const unsigned char* a = regs.data();
      const unsigned char* b = regs.data() + tsize * odd;
      const std::size_t per_matrix = registration_bytes(true), per_vector = registration_bytes(false);
      std::string which = "a tensor";
      for (std::size_t i = 0; i < matrices_.size(); ++i)
        if (std::memcmp(a + per_matrix * i, b + per_matrix * i, per_matrix) != 0) {
          which = "matrix " + std::to_string(i) + ": " + describe_matrix(b + per_matrix * i) + " on " + them + ", " +
                  describe_matrix(a + per_matrix * i) + " on rank 0";
          break;
        }
      const std::size_t v0 = per_matrix * matrices_.size();
      for (std::size_t i = 0; i < vectors_.size() && which == "a tensor"; ++i)
        if (std::memcmp(a + v0 + per_vector * i, b + v0 + per_vector * i, per_vector) != 0)
          which = "vector " + std::to_string(i) + ": " + describe_vector(b + v0 + per_vector * i) + " on " + them +
                  ", " + describe_vector(a + v0 + per_vector * i) + " on rank 0";
      fail("initialize(): the ranks registered different tensors (" + which +
           "); every rank registers the same tensors in the same order");
    }
    setup_sent_ += comm_.bytes_sent() - sent_before;
  }
  // One registration as check_ranks_match gathers it (read back in the order written), in words.
  static std::string describe_matrix(const unsigned char* p) {
    ckpt::reader r(p, registration_bytes(true), "registration");
    const auto rows = r.get<std::uint64_t>(), cols = r.get<std::uint64_t>();
    std::string s = std::to_string(rows) + " x " + std::to_string(cols) + ", " + describe_types(r);
    s += r.get<std::uint8_t>() == std::uint8_t(matrix_layout::row_major) ? ", row-major" : ", column-contiguous";
    return s + describe_scales(r);
  }
  static std::string describe_vector(const unsigned char* p) {
    ckpt::reader r(p, registration_bytes(false), "registration");
    const std::string n = std::to_string(r.get<std::uint64_t>());
    const std::string types = describe_types(r);
    return n + " elements, " + types + describe_scales(r);
  }
  static std::string describe_types(ckpt::reader& r) {
    const dtype param = dtype(r.get<std::uint8_t>()), grad = dtype(r.get<std::uint8_t>());
    return std::string(name_of(param)) + " params, " + std::string(name_of(grad)) + " grads";
  }
  static std::string describe_scales(ckpt::reader& r) {
    const float lr = r.get<float>(), wd = r.get<float>();
    return ", lr_scale " + detail::exact(lr) + ", weight_decay_scale " + detail::exact(wd);
  }
  // A matrix's registration: rows, cols (8 bytes each), two dtypes and a layout (1 each), two
  // scales (4 each); a vector's: n, two dtypes, two scales.
  static constexpr std::size_t registration_bytes(bool matrix) noexcept { return matrix ? 8 + 8 + 3 + 8 : 8 + 2 + 8; }

  // At least `bytes` of the space's device memory for a collective (contents not kept).
  // Grown where a collective needs more: every rank asks for the same size at the same point
  // (the sizes come from replicated state), so the ranks grow together, and vote on it: a rank
  // that cannot allocate throws its error and the others throw too, instead of waiting in the
  // collective it never joins. (Mid-step, the step's guard then stops every rank alike.)
  unsigned char* gather_space(std::size_t bytes) {
    if (gather_buf_.size() < bytes) {
      if (gather_buf_.size()) space_.fence();  // the device may still read the old one
      gather_buf_ = {};
      on_every_rank([&] { gather_buf_ = typename Space::template buffer<unsigned char>(bytes); },
                    [&] {
                      return "zenflow: another rank could not allocate " + std::to_string(bytes) +
                             " bytes for the ranks' gather space (it threw its error)";
                    },
                    // (dropped where it was allocated too: the sizes stay the same on every rank,
                    // and the next growth comes at one point)
                    [&] { gather_buf_ = {}; });
    }
    return gather_buf_.data();
  }

  const std::uint32_t* all_dev(std::size_t i) const noexcept { return lists_dev_[i].data(); }
  const std::uint32_t* unselected_dev(std::size_t i) const noexcept { return lists_dev_[i].data() + matrices_[i].cols; }

  // The unselected list of matrix i from its selected list, on the host and on the device.
  void set_unselected(std::size_t i) {
    if (unselected_.size() <= i) unselected_.resize(i + 1);
    const auto& sel = selected_[i];
    auto& un = unselected_[i];
    un.clear();
    for (std::size_t c = 0, j = 0; c < matrices_[i].cols; ++c) {
      if (j < sel.size() && sel[j] == c) ++j;
      else un.push_back(std::uint32_t(c));
    }
    if (!un.empty()) space_.upload(lists_dev_[i].data() + matrices_[i].cols, un.data(), 4 * un.size());
    if constexpr (data_parallel) {
      if (own_unselected_.size() <= i) {
        own_unselected_.resize(i + 1);
        own_from_.resize(i + 1);
      }
      const std::uint32_t c0 = std::uint32_t(col_begin(i, comm_.rank()));
      const auto [from, to] = rank_part(i, un.data(), un.size(), comm_.rank());
      own_from_[i] = from;
      auto& own = own_unselected_[i];
      own.clear();
      for (std::size_t k = from; k < to; ++k) own.push_back(un[k] - c0);
    }
    slots_stale_ = true;
  }
  // The fused compaction's place tables, every matrix's in one upload (a selection changes
  // them all): host_unselected's k-th column of matrix i (in the device's numbering) to place k
  // of the matrix's block, every other column nowhere.
  void write_slots() {
    slot_scratch_.assign(compact_slot_.size(), no_slot);
    for (std::size_t i = 0, at = 0; i < matrices_.size(); at += matrices_[i].cols, ++i) {
      const std::uint32_t* list = host_unselected(i);
      const std::size_t c0 = at + col_begin(i, comm_.rank());
      for (std::size_t k = 0, n = host_unselected_count(i); k < n; ++k) slot_scratch_[c0 + list[k]] = std::uint32_t(k);
    }
    space_.upload(compact_slot_.data(), slot_scratch_.data(), 4 * slot_scratch_.size());
    slots_stale_ = false;
  }

  template <class T>
  std::vector<T> download(const T* src, std::size_t n) {
    std::vector<T> out(n);
    if (n) space_.download(out.data(), src, n * sizeof(T));
    return out;
  }

  // Columns list[0..n) of a device matrix to the host staging area, chunk by chunk (compacted on
  // the device, then one transfer each); then(c0, m) consumes columns [c0, c0+m) of the list.
  template <class Then>
  void columns_down(std::size_t i, const void* src, dtype t, const std::uint32_t* list_dev, std::size_t n, Then then) {
    const matrix_param& p = matrices_[i];
    const std::size_t chunk = host_.stage_columns(i), es = size_of(t);
    for (std::size_t c0 = 0; c0 < n; c0 += chunk) {
      const std::size_t m = std::min(chunk, n - c0);
      space_.compact_columns(src, t, p.layout, p.rows, p.cols, list_dev + c0, m, dev_stage_.data());
      transport_.to_host(host_.stage(), dev_stage_.data(), m * p.rows * es);
      then(c0, m);
    }
  }

  // Host master of matrix i (this rank's block) from its device params.
  void load_master(std::size_t i) {
    const matrix_param& p = matrices_[i];
    float* master = host_.matrix(i).master.data();
    const std::size_t first = col_begin(i, comm_.rank());
    columns_down(i, p.param, p.param_type, all_dev(i) + first, host_.matrix(i).cols,
                 [&](std::size_t c0, std::size_t m) {
      host::convert(host_.arena(), {host_.stage(), p.param_type, master + c0 * p.rows, dtype::f32}, m * p.rows);
      note_non_finite(master + c0 * p.rows, m * p.rows, i, first + c0);
    });
  }

  // initialize() takes each master from its param. One that is not finite (a NaN, an infinity:
  // garbage in the buffer, or a 16-bit value past its range) is noted, naming where, and step()
  // refuses to train it until a load replaces the masters (a resume may well initialize() over
  // params that hold nothing yet and load() after): it would never become finite again, and no
  // checkpoint of it could be saved or loaded. `x`: the fp32 values of matrix i's columns from
  // `col` on, column by column (rows values each), in host memory (scanned on the host threads).
  void note_non_finite(const float* x, std::size_t count, std::size_t i, std::size_t col) {
    if (!unfit_params_.empty()) return;  // (the first one found is the one reported)
    const std::size_t k = host_space::first_non_finite(host_.arena(), x, count);
    if (k < count) note_non_finite_matrix(i, x[k], k % matrices_[i].rows, col + k / matrices_[i].rows);
  }
  void note_non_finite_matrix(std::size_t i, float x, std::size_t row, std::size_t col) {
    unfit_params_ = "matrix " + std::to_string(i) + "'s param held " + detail::exact(x) + " at row " +
                    std::to_string(row) + ", column " + std::to_string(col);
  }
  // A param buffer of the space (n values of dtype t): found(k, value) for its first value that
  // is not finite, if any. The space scans it where it lies (cuda_space: a pass on the device, 8
  // bytes back); a space without first_non_finite() has it read back a piece at a time.
  template <class Found>
  void first_non_finite(const void* src, dtype t, std::size_t n, Found found) {
    if (!unfit_params_.empty() || n == 0) return;
    visit_dtype(t, [&](auto tag) {
      using P = typename decltype(tag)::type;
      P value;
      std::size_t k = n;
      if constexpr (requires { { space_.first_non_finite(src, t, n) } -> std::convertible_to<std::size_t>; }) {
        k = space_.first_non_finite(src, t, n);
        if (k < n) space_.download(&value, static_cast<const P*>(src) + k, sizeof(P));
      } else {
        constexpr std::size_t most = std::size_t(1) << 20;  // values a piece
        std::vector<P> piece(std::min(most, n));
        for (std::size_t e0 = 0; e0 < n && k == n; e0 += most) {
          const std::size_t m = std::min(most, n - e0);
          space_.download(piece.data(), static_cast<const P*>(src) + e0, m * sizeof(P));
          const std::size_t at = detail::first_non_finite_in(piece.data(), 0, m);
          if (at < m) k = e0 + at, value = piece[at];
        }
      }
      if (k < n) found(k, static_cast<float>(value));
    });
  }
  void note_non_finite_vectors() {
    for (std::size_t v = 0; v < vectors_.size(); ++v)
      first_non_finite(vectors_[v].param, vectors_[v].param_type, vectors_[v].n, [&](std::size_t k, float x) {
        unfit_params_ = "vector " + std::to_string(v) + "'s param held " + detail::exact(x) + " at element " +
                        std::to_string(k);
      });
  }
  // step()'s refusal of such a state, before anything changes
  void check_fit_params() const {
    if (unfit_params_.empty()) return;
    fail("step() refused: " + unfit_params_ +
         " at initialize(), and no checkpoint was loaded since: only finite params can be trained (a master taken "
         "from it would never become finite again, and no checkpoint of it could be saved); load a checkpoint, or "
         "register finite params with a new optimizer. Nothing was changed");
  }

  // Raw gradient columns list[0..n) of matrix i -> acc[which] += raw * factor.
  void gather_grad(std::size_t i, int which, const std::uint32_t* list, const std::uint32_t* list_dev, std::size_t n,
                   float factor) {
    const matrix_param& p = matrices_[i];
    columns_down(i, p.grad, p.grad_type, list_dev, n, [&](std::size_t c0, std::size_t m) {
      host_.accumulate(i, which, p.grad_type, list + c0, m, factor);
    });
  }

  // Warm-up: plain ZeRO-Offload. Every column crosses, gets a host AdamW with this step's g
  // (accumulated into the empty accumulator: 0 + raw*factor is exactly g) and is uploaded.
  void warm_up(float factor) {
    // The host AdamW is timed, as the boundary job times it (host_update_seconds), and the step
    // waits for it inline, as ZeRO-Offload's synchronous update (stall_seconds): the same region
    // in both, not the transfers around it, which neither path counts.
    std::chrono::steady_clock::duration dt{};
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      // every column of this rank's block: host-state indices iota_[0, n), from column c0
      const std::size_t c0 = col_begin(i, comm_.rank()), n = host_.matrix(i).cols;
      gather_grad(i, active_acc_, iota_.data(), all_dev(i) + c0, n, factor);
      const auto t0 = std::chrono::steady_clock::now();
      host_.update(i, active_acc_, iota_.data(), n, 1.0f, matrix_hyper(i, cfg_.adam));
      dt += std::chrono::steady_clock::now() - t0;
      publish(i, iota_.data(), all_dev(i) + c0, n, iota_.data(), all_dev(i), matrices_[i].cols);
    }
    host_ns_ += std::uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count());
    stall_carried_ += std::chrono::duration<double>(dt).count();
    if (!matrices_.empty()) ++host_updates_;  // a pass that updated columns (see stats().host_updates)
  }

  void offload(float factor) {
    for (std::size_t i = 0; i < matrices_.size(); ++i)
      gather_grad(i, active_acc_, host_unselected(i), host_unselected_dev(i), host_unselected_count(i), factor);
  }

  // Whether every matrix's unselected columns (this rank's) fit its block of the compaction
  // buffer: always, once a first selection has been made (and from the start where no matrix
  // selects a column).
  bool compact_fits() const noexcept {
    for (std::size_t i = 0; i < matrices_.size(); ++i)
      if (host_unselected_count(i) * matrices_[i].rows * size_of(matrices_[i].grad_type) >
          compact_offset_[i + 1] - compact_offset_[i])
        return false;
    return true;
  }
  // The same offload behind the device: the unselected columns are compacted on the device now
  // (the trainer may overwrite its grad buffers once the device has passed this point); their
  // transfer and accumulation run on the scheduler's offload lane, one step in flight, starting
  // when the device reaches the recorded event. The accumulation is the same calls in the same
  // order as offload(), so results are identical. `compacted`: the gradient pass did the
  // compaction already (fuse_compaction).
  void offload_async(float factor, bool compacted) {
    // the previous step's transfer still reads the compaction buffer (when compacted, the lane
    // was idle before the pass: this only reports what its job threw)
    scheduler_.wait_offload();
    if (!compact_fits()) return offload(factor);  // only before a first selection
    std::uint64_t job_bytes = 0;
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const matrix_param& p = matrices_[i];
      const std::size_t n = host_unselected_count(i);
      if (!compacted)
        space_.compact_columns(p.grad, p.grad_type, p.layout, p.rows, p.cols, host_unselected_dev(i), n,
                               grad_compact_.data() + compact_offset_[i]);
      job_bytes += n * p.rows * size_of(p.grad_type);
    }
    if (!compacted) space_.record(compacted_);
    // stats() counts this step's bytes now, not when the lane gets to them: the only device-to-
    // host traffic while the job runs is the job's own (the lane was idle above; selections and
    // saves wait for it first), so the transport's count will reach exactly this.
    owed_to_host_ = transport_.bytes_to_host() + job_bytes;
    const int which = active_acc_;
    // each matrix's block in pieces of whole columns, up to the lane piece
    offload_blocks_.resize(matrices_.size());
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const std::size_t col_bytes = matrices_[i].rows * size_of(matrices_[i].grad_type);
      offload_blocks_[i] = {grad_compact_.data() + compact_offset_[i], host_unselected_count(i) * col_bytes,
                            std::max<std::size_t>(1, lane_piece_ / col_bytes) * col_bytes};
    }
    scheduler_.launch_offload([this, which, factor] {
      auto consume = [&](std::size_t i, const void* piece, std::size_t off, std::size_t len) {
        const matrix_param& p = matrices_[i];
        const std::size_t col_bytes = p.rows * size_of(p.grad_type);
        host_.accumulate_from(piece, i, which, p.grad_type, host_unselected(i) + off / col_bytes, len / col_bytes,
                              factor);
      };
      if constexpr (block_streaming_transport<Transport, Space>) {
        transport_.stream_blocks_to_host(compacted_, offload_blocks_.data(), offload_blocks_.size(), consume);
      } else {
        for (std::size_t i = 0; i < offload_blocks_.size(); ++i) {
          const offload_block& b = offload_blocks_[i];
          transport_.stream_to_host(compacted_, b.src, b.bytes, b.piece,
                                    [&](const void* piece, std::size_t off, std::size_t len) { consume(i, piece, off, len); });
        }
      }
    });
  }

  // Every background job finished (nothing applied).
  // Both lanes idle on return, even when one of them failed (the first error is rethrown once
  // both have been waited for): the destructor and load() rely on no job still running.
  void quiesce() {
    guarded([&] {
      std::exception_ptr first;
      try {
        scheduler_.wait_offload();
      } catch (...) {
        first = std::current_exception();
      }
      try {
        scheduler_.wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
      if (first) std::rethrow_exception(first);
    });
  }

  // The params of host-state columns list[0, m) of matrix i (at most a stage of them), rounded
  // from the master, to `dst` on the device: staged straight in the transport's buffer where it
  // has one to fill (pinned memory on a GPU: one host copy fewer), else through the host stage.
  void stage_up(std::size_t i, const std::uint32_t* list, std::size_t m, void* dst) {
    const std::size_t bytes = m * matrices_[i].rows * size_of(matrices_[i].param_type);
    if constexpr (filling_transport<Transport>) {
      transport_.fill_to_device(dst, bytes, [&](void* staging) { host_.stage_params(i, list, m, staging); });
    } else {
      host_.stage_params(i, list, m, host_.stage());
      transport_.to_device(dst, host_.stage(), bytes);
    }
  }
  // The host's params of columns list[0..n) of matrix i into the device params: rounded from the
  // master into the staging area, one transfer per chunk, scattered on the device.
  void upload(std::size_t i, const std::uint32_t* list, const std::uint32_t* list_dev, std::size_t n) {
    const matrix_param& p = matrices_[i];
    const std::size_t chunk = host_.stage_columns(i);
    for (std::size_t c0 = 0; c0 < n; c0 += chunk) {
      const std::size_t m = std::min(chunk, n - c0);
      stage_up(i, list + c0, m, dev_stage_.data());
      space_.scatter_columns(dev_stage_.data(), p.param_type, p.param, p.layout, p.rows, p.cols, list_dev + c0, m);
    }
  }
  // Makes the params of the columns list[0, n) of matrix i (sorted; list_dev on the device)
  // current on the device from the host state: this rank uploads its part (host-state indices
  // local[0, n_own), own_dev on the device) — in one process, all of them. Data parallel, each
  // rank's part goes into its place in the gather space instead, and every rank's part is
  // gathered there (as a device-side all-gather would) and scattered into the params. (One
  // rank's part is the whole list: uploaded as in one process.)
  void publish(std::size_t i, const std::uint32_t* local, const std::uint32_t* own_dev, std::size_t n_own,
               const std::uint32_t* list, const std::uint32_t* list_dev, std::size_t n) {
    if constexpr (!data_parallel) {
      upload(i, local, own_dev, n_own);
    } else if (!distributed()) {
      upload(i, local, own_dev, n_own);
    } else {
      if (n == 0) return;
      const matrix_param& p = matrices_[i];
      const std::size_t chunk = host_.stage_columns(i), cb = p.rows * size_of(p.param_type);
      unsigned char* all = gather_space(n * cb) + std::size_t(own_dev - list_dev) * cb;
      for (std::size_t c0 = 0; c0 < n_own; c0 += chunk) {
        const std::size_t m = std::min(chunk, n_own - c0);
        stage_up(i, local + c0, m, all + c0 * cb);
      }
      gather_list(i, list, n, gather_buf_.data(), cb, true);
      space_.scatter_columns(gather_buf_.data(), p.param_type, p.param, p.layout, p.rows, p.cols, list_dev, n);
    }
  }

  // End of a window: host AdamW on every unselected column with the window mean (or sum).
  void boundary() {
    const float div = cfg_.host_gradient == window_gradient::sum ? 1.0f : float(window_steps_);
    const adamw_hyper hyper = cfg_.adam;
    const int which = active_acc_;
    const bool ahead = ahead_fits();
    auto job = [this, which, div, hyper, ahead] {
      // this window's last accumulation; if that offload failed, its error fails the training
      // thread's next step, and this update is not applied to a window short of it
      if (async_offload_ && !scheduler_.wait_offload_quiet()) return;
      const auto t0 = std::chrono::steady_clock::now();
      if constexpr (ahead_transport<Transport>)
        if (ahead) transport_.ahead_begin();
      for (std::size_t i = 0; i < matrices_.size(); ++i) {
        host_.update(i, which, host_unselected(i), host_unselected_count(i), div, matrix_hyper(i, hyper));
        if (ahead) upload_ahead(i);  // (its copies overlap the next matrix's update)
      }
      if constexpr (ahead_transport<Transport>)
        if (ahead) {
          transport_.ahead_done();
          ahead_filled_ = true;
        }
      const auto dt = std::chrono::steady_clock::now() - t0;
      host_ns_ += std::uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count());
    };
    if (cfg_.overlap_step) {
      drain();  // the previous window's update lands now, before this one starts
      active_acc_ ^= 1;
    }
    // (voted: the launch allocates, and a drain's vote may come next)
    step_part([&] { scheduler_.launch(job); });
    pending_ = true;
    if (std::any_of(unselected_.begin(), unselected_.end(), [](const auto& un) { return !un.empty(); }))
      ++host_updates_;  // a pass that updates at least one column: device AdamW counts none
    if (!cfg_.overlap_step) drain();
    window_steps_ = 0;
    auto_a_.assign(matrices_.size(), 0.0);
    auto_b_.assign(matrices_.size(), 0.0);
  }

  // Waits for the host update in flight, if any, and uploads the columns it changed (or, when
  // its job uploaded them ahead, applies them from the device area).
  // Data parallel, the ranks vote on the wait first: a host update that failed on one rank
  // throws on every rank (each then stops: the step fails midway), rather than leave the others
  // in the collectives that publish it. (drain runs at the same point on every rank.)
  void drain() {
    on_every_rank([&] { scheduler_.wait(); },
                  [] { return std::string("zenflow: the host update failed on another rank (which threw its error)"); });
    if (!pending_) return;
    if (ahead_filled_) {
      apply_ahead();
    } else {
      for (std::size_t i = 0; i < matrices_.size(); ++i)
        publish(i, host_unselected(i), host_unselected_dev(i), host_unselected_count(i), unselected_[i].data(),
                unselected_dev(i), unselected_[i].size());
    }
    pending_ = false;
  }

  // Uploads ahead: does every matrix's unselected list fit its part of the area? (Always, once
  // the first selection has given each matrix its k columns; checked all the same.)
  bool ahead_fits() const noexcept {
    if (!ahead_on_) return false;
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const matrix_param& p = matrices_[i];
      if (unselected_[i].size() * p.rows * size_of(p.param_type) > ahead_at_[i + 1] - ahead_at_[i]) return false;
    }
    return true;
  }
  // On the update lane, right after matrix i's host AdamW: its updated params, rounded from the
  // master straight into the transport's (pinned) buffers, go to this rank's place in the area.
  void upload_ahead(std::size_t i) {
    if constexpr (ahead_transport<Transport>) {
      const std::size_t n = host_unselected_count(i);
      if (n == 0) return;
      const matrix_param& p = matrices_[i];
      const std::size_t cb = p.rows * size_of(p.param_type), per = transport_.ahead_piece() / cb;
      if (per == 0) throw std::logic_error("zenflow: the transport's upload piece holds no column");
      unsigned char* base = ahead_.data() + ahead_at_[i] + std::size_t(host_unselected_dev(i) - unselected_dev(i)) * cb;
      const std::uint32_t* list = host_unselected(i);
      for (std::size_t c0 = 0; c0 < n; c0 += per) {
        const std::size_t m = std::min(per, n - c0);
        transport_.fill_ahead(base + c0 * cb, m * cb, [&](void* staging) { host_.stage_params(i, list + c0, m, staging); });
      }
    }
  }
  // The boundary's part when the job uploaded ahead: the compute stream waits for its copies (the
  // host does not), every rank's part is gathered (data parallel), one scatter per matrix.
  void apply_ahead() {
    if constexpr (ahead_transport<Transport>) {
      transport_.await_ahead();
      std::size_t bytes = 0;
      for (std::size_t i = 0; i < matrices_.size(); ++i) {
        const auto& un = unselected_[i];
        if (un.empty()) continue;
        const matrix_param& p = matrices_[i];
        const std::size_t cb = p.rows * size_of(p.param_type);
        unsigned char* area = ahead_.data() + ahead_at_[i];
        gather_list(i, un.data(), un.size(), area, cb, true);
        space_.scatter_columns(area, p.param_type, p.param, p.layout, p.rows, p.cols, unselected_dev(i), un.size());
        bytes += host_unselected_count(i) * cb;
      }
      transport_.ahead_consumed();
      transport_.account_to_device(bytes);
      ahead_bytes_ += bytes;
    }
    ahead_filled_ = false;
  }

  // Zen-auto: per matrix with 0 < k < cols, A = mean over the window of (selected L1 mass / k),
  // B = sum over the window of (unselected L1 mass / (cols - k)); the matrix needs an update when
  // B >= A. A boundary when at least auto_ratio of the eligible matrices need one (or none is
  // eligible). Is this step a boundary?
  bool auto_boundary(float factor) {
    if (auto_a_.size() != matrices_.size()) {
      auto_a_.assign(matrices_.size(), 0.0);
      auto_b_.assign(matrices_.size(), 0.0);
    }
    constexpr bool device_masses = requires { updater_.masses(space_, std::size_t{}); };
    if constexpr (!device_masses) updater_.fetch_scores(space_, score_kind::l1);
    std::size_t eligible = 0, needing = 0;
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const std::size_t k = selected_[i].size(), cols = matrices_[i].cols;
      if (k == 0 || k == cols) continue;
      double sel = 0, all = 0;
      if constexpr (device_masses) {  // computed by the updater after this step's selection
        std::tie(sel, all) = updater_.masses(space_, i);
      } else {
        const double* l1 = updater_.scores(i, score_kind::l1);
        for (std::size_t s = 0; s < k; ++s) sel += l1[selected_[i][s]];
        for (std::size_t c = 0; c < cols; ++c) all += l1[c];
      }
      const double f = double(factor);
      auto_a_[i] += f * sel / double(k);
      auto_b_[i] += f * (all - sel) / double(cols - k);
      ++eligible;
      if (auto_b_[i] >= auto_a_[i] / double(window_steps_)) ++needing;
    }
    return detail::at_least_share(needing, eligible, cfg_.auto_ratio);
  }

  // Picks the new columns of every matrix from this step's scores and swaps their state. The
  // updater may select on the device (cuda_space's top-k for column_topk); otherwise the
  // Selector runs on the host over the scores.
  void select() {
    const std::size_t M = matrices_.size();
    std::vector<std::vector<std::uint32_t>> chosen, slots;
    std::vector<detail::swap_plan> plans;
    auto swaps = [&](std::size_t i) { return updater_.matrix(i).k && !fixed_selection(i); };
    auto plan = [&](std::size_t i, detail::swap_plan& p, std::vector<std::uint32_t>& sl) {
      p = detail::plan_swap(selected_[i], chosen[i]);
      sl.clear();
      for (const auto* v : {&p.leave_slot, &p.stay_src, &p.stay_dst, &p.join_slot}) sl.insert(sl.end(), v->begin(), v->end());
    };
    // The choice, and with several ranks every matrix's swap plan — what this rank allocates —
    // before the first collective (the swaps gather the joining columns from their owners),
    // voted on; the swaps then fill lists whose capacity build() reserved. (One process plans a
    // matrix at a time: a model of very many tensors holds one plan, not all of them, at once.)
    step_part([&] {
      chosen.resize(M);
      bool done = false;
      if constexpr (device_topk_updater<GpuUpdater, Space>) {
        if constexpr (std::is_same_v<Selector, column_topk>) {
          updater_.select_topk(space_, cfg_.score, chosen);
          done = true;
        }
      }
      if (!done) {
        if constexpr (Selector::needs_scores) updater_.fetch_scores(space_, cfg_.score);
        for (std::size_t i = 0; i < M; ++i) {
          const std::size_t k = updater_.matrix(i).k;
          if (k == 0 || fixed_selection(i)) continue;
          chosen[i].resize(k);
          Selector::select(Selector::needs_scores ? updater_.scores(i, cfg_.score) : nullptr, matrices_[i].cols, k,
                           chosen[i].data());
          check_selection(chosen[i], matrices_[i].cols, i);
        }
      }
      if (distributed()) {
        plans.resize(M);
        slots.resize(M);
        for (std::size_t i = 0; i < M; ++i)
          if (swaps(i)) plan(i, plans[i], slots[i]);
      }
    });
    detail::swap_plan one;
    std::vector<std::uint32_t> one_slots;
    for (std::size_t i = 0; i < M; ++i) {
      if (!swaps(i)) continue;
      if (distributed()) {
        swap_columns(i, std::move(chosen[i]), plans[i], slots[i]);
      } else {
        plan(i, one, one_slots);
        swap_columns(i, std::move(chosen[i]), one, one_slots);
      }
    }
    ++selections_;
  }

  // A Selector's choice for matrix i: distinct column indices below cols, ascending (what the swap
  // planning and the device's slots rely on). A Selector of the trainer's own that breaks it is
  // refused before any column moves (a std::logic_error: a step that throws it is a failed one).
  static void check_selection(const std::vector<std::uint32_t>& chosen, std::size_t cols, std::size_t i) {
    for (std::size_t s = 0; s < chosen.size(); ++s)
      if (chosen[s] >= cols || (s > 0 && chosen[s] <= chosen[s - 1]))
        throw std::logic_error("zenflow: the Selector's choice for matrix " + std::to_string(i) + " has column " +
                               std::to_string(chosen[s]) + " at place " + std::to_string(s) +
                               ": it must be distinct columns below " + std::to_string(cols) + ", ascending");
  }

  // Columns that leave hand their fp32 master, moments and count to the host; columns that join
  // take theirs from the host; columns that stay move between the two device slot sets. Planned
  // on the host (plan: detail::plan_swap of the current and the next list; slots: its leave,
  // stay and join slot lists one after the other), then carried out in bulk: device-side slot
  // moves, and one transfer per chunk and array for each direction (12*rows + 4 bytes per column
  // changing sides), whose columns the host accumulator's threads (idle: a reselection runs
  // drained) scatter to or gather from their places in the host arrays.
  void swap_columns(std::size_t i, std::vector<std::uint32_t>&& next, const detail::swap_plan& plan,
                    const std::vector<std::uint32_t>& slots) {
    auto& d = updater_.matrix(i);
    auto& hs = host_.matrix(i);
    const std::size_t rows = matrices_[i].rows;
    // (a matrix with every column selected has one slot set: it is filled once, all joining)
    const int cur = d.cur, nxt = d.all_selected() ? cur : cur ^ 1;
    const auto& [leave_slot, leave_col, stay_src, stay_dst, join_slot, join_col] = plan;
    const std::size_t nl = leave_slot.size(), ns = stay_src.size(), nj = join_slot.size();
    if (!slots.empty()) space_.upload(slots_dev_.data(), slots.data(), 4 * slots.size());
    const std::uint32_t* leave_dev = slots_dev_.data();
    const std::uint32_t* src_dev = leave_dev + nl;
    const std::uint32_t* dst_dev = src_dev + ns;
    const std::uint32_t* join_dev = dst_dev + ns;

    // When the (fp32) param is the master, the master moves with nothing: a leaving column's host
    // master is read from its param, a joining column's param already equals its host master
    // (drained before any selection), and staying columns keep their params in place.
    const int a0 = d.param_master ? 1 : 0;
    float* dev_cur[3] = {d.master_of(cur), d.exp_avg[cur].data(), d.exp_avg_sq[cur].data()};
    float* dev_nxt[3] = {d.master_of(nxt), d.exp_avg[nxt].data(), d.exp_avg_sq[nxt].data()};
    float* host_arr[3] = {hs.master.data(), hs.exp_avg.data(), hs.exp_avg_sq.data()};
    auto* st = static_cast<unsigned char*>(host_.stage());
    const std::size_t chunk = host_.stage_columns(i);
    // staying columns change slot set on the device
    for (int a = a0; a < 3; ++a) space_.move_slots(dev_nxt[a], dst_dev, dev_cur[a], src_dev, ns, 4 * rows);
    space_.move_slots(d.counts[nxt].data(), dst_dev, d.counts[cur].data(), src_dev, ns, 4);
    const std::uint32_t* leave_col_dev = join_dev + nj;
    if (d.param_master && nl) space_.upload(slots_dev_.data() + 2 * ns + nl + nj, leave_col.data(), 4 * nl);
    // This rank's block of columns, [h0, ...), is what its host state holds (all of them in one
    // process): the leaving and joining columns in it are a run of each sorted list.
    const std::uint32_t h0 = std::uint32_t(col_begin(i, comm_.rank()));
    auto run = [&](const std::vector<std::uint32_t>& cols) { return rank_part(i, cols.data(), cols.size(), comm_.rank()); };
    // leaving: gathered on the device, one transfer, scattered into the host arrays (data
    // parallel: the rank holding the column takes it; the others drop their replica)
    const auto [lfrom, lto] = run(leave_col);
    for (std::size_t c0 = lfrom; c0 < lto; c0 += chunk) {
      const std::size_t m = std::min(chunk, lto - c0);
      for (int a = 0; a < 3; ++a) {
        if (a < a0) {
          space_.compact_columns(matrices_[i].param, dtype::f32, matrices_[i].layout, rows, matrices_[i].cols,
                                 leave_col_dev + c0, m, dev_stage_.data());
        } else {
          space_.move_slots(dev_stage_.data(), nullptr, dev_cur[a], leave_dev + c0, m, 4 * rows);
        }
        transport_.to_host(st, dev_stage_.data(), m * rows * 4);
        host::copy_pieces(host_.arena(), m, rows * 4, [&](std::size_t k) { return host_arr[a] + std::size_t(plan.leave_col[c0 + k] - h0) * rows; },
                          [&](std::size_t k) { return st + k * rows * 4; });
      }
      space_.move_slots(dev_stage_.data(), nullptr, d.counts[cur].data(), leave_dev + c0, m, 4);
      transport_.to_host(st, dev_stage_.data(), m * 4);
      for (std::size_t k = 0; k < m; ++k) std::memcpy(hs.counts.data() + (leave_col[c0 + k] - h0), st + k * 4, 4);
    }
    // joining: gathered on the host, one transfer, scattered into the new device slots (with
    // reselect_moments = reset, moments and counts of zero cross instead of the host's)
    const bool reset = cfg_.reselect_moments == reselect_policy::reset;
    if constexpr (data_parallel) {
      // each rank uploads the joining columns it holds into their place in the gather space,
      // every rank's are gathered there, then moved into the slots: array by array, the counts last
      const auto [jfrom, jto] = run(join_col);
      for (int a = a0; a < 4; ++a) {
        const std::size_t per = a < 3 ? rows * 4 : 4;
        const auto* src = a < 3 ? reinterpret_cast<const unsigned char*>(host_arr[a])
                                : reinterpret_cast<const unsigned char*>(hs.counts.data());
        unsigned char* all = gather_space(nj * per);
        for (std::size_t c0 = jfrom; c0 < jto; c0 += chunk) {
          const std::size_t m = std::min(chunk, jto - c0);
          if (reset && a > 0) std::memset(st, 0, m * per);
          else
            host::copy_pieces(host_.arena(), m, per, [&](std::size_t k) { return st + k * per; },
                              [&](std::size_t k) { return src + std::size_t(plan.join_col[c0 + k] - h0) * per; });
          transport_.to_device(all + c0 * per, st, m * per);
        }
        gather_list(i, join_col.data(), nj, all, per, true);
        if (nj) space_.move_slots(a < 3 ? static_cast<void*>(dev_nxt[a]) : d.counts[nxt].data(), join_dev, all, nullptr, nj, per);
      }
    } else {
      for (std::size_t c0 = 0; c0 < nj; c0 += chunk) {
        const std::size_t m = std::min(chunk, nj - c0);
        for (int a = a0; a < 3; ++a) {
          if (reset && a > 0) std::memset(st, 0, m * rows * 4);
          else
            host::copy_pieces(host_.arena(), m, rows * 4, [&](std::size_t k) { return st + k * rows * 4; },
                              [&](std::size_t k) { return host_arr[a] + std::size_t(plan.join_col[c0 + k]) * rows; });
          transport_.to_device(dev_stage_.data(), st, m * rows * 4);
          space_.move_slots(dev_nxt[a], join_dev + c0, dev_stage_.data(), nullptr, m, 4 * rows);
        }
        if (reset) std::memset(st, 0, m * 4);
        else
          for (std::size_t k = 0; k < m; ++k) std::memcpy(st + k * 4, hs.counts.data() + join_col[c0 + k], 4);
        transport_.to_device(dev_stage_.data(), st, m * 4);
        space_.move_slots(d.counts[nxt].data(), join_dev + c0, dev_stage_.data(), nullptr, m, 4);
      }
    }
    if (!next.empty()) space_.upload(d.columns[nxt].data(), next.data(), 4 * next.size());
    d.cur = nxt;
    d.active = next.size();
    selected_[i] = std::move(next);
    set_unselected(i);
  }

  // (master: the array asked for is the master, which an fp32 param holds itself)
  template <class DeviceArray, class HostArray>
  void column_state(const char* call, std::size_t matrix, float* out, DeviceArray dev, HostArray host,
                    bool master = false) {
    enter();
    enter_collective(call, [&] { quiesce(); }, [&] {
      check_matrix(matrix);
      check_out(call, out, 4 * matrices_[matrix].rows * matrices_[matrix].cols, 4);
    });
    const matrix_param& p = matrices_[matrix];
    const std::size_t rows = p.rows, cols = p.cols;
    if (const auto& hs = host_.matrix(matrix); hs.on_host) {  // this rank's block, then the others'
      std::copy_n(host(hs), rows * hs.cols, out + col_begin(matrix, comm_.rank()) * rows);
      gather_blocks_host(matrix, out, 4 * rows);
    }
    auto& d = updater_.matrix(matrix);
    if (master && d.param_master) {  // the master, held by the fp32 param: its selected columns
      const std::vector<float> w = download<float>(static_cast<const float*>(p.param), rows * cols);
      for (const std::uint32_t c : selected_[matrix])
        for (std::size_t r = 0; r < rows; ++r) out[std::size_t(c) * rows + r] = w[element_offset(p.layout, rows, cols, r, c)];
      return;
    }
    const std::vector<float> dv = download<float>(dev(d, d.cur), d.active * rows);
    for (std::size_t s = 0; s < d.active; ++s)
      std::copy_n(dv.data() + s * rows, rows, out + std::size_t(selected_[matrix][s]) * rows);
  }

  config cfg_;
  Space space_{};
  HostAccumulator host_;
  GpuUpdater updater_{};
  // Uploads ahead (a transport's opt-in, ahead_transport): every matrix's unselected columns'
  // params, matrix after matrix (ahead_at_[i] bytes on) in unselected-list order (data parallel:
  // this rank's part at its place, the others' gathered there at the boundary), in the space's
  // device memory; written by the update lane's job, read by the boundary that applies it.
  // (Before transport_: destroyed after it, whose destructor waits for the copies into it.)
  typename Space::template buffer<unsigned char> ahead_;
  std::vector<std::size_t> ahead_at_;  // ahead_at_[matrices] = the end
  bool ahead_on_ = false;
  bool ahead_filled_ = false;  // the last host update's params are there (set at its job's end)
  std::uint64_t ahead_bytes_ = 0;  // stats().bytes_uploaded_ahead
  Transport transport_{};
  Scheduler scheduler_{};
  [[no_unique_address]] Communicator comm_;
  // data parallel: a round of the gradients (reduce_round_ elements, reduce_round_for) as they
  // travel in the reduction (wire_of), in the space's device memory
  std::size_t reduce_round_ = 0;
  typename Space::template buffer<unsigned char> reduce_buf_;
  std::vector<step_vote> votes_;  // agree_to_step's, a rank each
  std::vector<std::size_t> vote_bytes_;
  struct reduce_piece {
    std::size_t tensor, first, len;  // elements [first, first + len) of grad buffer `tensor`
  };
  std::vector<reduce_piece> reduce_pieces_;  // (a member: its capacity stays, no allocation per step)
  // sharded_reduction: a round's rectangles (rows [r0, r1) by columns [a, b) of a matrix), the
  // ranks' segments of it (elements), and the bytes this rank sent of its blocks' column
  // statistics and its selected columns' reduced gradients (in stats().bytes_reduced)
  struct scatter_item {
    std::size_t matrix, r0, r1, a, b;
  };
  std::vector<scatter_item> scatter_items_;
  std::vector<std::size_t> scatter_counts_;
  piece_batch stats_out_, stats_in_;  // sharded_gradient_pass's batched copies
  std::uint64_t shared_ = 0;
  // the communicator's bytes that are not this run's reductions: initialize()'s comparison of the
  // ranks, and, after a load, all it sent before (bytes_reduced continues from the file's, in shared_)
  std::uint64_t setup_sent_ = 0;
  // Data parallel: the ranks' blocks of a collective (bytes each), the (device) memory where
  // the blocks of params or joining state are gathered, and the bytes this rank sent there.
  std::vector<std::size_t> counts_;
  typename Space::template buffer<unsigned char> gather_buf_;
  std::uint64_t gathered_ = 0;
  // Data parallel: per matrix, the unselected columns in this rank's block, as indices into its
  // host state (column - col_begin), and where they start in unselected_.
  std::vector<std::vector<std::uint32_t>> own_unselected_;
  std::vector<std::size_t> own_from_;
  int load_vote_ = 0;  // see collective_load

  std::vector<matrix_param> matrices_;
  std::vector<vector_param> vectors_;
  detail::registered_buffers buffers_;
  std::string broken_;  // why the optimizer refuses further work (empty: it does not)
  // where initialize() found a param that is not finite on this rank (empty: none), which
  // step() refuses to train until a load replaces the masters taken from it
  std::string unfit_params_;
  // host mirrors of each matrix's column lists: unselected, selected (ascending)
  std::vector<std::vector<std::uint32_t>> unselected_, selected_;
  std::vector<std::uint32_t> iota_;  // 0, 1, 2, ...: every column of any matrix
  bool initialized_ = false, any_selected_ = false, selected_once_ = false, pending_ = false;
  bool async_offload_ = false;
  // the offload lane's largest piece (bytes), and this step's blocks (a member: no allocation per step)
  static constexpr std::size_t max_lane_piece = std::size_t(32) << 20;
  std::size_t lane_piece_ = 0;
  std::vector<offload_block> offload_blocks_;
  typename Space::template buffer<unsigned char> grad_compact_, dev_stage_;
  detail::array_pool<Space> lists_pool_;
  std::vector<detail::pooled_array<Space, std::uint32_t>> lists_dev_;
  typename Space::template buffer<std::uint32_t> slots_dev_;
  typename Space::event compacted_;
  std::vector<std::size_t> compact_offset_;  // matrix i's block in grad_compact_ (fixed), then the end
  // fused compaction: matrix by matrix, each column's place in its block (write_slots)
  typename Space::template buffer<std::uint32_t> compact_slot_;
  std::vector<std::uint32_t> slot_scratch_;
  bool slots_stale_ = true;  // the unselected lists changed since write_slots()
  int active_acc_ = 0;
  std::uint64_t applied_ = 0, steps_ = 0, skipped_ = 0, selections_ = 0, host_updates_ = 0;
  std::uint64_t last_selection_ = 0, window_steps_ = 0;
  std::uint64_t base_to_host_ = 0, base_to_device_ = 0;
  std::uint64_t owed_to_host_ = 0;  // the transport's to-host count once the offload in flight is done
  double base_stall_ = 0;
  // stall the scheduler does not see: a loaded checkpoint's (kept apart: exactly the file's right
  // after the load), and warm-up's inline host updates since
  double stall_carried_ = 0;
  std::atomic<std::uint64_t> host_ns_{0};
  std::uint64_t reduce_ns_ = 0;  // data parallel: time reducing gradients (stats().reduce_seconds)
  std::vector<double> auto_a_, auto_b_;
};

// Baselines as policy combinations.

// ZeRO-Offload: no column on the device, a host AdamW of everything every step, synchronous.
// (Data parallel with a Communicator, as the optimizer.)
template <class Space = host_space, communicator_policy Communicator = single_process>
class zero_offload
    : public optimizer<Space, select_none, fused_adamw<Space>, simd_accumulator, default_transport_t<Space>, synchronous,
                       Communicator> {
  using base = optimizer<Space, select_none, fused_adamw<Space>, simd_accumulator, default_transport_t<Space>,
                         synchronous, Communicator>;
  static config adjust(config c) {
    c.topk_ratio = 0;
    c.update_interval = interval::every(1);
    c.select_interval = interval::every(1);
    c.overlap_step = false;
    c.full_warm_up_rounds = 0;
    return c;
  }

 public:
  explicit zero_offload(const config& c = {})
    requires std::default_initializable<Communicator>
      : base(adjust(c)) {}
  zero_offload(const config& c, Communicator comm) : base(adjust(c), std::move(comm)) {}
};

// Plain AdamW where the model trains: every column selected once, nothing left on the host.
template <class Space = host_space, communicator_policy Communicator = single_process>
class device_adam
    : public optimizer<Space, select_all, fused_adamw<Space>, simd_accumulator, default_transport_t<Space>, synchronous,
                       Communicator> {
  using base = optimizer<Space, select_all, fused_adamw<Space>, simd_accumulator, default_transport_t<Space>,
                         synchronous, Communicator>;
  static config adjust(config c) {
    c.topk_ratio = 1;
    c.update_interval = interval::every(1);
    c.select_interval = interval::every(std::numeric_limits<std::uint32_t>::max());
    c.overlap_step = false;
    c.full_warm_up_rounds = 0;
    return c;
  }

 public:
  explicit device_adam(const config& c = {})
    requires std::default_initializable<Communicator>
      : base(adjust(c)) {}
  device_adam(const config& c, Communicator comm) : base(adjust(c), std::move(comm)) {}
};

}  // namespace zenflow
