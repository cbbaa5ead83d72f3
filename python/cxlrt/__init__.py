"""cxlrt: communication through a CXL shared memory pool.

Pools, hosts, pool-resident buffers, communicators with NCCL-shaped
collectives, and the KV-cache block store, over the C++ runtime
(docs/python.md). Arrays are numpy arrays or CPU torch tensors (anything
with the buffer protocol works too, with an explicit dtype); results land
in the caller's arrays, and calls that wait release the GIL.

    import numpy as np, cxlrt
    with cxlrt.Host("emu://job?size=256M", create=True) as host:  # one per process
        comm = host.communicator("train", nranks=2, rank=0)
        x = np.ones(1024, np.float32)
        comm.all_reduce(x)                                         # in place, sum

Every failure raises a subclass of ``cxlrt.Error`` carrying ``code`` (the
status code's name) and ``message``.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence, Union

from . import _cxlrt
from ._cxlrt import (
    AbortedError,
    AlreadyExistsError,
    DataLossError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    Pins,
    Pool,
    DeviceSpan,
    PoolBuffer,
    ResourceExhaustedError,
    devices_available,
    devices_unavailable_reason,
    process_metrics,
)

__all__ = [
    "AbortedError", "AlreadyExistsError", "Communicator", "DataLossError", "DeviceSpan",
    "DeadlineExceededError", "Error", "FailedPreconditionError", "Host",
    "InvalidArgumentError", "NotFoundError", "Pins", "Pool", "PoolBuffer",
    "ResourceExhaustedError", "Store", "devices_available", "devices_unavailable_reason",
    "process_metrics",
]

# numpy / torch element types -> cxlrt's names.
_NUMPY = {
    "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32",
    "int64": "int64", "uint64": "uint64", "float16": "float16",
    "float32": "float32", "float64": "float64",
}
_TORCH = {
    "torch.int8": "int8", "torch.uint8": "uint8", "torch.int32": "int32",
    "torch.int64": "int64", "torch.float16": "float16", "torch.bfloat16": "bfloat16",
    "torch.float32": "float32", "torch.float64": "float64",
}


# Producers whose arrays are immutable by contract, whatever their DLPack
# capsule says: cxlrt never writes into them.
_IMMUTABLE = ("jax", "jaxlib", "tensorflow")


def _view(x, dtype: Optional[str] = None, *, writable: bool = False):
    """(buffer, cxlrt dtype, elements) of an array, without a copy: numpy
    arrays, torch tensors, ``__cuda_array_interface__`` objects, DLPack
    arrays, buffers. GPU memory comes back as a DeviceSpan (docs/gpu.md).
    The dtype is the array's own; ``dtype`` names the elements of an untyped
    buffer (bytearray, PoolBuffer). ``writable``: the call writes x, so a
    read-only array is refused (InvalidArgumentError). The C++ side holds
    the buffer for the call and checks its size against the call."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        if x.device.type not in ("cpu", "cuda"):
            raise InvalidArgumentError(f"a {x.device.type} tensor: cxlrt moves CPU and CUDA tensors")
        if not x.is_contiguous():
            raise InvalidArgumentError("the tensor is not contiguous")
        name = _TORCH.get(str(x.dtype))
        if name is None:
            raise InvalidArgumentError(f"cxlrt has no element type for {x.dtype}")
        if x.device.type == "cuda":
            span = _cxlrt.DeviceSpan(x.data_ptr(), x.numel() * x.element_size())
            return span, name, x.numel()
        import torch  # the caller has it

        # numpy has no bfloat16: the same bits through an int16 view.
        arr = x.view(torch.int16).numpy() if name == "bfloat16" else x.numpy()
        return arr, name, x.numel()
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:  # CuPy, Numba and other GPU arrays
        import numpy as np

        if cai.get("strides") is not None:
            raise InvalidArgumentError("the GPU array is not C-contiguous")
        if writable and cai["data"][1]:
            raise InvalidArgumentError("the GPU array is read-only; the call writes it")
        dt = np.dtype(cai["typestr"])
        name = _NUMPY.get(str(dt))
        if name is None:
            raise InvalidArgumentError(f"cxlrt has no element type for {dt}")
        count = int(np.prod(cai["shape"])) if cai["shape"] else 1
        return _cxlrt.DeviceSpan(int(cai["data"][0]), count * dt.itemsize), name, count
    if hasattr(x, "dtype") and hasattr(x, "size") and hasattr(x, "flags"):  # numpy
        if not x.flags["C_CONTIGUOUS"]:
            raise InvalidArgumentError("the array is not C-contiguous")
        name = _NUMPY.get(str(x.dtype))
        if name is None:
            raise InvalidArgumentError(f"cxlrt has no element type for {x.dtype}")
        return x, name, x.size  # a read-only one is refused by the C++ side when written
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):  # JAX, TF, ... arrays
        if writable and mod.split(".")[0] in _IMMUTABLE:
            raise InvalidArgumentError(f"a {mod}.{type(x).__name__} is immutable; cxlrt does "
                                       "not write into it")
        # A CUDA producer orders its work before the consumer's stream (1:
        # the legacy default stream, which the call uses unless given one).
        dev_type = x.__dlpack_device__()[0]
        kw = {"stream": 1} if dev_type in (2, 13) else {}
        try:  # DLPack 1.0 says whether the array is read-only
            cap = x.__dlpack__(max_version=(1, 0), **kw)
        except TypeError:  # a producer of the legacy protocol only
            cap = x.__dlpack__(**kw)
        return _cxlrt.dlpack_view(cap, writable)
    if dtype is None:
        raise InvalidArgumentError("pass dtype= for a buffer that is not an array")
    nbytes = memoryview(x).nbytes
    return x, dtype, nbytes // _cxlrt.dtype_size(dtype)


def _raw(x, writable: bool = False):
    """The buffer of ``x`` for a call that moves bytes (the KV store), whose
    element type does not matter."""
    if (hasattr(x, "dtype") and hasattr(x, "flags") and hasattr(x, "size")
            and not type(x).__module__.startswith("torch")):
        return x  # numpy: any type; contiguity and writability checked in C++
    return _view(x, "uint8", writable=writable)[0]


def _stream(stream, x) -> int:
    """The cudaStream_t of a call, as an integer: ``stream`` itself (an int,
    or an object with ``cuda_stream`` like torch.cuda.Stream, or ``ptr``
    like cupy's), else torch's current stream when ``x`` is a CUDA tensor,
    else 0 (the legacy default stream; nothing for host arrays)."""
    if stream is not None:
        if isinstance(stream, int):
            return stream
        for attr in ("cuda_stream", "ptr"):
            if hasattr(stream, attr):
                return int(getattr(stream, attr))
        raise InvalidArgumentError(f"not a stream: {stream!r}")
    if type(x).__module__.startswith("torch") and x.device.type == "cuda":
        import torch

        return torch.cuda.current_stream(x.device).cuda_stream
    return 0


class Host:
    """This process attached to a pool as one host (its heartbeat, its
    allocator). A context manager; ``close()`` detaches.

    ``pool``: a Pool, a URI, or None for CXLRT_POOL (which ``cxlrt run``
    sets); with ``create=True`` a URI that names no pool yet is created.
    ``slot``/``host_id``: where to attach (default: the environment's
    CXLRT_HOST_ID, else the first free slot).
    """

    def __init__(self, pool: Union[Pool, str, None] = None, *, create: bool = False,
                 slot: Optional[int] = None, host_id: Optional[int] = None):
        if pool is None:
            pool = os.environ.get("CXLRT_POOL")
            if not pool:
                raise InvalidArgumentError("no pool given and CXLRT_POOL is not set")
        if isinstance(pool, str):
            uri = pool
            try:
                pool = Pool.open(uri)
            except NotFoundError:
                if not create:
                    raise
                try:
                    pool = Pool.create(uri)
                except AlreadyExistsError:  # another process made it meanwhile
                    pool = Pool.open(uri)
        self.pool = pool
        self._host = _cxlrt.Host(pool, slot, host_id)

    def __enter__(self) -> "Host":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._host.close()

    @property
    def slot(self) -> int:
        return self._host.slot

    def allocate(self, nbytes: int, alignment: int = 64) -> PoolBuffer:
        """A block of the pool (buffer protocol; ``free()`` returns it)."""
        return self._host.allocate(nbytes, alignment)

    def array(self, shape, dtype="float32"):
        """A numpy array whose memory lies in the pool (it keeps its block)."""
        import numpy as np

        dt = np.dtype(dtype)
        count = int(np.prod(shape))
        buf = self.allocate(max(count * dt.itemsize, 1), 4096)
        return np.frombuffer(buf, dtype=dt, count=count).reshape(shape)

    def communicator(self, name: str, nranks: Optional[int] = None,
                     rank: Optional[int] = None, **options) -> "Communicator":
        """Creates or joins communicator ``name`` (rank and size from the
        launcher's environment when not given). Options: timeout (seconds),
        slot_bytes, depth."""
        return Communicator(self, name, nranks, rank, **options)

    def store(self, create: bool = False, **options) -> "Store":
        """The pool's KV store (made when ``create`` and the pool has none)."""
        return Store(self, create=create, **options)


class Communicator:
    """NCCL-shaped collectives over the pool. Arrays of the same element
    type; ``out`` omitted means in place. A context manager; ``destroy()``
    leaves (a barrier, then the last one out frees the block).

    Arrays may be GPU memory (CUDA tensors, ``__cuda_array_interface__``
    arrays, DeviceSpans) in a build with CUDA: the call then runs on the
    GPU data path, ordered on ``stream`` (torch's current stream of the
    tensor's device by default; docs/gpu.md). A call's arrays are of one
    kind; ranks may differ."""

    def __init__(self, host: Host, name: str, nranks: Optional[int] = None,
                 rank: Optional[int] = None, *, timeout: float = 0.0,
                 slot_bytes: int = 0, depth: int = 0):
        self._c = _cxlrt.Communicator(
            host._host, name, -1 if nranks is None else nranks,
            -1 if rank is None else rank, timeout, slot_bytes, depth)

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    @property
    def rank(self) -> int:
        return self._c.rank

    @property
    def size(self) -> int:
        return self._c.size

    def destroy(self) -> None:
        self._c.destroy()

    def abort(self, why: str = "aborted by the application") -> None:
        self._c.abort(why)

    def array(self, shape, dtype="float32"):
        """A numpy array in the pool that collectives read in place
        (zero-copy)."""
        import numpy as np

        dt = np.dtype(dtype)
        count = int(np.prod(shape))
        buf = self._c.allocate(max(count * dt.itemsize, 1))
        return np.frombuffer(buf, dtype=dt, count=count).reshape(shape)

    # Each call passes its buffers' own element types: the C++ side checks
    # that they are the call's and that every buffer holds exactly what the
    # call reads or writes, before anything is copied.
    def all_reduce(self, x, op: str = "sum", out=None, stream=None):
        s, t, n = _view(x, writable=out is None)
        r, rt = (s, t) if out is None else _view(out, t, writable=True)[:2]
        self._c.all_reduce(s, r, n, t, op, _stream(stream, x), t, rt)
        return x if out is None else out

    def reduce_scatter(self, x, out, op: str = "sum", stream=None):
        s, t, _ = _view(x)
        r, rt, n = _view(out, t, writable=True)
        self._c.reduce_scatter(s, r, n, t, op, _stream(stream, x), t, rt)
        return out

    def all_gather(self, x, out, stream=None):
        s, t, n = _view(x)
        r, rt, _ = _view(out, t, writable=True)
        self._c.all_gather(s, r, n, t, _stream(stream, x), t, rt)
        return out

    def broadcast(self, x, root: int = 0, out=None, stream=None):
        """``x`` matters on the root only: the count is x's on the root,
        ``out``'s elsewhere."""
        s, xt, n = _view(x, writable=out is None)
        r, t = s, xt
        if out is not None:
            r, t, out_n = _view(out, xt, writable=True)
            if self.rank != root:
                n = out_n
        self._c.broadcast(s, r, n, t, root, _stream(stream, x), xt, t)
        return x if out is None else out

    def reduce(self, x, root: int = 0, op: str = "sum", out=None, stream=None):
        """``out`` matters on the root only."""
        s, t, n = _view(x, writable=out is None)
        r, rt = (s, t) if out is None else _view(out, t, writable=True)[:2]
        self._c.reduce(s, r, n, t, op, root, _stream(stream, x), t, rt)
        return x if out is None else out

    def gather(self, x, out, root: int = 0, stream=None):
        """``out`` (size * x elements) matters on the root only."""
        s, t, n = _view(x)
        r, rt, _ = _view(out, t, writable=True)
        self._c.gather(s, r, n, t, root, _stream(stream, x), t, rt)
        return out

    def scatter(self, x, out, root: int = 0, stream=None):
        """``x`` (size * out elements) matters on the root only."""
        r, t, n = _view(out, writable=True)
        s, xt, _ = _view(x, t)
        self._c.scatter(s, r, n, t, root, _stream(stream, out), xt, t)
        return out

    def all_to_all(self, x, out, stream=None):
        s, t, n = _view(x)
        if n % self.size:
            raise InvalidArgumentError(f"{n} elements do not split over {self.size} ranks")
        r, rt, _ = _view(out, t, writable=True)
        self._c.all_to_all(s, r, n // self.size, t, _stream(stream, x), t, rt)
        return out

    def barrier(self) -> None:
        self._c.barrier()

    def send(self, x, peer: int, stream=None) -> None:
        s, t, n = _view(x)
        self._c.send(s, n, t, peer, _stream(stream, x), t)

    def recv(self, x, peer: int, stream=None):
        r, t, n = _view(x, writable=True)
        self._c.recv(r, n, t, peer, _stream(stream, x), t)
        return x


def _buffers(items: Sequence, writable: bool = False) -> Sequence:
    """The items themselves when they have the buffer protocol (numpy,
    bytes, PoolBuffer: checked in C++), else their views (tensors, GPU and
    DLPack arrays; ``writable`` refuses read-only ones)."""
    if items and (type(items[0]).__module__.startswith("torch")
                  or hasattr(items[0], "__cuda_array_interface__")
                  or (hasattr(items[0], "__dlpack__") and not hasattr(items[0], "flags"))):
        return [_raw(x, writable) for x in items]
    return items


def _key(k) -> bytes:
    return k.encode() if isinstance(k, str) else bytes(k)


class Store:
    """The KV-cache block store: write-once values under (namespace, key).
    Keys are str or bytes; values are arrays or buffers. ``get_into`` and
    ``batch_get_into`` copy into the caller's buffers."""

    def __init__(self, host: Host, *, create: bool = False, entries_per_host: int = 0,
                 pins_per_host: int = 0, max_namespaces: int = 0):
        self._s = _cxlrt.Store(host._host, create, entries_per_host, pins_per_host,
                               max_namespaces)

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._s.close()

    def put(self, ns: str, key, value) -> None:
        """AlreadyExistsError when the key is there (the first writer wins)."""
        self._s.put(ns, _key(key), _raw(value))

    def get_into(self, ns: str, key, out) -> int:
        """Copies the value into ``out``; returns its size in bytes."""
        return self._s.get_into(ns, _key(key), _raw(out, writable=True))

    def get(self, ns: str, key) -> bytes:
        """The value; NotFoundError when the key is not there (counted as a
        miss, as get_into counts it)."""
        k = _key(key)
        for _ in range(8):
            try:
                out = bytearray(self._s.value_size(ns, k))
            except NotFoundError:
                out = bytearray(0)  # get_into counts the miss and raises it
            try:
                n = self._s.get_into(ns, k, out)
            except InvalidArgumentError:
                continue  # put again, larger, between the two calls: ask again
            return bytes(out[:n])
        raise AbortedError(f"the value of key {key!r} changed size under 8 reads in a row")

    def contains(self, ns: str, key) -> bool:
        return self._s.contains(ns, _key(key))

    def batch_put(self, ns: str, keys: Sequence, values: Sequence) -> list:
        """One entry per item: None, or the Error of that item. Keys are str
        or bytes; values anything with the buffer protocol, or tensors."""
        return self._s.batch_put(ns, keys, _buffers(values))

    def batch_get_into(self, ns: str, keys: Sequence, outs: Sequence) -> list:
        """One entry per item: the value's size, or the Error of that item."""
        return self._s.batch_get_into(ns, keys, _buffers(outs, writable=True))

    def batch_put_paged(self, ns: str, keys: Sequence, blocks: Sequence[int],
                        segments: Sequence[tuple[int, int, int]]) -> list:
        """Paged caches (a KV cache, one tensor per layer): key i's value is,
        for each segment (address, block stride, bytes) in order, the bytes
        at address + blocks[i] * stride, copied straight into the pool. The
        segments are all host or all GPU memory (else InvalidArgumentError),
        asked once each, not per page. The caller keeps that memory valid for
        the call. One entry per item: None, or the Error of that item."""
        return self._s.batch_put_paged(ns, [_key(k) for k in keys], blocks, segments)

    def batch_get_paged(self, ns: str, keys: Sequence, blocks: Sequence[int],
                        segments: Sequence[tuple[int, int, int]]) -> list:
        """Scatters each value back into its block's pages; the segments must
        add up to the value's size (else that item is an InvalidArgumentError
        and nothing of it is copied). One entry per item: the size, or the Error."""
        return self._s.batch_get_paged(ns, [_key(k) for k in keys], blocks, segments)

    @contextmanager
    def lookup(self, ns: str, chain: Sequence) -> Iterator[Pins]:
        """Pins the longest present prefix of ``chain``; ``pins.length`` keys.
        The pins are released when the block ends."""
        pins = self._s.lookup(ns, [_key(k) for k in chain])
        try:
            yield pins
        finally:
            pins.release()

    def delete(self, ns: str, key) -> None:
        self._s.delete(ns, _key(key))

    def set_quota(self, ns: str, nbytes: int) -> None:
        self._s.set_quota(ns, nbytes)

    def stats(self) -> dict:
        return self._s.stats()
