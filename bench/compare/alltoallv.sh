#!/bin/bash
# Compares cxlrt's all-to-all-v with Open MPI's MPI_Alltoallv on an MoE
# layer's skewed splits, in one run: `cxlrt bench alltoallv` (private
# buffers, and pool-resident ones posted in place) and
# bench/compare/mpi_alltoallv.c draw the same routing (bench/moe_routing.h,
# same seed; the script checks their fingerprints agree), and time the
# dispatch and the combine call by call (median of the slowest rank's time).
# The runs are interleaved ROUNDS times (cxlrt, cxlrt in the pool, each
# Open MPI transport, again), because the machine may be shared: each
# figure is the median over rounds of a round's median, and each ratio the
# median over rounds of the ratio within a round. The load average is
# printed before and after.
#
#   bench/compare/alltoallv.sh [RANKS...] [--plot FILE.png]       (default: 2 4)
#   env: TOKENS=4096 HIDDEN=2048 EXPERTS=8 TOPK=1 SKEWS="zipf:1.2 hot:2:0.5 uniform"
#        SEED=1 ITERS=20 WARMUP=5 ROUNDS=3
#
# Open MPI gets its best configuration, as in collectives.sh: a private
# network namespace with only loopback up, glibc's malloc told not to
# return memory, and the better of ob1/vader and UCX kept per round. More
# ranks than cores run oversubscribed for both (cxlrt's ranks then yield
# in their waits; Open MPI's with --oversubscribe). Installs what it needs
# (root, apt-get). cxlrt runs in the hardware domain.
set -euo pipefail
. "$(dirname "$0")/plot_option.sh"
plot_option_parse "$@"
set -- "${PLOT_ARGS[@]+"${PLOT_ARGS[@]}"}"
cd "$(dirname "$0")/../.."
RANKS=("$@")
[ $# -eq 0 ] && RANKS=(2 4)
TOKENS=${TOKENS:-4096}
HIDDEN=${HIDDEN:-2048}
EXPERTS=${EXPERTS:-8}
TOPK=${TOPK:-1}
SKEWS=${SKEWS:-"zipf:1.2 hot:2:0.5 uniform"}
SEED=${SEED:-1}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
ROUNDS=${ROUNDS:-3}

need=()
command -v mpicc >/dev/null || need+=(openmpi-bin libopenmpi-dev)
command -v unshare >/dev/null || need+=(util-linux)
command -v ip >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  echo "# installing ${need[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >&2
fi
[ -x build/bin/cxlrt ] || ./scripts/build.sh >&2

WORK=$(mktemp -d /tmp/cxlrt-a2av.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mpicc -O2 -I. -o "$WORK/mpi_alltoallv" bench/compare/mpi_alltoallv.c -lm
OUT="$WORK/results.jsonl"
: >"$OUT"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores" >&2
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296
args=(--tokens "$TOKENS" --hidden "$HIDDEN" --experts-per-rank "$EXPERTS" --topk "$TOPK"
      --seed "$SEED" -n "$ITERS" -w "$WARMUP" --json)
for round in $(seq 1 "$ROUNDS"); do
  for n in "${RANKS[@]}"; do
    for skew in $SKEWS; do
      echo "# round $round, $n ranks, $skew" >&2
      build/bin/cxlrt bench alltoallv "${args[@]}" --ranks "$n" --skew "$skew" |
        sed "s/^{/{\"peer\": \"cxlrt\", \"round\": $round, /" >>"$OUT"
      build/bin/cxlrt bench alltoallv "${args[@]}" --ranks "$n" --skew "$skew" --in-pool |
        sed "s/^{/{\"peer\": \"cxlrt-pool\", \"round\": $round, /" >>"$OUT"
      for pml in "--mca pml ob1 --mca btl self,vader" \
                 "--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any"; do
        unshare -n sh -c "ip link set lo up && mpirun --allow-run-as-root --oversubscribe \
            -x GLIBC_TUNABLES --bind-to none -np $n $pml \
            $WORK/mpi_alltoallv $TOKENS $HIDDEN $EXPERTS $TOPK $skew $SEED $ITERS $WARMUP" \
            2>"$WORK/mpi.err" |
          sed "s|^{\"peer\": \"mpi\"|{\"peer\": \"mpi\", \"round\": $round, \"config\": \"${pml%% --mca btl*}\"|" \
            >>"$OUT" ||
          { echo "# Open MPI ($pml) failed:" >&2; tail -5 "$WORK/mpi.err" >&2; }
      done
    done
  done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

plot_option_draw "MoE all-to-all-v: cxlrt vs Open MPI (bench/compare/alltoallv.sh)" "$OUT"

/usr/bin/python3 - "$OUT" "$LOAD_BEFORE" "$LOAD_AFTER" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
first = next((r for r in rows if "memcpy_gbps" in r), {})
t = rows[0] if rows else {}
print(f"# MoE all-to-all-v: {t.get('tokens')} tokens x {t.get('hidden')} bf16 per rank, top-"
      f"{t.get('topk')} of {t.get('experts_per_rank')} experts per rank, seed {t.get('seed')}")
print(f"# this machine, in the run: memcpy {first.get('memcpy_gbps', 0):.2f} GB/s, best "
      f"single-thread copy {first.get('best_copy_gbps', 0):.2f} GB/s; load average before "
      f"{sys.argv[2]}, after {sys.argv[3]}")
print("# time: median over rounds of each round's median per call (slowest rank), us; "
      "MPI: the better of ob1/vader and UCX per round; x: MPI's time / cxlrt's, median over "
      "rounds (above 1: cxlrt faster); GB/s: the busiest rank's bytes per cxlrt's time")
print("%-11s %5s %-9s %10s %10s %10s %7s %7s %7s %6s" % ("skew", "ranks", "phase", "cxlrt",
      "pool", "mpi", "x", "x pool", "GB/s", "posts"))
keys = sorted({(r["skew"], r["ranks"], r["phase"]) for r in rows},
              key=lambda k: (k[0], k[1], k[2] != "dispatch"))
bad = False
for skew, n, phase in keys:
    sel = [r for r in rows if r["skew"] == skew and r["ranks"] == n and r["phase"] == phase]
    if len({r["fingerprint"] for r in sel}) > 1:
        print(f"# {skew} {n} ranks: the peers drew different splits!"); bad = True
    if any(r["wrong"] for r in sel):
        print(f"# {skew} {n} ranks {phase}: wrong elements!"); bad = True
    rounds = sorted({r["round"] for r in sel})
    def per_round(peer):
        out = {}
        for k in rounds:
            v = [r["median_us"] for r in sel if r["peer"] == peer and r["round"] == k]
            if v: out[k] = min(v)
        return out
    c, p, m = per_round("cxlrt"), per_round("cxlrt-pool"), per_round("mpi")
    med = lambda d: statistics.median(d.values()) if d else None
    ratio = lambda a: statistics.median([m[k] / a[k] for k in a if k in m]) if a and m else None
    f = lambda x, fmt="%.1f": fmt % x if x is not None else "-"
    cr = [r for r in sel if r["peer"] == "cxlrt"]
    gbps = cr[0]["busiest_bytes"] / (med(c) * 1e3) if c else None
    posts = statistics.median([r["posts_per_call"] for r in cr]) if cr else None
    print("%-11s %5d %-9s %10s %10s %10s %7s %7s %7s %6s" % (skew, n, phase, f(med(c)), f(med(p)),
          f(med(m)), f(ratio(c), "%.2f"), f(ratio(p), "%.2f"), f(gbps, "%.2f"), f(posts, "%.0f")))
sys.exit(1 if bad else 0)
PY
