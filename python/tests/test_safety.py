"""Memory safety of the cxlrt Python package (issue 25): every buffer's
size and type checked against the call before any copy, objects made from
a Host outliving its close, close while another thread is inside a call,
buffer exports held for the length of a call, read-only DLPack producers,
and a property test over shapes, types, strides and wrong outs. Run by
ctest (python_safety_test) with PYTHONPATH at the build tree's python/.

A regression that corrupts memory may crash the interpreter: those run in a
forked child (run_ranks), so that a crash fails the one test."""

import gc
import os
import threading
import time
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import cxlrt
from test_cxlrt import Producer, run_ranks, uri  # noqa: F401  (uri: the pool fixture)

CANARY = 0xA5
PAD = 64  # canary bytes on each side of an out buffer


def fenced(nbytes):
    """(whole, inner): a uint8 array of PAD canary bytes, nbytes for the
    call, PAD canary bytes; inner is the middle."""
    whole = np.full(nbytes + 2 * PAD, CANARY, np.uint8)
    return whole, whole[PAD:PAD + nbytes]


def untouched(whole, nbytes):
    return bool((whole[:PAD] == CANARY).all() and (whole[PAD + nbytes:] == CANARY).all())


def fenced_array(count, dtype):
    dt = np.dtype(dtype)
    whole, inner = fenced(count * dt.itemsize)
    return whole, inner.view(dt)


# --- Defect 1: every buffer holds exactly what the call reads or writes ---

def test_the_issues_reproductions_raise_and_write_nothing(uri):
    with cxlrt.Host(uri) as host, host.communicator("sizes", 1, 0) as comm:
        x = np.arange(1024, dtype=np.float32)
        # All-reduce into a 4-element out (wrote 1,020 elements past it).
        whole, out = fenced_array(4, np.float32)
        with pytest.raises(cxlrt.InvalidArgumentError, match=r"all_reduce: out holds 16 bytes"):
            comm.all_reduce(x, out=out)
        assert untouched(whole, 16) and (out.view(np.uint8) == CANARY).all()
        # float64 x into a float32 out of as many elements.
        whole, out = fenced_array(1024, np.float32)
        with pytest.raises(cxlrt.InvalidArgumentError, match="float32.*float64|float64.*float32"):
            comm.all_reduce(np.ones(1024, np.float64), out=out)
        assert (whole == CANARY).all()
        # Broadcast into a short out.
        whole, out = fenced_array(2, np.float32)
        with pytest.raises(cxlrt.InvalidArgumentError, match="broadcast: out holds 8 bytes"):
            comm.broadcast(np.ones(512, np.float32), out=out)
        assert (whole == CANARY).all()
        # reduce_scatter with a short x: it sent bytes beyond x.
        backing = np.full(64, 7, np.float32)
        short = backing[:2]
        whole, out = fenced_array(4, np.float32)
        with pytest.raises(cxlrt.InvalidArgumentError, match="reduce_scatter: x holds 8 bytes"):
            comm.reduce_scatter(short, out)
        assert (whole == CANARY).all()


def test_every_call_refuses_a_wrong_out_size_or_type(uri):
    with cxlrt.Host(uri) as host, host.communicator("every", 1, 0) as comm:
        x = np.arange(16, dtype=np.int32)
        calls = {
            "all_reduce": lambda o: comm.all_reduce(x, out=o),
            "reduce_scatter": lambda o: comm.reduce_scatter(x, o),
            "all_gather": lambda o: comm.all_gather(x, o),
            "broadcast": lambda o: comm.broadcast(x, out=o),
            "reduce": lambda o: comm.reduce(x, out=o),
            "gather": lambda o: comm.gather(x, o),
            "scatter": lambda o: comm.scatter(x, o),
            "all_to_all": lambda o: comm.all_to_all(x, o),
        }
        for name, call in calls.items():
            for count, dtype in ((15, np.int32), (17, np.int32), (16, np.float32),
                                 (8, np.int64), (64, np.uint8)):
                whole, out = fenced_array(count, dtype)
                with pytest.raises(cxlrt.InvalidArgumentError, match=name) as e:
                    call(out)
                assert (whole == CANARY).all(), (name, count, dtype, str(e.value))
            good = np.zeros(16, np.int32)
            call(good)
            np.testing.assert_array_equal(good, x, err_msg=name)
        # Send and recv (to itself: refused by the runtime too, but the
        # buffer check comes first and names the buffer).
        with pytest.raises(cxlrt.InvalidArgumentError, match="recv: x holds 8 bytes"):
            comm._c.recv(np.zeros(2, np.int32), 16, "int32", 0, 0)
        with pytest.raises(cxlrt.InvalidArgumentError, match="send: x holds 8 bytes"):
            comm._c.send(np.zeros(2, np.int32), 16, "int32", 0, 0)
        # A count whose byte size overflows is refused, not wrapped.
        with pytest.raises(cxlrt.InvalidArgumentError, match="all_gather"):
            comm._c.all_gather(x, np.zeros(16, np.int32), (1 << 62) + 4, "int32", 0)


def test_kv_calls_never_write_past_an_out(uri):
    with cxlrt.Host(uri) as host:
        store = host.store(create=True)
        store.put("ns", "k", np.arange(64, dtype=np.uint8))
        whole, out = fenced(63)
        with pytest.raises(cxlrt.InvalidArgumentError):
            store.get_into("ns", "k", out)
        res = store.batch_get_into("ns", ["k", "k"], [out, bytearray(64)])
        assert isinstance(res[0], cxlrt.InvalidArgumentError) and res[1] == 64
        assert (whole == CANARY).all()
        whole, out = fenced(100)
        assert store.get_into("ns", "k", out) == 64
        assert out[:64].tobytes() == bytes(range(64)) and (whole[PAD + 64:] == CANARY).all()
        with pytest.raises(cxlrt.InvalidArgumentError, match="read-only"):
            store.get_into("ns", "k", b"\0" * 64)
        store.close()


def _root_only(rank, n, uri):
    """Buffers a call does not use on this rank are not checked: gather's
    and reduce's out off the root, scatter's and broadcast's x off the
    root."""
    with cxlrt.Host(uri) as host, host.communicator("roots", n, rank, timeout=30) as comm:
        unused = np.empty(0, np.int32)
        x = np.full(4, rank + 1, np.int32)
        out = np.zeros(n * 4, np.int32) if rank == 0 else unused
        comm.gather(x, out, root=0)
        if rank == 0:
            np.testing.assert_array_equal(out, np.repeat(np.arange(1, n + 1), 4))
        red = np.zeros(4, np.int32) if rank == 0 else unused
        comm.reduce(x, root=0, out=red)
        if rank == 0:
            assert (red == n * (n + 1) // 2).all()
        src = np.arange(n * 4, dtype=np.int32) if rank == 0 else unused
        got = np.zeros(4, np.int32)
        comm.scatter(src, got, root=0)
        np.testing.assert_array_equal(got, np.arange(4 * rank, 4 * rank + 4))
        b = np.zeros(4, np.int32)
        comm.broadcast(np.full(4, 9, np.int32) if rank == 0 else unused, root=0, out=b)
        assert (b == 9).all()


def test_buffers_a_rank_does_not_use_are_not_checked(uri):
    run_ranks(2, _root_only, uri)


def _overlaps(rank, n, uri):
    """x and out that overlap other than as NCCL allows are refused (the
    calls read bytes they had written: wrong results with OK); the same
    buffer, x as this rank's part of out and out as its part of x work."""
    with cxlrt.Host(uri) as host, host.communicator("overlaps", n, rank, timeout=30) as comm:
        N = 64
        buf = np.arange(N * n + 8, dtype=np.float32)
        calls = {
            "all_reduce": lambda: comm.all_reduce(buf[0:N], out=buf[1:N + 1]),
            "all_gather": lambda: comm.all_gather(buf[3:3 + N], buf[0:N * n]),
            "reduce_scatter": lambda: comm.reduce_scatter(buf[0:N * n], buf[2:2 + N]),
            "all_to_all": lambda: comm.all_to_all(buf[0:N * n], buf[4:4 + N * n]),
        }
        for name, call in calls.items():
            before = buf.copy()
            with pytest.raises(cxlrt.InvalidArgumentError, match=f"{name}: x .* and out .* overlap"):
                call()
            assert (buf == before).all(), name
        out = np.zeros(N * n, np.float32)
        out[rank * N:(rank + 1) * N] = rank + 1
        comm.all_gather(out[rank * N:(rank + 1) * N], out)
        np.testing.assert_array_equal(out, np.repeat(np.arange(1, n + 1), N))
        x = np.arange(N * n, dtype=np.float32)
        comm.reduce_scatter(x, x[rank * N:(rank + 1) * N])
        np.testing.assert_array_equal(x[rank * N:(rank + 1) * N],
                                      n * np.arange(rank * N, (rank + 1) * N))
        y = np.full(N, rank + 1, np.float32)
        comm.all_reduce(y, out=y)
        assert (y == n * (n + 1) // 2).all()
        g = np.zeros(N * n, np.float32)
        g[rank * N:(rank + 1) * N] = rank + 1
        comm.gather(g[rank * N:(rank + 1) * N], g if rank == 0 else np.empty(0, np.float32))
        if rank == 0:
            np.testing.assert_array_equal(g, np.repeat(np.arange(1, n + 1), N))
        s = np.arange(N * n, dtype=np.float32)
        comm.scatter(s if rank == 0 else np.empty(0, np.float32), s[rank * N:(rank + 1) * N])
        np.testing.assert_array_equal(s[rank * N:(rank + 1) * N], np.arange(rank * N, (rank + 1) * N))


def test_overlapping_x_and_out_are_refused(uri):
    run_ranks(2, _overlaps, uri)


# --- Defect 2: objects made from a Host keep what they use alive ---

def _host_closed_first(rank, n, uri):
    host = cxlrt.Host(uri)
    comm = host.communicator("orphan", 1, 0)
    store = host.store(create=True)
    buf = host.allocate(4096)
    arr = np.frombuffer(buf, np.uint8)
    host.close()
    assert host._host.closed
    with pytest.raises(cxlrt.FailedPreconditionError, match="host is closed"):
        host.allocate(64)
    # Everything made from it still works: it holds the allocator.
    x = np.arange(100, dtype=np.float32)
    comm.all_reduce(x)
    store.put("ns", "k", b"value")
    assert store.get("ns", "k") == b"value"
    arr[:] = 3
    assert bytes(memoryview(buf)[:2]) == b"\x03\x03"
    # The reproduction: the communicator collected after host.close().
    del comm
    gc.collect()
    del host
    gc.collect()
    store.close()
    del arr
    buf.free()


def _children_collected_in_any_order(rank, n, uri):
    for order in ("buf-store-comm", "comm-buf-store", "store-comm-buf"):
        host = cxlrt.Host(uri)
        objs = {"comm": host.communicator(f"o-{order}", 1, 0), "store": host.store(create=True),
                "buf": np.frombuffer(host.allocate(1 << 20), np.uint8)}
        del host  # the wrapper goes first
        gc.collect()
        for name in order.split("-"):
            if name == "comm":
                objs["comm"].all_reduce(np.ones(8, np.int64))
            elif name == "store":
                objs["store"].put("ns", f"{order}", b"x")
            else:
                objs["buf"][:] = 1
            del objs[name]
            gc.collect()


def test_objects_made_from_a_host_outlive_its_close(uri):
    run_ranks(1, _host_closed_first, uri)
    run_ranks(1, _children_collected_in_any_order, uri)
    # Every host detached once its last object went: a new one attaches and
    # the pool's metadata is sound.
    pool = cxlrt.Pool.open(uri)
    assert pool.check() == []


# --- Defect 3: close while another thread is inside a call ---

def _hammer(fn, errors, stop):
    """Calls fn until it raises FailedPreconditionError (closed) or stop."""
    try:
        while not stop.is_set():
            fn()
    except cxlrt.FailedPreconditionError as e:
        errors.append(e)
    except BaseException as e:  # anything else fails the test
        errors.append(e)


def _close_under_calls(rank, n, uri):
    host = cxlrt.Host(uri)
    store = host.store(create=True)
    value = np.ones(8 << 20, np.uint8)
    store.put("ns", "big", value)
    out = np.empty_like(value)
    errors, stop = [], threading.Event()
    threads = [threading.Thread(target=_hammer,
                                args=(lambda: store.get_into("ns", "big", out), errors, stop))
               for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    store.close()  # waits for the calls in flight; later ones raise
    for t in threads:
        t.join(30)
    stop.set()
    assert len(errors) == 2 and all(isinstance(e, cxlrt.FailedPreconditionError)
                                    for e in errors), errors

    comm = host.communicator("busy", 1, 0)
    x = np.ones(4 << 20, np.float32)
    errors, stop = [], threading.Event()
    t = threading.Thread(target=_hammer, args=(lambda: comm.all_reduce(x), errors, stop))
    t.start()
    time.sleep(0.2)
    comm.destroy()
    t.join(30)
    stop.set()
    assert len(errors) == 1 and isinstance(errors[0], cxlrt.FailedPreconditionError), errors

    # Host.close() under allocations in flight: they finish or raise.
    errors, stop = [], threading.Event()

    def alloc():
        host.allocate(1 << 20).free()

    t = threading.Thread(target=_hammer, args=(alloc, errors, stop))
    t.start()
    time.sleep(0.1)
    host.close()
    t.join(30)
    stop.set()
    assert len(errors) == 1 and isinstance(errors[0], cxlrt.FailedPreconditionError), errors


def test_close_while_another_thread_is_inside_a_call(uri):
    run_ranks(1, _close_under_calls, uri)


def _abort_under_calls(rank, n, uri):
    with cxlrt.Host(uri) as host:
        comm = host.communicator("aborted", 1, 0)
        x = np.ones(4 << 20, np.float32)
        errors, stop = [], threading.Event()
        t = threading.Thread(target=_hammer, args=(lambda: comm.all_reduce(x), errors, stop))
        t.start()
        time.sleep(0.2)
        comm.abort("test")  # after the call in flight; the next one raises
        t.join(30)
        stop.set()
        # The next call names the abort and its reason.
        assert len(errors) == 1 and isinstance(errors[0], cxlrt.FailedPreconditionError), errors
        assert "aborted" in str(errors[0]) and "test" in str(errors[0]), errors[0]
        comm.destroy()


def test_abort_from_another_thread_waits_for_the_call_in_flight(uri):
    # The C++ communicator is used by one thread at a time: abort() from
    # another thread once raced the call's own failure state (review).
    run_ranks(1, _abort_under_calls, uri)


# --- Defect 4: buffer exports held for the length of the call ---

def _resize_during_calls(rank, n, uri):
    with cxlrt.Host(uri) as host:
        store = host.store(create=True)
        size = 16 << 20
        store.put("ns", "v", np.full(size, 5, np.uint8))
        refused = {"put": 0, "get_into": 0}
        for call in ("get_into", "put"):
            buf = bytearray(size) if call == "get_into" else bytearray(b"\x07" * size)
            busy, done = threading.Event(), threading.Event()

            def resize():
                while not done.is_set():
                    if busy.is_set():
                        try:
                            buf.append(0)  # may move the bytes: refused while exported
                            buf.pop()
                        except BufferError:
                            refused[call] += 1
                    time.sleep(0)

            t = threading.Thread(target=resize)
            t.start()
            for i in range(20):
                busy.set()
                if call == "get_into":
                    assert store.get_into("ns", "v", buf) == size
                else:
                    store.put("ns", f"p{i}", buf)
                busy.clear()
                if call == "put":
                    store.delete("ns", f"p{i}")
            done.set()
            t.join()
            if call == "get_into":
                assert buf[:size] == b"\x05" * size
        assert refused["put"] > 0 and refused["get_into"] > 0, refused
        store.close()


def test_a_buffer_cannot_be_resized_during_a_call(uri):
    run_ranks(1, _resize_during_calls, uri)


def test_a_pool_buffer_with_live_views_is_not_freed(uri):
    with cxlrt.Host(uri) as host:
        buf = host.allocate(4096)
        view = memoryview(buf)
        arr = np.frombuffer(buf, np.uint32)
        with pytest.raises(cxlrt.FailedPreconditionError, match="2 views"):
            buf.free()
        arr[:] = 1
        del arr
        with pytest.raises(cxlrt.FailedPreconditionError, match="1 view"):
            buf.free()
        view.release()
        buf.free()
        assert buf.freed and memoryview(buf).nbytes == 0
        # A buffer nobody holds returns its block: allocations that would
        # exhaust the pool if they leaked all succeed.
        for _ in range(64):
            a = host.array(4 << 20, "uint8")
            a[-1] = 1
        del a


# --- DLPack: read-only producers are never written ---

def test_read_only_dlpack_arrays_are_never_written(uri):
    frozen = np.arange(16, dtype=np.float32)
    frozen.flags.writeable = False
    before = frozen.copy()
    with cxlrt.Host(uri) as host, host.communicator("ro", 1, 0) as comm:
        store = host.store(create=True)
        store.put("d", "k", np.full(64, 9, np.uint8))
        for arr in (Producer(frozen), Producer(frozen, versioned=False)):
            with pytest.raises(cxlrt.InvalidArgumentError, match="read-only"):
                comm.all_reduce(arr)  # in place: x is written
            with pytest.raises(cxlrt.InvalidArgumentError, match="read-only"):
                comm.broadcast(np.ones(16, np.float32), out=arr)
            with pytest.raises(cxlrt.InvalidArgumentError, match="read-only"):
                store.get_into("d", "k", arr)
            with pytest.raises(cxlrt.InvalidArgumentError, match="read-only"):
                store.batch_get_into("d", ["k"], [arr])
            np.testing.assert_array_equal(frozen, before)
            # Read-only arrays are fine as inputs.
            out = np.zeros(16, np.float32)
            comm.all_reduce(arr, out=out)
            np.testing.assert_array_equal(out, before)
        # numpy's own __dlpack__ of a read-only array: refused by numpy (old
        # numpy) or flagged read-only (DLPack 1.0); never written.
        with pytest.raises((cxlrt.InvalidArgumentError, BufferError)):
            store.get_into("d", "k", DlpackOf(frozen))
        np.testing.assert_array_equal(frozen, before)
        # A writable array through DLPack 1.0 is written.
        w = np.zeros(16, np.float32)
        comm.broadcast(np.full(16, 4, np.float32), out=Producer(w))
        assert (w == 4).all()
        assert store.get_into("d", "k", Producer(np.zeros(64, np.uint8))) == 64
        store.close()


class DlpackOf:
    """numpy's own __dlpack__, nothing else."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, **kw):
        return self.arr.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_a_dlpack_capsule_is_consumed_by_its_view():
    # DLPack's protocol: the consumer renames the capsule and calls the
    # producer's deleter when done. A view that left it unconsumed let a
    # second consumer take it and free the memory under cxlrt's view
    # (SIGSEGV; review of issue 25).
    import gc
    import weakref
    from cxlrt import _cxlrt

    arr = np.full(1 << 20, 7, np.uint8)
    alive = weakref.ref(arr)
    cap = arr.__dlpack__()
    view, dtype, count = _cxlrt.dlpack_view(cap, False)
    assert (dtype, count) == ("uint8", 1 << 20)
    with pytest.raises(cxlrt.InvalidArgumentError, match="unconsumed"):
        _cxlrt.dlpack_view(cap, False)  # taken: no second consumer
    del arr, cap
    gc.collect()
    assert alive() is not None  # the view holds the producer's memory
    assert (np.frombuffer(memoryview(view), np.uint8) == 7).all()
    del view
    gc.collect()
    assert alive() is None  # and its deleter ran when the view went


# --- Property test: shapes, types, strides and wrong outs for every call ---

DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64"]
CALLS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "gather",
         "scatter", "all_to_all", "send", "recv"]
PROPERTY = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def solo():
    """One pool, host, single-rank communicator and store for the property
    tests (hypothesis runs many examples per test)."""
    u = f"emu://pytest-prop-{os.getpid()}-{uuid.uuid4().hex[:8]}?size=128M"
    pool = cxlrt.Pool.create(u)
    host = cxlrt.Host(pool)
    comm = host.communicator("prop", 1, 0)
    store = host.store(create=True)
    yield comm, store
    store.close()
    comm.destroy()
    host.close()
    del pool
    cxlrt.Pool.destroy(u, force=True)


@st.composite
def arrays(draw):
    """(array, contiguous): a numpy array of a drawn type and shape, every
    step-th element of a larger one along its last axis."""
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(st.lists(st.integers(0, 5), min_size=1, max_size=3))
    step = draw(st.sampled_from([1, 1, 2]))
    full = shape[:-1] + [shape[-1] * step]
    base = (np.arange(int(np.prod(full)), dtype=np.int64) % 100 + 1).astype(dtype).reshape(full)
    x = base[..., ::step]
    return x


def fenced_out(count, dtype, step):
    """(whole, out): out has `count` elements of `dtype`, every step-th of
    a canary-fenced buffer."""
    dt = np.dtype(dtype)
    whole, inner = fenced(count * step * dt.itemsize)
    return whole, inner.view(dt)[::step]


@PROPERTY
@given(x=arrays(), call=st.sampled_from(CALLS), delta=st.sampled_from([0, 0, 0, -1, 1, 3]),
       out_dtype=st.sampled_from([None, None, None] + DTYPES), out_step=st.sampled_from([1, 1, 2]))
def test_collectives_return_the_right_bytes_or_refuse(solo, x, call, delta, out_dtype, out_step):
    comm, _ = solo
    count = max(x.size + delta, 0)
    dtype = x.dtype if out_dtype is None else np.dtype(out_dtype)
    whole, out = fenced_out(count, dtype, out_step)
    before = whole.copy()
    x_before = x.copy()
    fits = (x.flags.c_contiguous and out.flags.c_contiguous and dtype == x.dtype
            and out.size == x.size)
    try:
        if call == "send":
            comm.send(x, 0)  # to itself: always refused
        elif call == "recv":
            comm.recv(out, 0)
        elif call in ("all_reduce", "broadcast", "reduce"):
            getattr(comm, call)(x, out=out)
        else:
            getattr(comm, call)(x, out)
    except cxlrt.InvalidArgumentError:
        assert np.array_equal(whole, before), "a refused call wrote"
        assert not fits or x.size == 0 or call in ("send", "recv"), "a fitting call was refused"
    else:
        assert fits and call not in ("send", "recv"), "a call that does not fit ran"
        assert untouched(whole, whole.size - 2 * PAD), "a call wrote outside its out"
        np.testing.assert_array_equal(out.reshape(-1), x.reshape(-1))
    np.testing.assert_array_equal(x, x_before)


_keys = iter(range(1 << 30))


@PROPERTY
@given(x=arrays(), delta=st.sampled_from([0, 0, -1, 1, 7]), out_step=st.sampled_from([1, 1, 2]))
def test_put_and_get_into_return_the_right_bytes_or_refuse(solo, x, delta, out_step):
    _, store = solo
    key = f"k{next(_keys)}"
    try:
        store.put("prop", key, x)
    except cxlrt.InvalidArgumentError:
        assert not x.flags.c_contiguous or x.nbytes == 0
        return
    assert x.flags.c_contiguous and x.nbytes > 0
    count = max(x.nbytes + delta, 0)
    whole, out = fenced_out(count, np.uint8, out_step)
    before = whole.copy()
    try:
        n = store.get_into("prop", key, out)
    except cxlrt.InvalidArgumentError:
        assert np.array_equal(whole, before)
        assert count < x.nbytes or not out.flags.c_contiguous
    else:
        assert n == x.nbytes and count >= n and out.flags.c_contiguous
        assert out[:n].tobytes() == x.tobytes()
        assert np.array_equal(whole[PAD + n:], before[PAD + n:]), "wrote past the value"
        assert untouched(whole, count)
    store.delete("prop", key)
