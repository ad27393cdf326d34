// The definition of zf_create_mpi (<zenflow/c_mpi.h>): compile this header into exactly one C++
// file, beside c_impl.hpp's (the zenflow::c_mpi library does). The other C functions are
// c_impl.hpp's, over the same handle.
#pragma once

#include <mpi.h>

#include <optional>
#include <utility>

#include "any_optimizer.hpp"
#include "c_mpi.h"
#include "detail/c_handle.hpp"
#include "detail/c_status.hpp"
#include "mpi.hpp"

extern "C" zf_status zf_create_mpi(const char* kind, const char* config_json, MPI_Comm comm,
                                   zf_optimizer** out) noexcept {
  using namespace zenflow;
  using namespace zenflow::c_api;
  if (out) *out = nullptr;
  // what no rank can vote on (the vote is a collective on comm)
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    return fail(ZF_INVALID_ARGUMENT, "zenflow: zf_create_mpi: MPI is not initialised, or already finalised");
  if (comm == MPI_COMM_NULL) return fail(ZF_INVALID_ARGUMENT, "zenflow: zf_create_mpi: comm is MPI_COMM_NULL");
  // (before the first vote, itself an MPI call: from a thread that may not call MPI, refused)
  if (const zf_status s = guarded([] { detail::check_mpi_thread("zf_create_mpi"); }); s != ZF_OK) return s;
  // every rank's own answer, then whether every rank's is yes (on comm, the trainer's: zenflow's
  // duplicate is made by the construction between the two votes)
  auto all_ranks = [&](bool ok, bool& all) -> zf_status {
    int mine = ok ? 1 : 0, every = 0;
    if (MPI_Allreduce(&mine, &every, 1, MPI_INT, MPI_LAND, comm) != MPI_SUCCESS)
      return fail(ZF_IO_ERROR, "zenflow: zf_create_mpi: MPI_Allreduce on comm failed; no optimizer was made");
    all = every != 0;
    return ZF_OK;
  };
  // 1. the arguments: the kind and the config, read and checked on each rank
  optimizer_kind k{};
  config cfg;
  zf_status mine = !out    ? fail(ZF_INVALID_ARGUMENT, "zenflow: zf_create_mpi: out is NULL")
                   : !kind ? fail(ZF_INVALID_ARGUMENT, "zenflow: zf_create_mpi: kind is NULL")
                           : guarded([&] {
                               k = parse_optimizer_kind(kind);
                               cfg = config_of(config_json);
                               cfg.validate();
                             });
  bool all = false;
  if (const zf_status s = all_ranks(mine == ZF_OK, all); s != ZF_OK) return s;
  if (mine != ZF_OK) return mine;
  if (!all)
    return fail(ZF_INVALID_ARGUMENT, "zenflow: zf_create_mpi refused on every rank: another rank refused its kind or config (it "
                     "returned that error); no optimizer was made");
  // 2. the optimizer: the communicator first (its duplicate of comm is a collective, which every
  // rank must reach whatever fails after it), then the rest, and a vote on whether every rank
  // made its own
  std::optional<mpi_communicator> c;
  zf_optimizer* made = nullptr;
  mine = guarded([&] {
    c.emplace(comm);
    made = new zf_optimizer{any_optimizer::create<host_space>(k, cfg, std::move(*c)), {}, {}};
  });
  if (const zf_status s = all_ranks(mine == ZF_OK, all); s != ZF_OK || mine != ZF_OK || !all) {
    delete made;
    if (s != ZF_OK) return s;
    if (mine != ZF_OK) return mine;
    return fail(ZF_INVALID_ARGUMENT, "zenflow: zf_create_mpi failed on another rank (it returned its error); no optimizer was made");
  }
  *out = made;
  return ZF_OK;
}
