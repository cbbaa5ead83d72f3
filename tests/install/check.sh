#!/usr/bin/env bash
# Installs the build tree BUILD into a scratch prefix, then builds and runs
# tests/install/consumer.cc against it twice: through find_package(cxlrt)
# and through pkg-config; builds the C++ examples (examples/*.cc) against it
# and runs them on two ranks under the installed CLI. ctest: install_test.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
# No internal header is installed: public classes keep their state behind them.
internal=$(find "$work/prefix" -type f -path '*/internal/*')
if [ -n "$internal" ]; then
  echo "install_test: internal headers were installed:" $internal >&2
  exit 1
fi
# Communicator keeps its state behind an Impl: its transport, pool layout,
# algorithms and copy engines are not installed.
for h in transport.h pool_transport.h comm_layout.h communicator_impl.h algorithms/algorithm.h \
         copy_engine.h gpu_engine.h comm_knobs.h; do
  if [ -e "$work/prefix/include/cxlrt/collectives/$h" ]; then
    echo "install_test: cxlrt/collectives/$h is installed (it is internal)" >&2
    exit 1
  fi
done

cmake -S "$src" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCXLRT_EXAMPLES_DIR="$src/../../examples" >/dev/null
cmake --build "$work/cmake" >/dev/null
mkdir "$work/run1"
"$work/cmake/consumer" "$work/run1"

pc_dir=$(dirname "$(find "$work/prefix" -name cxlrt.pc)")
# shellcheck disable=SC2046
c++ -O1 "$src/consumer.cc" -o "$work/consumer-pc" \
  $(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs cxlrt)
mkdir "$work/run2"
"$work/consumer-pc" "$work/run2"

"$work/prefix/bin/cxlrt" --help >/dev/null
for example in kv_handoff allreduce; do
  "$work/prefix/bin/cxlrt" run -n 2 --timeout 120 -- "$work/cmake/example_$example" >/dev/null
done
# Built with MPI: the example across pods, from the installed cxlrt::pods_mpi,
# on 2 pods x 2 ranks (the MPI stand-in tests say when MPI is missing).
if [ -e "$work/prefix/include/cxlrt/pods/mpi_communicator.h" ]; then
  if [ ! -x "$work/cmake/example_pods_allreduce" ]; then
    echo "install_test: cxlrt::pods_mpi is installed but the example across pods did not build" >&2
    exit 1
  fi
  # Open MPI's exit-time allocations are not ours (tests/CMakeLists.txt,
  # cxlrt_mpi_test): no leak check for this run in a sanitized build.
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
    "$work/prefix/bin/cxlrt" run --pods 2 -n 4 --timeout 100 -- "$work/cmake/example_pods_allreduce" >/dev/null
fi
echo "install_test: find_package, pkg-config, the examples (across pods too where MPI is in) and the CLI work from $work/prefix"
