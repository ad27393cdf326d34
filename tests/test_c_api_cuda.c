/* The C API on a GPU (<zenflow/c_cuda.h>), compiled as C11 by the C compiler.
 * Without a usable GPU (CI): zf_create_cuda and the registrations succeed, zf_initialize fails
 * with ZF_IO_ERROR naming CUDA's refusal and leaves the handle uninitialised (zf_step refused);
 * then the GPU half is reported skipped (exit 77).
 * With a GPU: one model trained twice with the same gradients, through zf_create_cuda on device
 * buffers and through zf_create on host buffers, must hold the same bits after every step (the
 * CUDA space computes the host space's bits: README), masters included, for the three kinds;
 * a save and load on the GPU resume bit for bit. Exit status 0 when every check holds. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <zenflow/c_cuda.h>

static int failures = 0;
#define CHECK(cond)                                                                                     \
  do {                                                                                                  \
    if (!(cond)) {                                                                                      \
      fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: %s)\n", __FILE__, __LINE__, #cond, zf_last_error()); \
      ++failures;                                                                                       \
    }                                                                                                   \
  } while (0)
#define OK(call) CHECK((call) == ZF_OK)
#define CUDA_OK(call) CHECK((call) == cudaSuccess)

static int contains(const char* s, const char* part) { return strstr(s, part) != NULL; }

/* The model: A, fp32 row-major 6 x 10; B, bf16 column-contiguous 8 x 12; a fp32 vector of 5. */
enum { AR = 6, AC = 10, NA = AR * AC, BR = 8, BC = 12, NB = BR * BC, NV = 5, STEPS = 12, SAVE_AT = 6 };
static const char* config_json = "{\"topk_ratio\": 0.25, \"update_interval\": 2, \"select_interval\": 4}";

static uint16_t bf16_of(float f) { /* nearest even (no NaN here) */
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float float_of(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

struct model {
  float a[NA], da[NA], v[NV], dv[NV];
  uint16_t b[NB], db[NB];
};
/* the same model in device memory */
struct device_model {
  float *a, *da, *v, *dv;
  uint16_t *b, *db;
};

static void init_model(struct model* m) {
  for (size_t i = 0; i < NA; ++i) m->a[i] = 0.05f * (float)(i % 7) - 0.1f;
  for (size_t i = 0; i < NB; ++i) m->b[i] = bf16_of(0.03f * (float)(i % 11) - 0.15f);
  for (size_t i = 0; i < NV; ++i) m->v[i] = 0.2f * (float)i;
}
/* the pull towards a target plus a part of different weight per column and step (the selection moves) */
static void gradients(struct model* m, int t) {
  for (size_t i = 0; i < NA; ++i)
    m->da[i] = (m->a[i] - (float)sin((double)i)) * (float)(1 + (i % AC + (size_t)t) % 5);
  for (size_t i = 0; i < NB; ++i)
    m->db[i] = bf16_of((float_of(m->b[i]) - (float)cos((double)i)) * (float)(1 + (i / BR + (size_t)t) % 5));
  for (size_t i = 0; i < NV; ++i) m->dv[i] = m->v[i] - 0.5f;
}

static void add(zf_optimizer* opt, float* a, float* da, uint16_t* b, uint16_t* db, float* v, float* dv) {
  OK(zf_add_matrix(opt, a, da, AR, AC, ZF_F32, ZF_F32, ZF_ROW_MAJOR, NULL));
  OK(zf_add_matrix(opt, b, db, BR, BC, ZF_BF16, ZF_BF16, ZF_COLUMN_CONTIGUOUS, NULL));
  OK(zf_add_vector(opt, v, dv, NV, ZF_F32, ZF_F32, NULL));
}

static void no_gpu(void) {
  static struct model m;
  init_model(&m);
  zf_optimizer* opt = NULL;
  OK(zf_create_cuda("zenflow", config_json, &opt));
  if (!opt) return;
  add(opt, m.a, m.da, m.b, m.db, m.v, m.dv); /* (registration touches no GPU) */
  CHECK(zf_initialize(opt) == ZF_IO_ERROR);
  CHECK(contains(zf_last_error(), "cuda_space needs a CUDA GPU"));
  CHECK(zf_step(opt, 1.0f, NULL) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), "step() before initialize()"));
  zf_destroy(opt);
  zf_optimizer* none = (zf_optimizer*)&failures;
  CHECK(zf_create_cuda("adam", NULL, &none) == ZF_INVALID_ARGUMENT && none == NULL);
  CHECK(contains(zf_last_error(), "unknown optimizer 'adam'"));
}

static void download(struct model* out, const struct device_model* d) {
  CUDA_OK(cudaMemcpy(out->a, d->a, sizeof out->a, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(out->b, d->b, sizeof out->b, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(out->v, d->v, sizeof out->v, cudaMemcpyDeviceToHost));
}
static void upload_grads(struct device_model* d, const struct model* m) {
  CUDA_OK(cudaMemcpy(d->da, m->da, sizeof m->da, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d->db, m->db, sizeof m->db, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d->dv, m->dv, sizeof m->dv, cudaMemcpyHostToDevice));
}
static int same_params(const struct model* x, const struct model* y) {
  return memcmp(x->a, y->a, sizeof x->a) == 0 && memcmp(x->b, y->b, sizeof x->b) == 0 &&
         memcmp(x->v, y->v, sizeof x->v) == 0;
}

/* one kind, on the GPU against the host space, step by step */
static void gpu_equals_host(const char* kind, const char* path) {
  static struct model host, seen, first_run;
  struct device_model d;
  CUDA_OK(cudaMalloc((void**)&d.a, sizeof host.a));
  CUDA_OK(cudaMalloc((void**)&d.da, sizeof host.da));
  CUDA_OK(cudaMalloc((void**)&d.b, sizeof host.b));
  CUDA_OK(cudaMalloc((void**)&d.db, sizeof host.db));
  CUDA_OK(cudaMalloc((void**)&d.v, sizeof host.v));
  CUDA_OK(cudaMalloc((void**)&d.dv, sizeof host.dv));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  init_model(&host);
  CUDA_OK(cudaMemcpy(d.a, host.a, sizeof host.a, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d.b, host.b, sizeof host.b, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d.v, host.v, sizeof host.v, cudaMemcpyHostToDevice));
  zf_optimizer *gpu = NULL, *ref = NULL;
  OK(zf_create_cuda(kind, config_json, &gpu));
  OK(zf_create(kind, config_json, &ref));
  if (gpu && ref) {
    add(gpu, d.a, d.da, d.b, d.db, d.v, d.dv);
    add(ref, host.a, host.da, host.b, host.db, host.v, host.dv);
    OK(zf_initialize_on_stream(gpu, stream));
    OK(zf_initialize(ref));
    for (int t = 1; t <= STEPS; ++t) {
      gradients(&host, t); /* from the host params, which the GPU's equal */
      upload_grads(&d, &host);
      int applied = -1;
      OK(zf_step_on_stream(gpu, stream, 1.0f, &applied));
      OK(zf_step(ref, 1.0f, NULL));
      CHECK(applied == 1);
      CUDA_OK(cudaStreamSynchronize(stream));
      download(&seen, &d);
      if (!same_params(&seen, &host)) fprintf(stderr, "%s: params differ after step %d\n", kind, t);
      CHECK(same_params(&seen, &host));
      if (t == SAVE_AT) OK(zf_save(gpu, path));
    }
    static float mg[NB], mh[NB];
    OK(zf_copy_master(gpu, 1, mg, NB));
    OK(zf_copy_master(ref, 1, mh, NB));
    CHECK(memcmp(mg, mh, sizeof mg) == 0);
    /* resume on the GPU from the save at SAVE_AT: the same steps, the same bits */
    first_run = seen;
    OK(zf_load(gpu, path));
    download(&seen, &d);
    for (int t = SAVE_AT + 1; t <= STEPS; ++t) {
      gradients(&seen, t);
      upload_grads(&d, &seen);
      OK(zf_step_on_stream(gpu, stream, 1.0f, NULL));
      CUDA_OK(cudaStreamSynchronize(stream));
      download(&seen, &d);
    }
    CHECK(same_params(&seen, &first_run));
  }
  zf_destroy(gpu);
  zf_destroy(ref);
  remove(path);
  cudaStreamDestroy(stream);
  cudaFree(d.a), cudaFree(d.da), cudaFree(d.b), cudaFree(d.db), cudaFree(d.v), cudaFree(d.dv);
}

int main(int argc, char** argv) {
  const char* dir = argc > 1 ? argv[1] : ".";
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    no_gpu();
    if (failures) {
      fprintf(stderr, "%d check(s) failed\n", failures);
      return 1;
    }
    /* no device, or no NVIDIA driver installed at all (error 35 without its control device):
     * a machine without a GPU, skipped; any other error (a driver older than the runtime, a
     * device failing to initialise) is a broken GPU set-up: failed */
    const int no_driver = e == cudaErrorInsufficientDriver && access("/dev/nvidiactl", F_OK) != 0 &&
                          access("/proc/driver/nvidia/version", F_OK) != 0;
    if (e != cudaSuccess && e != cudaErrorNoDevice && !no_driver) {
      fprintf(stderr, "C API on CUDA: the GPU cannot be used: %s (%s): a broken GPU set-up\n", cudaGetErrorString(e),
              cudaGetErrorName(e));
      return 1;
    }
    printf("C API on CUDA: no GPU (%s); the no-GPU path passed, the GPU half is skipped\n",
           e != cudaSuccess ? cudaGetErrorName(e) : "no device");
    return 77;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/c_api_cuda.zfckpt", dir);
  gpu_equals_host("zenflow", path);
  gpu_equals_host("zero_offload", path);
  gpu_equals_host("device_adam", path);
  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  else printf("C API on CUDA: all checks passed\n");
  return failures ? 1 : 0;
}
