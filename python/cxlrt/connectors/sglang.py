"""SGLang HiCache storage backend over the cxlrt KV store.

Load it with SGLang's dynamic backend:

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "cxlrt",
        "module_path": "cxlrt.connectors.sglang", "class_name": "CxlrtHiCacheStorage",
        "interface_v1": 1, "pool": "dax:///dev/dax0.0"}'

(`interface_v1` is what makes SGLang's cache controller call the zero-copy
v1 calls of a dynamic backend; without it, it moves pages as tensors.)

Pages are stored under SGLang's page hashes, in a namespace per model and,
for non-MLA models, per tensor-parallel shard (each TP rank holds its own
heads), and per decode-context-parallel shard (each DCP rank holds its own
slice of a page's tokens), as SGLang's file backend names them. Values are write-once: a page
another rank or server already stored counts as stored.

- v1 (zero copy, after `register_mem_pool_host`): `batch_get_v1` /
  `batch_set_v1` move each page between the host KV pool and the pool by
  the raw addresses SGLang's `get_page_buffer_meta` gives (one buffer per
  page, or a k and a v buffer), with no staging copy. A page is one value
  under `<hash>`, its buffers its parts: sealed whole, so `exists` never
  reports a page half written.
- v0: `get`/`set`/`batch_get`/`batch_set` of tensors, values under `<hash>`.
- `batch_exists`: the longest prefix present (SGLang's contract).

The pool: `extra_config["pool"]`, else CXLRT_POOL. The store is made when
the pool has none.

Metrics: `get_stats` hands SGLang its StorageMetrics, as its Mooncake and
3FS backends do: per batch, the pages prefetched (got) and backed up (newly
stored; pages already there move nothing) and the GB/s of each, since the
last call. SGLang's StorageMetricsCollector turns them into its
sglang:prefetch_pgs, backup_pgs, prefetch_bandwidth and backup_bandwidth
histograms, per TP rank (each rank has its own backend). The store's own
per-namespace counters are `cxlrt kv stats`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

import cxlrt

logger = logging.getLogger(__name__)


def _namespace(cfg: HiCacheStorageConfig) -> str:
    model = (cfg.model_name or "").replace("/", "-")
    ns = f"sglang/{model}"
    if not cfg.is_mla_model:  # each TP rank stores its own heads
        ns += f"/tp{cfg.tp_rank}of{cfg.tp_size}"
    if cfg.pp_size > 1:
        ns += f"/pp{cfg.pp_rank}of{cfg.pp_size}"
    if getattr(cfg, "attn_cp_size", 1) > 1:
        ns += f"/cp{cfg.attn_cp_rank}of{cfg.attn_cp_size}"
    dcp_size = getattr(cfg, "dcp_size", 1)
    if dcp_size > 1:
        # Decode context parallelism: each DCP rank holds its own slice of
        # every page's tokens, under the same page hashes, so each rank needs
        # its own namespace (else the second rank's write is "already there"
        # and it later loads the first rank's slice). Keyed as SGLang's file
        # backend keys it: the TP size, the DCP rank and size, and the
        # logical page size, which together fix what a slice holds.
        ns += f"/tp{cfg.tp_size}dcp{cfg.dcp_rank}of{dcp_size}page{cfg.logical_page_size}"
    if len(ns) > 200:  # the store's namespace names are bounded
        ns = "sglang/" + hashlib.sha256(ns.encode()).hexdigest()
    return ns


@dataclass
class _Batches:
    """The batches since SGLang last asked, in StorageMetrics' fields."""

    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)


class CxlrtHiCacheStorage(HiCacheStorage):
    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        extra = storage_config.extra_config or {}
        uri = extra.get("pool") or os.environ.get("CXLRT_POOL")
        if not uri:
            raise ValueError("cxlrt HiCache backend: set extra_config['pool'] or CXLRT_POOL")
        self.config = storage_config
        self.ns = _namespace(storage_config)
        self.host = cxlrt.Host(uri, create=True)
        self.store = self.host.store(create=True)
        self.mem_pool_host = None
        # SGLang's prefetch and backup threads record, its scheduler takes.
        self._metrics_lock = threading.Lock()
        self._metrics = _Batches()

    def _record(self, kind: str, pages: int, nbytes: int, seconds: float) -> None:
        """One batch of `kind` ("prefetch" or "backup") that moved `pages`."""
        if pages == 0:
            return
        gbps = nbytes / seconds / (1 << 30) if seconds > 0 else 0.0  # SGLang's GB: 2^30
        with self._metrics_lock:
            getattr(self._metrics, f"{kind}_pgs").append(pages)
            getattr(self._metrics, f"{kind}_bandwidth").append(gbps)

    # --- zero copy (v1) ---

    def register_mem_pool_host(self, mem_pool_host) -> None:
        super().register_mem_pool_host(mem_pool_host)

    def _page_buffers(self, keys: List[str], host_indices: torch.Tensor):
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if not keys or len(ptrs) % len(keys) or len(ptrs) != len(sizes):
            raise ValueError(f"{len(ptrs)} page buffers for {len(keys)} pages")
        return len(ptrs) // len(keys), [int(p) for p in ptrs], [int(s) for s in sizes]

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        if not keys:
            return []
        per, ptrs, sizes = self._page_buffers(keys, host_indices)
        start = time.perf_counter()
        res = self.store._s.batch_put_ptrs(self.ns, [k.encode() for k in keys], ptrs, sizes, per)
        seconds = time.perf_counter() - start
        new = [i for i, r in enumerate(res) if r is None]
        self._record("backup", len(new), sum(sum(sizes[i * per:(i + 1) * per]) for i in new),
                     seconds)
        return [r is None or isinstance(r, cxlrt.AlreadyExistsError) for r in res]

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        if not keys:
            return []
        per, ptrs, sizes = self._page_buffers(keys, host_indices)
        start = time.perf_counter()
        res = self.store._s.batch_get_ptrs(self.ns, [k.encode() for k in keys], ptrs, sizes, per)
        seconds = time.perf_counter() - start
        got = [i for i, r in enumerate(res) if isinstance(r, int)]  # another size: an error
        self._record("prefetch", len(got), sum(sum(sizes[i * per:(i + 1) * per]) for i in got),
                     seconds)
        return [isinstance(r, int) for r in res]

    # --- tensors (v0) ---

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> torch.Tensor | None:
        start = time.perf_counter()
        out = self._get(key, target_location)
        if out is not None:
            self._record("prefetch", 1, out.numel() * out.element_size(),
                         time.perf_counter() - start)
        return out

    def _get(self, key: str, target_location: Optional[Any]) -> torch.Tensor | None:
        try:
            if target_location is None:
                data = self.store.get(self.ns, key)
                return torch.frombuffer(bytearray(data), dtype=torch.uint8)
            out = target_location.contiguous().view(torch.uint8).view(-1)
            n = self.store.get_into(self.ns, key, out)
            if n != out.numel():
                logger.warning("cxlrt: %s holds %d bytes, the target %d", key, n, out.numel())
                return None
            if out.data_ptr() != target_location.data_ptr():
                target_location.view(torch.uint8).view(-1).copy_(out)
            return target_location
        except cxlrt.NotFoundError:
            return None
        except cxlrt.InvalidArgumentError as e:  # the target is too small
            logger.warning("cxlrt: get %s: %s", key, e)
            return None

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[torch.Tensor | None]:
        locs = target_locations or [None] * len(keys)
        start = time.perf_counter()
        out = [self._get(k, t) for k, t in zip(keys, locs)]
        got = [t for t in out if t is not None]
        self._record("prefetch", len(got), sum(t.numel() * t.element_size() for t in got),
                     time.perf_counter() - start)
        return out

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        try:
            data = value.contiguous().view(torch.uint8).view(-1)
            start = time.perf_counter()
            self.store.put(self.ns, key, data)
            self._record("backup", 1, data.numel(), time.perf_counter() - start)
            return True
        except cxlrt.AlreadyExistsError:
            return True  # write-once: the page is there
        except cxlrt.Error as e:
            logger.warning("cxlrt: set %s: %s", key, e)
            return False

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        vals = [v.contiguous().view(torch.uint8).view(-1) for v in values]
        start = time.perf_counter()
        res = self.store.batch_put(self.ns, keys, vals)
        new = [v for v, r in zip(vals, res) if r is None]
        self._record("backup", len(new), sum(v.numel() for v in new),
                     time.perf_counter() - start)
        return all(r is None or isinstance(r, cxlrt.AlreadyExistsError) for r in res)

    def exists(self, key: str) -> bool:
        return self.store.contains(self.ns, key)

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        with self.store.lookup(self.ns, keys) as pins:
            return pins.length

    def clear(self) -> None:
        pass  # write-once entries go by eviction, not by a clear

    def get_stats(self):
        """SGLang's StorageMetrics of the batches since the last call (its
        radix cache logs them to Prometheus). Imported here, not with the
        backend: SGLang's metrics module pulls in its model configs."""
        from sglang.srt.observability.metrics_collector import StorageMetrics

        with self._metrics_lock:
            b, self._metrics = self._metrics, _Batches()
        return StorageMetrics(prefetch_pgs=b.prefetch_pgs, backup_pgs=b.backup_pgs,
                              prefetch_bandwidth=b.prefetch_bandwidth,
                              backup_bandwidth=b.backup_bandwidth)
