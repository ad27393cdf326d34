/* zenflow's C API: the optimizer for trainers written in C (or any language with a C FFI),
 * on the host space (on a GPU: <zenflow/c_cuda.h>; data parallel over MPI: <zenflow/c_mpi.h>).
 * An opaque handle created from a kind and a JSON config; every call returns a status code and
 * never throws or aborts; the message of the last failing call on the calling thread is
 * zf_last_error(). Link the zenflow::c library (CMake), or compile
 * <zenflow/c_impl.hpp> into one C++ file of your own. C11 and C++.
 *
 *   zf_optimizer* opt;
 *   if (zf_create("zenflow", NULL, &opt) != ZF_OK) { fprintf(stderr, "%s\n", zf_last_error()); ... }
 *   zf_add_matrix(opt, w, dw, out, in, ZF_F32, ZF_F32, ZF_ROW_MAJOR, NULL);
 *   zf_initialize(opt);
 *   for (...) { forward_backward(); zf_step(opt, 1.0f, NULL); }
 *   zf_destroy(opt);
 */
#ifndef ZENFLOW_C_H
#define ZENFLOW_C_H

#include <stddef.h>
#include <stdint.h>

#include "version.hpp" /* ZENFLOW_VERSION (macros only, C too) */

/* In C++ the functions are declared noexcept: none of them lets an exception out. */
#if defined(__cplusplus) && __cplusplus >= 201103L
#  define ZF_NOEXCEPT noexcept
#else
#  define ZF_NOEXCEPT
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zf_optimizer zf_optimizer;

typedef enum zf_status {
  ZF_OK = 0,
  ZF_INVALID_ARGUMENT = 1, /* a bad argument, config value or registration, or a call out of order */
  ZF_CHECKPOINT_ERROR = 2, /* a checkpoint that is unreadable, corrupt or not this optimizer's */
  ZF_IO_ERROR = 3,         /* saving failed (disk full, no such directory, a state load would refuse; nothing
                            * changed), or another runtime error */
  ZF_OUT_OF_MEMORY = 4,     /* memory, or a thread the system could not give */
  /* The optimizer cannot go on: this call failed midway (a step, a background host update it
   * met, a load's commit; the message names the cause, out of memory say), or an earlier one
   * did. zf_step, zf_synchronize and zf_save then return ZF_UNUSABLE until a zf_load succeeds;
   * zf_copy_master and zf_stats_get still read the state, which may be inconsistent. */
  ZF_UNUSABLE = 5,
  ZF_INTERNAL_ERROR = 6    /* anything else (a fault of zenflow's own); the message says what */
} zf_status;

/* Element types of params and grads, and matrix layouts (the values of zenflow::dtype and
 * zenflow::matrix_layout). The functions take them as int, so that any value a caller passes is
 * checked (an unknown one is ZF_INVALID_ARGUMENT), not undefined. */
typedef enum zf_dtype { ZF_F32 = 0, ZF_BF16 = 1, ZF_F16 = 2 } zf_dtype;
typedef enum zf_layout {
  ZF_COLUMN_CONTIGUOUS = 0, /* [cols][rows]: a column is contiguous */
  ZF_ROW_MAJOR = 1          /* [rows][cols]: PyTorch's and llm.c's [out][in] weights */
} zf_layout;

/* The optimizer's counters (zf_stats_get). Later versions only append fields: a program built
 * against this header keeps reading the fields it knows from a newer library. */
typedef struct zf_stats {
  uint64_t steps, skipped_steps, selections, host_updates, bytes_to_host, bytes_to_device;
  double stall_seconds, host_update_seconds;
  uint64_t host_pageable_bytes, host_pinned_bytes, device_bytes;
  uint64_t host_bookkeeping_bytes; /* per-tensor records (registrations, shapes, column lists) */
  uint64_t bytes_uploaded_ahead;   /* of bytes_to_device, uploaded by a host update ahead of its boundary */
  /* data parallel (zf_create_mpi): the bytes this rank sent to reduce the gradients and to share
   * its host updates' results, and the seconds zf_step spent reducing; 0 in one process */
  uint64_t bytes_reduced, bytes_gathered;
  double reduce_seconds;
} zf_stats;
/* The size of the first zf_stats (0.1.0): the least zf_stats_get accepts. */
#define ZF_STATS_SIZE_0_1 ((size_t)128)

/* The library's version, major * 10000 + minor * 100 + patch: ZENFLOW_VERSION of the zenflow
 * the library was built from. A program loading it at run time compares it with the header's
 * ZENFLOW_VERSION: the zf_stats fields a version older than its header lacks read as zero. */
int zf_version(void) ZF_NOEXCEPT;

/* kind: "zenflow", "zero_offload" or "device_adam". config_json: NULL for the defaults, the
 * "zenflow" block of a DeepSpeed config ({"topk_ratio": 0.1, "update_interval": 4, ...}), or a
 * whole DeepSpeed config (an object with "zero_optimization"; its optimizer.params give lr,
 * betas, eps and weight_decay), which must hold a "zero_optimization.zenflow" block whatever the
 * kind ({} gives the defaults; without one ZenFlow is off in it, and it is refused). The config
 * is read and checked as ZenFlow's whatever the kind; the baselines then fix topk_ratio,
 * update_interval, select_interval, overlap_step and full_warm_up_rounds to their own values
 * (zero_offload: 0, 1, 1, off, 0; device_adam: 1, 1, never, off, 0), so one config serves the
 * three kinds, and those keys change nothing for the baselines. On success *out is the new
 * handle; on failure *out is NULL. */
zf_status zf_create(const char* kind, const char* config_json, zf_optimizer** out) ZF_NOEXCEPT;
/* Releases everything (waits for a host update in flight; a failure of that update is not
 * reported: zf_synchronize first returns it). NULL is allowed. */
void zf_destroy(zf_optimizer* opt) ZF_NOEXCEPT;

/* Registration, before zf_initialize. rows = output features, cols = input features (a column is
 * what ZenFlow selects). *id_out (may be NULL) receives the matrix's or vector's index, each
 * counted from 0 in its own sequence. param and grad must stay valid, in place, until
 * zf_destroy; each aligned to its element size and not overlapping another registered buffer
 * (else ZF_INVALID_ARGUMENT). */
zf_status zf_add_matrix(zf_optimizer* opt, void* param, const void* grad, size_t rows, size_t cols,
                        int param_type, int grad_type, int layout, size_t* id_out) ZF_NOEXCEPT;
zf_status zf_add_vector(zf_optimizer* opt, void* param, const void* grad, size_t n, int param_type, int grad_type,
                        size_t* id_out) ZF_NOEXCEPT;
/* The parameter group of the matrices and vectors registered after this call: a group the config
 * names in "param_groups" ({"param_groups": {"no_decay": {"weight_decay_scale": 0}}}), or NULL
 * for the default group (the config's lr and weight_decay). An unknown name is
 * ZF_INVALID_ARGUMENT and leaves the current group as it was. */
zf_status zf_set_group(zf_optimizer* opt, const char* name) ZF_NOEXCEPT;
zf_status zf_initialize(zf_optimizer* opt) ZF_NOEXCEPT;

/* One step with the gradients now in the grad buffers, which hold the loss scaled by grad_scale.
 * *applied (may be NULL) is 1 if the step was applied, 0 if skipped (a non-finite or overflowing
 * gradient: nothing changed). A param that was not finite at zf_initialize makes every step
 * ZF_INVALID_ARGUMENT (zf_last_error names where), nothing changed, until a zf_load. */
zf_status zf_step(zf_optimizer* opt, float grad_scale, int* applied) ZF_NOEXCEPT;
/* zf_initialize and zf_step with the space's stream: for an optimizer on a GPU (<zenflow/c_cuda.h>)
 * the trainer's cudaStream_t as void* (NULL: the default stream), which the calls without a
 * stream then keep using; an optimizer on the host space has no streams and takes only NULL
 * (anything else is ZF_INVALID_ARGUMENT). A call that fails before it runs (refused) leaves the
 * stream the handle had, and so does a zf_initialize_on_stream that fails. */
zf_status zf_initialize_on_stream(zf_optimizer* opt, void* stream) ZF_NOEXCEPT;
zf_status zf_step_on_stream(zf_optimizer* opt, void* stream, float grad_scale, int* applied) ZF_NOEXCEPT;
zf_status zf_synchronize(zf_optimizer* opt) ZF_NOEXCEPT;
zf_status zf_set_lr(zf_optimizer* opt, float lr) ZF_NOEXCEPT;
/* The counters, into the out_size bytes at out: pass sizeof(zf_stats). The library writes the
 * fields it has that fit, and zeroes the bytes past its own zf_stats (a newer header's fields
 * this library does not know). out_size below ZF_STATS_SIZE_0_1 is ZF_INVALID_ARGUMENT. */
zf_status zf_stats_get(const zf_optimizer* opt, zf_stats* out, size_t out_size) ZF_NOEXCEPT;
/* The fp32 master of matrix `id`, column after column ([cols][rows]), into out, which holds
 * out_count floats: that must be the matrix's rows*cols (else ZF_INVALID_ARGUMENT, nothing
 * written; a vector's id or another matrix's is caught so when the sizes differ). out must be
 * aligned to a float and must not overlap a registered param or grad (else ZF_INVALID_ARGUMENT). */
zf_status zf_copy_master(zf_optimizer* opt, size_t id, float* out, size_t out_count) ZF_NOEXCEPT;

zf_status zf_save(zf_optimizer* opt, const char* path) ZF_NOEXCEPT;
zf_status zf_load(zf_optimizer* opt, const char* path) ZF_NOEXCEPT;

/* The message of the last call on this thread that did not return ZF_OK ("" if none yet). Valid
 * until the next failing call on this thread.
 * A call that fails leaves its out-parameters (*out of zf_create excepted: NULL) as they were,
 * but for zf_copy_master's buffer, which a failure midway may leave partly written. A handle is
 * not to be used from two threads at once. */
const char* zf_last_error(void) ZF_NOEXCEPT;

/* The name of a status code ("ZF_OK", "ZF_UNUSABLE", ...; "unknown zf_status" for any other
 * value), a static string: for logs written away from the failing call, where zf_last_error()
 * may already hold another call's message. */
const char* zf_status_string(int status) ZF_NOEXCEPT;

#ifdef __cplusplus
}
#endif

#endif /* ZENFLOW_C_H */
