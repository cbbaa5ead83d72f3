#!/usr/bin/env bash
# The hierarchical communicator over the Open MPI engine under `cxlrt run
# --pods` (pod_mpi_test.cc): every collective exact on 2 pods x 2 ranks and
# on pods of 2 + 3, in the hardware and the simulated coherence domain; a
# rank SIGKILLed in pod 0, then in pod 1: the job's code is its signal, the
# launcher names it, and every other rank reports its error (PASS) within
# the deadline.
# Usage: run_pod_mpi_test.sh CXLRT POD_MPI_TEST
set -uo pipefail
cxlrt=$1 prog=$2
fail=0
check() {  # check NAME WANT GOT
  if [[ "$2" != "$3" ]]; then
    echo "FAIL $1: want $2, got $3"; fail=1
  else
    echo "ok   $1"
  fi
}
# Short deadlines, so that a dead rank is noticed in seconds.
export CXLRT_COMM_TIMEOUT_MS=4000 CXLRT_LEASE_MS=1000 CXLRT_HEARTBEAT_MS=200

run() {  # run NAME WANT_RC WANT_PASSES LAUNCH_ARGS... -- ARGS...
  local name=$1 want_rc=$2 want_pass=$3
  shift 3
  local start=$SECONDS
  out=$(timeout 200 "$cxlrt" run "$@" 2>&1)
  rc=$?
  echo "--- $name: exit $rc after $((SECONDS - start)) s"
  grep -E '^rank [0-9]+: (PASS|FAIL)|was killed|exited with' <<<"$out"
  check "$name: job's exit code" "$want_rc" "$rc"
  check "$name: ranks that passed" "$want_pass 0" \
    "$(grep -c '^rank [0-9]*: PASS' <<<"$out") $(grep -c '^rank [0-9]*: FAIL' <<<"$out")"
  ((rc == want_rc)) || tail -40 <<<"$out"
}

for domain in hardware simulated; do
  pool="emu://pm$$?size=128M&coherence=$domain"
  mode=quick
  [[ $domain == hardware ]] && mode=full
  run "2 pods x 2, $domain" 0 4 --pods 2 -n 4 --pool "$pool" --timeout 180 -- "$prog" $mode
  run "pods of 2 + 3, $domain" 0 5 --pod-sizes 2,3 --pool "$pool" --timeout 180 -- "$prog" quick
done

# Rank 1 (pod 0, local rank 1) of 2 x 2, hardware; rank 3 (pod 1, local
# rank 1) of 2 + 3, simulated. A timeout well past the lease: the victim's
# pod-mates see it dead through the pool in about 1.2 s, and the other
# pod's ranks must hear their abort notices (kAborted) long before their
# own deadline (pod_mpi_test.cc, RunKill).
export CXLRT_COMM_TIMEOUT_MS=10000
run "rank 1 killed in pod 0" 137 3 --pods 2 -n 4 --pool "emu://pk$$?size=128M" --timeout 60 \
  -- "$prog" kill 1
check "rank 1 named" 1 "$(grep -c 'rank 1 (pod 0, local rank 1) was killed by signal 9' <<<"$out")"
run "rank 3 killed in pod 1" 137 4 --pod-sizes 2,3 \
  --pool "emu://pk$$?size=128M&coherence=simulated" --timeout 60 -- "$prog" kill 3
check "rank 3 named" 1 "$(grep -c 'rank 3 (pod 1, local rank 1) was killed by signal 9' <<<"$out")"
exit $fail
