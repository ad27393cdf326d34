/* The C API data parallel over MPI (<zenflow/c_mpi.h>), compiled as C11 by the C compiler and run
 * by mpirun with R ranks. Each rank trains with its own gradients through zf_create_mpi; beside
 * it, on every rank, a one-process handle (zf_create) steps with the ranks' mean gradient worked
 * out here — every rank's gradient summed in rank order in fp32, divided by R, rounded to the
 * grad dtype (nearest even), as the library documents its reduction — and the two must hold the
 * same bits after every step: params, then masters. Every rank must hold the same bits; a save
 * and load resume bit for bit; a kind, path or buffer one rank gets wrong fails that call on
 * every rank (none left waiting), nothing changed. Exit status 0 when every check holds on every
 * rank; each failure is printed with its rank. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>
#include <zenflow/c_mpi.h>

static int failures = 0, me = 0, ranks = 1;
#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "rank %d: %s:%d: CHECK(%s) failed (last error: %s)\n", me, __FILE__, __LINE__, #cond, \
              zf_last_error());                                                               \
      ++failures;                                                                             \
    }                                                                                         \
  } while (0)
#define OK(call) CHECK((call) == ZF_OK)

/* The model: A, fp32 row-major 6 x 10; B, bf16 column-contiguous 8 x 12 (its gradients travel
 * as bf16); a fp32 vector of 5. */
enum { AR = 6, AC = 10, NA = AR * AC, BR = 8, BC = 12, NB = BR * BC, NV = 5, STEPS = 12, SAVE_AT = 6 };
static const char* config_json =
    "{\"zero_optimization\": {\"zenflow\": {\"topk_ratio\": 0.25, \"update_interval\": 2,"
    " \"select_interval\": 4}},"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}}}";

/* bf16 by hand: the upper half of a float, rounded to nearest even (no NaN here) */
static uint16_t bf16_of(float f) {
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

static void init_model(struct model* m) {
  for (size_t i = 0; i < NA; ++i) m->a[i] = 0.05f * (float)(i % 7) - 0.1f;
  for (size_t i = 0; i < NB; ++i) m->b[i] = bf16_of(0.03f * (float)(i % 11) - 0.15f);
  for (size_t i = 0; i < NV; ++i) m->v[i] = 0.2f * (float)i;
}

/* rank r's gradient of element i at step t: the pull towards a target (from the params every
 * rank shares) plus a part of its own, of different weight per column, so the selection moves */
static float grad_of(float p, int r, int t, size_t i, size_t col) {
  const float own = (float)((int)((i * 7u + (size_t)r * 13u + (size_t)t * 5u) % 17u) - 8) * 0.01f;
  return (p - (float)sin((double)i)) + own * (float)(1 + r) * (float)(1 + (col + (size_t)t) % 5);
}

/* this rank's gradients (dp) and the ranks' mean (one), from the params of `at` */
static void gradients(const struct model* at, struct model* dp, struct model* one, int t) {
  const float div = (float)ranks;
  for (size_t i = 0; i < NA; ++i) {
    float s = 0;
    for (int r = 0; r < ranks; ++r) {
      const float g = grad_of(at->a[i], r, t, i, i % AC); /* row-major: column i % cols */
      if (r == me) dp->da[i] = g;
      s = r == 0 ? g : s + g;
    }
    one->da[i] = s / div;
  }
  for (size_t i = 0; i < NB; ++i) {
    float s = 0;
    for (int r = 0; r < ranks; ++r) {
      /* a rank's own gradient is bf16; the reduction widens it (exact) and sums in fp32 */
      const float g = float_of(bf16_of(grad_of(float_of(at->b[i]), r, t, i + 1000, i / BR)));
      if (r == me) dp->db[i] = bf16_of(g);
      s = r == 0 ? g : s + g;
    }
    one->db[i] = bf16_of(s / div);
  }
  for (size_t i = 0; i < NV; ++i) {
    float s = 0;
    for (int r = 0; r < ranks; ++r) {
      const float g = grad_of(at->v[i], r, t, i + 2000, i);
      if (r == me) dp->dv[i] = g;
      s = r == 0 ? g : s + g;
    }
    one->dv[i] = s / div;
  }
}

static int same_params(const struct model* x, const struct model* y) {
  return memcmp(x->a, y->a, sizeof x->a) == 0 && memcmp(x->b, y->b, sizeof x->b) == 0 &&
         memcmp(x->v, y->v, sizeof x->v) == 0;
}

static void add(zf_optimizer* opt, struct model* m) {
  OK(zf_add_matrix(opt, m->a, m->da, AR, AC, ZF_F32, ZF_F32, ZF_ROW_MAJOR, NULL));
  OK(zf_add_matrix(opt, m->b, m->db, BR, BC, ZF_BF16, ZF_BF16, ZF_COLUMN_CONTIGUOUS, NULL));
  OK(zf_add_vector(opt, m->v, m->dv, NV, ZF_F32, ZF_F32, NULL));
}

/* FNV-1a of bytes, to compare the ranks' */
static uint64_t digest(const void* p, size_t n, uint64_t h) {
  const unsigned char* c = (const unsigned char*)p;
  for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}
static uint64_t params_digest(const struct model* m) {
  return digest(m->v, sizeof m->v, digest(m->b, sizeof m->b, digest(m->a, sizeof m->a, 14695981039346656037ull)));
}
static int every_rank_holds(uint64_t h) {
  uint64_t* all = (uint64_t*)malloc(sizeof(uint64_t) * (size_t)ranks);
  int same = all != NULL;
  if (all) {
    MPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    for (int r = 0; r < ranks; ++r) same = same && all[r] == h;
    free(all);
  }
  return same;
}
static int contains(const char* s, const char* part) { return strstr(s, part) != NULL; }

static void trains_as_one_process_fed_the_mean(const char* path) {
  static struct model dp, one, at, first_run;
  zf_optimizer *opt = NULL, *ref = NULL;
  OK(zf_create_mpi("zenflow", config_json, MPI_COMM_WORLD, &opt));
  OK(zf_create("zenflow", config_json, &ref));
  if (!opt || !ref) return;
  init_model(&dp);
  init_model(&one);
  add(opt, &dp);
  add(ref, &one);
  OK(zf_initialize(opt));
  OK(zf_initialize(ref));
  for (int t = 1; t <= STEPS; ++t) {
    at = dp;
    gradients(&at, &dp, &one, t);
    int applied = -1, applied_one = -1;
    OK(zf_step(opt, 1.0f, &applied));
    OK(zf_step(ref, 1.0f, &applied_one));
    CHECK(applied == 1 && applied_one == 1);
    if (!same_params(&dp, &one)) fprintf(stderr, "rank %d: params differ after step %d\n", me, t);
    CHECK(same_params(&dp, &one));
    CHECK(every_rank_holds(params_digest(&dp)));
    if (t == SAVE_AT) OK(zf_save(opt, path));
  }
  zf_stats st;
  OK(zf_stats_get(opt, &st, sizeof st));
  CHECK(st.steps == STEPS && st.selections > 0 && st.host_updates > 0);
  {
    /* the data-parallel counters: traffic and time at R > 1, none in one process (a sum of one is
     * not reduced); after a load every rank's continue from rank 0's (README), the same bits */
    zf_stats one_st, loaded;
    OK(zf_stats_get(ref, &one_st, sizeof one_st));
    CHECK(one_st.bytes_reduced == 0 && one_st.bytes_gathered == 0 && one_st.reduce_seconds == 0.0);
    if (ranks > 1) CHECK(st.bytes_reduced > 0 && st.bytes_gathered > 0 && st.reduce_seconds > 0.0);
    else CHECK(st.bytes_reduced == 0 && st.bytes_gathered == 0 && st.reduce_seconds == 0.0);
    char stats_path[4200]; /* (not path: the set saved at SAVE_AT is resumed below) */
    snprintf(stats_path, sizeof stats_path, "%s.stats", path);
    OK(zf_save(opt, stats_path));
    OK(zf_load(opt, stats_path));
    OK(zf_stats_get(opt, &loaded, sizeof loaded));
    uint64_t seconds_bits;
    memcpy(&seconds_bits, &loaded.reduce_seconds, sizeof seconds_bits);
    const int reduced_held = every_rank_holds(loaded.bytes_reduced); /* (collectives: each on every rank) */
    const int gathered_held = every_rank_holds(loaded.bytes_gathered);
    const int seconds_held = every_rank_holds(seconds_bits);
    CHECK(reduced_held && gathered_held && seconds_held);
    if (me == 0) CHECK(loaded.bytes_reduced == st.bytes_reduced && loaded.bytes_gathered == st.bytes_gathered);
  }
  /* the masters (a collective), the same bits as the one process's and on every rank */
  static float ma[NA], mb[NB], ra[NA], rb[NB];
  OK(zf_copy_master(opt, 0, ma, NA));
  OK(zf_copy_master(opt, 1, mb, NB));
  OK(zf_copy_master(ref, 0, ra, NA));
  OK(zf_copy_master(ref, 1, rb, NB));
  CHECK(memcmp(ma, ra, sizeof ma) == 0 && memcmp(mb, rb, sizeof mb) == 0);
  CHECK(every_rank_holds(digest(ma, sizeof ma, digest(mb, sizeof mb, 14695981039346656037ull))));
  /* resume: the set saved at SAVE_AT loaded, the same steps again: the same bits */
  first_run = dp;
  OK(zf_load(opt, path));
  for (int t = SAVE_AT + 1; t <= STEPS; ++t) {
    at = dp;
    gradients(&at, &dp, &one, t);
    OK(zf_step(opt, 1.0f, NULL));
  }
  CHECK(same_params(&dp, &first_run));
  zf_destroy(opt);
  zf_destroy(ref);
}

/* A call one rank gets wrong fails on every rank, and the run goes on as if it had not been made. */
static void one_rank_wrong(const char* path) {
  const int last = ranks - 1;
  zf_optimizer* opt = NULL;
  /* a kind the last rank misspells: no optimizer anywhere */
  zf_optimizer* none = (zf_optimizer*)&failures;
  CHECK(zf_create_mpi(me == last ? "zenflw" : "zenflow", NULL, MPI_COMM_WORLD, &none) == ZF_INVALID_ARGUMENT);
  CHECK(none == NULL);
  CHECK(contains(zf_last_error(), me == last ? "unknown optimizer 'zenflw'" : "refused on every rank"));
  /* a config one rank cannot read */
  CHECK(zf_create_mpi("zenflow", me == 0 ? "{\"topk_ratio\": 2}" : NULL, MPI_COMM_WORLD, &none) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), me == 0 ? "topk_ratio" : "another rank refused its kind or config"));
  CHECK(zf_create_mpi("zenflow", NULL, MPI_COMM_NULL, &none) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), "MPI_COMM_NULL"));

  static struct model m, before, after;
  OK(zf_create_mpi("zenflow", config_json, MPI_COMM_WORLD, &opt));
  if (!opt) return;
  init_model(&m);
  add(opt, &m);
  /* a stream (the host space has none) on the last rank: refused on every rank, nothing built */
  CHECK(zf_initialize_on_stream(opt, me == last ? (void*)&failures : NULL) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), me == last ? "has no streams" : "another rank's initialize() failed"));
  OK(zf_initialize_on_stream(opt, NULL));
  static struct model scratch;
  gradients(&m, &m, &scratch, 1);
  /* the same in a step: refused on every rank, the gradients still there for the step after */
  CHECK(zf_step_on_stream(opt, me == 0 ? (void*)&failures : NULL, 1.0f, NULL) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), me == 0 ? "has no streams" : "rank 0's call passed an argument it refuses"));
  OK(zf_step(opt, 1.0f, NULL));
  before = m;
  /* a NULL path on the last rank */
  CHECK(zf_save(opt, me == last ? NULL : path) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), me == last ? "path is NULL" : "zf_save refused on every rank"));
  /* a buffer of the wrong size on rank 0 */
  static float master[NA];
  CHECK(zf_copy_master(opt, 0, master, me == 0 ? NA - 1 : NA) == ZF_INVALID_ARGUMENT);
  CHECK(contains(zf_last_error(), me == 0 ? "out holds 59 floats" : "zf_copy_master refused on every rank"));
  CHECK(zf_load(opt, me == last ? NULL : path) == ZF_INVALID_ARGUMENT);
  CHECK(same_params(&m, &before));
  /* nothing changed: the run goes on, on every rank */
  gradients(&m, &m, &scratch, 2);
  OK(zf_step(opt, 1.0f, NULL));
  after = m;
  const int held = every_rank_holds(params_digest(&after)); /* (a collective: called on every rank) */
  CHECK(held && !same_params(&after, &before));
  zf_destroy(opt);

  if (ranks > 1) {
    /* different kinds on different ranks: made, then refused by zf_initialize on every rank */
    OK(zf_create_mpi(me == 0 ? "zenflow" : "zero_offload", NULL, MPI_COMM_WORLD, &opt));
    if (!opt) return;
    init_model(&m);
    add(opt, &m);
    CHECK(zf_initialize(opt) != ZF_OK);
    zf_destroy(opt);
  }
}

/* MPI runs at MPI_THREAD_FUNNELED here (main): zf_create_mpi called from another thread is
 * refused before it calls MPI, on every rank alike, with nothing made. */
struct create_call {
  zf_status status;
  zf_optimizer* opt;
  int named_level; /* the message names the level and the one to ask for */
};
static void* create_on_thread(void* arg) {
  struct create_call* c = (struct create_call*)arg;
  c->opt = (zf_optimizer*)&c->opt; /* (not NULL: the call must set it) */
  c->status = zf_create_mpi("zenflow", config_json, MPI_COMM_WORLD, &c->opt);
  c->named_level = strstr(zf_last_error(), "MPI_THREAD_FUNNELED") != NULL &&
                   strstr(zf_last_error(), "MPI_THREAD_SERIALIZED") != NULL;
  return NULL;
}
static void another_thread_refused(void) {
  struct create_call c = {ZF_OK, NULL, 0};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, create_on_thread, &c) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(c.status == ZF_INVALID_ARGUMENT);
  CHECK(c.opt == NULL);
  CHECK(c.named_level);
  /* and from this thread it works */
  zf_optimizer* opt = NULL;
  OK(zf_create_mpi("zenflow", config_json, MPI_COMM_WORLD, &opt));
  CHECK(opt != NULL);
  zf_destroy(opt);
}

int main(int argc, char** argv) {
  int provided = 0; /* zenflow runs threads of its own; only this one calls MPI */
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const char* dir = argc > 1 ? argv[1] : ".";
  char path[4096];
  snprintf(path, sizeof path, "%s/c_api_mpi_%d.zfckpt", dir, ranks);
  trains_as_one_process_fed_the_mean(path);
  one_rank_wrong(path);
  another_thread_refused();
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (me == 0) {
    if (all) fprintf(stderr, "%d check(s) failed\n", all);
    else printf("C API over MPI, %d rank(s): all checks passed\n", ranks);
  }
  MPI_Finalize();
  return all ? 1 : 0;
}
