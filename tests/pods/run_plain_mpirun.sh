#!/usr/bin/env bash
# The example across pods launched as a job across real hosts is: plain
# mpirun, one app context per pod, each giving its ranks CXLRT_POOL = the
# pool its host maps (here: two emulated pools this script makes), no
# `cxlrt run`. Every rank must print its averaged line and the job exit 0.
# Usage: run_plain_mpirun.sh MPIRUN CXLRT EXAMPLE
set -uo pipefail
mpirun=$1 cxlrt=$2 example=$3
pools=("emu://pm0-$$?size=64M" "emu://pm1-$$?size=64M")
cleanup() { for p in "${pools[@]}"; do "$cxlrt" pool destroy "${p%%\?*}" >/dev/null 2>&1; done; }
trap cleanup EXIT
for p in "${pools[@]}"; do "$cxlrt" pool create "$p" >/dev/null || exit 1; done
out=$(timeout 120 "$mpirun" --oversubscribe -np 2 -x CXLRT_POOL="${pools[0]%%\?*}" "$example" \
  : -np 3 -x CXLRT_POOL="${pools[1]%%\?*}" "$example" 2>&1)
rc=$?
echo "$out"
lines=$(grep -c 'averaged 1048576 gradients to 3$' <<<"$out")
if ((rc != 0 || lines != 5)); then
  echo "FAIL: mpirun exited $rc, $lines of 5 ranks averaged (pods of 2 + 3)"
  exit 1
fi
for r in 0 1; do
  grep -q "^rank $r/5 (pod 0 of 2)" <<<"$out" || { echo "FAIL: rank $r is not in pod 0"; exit 1; }
done
for r in 2 3 4; do
  grep -q "^rank $r/5 (pod 1 of 2)" <<<"$out" || { echo "FAIL: rank $r is not in pod 1"; exit 1; }
done
echo "ok: 5 ranks in pods of 2 + 3 under plain mpirun"
