#!/usr/bin/env bash
# The suite under the sanitizers, built with clang (docs/testing.md):
#  1. AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/): every
#     test (the spin models aside: no C++ in them; the VM scenarios aside:
#     ASan binaries under TCG guests beside a -j2 suite missed their
#     progress deadlines, and the code they run is the multiprocess
#     tests' code, run here; and the tests labelled asan_skip, which
#     rerun code other tests run here: tests/CMakeLists.txt says why for
#     each) and each libFuzzer
#     harness for CXLRT_FUZZ_SECONDS (default 60) from its seed corpus
#     (CXLRT_SANITIZE_CPU_LEVEL sets the CPU level; default auto).
#  2. ThreadSanitizer (build-tsan/): the in-process thread tests (allocator
#     thread caches and free queues, KV copy threads), with the races on
#     pool memory left out by tests/tsan.supp (why: there).
# Any sanitizer report fails the run. Called by scripts/test.sh; runs alone.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
clang=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)

echo "== sanitize: ASan + UBSan, with the fuzzers"
cmake -S . -B build-asan "${clang[@]}" -DCXLRT_SANITIZE=address,undefined -DCXLRT_FUZZ=ON \
  -DCXLRT_FUZZ_SECONDS="${CXLRT_FUZZ_SECONDS:-60}" >/dev/null
cmake --build build-asan -j"$jobs"
# CXLRT_SANITIZE_CPU_LEVEL=baseline runs this whole suite at the baseline
# CPU level. Not by default: on 2 cores the slower SSE2 kernels under ASan
# starved heartbeats past their lease in 1 of 2 runs (the fencing window of
# docs/allocator.md, "Limits"). The baseline level is covered in both
# builds by communicator_test_baseline, communicator_p2p_test_baseline,
# cpu_features_test_baseline and the kernel tests (reduce_test,
# cpu_kernels_test: every level the CPU has).
CXLRT_CPU_LEVEL="${CXLRT_SANITIZE_CPU_LEVEL:-auto}" \
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1}" \
UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
  ctest --test-dir build-asan -j2 --output-on-failure --timeout 900 -LE 'model|vm|asan_skip'

echo "== sanitize: TSan, in-process thread tests"
tsan_tests=(allocator_test free_queue_test store_test)
cmake -S . -B build-tsan "${clang[@]}" -DCXLRT_SANITIZE=thread >/dev/null
cmake --build build-tsan -j"$jobs" --target "${tsan_tests[@]}"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"
for t in "${tsan_tests[@]}"; do
  echo "-- $t"
  build-tsan/bin/"$t" --gtest_brief=1
done
