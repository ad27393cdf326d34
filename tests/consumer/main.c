/* A C consumer of the installed package: a few steps through the C API. */
#include <stdio.h>

#include <zenflow/c.h>

int main(void) {
  float w[16] = {0}, g[16];
  for (int i = 0; i < 16; ++i) g[i] = 0.01f * (float)(i - 8);
  zf_optimizer* opt = NULL;
  if (zf_create("zenflow", NULL, &opt) != ZF_OK || zf_add_matrix(opt, w, g, 4, 4, ZF_F32, ZF_F32, ZF_ROW_MAJOR, NULL) ||
      zf_initialize(opt) || zf_step(opt, 1.0f, NULL) || zf_synchronize(opt)) {
    fprintf(stderr, "consumer_c: %s\n", zf_last_error());
    zf_destroy(opt);
    return 1;
  }
  zf_destroy(opt);
  printf("consumer_c: ok (w[0] = %g)\n", (double)w[0]);
  return w[0] != 0.0f ? 0 : 1;
}
