#!/usr/bin/env bash
# Quick start, command 2: install, build, and run the whole test suite, then
# the suite again under the sanitizers with the fuzzers (scripts/sanitize.sh;
# CXLRT_TEST_SANITIZERS=0 skips that part). Exits non-zero when any test fails.
# CXLRT_TEST_SCALE (default 1) scales the stress tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each part's wall time, printed at the end (and on failure): where a slow
# run spent its time.
times=()
phase_start=$SECONDS
phase() {
  times+=("$1 $((SECONDS - phase_start)) s")
  phase_start=$SECONDS
}
trap 'echo "test.sh: times: ${times[*]:-} (then failed after $((SECONDS - phase_start)) s)"' ERR
scripts/install-deps.sh
phase install-deps
# The torch and framework tests are required: a failed import is a configure
# error, never a test left out (docs/testing.md, "Tests that need torch or a
# framework"). CXLRT_REQUIRE_FRAMEWORKS=0 lets them be skipped instead (not
# with CI=true).
export CXLRT_REQUIRE_FRAMEWORKS="${CXLRT_REQUIRE_FRAMEWORKS:-1}"
scripts/build.sh
phase build
export CXLRT_TEST_SCALE="${CXLRT_TEST_SCALE:-1}"
ctest --test-dir build -j2 --output-on-failure --timeout 600
phase tests
if [[ "${CXLRT_TEST_SANITIZERS:-1}" != 0 ]]; then
  scripts/sanitize.sh
  phase sanitizers
fi
echo "test.sh: times: ${times[*]}"

