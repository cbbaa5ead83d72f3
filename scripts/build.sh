#!/usr/bin/env bash
# Configures and builds cxlrt into build/ (programs in build/bin/).
# Usage: [CXLRT_BUILD_TARGETS="t1 t2"] scripts/build.sh [extra cmake -D options]
# Compiles through ccache where it is installed (install-deps.sh installs
# it), so a rebuild after a small change, or of a second tree of the same
# sources, recompiles only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
launcher=()
# Hits across build directories (the pip install test's wheel build
# compiles the same commands elsewhere): the hash leaves out the directory
# a compile runs in. (With CCACHE_BASEDIR also set, paths become relative
# to that directory, which differs between this tree's Makefiles and the
# wheel's Ninja build, and the wheel misses; objects served from another
# tree's compile keep that tree's directory in their debug info.)
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCXLRT_WERROR=ON "${launcher[@]}" "$@" >/dev/null
# CXLRT_BUILD_TARGETS: only these targets (the demo builds the `cxlrt`
# program alone, cxlrt_cli); default everything.
targets=()
for t in ${CXLRT_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build build -j"$jobs" "${targets[@]}"
