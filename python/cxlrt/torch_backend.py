"""torch.distributed backend "cxlrt": collectives of CPU and CUDA tensors
through the pool (a CUDA call is ordered on the caller's current stream, as
NCCL's are). Importing this module registers it:

    import cxlrt.torch_backend  # noqa: F401
    torch.distributed.init_process_group("cxlrt")   # under torchrun

The pool is CXLRT_POOL, else an emulated pool named after the job's
MASTER_PORT (rank 0 makes it when it does not exist). The C++ backend
(a c10d::Backend subclass, python/src/torch_backend.cc) is compiled ahead
of time by the project's build (or pip's) into the package as
cxlrt_torch_backend, against one torch version (_torch_build.py); importing
this module loads it, and refuses, saying how to rebuild, when it is
missing or was built against another torch. CXLRT_TORCH_JIT=1 instead
compiles it at first use by torch.utils.cpp_extension against the torch in
use (cached by torch in TORCH_EXTENSIONS_DIR).
"""

from __future__ import annotations

import atexit
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from . import AlreadyExistsError, Error, Pool

_HERE = os.path.dirname(os.path.abspath(__file__))
_REBUILD = ("build it with `cmake --build build --target cxlrt_torch_backend` (CMake finds "
            "torch in the project's .venv/bin/python, or in -DCXLRT_TORCH_PYTHON=<python>), or "
            "`pip install --no-build-isolation ./python` from an environment with this torch; "
            "or set CXLRT_TORCH_JIT=1 to compile it for this torch at first use")

# How the C++ backend was loaded: "prebuilt" (compiled by the build) or
# "jit" (CXLRT_TORCH_JIT=1: compiled by torch.utils.cpp_extension).
EXTENSION_ORIGIN = ""


def _load_prebuilt():
    try:
        from . import _torch_build
    except ImportError:
        raise ImportError(
            f"cxlrt.torch_backend: the backend's extension cxlrt_torch_backend is not built in "
            f"{_HERE} (no _torch_build.py): {_REBUILD}") from None
    if _torch_build.TORCH_VERSION != torch.__version__:
        # Checked before loading it: a module built against another torch's
        # headers may crash or fail on missing symbols.
        raise ImportError(
            f"cxlrt.torch_backend: cxlrt_torch_backend in {_HERE} was built against torch "
            f"{_torch_build.TORCH_VERSION} ({_torch_build.PYTHON}), but this interpreter has "
            f"torch {torch.__version__} ({os.path.dirname(torch.__file__)}); rebuild it: "
            f"{_REBUILD}")
    try:
        from . import cxlrt_torch_backend
    except ImportError as e:
        raise ImportError(f"cxlrt.torch_backend: cxlrt_torch_backend in {_HERE} does not "
                          f"load ({e}); {_REBUILD}") from e
    return cxlrt_torch_backend


def _build_jit():
    from torch.utils import cpp_extension

    from . import _paths

    return cpp_extension.load(
        name="cxlrt_torch_backend",
        sources=[os.path.join(_HERE, "torch_backend.cc")],
        extra_include_paths=[_paths.INCLUDE_DIR],
        extra_cflags=["-O2", "-std=c++20"],
        extra_ldflags=[f"-L{_paths.LIB_DIR}", "-lcxlrt", f"-Wl,-rpath,{_paths.LIB_DIR}"],
        verbose=bool(os.environ.get("CXLRT_TORCH_BUILD_VERBOSE")),
    )


if os.environ.get("CXLRT_TORCH_JIT") == "1":
    _ext = _build_jit()
    EXTENSION_ORIGIN = "jit"
else:
    _ext = _load_prebuilt()
    EXTENSION_ORIGIN = "prebuilt"


def _extension():
    return _ext


def pool_uri() -> str:
    """The pool the backend uses."""
    uri = os.environ.get("CXLRT_POOL")
    if uri:
        return uri
    return f"emu://torch-{os.environ.get('MASTER_PORT', '0')}?size=1G"


_made: set = set()


def _destroy_made_pools() -> None:
    # The pool rank 0 made for the job goes when its process exits (a
    # process group still referenced at exit, as DDP's is, is never
    # destroyed); the other ranks' mappings outlive the name.
    for uri in _made:
        try:
            Pool.destroy(uri, force=True)
        except Error:
            pass


def _create(store, rank: int, size: int, timeout: timedelta):
    uri = pool_uri()
    if rank == 0:
        try:
            Pool.create(uri)
            if not _made:
                atexit.register(_destroy_made_pools)
            _made.add(uri)
        except AlreadyExistsError:
            pass  # CXLRT_POOL names a pool made before the job
    return _extension().create(store, rank, size, timeout, uri)


dist.Backend.register_backend("cxlrt", _create, devices=["cpu", "cuda"])
