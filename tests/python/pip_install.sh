#!/bin/bash
# Installs the Python package the way a user does, `pip install ./python`
# into a fresh venv (its build dependencies come from PyPI), and runs an
# all-reduce and a KV round trip with the installed package, from outside
# the source tree. Then, where the project's venv has torch, the torch
# backend from the installed package: refused, saying why, without a module
# built against torch (pip's isolated build has none), and compiled at
# first use from the package's own source, headers and libcxlrt.so with
# CXLRT_TORCH_JIT=1.
#
# Usage: pip_install.sh [WHEEL_BUILD_DIR [CXX CC]]
# With WHEEL_BUILD_DIR (ctest passes build/python-wheel), scikit-build-core
# builds in that directory and keeps it, so a rerun recompiles only what
# changed: pip still configures the project, builds and installs the wheel
# from the sources exactly as for a user, but not the whole tree every
# time. The fresh venv is made at WHEEL_BUILD_DIR-venv (emptied every run)
# and the torch backend compiles in WHEEL_BUILD_DIR-torch-ext, so that its
# compile commands repeat and ccache serves them. A fresh build tree (a
# fresh clone, CI) starts all three empty; CXLRT_PIP_TEST_FRESH=1 empties
# them first. ccache, where installed, compiles for both builds.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/cxlrt-pip.XXXXXX)
trap 'rm -rf "$work"' EXIT
settings=()
venv=$work/venv
torch_ext=$work/torch_extensions
if [[ $# -ge 1 ]]; then
  wheel_build=$1
  venv=$wheel_build-venv
  torch_ext=$wheel_build-torch-ext
  if [[ "${CXLRT_PIP_TEST_FRESH:-0}" == 1 ]]; then
    rm -rf "$wheel_build" "$venv" "$torch_ext"
  fi
  if [[ -f "$wheel_build/CMakeCache.txt" ]]; then
    echo "reusing the wheel's build directory $wheel_build"
  else
    echo "building the wheel from scratch in $wheel_build"
  fi
  settings+=(--config-settings=build-dir="$wheel_build")
fi
if command -v ccache >/dev/null; then
  # The main build's flags (scripts/build.sh: RelWithDebInfo, -Werror)
  # rather than the wheel's Release: every compile command of the wheel's
  # libraries then repeats one of the main build's, and ccache serves it
  # (CCACHE_NOHASHDIR: the two builds compile in different directories).
  # On a fresh machine that is the difference between compiling the
  # library twice and once. Everything else is what a user's pip does.
  # The same compilers by the same paths, too (ccache hashes the path;
  # pip's environment would pick x86_64-linux-gnu-g++): ctest passes the
  # main build's.
  export CCACHE_NOHASHDIR=1
  if [[ $# -ge 3 ]]; then
    settings+=(--config-settings=cmake.define.CMAKE_CXX_COMPILER="$2"
               --config-settings=cmake.define.CMAKE_C_COMPILER="$3")
  fi
  settings+=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache
             --config-settings=cmake.define.CMAKE_CUDA_COMPILER_LAUNCHER=ccache
             --config-settings=cmake.build-type=RelWithDebInfo
             --config-settings=cmake.define.CXLRT_WERROR=ON)
fi
/usr/bin/python3 -m venv --clear "$venv"
start=$(date +%s)
"$venv/bin/pip" install -q --disable-pip-version-check "${settings[@]}" "$src/python"
echo "pip install ./python took $(($(date +%s) - start)) s"
cd "$work"
"$venv/bin/python" - <<'PY'
import os
import numpy as np
import cxlrt
assert "site-packages" in cxlrt.__file__, cxlrt.__file__
uri = f"emu://pip-install-{os.getpid()}?size=128M"
with cxlrt.Host(uri, create=True) as host:
    with host.communicator("solo", 1, 0) as comm:
        x = np.arange(1000, dtype=np.float32)
        comm.all_reduce(x)
        assert (x == np.arange(1000)).all()
    store = host.store(create=True)
    store.put("ns", "k", b"value")
    assert store.get("ns", "k") == b"value"
    store.close()
cxlrt.Pool.destroy(uri, force=True)
from cxlrt import nixl  # NIXL's CXLRT plugin, in the wheel (docs/nixl.md)
plugin = nixl.plugin_path()
assert "site-packages" in plugin and os.path.getsize(plugin) > 0, plugin
print("installed package OK:", cxlrt.__file__, "with", plugin)
PY

venv_py="$src/.venv/bin/python"
if ! "$venv_py" -c "import torch" 2>/dev/null; then
  echo "no torch in $src/.venv: the installed torch backend is not tried"
  exit 0
fi
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# torch.utils.cpp_extension compiles with `c++`: through ccache's
# masquerading directory where there is one.
ccache_dir=/usr/lib/ccache
if [[ -x $ccache_dir/c++ ]]; then export PATH=$ccache_dir:$PATH; fi
# A run killed mid-compile leaves torch's lock, which the next would wait on.
rm -f "$torch_ext"/*/lock
# pip's isolated build has no torch, so the wheel carries the backend's
# source but not its compiled module: importing it must say so and how to
# get one, and CXLRT_TORCH_JIT=1 must compile it from the package's own
# source, headers and libcxlrt.so.
PYTHONPATH="$site" "$venv_py" - <<'PY'
try:
    import cxlrt.torch_backend  # noqa: F401
except ImportError as e:
    assert "is not built" in str(e) and "CXLRT_TORCH_JIT=1" in str(e), e
    print("without a prebuilt backend the import says why:", str(e)[:80], "...")
else:
    raise AssertionError("cxlrt.torch_backend imported from a wheel built without torch")
PY
PYTHONPATH="$site" TORCH_EXTENSIONS_DIR="$torch_ext" OMP_NUM_THREADS=1 CXLRT_TORCH_JIT=1 \
MASTER_ADDR=127.0.0.1 MASTER_PORT=29421 "$venv_py" - <<'PY'
import os
import torch
import torch.distributed as dist
import cxlrt
import cxlrt.torch_backend  # noqa: F401
from cxlrt import _paths
assert cxlrt.torch_backend.EXTENSION_ORIGIN == "jit", cxlrt.torch_backend.EXTENSION_ORIGIN
assert "site-packages" in cxlrt.__file__, cxlrt.__file__
assert os.path.exists(os.path.join(_paths.LIB_DIR, "libcxlrt.so")), _paths.LIB_DIR
assert os.path.exists(os.path.join(_paths.INCLUDE_DIR, "cxlrt", "collectives", "communicator.h"))
dist.init_process_group("cxlrt", rank=0, world_size=1)
x = torch.arange(10, dtype=torch.float32)
dist.all_reduce(x)
assert torch.equal(x, torch.arange(10, dtype=torch.float32)), x
dist.destroy_process_group()
print("installed torch backend OK:", _paths.LIB_DIR)
PY
