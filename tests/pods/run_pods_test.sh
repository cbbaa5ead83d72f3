#!/usr/bin/env bash
# `cxlrt run --pods` (docs/collectives.md, "Beyond one pool"): ranks placed
# in pods as documented, each pod's pool made before the ranks and destroyed after, the exit code
# of a failed rank, the error without mpirun, and the MPI engine's suite
# run across two pods through it, and a rank killed in one pod reported by
# the others at their deadline.
# Usage: run_pods_test.sh CXLRT MPI_ENGINE_TEST MPI_ENGINE_FAULT
set -uo pipefail
cxlrt=$1 engine_test=$2 engine_fault=$3
fail=0
check() {  # check NAME WANT GOT
  if [[ "$2" != "$3" ]]; then
    echo "FAIL $1"; echo "--- want"; echo "$2"; echo "--- got"; echo "$3"; fail=1
  else
    echo "ok   $1"
  fi
}
show='echo $CXLRT_RANK $CXLRT_WORLD_SIZE $CXLRT_POD $CXLRT_PODS $CXLRT_POD_SIZE $CXLRT_LOCAL_RANK $CXLRT_HOST_ID $CXLRT_POOL; '
show+='"$0" pool info $CXLRT_POOL >/dev/null || echo "no pool $CXLRT_POOL"'

# 4 ranks in 2 pods: blocks [0, 2), [2, 4).
got=$("$cxlrt" run --pods 2 -n 4 --pool "emu://rp$$?size=32M" -- sh -c "$show" "$cxlrt" | sort -n)
want="0 4 0 2 2 0 0 emu://rp$$-pod0
1 4 0 2 2 1 1 emu://rp$$-pod0
2 4 1 2 2 0 0 emu://rp$$-pod1
3 4 1 2 2 1 1 emu://rp$$-pod1"
check "--pods 2 -n 4" "$want" "$got"
# Uneven blocks: 5 ranks in 2 pods are 2 + 3.
got=$("$cxlrt" run --pods 2 -n 5 --pool "emu://rq$$?size=32M" -- sh -c 'echo $CXLRT_RANK $CXLRT_POD $CXLRT_POD_SIZE' | sort -n)
check "--pods 2 -n 5" "$(printf '0 0 2\n1 0 2\n2 1 3\n3 1 3\n4 1 3')" "$got"
# Given sizes, in simulated coherence.
got=$("$cxlrt" run --pod-sizes 2,3 --pool "emu://rs$$?size=32M&coherence=simulated" -- \
  sh -c "$show" "$cxlrt" | sort -n)
want="0 5 0 2 2 0 0 emu://rs$$-pod0
1 5 0 2 2 1 1 emu://rs$$-pod0
2 5 1 2 3 0 0 emu://rs$$-pod1
3 5 1 2 3 1 1 emu://rs$$-pod1
4 5 1 2 3 2 2 emu://rs$$-pod1"
check "--pod-sizes 2,3" "$want" "$got"
for p in rp$$-pod0 rp$$-pod1 rq$$-pod0 rs$$-pod0 rs$$-pod1; do
  if "$cxlrt" pool info "emu://$p" >/dev/null 2>&1; then echo "FAIL pool emu://$p left behind"; fail=1; fi
done
# A failing rank: its exit code and name; the others still ran to the end.
out=$("$cxlrt" run --pods 2 -n 3 -- sh -c '[ $CXLRT_RANK = 2 ] && exit 7; echo done $CXLRT_RANK' 2>&1)
rc=$?
check "failing rank's exit code" 7 "$rc"
check "failing rank named" 1 "$(grep -c 'rank 2 (pod 1, local rank 1) exited with code 7' <<<"$out")"
check "other ranks finished" 2 "$(grep -c '^done' <<<"$out")"
# Bad input and a missing mpirun: exit 2 with the reason.
out=$("$cxlrt" run --pod-sizes 2,2 -n 5 -- true 2>&1); rc=$?
check "sizes that do not add up" "2 1" "$rc $(grep -c 'add up to 4 ranks but -n is 5' <<<"$out")"
out=$(PATH=/nonexistent "$cxlrt" run --pods 2 -n 2 -- true 2>&1); rc=$?
check "no mpirun" "2 1" "$rc $(grep -c 'install Open MPI' <<<"$out")"
# The engine between pods across 2 + 1 ranks of two pods.
out=$("$cxlrt" run --pod-sizes 2,1 --timeout 120 -- "$engine_test" --gtest_color=no 2>&1); rc=$?
check "mpi_engine_test under --pod-sizes 2,1" "0 3" "$rc $(grep -c '\[  PASSED  \]' <<<"$out")"
((rc == 0)) || tail -30 <<<"$out"
# A rank of pod 1 SIGKILLs itself mid-loop: the job's code is its signal,
# and the two others (one in each pod) report their error (PASS).
out=$(timeout 100 "$cxlrt" run --pods 2 -n 3 --timeout 60 -- "$engine_fault" kill 2>&1); rc=$?
check "killed rank's code" 137 "$rc"
check "killed rank named" 1 "$(grep -c 'rank 1 (pod 1, local rank 0) was killed by signal 9' <<<"$out")"
check "survivors reported" "2 0" "$(grep -c '^rank [02]: PASS' <<<"$out") $(grep -c 'FAIL' <<<"$out")"
exit $fail
