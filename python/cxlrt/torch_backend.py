"""torch.distributed backend "cxlrt": collectives of CPU and CUDA tensors
through the pool (a CUDA call is ordered on the caller's current stream, as
NCCL's are). Importing this module registers it:

    import cxlrt.torch_backend  # noqa: F401
    torch.distributed.init_process_group("cxlrt")   # under torchrun

The pool is CXLRT_POOL, else an emulated pool named after the job's
MASTER_PORT (the lowest rank of each host and pool makes it when it does
not exist). A group whose ranks map more than one pool runs across pods
(torch_pods.py: the pool inside each pod, Gloo or NCCL between pods;
docs/python.md, "Across pods"); a group of one pool is the C++ backend
alone, as before. The C++ backend
(a c10d::Backend subclass, python/csrc/torch_backend/) is compiled ahead
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
import sys

import torch
import torch.distributed as dist

from . import AlreadyExistsError, Error, Pool, torch_pods

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

    # Its sources include each other from INCLUDE_DIR (the source tree, or
    # the package's include/ when installed).
    return cpp_extension.load(
        name="cxlrt_torch_backend",
        sources=[os.path.join(_paths.INCLUDE_DIR, s) for s in _paths.TORCH_BACKEND_SOURCES],
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
    """The pool the backend uses. The default holds the many groups torch's
    tests make (1 GiB), its memory reserved as the heap grows and faulted
    in on first touch (reserve=lazy): mapping a whole 1 GiB pool's page
    tables cost every rank about 0.5 s at start, and reserving its memory
    up front rank 0 about 0.25 s (python -m cxlrt.bench startup;
    docs/python.md)."""
    uri = os.environ.get("CXLRT_POOL")
    if uri:
        return uri
    return f"emu://torch-{os.environ.get('MASTER_PORT', '0')}?size=1G&reserve=lazy"


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


def _create_pool(uri: str) -> None:
    # The pool a group's rank makes when it does not exist (torch_pods.discover
    # picks the rank: the lowest of each host and pool URI).
    try:
        Pool.create(uri)
        if not _made:
            atexit.register(_destroy_made_pools)
        _made.add(uri)
    except AlreadyExistsError:
        pass  # CXLRT_POOL names a pool made before the job


def _create(opts, backend_options=None):
    # torch's extended plugin API: opts carries the group's store, rank,
    # size, timeout and torch's own ProcessGroup object for the group.
    rank, size = opts.group_rank, opts.group_size
    uri = pool_uri()
    pods, made = torch_pods.discover(opts.store, rank, size, uri, _ext.pool_identity,
                                     _create_pool)
    if len(pods) == 1:
        # One pod: today's backend, as it was.
        backend = _extension().create(opts.store, rank, size, opts.timeout, uri)
        return _named_group(opts, backend)
    # Several pods (docs/python.md, "Across pods"): the pod's backend over a
    # store of its own, and the engine's groups between pods.
    q = next(i for i, p in enumerate(pods) if rank in p)
    pod_store = dist.PrefixStore(f"cxlrt/pods/{made}/pod{q}/", opts.store)
    pod = _extension().create(pod_store, pods[q].index(rank), len(pods[q]), opts.timeout, uri)
    backend = torch_pods.PodsBackend(opts.store, rank, size, opts.timeout, pods, made, pod)
    return _named_group(opts, backend)


def _group_backends():
    # The device -> backend map of the group torch is making, read from
    # torch's _new_process_group_helper (our caller's caller); None when it
    # is not there (another torch): then the backend goes back unnamed.
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_name != "_new_process_group_helper":
        frame = frame.f_back
    config = frame.f_locals.get("backend_config") if frame is not None else None
    try:
        return dict(config.get_device_backend_map())
    except AttributeError:
        return None


def _named_group(opts, backend):
    """torch's group for `backend`, named "cxlrt" (docs/python.md, "DDP's
    logging"): torch gives a plugin's backend a ProcessGroup of type CUSTOM
    that says "custom" to DDP's logger; a plugin may instead hand back a
    ProcessGroup, which torch then uses as the group. Only for a group whose
    every device is cxlrt's (torch takes the first ProcessGroup returned and
    makes no other device's backend), and not under
    TORCH_DISTRIBUTED_DEBUG=DETAIL, where torch wraps the Backend in its
    checking wrapper: then the plain backend (named "custom")."""
    if dist.get_debug_level() == dist.DebugLevel.DETAIL:
        return backend
    devices = _group_backends()
    if not devices or any(b != "cxlrt" for b in devices.values()):
        return backend
    store = opts.store
    # torch's group has the group's store; the backend's is its per-device
    # PrefixStore over it.
    pg = _ext.ProcessGroup(getattr(store, "underlying_store", store), opts.group_rank,
                           opts.group_size)
    custom = dist.ProcessGroup.BackendType.CUSTOM
    pg._set_default_backend(custom)
    for device in devices:
        pg._register_backend(torch.device(device), custom, backend)
    torch_pg = getattr(opts, "process_group", None)
    if torch_pg is not None and torch_pg.bound_device_id is not None:
        pg.bound_device_id = torch_pg.bound_device_id
    return pg


dist.Backend.register_backend("cxlrt", _create, extended_api=True, devices=["cpu", "cuda"])
