#!/bin/bash
# Compares two builds of cxlrt on this machine, for a change that should not
# change speed (a restructuring): the collectives bench/compare/collectives.sh
# runs, the 8-byte all-reduce latency and `cxlrt bench kv`, each run by both
# builds in ABBA order (A B B A, repeated), so that the machine's drift
# during the run falls on both alike. Prints the median of each row per
# build and their ratio (B / A), with the range.
#
#   bench/compare/before_after.sh A_CXLRT B_CXLRT [--plot FILE.png]
#   env: ROUNDS=3 (ABBA blocks; each build runs 2 x ROUNDS times), RANKS=2,
#        MIN=64K MAX=4M ITERS=100, COLLS="allreduce allgather ...", KV=1
#
# A_CXLRT and B_CXLRT are the `cxlrt` programs of the two builds, e.g. a
# worktree of the parent commit built with
#   cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCXLRT_BUILD_TESTS=OFF
#   cmake --build build --target cxlrt_cli
# Busbw and kv rows are GB/s (higher is better), latency rows us (lower is
# better). On a noisy machine, read a ratio only against the ranges.
set -euo pipefail
. "$(dirname "$0")/plot_option.sh"
plot_option_parse "$@"
set -- "${PLOT_ARGS[@]+"${PLOT_ARGS[@]}"}"
[ $# -eq 2 ] || { sed -n '2,18p' "$0"; exit 2; }
A=$1
B=$2
ROUNDS=${ROUNDS:-3}
RANKS=${RANKS:-2}
MIN=${MIN:-64K}
MAX=${MAX:-4M}
ITERS=${ITERS:-100}
COLLS=${COLLS:-"allreduce allgather broadcast reducescatter alltoall sendrecv"}
KV=${KV:-1}
for b in "$A" "$B"; do
  [ -x "$b" ] || { echo "before_after.sh: $b is not a program" >&2; exit 2; }
done
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296

run() {  # run LABEL PROGRAM: one of each benchmark, a JSON line each, tagged
  local label=$1 prog=$2 coll
  for coll in $COLLS; do
    "$prog" bench "$coll" -b "$MIN" -e "$MAX" -f 4 -n "$ITERS" -w 10 --ranks "$RANKS" --json |
      sed "s/^{/{\"build\": \"$label\", \"row\": \"busbw\", /"
  done
  "$prog" bench allreduce -b 8 -e 8 -n 50000 -w 2000 --ranks "$RANKS" --json |
    sed "s/^{/{\"build\": \"$label\", \"row\": \"latency\", /"
  if [ "$KV" = 1 ]; then
    "$prog" bench kv --json | /usr/bin/python3 -c "import json, sys
j = json.load(sys.stdin)
for r in j['rows']:
    print(json.dumps({'build': '$label', 'row': 'kv', 'collective': 'kv ' + r['op'],
                      'bytes': r['block'], 'gbps': r['gbps'], 'batch_gbps': r['batch_gbps'],
                      'wrong': j['wrong']}))"
  fi
}

for ((i = 1; i <= ROUNDS; i++)); do
  for label in A B B A; do
    prog=$A
    [ "$label" = B ] && prog=$B
    echo "# round $i, $label" >&2
    run "$label" "$prog" >>"$OUT"
  done
done

plot_option_draw "build A ($A) vs build B ($B) (bench/compare/before_after.sh)" "$OUT"

/usr/bin/python3 - "$OUT" "$A" "$B" <<'PY'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(f"# A = {sys.argv[2]}\n# B = {sys.argv[3]}")
print("# busbw and kv: GB/s (higher is better); latency: us per 8-byte all-reduce (lower)")
print("%-16s %9s %22s %22s %7s" % ("row", "bytes", "A median [range]", "B median [range]", "B/A"))
groups = collections.defaultdict(lambda: {"A": [], "B": []})
wrong = 0
for r in rows:
    if r["row"] == "busbw":
        groups[(r["collective"], r["bytes"])][r["build"]].append(r["busbw_gbps"])
        wrong += r["wrong"] + r["inplace_wrong"]
    elif r["row"] == "latency":
        groups[("latency", 8)][r["build"]].append(r["time_us"])
    else:
        groups[(r["collective"], r["bytes"])][r["build"]].append(r["gbps"])
        groups[(r["collective"] + " batch", r["bytes"])][r["build"]].append(r["batch_gbps"])
        wrong += r["wrong"]
def cell(v):
    return "%.3f [%.3f-%.3f]" % (statistics.median(v), min(v), max(v))
for (name, size), v in sorted(groups.items()):
    if not v["A"] or not v["B"]:
        continue
    ratio = statistics.median(v["B"]) / statistics.median(v["A"])
    print("%-16s %9d %22s %22s %7.3f" % (name, size, cell(v["A"]), cell(v["B"]), ratio))
print(f"# wrong results: {wrong}")
sys.exit(1 if wrong else 0)
PY
