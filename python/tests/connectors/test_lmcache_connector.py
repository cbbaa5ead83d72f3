"""The cxlrt LMCache connector, created by LMCache's own native_plugin L2
adapter factory and driven through LMCache's NativeConnectorL2Adapter
(store, lookup, load, delete tasks, its event fds and demux thread), with
LMCache's ObjectKey. Memory objects are stand-ins exposing `byte_array`,
the one attribute the adapter reads of them (LMCache's own TensorMemoryObj
needs its L1 allocator). Then through LMCache's StorageManager (its L1,
store and prefetch controllers) with its own L2 metric subscribers, whose
figures must equal the workload. Needs lmcache and OpenTelemetry (the
project's .venv)."""

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


class Counted:
    """LMCache's own L2 key events (what its observability subscribers and
    eviction listeners consume), counted from its event bus."""

    def __init__(self):
        from lmcache.v1.mp_observability.event import EventType
        from lmcache.v1.mp_observability.event_bus import EventBusConfig, init_event_bus
        self.stored, self.accessed, self.deleted = [], [], []
        self.bus = init_event_bus(EventBusConfig(enabled=True))
        self.bus.subscribe(EventType.L2_KEYS_STORED,
                           lambda e: self.stored.extend(zip(e.metadata["keys"],
                                                            e.metadata["sizes"])))
        self.bus.subscribe(EventType.L2_KEYS_ACCESSED,
                           lambda e: self.accessed.extend(e.metadata["keys"]))
        self.bus.subscribe(EventType.L2_KEYS_DELETED,
                           lambda e: self.deleted.extend(e.metadata["keys"]))
        self.bus.start()

    def close(self):
        from lmcache.v1.mp_observability.event_bus import EventBusConfig, init_event_bus
        self.bus.stop()  # flushes what is queued
        init_event_bus(EventBusConfig(enabled=False))


def store(a, ks, objs):
    t = a.submit_store_task(ks, objs)
    deadline = time.time() + 20
    done = {}
    while t not in done and time.time() < deadline:
        select.select([a.get_store_event_fd()], [], [], 0.2)
        done.update(a.pop_completed_store_tasks())
    return done[t]


def test_lmcaches_counters_match_what_was_stored_hit_and_deleted(uri):
    size = 65536
    counted = Counted()
    a = adapter(uri)
    try:
        ks = keys(6)
        # N = 5 chunks put, in two batches; the second repeats one of the first.
        r1 = store(a, ks[:3], [Obj(bytearray([i]) * size) for i in range(3)])
        r2 = store(a, ks[2:5], [Obj(bytearray([i]) * size) for i in range(2, 5)])
        assert r1.is_successful() and r1.bytes_transferred() == 3 * size
        assert r2.is_successful() and r2.bytes_transferred() == 2 * size  # the repeat: 0
        assert a.get_usage().total_bytes_used == 5 * size
        # M = 4 hits of 6 looked up, then loaded.
        look = [ks[0], ks[1], ks[3], ks[4], ks[5], keys(1, salt="other")[0]]
        t = a.submit_lookup_and_lock_task(look, {})
        bitmap = wait(a.get_lookup_and_lock_event_fd(), a.query_lookup_and_lock_result, t)
        assert [bitmap.test(i) for i in range(6)] == [True] * 4 + [False] * 2
        outs = [Obj(bytearray(size)) for _ in look]
        t = a.submit_load_task(look, outs)
        bitmap = wait(a.get_load_event_fd(), a.query_load_result, t)
        assert sum(bitmap.test(i) for i in range(6)) == 4
        a.submit_unlock(look[:4])
        a.delete(ks[:1])
        assert a.get_usage().total_bytes_used == 4 * size
        a.close()
        a = None
        counted.close()
        assert sum(n for _, n in counted.stored) == 5 * size
        assert sorted(k.chunk_hash[0] for k, n in counted.stored if n) == [0, 1, 2, 3, 4]
        assert sorted(k.chunk_hash[0] for k in counted.accessed) == [0, 1, 3, 4]
        assert [k.chunk_hash[0] for k in counted.deleted] == [0]
    finally:
        if a is not None:
            a.close()
        counted.close()


def test_a_store_batch_that_fails_stores_nothing_and_counts_nothing():
    u = f"emu://lmcache-small-{os.getpid()}-{uuid.uuid4().hex[:6]}?size=64M"
    pool = cxlrt.Pool.create(u)
    a = adapter(pool.uri)
    try:
        ks = keys(2)
        # The second chunk cannot fit the 64 MiB pool: the batch fails whole.
        r = store(a, ks, [Obj(bytearray(65536)), Obj(bytearray(64 << 20))])
        assert not r.is_successful() and r.bytes_transferred() == 0
        assert a.get_usage().total_bytes_used == 0
        t = a.submit_lookup_and_lock_task(ks, {})
        bitmap = wait(a.get_lookup_and_lock_event_fd(), a.query_lookup_and_lock_result, t)
        assert not bitmap.test(0) and not bitmap.test(1)  # the first was taken back
    finally:
        a.close()
        del pool
        cxlrt.Pool.destroy(u, force=True)


# --- LMCache's own L2 metrics, through its storage manager ---------------


def _otel_reader():
    """An in-memory reader on OTel's global meter provider, which LMCache's
    metric subscribers take their meters from (set once per process)."""
    global _READER
    if _READER is None:
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        _READER = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[_READER]))
    return _READER


_READER = None


def _points(reader):
    """{metric name: [(attributes, data point)]} of everything recorded."""
    out = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(
                    (dict(p.attributes or {}), p) for p in m.data.data_points)
    return out


def _total(points, name):
    return sum(p.value for _, p in points.get(name, []))


def test_lmcaches_l2_metrics_match_the_workload_through_its_storage_manager(uri):
    """LMCache's storage manager (L1 in host memory, the cxlrt connector as
    its L2 through the native_plugin adapter), its store and prefetch
    controllers and its own L2 metric subscribers (lmcache_mp.l2_*, as its
    server registers them) on OTel: N chunks stored, M of them hit and
    loaded back, exact bytes, a load of the wrong size failed, and
    LMCache's figures say so."""
    import torch
    from lmcache.v1.distributed.api import (GroupedObjectKeys, MemoryLayoutDesc,
                                            PrefetchTaskSpec)
    from lmcache.v1.distributed.config import (EvictionConfig, L1ManagerConfig,
                                               L1MemoryManagerConfig, L2AdaptersConfig,
                                               StorageManagerConfig)
    from lmcache.v1.distributed.storage_manager import StorageManager
    from lmcache.v1.mp_observability.event_bus import EventBusConfig, init_event_bus
    from lmcache.v1.mp_observability.subscribers.metrics.l2 import L2MetricsSubscriber
    from lmcache.v1.mp_observability.subscribers.metrics.l2_failures import (
        L2FailureMetricsSubscriber)
    from lmcache.v1.mp_observability.subscribers.metrics.l2_throughput import (
        L2ThroughputSubscriber)

    reader = _otel_reader()
    before = _points(reader)
    bus = init_event_bus(EventBusConfig(enabled=True))
    for sub in (L2MetricsSubscriber(), L2ThroughputSubscriber(), L2FailureMetricsSubscriber()):
        bus.register_subscriber(sub)
    bus.start()
    l2 = NativePluginL2AdapterConfig.from_dict({
        "type": "native_plugin", "module_path": "cxlrt.connectors.lmcache",
        "class_name": "CxlrtL2Connector", "adapter_params": {"pool": uri}})
    sm = StorageManager(StorageManagerConfig(
        l1_manager_config=L1ManagerConfig(memory_config=L1MemoryManagerConfig(
            size_in_bytes=32 << 20, use_lazy=False, shm_name="")),
        eviction_config=EvictionConfig(eviction_policy="LRU"),
        l2_adapter_config=L2AdaptersConfig([l2])))
    try:
        n, m, elems = 5, 3, 16384  # chunks of 64 KiB (float32)
        size = elems * 4
        layout = MemoryLayoutDesc(shapes=[torch.Size([elems])], dtypes=[torch.float32])
        ks = keys(n)
        objs = sm.reserve_write(ks, layout)
        assert len(objs) == n
        for i, k in enumerate(ks):
            objs[k].tensor.fill_(float(i + 1))
        sm.finish_write(ks)  # the store controller puts them into L2
        deadline = time.time() + 20
        while sum(u for u, _ in sm.get_l2_usages()) < n * size and time.time() < deadline:
            time.sleep(0.02)
        assert sm.get_l2_usages() == [(n * size, {"l2_name": "native_plugin"})]
        assert sm.delete_l1_keys(ks) == (n, 0)
        # A request for the first M chunks, then one never stored, then one
        # stored: prefix fetching loads the M and stops at the miss.
        absent = ObjectKey(chunk_hash=b"\xee" * 32, model_name="org/model", kv_rank=0)
        want = ks[:m] + [absent, ks[m]]
        h = sm.submit_prefetch_task(PrefetchTaskSpec(
            key_groups=[GroupedObjectKeys(keys=want, object_group_id=0, layout_desc=layout)]))
        assert sm.wait_prefetch_status(h, 20)
        r = sm.query_prefetch_status(h)
        assert r.l2_hit_count == m and r.l1_hit_count == 0
        with sm.read_prefetched_results(ks[:m], r.l1_owners) as got:
            assert got is not None
            for i, o in enumerate(got):
                assert torch.equal(o.tensor, torch.full((elems,), float(i + 1)))
        sm.finish_read_prefetched(ks[:m], l1_owners=r.l1_owners)
        # A server of another chunk size asks for one: found, but its load
        # is a miss (never wrong bytes), and LMCache counts it as failed.
        half = MemoryLayoutDesc(shapes=[torch.Size([elems // 2])], dtypes=[torch.float32])
        h = sm.submit_prefetch_task(PrefetchTaskSpec(
            key_groups=[GroupedObjectKeys(keys=[ks[m + 1]], object_group_id=0, layout_desc=half)]))
        assert sm.wait_prefetch_status(h, 20)
        assert sm.query_prefetch_status(h).l2_hit_count == 0
    finally:
        sm.close()
        bus.stop()  # flushes what is queued into the subscribers
        init_event_bus(EventBusConfig(enabled=False))
    after = _points(reader)

    def delta(name):
        return _total(after, name) - _total(before, name)

    assert delta("lmcache_mp.l2_store_submitted_objects") == n
    assert delta("lmcache_mp.l2_store_completed_objects") == n
    # LMCache's store controller batches the chunks into its own tasks.
    tasks = delta("lmcache_mp.l2_store_completed")
    assert tasks >= 1 and tasks == delta("lmcache_mp.l2_store_submitted")
    assert {tuple(a.items()) for a, _ in after["lmcache_mp.l2_store_completed"]} == {
        (("l2_name", "native_plugin"),)}
    assert delta("lmcache_mp.l2_prefetch_lookup_objects") == len(want) + 1
    assert delta("lmcache_mp.l2_prefetch_load_submitted_objects") == m + 1
    assert delta("lmcache_mp.l2_prefetch_load_completed") == m  # the wrong size: not loaded
    assert delta("lmcache_mp.l2_load_completed") == 2  # load tasks: one per prefetch
    assert [(a, p.value) for a, p in after["lmcache_mp.l2_prefetch_failure"]] == [
        ({"reason": "not_found", "model_name": "org/model"}, 1)]
    # One throughput sample per store task and per load task.
    for name, count in (("lmcache_mp.l2_store_throughput", tasks),
                        ("lmcache_mp.l2_load_throughput", 2)):
        [(attrs, p)] = after[name]
        assert attrs == {"l2_name": "native_plugin"} and p.count == count and p.sum > 0
