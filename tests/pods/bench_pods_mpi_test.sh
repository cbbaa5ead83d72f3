#!/usr/bin/env bash
# cxlrt_bench_pods_mpi (bench/compare/pods.sh's hierarchical rows) at two
# small sizes under `cxlrt run --pods 2 -n 4`: it exits 0 (1 on a wrong
# element or a failed call) and prints both rows with #wrong 0; a bad
# argument exits 2 naming it.
# Usage: bench_pods_mpi_test.sh CXLRT CXLRT_BENCH_PODS_MPI
set -uo pipefail
cxlrt=$1 bench=$2
out=$("$cxlrt" run --pods 2 -n 4 --timeout 100 -- "$bench" -b 64K -e 256K -n 2 -w 1 2>&1)
rc=$?
echo "$out"
((rc == 0)) || { echo "FAIL: exit $rc"; exit 1; }
for row in '^ *65536 .* 0$' '^ *262144 .* 0$'; do
  grep -q "$row" <<<"$out" || { echo "FAIL: no row $row"; exit 1; }
done
out=$("$bench" -b 1X 2>&1)
rc=$?
[[ $rc == 2 && $out == *"bad argument -b 1X"* ]] || { echo "FAIL: bad -b: $rc $out"; exit 1; }
echo "ok"
