#!/bin/bash
# Installs the Python package the way a user does, `pip install ./python`
# into a fresh venv (its build dependencies come from PyPI), and runs an
# all-reduce and a KV round trip with the installed package, from outside
# the source tree. Then, where the project's venv has torch, the torch
# backend from the installed package (its source, headers and libcxlrt.so
# all inside the package).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/cxlrt-pip.XXXXXX)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check "$src/python"
cd "$work"
"$work/venv/bin/python" - <<'PY'
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
print("installed package OK:", cxlrt.__file__)
PY

venv_py="$src/.venv/bin/python"
if ! "$venv_py" -c "import torch" 2>/dev/null; then
  echo "no torch in $src/.venv: the installed torch backend is not tried"
  exit 0
fi
site=$("$work/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
PYTHONPATH="$site" TORCH_EXTENSIONS_DIR="$work/torch_extensions" OMP_NUM_THREADS=1 \
MASTER_ADDR=127.0.0.1 MASTER_PORT=29421 "$venv_py" - <<'PY'
import os
import torch
import torch.distributed as dist
import cxlrt
import cxlrt.torch_backend  # noqa: F401
from cxlrt import _paths
assert "site-packages" in cxlrt.__file__, cxlrt.__file__
assert os.path.exists(os.path.join(_paths.LIB_DIR, "libcxlrt.so")), _paths.LIB_DIR
assert os.path.exists(os.path.join(_paths.INCLUDE_DIR, "collectives", "communicator.h"))
dist.init_process_group("cxlrt", rank=0, world_size=1)
x = torch.arange(10, dtype=torch.float32)
dist.all_reduce(x)
assert torch.equal(x, torch.arange(10, dtype=torch.float32)), x
dist.destroy_process_group()
print("installed torch backend OK:", _paths.LIB_DIR)
PY
