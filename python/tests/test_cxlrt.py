"""The cxlrt Python package: pools, hosts, pool buffers, collectives across
forked processes (results against numpy), the KV store, errors, and the
GIL released while a call waits. Run by ctest (python_test) with
PYTHONPATH at the build tree's python/."""

import ctypes
import json
import multiprocessing as mp
import os
import threading
import time
import traceback
import uuid

import numpy as np
import pytest

import cxlrt


@pytest.fixture
def uri():
    name = f"pytest-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    u = f"emu://{name}?size=256M"
    pool = cxlrt.Pool.create(u)
    yield pool.uri
    del pool
    cxlrt.Pool.destroy(u, force=True)


def run_ranks(n, fn, *args, timeout=120):
    """Runs fn(rank, n, *args) in n forked processes; re-raises the first
    failure with its traceback text."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def main(r):
        try:
            fn(r, n, *args)
            q.put((r, None))
        except BaseException:  # report everything, exit cleanly
            q.put((r, traceback.format_exc()))

    procs = [ctx.Process(target=main, args=(r,)) for r in range(n)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.time() + timeout
    while len(results) < n and time.time() < deadline:
        try:
            r, err = q.get(timeout=1)
            results[r] = err
        except Exception:
            if any(p.exitcode not in (None, 0) for p in procs):
                break
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    errors = [f"rank {r}: {e}" for r, e in sorted(results.items()) if e]
    missing = [r for r in range(n) if r not in results]
    assert not errors and not missing, "\n".join(errors) + f" missing: {missing}"


def test_pool_errors_carry_the_status_code(uri):
    with pytest.raises(cxlrt.NotFoundError) as e:
        cxlrt.Pool.open("emu://no-such-pool-here")
    assert e.value.code == "NOT_FOUND"
    assert isinstance(e.value, cxlrt.Error)
    with pytest.raises(cxlrt.AlreadyExistsError):
        cxlrt.Pool.create(uri + "?size=64M")
    pool = cxlrt.Pool.open(uri)
    assert pool.size == 256 << 20
    assert pool.check() == []


def test_pool_buffers_are_numpy_arrays_without_a_copy(uri):
    with cxlrt.Host(uri) as host:
        a = host.array((4, 256), "float32")
        a[:] = 7
        buf = host.allocate(4096)
        view = np.frombuffer(buf, np.uint8)
        view[:] = 3
        assert bytes(memoryview(buf)[:4]) == b"\x03" * 4
        assert buf.offset > 0 and buf.nbytes == 4096
        del view  # a buffer with live views is not freed (test_safety.py)
        buf.free()
        assert buf.freed and memoryview(buf).nbytes == 0
        assert a.sum() == 7 * 1024
    with pytest.raises(cxlrt.FailedPreconditionError):
        host.allocate(64)


def _collectives(rank, n, uri):
    with cxlrt.Host(uri) as host, host.communicator("py", n, rank) as comm:
        assert (comm.rank, comm.size) == (rank, n)
        count = 100_003
        base = np.arange(count, dtype=np.float32) % 13
        x = base + rank
        comm.all_reduce(x)
        np.testing.assert_array_equal(x, base * n + n * (n - 1) / 2)

        y = np.full(count, rank + 1, np.int64)
        out = np.empty_like(y)
        comm.all_reduce(y, op="max", out=out)
        assert (out == n).all() and (y == rank + 1).all()

        g = np.empty(n * 1000, np.float64)
        comm.all_gather(np.full(1000, rank, np.float64), g)
        np.testing.assert_array_equal(g, np.repeat(np.arange(n, dtype=np.float64), 1000))

        rs = np.empty(500, np.int32)
        comm.reduce_scatter(np.arange(500 * n, dtype=np.int32), rs)
        np.testing.assert_array_equal(rs, n * np.arange(500 * rank, 500 * (rank + 1)))

        b = np.full(7777, rank, np.uint8)
        comm.broadcast(b, root=n - 1)
        assert (b == n - 1).all()

        t = np.arange(3 * n, dtype=np.float16).reshape(n, 3) + rank
        a2a = np.empty_like(t)
        comm.all_to_all(t, a2a)
        for j in range(n):
            np.testing.assert_array_equal(a2a[j], np.arange(3 * rank, 3 * rank + 3) + j)

        red = np.ones(64, np.float32)
        comm.reduce(red, root=0)
        if rank == 0:
            assert (red == n).all()
        gat = np.zeros(n * 4, np.int32)
        comm.gather(np.full(4, rank, np.int32), gat, root=0)
        if rank == 0:
            np.testing.assert_array_equal(gat, np.repeat(np.arange(n), 4))
        sc = np.empty(4, np.int32)
        comm.scatter(np.arange(4 * n, dtype=np.int32), sc, root=0)
        np.testing.assert_array_equal(sc, np.arange(4 * rank, 4 * rank + 4))

        # Pool-resident arrays go in place.
        z = comm.array(1 << 18, "float32")
        z[:] = rank
        zo = comm.array(1 << 18, "float32")
        comm.all_reduce(z, out=zo)
        assert (zo == n * (n - 1) / 2).all()

        # Point to point around a ring.
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        msg = np.full(200_000, rank, np.int32)
        got = np.empty_like(msg)
        if rank % 2 == 0:
            comm.send(msg, nxt)
            comm.recv(got, prv)
        else:
            comm.recv(got, prv)
            comm.send(msg, nxt)
        assert (got == prv).all()
        comm.barrier()


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_matches_numpy(uri, n):
    run_ranks(n, _collectives, uri)


def _mismatch(rank, n, uri):
    with cxlrt.Host(uri) as host:
        comm = host.communicator("bad", n, rank, timeout=20)
        x = np.ones(10 if rank == 0 else 20, np.float32)
        with pytest.raises(cxlrt.InvalidArgumentError) as e:
            comm.all_reduce(x)
        assert "count=10" in str(e.value) and "count=20" in str(e.value)
        with pytest.raises(cxlrt.FailedPreconditionError):
            comm.barrier()
        comm.destroy()


def test_a_mismatched_call_raises_on_every_rank(uri):
    run_ranks(2, _mismatch, uri)


def _gil(rank, n, uri):
    with cxlrt.Host(uri) as host, host.communicator("gil", n, rank) as comm:
        if rank == 1:
            time.sleep(1.0)  # rank 0 waits in the call meanwhile
        ticks = [0]
        stop = threading.Event()

        def count():
            while not stop.is_set():
                ticks[0] += 1
                time.sleep(0.001)

        t = threading.Thread(target=count)
        t.start()
        comm.all_reduce(np.ones(8, np.float32))
        stop.set()
        t.join()
        if rank == 0:
            # A thread that ran while the call waited: the GIL was released.
            assert ticks[0] > 100, ticks[0]


def test_a_waiting_call_releases_the_gil(uri):
    run_ranks(2, _gil, uri)


def test_bad_arguments_raise_before_any_wait(uri):
    with cxlrt.Host(uri) as host:
        comm = host.communicator("solo", 1, 0)
        with pytest.raises(cxlrt.InvalidArgumentError):
            comm.all_reduce(np.ones(4, np.complex64))
        with pytest.raises(cxlrt.InvalidArgumentError):
            comm.all_reduce(np.ones((4, 4), np.float32)[:, 1])
        with pytest.raises(cxlrt.InvalidArgumentError):
            comm.broadcast(np.ones(4, np.float32), root=3)
        x = np.arange(5, dtype=np.float64)
        comm.all_reduce(x)  # one rank: unchanged
        np.testing.assert_array_equal(x, np.arange(5))
        comm.destroy()


def test_gpu_memory_without_a_gpu_is_refused_saying_why(uri):
    # DeviceSpans name GPU memory; where there is none (or the address is
    # not GPU memory) the call refuses before touching it, never reads it
    # as host memory.
    span = cxlrt.DeviceSpan(0x7F0000001000, 4096)
    assert span.ptr == 0x7F0000001000 and span.nbytes == 4096 and "DeviceSpan" in repr(span)
    with cxlrt.Host(uri) as host:
        comm = host.communicator("gpu-refused", 1, 0)
        store = host.store(create=True)
        if not cxlrt.devices_available():
            assert cxlrt.devices_unavailable_reason()
        for call in (lambda: comm._c.all_reduce(span, span, 1024, "float32", "sum", 0),
                     lambda: comm._c.broadcast(span, span, 1024, "float32", 0, 0),
                     lambda: store._s.put("ns", b"k", span),
                     lambda: store._s.get_into("ns", b"k", span)):
            with pytest.raises(cxlrt.InvalidArgumentError, match="DeviceSpan at 0x7f0000001000"):
                call()
        with pytest.raises(cxlrt.InvalidArgumentError, match="expected a buffer"):
            comm._c.all_reduce(object(), span, 1, "float32", "sum", 0)
        # A stream with host arrays: synchronised first (no GPU: refused).
        x = np.ones(4, np.float32)
        comm.all_reduce(x, stream=0)
        assert (x == 1).all()
        with pytest.raises(cxlrt.InvalidArgumentError, match="not a stream"):
            comm.all_reduce(x, stream="s")
        comm.destroy()
        store.close()


def _handoff(rank, n, uri):
    """Prefill (rank 0) puts a chain of KV blocks; decode (rank 1) finds the
    prefix, pins it, and reads it into its own buffers."""
    with cxlrt.Host(uri) as host, host.communicator("kv", n, rank) as comm:
        if rank == 0:
            store = host.store(create=True)
        comm.barrier()
        if rank != 0:
            store = host.store()
        blocks = [np.full(16384, i, np.uint8) for i in range(8)]
        chain = [f"blk-{i}" for i in range(8)]
        if rank == 0:
            errs = store.batch_put("model-a", chain[:6], blocks[:6])
            assert errs == [None] * 6
            with pytest.raises(cxlrt.AlreadyExistsError):
                store.put("model-a", chain[0], blocks[0])
        comm.barrier()
        if rank == 1:
            with store.lookup("model-a", chain) as pins:
                assert pins.length == 6 and len(pins) == 6
                outs = [np.empty(16384, np.uint8) for _ in range(7)]
                got = store.batch_get_into("model-a", chain[:7], outs)
                assert got[:6] == [16384] * 6
                assert isinstance(got[6], cxlrt.NotFoundError)
                for i in range(6):
                    assert (outs[i] == i).all()
            assert store.get("model-a", "blk-2") == bytes(blocks[2])
            assert not store.contains("model-b", "blk-2")
            stats = store.stats()
            assert stats["namespaces"]["model-a"]["entries"] == 6
        comm.barrier()
        store.close()


def test_kv_handoff_between_processes(uri):
    run_ranks(2, _handoff, uri)


def test_kv_quota_and_errors(uri):
    with cxlrt.Host(uri) as host:
        store = host.store(create=True)
        store.set_quota("q", 10_000)
        with pytest.raises(cxlrt.InvalidArgumentError):
            store.put("q", "big", np.zeros(20_000, np.uint8))
        store.put("q", b"\x00\x01raw", b"hello")
        assert store.get("q", b"\x00\x01raw") == b"hello"
        small = bytearray(2)
        with pytest.raises(cxlrt.InvalidArgumentError):
            store.get_into("q", b"\x00\x01raw", small)
        with pytest.raises(cxlrt.NotFoundError):
            store.get("q", "missing")
        store.delete("q", b"\x00\x01raw")
        assert not store.contains("q", b"\x00\x01raw")
        store.close()


def test_the_binding_benchmark_runs_and_reports_both_paths(capsys):
    from cxlrt import bench

    assert bench.main(["kv", "--block", "16K", "--batch", "4", "--reps", "1", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert row["block"] == 16384
    for k in ("cpp_put_gbps", "python_put_gbps", "cpp_get_gbps", "python_get_gbps"):
        assert row[k] > 0, row


def test_batches_take_str_keys_and_refuse_bad_buffers(uri):
    with cxlrt.Host(uri) as host:
        store = host.store(create=True)
        assert store.batch_put("ns", ["a", b"b"], [b"1", np.ones(3, np.uint8)]) == [None, None]
        out = [bytearray(1), np.zeros(3, np.uint8)]
        assert store.batch_get_into("ns", ["a", "b"], out) == [1, 3]
        with pytest.raises(cxlrt.InvalidArgumentError):
            store.batch_get_into("ns", ["a"], [b"read-only"])
        with pytest.raises(cxlrt.InvalidArgumentError):
            store.batch_put("ns", ["x", "y"], [b"1"])
        with pytest.raises(cxlrt.InvalidArgumentError):
            store.batch_put("ns", [3], [b"1"])
        store.close()


def test_paged_blocks_gather_every_layers_pages_and_scatter_them_elsewhere(uri):
    # Two layers of a paged cache, [2 (K, V), 8 blocks, 64 bytes] each.
    layers = [np.random.default_rng(i).integers(0, 255, (2, 8, 64), dtype=np.uint8)
              for i in range(2)]
    def segments(caches):
        return [(c[kv].ctypes.data, c.strides[1], c[kv, 0].nbytes)
                for c in caches for kv in (0, 1)]
    with cxlrt.Host(uri) as host:
        store = host.store(create=True)
        assert store.batch_put_paged("paged", ["b0", "b1"], [3, 5], segments(layers)) == [None, None]
        assert store.get("paged", "b0") == b"".join(
            layers[l][kv, 3].tobytes() for l in (0, 1) for kv in (0, 1))
        other = [np.zeros_like(c) for c in layers]
        assert store.batch_get_paged("paged", ["b0", "b1"], [0, 7], segments(other)) == [256, 256]
        for l in (0, 1):
            assert np.array_equal(other[l][:, 0], layers[l][:, 3])
            assert np.array_equal(other[l][:, 7], layers[l][:, 5])
            assert not other[l][:, 1:7].any()
        # Another layout (one layer only): refused, and nothing copied.
        res = store.batch_get_paged("paged", ["b0"], [2], segments(other[:1]))
        assert isinstance(res[0], cxlrt.InvalidArgumentError) and "parts hold" in str(res[0])
        assert not other[0][:, 2].any()
        with pytest.raises(cxlrt.InvalidArgumentError, match="differ in length"):
            store.batch_put_paged("paged", ["x"], [1, 2], segments(layers))
        with pytest.raises(cxlrt.InvalidArgumentError, match="at least one segment"):
            store.batch_put_paged("paged", ["x"], [1], [])
        store.close()


def test_the_paged_benchmark_runs_and_reports_every_path(capsys):
    from cxlrt import bench

    assert bench.main(["paged", "--layers", "2", "--page", "4K", "--batch", "2", "--reps", "1",
                       "--json"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert row["block"] == 2 * 2 * 4096
    for k in ("paged_put_gbps", "staged_put_gbps", "contiguous_put_gbps", "paged_get_gbps",
              "staged_get_gbps", "contiguous_get_gbps", "memcpy_gbps"):
        assert row[k] > 0, row


class DlpackOnly:
    """An array known only through DLPack (as JAX and TensorFlow arrays are
    to cxlrt): numpy's own __dlpack__ behind it."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, stream=None):
        return self.arr.__dlpack__()

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


class _Device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int32), ("id", ctypes.c_int32)]


class _Dtype(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _Dtype), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", _Tensor)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_LEGACY, _VERSIONED = b"dltensor", b"dltensor_versioned"
_CODES = {"i": 0, "u": 1, "f": 2}


class Producer:
    """An array known only through DLPack, over a numpy array's memory, as
    JAX's immutable arrays are: a legacy capsule (no read-only flag) when the
    consumer asks for no version, and a DLPack 1.0 capsule carrying the
    array's writability when it asks for max_version >= (1, 0). With
    versioned=False it is a legacy-only producer (no max_version)."""

    def __init__(self, arr, versioned=True):
        self.arr, self.versioned, self.keep = arr, versioned, []

    def _tensor(self):
        a = self.arr
        shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
        self.keep.append(shape)
        t = _Tensor(a.ctypes.data, _Device(1, 0), a.ndim,
                    _Dtype(_CODES[a.dtype.kind], a.dtype.itemsize * 8, 1), shape, None, 0)
        return t

    def __dlpack__(self, stream=None, max_version=None, **kw):
        if max_version is not None and not self.versioned:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        if max_version is not None and tuple(max_version) >= (1, 0):
            m = _ManagedVersioned(_Version(1, 0), None, None,
                                  0 if self.arr.flags.writeable else 1, self._tensor())
            self.keep.append(m)
            return _capsule_new(ctypes.addressof(m), _VERSIONED, None)
        m = _Managed(self._tensor(), None, None)
        self.keep.append(m)
        return _capsule_new(ctypes.addressof(m), _LEGACY, None)

    def __dlpack_device__(self):
        return (1, 0)


def _dlpack_rank(rank, n, uri):
    with cxlrt.Host(uri) as host, host.communicator("dlpack", n, rank) as comm:
        x = np.arange(1000, dtype=np.float32) * (rank + 1)
        comm.all_reduce(Producer(x))  # in place, through a DLPack 1.0 view
        np.testing.assert_array_equal(x, np.arange(1000, dtype=np.float32) * sum(range(1, n + 1)))
        out = np.zeros(n * 4, np.int64)
        comm.all_gather(DlpackOnly(np.full(4, rank, np.int64)), Producer(out))
        np.testing.assert_array_equal(out, np.repeat(np.arange(n), 4))


def test_dlpack_arrays_go_through_collectives_and_the_store(uri):
    run_ranks(2, _dlpack_rank, uri)
    with cxlrt.Host(uri) as host:
        store = host.store(create=True)
        store.put("d", "k", DlpackOnly(np.arange(10, dtype=np.int32)))
        back = np.zeros(10, np.int32)
        assert store.get_into("d", "k", Producer(back)) == 40
        np.testing.assert_array_equal(back, np.arange(10))
        assert store.batch_put("d", ["a", "b"], [DlpackOnly(np.ones(3, np.uint8))] * 2) == [None] * 2
        with pytest.raises(cxlrt.InvalidArgumentError, match="not C-contiguous"):
            store.put("d", "s", DlpackOnly(np.arange(10, dtype=np.int32)[::2]))
        with pytest.raises(cxlrt.InvalidArgumentError, match="no element type"):
            store.put("d", "c", DlpackOnly(np.ones(2, np.complex64)))
        # A capsule another consumer already took (renamed, as the protocol says).
        import ctypes

        cap = np.ones(2).__dlpack__()
        ctypes.pythonapi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
        ctypes.pythonapi.PyCapsule_SetName(cap, b"used_dltensor")
        with pytest.raises(cxlrt.InvalidArgumentError, match="unconsumed DLPack"):
            cxlrt._cxlrt.dlpack_view(cap)
        store.close()
