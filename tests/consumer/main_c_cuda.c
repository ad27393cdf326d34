/* A C consumer of the installed package's C API on the CUDA space (zenflow::c_cuda). Runs with or
 * without a GPU: without one, zf_initialize must fail with ZF_IO_ERROR. */
#include <stdio.h>

#include <cuda_runtime_api.h>
#include <zenflow/c_cuda.h>

int main(void) {
  int n = 0;
  const int gpu = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  static float host[64 * 64], host_grad[64 * 64];
  float *w = host, *g = host_grad; /* without a GPU never dereferenced: zf_initialize fails first */
  if (gpu && (cudaMalloc((void**)&w, sizeof host) != cudaSuccess || cudaMalloc((void**)&g, sizeof host) != cudaSuccess ||
              cudaMemset(w, 0, sizeof host) != cudaSuccess || cudaMemset(g, 0, sizeof host) != cudaSuccess))
    return 1;
  zf_optimizer* opt = NULL;
  if (zf_create_cuda("zenflow", NULL, &opt) != ZF_OK ||
      zf_add_matrix(opt, w, g, 64, 64, ZF_F32, ZF_F32, ZF_ROW_MAJOR, NULL) != ZF_OK) {
    fprintf(stderr, "consumer_c_cuda: %s\n", zf_last_error());
    return 1;
  }
  const zf_status s = zf_initialize_on_stream(opt, NULL);
  int ok = gpu ? s == ZF_OK && zf_step_on_stream(opt, NULL, 1.0f, NULL) == ZF_OK : s == ZF_IO_ERROR;
  printf("consumer_c_cuda %s%s: %s\n", ok ? "ok" : "FAILED", gpu ? " on the GPU" : " without a GPU",
         s == ZF_OK ? "a step" : zf_last_error());
  zf_destroy(opt);
  return ok ? 0 : 1;
}
