/* zenflow's C API, data parallel over MPI: zf_create_mpi makes an optimizer whose ranks reduce
 * their gradients before each step and keep one replicated state, the host state sharded among
 * them (the C++ optimizer over zenflow::mpi_communicator; README, "Data parallel"). Every other
 * function is <zenflow/c.h>'s, on the handle it returns. Link the zenflow::c_mpi library (CMake),
 * or compile <zenflow/c_mpi_impl.hpp> into one C++ file of your own beside <zenflow/c_impl.hpp>.
 *
 * Collectives — every rank of comm calls them, in the same order: zf_create_mpi, zf_initialize
 * (or zf_initialize_on_stream), zf_step (or zf_step_on_stream), zf_synchronize, zf_copy_master,
 * zf_save, zf_load and zf_destroy. A call one rank refuses (a bad argument, an error on that rank)
 * fails on every rank, the rank at fault with its own message; none is left waiting — but for a
 * NULL handle, refused on that rank alone (there is no communicator to tell the others through).
 * zf_add_matrix, zf_add_vector, zf_set_group, zf_set_lr and zf_stats_get are each rank's own, but
 * every rank must register the same tensors and set the same learning rate, and create it with
 * the same kind and config (zf_initialize and zf_step refuse otherwise, on every rank). zf_save writes a
 * shard per rank and a manifest at path; zf_load reads such a set, written by any number of ranks.
 *
 *   int provided;   (zenflow's own threads never call MPI: README, "Data parallel over MPI")
 *   MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
 *   zf_optimizer* opt;
 *   if (zf_create_mpi("zenflow", NULL, MPI_COMM_WORLD, &opt) != ZF_OK) { ...zf_last_error()... }
 *   zf_add_matrix(opt, w, dw, out, in, ZF_F32, ZF_F32, ZF_ROW_MAJOR, NULL);
 *   zf_initialize(opt);
 *   for (...) { forward_backward_on_my_batch(); zf_step(opt, 1.0f, NULL); }
 *   zf_destroy(opt);
 *   MPI_Finalize();
 */
#ifndef ZENFLOW_C_MPI_H
#define ZENFLOW_C_MPI_H

#include <mpi.h>

#include "c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* zf_create (kind, config_json) over the ranks of comm: a collective on comm (zenflow then works
 * on a duplicate of it, so that its messages never mix with the trainer's). MPI must be
 * initialised, and finalised only after zf_destroy. A kind or config one rank refuses fails on
 * every rank (the others say so), each *out NULL. comm MPI_COMM_NULL is ZF_INVALID_ARGUMENT on
 * the ranks that pass it, without a collective (as is MPI not initialised): every rank must pass
 * it alike. The gradients' reduction ("gradient_reduction" in the config: "mean", the default, or
 * "sum") is in rank order, the same bits run after run.
 * Errors of MPI itself are handled as comm's error handler says: zf_create_mpi's first vote and
 * its duplicate are made on comm, so under MPI's default (MPI_ERRORS_ARE_FATAL) a failure there
 * aborts the job; a communicator the trainer already freed is undefined behaviour, as for any
 * MPI call. */
zf_status zf_create_mpi(const char* kind, const char* config_json, MPI_Comm comm, zf_optimizer** out) ZF_NOEXCEPT;

#ifdef __cplusplus
}
#endif

#endif /* ZENFLOW_C_MPI_H */
