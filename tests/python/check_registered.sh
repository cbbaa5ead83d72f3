#!/usr/bin/env bash
# Fails, naming each, when a test that must never vanish is not registered
# in the build: the names in LIST (one a line, # comments) and any given
# after it, against `ctest -N`. Catches a framework or torch test dropped at
# configure time (docs/testing.md, "Tests that need torch or a framework").
# Usage: check_registered.sh CTEST BUILD_DIR LIST [NAME...]
set -euo pipefail
ctest=$1 build=$2 list=$3
shift 3
registered=$("$ctest" --test-dir "$build" -N | sed -n 's/^ *Test *#[0-9]*: *//p')
want=()
while read -r name; do
  name=${name%%#*}
  name=${name//[[:space:]]/}
  [[ -n $name ]] && want+=("$name")
done <"$list"
want+=("$@")
missing=()
for name in "${want[@]}"; do
  grep -qxF -- "$name" <<<"$registered" || missing+=("$name")
done
if ((${#missing[@]})); then
  echo "not registered: ${missing[*]}"
  echo "(tests/CMakeLists.txt registers each; $list lists them)"
  exit 1
fi
echo "all ${#want[@]} tests of $list are registered"
