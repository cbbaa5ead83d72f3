#!/usr/bin/env bash
# Quick start, command 1: install, build, and run the demo on an emulated
# pool: two emulated hosts (two processes) attach and see each other's
# heartbeats, then `cxlrt pool info` and `cxlrt pool check`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh

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
echo "== two emulated hosts attach for 3 s and watch each other"
$cxlrt pool attach "$pool" --seconds 3 --interval-ms 500 &
first=$!
sleep 0.3
$cxlrt pool attach "$pool" --seconds 3 --interval-ms 500 &
second=$!
sleep 1.5
echo
echo "== cxlrt pool info $pool (while both are attached)"
$cxlrt pool info "$pool"
wait "$first" "$second"
echo
echo "== cxlrt pool check $pool"
$cxlrt pool check "$pool"
echo
echo "== cxlrt pool destroy $pool"
$cxlrt pool destroy "$pool"
trap - EXIT
