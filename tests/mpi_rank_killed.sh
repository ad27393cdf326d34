#!/usr/bin/env bash
# A rank killed in the middle of the ranks' saves (test_mpi's two "killed mid-save" cases, each
# its own job): the writing job must end in failure — the killed rank takes the job down — and a
# new job must load the last complete set exactly and go on from it.
#   mpi_rank_killed.sh MPIEXEC TEST_MPI RANKS
set -u
mpiexec=$1 prog=$2 ranks=$3
log=$(mktemp)
if ZF_MPI_KILL=write "$mpiexec" -x ZF_MPI_KILL -np "$ranks" "$prog" -tc='*killed mid-save: the writing job*' > "$log" 2>&1; then
  echo "the writing job ended well: no rank was killed"
  cat "$log"
  rm -f "$log"
  exit 1
fi
echo "the writing job failed, as it must (a rank killed itself); its last lines:"
tail -5 "$log"
rm -f "$log"
ZF_MPI_KILL=check "$mpiexec" -x ZF_MPI_KILL -np "$ranks" "$prog" -tc='*killed mid-save: the loading job*' -s
