/* A C consumer of the installed package's data-parallel C API (zenflow::c_mpi): a few steps on
 * the ranks it is run with (one, in the package test). */
#include <stdio.h>

#include <mpi.h>
#include <zenflow/c_mpi.h>

int main(int argc, char** argv) {
  int provided = 0; /* zenflow runs threads of its own; only this one calls MPI */
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  float w[16] = {0}, g[16];
  for (int i = 0; i < 16; ++i) g[i] = 0.01f * (float)(i - 8);
  zf_optimizer* opt = NULL;
  int failed = zf_create_mpi("zenflow", NULL, MPI_COMM_WORLD, &opt) != ZF_OK ||
               zf_add_matrix(opt, w, g, 4, 4, ZF_F32, ZF_F32, ZF_ROW_MAJOR, NULL) || zf_initialize(opt) ||
               zf_step(opt, 1.0f, NULL) || zf_synchronize(opt);
  if (failed) fprintf(stderr, "consumer_c_mpi: %s\n", zf_last_error());
  zf_destroy(opt);
  MPI_Finalize();
  if (!failed) printf("consumer_c_mpi: ok (w[0] = %g)\n", (double)w[0]);
  return failed || w[0] == 0.0f;
}
