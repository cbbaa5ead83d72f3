"""torch.distributed backend "cxlrt": collectives of CPU and CUDA tensors
through the pool (a CUDA call is ordered on the caller's current stream, as
NCCL's are). Importing this module registers it:

    import cxlrt.torch_backend  # noqa: F401
    torch.distributed.init_process_group("cxlrt")   # under torchrun

The pool is CXLRT_POOL, else an emulated pool named after the job's
MASTER_PORT (rank 0 makes it when it does not exist). The C++ backend
(a c10d::Backend subclass, python/src/torch_backend.cc) is built at first
use by torch.utils.cpp_extension against the torch in use and libcxlrt.so,
and cached by torch (TORCH_EXTENSIONS_DIR).
"""

from __future__ import annotations

import atexit
import os
from datetime import timedelta

import torch.distributed as dist
from torch.utils import cpp_extension

from . import AlreadyExistsError, Error, Pool

_ext = None


def _extension():
    global _ext
    if _ext is None:
        from . import _paths

        here = os.path.dirname(os.path.abspath(__file__))
        _ext = cpp_extension.load(
            name="cxlrt_torch_backend",
            sources=[os.path.join(here, "torch_backend.cc")],
            extra_include_paths=[_paths.INCLUDE_DIR],
            extra_cflags=["-O2", "-std=c++20"],
            extra_ldflags=[f"-L{_paths.LIB_DIR}", "-lcxlrt", f"-Wl,-rpath,{_paths.LIB_DIR}"],
            verbose=bool(os.environ.get("CXLRT_TORCH_BUILD_VERBOSE")),
        )
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
