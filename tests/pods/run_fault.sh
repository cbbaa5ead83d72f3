#!/usr/bin/env bash
# Runs a failure mode of the MPI engine between pods (mpi_engine_fault.cc)
# under mpirun with 3 ranks and checks that every rank that should report
# did, with PASS. Usage: run_fault.sh MPIRUN PROGRAM deadline|kill|notice
#
# mpirun (Open MPI 4.1) aborts the whole job as soon as one rank is killed
# or exits non-zero: the survivors would be killed before they could
# report. orte_abort_on_non_zero_status=0 keeps them running, so each
# meets its own deadline and reports; the job still ends (each survivor
# exits after reporting) and mpirun's own exit code is not what we check.
set -uo pipefail
mpirun=$1 program=$2 mode=$3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
case $mode in
  deadline) expect=(0 1) ;;  # rank 2 never joins
  kill) expect=(0 2) ;;      # rank 1 kills itself
  notice) expect=(0 1 2) ;;  # rank 0 aborts; 1 and 2 hear it
  *) echo "unknown mode $mode"; exit 2 ;;
esac
start=$(date +%s)
CXLRT_FAULT_OUT=$out timeout 60 "$mpirun" -n 3 --mca orte_abort_on_non_zero_status 0 \
  "$program" "$mode" 2>&1 | grep -v '^$'
rc=${PIPESTATUS[0]}
echo "mpirun exited with $rc after $(($(date +%s) - start)) s"
if ((rc == 124)); then
  echo "FAIL: the job hung (killed by timeout after 60 s)"
  exit 1
fi
status=0
for r in "${expect[@]}"; do
  if [[ ! -f $out/rank.$r ]]; then
    echo "FAIL: rank $r did not report (it was killed, or hung)"
    status=1
  elif ! grep -q '^PASS' "$out/rank.$r"; then
    echo "FAIL: rank $r: $(cat "$out/rank.$r")"
    status=1
  else
    echo "rank $r: $(cat "$out/rank.$r")"
  fi
done
exit $status
