#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs (Release, with CUDA) into
# .gpu/bin, and copies the shared libraries those programs need that a bare
# CUDA machine image lacks (Abseil, hwloc, libpmem2, libnuma...) into
# .gpu/lib. For GPU machines that cannot install Debian packages: carry
# .gpu there and run `scripts/gpu-check.sh --prebuilt .gpu` (docs/gpu.md).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCXLRT_PYTHON=ON >/dev/null
cmake --build build-gpu -j"$jobs" --target cxlrt_cli gpu_test gpu_api_test cxlrt_shared _cxlrt
rm -rf .gpu && mkdir -p .gpu/bin .gpu/lib
for b in cxlrt gpu_test gpu_api_test; do
  strip -o .gpu/bin/$b build-gpu/bin/$b
done
# The Python package as pip installs it (sources, the torch backend's
# sources, cxlrt's headers, libcxlrt.so), but its extension: the GPU image's
# Python is another version, so gpu-check.sh compiles its sources
# (python/csrc/*.cc and *.h) there against that
# Python, with Abseil's headers carried beside cxlrt's.
cmake --install build-gpu --component python --prefix .gpu/py >/dev/null
rm -f .gpu/py/cxlrt/_cxlrt*.so
strip .gpu/py/cxlrt/lib/libcxlrt.so
mkdir -p .gpu/py/python/csrc
cp python/csrc/*.cc python/csrc/*.h .gpu/py/python/csrc/
cp -r /usr/include/absl .gpu/py/cxlrt/include/
# Every library they load but the C runtime's own (the GPU machine's
# glibc is at least Debian 12's).
ldd .gpu/bin/* .gpu/py/cxlrt/lib/libcxlrt.so | awk '/=> \//{print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" .gpu/lib/; done
du -sh .gpu
