#!/bin/bash
# Compares cxlrt's collectives with Open MPI and PyTorch Gloo on this
# machine, in one run, same sizes and rank counts, and prints one table of
# busbw with the ratio cxlrt / best peer.
#
#   bench/compare/collectives.sh [RANKS...] [--plot FILE.png]     (default: 2)
#   env: MIN=64K MAX=64M ITERS=20 WARMUP=5 COLLS="allreduce allgather ..."
#
# The ceiling probe (`cxlrt bench ceiling`: the 2-rank all-reduce with the
# least protocol that works, over a memfd) runs in the same run, and every
# cxlrt row also reads against the traffic bound its benchmark reports
# (busbw / bound: above 1.0 would mean the bound is wrong). Broadcast is
# cxlrt's in-place call, as MPI_Bcast's one buffer.
#
# Each peer gets its best configuration: Open MPI runs in a private network
# namespace with only loopback up (its out-of-band listeners bind every
# interface), with glibc's malloc told not to return memory (else its
# allreduce pays a page fault per 4 KiB of a temporary buffer above 32 MiB),
# and the better of the ob1/vader and UCX transports is kept per size; Gloo
# is pinned to lo and initialised from a file. Installs what it needs
# (root, apt-get). cxlrt runs in the hardware domain.
set -euo pipefail
. "$(dirname "$0")/plot_option.sh"
plot_option_parse "$@"
set -- "${PLOT_ARGS[@]+"${PLOT_ARGS[@]}"}"
cd "$(dirname "$0")/../.."
ROOT=$PWD
RANKS=("${@:-2}")
MIN=${MIN:-64K}
MAX=${MAX:-64M}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
COLLS=${COLLS:-"allreduce allgather broadcast reducescatter alltoall sendrecv"}

bytes() {  # 64K -> 65536
  /usr/bin/python3 -c "import sys; s=sys.argv[1].upper(); m={'K':1<<10,'M':1<<20,'G':1<<30}
print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1"
}
LO=$(bytes "$MIN")
HI=$(bytes "$MAX")

need=()
command -v mpicc >/dev/null || need+=(openmpi-bin libopenmpi-dev)
/usr/bin/python3 -c "import torch" 2>/dev/null || need+=(python3-torch)
command -v unshare >/dev/null || need+=(util-linux)
command -v ip >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  echo "# installing ${need[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >&2
fi
[ -x build/bin/cxlrt ] || ./scripts/build.sh >&2

WORK=$(mktemp -d /tmp/cxlrt-compare.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mpicc -O2 -o "$WORK/mpi_coll" bench/compare/mpi_coll.c
OUT="$WORK/results.jsonl"
: >"$OUT"

export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296
for n in "${RANKS[@]}"; do
  for coll in $COLLS; do
    echo "# $coll, $n ranks: cxlrt" >&2
    build/bin/cxlrt bench "$coll" -b "$MIN" -e "$MAX" -f 2 -n "$ITERS" -w "$WARMUP" \
      --ranks "$n" --json | sed 's/^{/{"peer": "cxlrt", /' >>"$OUT"
    build/bin/cxlrt bench "$coll" -b "$MIN" -e "$MAX" -f 2 -n "$ITERS" -w "$WARMUP" \
      --ranks "$n" --in-pool --json | sed 's/^{/{"peer": "cxlrt-pool", /' >>"$OUT"
    for pml in "--mca pml ob1 --mca btl self,vader" \
               "--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any"; do
      echo "# $coll, $n ranks: Open MPI $pml" >&2
      unshare -n sh -c "ip link set lo up && mpirun --allow-run-as-root --oversubscribe \
          -x GLIBC_TUNABLES --bind-to none -np $n $pml \
          $WORK/mpi_coll $coll $LO $HI 2 $ITERS $WARMUP" 2>"$WORK/mpi.err" |
        sed "s|\"peer\": \"mpi\"|\"peer\": \"mpi\", \"config\": \"${pml%% --mca btl*}\"|" >>"$OUT" ||
        { echo "# Open MPI ($pml) failed:" >&2; tail -5 "$WORK/mpi.err" >&2; }
    done
    case $coll in allreduce|allgather|broadcast)
      echo "# $coll, $n ranks: Gloo" >&2
      GLOO_SOCKET_IFNAME=lo /usr/bin/python3 bench/compare/gloo_coll.py "$coll" "$n" "$LO" "$HI" 2 \
        "$ITERS" "$WARMUP" 2>"$WORK/gloo.err" >>"$OUT" ||
        { echo "# Gloo failed:" >&2; tail -5 "$WORK/gloo.err" >&2; } ;;
    esac
  done
  if [ "$n" = 2 ] && [[ " $COLLS " == *" allreduce "* ]]; then
    echo "# allreduce, 2 ranks: the ceiling probe" >&2
    build/bin/cxlrt bench ceiling -b "$MIN" -e "$MAX" -f 2 -n "$ITERS" -w "$WARMUP" --json |
      sed 's/^{/{"peer": "probe", /' >>"$OUT"
  fi
  # 8-byte all-reduce latency: many iterations, time per call.
  echo "# 8-byte allreduce latency, $n ranks" >&2
  build/bin/cxlrt bench allreduce -b 8 -e 8 -n 5000 -w 500 --ranks "$n" --json |
    sed 's/^{/{"peer": "cxlrt", "latency": true, /' >>"$OUT"
  for pml in "--mca pml ob1 --mca btl self,vader" \
             "--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any"; do
    unshare -n sh -c "ip link set lo up && mpirun --allow-run-as-root --oversubscribe \
        -x GLIBC_TUNABLES --bind-to none -np $n $pml \
        $WORK/mpi_coll allreduce 8 8 2 5000 500" 2>>"$WORK/mpi.err" |
      sed 's/^{/{"latency": true, /' >>"$OUT" || true
  done
  GLOO_SOCKET_IFNAME=lo /usr/bin/python3 bench/compare/gloo_coll.py allreduce "$n" 8 8 2 2000 200 \
    2>>"$WORK/gloo.err" | sed 's/^{/{"latency": true, /' >>"$OUT" || true
done

plot_option_draw "collectives: cxlrt, Open MPI, Gloo (bench/compare/collectives.sh)" "$OUT"

/usr/bin/python3 - "$OUT" <<'PY'
import json, sys
every = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
rows = [r for r in every if not r.get("latency")]
# MPI_Bcast has one buffer: cxlrt's broadcast reads against its in-place
# call (out of place its root also copies send to recv, which MPI never does).
for r in rows:
    if r.get("collective") == "broadcast" and "inplace_busbw_gbps" in r:
        r["busbw_gbps"] = r["inplace_busbw_gbps"]
        if r.get("bound_busbw_gbps"):
            r["busbw_vs_bound"] = r["busbw_gbps"] / r["bound_busbw_gbps"]
lat = [r for r in every if r.get("latency")]
first = next((r for r in rows if "two_thread_copy_gbps" in r), {})
print(f"# busbw in GB/s (nccl-tests formulas). This machine, measured in the run: memcpy "
      f"{first.get('memcpy_gbps', 0):.2f}, best single-thread copy {first.get('best_copy_gbps', 0):.2f}, "
      f"two threads {first.get('two_thread_copy_gbps', 0):.2f} GB/s (64 MiB); affinity: "
      f"{first.get('affinity', '?')}")
print("# cxlrt: private buffers; pool: buffers in the pool (zero-copy); MPI: the better of "
      "ob1/vader and UCX per size; probe: the ceiling probe (allreduce, 2 ranks); /bound: "
      "cxlrt busbw over its traffic bound")
print("%-14s %5s %10s %8s %8s %8s %8s %8s %7s %7s %7s %7s %7s" % ("collective", "ranks", "bytes",
      "cxlrt", "pool", "mpi", "gloo", "probe", "c/best", "p/best", "c/probe", "c/bound",
      "p/bound"))
keys = sorted({(r["collective"], r["ranks"], r["bytes"]) for r in rows if r["peer"] != "probe"})
for coll, n, b in keys:
    def pick(peer):
        v = [r for r in rows if r["peer"] == peer and r["collective"] == coll
             and r["ranks"] == n and r["bytes"] == b]
        return max(v, key=lambda r: r["busbw_gbps"]) if v else None
    def get(peer):
        r = pick(peer)
        return r["busbw_gbps"] if r else None
    c, p, m, g, pr = get("cxlrt"), get("cxlrt-pool"), get("mpi"), get("gloo"), get("probe")
    best = max([x for x in (m, g) if x] or [0])
    f = lambda x: "%.2f" % x if x is not None else "-"
    ratio = lambda x, y: "%.2f" % (x / y) if x and y else "-"
    bound = lambda peer: f(pick(peer)["busbw_vs_bound"]) if pick(peer) and pick(peer).get("busbw_vs_bound") else "-"
    print("%-14s %5d %10d %8s %8s %8s %8s %8s %7s %7s %7s %7s %7s" % (coll, n, b, f(c), f(p), f(m),
          f(g), f(pr), ratio(c, best), ratio(p, best), ratio(c, pr), bound("cxlrt"),
          bound("cxlrt-pool")))
print()
print("# 8-byte allreduce latency (us per call; MPI: the better transport)")
print("%5s %9s %9s %9s %11s" % ("ranks", "cxlrt", "mpi", "gloo", "cxlrt/best"))
for n in sorted({r["ranks"] for r in lat}):
    def t(peer):
        v = [r["time_us"] for r in lat if r["peer"] == peer and r["ranks"] == n]
        return min(v) if v else None
    c, m, g = t("cxlrt"), t("mpi"), t("gloo")
    best = min([x for x in (m, g) if x] or [0])
    f = lambda x: "%.2f" % x if x is not None else "-"
    print("%5d %9s %9s %9s %11s" % (n, f(c), f(m), f(g), "%.2f" % (c / best) if c and best else "-"))
PY
