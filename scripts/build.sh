#!/usr/bin/env bash
# Configures and builds cxlrt into build/ (programs in build/bin/).
# Usage: scripts/build.sh [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCXLRT_WERROR=ON "$@" >/dev/null
cmake --build build -j"$jobs"
