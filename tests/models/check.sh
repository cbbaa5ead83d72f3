#!/usr/bin/env bash
# Runs one Promela model with spin and checks the verdict.
# Usage: check.sh MODEL.pml safe|violation [spin -D options...]
# "safe": the exhaustive search must finish with no error; "violation":
# spin must find one (the model of a known-broken protocol must fail, or
# the model does not show what it claims). Needs Debian's `spin` and cc.
set -euo pipefail
model=$(realpath "$1"); want=$2; shift 2
command -v spin >/dev/null || { echo "check.sh: spin is not installed (scripts/install-deps.sh)"; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cd "$work"
spin -a "$@" "$model" >spin.out || { cat spin.out; exit 1; }
cc -O2 -w -DSAFETY -o pan pan.c
./pan -m100000 >pan.out 2>&1 || true
errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' pan.out | head -1)
if grep -q "search depth too small\|max search depth too small" pan.out; then
  echo "$(basename "$model") $*: search was truncated (raise -m)"; cat pan.out; exit 1
fi
case "$want:$errors" in
  safe:0) echo "$(basename "$model") $*: verified, $(grep -o '[0-9]* states, stored' pan.out)";;
  violation:0) echo "$(basename "$model") $*: expected a violation, spin found none"; cat pan.out; exit 1;;
  violation:*) echo "$(basename "$model") $*: violation found as expected: $(grep -m1 'violated' pan.out)";;
  *) echo "$(basename "$model") $*: spin reported errors=$errors"; cat pan.out; exit 1;;
esac
