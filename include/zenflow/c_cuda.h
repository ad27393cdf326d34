/* zenflow's C API on a GPU: zf_create_cuda makes an optimizer on the CUDA space (the C++
 * optimizer<cuda_space>; README, "On a GPU"). Every other function is <zenflow/c.h>'s, on the
 * handle it returns, with these differences:
 *   - the params and grads given to zf_add_matrix / zf_add_vector are memory of the GPU —
 *     cudaMalloc'd, managed, or page-locked host memory — checked by zf_initialize, which
 *     refuses plain host memory, another GPU's memory and a buffer shorter than its shape
 *     (ZF_INVALID_ARGUMENT);
 *   - the GPU is the one current on the calling thread when zf_initialize runs;
 *   - zf_initialize_on_stream and zf_step_on_stream (in <zenflow/c.h>) take the trainer's
 *     cudaStream_t as a void* (NULL: the default stream): the step's device work is enqueued on
 *     it after the trainer's backward; zf_initialize and zf_step use the stream of the last call
 *     that gave one (at first the default stream);
 *   - zf_copy_master's out is host memory (device memory is refused);
 *   - a CUDA failure (no GPU, no driver, a failed launch) returns ZF_IO_ERROR, device or
 *     page-locked memory the runtime could not give (cudaErrorMemoryAllocation)
 *     ZF_OUT_OF_MEMORY, each with a message naming the CUDA call and error — or ZF_UNUSABLE
 *     when the failure came midway through a step or a load (c.h); without a GPU, zf_create_cuda
 *     and the registrations succeed and zf_initialize fails with ZF_IO_ERROR, leaving the
 *     handle uninitialised with its registrations.
 * Link the zenflow::c_cuda library (CMake; built when a CUDA compiler is found), or compile
 * <zenflow/c_cuda_impl.hpp> into one .cu file of your own (nvcc, C++20) beside <zenflow/c_impl.hpp>.
 *
 *   zf_optimizer* opt;
 *   zf_create_cuda("zenflow", NULL, &opt);
 *   zf_add_matrix(opt, d_w, d_dw, out, in, ZF_BF16, ZF_BF16, ZF_ROW_MAJOR, NULL);
 *   zf_initialize_on_stream(opt, stream);
 *   for (...) { forward_backward(stream); zf_step_on_stream(opt, stream, loss_scale, NULL); }
 *   zf_destroy(opt);
 */
#ifndef ZENFLOW_C_CUDA_H
#define ZENFLOW_C_CUDA_H

#include "c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kind and config_json as zf_create's. Touches no GPU (zf_initialize chooses it). */
zf_status zf_create_cuda(const char* kind, const char* config_json, zf_optimizer** out) ZF_NOEXCEPT;

#ifdef __cplusplus
}
#endif

#endif /* ZENFLOW_C_CUDA_H */
