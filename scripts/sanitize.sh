#!/usr/bin/env bash
# The suite under AddressSanitizer + UndefinedBehaviorSanitizer, built with
# clang into build-asan/, with the libFuzzer harnesses: every test but the
# long stress binaries, the models and each fuzzer for CXLRT_FUZZ_SECONDS
# (default 60). Any sanitizer report fails the run (-fno-sanitize-recover).
# Called by scripts/test.sh; runs alone too.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCXLRT_SANITIZE=address,undefined -DCXLRT_FUZZ=ON \
  -DCXLRT_FUZZ_SECONDS="${CXLRT_FUZZ_SECONDS:-60}" >/dev/null
cmake --build build-asan -j"$jobs"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
ctest --test-dir build-asan -j2 --output-on-failure --timeout 900 -LE stress
