"""vLLM KV connector (v1) over the cxlrt KV store: a rack-wide prefix cache.

Load it with vLLM's own connector loading:

    --kv-transfer-config '{"kv_connector": "CxlrtConnector",
        "kv_connector_module_path": "cxlrt.connectors.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"pool": "dax:///dev/dax0.0"}}'

Every full block of a request's tokens is one value in the store, under a
key that names its whole prefix: a chained hash of the tokens up to and
including the block (seeded with the request's cache salt, LoRA and
multimodal inputs), so any server that computed the same prefix finds it.
A value holds the block's pages of every layer (K and V), gathered from
the paged KV cache and scattered back into it by one store call per step
(`batch_put_paged` / `batch_get_paged`): no staging copy, one key per
block rather than one per layer.

- Scheduler side: `get_num_new_matched_tokens` looks up the longest
  stored prefix, pinning it (in every tensor-parallel shard's namespace) so
  it cannot be evicted before it is loaded; `build_connector_meta` tells
  the workers which blocks to load and which newly full blocks to store.
- Worker side: `start_load_kv` loads before the forward pass; blocks that
  fail to load are reported by `get_block_ids_with_load_errors` (vLLM then
  recomputes them); `wait_for_save` stores after it. Saves are synchronous
  (the pool is memory: a block of every layer moves at copy speed), so no
  request's blocks are held past its step.

Loads are synchronous too unless `extra_config["load_async"]` is true. Then
a request with a hit waits (vLLM's WAITING_FOR_REMOTE_KVS) while a worker
thread loads its blocks, and the batch's other requests keep running: a
long cached prefix no longer stalls every request's step. `get_finished`
reports each load once it is done, failed blocks included (vLLM recomputes
them or fails the request, as its kv_load_failure_policy says).

Namespaces: one per model, KV dtype, block geometry, tensor-parallel
shard (non-MLA models: each TP rank holds its own heads) and
decode-context-parallel shard (each DCP rank holds its own slice of every
block's tokens under the same key; `extra_config["namespace"]` overrides
the model part). A worker's ranks come from its global rank
(`parallel_config.rank`, set per worker before vLLM makes the connector),
laid out as vLLM lays workers out. Servers
sharing a namespace must lay pages out alike (the same attention
backend); a value of another size is never loaded (a load error, not
wrong bytes). The pool: `extra_config["pool"]`, else CXLRT_POOL; the store
is made when the pool has none.

Stats: vLLM's KVConnectorStats (vllm_stats.py): lookups, hits and hit
tokens from the scheduler; blocks, bytes and time of loads and stores from
each worker, kept per rank so that they stay right across tensor-parallel
ranks; in vLLM's "KV Transfer metrics" log line and its Prometheus metrics
(vllm:cxlrt_*).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.core.kv_cache_utils import resolve_dcp_kv_block_size
from vllm.v1.metrics.cache_hit_source import CacheHitSource

import cxlrt
from cxlrt.connectors.vllm_stats import CxlrtKVConnectorStats, CxlrtPromMetrics

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics, KVConnectorStats, PromMetric, PromMetricT)
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)


@dataclass
class Transfers:
    """Blocks to move, every request's of a step: keys[i] <-> KV cache block
    block_ids[i]."""

    keys: list[bytes] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)

    def add(self, keys: list[bytes], block_ids: list[int]) -> None:
        self.keys += keys
        self.block_ids += block_ids


@dataclass
class CxlrtConnectorMetadata(KVConnectorMetadata):
    loads: Transfers = field(default_factory=Transfers)
    saves: Transfers = field(default_factory=Transfers)
    async_loads: dict[str, Transfers] = field(default_factory=dict)  # by request id


@dataclass
class _Request:
    """Scheduler-side state of one request."""

    request: "Request"  # the scheduler's, whose tokens grow as it decodes
    seed: bytes
    keys: list[bytes] = field(default_factory=list)  # of its full blocks so far
    stored: int = 0  # leading blocks known to be in the store
    pins: list = field(default_factory=list)
    load: Optional[tuple[int, int]] = None  # blocks [first, end) to load
    no_load_from: Optional[int] = None  # a load of this block failed: never offered again
    block_ids: list[int] = field(default_factory=list)  # its KV cache blocks
    asked: bool = False  # get_num_new_matched_tokens since its last admission


def _seed(request: "Request") -> bytes:
    """What besides the tokens decides a block's KV: salt, LoRA, images."""
    h = hashlib.blake2b(b"cxlrt-vllm-v1", digest_size=32)
    if request.cache_salt:
        h.update(b"salt:" + request.cache_salt.encode())
    if request.lora_request is not None:
        h.update(b"lora:" + request.lora_request.lora_name.encode())
    for f in request.mm_features or ():  # each input and where it sits
        where = getattr(getattr(f, "mm_position", None), "offset", "")
        h.update(f"mm:{f.identifier}@{where}".encode())
    return h.digest()


class CxlrtConnector(KVConnectorBase_V1):
    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig"):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        uri = extra.get("pool") or os.environ.get("CXLRT_POOL")
        if not uri:
            raise ValueError("cxlrt vLLM connector: set kv_connector_extra_config['pool'] "
                             "or CXLRT_POOL")
        parallel = vllm_config.parallel_config
        self._tp_size = parallel.tensor_parallel_size
        self._pp_size = parallel.pipeline_parallel_size
        self._pcp_size = getattr(parallel, "prefill_context_parallel_size", 1)
        self._dcp_size = getattr(parallel, "decode_context_parallel_size", 1)
        if self._dcp_size > 1 and self._pcp_size > 1:
            raise ValueError(f"cxlrt vLLM connector: decode context parallelism (DCP "
                             f"{self._dcp_size}) with prefill context parallelism (PCP "
                             f"{self._pcp_size}) is not supported")
        self._interleave = getattr(parallel, "cp_kv_cache_interleave_size", 1)
        # This worker's global rank; vLLM's workers are laid out [PP, PCP, TP],
        # TP innermost, and DCP (without PCP) subdivides TP.
        self._rank = getattr(parallel, "rank", 0)
        spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
        # The tokens one of vLLM's block ids stands for: under DCP, a block
        # holds block_size tokens on each DCP rank, block_size * dcp in all
        # (vLLM's scheduler counts in these).
        self._block_size = resolve_dcp_kv_block_size(spec, self._dcp_size)
        model = extra.get("namespace") or vllm_config.model_config.model
        self._ns_base = (f"vllm/{model}/{str(spec.dtype).removeprefix('torch.')}"
                         f"/b{spec.block_size}h{getattr(spec, 'num_kv_heads', 1)}"
                         f"d{getattr(spec, 'head_size', 0)}").replace("//", "/")
        self._mla = bool(getattr(vllm_config.model_config, "use_mla", False))
        self._load_async = bool(extra.get("load_async", False))
        self.host = cxlrt.Host(uri, create=True)
        self.store = self.host.store(create=True)
        # Scheduler side.
        self._reqs: dict[str, _Request] = {}
        self._async_loads: dict[str, Transfers] = {}  # for the next metadata
        self._loads_in_flight: dict[str, tuple[int, list[int]]] = {}  # first block, block ids
        # Worker side.
        self._segments: list[tuple[int, int, int]] = []
        self._num_blocks = 0
        self._block_bytes = 0
        self._load_errors: set[int] = set()
        self._device: Optional[torch.device] = None
        self._loader: Optional[ThreadPoolExecutor] = None  # one thread: async loads
        self._loading: dict[str, tuple[Transfers, Future]] = {}
        self._stats = CxlrtKVConnectorStats()  # since the last get_kv_connector_stats

    # --- namespaces ---

    def _namespace(self, tp_rank: int, pp_rank: int) -> str:
        ns = self._ns_base
        if not self._mla and self._tp_size > 1:  # each TP rank holds its own heads
            ns += f"/tp{tp_rank}of{self._tp_size}"
        if self._dcp_size > 1:
            # Each DCP rank holds its own slice of every block's tokens, under
            # the same key: without its own namespace, the second rank's store
            # is "already there" and it later loads the first rank's slice.
            # What a slice holds is fixed by the DCP rank and size and the
            # interleave; the TP size too, as SGLang and vLLM's own
            # connectors key it (MLA: DCP groups hold the same slices).
            ns += (f"/dcp{tp_rank % self._dcp_size}of{self._dcp_size}"
                   f"tp{self._tp_size}i{self._interleave}")
        if self._pp_size > 1:  # each stage holds its own layers
            ns += f"/pp{pp_rank}of{self._pp_size}"
        if len(ns) > 200:  # the store's namespace names are bounded
            ns = "vllm/" + hashlib.sha256(ns.encode()).hexdigest()
        return ns

    def _all_namespaces(self) -> list[str]:
        # The TP ranks whose namespaces differ: MLA, one per DCP rank (TP rank
        # r holds DCP rank r % dcp's slice); otherwise every TP rank.
        tps = range(self._dcp_size) if self._mla else range(self._tp_size)
        return [self._namespace(t, p) for t in tps for p in range(self._pp_size)]

    def _worker_namespace(self) -> str:
        tp_rank = self._rank % self._tp_size
        pp_rank = self._rank // (self._tp_size * self._pcp_size) % self._pp_size
        return self._namespace(tp_rank, pp_rank)

    # --- scheduler side ---

    def _state(self, request: "Request") -> _Request:
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = _Request(request, _seed(request))
        tokens = request.all_token_ids
        bs = self._block_size
        while (len(st.keys) + 1) * bs <= len(tokens):
            i = len(st.keys)
            block = np.asarray(tokens[i * bs:(i + 1) * bs], dtype=np.int64).tobytes()
            prev = st.keys[-1] if st.keys else st.seed
            st.keys.append(hashlib.blake2b(prev + block, digest_size=32).digest())
        return st

    def _release(self, st: _Request) -> None:
        for p in st.pins:
            p.release()
        st.pins = []

    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int) -> tuple[Optional[int], bool]:
        st = self._state(request)
        self._release(st)  # asked again (a retry, or resumed after preemption)
        st.load = None
        st.asked = True
        # At least one token must be left to compute.
        most = min(len(st.keys), (request.num_tokens - 1) // self._block_size)
        if st.no_load_from is not None:  # retried after a failed load: recomputed
            most = min(most, st.no_load_from)
        hit = most
        for ns in self._all_namespaces():
            if hit == 0:
                break
            pins = self.store._s.lookup(ns, st.keys[:hit])  # an unknown namespace: 0
            st.pins.append(pins)
            hit = min(hit, len(pins))
        st.stored = max(st.stored, hit)
        first = num_computed_tokens // self._block_size
        if hit <= first:
            self._release(st)
            return 0, False
        st.load = (first, hit)
        return hit * self._block_size - num_computed_tokens, self._load_async

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        if st.asked:  # admitted: one lookup (vLLM also calls this after an async load)
            st.asked = False
            self._stats.count("lookups")
            if num_external_tokens > 0:
                self._stats.count("hit_requests")
                self._stats.count("hit_tokens", num_external_tokens)
                self._stats.count("hit_blocks", num_external_tokens // self._block_size)
        if num_external_tokens == 0:
            st.load = None
            self._release(st)
            return
        first, _ = st.load
        end = first + num_external_tokens // self._block_size
        st.load = (first, end)
        if self._load_async:
            # Not scheduled this step: the load goes out with the next
            # metadata, into the blocks allocated for it now.
            ids = list(blocks.get_block_ids()[0])
            self._async_loads.setdefault(request.request_id, Transfers()).add(
                st.keys[first:end], ids[first:end])
            self._loads_in_flight[request.request_id] = (first, ids[first:end])
            st.stored = max(st.stored, end)
            st.load = None

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = CxlrtConnectorMetadata(async_loads=self._async_loads)
        self._async_loads = {}
        out = scheduler_output
        # Each scheduled request's block ids and computed tokens: new ones
        # carry all their blocks; running ones the blocks added this step
        # (all of them when resumed after preemption).
        scheduled: list[tuple[str, int]] = []
        for new in out.scheduled_new_reqs:
            if (st := self._reqs.get(new.req_id)) is not None:
                st.block_ids = list(new.block_ids[0])
                scheduled.append((new.req_id, new.num_computed_tokens))
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if (st := self._reqs.get(req_id)) is None:
                continue
            added = list(cached.new_block_ids[i][0]) if cached.new_block_ids[i] else []
            st.block_ids = added if req_id in cached.resumed_req_ids else st.block_ids + added
            scheduled.append((req_id, cached.num_computed_tokens[i]))

        for req_id, computed in scheduled:
            st = self._state(self._reqs[req_id].request)  # keys of blocks decoding filled
            ids = st.block_ids
            if st.load is not None:
                first, end = st.load
                meta.loads.add(st.keys[first:end], ids[first:end])
                st.stored = max(st.stored, end)
                st.load = None
            # The blocks this step fills, generated tokens' too (a later turn
            # of the conversation starts with them): stored unless they are.
            computed += out.num_scheduled_tokens.get(req_id, 0)
            full = min(computed // self._block_size, len(st.keys), len(ids))
            if full > st.stored:
                meta.saves.add(st.keys[st.stored:full], ids[st.stored:full])
                st.stored = full
        return meta

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        """A request whose asynchronous load failed comes back to
        get_num_new_matched_tokens (vLLM frees its blocks and retries): it is
        not offered the blocks from the first failed one on, which would
        fail again."""
        bad = connector_output.invalid_block_ids or set()
        for req_id in connector_output.finished_recving or ():
            first, ids = self._loads_in_flight.pop(req_id, (0, []))
            failed = [i for i, b in enumerate(ids) if b in bad]
            if failed and (st := self._reqs.get(req_id)) is not None:
                st.no_load_from = first + failed[0]

    def request_finished(self, request: "Request",
                         block_ids: list[int]) -> tuple[bool, Optional[dict[str, Any]]]:
        st = self._reqs.pop(request.request_id, None)
        if st is not None:
            self._release(st)
        return False, None

    # --- worker side ---

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Finds each layer's block dimension and, per block, the pages to
        move: one segment (address, block stride, bytes) per page."""
        num_blocks = self._kv_cache_config.num_blocks
        segments, seen = [], set()
        for name in sorted(kv_caches):
            t = kv_caches[name]
            if (t.data_ptr(), tuple(t.shape)) in seen:  # a layer sharing another's cache
                continue
            seen.add((t.data_ptr(), tuple(t.shape)))
            dims = [d for d in range(min(2, t.dim())) if t.shape[d] == num_blocks]
            if not dims:
                raise ValueError(f"cxlrt vLLM connector: layer {name}'s KV cache {tuple(t.shape)} "
                                 f"has no dimension of {num_blocks} blocks in front")
            d = dims[0]
            esize = t.element_size()
            for idx in itertools.product(*(range(t.shape[k]) for k in range(d))):
                sub = t[idx] if idx else t
                page = sub[0]
                if not page.is_contiguous():
                    raise ValueError(f"cxlrt vLLM connector: layer {name}'s pages "
                                     f"{tuple(page.shape)} are not contiguous")
                segments.append((sub.data_ptr(), sub.stride(0) * esize, page.numel() * esize))
            self._device = t.device
        self._segments = segments
        self._num_blocks = num_blocks
        self._block_bytes = sum(n for _, _, n in segments)  # one block, every layer

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, CxlrtConnectorMetadata)
        for req_id, t in meta.async_loads.items():
            if self._loader is None:
                self._loader = ThreadPoolExecutor(1, "cxlrt-load", initializer=self._on_device)
            self._loading[req_id] = (t, self._loader.submit(
                self._timed_transfer, self.store._s.batch_get_paged, t))
        if meta.loads.keys:
            self._check_loaded(meta.loads, *self._timed_transfer(self.store._s.batch_get_paged,
                                                                 meta.loads))

    def _on_device(self) -> None:
        """The loader thread copies to and from the worker's own GPU."""
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.set_device(self._device)

    def _check_loaded(self, t: Transfers, res: list, seconds: float) -> None:
        w = self._stats.worker(self._rank)
        w["load_seconds"].append(seconds)
        for block, r in zip(t.block_ids, res):
            if not isinstance(r, int):
                logger.warning("cxlrt: block %d did not load (%s); vLLM recomputes it", block, r)
                self._load_errors.add(block)
                w["load_failed_blocks"] += 1
            else:
                w["loaded_blocks"] += 1
                w["loaded_bytes"] += self._block_bytes

    def get_finished(self, finished_req_ids: set[str]) -> tuple[Optional[set[str]],
                                                                 Optional[set[str]]]:
        """The requests whose asynchronous loads are done (their failed blocks
        go to get_block_ids_with_load_errors, called right after)."""
        done = {r for r, (_, f) in self._loading.items() if f.done()}
        for req_id in done:
            t, f = self._loading.pop(req_id)
            try:
                self._check_loaded(t, *f.result())
            except Exception as e:  # noqa: BLE001 - every block of it failed
                logger.warning("cxlrt: request %s's blocks did not load: %s", req_id, e)
                self._load_errors.update(t.block_ids)
                self._stats.worker(self._rank)["load_failed_blocks"] += len(t.block_ids)
        return None, done or None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # start_load_kv loaded every layer

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        return  # a block's value holds every layer: stored in wait_for_save

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, CxlrtConnectorMetadata)
        if not meta.saves.keys:
            return
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.current_stream(self._device).synchronize()  # the forward's writes
        res, seconds = self._timed_transfer(self.store._s.batch_put_paged, meta.saves)
        w = self._stats.worker(self._rank)
        w["store_seconds"].append(seconds)
        for r in res:
            if r is None:
                w["stored_blocks"] += 1
                w["stored_bytes"] += self._block_bytes
                continue
            w["store_skipped_blocks"] += 1  # already there (another server's), or failed
            if not isinstance(r, cxlrt.AlreadyExistsError):
                logger.warning("cxlrt: a block was not stored: %s", r)  # a later miss

    def _timed_transfer(self, call, t: Transfers) -> tuple[list, float]:
        start = time.perf_counter()
        res = self._transfer(call, t)
        return res, time.perf_counter() - start

    def _transfer(self, call, t: Transfers) -> list:
        if not self._segments:
            raise RuntimeError("cxlrt vLLM connector: register_kv_caches was not called")
        bad = [b for b in t.block_ids if not 0 <= b < self._num_blocks]
        if bad:  # an address outside the cache: refused before any copy
            raise ValueError(f"cxlrt vLLM connector: block ids {bad[:4]} outside the cache's "
                             f"{self._num_blocks} blocks")
        return call(self._worker_namespace(), t.keys, t.block_ids, self._segments)

    # --- stats (vllm_stats.py) ---

    def get_kv_connector_stats(self) -> Optional["KVConnectorStats"]:
        """This side's counts since the last call (vLLM merges the workers'
        and the scheduler's, then every step of a logging interval)."""
        if self._stats.is_empty():
            return None
        stats, self._stats = self._stats, CxlrtKVConnectorStats()
        return stats

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[dict[str, Any]] = None
                                 ) -> Optional["KVConnectorStats"]:
        return CxlrtKVConnectorStats(data=data) if data is not None else CxlrtKVConnectorStats()

    @classmethod
    def build_prom_metrics(cls, vllm_config: "VllmConfig",
                           metric_types: dict[type["PromMetric"], type["PromMetricT"]],
                           labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]
                           ) -> "KVConnectorPromMetrics":
        return CxlrtPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        if self._loader is not None:  # no copy may outlive the caches
            self._loader.shutdown(wait=True)
            self._loader = None
        for st in self._reqs.values():
            self._release(st)
        self._reqs.clear()
