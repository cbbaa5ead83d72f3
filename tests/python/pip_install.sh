#!/bin/bash
# Installs the Python package the way a user does, `pip install ./python`
# into a fresh venv (its build dependencies come from PyPI), and runs an
# all-reduce and a KV round trip with the installed package, from outside
# the source tree.
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
