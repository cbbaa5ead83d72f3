"""The cxlrt HiCache storage backend, created by SGLang's own backend
factory (the "dynamic" backend) and checked through SGLang's HiCacheStorage
interface: tensor get/set, batch calls, prefix exists, zero-copy
batch_set_v1 / batch_get_v1 between host-pool pages and the pool, and a
handoff between two processes. The host KV pool is a stand-in that hands
out page addresses the way SGLang's page_first pools do
(get_page_buffer_meta): SGLang's own pools need its model stack
(transformers) to import. Needs torch and sglang (the project's .venv)."""

import itertools
import multiprocessing as mp
import functools
import os
import uuid

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorage, HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

import cxlrt
from cxlrt.connectors.sglang import CxlrtHiCacheStorage


def config(uri, tp_rank=0, tp_size=1, mla=False, dcp_rank=0, dcp_size=1, page=None, **extra):
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
        is_page_first_layout=True, model_name="org/test-model",
        dcp_rank=dcp_rank, dcp_size=dcp_size, logical_page_size=page,
        extra_config={"backend_name": "cxlrt", "module_path": "cxlrt.connectors.sglang",
                      "class_name": "CxlrtHiCacheStorage", "interface_v1": 1, "pool": uri,
                      **extra})


def make(uri, **kw):
    return StorageBackendFactory.create_backend("dynamic", config(uri, **kw), None)


class PageFirstHostPool:
    """SGLang's page_first host pool, as its storage backends see it: page p
    of `page_size` tokens is one contiguous row; get_page_buffer_meta gives
    one (address, bytes) per page of the indices (token slots)."""

    def __init__(self, pages, page_size, page_bytes):
        self.page_size = page_size
        self.kv_buffer = torch.zeros(pages, page_bytes, dtype=torch.uint8)

    def get_page_buffer_meta(self, indices):
        rows = (indices[:: self.page_size] // self.page_size).tolist()
        ptrs = [self.kv_buffer[r].data_ptr() for r in rows]
        return ptrs, [self.kv_buffer.shape[1]] * len(ptrs)


class SplitKVHostPool(PageFirstHostPool):
    """An MHA host pool: a k and a v buffer per page, listed k, v page by
    page, as SGLang's MHA pools give them."""

    def __init__(self, pages, page_size, page_bytes):
        self.page_size = page_size
        self.kv_buffer = torch.zeros(2, pages, page_bytes, dtype=torch.uint8)

    def get_page_buffer_meta(self, indices):
        rows = (indices[:: self.page_size] // self.page_size).tolist()
        ptrs = [self.kv_buffer[kv, r].data_ptr() for r in rows for kv in (0, 1)]
        return ptrs, [self.kv_buffer.shape[2]] * len(ptrs)


@pytest.fixture
def uri():
    u = f"emu://sglang-{os.getpid()}-{uuid.uuid4().hex[:6]}?size=512M"
    pool = cxlrt.Pool.create(u)
    yield pool.uri
    del pool
    cxlrt.Pool.destroy(u, force=True)


def test_the_factory_makes_it_through_sglangs_dynamic_backend(uri):
    b = make(uri)
    assert isinstance(b, CxlrtHiCacheStorage) and isinstance(b, HiCacheStorage)
    assert b.ns == "sglang/org-test-model/tp0of1"


def test_tensors_batches_and_prefix_exists(uri):
    b = make(uri)
    pages = [torch.full((4, 32), i, dtype=torch.bfloat16) for i in range(6)]
    keys = [f"h{i}" for i in range(6)]
    assert b.set(keys[0], pages[0]) and b.set(keys[0], pages[0])  # write-once: still True
    assert b.batch_set(keys[1:4], pages[1:4])
    assert b.exists("h2") and not b.exists("h5")
    assert b.batch_exists(keys) == 4
    out = torch.empty(4, 32, dtype=torch.bfloat16)
    assert b.get("h3", out) is out and torch.equal(out, pages[3])
    got = b.batch_get(keys[:5], [torch.empty(4, 32, dtype=torch.bfloat16) for _ in range(5)])
    assert all(torch.equal(got[i], pages[i]) for i in range(4)) and got[4] is None
    assert b.get("h1", torch.empty(8, dtype=torch.uint8)) is None  # too small: a miss
    assert b.store.stats()["namespaces"][b.ns]["entries"] == 4


def test_zero_copy_pages_round_trip(uri):
    b = make(uri)
    host = PageFirstHostPool(pages=16, page_size=4, page_bytes=8192)
    b.register_mem_pool_host(host)
    for p in range(16):
        host.kv_buffer[p] = p
    keys = [f"z{i}" for i in range(5)]
    idx = torch.arange(4 * 3, 4 * 8)  # pages 3..7
    assert b.batch_set_v1(keys, idx) == [True] * 5
    assert b.batch_set_v1(keys[:2], idx[:8]) == [True, True]  # already there
    assert b.batch_exists(keys + ["z-missing"]) == 5
    host.kv_buffer.zero_()
    back = torch.arange(4 * 10, 4 * 15)  # into pages 10..14
    assert b.batch_get_v1(keys, back) == [True] * 5
    for i in range(5):
        assert (host.kv_buffer[10 + i] == 3 + i).all()
    assert b.batch_get_v1(["z-missing"], torch.arange(4)) == [False]


def _sglang_metrics_module():
    """SGLang's metrics module, sglang.srt.observability.metrics_collector.
    Importing it pulls in SGLang's model configs and with them torchvision,
    which the venv cannot have (no torchvision for its torch yet). Then the
    module is made from the installed file's own source of what storage
    metrics are, StorageMetrics, StorageMetricsCollector and the mixin it
    derives from, and registered under SGLang's name, so that the backend's
    get_stats and the test use that code, unchanged."""
    import sys
    try:
        from sglang.srt.observability import metrics_collector
        return metrics_collector
    except ImportError:
        pass
    import ast
    import importlib.util
    import types
    name = "sglang.srt.observability.metrics_collector"
    path = os.path.join(os.path.dirname(importlib.util.find_spec("sglang").origin), "srt",
                        "observability", "metrics_collector.py")
    tree = ast.parse(open(path).read())
    wanted = {"_StatLoggerDIMixin", "StorageMetrics", "StorageMetricsCollector"}
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in wanted]
    assert {n.name for n in found} == wanted, f"{path} no longer defines {wanted}"
    mod = types.ModuleType(name)
    mod.__file__ = path
    exec("from dataclasses import dataclass, field\nfrom typing import *\n", mod.__dict__)
    exec(compile(ast.Module(body=found, type_ignores=[]), path, "exec"), mod.__dict__)
    sys.modules[name] = mod
    return mod


def collector(tp_rank):
    """SGLang's StorageMetricsCollector (what its radix cache feeds get_stats()
    to), emitting into a registry of the test's own."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    reg = CollectorRegistry()

    class Collector(_sglang_metrics_module().StorageMetricsCollector):
        _counter_cls = functools.partial(Counter, registry=reg)
        _gauge_cls = functools.partial(Gauge, registry=reg)
        _histogram_cls = functools.partial(Histogram, registry=reg)

    labels = {"model_name": "org/test-model", "tp_rank": str(tp_rank)}
    return Collector(labels), lambda name: reg.get_sample_value(f"sglang:{name}", labels)


def test_sglangs_storage_metrics_count_the_pages_of_each_tp_rank(uri):
    page_bytes = 8192
    for tp_rank, n in ((0, 5), (1, 3)):  # each rank its own backend, shard and collector
        b = make(uri, tp_rank=tp_rank, tp_size=2)
        host = PageFirstHostPool(pages=16, page_size=4, page_bytes=page_bytes)
        b.register_mem_pool_host(host)
        c, value = collector(tp_rank)
        keys = [f"m{i}" for i in range(n)]
        assert b.batch_set_v1(keys, torch.arange(0, 4 * n)) == [True] * n
        assert b.batch_set_v1(keys[:2], torch.arange(0, 8)) == [True] * 2  # there: not moved
        got = b.batch_get_v1(keys + ["m-missing"], torch.arange(0, 4 * (n + 1)))
        assert got == [True] * n + [False]  # n hits of n + 1
        assert b.batch_get_v1(["m-missing"], torch.arange(4)) == [False]  # moved nothing
        m = b.get_stats()
        m.prefetch_stats = None  # as SGLang's radix cache adds before logging
        c.log_storage_metrics(m)
        # One batch each way that moved pages; the pages each moved.
        assert value("backup_pgs_count") == 1 and value("backup_pgs_sum") == n
        assert value("prefetch_pgs_count") == 1 and value("prefetch_pgs_sum") == n
        assert value("backup_bandwidth_count") == 1 and value("backup_bandwidth_sum") > 0
        assert value("prefetch_bandwidth_count") == 1 and value("prefetch_bandwidth_sum") > 0
        # get_stats hands each batch once.
        again = b.get_stats()
        assert again.prefetch_pgs == [] and again.backup_pgs == []
    # v0 tensors count too: 2 pages stored (one twice), 1 got.
    b = make(uri)
    page = torch.ones(4, 32, dtype=torch.bfloat16)
    assert b.set("t0", page) and b.set("t0", page) and b.batch_set(["t1"], [page])
    assert b.get("t1", torch.empty(4, 32, dtype=torch.bfloat16)) is not None
    assert b.get("t-missing") is None
    m = b.get_stats()
    assert (m.backup_pgs, m.prefetch_pgs) == ([1, 1], [1])
    assert len(m.backup_bandwidth) == 2 and len(m.prefetch_bandwidth) == 1


def test_a_pages_k_and_v_buffers_are_one_value(uri):
    b = make(uri)
    host = SplitKVHostPool(pages=8, page_size=2, page_bytes=4096)
    b.register_mem_pool_host(host)
    for p in range(8):
        host.kv_buffer[0, p] = p
        host.kv_buffer[1, p] = 50 + p
    keys = ["kv0", "kv1", "kv2"]
    assert b.batch_set_v1(keys, torch.arange(2 * 1, 2 * 4)) == [True] * 3  # pages 1..3
    # One value per page (k then v), sealed whole: exists sees all or nothing.
    assert b.store.get(b.ns, "kv0") == bytes([1]) * 4096 + bytes([51]) * 4096
    assert b.batch_exists(keys) == 3
    host.kv_buffer.zero_()
    assert b.batch_get_v1(keys, torch.arange(2 * 5, 2 * 8)) == [True] * 3  # into pages 5..7
    for i in range(3):
        assert (host.kv_buffer[0, 5 + i] == 1 + i).all()
        assert (host.kv_buffer[1, 5 + i] == 51 + i).all()
    assert not host.kv_buffer[:, :5].any()
    # A host pool of another page size cannot take them: a miss, nothing copied.
    small = SplitKVHostPool(pages=2, page_size=2, page_bytes=1024)
    b.register_mem_pool_host(small)
    assert b.batch_get_v1(["kv0"], torch.arange(2)) == [False]
    assert not small.kv_buffer.any()


def _writer(uri, q):
    b = make(uri, tp_rank=1, tp_size=2)
    host = PageFirstHostPool(pages=4, page_size=2, page_bytes=4096)
    b.register_mem_pool_host(host)
    for p in range(4):
        host.kv_buffer[p] = 100 + p
    q.put(b.batch_set_v1(["p0", "p1", "p2", "p3"], torch.arange(8)))


def test_a_second_server_reads_what_the_first_stored(uri):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    w = ctx.Process(target=_writer, args=(uri, q))
    w.start()
    assert q.get(timeout=60) == [True] * 4
    w.join(30)
    b = make(uri, tp_rank=1, tp_size=2)  # the same shard on another server
    host = PageFirstHostPool(pages=4, page_size=2, page_bytes=4096)
    b.register_mem_pool_host(host)
    assert b.batch_exists(["p0", "p1", "p2", "p3"]) == 4
    assert b.batch_get_v1(["p0", "p1", "p2", "p3"], torch.arange(8)) == [True] * 4
    assert all((host.kv_buffer[p] == 100 + p).all() for p in range(4))
    other = make(uri, tp_rank=0, tp_size=2)  # another shard: nothing of shard 1
    assert other.batch_exists(["p0"]) == 0


def test_each_decode_context_parallel_rank_loads_its_own_slice(uri):
    # An MLA model with decode context parallelism (TP 2, DCP 2): each DCP
    # rank's host pool holds its own slice of every page's tokens, stored
    # under the same page hashes by both ranks.
    keys = ["d0", "d1", "d2"]
    dcp = dict(tp_size=2, mla=True, dcp_size=2, page=8)
    for r in range(2):
        b = make(uri, tp_rank=r, dcp_rank=r, **dcp)
        host = PageFirstHostPool(pages=3, page_size=4, page_bytes=2048)
        b.register_mem_pool_host(host)
        for p in range(3):
            host.kv_buffer[p] = 10 * (r + 1) + p  # rank r's slice of page p
        assert b.batch_set_v1(keys, torch.arange(12)) == [True] * 3
    # The same ranks of another server: each loads its own slice.
    for r in range(2):
        b = make(uri, tp_rank=r, dcp_rank=r, **dcp)
        host = PageFirstHostPool(pages=3, page_size=4, page_bytes=2048)
        b.register_mem_pool_host(host)
        assert b.batch_exists(keys) == 3
        assert b.batch_get_v1(keys, torch.arange(12)) == [True] * 3
        for p in range(3):
            assert (host.kv_buffer[p] == 10 * (r + 1) + p).all(), f"rank {r} page {p}"
    # A server of another logical page size (another slicing) finds nothing.
    other = make(uri, tp_rank=0, dcp_rank=0, **{**dcp, "page": 16})
    assert other.batch_exists(keys) == 0


def test_namespaces_part_what_sglangs_file_backend_keys_apart(uri, tmp_path):
    """Two shards share a namespace exactly when SGLang's own file backend
    gives their pages the same file (its config suffix): MLA and not, TP,
    DCP rank and size, logical page size."""
    shards = []
    for mla, tp_size, dcp_size, page in itertools.product(
            (False, True), (2, 4), (1, 2), (8, 16)):
        if dcp_size > 1 and not mla:  # SGLang: DCP storage needs MLA
            continue
        for tp_rank in range(tp_size):
            shards.append(dict(tp_rank=tp_rank, tp_size=tp_size, mla=mla,
                               dcp_rank=tp_rank % dcp_size, dcp_size=dcp_size, page=page))
    ours = [make(uri, **s).ns for s in shards]
    files = [HiCacheFile(config(uri, file_storage_path=str(tmp_path), **s)).config_suffix
             for s in shards]
    for (a, fa), (b, fb) in itertools.combinations(zip(ours, files), 2):
        assert (a == b) == (fa == fb), (a, fa, b, fb)
