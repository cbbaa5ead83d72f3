#!/bin/bash
# The hierarchical all-reduce across pods (MPI between them) beside flat
# Open MPI over the same ranks and beside one pool holding every rank, with
# each tier's time beside its own limit, all from one run of this script
# (docs/collectives.md, "Beyond one pool"):
#
#   bench/compare/pods.sh [--plot FILE.png]   (env: PODS=2 RANKS=4 MIN=64K
#                                     MAX=64M ITERS=10 WARMUP=3)
#
# Peers, each measured here:
#   hier        cxlrt's MultiPodCommunicator, RANKS ranks in PODS emulated
#               pods (`cxlrt run --pods`), Open MPI over loopback TCP
#               between the pods (cxlrt_bench_pods_mpi)
#   mpi-tcp     MPI_Allreduce over the same ranks in the same job, on the
#               same transport as the rails (loopback TCP)
#   mpi-shm     MPI_Allreduce over RANKS ranks with Open MPI's shared-memory
#               transport (ob1/vader; bench/compare/mpi_coll.c): flat MPI
#               at its best on one machine, which real pods do not have
#   one-pool    every rank in one pool (`cxlrt bench allreduce --ranks`)
# Tier limits (from the hier job): pod steps against one copy of the
# buffer at the memcpy bandwidth measured in the run; the time waiting for
# the engine against an MPI all-reduce of one shard over a rail alone.
# Installs Open MPI if missing (root, apt-get); builds what it needs.
set -euo pipefail
. "$(dirname "$0")/plot_option.sh"
plot_option_parse "$@"
set -- "${PLOT_ARGS[@]+"${PLOT_ARGS[@]}"}"
cd "$(dirname "$0")/../.."
PODS=${PODS:-2}
RANKS=${RANKS:-4}
MIN=${MIN:-64K}
MAX=${MAX:-64M}
ITERS=${ITERS:-10}
WARMUP=${WARMUP:-3}

bytes() {  # 64K -> 65536
  /usr/bin/python3 -c "import sys; s=sys.argv[1].upper(); m={'K':1<<10,'M':1<<20,'G':1<<30}
print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1"
}
LO=$(bytes "$MIN")
HI=$(bytes "$MAX")

if ! command -v mpicc >/dev/null; then
  echo "# installing openmpi-bin libopenmpi-dev" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q openmpi-bin libopenmpi-dev >&2
fi
[ -x build/bin/cxlrt ] || ./scripts/build.sh >&2
if [ ! -x build/bin/cxlrt_bench_pods_mpi ]; then
  cmake build >/dev/null  # finds MPI now
  cmake --build build -j2 --target cxlrt_bench_pods_mpi cxlrt_cli >&2
fi

WORK=$(mktemp -d /tmp/cxlrt-compare-pods.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mpicc -O2 -o "$WORK/mpi_coll" bench/compare/mpi_coll.c
OUT="$WORK/results.jsonl"
: >"$OUT"
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "{\"load_before\": \"$(load)\", \"cores\": $(nproc)}" >>"$OUT"

# Pools of 1 GiB: each pod's communicators stage 64 MiB buffers.
echo "# hier and mpi-tcp: cxlrt run --pods $PODS -n $RANKS" >&2
build/bin/cxlrt run --pods "$PODS" -n "$RANKS" --pool "emu://cmp-pods-$$?size=1G" --timeout 900 -- \
  build/bin/cxlrt_bench_pods_mpi -b "$MIN" -e "$MAX" -f 4 -n "$ITERS" -w "$WARMUP" --json >>"$OUT"
echo "# one-pool: cxlrt bench allreduce --ranks $RANKS" >&2
build/bin/cxlrt bench allreduce -b "$MIN" -e "$MAX" -f 4 -n "$ITERS" -w "$WARMUP" \
  --ranks "$RANKS" --json | sed 's/^{/{"peer": "one-pool", /' >>"$OUT"
echo "# mpi-shm: mpirun -np $RANKS (ob1/vader)" >&2
mpirun "${root[@]}" --oversubscribe --bind-to none -np "$RANKS" --mca pml ob1 \
  --mca btl self,vader --mca oob_tcp_if_include lo \
  "$WORK/mpi_coll" allreduce "$LO" "$HI" 4 "$ITERS" "$WARMUP" |
  sed 's/"peer": "mpi"/"peer": "mpi-shm"/' >>"$OUT"
echo "{\"load_after\": \"$(load)\"}" >>"$OUT"

plot_option_draw "across pods: cxlrt, one pool, Open MPI (bench/compare/pods.sh)" "$OUT"

/usr/bin/python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
meta = {k: v for r in rows for k, v in r.items() if k.startswith("load") or k == "cores"}
hier = {r["bytes"]: r for r in rows if r.get("peer") == "hier-mpi"}
def by(peer):
    return {r["bytes"]: r["time_us"] for r in rows if r.get("peer") == peer}
pool, shm = by("one-pool"), by("mpi-shm")
first = next(iter(hier.values()))
print(f"# all-reduce float32 sum, {first['ranks']} ranks in {first['pods']} pods; us per call, "
      f"the slowest rank; {meta['cores']} cores, load average {meta['load_before']} before, "
      f"{meta['load_after']} after; memcpy {first['memcpy_gbps']:.2f} GB/s")
print("# X/hier above 1: hier is faster. pod/lim: pod steps over one memcpy of the buffer; "
      "eng/rail: engine wait over an MPI all-reduce of a shard on one rail")
print("%10s %9s %9s %9s %9s %7s %7s %7s %9s %9s %6s %9s %9s %6s %6s" % (
    "bytes", "hier", "mpi-tcp", "mpi-shm", "one-pool", "tcp/h", "shm/h", "pool/h",
    "pod", "pod-lim", "p/lim", "engine", "rail", "e/rail", "#wrong"))
ratio = lambda x, y: "%.2f" % (x / y) if x and y else "-"
num = lambda x: "%.1f" % x if x is not None else "-"
for b in sorted(hier):
    h = hier[b]
    print("%10d %9s %9s %9s %9s %7s %7s %7s %9s %9s %6s %9s %9s %6s %6d" % (
        b, num(h["hier_us"]), num(h["flat_mpi_us"]), num(shm.get(b)), num(pool.get(b)),
        ratio(h["flat_mpi_us"], h["hier_us"]), ratio(shm.get(b), h["hier_us"]),
        ratio(pool.get(b), h["hier_us"]), num(h["pod_step_us"]), num(h["pod_limit_us"]),
        ratio(h["pod_step_us"], h["pod_limit_us"]), num(h["engine_wait_us"]),
        num(h["rail_alone_us"]), ratio(h["engine_wait_us"], h["rail_alone_us"]), h["wrong"]))
PY
