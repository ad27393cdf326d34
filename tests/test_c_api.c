/* The C API, compiled as C11 by the C compiler: device_adam against a double-precision AdamW
 * written here (the obviously correct loop), zenflow training a least-squares fit and resuming
 * from a checkpoint bit for bit, and each kind of bad call's status code and message. Exit status
 * 0 when every check holds; each failure is printed. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zenflow/c.h>

static int failures = 0;
#define CHECK(cond)                                                    \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                      \
    }                                                                  \
  } while (0)
#define OK(call) CHECK((call) == ZF_OK)

enum { R = 6, C = 10, N = R * C, V = 5, STEPS = 25 };

/* Gradient of 0.5 * |p - target|^2: p - target, target(i) = sin(i). */
static void gradients(const float* p, float* g, size_t n, size_t offset) {
  for (size_t i = 0; i < n; ++i) g[i] = p[i] - (float)sin((double)(i + offset));
}

static void device_adam_against_reference(void) {
  /* hyperparameters as JSON: a whole DeepSpeed config carries them, and a parameter group for
   * the bias (half the lr, no weight decay) */
  const char* json =
      "{\"zero_optimization\": {\"zenflow\": {\"topk_ratio\": 0.1,"
      " \"param_groups\": {\"bias\": {\"lr_scale\": 0.5, \"weight_decay_scale\": 0}}}},"
      " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"betas\": [0.9, 0.999],"
      " \"eps\": 1e-8, \"weight_decay\": 0.1}}}";
  zf_optimizer* opt = NULL;
  OK(zf_create("device_adam", json, &opt));
  if (!opt) return;
  float w[N], dw[N], b[V], db[V];
  double rw[N], rb[V], m[N + V], v[N + V];
  for (size_t i = 0; i < N; ++i) rw[i] = w[i] = 0.05f * (float)(i % 7);
  for (size_t i = 0; i < V; ++i) rb[i] = b[i] = -0.1f * (float)i;
  memset(m, 0, sizeof m);
  memset(v, 0, sizeof v);
  size_t mid = 99, vid = 99;
  OK(zf_add_matrix(opt, w, dw, R, C, ZF_F32, ZF_F32, ZF_ROW_MAJOR, &mid));
  OK(zf_set_group(opt, "bias"));
  OK(zf_add_vector(opt, b, db, V, ZF_F32, ZF_F32, &vid));
  OK(zf_set_group(opt, NULL));
  CHECK(mid == 0 && vid == 0);
  OK(zf_initialize(opt));
  for (int t = 1; t <= STEPS; ++t) {
    gradients(w, dw, N, 0);
    gradients(b, db, V, 100);
    int applied = -1;
    OK(zf_step(opt, 1.0f, &applied));
    CHECK(applied == 1);
    /* the reference: decoupled weight decay, then Adam with bias correction, in double; the
     * bias in its group: lr 0.005, no decay */
    for (size_t i = 0; i < N + V; ++i) {
      double* p = i < N ? &rw[i] : &rb[i - N];
      const double g = (double)(i < N ? dw[i] : db[i - N]);
      const double lr = i < N ? 0.01 : 0.005, wd = i < N ? 0.1 : 0.0;
      *p *= 1.0 - lr * wd;
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      const double mh = m[i] / (1.0 - pow(0.9, t)), vh = v[i] / (1.0 - pow(0.999, t));
      *p -= lr * mh / (sqrt(vh) + 1e-8);
    }
  }
  /* fp32 against double: each step's update is about lr = 0.01 with a relative rounding error
   * near 1e-7, and the decay and moments round likewise; 25 steps stay below 1e-5 absolute */
  double worst = 0;
  for (size_t i = 0; i < N; ++i) worst = fmax(worst, fabs((double)w[i] - rw[i]));
  for (size_t i = 0; i < V; ++i) worst = fmax(worst, fabs((double)b[i] - rb[i]));
  if (worst >= 1e-5) fprintf(stderr, "device_adam vs reference: worst difference %g\n", worst);
  CHECK(worst < 1e-5);
  zf_stats st;
  OK(zf_stats_get(opt, &st, sizeof st));
  CHECK(st.steps == STEPS && st.skipped_steps == 0 && st.host_updates == 0);
  zf_destroy(opt);
}

static double loss(const float* w) {
  double l = 0;
  for (size_t i = 0; i < N; ++i) {
    const double d = (double)w[i] - sin((double)i);
    l += 0.5 * d * d;
  }
  return l;
}

/* n steps on the least-squares gradient, then the host update in flight lands */
static void steps(zf_optimizer* opt, float* w, float* dw, int n) {
  for (int t = 0; t < n; ++t) {
    gradients(w, dw, N, 0);
    OK(zf_step(opt, 1.0f, NULL));
  }
  OK(zf_synchronize(opt));
}

static void zenflow_trains_and_resumes(const char* path) {
  zf_optimizer* opt = NULL;
  OK(zf_create("zenflow", "{\"topk_ratio\": 0.2, \"update_interval\": 2}", &opt));
  if (!opt) return;
  float w[N], dw[N], saved[N], again[N];
  for (size_t i = 0; i < N; ++i) w[i] = 0;
  OK(zf_add_matrix(opt, w, dw, R, C, ZF_F32, ZF_F32, ZF_COLUMN_CONTIGUOUS, NULL));
  OK(zf_set_lr(opt, 0.05f));
  OK(zf_initialize_on_stream(opt, NULL)); /* (the host space: no stream, as zf_initialize) */
  const double before = loss(w);
  steps(opt, w, dw, 40);
  CHECK(loss(w) < 0.5 * before); /* it learns */
  zf_stats st;
  OK(zf_stats_get(opt, &st, sizeof st));
  CHECK(st.selections > 0 && st.host_updates > 0 && st.bytes_to_host > 0);
  /* save, go on 6 steps, load, the same 6 steps: the same bits */
  OK(zf_save(opt, path));
  steps(opt, w, dw, 6);
  memcpy(saved, w, sizeof w);
  OK(zf_load(opt, path));
  steps(opt, w, dw, 6);
  memcpy(again, w, sizeof w);
  CHECK(memcmp(saved, again, sizeof w) == 0);
  float master[N];
  OK(zf_copy_master(opt, 0, master, N));
  CHECK(memcmp(master, w, sizeof w) == 0); /* fp32 params: the visible params are the masters */
  zf_destroy(opt);
  remove(path);
}

static int contains(const char* s, const char* part) { return strstr(s, part) != NULL; }

static void bad_calls(const char* dir) {
  zf_optimizer* opt = (zf_optimizer*)&failures; /* overwritten with NULL on failure */
  zf_optimizer* opt2 = (zf_optimizer*)&failures;
  CHECK(zf_create("adam", NULL, &opt) == ZF_INVALID_ARGUMENT);
  CHECK(opt == NULL);
  CHECK(contains(zf_last_error(), "unknown optimizer 'adam'"));
  CHECK(zf_create("zenflow", "{\"topk_ratio\": 3}", &opt) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), "topk_ratio"));
  CHECK(zf_create("zenflow", "{not json", &opt) == ZF_INVALID_ARGUMENT);
  CHECK(zf_step(NULL, 1.0f, NULL) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), "handle is NULL"));
  zf_destroy(NULL);

  OK(zf_create("zenflow", NULL, &opt));
  float w[N], dw[N];
  memset(w, 0, sizeof w);
  memset(dw, 0, sizeof dw);
  CHECK(zf_add_matrix(opt, NULL, dw, R, C, ZF_F32, ZF_F32, ZF_ROW_MAJOR, NULL) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), "matrix 0: param is null"));
  CHECK(zf_add_matrix(opt, w, dw, R, C, 7, ZF_F32, ZF_ROW_MAJOR, NULL) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), "unknown dtype"));
  CHECK(zf_add_matrix(opt, w, dw, R, C, ZF_F32, ZF_F32, 2, NULL) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), "unknown layout"));
  CHECK(zf_add_vector(opt, w, dw, N, ZF_F32, -1, NULL) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), "unknown dtype"));
  /* a buffer off its element's alignment; rows * cols past what a size_t holds */
  CHECK(zf_add_matrix(opt, (char*)w + 1, dw, R, C, ZF_F32, ZF_F32, ZF_ROW_MAJOR, NULL) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), "aligned"));
  CHECK(zf_add_matrix(opt, w, dw, (size_t)-1, 2, ZF_F32, ZF_F32, ZF_ROW_MAJOR, NULL) == ZF_INVALID_ARGUMENT);
  CHECK(zf_create(NULL, NULL, &opt2) == ZF_INVALID_ARGUMENT);
  CHECK(opt2 == NULL);
  CHECK(zf_create("zenflow", NULL, NULL) == ZF_INVALID_ARGUMENT);
  CHECK(zf_stats_get(opt, NULL, sizeof(zf_stats)) == ZF_INVALID_ARGUMENT);
  CHECK(zf_copy_master(opt, 0, NULL, N) == ZF_INVALID_ARGUMENT);
  CHECK(zf_save(opt, NULL) == ZF_INVALID_ARGUMENT);
  CHECK(zf_load(opt, NULL) == ZF_INVALID_ARGUMENT);
  CHECK(zf_step(opt, 1.0f, NULL) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), "step() before initialize()"));
  CHECK(zf_set_group(opt, "no_decay") == ZF_INVALID_ARGUMENT); /* the config defines no group */
  CHECK(contains(zf_last_error(), "no parameter group \"no_decay\" (defined: none)"));
  OK(zf_add_matrix(opt, w, dw, R, C, ZF_F32, ZF_F32, ZF_ROW_MAJOR, NULL));
  CHECK(zf_initialize_on_stream(opt, (void*)&failures) == ZF_INVALID_ARGUMENT); /* no streams here */
  CHECK(contains(zf_last_error(), "no streams"));
  OK(zf_initialize(opt)); /* (the refused call changed nothing) */
  CHECK(zf_initialize(opt) == ZF_INVALID_ARGUMENT); /* twice */
  CHECK(zf_save(opt, "") == ZF_INVALID_ARGUMENT);    /* (not "cannot rename ... to ") */
  CHECK(contains(zf_last_error(), "save(): the path is empty"));
  {
    /* zf_stats_get writes out_size bytes: a caller built against a newer header (a bigger
     * zf_stats) gets this header's fields, then zeros; one smaller than 0.1.0's is refused and
     * its buffer left alone */
    struct {
      zf_stats s;
      unsigned char newer[24];
    } big;
    zf_stats st;
    memset(&big, 0xab, sizeof big);
    OK(zf_stats_get(opt, &st, sizeof st));
    OK(zf_stats_get(opt, &big.s, sizeof big));
    CHECK(memcmp(&big.s, &st, sizeof st) == 0);
    int zeros = 1;
    for (size_t i = 0; i < sizeof big.newer; ++i) zeros = zeros && big.newer[i] == 0;
    CHECK(zeros);
    CHECK(sizeof(zf_stats) >= ZF_STATS_SIZE_0_1);
    memset(&st, 0xab, sizeof st);
    CHECK(zf_stats_get(opt, &st, ZF_STATS_SIZE_0_1 - 1) == ZF_INVALID_ARGUMENT);
    CHECK(contains(zf_last_error(), "out_size is smaller than any zf_stats"));
    CHECK(st.steps == 0xababababababababull);
    CHECK(zf_version() == ZENFLOW_VERSION);
  }
  float b[V], db[V];
  memset(b, 0, sizeof b);
  memset(db, 0, sizeof db);
  CHECK(zf_add_vector(opt, b, db, V, ZF_F32, ZF_F32, NULL) == ZF_INVALID_ARGUMENT); /* after it */
  CHECK(contains(zf_last_error(), "initialize"));
  /* the stream variants: the host space has no streams, so only NULL, and then as without */
  CHECK(zf_step_on_stream(opt, (void*)&failures, 1.0f, NULL) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), "this optimizer's space has no streams; pass no stream"));
  {
    zf_stats before, after;
    int applied = -1;
    OK(zf_stats_get(opt, &before, sizeof before));
    OK(zf_step_on_stream(opt, NULL, 1.0f, &applied));
    OK(zf_stats_get(opt, &after, sizeof after));
    CHECK(applied == 1 && after.steps == before.steps + 1);
  }
  CHECK(zf_step(opt, -1.0f, NULL) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), "grad_scale must be finite and > 0"));
  dw[3] = NAN;
  int applied = -1;
  OK(zf_step(opt, 1.0f, &applied)); /* a non-finite gradient is a skipped step, not an error */
  CHECK(applied == 0);
  char path[4096];
  snprintf(path, sizeof path, "%s/no-such-dir/x.zfckpt", dir);
  CHECK(zf_save(opt, path) == ZF_IO_ERROR);
  CHECK(contains(zf_last_error(), "cannot create"));
  snprintf(path, sizeof path, "%s/no-such-file.zfckpt", dir);
  CHECK(zf_load(opt, path) == ZF_CHECKPOINT_ERROR);
  CHECK(contains(zf_last_error(), "cannot open the file"));
  CHECK(zf_copy_master(opt, 1, w, N) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), "no matrix 1"));
  /* a buffer of another size than the matrix's: refused, nothing written */
  memset(w, 0x7f, sizeof w);
  CHECK(zf_copy_master(opt, 0, w, N - 1) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), "out holds 59 floats, matrix 0 has 60 (rows * cols)"));
  CHECK(w[0] == w[N - 1] && w[0] != 0.0f);
  zf_destroy(opt);
}

/* Each code's name is its enumerator's spelling (the reference is the header's own names, typed
 * out here), and values outside the enum, negative or past the last, get the fallback. */
static void status_names(void) {
  CHECK(strcmp(zf_status_string(ZF_OK), "ZF_OK") == 0);
  CHECK(strcmp(zf_status_string(ZF_INVALID_ARGUMENT), "ZF_INVALID_ARGUMENT") == 0);
  CHECK(strcmp(zf_status_string(ZF_CHECKPOINT_ERROR), "ZF_CHECKPOINT_ERROR") == 0);
  CHECK(strcmp(zf_status_string(ZF_IO_ERROR), "ZF_IO_ERROR") == 0);
  CHECK(strcmp(zf_status_string(ZF_OUT_OF_MEMORY), "ZF_OUT_OF_MEMORY") == 0);
  CHECK(strcmp(zf_status_string(ZF_UNUSABLE), "ZF_UNUSABLE") == 0);
  CHECK(strcmp(zf_status_string(ZF_INTERNAL_ERROR), "ZF_INTERNAL_ERROR") == 0);
  CHECK(strcmp(zf_status_string(ZF_INTERNAL_ERROR + 1), "unknown zf_status") == 0);
  CHECK(strcmp(zf_status_string(-1), "unknown zf_status") == 0);
  CHECK(strcmp(zf_status_string(INT_MIN), "unknown zf_status") == 0);
  /* a status from a real failure names itself, and leaves the thread's message alone */
  zf_optimizer* opt = NULL;
  const zf_status st = zf_create("no such kind", NULL, &opt);
  CHECK(st == ZF_INVALID_ARGUMENT && opt == NULL);
  CHECK(strcmp(zf_status_string(st), "ZF_INVALID_ARGUMENT") == 0);
  CHECK(contains(zf_last_error(), "no such kind"));
}

/* A whole DeepSpeed config needs its zero_optimization.zenflow block whatever the kind (c.h). */
static void deepspeed_config_block(void) {
  static const char* kinds[] = {"zenflow", "zero_offload", "device_adam"};
  for (int k = 0; k < 3; ++k) {
    zf_optimizer* opt = NULL;
    CHECK(zf_create(kinds[k], "{\"zero_optimization\": {\"stage\": 2}, \"optimizer\": {\"params\": {\"lr\": 0.01}}}",
                    &opt) == ZF_INVALID_ARGUMENT);
    CHECK(opt == NULL);
    CHECK(contains(zf_last_error(), "has no zero_optimization.zenflow block"));
    CHECK(zf_create(kinds[k], "{\"zero_optimization\": {\"stage\": 2, \"zenflow\": {}}, \"optimizer\": {\"params\": {\"lr\": 0.01}}}",
                    &opt) == ZF_OK);
    zf_destroy(opt);
  }
}

/* A NaN param at zf_initialize: accepted there (a resume may load after), every step refused
 * with ZF_INVALID_ARGUMENT naming where, nothing changed (the C++ tests check that a load clears it). */
static void non_finite_param(void) {
  zf_optimizer* opt = NULL;
  OK(zf_create("zenflow", NULL, &opt));
  if (!opt) return;
  float w[N], dw[N];
  for (size_t i = 0; i < N; ++i) w[i] = 0.5f, dw[i] = 0.01f;
  w[2 * C + 3] = NAN; /* row 2, column 3 of the row-major matrix */
  OK(zf_add_matrix(opt, w, dw, R, C, ZF_F32, ZF_F32, ZF_ROW_MAJOR, NULL));
  OK(zf_initialize(opt));
  for (int attempt = 0; attempt < 2; ++attempt) {
    int applied = -1;
    CHECK(zf_step(opt, 1.0f, &applied) == ZF_INVALID_ARGUMENT);
    CHECK(contains(zf_last_error(), "step() refused: matrix 0's param held nan at row 2, column 3 at initialize()"));
  }
  zf_stats st;
  OK(zf_stats_get(opt, &st, sizeof st));
  CHECK(st.steps == 0);
  CHECK(w[0] == 0.5f && isnan(w[2 * C + 3]));
  zf_destroy(opt);
}

int main(int argc, char** argv) {
  const char* dir = argc > 1 ? argv[1] : ".";
  char path[4096];
  snprintf(path, sizeof path, "%s/c_api.zfckpt", dir);
  device_adam_against_reference();
  zenflow_trains_and_resumes(path);
  bad_calls(dir);
  non_finite_param();
  status_names();
  deepspeed_config_block();
  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  else printf("C API: all checks passed\n");
  return failures ? 1 : 0;
}
