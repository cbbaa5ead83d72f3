#!/usr/bin/env bash
# Quick start, command 1: install, build, and run the demo on an emulated
# pool: `cxlrt run` starts two emulated hosts (two processes) that attach
# and see each other's heartbeats, then `cxlrt pool info`, a KV-cache block
# handoff between emulated hosts (`cxlrt kv handoff`, `cxlrt kv stats`),
# `cxlrt pool check`, `cxlrt bench pool` on an emulated switch-attached CXL
# pool, and a 4-rank all-reduce.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# The demo runs the `cxlrt` program alone: build only it (the test
# command builds the rest, reusing what this built).
CXLRT_BUILD_TARGETS=cxlrt_cli scripts/build.sh

cxlrt=build/bin/cxlrt
uri="emu://demo-$$?size=256M"
pool="emu://demo-$$"
trap '$cxlrt pool destroy --force "$pool" >/dev/null 2>&1 || true' EXIT

echo
echo "== cxlrt doctor"
$cxlrt doctor
echo
echo "== cxlrt pool create $uri"
$cxlrt pool create "$uri"
echo
echo "== cxlrt run: two emulated hosts (two processes) attach for 3 s and watch each other"
$cxlrt run -n 2 --pool "$pool" -- "$cxlrt" pool attach --seconds 3 --interval-ms 500 &
job=$!
sleep 1.5
echo
echo "== cxlrt pool info $pool (while both are attached)"
$cxlrt pool info "$pool"
wait "$job"
echo
echo "== cxlrt run: KV-cache handoff: host 0 (prefill) puts a chain of 8 KV blocks, hosts 1-2 (decode) look it up, pin it and get it"
$cxlrt run -n 3 --pool "$pool" -- "$cxlrt" kv handoff --blocks 8 --block 256K
echo
echo "== cxlrt kv stats $pool"
$cxlrt kv stats "$pool"
echo
echo "== cxlrt pool check $pool"
$cxlrt pool check "$pool"
echo
echo "== cxlrt bench pool: the coherence layer on an emulated switch-attached CXL pool"
$cxlrt bench pool "emu://demo-bench-$$?size=128M&model=switch" --reps 3
echo
echo "== cxlrt bench allreduce: 4 ranks (emulated hosts) all-reduce through the pool, nccl-tests columns"
$cxlrt bench allreduce --ranks 4 -b 64K -e 16M -f 16 -n 10 -w 3
echo
echo "== cxlrt pool destroy $pool"
$cxlrt pool destroy "$pool"
trap - EXIT
