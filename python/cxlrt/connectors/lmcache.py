"""LMCache L2 connector over the cxlrt KV store, for LMCache's
`native_plugin` L2 adapter:

    {"type": "native_plugin", "module_path": "cxlrt.connectors.lmcache",
     "class_name": "CxlrtL2Connector",
     "adapter_params": {"pool": "dax:///dev/dax0.0"}}

It has the native-connector shape LMCache's NativeConnectorL2Adapter drives:
`submit_batch_set/get/exists/delete` queue a batch and return a future id
at once (the adapter calls them under its lock); a worker thread runs each
batch as one store call (the copies run without the GIL, into or out of
LMCache's own buffers: no staging copy); `event_fd` becomes readable when
results are ready and `drain_completions` hands them over as (future id,
ok, error, per-key results).

Keys are LMCache's serialized object keys (model, KV rank, group, chunk
hash, salt), in one namespace (`namespace`, default "lmcache"). Values are
write-once: a chunk already stored counts as stored. The pool:
`adapter_params["pool"]`, else CXLRT_POOL; the store is made when the pool
has none.

LMCache's counters of an L2 backend are fed by its own adapter from these
completions: bytes in use (`get_usage()`, which drives its eviction), the
keys stored, accessed and deleted (events on its observability bus), and
each store task's bytes. So that they stay true, a store batch is all or
nothing (LMCache takes a batch's result as one flag and counts no byte of a
failed one): when a chunk of it fails, the chunks it did store are deleted
again; loads, lookups and deletes answer per key. A native plugin has no
hook of its own into LMCache's status (`report_status`).
"""

from __future__ import annotations

import os
import queue
import threading
from typing import List, Optional, Sequence, Tuple

import cxlrt

Completion = Tuple[int, bool, str, Optional[List[bool]]]


class CxlrtL2Connector:
    def __init__(self, pool: Optional[str] = None, namespace: str = "lmcache",
                 create_store: bool = True):
        uri = pool or os.environ.get("CXLRT_POOL")
        if not uri:
            raise ValueError("cxlrt LMCache connector: pass adapter_params['pool'] or set "
                             "CXLRT_POOL")
        self.ns = namespace
        self._host = cxlrt.Host(uri, create=True)
        self._store = self._host.store(create=create_store)
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._jobs: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._done: List[Completion] = []
        self._lock = threading.Lock()
        self._next = 0
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="cxlrt-lmcache", daemon=True)
        self._worker.start()

    # --- the native-connector interface ---

    def event_fd(self) -> int:
        return self._efd

    def submit_batch_set(self, keys: Sequence[str], memviews: Sequence) -> int:
        return self._submit("set", keys, memviews)

    def submit_batch_get(self, keys: Sequence[str], memviews: Sequence) -> int:
        return self._submit("get", keys, memviews)

    def submit_batch_exists(self, keys: Sequence[str]) -> int:
        return self._submit("exists", keys, None)

    def submit_batch_delete(self, keys: Sequence[str]) -> int:
        return self._submit("delete", keys, None)

    def drain_completions(self) -> List[Completion]:
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass
        with self._lock:
            done, self._done = self._done, []
        return done

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        self._worker.join()
        os.close(self._efd)
        self._store.close()
        self._host.close()

    # --- the worker ---

    def _submit(self, op: str, keys: Sequence[str], memviews) -> int:
        if self._closed:
            raise cxlrt.FailedPreconditionError("the connector is closed")
        with self._lock:
            fid = self._next
            self._next += 1
        self._jobs.put((fid, op, list(keys), None if memviews is None else list(memviews)))
        return fid

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fid, op, keys, views = job
            try:
                result = self._execute(op, keys, views)
            except Exception as e:  # one failed batch, reported, not a dead worker
                result = (False, f"{type(e).__name__}: {e}", None)
            with self._lock:
                self._done.append((fid,) + result)
            os.eventfd_write(self._efd, 1)

    def _execute(self, op: str, keys: List[str], views) -> Tuple[bool, str, Optional[List[bool]]]:
        s = self._store
        if op == "set":
            res = s.batch_put(self.ns, keys, views)
            bad = [r for r in res if r is not None and not isinstance(r, cxlrt.AlreadyExistsError)]
            if bad:  # all or nothing: undo what this batch stored
                for k, r in zip(keys, res):
                    if r is None:
                        try:
                            s.delete(self.ns, k)
                        except cxlrt.NotFoundError:
                            pass  # evicted meanwhile
            return (not bad, f"{type(bad[0]).__name__}: {bad[0]}" if bad else "", None)
        if op == "get":
            res = s.batch_get_into(self.ns, keys, views)
            got = [isinstance(r, int) and r == memoryview(v).nbytes for r, v in zip(res, views)]
            first = next((r for r in res if isinstance(r, cxlrt.Error)), None)
            return (all(got), f"{type(first).__name__}: {first}" if first else "", got)
        if op == "exists":
            return (True, "", [s.contains(self.ns, k) for k in keys])
        if op == "delete":
            out = []
            for k in keys:
                try:
                    s.delete(self.ns, k)
                    out.append(True)
                except cxlrt.NotFoundError:
                    out.append(False)
            return (True, "", out)
        raise ValueError(f"unknown op {op}")
