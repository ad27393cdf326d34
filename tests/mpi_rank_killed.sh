#!/usr/bin/env bash
# A rank killed in the middle of the ranks' saves (test_mpi's two "killed mid-save" cases, each
# its own job): the writing job must end in failure — the killed rank takes the job down — after
# it had written a complete set, and a new job must load the last complete set exactly and go on
# from it.
#   mpi_rank_killed.sh MPIEXEC TEST_MPI RANKS
set -u
mpiexec=$1 prog=$2 ranks=$3
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ZF_MPI_KILL=write "$mpiexec" -x ZF_MPI_KILL -np "$ranks" "$prog" -tc='*killed mid-save: the writing job*' > "$log" 2>&1; then
  echo "the writing job ended well: no rank was killed"
  cat "$log"
  exit 1
fi
# the doomed rank prints this once the first complete set is saved: a job that failed before
# (a crash, a case renamed so that nothing ran) would leave the check below a set of an earlier run
if ! grep -q "^zf-kill: armed after the complete set" "$log"; then
  echo "the writing job failed before its rank was set to die:"
  cat "$log"
  exit 1
fi
echo "the writing job failed, as it must (a rank killed itself); its last lines:"
tail -5 "$log"
ZF_MPI_KILL=check "$mpiexec" -x ZF_MPI_KILL -np "$ranks" "$prog" -tc='*killed mid-save: the loading job*' \
  --no-colors=true > "$log" 2>&1
rc=$?
# rank 0 ran the loading case (doctest passes a filter that matches nothing; rank 0 prints the
# one full report, and a failure on any rank fails the job's exit status)
if [ "$rc" -ne 0 ] || ! grep -qE "test cases: +1 \| +1 passed" "$log"; then
  cat "$log"
  echo "the loading job: exit $rc, or its one case did not run and pass"
  exit 1
fi
echo "the loading job ran its case and passed; rank 0's report:"
grep -E "^\[doctest\] |the last complete set holds" "$log" | head -6
