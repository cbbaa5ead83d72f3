"""What the cxlrt vLLM connector reports through vLLM's KVConnectorStats:
its log line ("KV Transfer metrics: ...") and its Prometheus metrics
(vllm:cxlrt_*), as vLLM's own connectors (NIXL, Mooncake, offloading) do.

vLLM collects a connector's stats from the scheduler (once per engine) and
from every worker (one per tensor- and pipeline-parallel rank), merging
them with `aggregate` (KVOutputAggregator over the workers of a step, the
scheduler's on top, then every step of a logging interval), and ships them
between processes as the plain dict `data`. The counts stay right across
ranks because each is kept where it is counted once:

- the scheduler counts lookups (requests admitted after the connector was
  asked for their prefix), hits (those with tokens to load) and hit tokens:
  one engine, one count;
- each worker counts its blocks, bytes and time under its own global rank,
  so that merging the ranks of one step sums nothing twice: a block loaded
  is every rank loading its shard of it, so the engine's blocks are the
  most any rank moved (`reduce`), its bytes the sum over ranks, and its
  time per load the mean over every rank's loads.

Not thread-safe: the connector updates its stats from vLLM's scheduler or
worker thread only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)
from vllm.v1.metrics.utils import create_metric_per_engine

# The scheduler's counters, then each worker's (data["workers"][rank]).
SCHEDULER_KEYS = ("lookups", "hit_requests", "hit_tokens", "hit_blocks")
WORKER_COUNTERS = ("loaded_blocks", "loaded_bytes", "load_failed_blocks", "stored_blocks",
                   "stored_bytes", "store_skipped_blocks")
WORKER_SAMPLES = ("load_seconds", "store_seconds")  # one per batch call


def _empty_worker() -> dict[str, Any]:
    w: dict[str, Any] = {k: 0 for k in WORKER_COUNTERS}
    w.update({k: [] for k in WORKER_SAMPLES})
    return w


@dataclass
class CxlrtKVConnectorStats(KVConnectorStats):
    """data = {"scheduler": {lookups, hit_requests, hit_tokens, hit_blocks},
    "workers": {"<global rank>": {loaded_blocks, loaded_bytes,
    load_failed_blocks, stored_blocks, stored_bytes, store_skipped_blocks,
    load_seconds: [...], store_seconds: [...]}}}."""

    def __post_init__(self) -> None:
        if "scheduler" not in self.data:
            self.reset()

    def reset(self) -> None:
        self.data = {"scheduler": {k: 0 for k in SCHEDULER_KEYS}, "workers": {}}

    def worker(self, rank: int) -> dict[str, Any]:
        """The counters of global rank `rank` (made empty on first use)."""
        return self.data["workers"].setdefault(str(rank), _empty_worker())

    def count(self, key: str, n: int = 1) -> None:
        """Adds n to a scheduler counter."""
        self.data["scheduler"][key] += n

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        if other.is_empty():
            return self
        assert isinstance(other, CxlrtKVConnectorStats), type(other)
        for k in SCHEDULER_KEYS:
            self.data["scheduler"][k] += other.data["scheduler"].get(k, 0)
        for rank, w in other.data["workers"].items():
            mine = self.worker(int(rank))
            for k in WORKER_COUNTERS:
                mine[k] += w.get(k, 0)
            for k in WORKER_SAMPLES:
                mine[k] = mine[k] + list(w.get(k, []))
        return self

    def is_empty(self) -> bool:
        return (not any(self.data["scheduler"].values()) and
                not any(any(w[k] for k in WORKER_COUNTERS + WORKER_SAMPLES)
                        for w in self.data["workers"].values()))

    def totals(self) -> dict[str, float]:
        """The engine's figures: scheduler counts as they are; blocks the
        most any rank moved; bytes and samples over every rank."""
        s = self.data["scheduler"]
        ws = list(self.data["workers"].values())
        out: dict[str, float] = {k: s[k] for k in SCHEDULER_KEYS}
        for k in ("loaded_blocks", "load_failed_blocks", "stored_blocks",
                  "store_skipped_blocks"):
            out[k] = max((w[k] for w in ws), default=0)
        for k in ("loaded_bytes", "stored_bytes"):
            out[k] = sum(w[k] for w in ws)
        for k in WORKER_SAMPLES:
            v = [x for w in ws for x in w[k]]
            out[k] = sum(v)
            out[k.replace("_seconds", "s")] = len(v)
        out["workers"] = len(ws)
        return out

    def reduce(self) -> dict[str, int | float]:
        t = self.totals()
        lookups = t["lookups"]
        loads, stores = t["loads"], t["stores"]
        return {
            "Lookups": int(lookups),
            "Hit requests": int(t["hit_requests"]),
            "Hit rate": round(t["hit_requests"] / lookups, 4) if lookups else 0.0,
            "Hit tokens": int(t["hit_tokens"]),
            "Loaded blocks": int(t["loaded_blocks"]),
            "Loaded bytes": int(t["loaded_bytes"]),
            "Failed block loads": int(t["load_failed_blocks"]),
            "Avg load time (ms)": round(t["load_seconds"] / loads * 1e3, 3) if loads else 0.0,
            "Stored blocks": int(t["stored_blocks"]),
            "Stored bytes": int(t["stored_bytes"]),
            "Avg store time (ms)": round(t["store_seconds"] / stores * 1e3, 3) if stores else 0.0,
            "Workers": int(t["workers"]),
        }


# Seconds a batch load or store of one step takes: 10 us .. 10 s.
_TIME_BUCKETS = [1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0]


class CxlrtPromMetrics(KVConnectorPromMetrics):
    """vllm:cxlrt_* per engine: counters of lookups, hits, hit tokens, blocks
    and bytes loaded and stored, failed loads; histograms of the time of a
    batch load and store (one sample per worker and step)."""

    _COUNTERS = {
        "lookups": "Requests admitted after the cxlrt store was asked for their prefix",
        "hit_requests": "Admitted requests with a prefix to load from the cxlrt store",
        "hit_tokens": "Tokens loaded from the cxlrt store instead of computed",
        "loaded_blocks": "KV blocks loaded from the cxlrt store (once per block, all ranks)",
        "loaded_bytes": "Bytes loaded from the cxlrt store, summed over the ranks",
        "load_failed_blocks": "KV blocks that failed to load (recomputed or failed by vLLM)",
        "stored_blocks": "KV blocks stored into the cxlrt store (once per block, all ranks)",
        "stored_bytes": "Bytes stored into the cxlrt store, summed over the ranks",
    }

    def __init__(self, vllm_config: Any, metric_types: dict[type[PromMetric], type[PromMetricT]],
                 labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters = {
            k: create_metric_per_engine(
                self._counter_cls(name=f"vllm:cxlrt_{k}", documentation=doc,
                                  labelnames=labelnames), per_engine_labelvalues)
            for k, doc in self._COUNTERS.items()}
        self.histograms = {
            k: create_metric_per_engine(
                self._histogram_cls(name=f"vllm:cxlrt_{k}",
                                    documentation=f"Seconds of one worker's batch "
                                    f"{k.split('_')[0]} of a step from the cxlrt store",
                                    buckets=_TIME_BUCKETS, labelnames=labelnames),
                per_engine_labelvalues)
            for k in WORKER_SAMPLES}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        t = CxlrtKVConnectorStats(data=transfer_stats_data).totals()
        for k, per_engine in self.counters.items():
            if t[k]:
                per_engine[engine_idx].inc(t[k])
        for k, per_engine in self.histograms.items():
            for w in transfer_stats_data["workers"].values():
                for v in w[k]:
                    per_engine[engine_idx].observe(v)
