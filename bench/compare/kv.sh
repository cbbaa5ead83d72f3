#!/bin/bash
# Compares cxlrt's KV-cache store with Redis on this machine, in one run:
# the same block sizes, working set and caller buffers put and got through
# `cxlrt bench kv` (host 0 puts, host 1 gets, through the pool) and through
# Redis 7 (Debian's redis-server, started here on a Unix socket, snapshots
# and AOF off, stopped after; a hiredis client pipelines the batched runs).
# Prints GB/s for both and the ratio cxlrt / Redis.
#
#   bench/compare/kv.sh [--plot FILE.png]   env: BLOCKS=16K,256K,2M WS=256M REPS=5 BATCH=32
#
# Installs what it needs (root, apt-get).
set -euo pipefail
. "$(dirname "$0")/plot_option.sh"
plot_option_parse "$@"
set -- "${PLOT_ARGS[@]+"${PLOT_ARGS[@]}"}"
cd "$(dirname "$0")/../.."
BLOCKS=${BLOCKS:-16K,256K,2M}
WS=${WS:-256M}
REPS=${REPS:-5}
BATCH=${BATCH:-32}

bytes() {  # 64K -> 65536
  /usr/bin/python3 -c "import sys; s=sys.argv[1].upper(); m={'K':1<<10,'M':1<<20,'G':1<<30}
print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1"
}

need=()
command -v redis-server >/dev/null || need+=(redis-server)
[ -f /usr/include/hiredis/hiredis.h ] || need+=(libhiredis-dev)
command -v gcc >/dev/null || need+=(gcc)
if [ ${#need[@]} -gt 0 ]; then
  echo "# installing ${need[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >&2
fi
[ -x build/bin/cxlrt ] || ./scripts/build.sh >&2

WORK=$(mktemp -d /tmp/cxlrt-kv-compare.XXXXXX)
SOCK="$WORK/redis.sock"
redis_pid=
cleanup() {
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
gcc -O2 -o "$WORK/redis_kv" bench/compare/redis_kv.c -lhiredis

redis-server --port 0 --unixsocket "$SOCK" --unixsocketperm 700 --save "" --appendonly no \
  --dir "$WORK" --daemonize no --protected-mode yes --loglevel warning \
  --proto-max-bulk-len 512mb >"$WORK/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 200); do [ -S "$SOCK" ] && break; sleep 0.05; done
[ -S "$SOCK" ] || { cat "$WORK/redis.log" >&2; echo "redis-server did not start" >&2; exit 1; }
echo "# $(redis-server --version | cut -d' ' -f1-3)" >&2

echo "# cxlrt bench kv --block $BLOCKS --hosts 2" >&2
build/bin/cxlrt bench kv --block "$BLOCKS" --hosts 2 --reps "$REPS" --batch "$BATCH" \
  --working-set "$WS" --json >"$WORK/cxlrt.json"
echo "# Redis" >&2
sizes=()
IFS=, read -ra list <<<"$BLOCKS"
for b in "${list[@]}"; do sizes+=("$(bytes "$b")"); done
"$WORK/redis_kv" "$SOCK" "$(bytes "$WS")" "$BATCH" "$REPS" "${sizes[@]}" >"$WORK/redis.jsonl"

if [ -n "$PLOT" ]; then  # one JSON line for cxlrt's object, then Redis's lines
  /usr/bin/python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' \
    "$WORK/cxlrt.json" | cat - "$WORK/redis.jsonl" >"$WORK/both.jsonl"
  plot_option_draw "KV: cxlrt vs Redis (bench/compare/kv.sh)" "$WORK/both.jsonl"
fi

/usr/bin/python3 - "$WORK/cxlrt.json" "$WORK/redis.jsonl" <<'PY'
import json, sys
cx = json.load(open(sys.argv[1]))
rd = {r["block"]: r for r in map(json.loads, open(sys.argv[2]))}
def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
print(f"KV put / get, GB/s: cxlrt (host 0 puts, host 1 gets, through the pool) vs Redis "
      f"(Unix socket); memcpy here: {cx['memcpy_gbps']:.2f} GB/s; working set "
      f"{cx['working_set_bytes'] >> 20} MiB per size")
print(f"{'block':>8} {'op':>4} {'batch':>6} {'cxlrt':>8} {'/memcpy':>8} {'Redis':>8} {'cxlrt/Redis':>12}")
for row in cx["rows"]:
    r = rd[row["block"]]
    for batched in (False, True):
        c = row["batch_gbps" if batched else "gbps"]
        p = r[("batch_" if batched else "") + row["op"] + "_gbps"]
        print(f"{size(row['block']):>8} {row['op']:>4} {cx['batch'] if batched else 1:>6} "
              f"{c:8.2f} {c / cx['memcpy_gbps']:8.2f} {p:8.2f} {c / p:11.1f}x")
print(f"Lookup (cxlrt): 1 key {cx['lookup_1_ns']:.0f} ns, 64-key chain "
      f"{cx['lookup_64_ns'] / 1000:.1f} us")
wrong = cx["wrong"] + sum(r["wrong"] for r in rd.values())
print(f"#wrong {wrong}")
sys.exit(1 if wrong else 0)
PY
