// mpi_communicator: data parallelism across MPI ranks for the host space. Each rank's trainer
// writes its local gradients; step() reduces them so every rank applies the same gradient and
// keeps bit-identical optimizer state. The trainer keeps owning its MPI_Comm (zenflow works on
// a duplicate, so its messages never mix with the trainer's); MPI must be initialised before
// the communicator is made and finalised only after the optimizer is destroyed.
//
// The reduction is deterministic: each rank owns a shard of the elements; the ranks' pieces of a
// shard go to its owner (MPI_Alltoallv), which sums them in rank order in fp32
// (detail::reduce_in_rank_order's arithmetic, host::sum_in_rank_order: on the threads of the
// arena an optimizer lends it, use_arena). reduce_scatter stops there (the optimizer makes the
// shards the ranks' blocks of matrix columns: each rank sends (R - 1) / R of the matrices'
// gradient); reduce then gathers the reduced shards back on every rank (MPI_Allgatherv: 2 (R -
// 1) / R in all). No MPI reduction operator is used, so the bits do not depend on the MPI
// library's algorithm. mpi_allreduce_communicator (below) has no reduce_scatter.
// The pieces travel in the gradients' own dtype (the optional typed members of
// communicator_policy): a bf16 or fp16 gradient sends 2 bytes an element, not the 4 of its
// widened copy, and its owner widens them as it sums (exact) and rounds the result back, as the
// optimizer would round an fp32 result: the same bits for half the bytes.
// The optimizer's sharded host state uses the other collectives: all_gather (the params its
// block's host updates changed, the state of joining columns) and all_agree (a save or load
// succeeds on every rank or on none).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "communicator.hpp"
#include "host/kernels.hpp"
#include "space/host_space.hpp"

namespace zenflow {

namespace detail {
// Below MPI_THREAD_SERIALIZED only the thread that initialised MPI may call it
// (MPI_THREAD_FUNNELED; MPI_THREAD_SINGLE, what a plain MPI_Init gives, promises one thread), and
// zenflow calls MPI from the thread that calls the optimizer: refused from another thread then,
// before the call (one from there would be undefined: a hang, a crash or garbled messages).
// Checked at each collective, alike on every rank that drives its optimizer the same way.
inline void check_mpi_thread(const char* who = "mpi_communicator") {
  int level = MPI_THREAD_SINGLE, main = 0;
  MPI_Query_thread(&level);
  if (level >= MPI_THREAD_SERIALIZED) return;
  MPI_Is_thread_main(&main);
  if (main) return;
  throw std::invalid_argument(std::string("zenflow: ") + who + ": MPI was initialised at thread level " +
                              (level == MPI_THREAD_FUNNELED ? "MPI_THREAD_FUNNELED" : "MPI_THREAD_SINGLE") +
                              ", where only the thread that initialised it may call MPI, and this thread did not; "
                              "zenflow calls MPI from the thread that calls the optimizer: initialise MPI with "
                              "MPI_Init_thread(..., MPI_THREAD_SERIALIZED, ...) to drive it from another thread");
}
}  // namespace detail

class mpi_communicator {
 public:
  using space = host_space;  // reduce and all_gather take host memory

  // The ranks of `comm` (duplicated: a collective call on every rank of it).
  explicit mpi_communicator(MPI_Comm comm) : mpi_communicator(comm, limits{}) {}
  mpi_communicator(mpi_communicator&& o) noexcept
      : comm_(o.comm_), rank_(o.rank_), size_(o.size_), sent_(o.sent_), lim_(o.lim_), arena_(o.arena_) {
    o.comm_ = MPI_COMM_NULL;
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  mpi_communicator& operator=(mpi_communicator&&) = delete;
  ~mpi_communicator() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  }

 protected:
  // How much one MPI call moves: at most `round` elements of each rank's data a call, and every
  // count and offset at most `int_max` (MPI's int; larger data goes in rounds, a packed copy or
  // broadcast pieces). Smaller values make those paths run on small data (the tests).
  struct limits {
    std::size_t round = std::size_t(1) << 26;
    std::size_t int_max = std::size_t(std::numeric_limits<int>::max());
  };
  mpi_communicator(MPI_Comm comm, limits lim) : lim_(lim) {
    if (lim_.round == 0 || lim_.int_max < 4) throw std::invalid_argument("zenflow: mpi_communicator limits too small");
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) throw std::logic_error("zenflow: mpi_communicator made before MPI_Init");
    detail::check_mpi_thread();
    // (local checks, alike on every rank that passes the same communicator: no rank waits in the
    // dup below for one that refused)
    if (comm == MPI_COMM_NULL) throw std::invalid_argument("zenflow: mpi_communicator of MPI_COMM_NULL");
    int inter = 0;
    check(MPI_Comm_test_inter(comm, &inter), "MPI_Comm_test_inter");
    if (inter)
      throw std::invalid_argument(
          "zenflow: mpi_communicator of an intercommunicator: its collectives join two groups, where the optimizer's "
          "ranks must be one group (pass an intracommunicator, e.g. MPI_Intercomm_merge's)");
    check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);  // errors become exceptions, not aborts
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }

 public:

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  // The bytes this rank sent to reduce gradients (the other collectives are counted by their
  // callers: the optimizer's stats() has them).
  std::uint64_t bytes_sent() const noexcept { return sent_; }
  // The host memory it keeps between calls: the receive buffer of the ranks' pieces (about a
  // round's worth; within twice the data in reduce_scatter), the shard and packing buffers, the
  // count arrays. (In the optimizer's stats().host_pageable_bytes.)
  std::size_t bytes_allocated() const noexcept {
    return pieces_.capacity() + shard_.capacity() + packed_.capacity() +
           sizeof(int) * (counts_.capacity() + displs_.capacity() + mine_.capacity() + mine_displs_.capacity());
  }

  // See communicator_policy. Collective: every rank calls it with the same n.
  void reduce(float* data, std::size_t n, reduce_op op) { reduce(data, dtype::f32, n, op); }
  // See communicator_policy (the typed reduce): n elements of dtype t, replaced by their
  // reduction rounded to t. Collective: every rank calls it with the same t and n.
  void reduce(void* data, dtype t, std::size_t n, reduce_op op) {
    if (size_ == 1) return;  // the sum of one, and its mean (x / 1 == x)
    detail::check_mpi_thread();
    // Rounds of at most 2^26 elements, so that every count and offset fits MPI's int.
    const std::size_t round_max = std::min(lim_.round, lim_.int_max);
    const std::size_t R = std::size_t(size_), es = size_of(t);
    if (n == 0) return;
    const std::size_t most = (std::min(round_max, n) + R - 1) / R;  // a rank's largest piece (the first round's)
    grow(most * R * es, most * es, 0);
    counts_.resize(R);  // (members: no allocation per step once sized)
    displs_.resize(R);
    mine_.resize(R);
    mine_displs_.resize(R);
    int *counts = counts_.data(), *displs = displs_.data(), *mine = mine_.data(), *mine_displs = mine_displs_.data();
    auto* bytes = static_cast<unsigned char*>(data);
    for (std::size_t off = 0; off < n; off += round_max) {
      const std::size_t len = std::min(round_max, n - off);
      for (std::size_t r = 0; r < R; ++r) {
        displs[r] = int(detail::shard_begin(len, size_, int(r)));
        counts[r] = int(detail::shard_begin(len, size_, int(r) + 1)) - displs[r];
      }
      const std::size_t m = std::size_t(counts[std::size_t(rank_)]);
      pieces_.resize(m * R * es);
      shard_.resize(m * es);
      for (std::size_t r = 0; r < R; ++r) {
        mine[r] = int(m);
        mine_displs[r] = int(r * m);
      }
      check(MPI_Alltoallv(bytes + off * es, counts, displs, wire_type(t), pieces_.data(), mine, mine_displs, wire_type(t),
                          comm_),
            "MPI_Alltoallv");
      sum(pieces_.data(), t, m, op, shard_.data());
      check(MPI_Allgatherv(shard_.data(), int(m), wire_type(t), bytes + off * es, counts, displs, wire_type(t), comm_),
            "MPI_Allgatherv");
      sent_ += ((len - m) + m * (R - 1)) * es;  // the others' pieces, then my shard to each
    }
  }

  // See communicator_policy (reduce_scatter): data holds R segments, rank r's of counts[r]
  // elements, one after the other; afterwards this rank's segment holds the reduction of every
  // rank's segment at its place (the sum in rank order, as reduce's), and the other segments
  // are unspecified. Each rank sends the others' segments (MPI_Alltoallv): (R - 1) / R of the
  // data when the segments are equal, half of what reduce sends. Round j moves elements
  // [j P, (j + 1) P) of every segment; P keeps every MPI count and offset within int, and at
  // most twice a segment's fair share, 2 ceil(total / R): a rank receives P from every rank, so
  // its receive buffer stays within about twice the data however the segments are split (one
  // rank's segment holding all of it would otherwise need R times the data). Segments within
  // twice their share go in one round: the optimizer's column blocks are, but for a matrix
  // narrower than R or a row longer than the optimizer's round.
  void reduce_scatter(float* data, const std::size_t* counts, reduce_op op) { reduce_scatter(data, dtype::f32, counts, op); }
  // The same over elements of dtype t (the typed reduce_scatter): this rank's segment gets the
  // reduction rounded to t.
  void reduce_scatter(void* data, dtype t, const std::size_t* counts, reduce_op op) {
    if (size_ == 1) return;
    detail::check_mpi_thread();
    const std::size_t R = std::size_t(size_), me = std::size_t(rank_), es = size_of(t);
    std::size_t longest = 0, total = 0, own = 0;  // own: where this rank's segment starts
    for (std::size_t r = 0; r < R; ++r) {
      longest = std::max(longest, counts[r]);
      if (r == me) own = total;
      total += counts[r];
    }
    // (R pieces of a round land one after the other: R * round_max within int too)
    const std::size_t round_max =
        std::max<std::size_t>(1, std::min({lim_.round, lim_.int_max / R, 2 * ((total + R - 1) / R)}));
    // Alltoallv takes int displacements from one send buffer: the segments in place when they
    // fit, else a packed copy of each round
    const bool in_place = total <= lim_.int_max;
    std::size_t first_round = 0;  // the packed copy of the first round, the largest
    for (std::size_t r = 0; r < R; ++r) first_round += std::min(round_max, counts[r]);
    grow(std::min(round_max, longest) * R * es, 0, in_place ? 0 : first_round * es);
    counts_.resize(R);  // (within what grow reserved)
    displs_.resize(R);
    mine_.resize(R);
    mine_displs_.resize(R);
    auto* bytes = static_cast<unsigned char*>(data);
    for (std::size_t off = 0; off < longest; off += round_max) {
      std::size_t seg = 0, packed = 0, sent = 0;
      for (std::size_t r = 0; r < R; ++r) {  // this round: elements [off, off + len) of segment r
        const std::size_t len = counts[r] > off ? std::min(round_max, counts[r] - off) : 0;
        counts_[r] = int(len);
        // (an empty piece's offset is 0: seg + off may pass int's range once segment r is done)
        displs_[r] = len == 0 ? 0 : int(in_place ? seg + off : packed);
        if (!in_place) {
          packed_.resize((packed + len) * es);
          std::copy_n(bytes + (seg + off) * es, len * es, packed_.data() + packed * es);
        }
        packed += len;
        if (r != me) sent += len;
        seg += counts[r];
      }
      const std::size_t m = std::size_t(counts_[me]);  // my segment's piece, from every rank
      pieces_.resize(m * R * es);
      for (std::size_t r = 0; r < R; ++r) {
        mine_[r] = int(m);
        mine_displs_[r] = int(r * m);
      }
      check(MPI_Alltoallv(in_place ? data : packed_.data(), counts_.data(), displs_.data(), wire_type(t), pieces_.data(),
                          mine_.data(), mine_displs_.data(), wire_type(t), comm_),
            "MPI_Alltoallv");
      // (this round's piece of my segment was sent above and is not read again: written in place)
      sum(pieces_.data(), t, m, op, bytes + (own + off) * es);
      sent_ += sent * es;
    }
  }

  // See communicator_policy (the optional member): the buffers any later reduce_scatter of at
  // most `scatter` elements in all, and reduce of at most `reduce`, needs, grown now (a
  // collective, voted on as grow is), for elements of up to `scatter_bytes` and `reduce_bytes`
  // bytes (4: any dtype; 2: bf16 and fp16 only): reduce's pieces are ceil(reduce / R) from every
  // rank and its shard one of them, reduce_scatter's pieces at most 2 ceil(scatter / R) from every
  // rank; the packed copy only past MPI's int. The optimizer calls it from initialize(), so that
  // its steps allocate nothing here.
  void reserve(std::size_t scatter, std::size_t reduce, std::size_t scatter_bytes = 4, std::size_t reduce_bytes = 4) {
    if (size_ == 1) return;
    const std::size_t R = std::size_t(size_), s = (scatter + R - 1) / R, r = (reduce + R - 1) / R;
    const std::size_t es = std::clamp<std::size_t>(scatter_bytes, 1, 4), er = std::clamp<std::size_t>(reduce_bytes, 1, 4);
    grow(std::max(2 * s * es, r * er) * R, r * er, scatter > lim_.int_max ? scatter * es : 0);
  }

  // See communicator_policy. In place: MPI_Allgatherv on bytes when every count and offset fits
  // MPI's int, else each rank's block broadcast from it in pieces of at most 1 GiB.
  void all_gather(void* data, const std::size_t* bytes) {
    if (size_ == 1) return;
    detail::check_mpi_thread();
    grow(0, 0, 0);
    const std::size_t R = std::size_t(size_);
    std::size_t total = 0;
    for (std::size_t r = 0; r < R; ++r) total += bytes[r];
    auto* at = static_cast<unsigned char*>(data);
    if (total <= lim_.int_max) {
      counts_.resize(R);
      displs_.resize(R);
      for (std::size_t r = 0, off = 0; r < R; off += bytes[r], ++r) {
        counts_[r] = int(bytes[r]);
        displs_[r] = int(off);
      }
      check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, at, counts_.data(), displs_.data(), MPI_BYTE, comm_),
            "MPI_Allgatherv");
      return;
    }
    const std::size_t piece = std::min(std::size_t(1) << 30, lim_.int_max);
    for (std::size_t r = 0, off = 0; r < R; off += bytes[r], ++r)
      for (std::size_t o = 0; o < bytes[r]; o += piece)
        check(MPI_Bcast(at + off + o, int(std::min(piece, bytes[r] - o)), MPI_BYTE, int(r), comm_), "MPI_Bcast");
  }

  // Optional member of communicator_policy: the threads the reduction's sums run on — an
  // optimizer over the host space lends its space's arena for each step's reduction and takes it
  // back after (nullptr, the default: the calling thread alone). The same bits either way.
  void use_arena(tbb::task_arena* arena) noexcept { arena_ = arena; }

  bool all_agree(bool ok) {
    detail::check_mpi_thread();
    int mine = ok ? 1 : 0, all = 0;
    check(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, comm_), "MPI_Allreduce");
    return all != 0;
  }

 private:
  // The buffers (in bytes) grown before a call's first collective, to bounds every rank computes alike from
  // the call's arguments (the same on every rank), so that the ranks grow at the same calls — and
  // vote on it there: a rank that cannot allocate throws its error and the others throw too,
  // instead of waiting for it in the collective. When refused, every rank drops them (they go on
  // growing alike). The loops' resizes stay within these capacities.
  void grow(std::size_t pieces, std::size_t shard, std::size_t packed) {
    const std::size_t R = std::size_t(size_);
    if (pieces_.capacity() >= pieces && shard_.capacity() >= shard && packed_.capacity() >= packed &&
        counts_.capacity() >= R && displs_.capacity() >= R && mine_.capacity() >= R && mine_displs_.capacity() >= R)
      return;
    std::exception_ptr failed;
    try {
      pieces_.reserve(pieces);
      shard_.reserve(shard);
      packed_.reserve(packed);
      for (auto* v : {&counts_, &displs_, &mine_, &mine_displs_}) v->reserve(R);
    } catch (...) {
      failed = std::current_exception();
    }
    if (all_agree(!failed)) return;
    for (auto* v : {&pieces_, &shard_, &packed_}) std::vector<unsigned char>().swap(*v);
    for (auto* v : {&counts_, &displs_, &mine_, &mine_displs_}) std::vector<int>().swap(*v);
    if (failed) std::rethrow_exception(failed);
    throw std::runtime_error("zenflow: mpi_communicator: another rank could not allocate its buffers for this "
                             "collective (it threw its error); nothing was sent");
  }

  // R pieces of m elements of dtype t, one after the other, reduced into out (m elements of t):
  // host::sum_in_rank_order, on the lent arena's threads, but without its argument checks, which
  // could throw here on one rank only, between two collectives (its own buffers, and a caller's
  // buffer that it takes as it is, as MPI does).
  void sum(const unsigned char* pieces, dtype t, std::size_t m, reduce_op op, unsigned char* out) const {
    host::detail::sum_in_rank_order_unchecked(arena_, pieces, t, std::size_t(size_), m, op == reduce_op::mean, out,
                                              host::kernels(host::best_isa()));
  }
  // what an element travels as: its own bits (MPI only moves them)
  static MPI_Datatype wire_type(dtype t) noexcept { return t == dtype::f32 ? MPI_FLOAT : MPI_UINT16_T; }

  static void check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw std::runtime_error(std::string("zenflow: ") + what + " failed: " + std::string(msg, std::size_t(len)));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::uint64_t sent_ = 0;
  std::vector<unsigned char> pieces_, shard_, packed_;
  std::vector<int> counts_, displs_, mine_, mine_displs_;
  limits lim_;
  tbb::task_arena* arena_ = nullptr;  // not owned (use_arena)
};

// mpi_communicator without reduce_scatter: an optimizer over it all-reduces every gradient, so
// that after step() the grad buffers hold the whole reduced gradient on every rank (for a trainer
// that reads them, to log a norm, say), at about 2 (R - 1) / R of the gradient sent per rank
// instead of (R - 1) / R plus the selected columns. The optimizer's state is the same, bit for bit.
struct mpi_allreduce_communicator : mpi_communicator {
  using mpi_communicator::mpi_communicator;
  void reduce_scatter(float*, const std::size_t*, reduce_op) = delete;
  void reduce_scatter(void*, dtype, const std::size_t*, reduce_op) = delete;
};

static_assert(communicator_policy<mpi_communicator>);
// (the optimizer detects the optional members with requires-expressions, where a private or
// misspelt one would silently count as absent)
static_assert(requires(mpi_communicator& c, float* d, void* b, const std::size_t* n) {
  c.reserve(std::size_t{}, std::size_t{});
  c.reserve(std::size_t{}, std::size_t{}, std::size_t{}, std::size_t{});
  c.reduce_scatter(d, n, reduce_op::sum);
  c.reduce(b, dtype::bf16, std::size_t{}, reduce_op::sum);
  c.reduce_scatter(b, dtype::bf16, n, reduce_op::sum);
  c.use_arena(static_cast<tbb::task_arena*>(nullptr));
});
static_assert(requires(mpi_allreduce_communicator& c) { c.reserve(std::size_t{}, std::size_t{}); });
static_assert(communicator_policy<mpi_allreduce_communicator>);

}  // namespace zenflow
