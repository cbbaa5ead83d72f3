#!/usr/bin/env bash
# Regenerates the plots and tables the README and docs show (docs/plots/):
# each comparison of bench/compare/ at a small scale, on this machine, in
# one run, each drawn with its --plot option (python/cxlrt/plot.py):
#   NAME.png   the plot; NAME.json  the rows it was drawn from;
#   NAME.txt   the script's table, as printed.
# NAME: collectives (cxlrt, Open MPI, Gloo, the ceiling probe; 2 ranks),
# kv (cxlrt vs Redis), alltoallv (MoE all-to-all-v vs Open MPI), pods (the
# all-reduce across 2 pods of 2 ranks vs one pool and flat Open MPI).
#
#   scripts/plots.sh [NAME...]      (default: all; env OUT=docs/plots)
#   scripts/plots.sh --replot [NAME...]
#     redraws NAME.png from the kept NAME.json (after a change to the
#     plotter), running nothing.
#
# Takes about 10 minutes on a 2-core VM; the compare scripts install what
# they need (Open MPI, Debian's torch for Gloo, Redis) as root. Figures
# move between machines and runs: read them as ratios within one plot.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/plots}
mkdir -p "$OUT"
[ -x build/bin/cxlrt ] || scripts/build.sh >&2
replot=0
if [ "${1:-}" = --replot ]; then
  replot=1
  shift
fi
names=("$@")
[ $# -gt 0 ] || names=(collectives kv alltoallv pods)

title() {  # as the compare scripts title their plots
  case $1 in
    collectives) echo "collectives: cxlrt, Open MPI, Gloo (bench/compare/collectives.sh)" ;;
    kv) echo "KV: cxlrt vs Redis (bench/compare/kv.sh)" ;;
    alltoallv) echo "MoE all-to-all-v: cxlrt vs Open MPI (bench/compare/alltoallv.sh)" ;;
    pods) echo "across pods: cxlrt, one pool, Open MPI (bench/compare/pods.sh)" ;;
  esac
}
if [ $replot = 1 ]; then
  for name in "${names[@]}"; do
    /usr/bin/python3 python/cxlrt/plot.py -o "$OUT/$name.png" --title "$(title "$name")" \
      "$OUT/$name.json"
  done
  exit 0
fi

for name in "${names[@]}"; do
  echo "# $name -> $OUT/$name.png" >&2
  case $name in
    collectives)
      MIN=64K MAX=16M ITERS=10 WARMUP=3 COLLS="allreduce allgather broadcast reducescatter" \
        bench/compare/collectives.sh 2 --plot "$OUT/$name.png" >"$OUT/$name.txt" ;;
    kv)
      BLOCKS=16K,256K,2M WS=64M REPS=3 bench/compare/kv.sh --plot "$OUT/$name.png" \
        >"$OUT/$name.txt" ;;
    alltoallv)
      TOKENS=1024 HIDDEN=1024 ROUNDS=1 ITERS=10 WARMUP=3 SKEWS="zipf:1.2 uniform" \
        bench/compare/alltoallv.sh 2 --plot "$OUT/$name.png" >"$OUT/$name.txt" ;;
    pods)
      PODS=2 RANKS=4 MIN=64K MAX=16M ITERS=5 WARMUP=2 \
        bench/compare/pods.sh --plot "$OUT/$name.png" >"$OUT/$name.txt" ;;
    *) echo "plots.sh: no plot named $name (collectives, kv, alltoallv, pods)" >&2; exit 2 ;;
  esac
done
ls -l "$OUT" >&2
