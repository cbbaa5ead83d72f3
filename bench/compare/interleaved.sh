#!/bin/bash
# Interleaves runs of one collective by one or more cxlrt builds with Open
# MPI's (the better of ob1/vader and UCX in each round), ROUNDS times, and
# prints per size the best and the median of each peer's per-run mean time
# per call, with Open MPI's over each build's. On a shared machine single
# runs move by 2-10x; the best of interleaved runs is what the code can do,
# the median what it did. The load average of each round goes to stderr.
# Broadcast is cxlrt's in-place call (MPI_Bcast's one buffer).
#
#   bench/compare/interleaved.sh CXLRT [CXLRT...] [--plot FILE.png]
#   env: COLL=allreduce MIN=8 MAX=4K ITERS=5000 ROUNDS=8 RANKS=2
#
# E.g. the 8 B-32 KiB all-reduce of a parent build against this one:
#   MAX=32K bench/compare/interleaved.sh /tmp/parent/build/bin/cxlrt build/bin/cxlrt
set -euo pipefail
. "$(dirname "$0")/plot_option.sh"
plot_option_parse "$@"
set -- "${PLOT_ARGS[@]+"${PLOT_ARGS[@]}"}"
[ $# -ge 1 ] || { sed -n '2,14p' "$0"; exit 2; }
cd "$(dirname "$0")/../.."
COLL=${COLL:-allreduce}
MIN=${MIN:-8}
MAX=${MAX:-4K}
ITERS=${ITERS:-5000}
ROUNDS=${ROUNDS:-8}
RANKS=${RANKS:-2}
bytes() {  # 4K -> 4096
  /usr/bin/python3 -c "import sys; s=sys.argv[1].upper(); m={'K':1<<10,'M':1<<20,'G':1<<30}
print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1"
}
LO=$(bytes "$MIN")
HI=$(bytes "$MAX")
WORK=$(mktemp -d /tmp/cxlrt-interleaved.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mpicc -O2 -o "$WORK/mpi_coll" bench/compare/mpi_coll.c
OUT="$WORK/results.jsonl"
: >"$OUT"
export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296
for round in $(seq "$ROUNDS"); do
  i=0
  for bin in "$@"; do
    i=$((i + 1))
    "$bin" bench "$COLL" -b "$LO" -e "$HI" -f 2 -n "$ITERS" -w $((ITERS / 10)) --ranks "$RANKS" \
      --json 2>/dev/null | sed "s|^{|{\"who\": \"cxlrt$i\", \"round\": $round, |" >>"$OUT"
  done
  for pml in "--mca pml ob1 --mca btl self,vader" \
             "--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any"; do
    unshare -n sh -c "ip link set lo up && mpirun --allow-run-as-root --oversubscribe \
        -x GLIBC_TUNABLES --bind-to none -np $RANKS $pml \
        $WORK/mpi_coll $COLL $LO $HI 2 $ITERS $((ITERS / 10))" 2>>"$WORK/mpi.err" |
      sed "s|^{|{\"who\": \"mpi\", \"round\": $round, \"config\": \"${pml%% --mca btl*}\", |" \
        >>"$OUT" || true
  done
  echo "# round $round: $(uptime | sed 's/.*load/load/')" >&2
done
plot_option_draw "interleaved runs: cxlrt builds vs Open MPI (bench/compare/interleaved.sh)" "$OUT"

/usr/bin/python3 - "$OUT" "$COLL" "$@" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
coll = sys.argv[2]
builds = ["cxlrt%d" % (i + 1) for i in range(len(sys.argv) - 3)]
for i, b in enumerate(sys.argv[3:]):
    print("# cxlrt%d: %s" % (i + 1, b))
print("# us per call: best / median of the rounds; mpi: the better transport in each round" +
      ("; cxlrt: in place" if coll == "broadcast" else ""))
print("%9s" % "bytes" + "".join("%22s" % w for w in builds + ["mpi"]) +
      "".join("%16s" % ("mpi/" + w) for w in builds))
for size in sorted({r["bytes"] for r in rows}):
    t = {}
    for w in builds + ["mpi"]:
        per_round = {}
        for r in rows:
            if r["who"] == w and r["bytes"] == size:
                # MPI_Bcast has one buffer: set cxlrt's broadcast against
                # its in-place call (out of place, the root also copies its
                # send buffer to its receive buffer, which MPI never does).
                key = "inplace_time_us" if coll == "broadcast" and w != "mpi" else "time_us"
                per_round[r["round"]] = min(per_round.get(r["round"], 1e18), r[key])
        v = list(per_round.values())
        t[w] = (min(v), statistics.median(v)) if v else None
    cell = lambda x: "%10.3f / %9.3f" % x if x else "%22s" % "-"
    ratio = lambda w: ("%7.2f, %6.2f" % (t["mpi"][0] / t[w][0], t["mpi"][1] / t[w][1])
                       if t[w] and t["mpi"] else "-")
    print("%9d" % size + "".join("%22s" % cell(t[w]) for w in builds + ["mpi"]) +
          "".join("%16s" % ratio(w) for w in builds))
PY
