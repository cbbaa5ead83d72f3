"""The cxlrt LMCache connector, created by LMCache's own native_plugin L2
adapter factory and driven through LMCache's NativeConnectorL2Adapter
(store, lookup, load, delete tasks, its event fds and demux thread), with
LMCache's ObjectKey. Memory objects are stand-ins exposing `byte_array`,
the one attribute the adapter reads of them (LMCache's own TensorMemoryObj
needs its L1 allocator). Needs lmcache (the project's .venv)."""

import os
import select
import time
import uuid

import pytest
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters.native_plugin_l2_adapter import (
    NativePluginL2AdapterConfig,
    _create_native_plugin_l2_adapter,
)

import cxlrt


class Obj:
    def __init__(self, data: bytearray):
        self.data = data

    @property
    def byte_array(self):
        return memoryview(self.data)

    def get_size(self):
        return len(self.data)


@pytest.fixture
def uri():
    u = f"emu://lmcache-{os.getpid()}-{uuid.uuid4().hex[:6]}?size=256M"
    pool = cxlrt.Pool.create(u)
    yield pool.uri
    del pool
    cxlrt.Pool.destroy(u, force=True)


def adapter(uri):
    cfg = NativePluginL2AdapterConfig.from_dict({
        "type": "native_plugin", "module_path": "cxlrt.connectors.lmcache",
        "class_name": "CxlrtL2Connector", "adapter_params": {"pool": uri}})
    return _create_native_plugin_l2_adapter(cfg)


def wait(fd, query, task, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        select.select([fd], [], [], 0.2)
        got = query(task)
        if got is not None:
            return got
    raise AssertionError(f"task {task} did not complete")


def keys(n, salt=""):
    return [ObjectKey(chunk_hash=bytes([i]) * 32, model_name="org/model", kv_rank=0,
                      cache_salt=salt) for i in range(n)]


def test_store_lookup_load_and_delete_through_lmcaches_adapter(uri):
    a = adapter(uri)
    try:
        ks = keys(4)
        objs = [Obj(bytearray([i]) * 65536) for i in range(4)]
        t = a.submit_store_task(ks[:3], objs[:3])
        deadline = time.time() + 20
        while t not in (done := a.pop_completed_store_tasks()) and time.time() < deadline:
            select.select([a.get_store_event_fd()], [], [], 0.2)
        assert done[t].is_successful() and done[t].bytes_transferred() == 3 * 65536

        t = a.submit_lookup_and_lock_task(ks, {})
        bitmap = wait(a.get_lookup_and_lock_event_fd(), a.query_lookup_and_lock_result, t)
        assert [bitmap.test(i) for i in range(4)] == [True, True, True, False]
        a.submit_unlock(ks[:3])

        outs = [Obj(bytearray(65536)) for _ in range(4)]
        t = a.submit_load_task(ks, outs)
        bitmap = wait(a.get_load_event_fd(), a.query_load_result, t)
        assert [bitmap.test(i) for i in range(4)] == [True, True, True, False]
        assert all(outs[i].data == objs[i].data for i in range(3))

        # Another user's salt is another key.
        t = a.submit_lookup_and_lock_task(keys(1, salt="tenant-b"), {})
        bitmap = wait(a.get_lookup_and_lock_event_fd(), a.query_lookup_and_lock_result, t)
        assert not bitmap.test(0)

        a.delete(ks[:1])
        t = a.submit_lookup_and_lock_task(ks[:2], {})
        bitmap = wait(a.get_lookup_and_lock_event_fd(), a.query_lookup_and_lock_result, t)
        assert [bitmap.test(i) for i in range(2)] == [False, True]
    finally:
        a.close()


def test_a_wrong_sized_load_is_a_miss_not_wrong_bytes(uri):
    from cxlrt.connectors.lmcache import CxlrtL2Connector

    c = CxlrtL2Connector(pool=uri)
    try:
        f = c.submit_batch_set(["k"], [memoryview(bytearray(b"x" * 100))])
        g = c.submit_batch_get(["k", "missing"], [memoryview(bytearray(10)),
                                                  memoryview(bytearray(100))])
        done = {}
        deadline = time.time() + 20
        while len(done) < 2 and time.time() < deadline:
            select.select([c.event_fd()], [], [], 0.2)
            done.update({d[0]: d for d in c.drain_completions()})
        assert done[f][1] is True
        assert done[g][1] is False and done[g][3] == [False, False]
        # The first failed item (the short buffer) says what was wrong.
        assert done[g][2].startswith("InvalidArgumentError"), done[g][2]
    finally:
        c.close()
