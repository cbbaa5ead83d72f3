"""The torch backend across pods (issue 28): a group whose ranks map more
than one pool runs each collective level by level, over the pool inside a
pod and over an existing engine between pods (Gloo for CPU tensors, NCCL
for CUDA tensors). torch_backend.py makes it; docs/python.md, "Across
pods", describes it.

Pods: each rank's pool (CXLRT_POOL) is named by its header's creation_id;
pods are ordered by their lowest group rank, a pod's ranks by group rank.
Groups of one pod never come here (torch_backend.py makes today's backend).

The tiers, per group:
  - pod: the cxlrt C++ backend over the pod's ranks (the pod's pool);
  - rails: rail j holds the ranks of local index j, one per pod that has
    one (pods may differ in size), as a Gloo (or NCCL) group;
  - cross: one Gloo (or NCCL) group of the whole group, for what moves
    between any two ranks of different pods: send/recv and all-to-all.
  The engine's groups are made from the group's store: Gloo's with the
  group (a Gloo group connects its ranks as it is made, and a send
  involves only two), NCCL's at the first CUDA call that needs them (NCCL
  connects at first use).

Composed here in Python, not in C++: the engine's groups are torch's own
ProcessGroupGloo / ProcessGroupNCCL, which Python makes with their options
and timeout in one line each, and each collective is a few calls of whole
tensors on the two tiers; the per-call cost (a few microseconds of Python
per tier call) is small beside an inter-pod step.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

C10D = torch._C._distributed_c10d
ENGINES = ("auto", "gloo", "nccl")
# The tag of the pod's p2p moves inside a collective (reduce, gather,
# scatter to or from a root that is not its pod's local rank 0): apart from
# the tags programs use.
_MOVE_TAG = (1 << 30) + 28
# The all-reduce's pipeline (PodsBackend._allreduce_flat): segments of at
# least PIPELINE_BYTES, at most PIPELINE_SEGMENTS of them (1: none). Read
# at each call; every rank of a group must see the same values.
PIPELINE_BYTES = 1 << 20
PIPELINE_SEGMENTS = 4


def inter_pod_engine(device: torch.device) -> str:
    """The engine between pods for tensors on `device`: CXLRT_TORCH_INTER_POD
    (auto, gloo or nccl; auto: Gloo for CPU tensors, NCCL for CUDA tensors
    where torch has NCCL, else Gloo)."""
    want = os.environ.get("CXLRT_TORCH_INTER_POD") or "auto"  # empty: unset
    if want not in ENGINES:
        raise ValueError(f"cxlrt: CXLRT_TORCH_INTER_POD={want!r}: expected one of "
                         f"{', '.join(ENGINES)}")
    if want == "auto":
        return "nccl" if device.type == "cuda" and dist.is_nccl_available() else "gloo"
    if want == "nccl" and device.type != "cuda":
        raise ValueError("cxlrt: CXLRT_TORCH_INTER_POD=nccl carries CUDA tensors only; this "
                         f"call's tensors are on {device} (set it to auto or gloo)")
    return want


def _exchange(store, key: str, rank: int, size: int, text: str) -> list:
    """Every rank's `text` (no control characters), in rank order, through
    the store: one append and one read a rank (the store's server handles
    O(size) requests, not O(size^2) as a key per rank read by every rank
    would make); a store without append: a key per rank."""
    try:
        store.append(f"{key}list", f"{rank}\x1f{text}\x1e")
    except (RuntimeError, NotImplementedError, AttributeError):
        store.set(f"{key}one/{rank}", text)
        return [text if r == rank else store.get(f"{key}one/{r}").decode() for r in range(size)]
    if store.add(f"{key}count", 1) == size:
        store.set(f"{key}done", "1")
    store.wait([f"{key}done"])  # the store's timeout
    got = {}
    for rec in store.get(f"{key}list").decode().split("\x1e"):
        if rec:
            r, t = rec.split("\x1f", 1)
            got[int(r)] = t
    if sorted(got) != list(range(size)):
        raise RuntimeError(f"cxlrt: [Rank {rank}] learning the pods: the store holds entries "
                           f"of ranks {sorted(got)}, not 0..{size - 1}")
    return [got[r] for r in range(size)]


def discover(store, rank: int, size: int, uri: str, pool_identity, create_pool):
    """Every rank's pod, learned through the group's store: (pods, made)
    where pods lists each pod's group ranks (ordered as above) and made
    counts this making of the group's keys. The lowest rank of each
    (host, pool URI) makes the pool when it does not exist (create_pool);
    the pools' creation_ids are read only when the ranks do not all name
    one pool on one host (then they are one pod: no pool is opened here)."""
    made = (store.add("cxlrt/pods/made", 1) - 1) // size
    key = f"cxlrt/pods/{made}/"
    where = f"{socket.gethostname()}\x1d{uri}"
    wheres = _exchange(store, f"{key}where/", rank, size, where)
    creator = wheres.index(where)
    if rank == creator:
        create_pool(uri)
        store.set(f"{key}ready/{rank}", "1")
    else:
        store.get(f"{key}ready/{creator}")  # waits (the store's timeout) for its maker
    if all(w == where for w in wheres):
        return [list(range(size))], made
    ids = _exchange(store, f"{key}id/", rank, size, pool_identity(uri))
    pods: dict = {}
    for r, i in enumerate(ids):  # dicts keep insertion order: by lowest rank
        pods.setdefault(i, []).append(r)
    return list(pods.values()), made


def _work(result):
    fut = torch.futures.Future()
    fut.set_result(result)
    return C10D._create_work_from_future(fut)


def _wait(work):
    if work is not None:
        work.wait()


class PodsBackend(C10D.Backend):
    """A c10d backend over several pods (see the module's docstring). Each
    call runs to its end in the caller's thread and returns a completed Work;
    a failure of either tier raises from the call, naming the rank and the
    tier."""

    # torch asks a backend whether it coalesces with getattr, which on a
    # Python subclass of c10d's Backend recurses without end unless the
    # class answers itself (dist.batch_isend_irecv raised RecursionError).
    # The calls of a batch run one by one.
    supports_coalescing = False

    def __init__(self, store, rank: int, size: int, timeout: timedelta, pods, made: int,
                 pod_backend):
        super().__init__(rank, size)
        self._store = store
        self._rank = rank
        self._size = size
        self._timeout = timeout
        self._made = made
        self.pods = pods
        self.pod_index = next(q for q, p in enumerate(pods) if rank in p)
        self.local = pods[self.pod_index].index(rank)
        self.pod_size = len(pods[self.pod_index])
        self._where = {}  # group rank -> (pod, local index)
        for q, p in enumerate(pods):
            for j, r in enumerate(p):
                self._where[r] = (q, j)
        self._min = min(len(p) for p in pods)
        self._max = max(len(p) for p in pods)
        self._pod = pod_backend
        self._engines = {}  # (engine, "rail"|"cross") -> (group, its ranks' map)
        # Gloo's groups (CPU tensors) now, while every rank is here: a Gloo
        # group connects its ranks as it is made, and a send between two
        # pods involves only two ranks of the cross group.
        cpu = torch.device("cpu")
        self._engine_group(cpu, "rail")
        self._engine_group(cpu, "cross")

    def getBackendName(self):  # noqa: N802 (torch's name)
        return "cxlrt"

    # --- the tiers ---

    def _engine_group(self, device: torch.device, kind: str):
        """(group, rank -> its rank in it) of `kind` ("rail": my rail;
        "cross": the whole group) of the engine for `device`."""
        engine = inter_pod_engine(device)
        got = self._engines.get((engine, kind))
        if got is not None:
            return got
        if kind == "rail":
            members = [p[self.local] for p in self.pods if len(p) > self.local]
            name = f"rail{self.local}"
        else:
            members = list(range(self._size))
            name = "cross"
        ranks = {r: i for i, r in enumerate(members)}
        store = dist.PrefixStore(f"cxlrt/pods/{self._made}/{engine}/{name}/", self._store)
        me = ranks[self._rank]
        if engine == "gloo":
            group = dist.ProcessGroupGloo(store, me, len(members), self._timeout)
        else:
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = self._timeout
            group = dist.ProcessGroupNCCL(store, me, len(members), opts)
        self._engines[(engine, kind)] = (group, ranks)
        return group, ranks

    def _inter(self, kind: str, what: str, device: torch.device, call):
        """Runs call(group, ranks) on the engine's group; CUDA tensors under
        Gloo go through CPU copies (the caller does that)."""
        group, ranks = self._engine_group(device, kind)
        try:
            _wait(call(group, ranks))
        except Exception as e:
            self._abort()
            raise RuntimeError(f"cxlrt: [Rank {self._rank}] {what} between pods "
                               f"({inter_pod_engine(device)}, {kind}): {e}") from e

    def shutdown(self) -> None:  # torch's name: destroy_process_group calls it
        """Shuts the engine's groups down while Python still runs. A Gloo
        group's worker threads drop their finished work, and with it Python
        tensors, after the caller's wait returned; left to the interpreter's
        exit, a worker doing so once Python finalizes is ended by it mid
        destructor, and the process aborts ("terminate called without an
        active exception")."""
        engines, self._engines = list(self._engines.values()), {}
        for group, _ in engines:
            try:
                group.shutdown()
            except Exception:  # already shut down, or broken: nothing to join
                pass

    def _abort(self) -> None:
        """A tier failed: the group is broken (as a cxlrt communicator is
        after an error). Aborts the pod's communicators (the pod's other
        ranks fail at their next wait, not at their deadline) and the
        engine's groups (their peers see the connections close)."""
        for b in [self._pod] + [g for g, _ in self._engines.values()]:
            try:
                b.abort()
            except Exception:  # an engine without abort: its peers time out
                pass

    def _on_pod(self, what: str, call):
        if self.pod_size == 1:
            return
        try:
            _wait(call(self._pod))
        except Exception as e:
            self._abort()
            raise RuntimeError(f"cxlrt: [Rank {self._rank}] {what} in pod {self.pod_index} "
                               f"(local rank {self.local} of {self.pod_size}): {e}") from e

    def _staged(self, t: torch.Tensor) -> bool:
        # Gloo carries CUDA tensors through CPU copies.
        return t.device.type == "cuda" and inter_pod_engine(t.device) == "gloo"

    def _rail(self, what: str, t: torch.Tensor, call):
        """call(group, ranks, tensor) on my rail with `t` (through a CPU copy
        under Gloo for a CUDA tensor, copied back)."""
        if self._staged(t):
            host = t.cpu()
            self._inter("rail", what, t.device, lambda g, r: call(g, r, host))
            t.copy_(host)
        else:
            self._inter("rail", what, t.device, lambda g, r: call(g, r, t))

    # --- collectives ---

    def _op(self, opts):
        op = getattr(opts.reduceOp, "op", opts.reduceOp)  # a ReduceOp: its RedOpType
        if op == dist.ReduceOp.AVG:
            return dist.ReduceOp.SUM, True
        # The pod tier's reductions (the C++ backend's): refused here, before
        # any tier runs, so that every rank fails alike at once (a rank alone
        # in its pod would otherwise skip the pod step and wait on its rail).
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN,
                      dist.ReduceOp.MAX):
            raise ValueError(f"cxlrt: [Rank {self._rank}] reduce op {op} is not supported: "
                             "reductions are sum, product, min, max and avg")
        return op, False

    def _pod_shard(self, sub: torch.Tensor, ro, what: str):
        """The pod's reduce-scatter of `sub` into the smallest pod's shards
        (ceil(len / smallest) elements; padded with zeros to pod size x
        shard): returns (the padded buffer, this rank's reduced shard)."""
        m = sub.numel()
        c = -(-m // self._min)
        whole = c * self.pod_size
        buf = sub if whole == m else torch.zeros(whole, dtype=sub.dtype, device=sub.device)
        if buf is not sub:
            buf[:m].copy_(sub)
        shard = torch.empty(c, dtype=sub.dtype, device=sub.device)
        if self.pod_size == 1:
            shard.copy_(buf)
        self._on_pod(f"{what} (reduce-scatter)",
                     lambda b: b._reduce_scatter_base(shard, buf, ro))
        return buf, shard

    def _rail_start(self, what: str, t: torch.Tensor, call, kind: str = "rail"):
        """Starts call(group, tensor) -> Work on my rail (or the engine's
        group of `kind`) with `t`, not waiting; returns what finishes it
        (waits, and under Gloo for a CUDA tensor copies the CPU copy
        back)."""
        device = t.device
        group, _ = self._engine_group(device, kind)
        host = t.cpu() if self._staged(t) else t

        def fail(e):
            self._abort()
            return RuntimeError(f"cxlrt: [Rank {self._rank}] {what} between pods "
                                f"({inter_pod_engine(device)}, {kind}): {e}")

        try:
            work = call(group, host)
        except Exception as e:
            raise fail(e) from e

        def finish():
            try:
                _wait(work)
            except Exception as e:
                raise fail(e) from e
            if host is not t:
                t.copy_(host)
        return finish

    def _segments(self, n: int, itemsize: int):
        """The pipeline's segments of an all-reduce of n elements: up to
        PIPELINE_SEGMENTS of at least PIPELINE_BYTES each (one below
        that)."""
        if n == 0:
            return []
        k = max(1, min(PIPELINE_SEGMENTS, n * itemsize // PIPELINE_BYTES))
        step = -(-n // k)
        return [(lo, min(n, lo + step)) for lo in range(0, n, step)]

    @staticmethod
    def _pipelined(segments, start, end) -> None:
        """start(lo, hi) of each segment, then end(*what start returned)
        of the one before it: segment k's step over the rail (started by
        start, finished by end) runs while this thread runs the pod's
        steps of its neighbours. Every rank of a pod calls the pod in the
        order this gives (S 0, S 1, E 0, S 2, E 1, ...)."""
        pending = []
        for lo, hi in segments:
            pending.append(start(lo, hi))
            if len(pending) > 1:
                end(*pending.pop(0))
        while pending:
            end(*pending.pop(0))

    def _allreduce_flat(self, flat: torch.Tensor, op) -> None:
        """All-reduce of a contiguous 1-D tensor in place: reduce-scatter in
        the pod, all-reduce of each shard over its rail, all-gather in the
        pod. The shards are the smallest pod's: ceil(n / smallest) elements
        each, so that rails 0 .. smallest-1 span every pod; a larger pod's
        extra ranks hold padding shards (the cost: a pod of s ranks moves
        s / smallest times the tensor in its two pod steps).

        Pipelined by segments (_segments): segment k's step over the rail
        runs in the engine's threads while this thread runs the pod's steps
        of segments k + 1 (reduce-scatter) and k - 1 (all-gather). Every
        rank of a pod runs the pod's steps in one order: RS 0, RS 1, AG 0,
        RS 2, AG 1, ..."""
        n = flat.numel()
        if n == 0:
            return
        ro = C10D.ReduceScatterOptions()
        ro.reduceOp = op
        ao = C10D.AllreduceOptions()
        ao.reduceOp = op
        on_rail = self.local < self._min and len(self.pods) > 1

        def start(lo, hi):
            sub = flat[lo:hi]
            buf, shard = self._pod_shard(sub, ro, "all_reduce")
            finish = None
            if on_rail:
                finish = self._rail_start("all_reduce", shard,
                                          lambda g, x: g.allreduce([x], ao))
            return sub, buf, shard, finish

        def end(sub, buf, shard, finish):
            if finish is not None:
                finish()
            if self.pod_size == 1:
                buf.copy_(shard)
            self._on_pod("all_reduce (all-gather)",
                         lambda b: b._allgather_base(buf, shard, C10D.AllgatherOptions()))
            if buf is not sub:
                sub.copy_(buf[:sub.numel()])

        self._pipelined(self._segments(n, flat.element_size()), start, end)

    def _in_place(self, t: torch.Tensor, fn) -> None:
        """fn(flat) on a contiguous 1-D view of t (a copy when t is not
        contiguous, written back)."""
        if t.is_contiguous():
            fn(t.view(-1))
        else:
            flat = t.contiguous().view(-1)
            fn(flat)
            t.copy_(flat.view_as(t))

    def allreduce(self, tensors, opts):
        t = _one(tensors, "all_reduce")
        inter_pod_engine(t.device)  # before any tier: a bad knob fails every rank alike
        op, avg = self._op(opts)
        self._in_place(t, lambda f: self._allreduce_flat(f, op))
        if avg:
            _avg_(t, self._size)
        return _work(tensors)

    def _rail_pieces(self, n: int):
        """The pieces of n elements the rails carry: rail j (0 .. smallest
        pod - 1, the rails that span every pod) carries elements
        [j * p, (j + 1) * p) of them, p = ceil(n / smallest)."""
        p = -(-n // self._min)
        return p, [(min(n, j * p), min(n, (j + 1) * p)) for j in range(self._min)]

    def _pod_pieces(self, piece: torch.Tensor, what: str) -> torch.Tensor:
        """Every rail's piece of this pod as (smallest pod x p): an
        all-gather in the pod where local ranks past the smallest pod's
        size give zeros (the cost of a larger pod: it moves pod size /
        smallest times the pieces)."""
        p = piece.numel()
        mine = piece if self.local < self._min else torch.zeros_like(piece)
        got = torch.empty((self.pod_size, p), dtype=piece.dtype, device=piece.device)
        if self.pod_size == 1:
            got[0].copy_(mine)
        self._on_pod(what, lambda b: b._allgather_base(got.view(-1), mine,
                                                       C10D.AllgatherOptions()))
        return got[:self._min]

    def _bcast_flat(self, flat: torch.Tensor, root: int) -> None:
        """Broadcast from group rank `root`: in the root's pod from the root;
        then over every rail that spans the pods, rail j carrying piece j
        (_rail_pieces) from the root's pod; in every other pod an all-gather
        of the pieces. Pipelined by segments (_pipelined) as the
        all-reduce is."""
        q, j = self._where[root]

        def start(lo, hi):
            sub = flat[lo:hi]
            if self.pod_index == q:
                bo = C10D.BroadcastOptions()
                bo.rootRank = j
                self._on_pod("broadcast", lambda b: b.broadcast([sub], bo))
            p, pieces = self._rail_pieces(sub.numel())
            piece = torch.zeros(p, dtype=flat.dtype, device=flat.device)
            finish = None
            if self.local < self._min:
                a, b = pieces[self.local]
                if self.pod_index == q:
                    piece[:b - a].copy_(sub[a:b])
                ro = C10D.BroadcastOptions()
                ro.rootRank = q
                finish = self._rail_start("broadcast", piece, lambda g, x: g.broadcast([x], ro))
            return sub, piece, finish

        def end(sub, piece, finish):
            if finish is not None:
                finish()
            if self.pod_index != q:
                got = self._pod_pieces(piece, "broadcast (the rails' pieces)")
                sub.copy_(got.reshape(-1)[:sub.numel()])

        self._pipelined(self._segments(flat.numel(), flat.element_size()), start, end)

    def broadcast(self, tensors, opts):
        t = _one(tensors, "broadcast")
        inter_pod_engine(t.device)
        self._in_place(t, lambda f: self._bcast_flat(f, opts.rootRank))
        return _work(tensors)

    def _move_in_pod(self, t: torch.Tensor, src: int, dst: int, what: str) -> None:
        """Local rank src's t to local rank dst's t (the pod's p2p)."""
        if src == dst:
            return
        if self.local == src:
            self._on_pod(what, lambda b: b.send([t], dst, _MOVE_TAG))
        elif self.local == dst:
            self._on_pod(what, lambda b: b.recv([t], src, _MOVE_TAG))

    def _reduce_flat(self, flat: torch.Tensor, op, root: int) -> None:
        """Reduce of a contiguous 1-D tensor onto group rank `root`, the
        all-reduce's first half: reduce-scatter in the pod (the smallest
        pod's shards, _allreduce_flat), each rail that spans the pods
        reducing its shard onto the root's pod, a gather of the shards onto
        the root in its pod. Every tier moves a rank's share, not the whole
        tensor. Other ranks' tensors are left as they were. Pipelined by
        segments (_pipelined) as the all-reduce is."""
        q, j = self._where[root]
        ro = C10D.ReduceScatterOptions()
        ro.reduceOp = op
        on_rail = self.local < self._min and len(self.pods) > 1

        def start(lo, hi):
            sub = flat[lo:hi]
            _, shard = self._pod_shard(sub, ro, "reduce")
            finish = None
            if on_rail:
                rr = C10D.ReduceOptions()
                rr.reduceOp = op
                rr.rootRank = q
                finish = self._rail_start("reduce", shard, lambda g, x: g.reduce([x], rr))
            return sub, shard, finish

        def end(sub, shard, finish):
            if finish is not None:
                finish()
            if self.pod_index != q:
                return
            got = [torch.empty_like(shard) for _ in range(self.pod_size)] \
                if self.local == j else []
            if self.pod_size == 1:
                got = [shard]
            go = C10D.GatherOptions()
            go.rootRank = j
            self._on_pod("reduce (to the root)",
                         lambda b: b.gather([got] if self.local == j else [], [shard], go))
            if self._rank == root:
                sub.copy_(torch.cat(got)[:sub.numel()])

        self._pipelined(self._segments(flat.numel(), flat.element_size()), start, end)

    def reduce(self, tensors, opts):
        t = _one(tensors, "reduce")
        inter_pod_engine(t.device)
        op, avg = self._op(opts)
        root = opts.rootRank

        def run(flat):
            self._reduce_flat(flat, op, root)
            if avg and self._rank == root:
                _avg_(flat, self._size)

        self._in_place(t, run)
        return _work(tensors)

    def _pod_block(self, rows: torch.Tensor) -> torch.Tensor:
        """rows (pod size x c) padded to the largest pod (largest x c)."""
        if rows.shape[0] == self._max:
            return rows
        out = torch.zeros((self._max,) + tuple(rows.shape[1:]), dtype=rows.dtype,
                          device=rows.device)
        out[:rows.shape[0]].copy_(rows)
        return out

    def _gather_all(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's contiguous 1-D x (one size) as (group size x c), in
        group rank order: all-gather in the pod; the pod's block (padded to
        the largest pod) cut into one piece per rail that spans the pods
        (_rail_pieces), each all-gathered over its rail; an all-gather of
        the pieces in the pod (_pod_pieces). Pipelined by segments of x
        (_pipelined) as the all-reduce is."""
        c = x.numel()
        out = torch.empty((self._size, c), dtype=x.dtype, device=x.device)
        npods = len(self.pods)

        def start(lo, hi):
            w = hi - lo
            mine = torch.empty((self.pod_size, w), dtype=x.dtype, device=x.device)
            if self.pod_size == 1:
                mine[0].copy_(x[lo:hi])
            self._on_pod("all_gather", lambda b: b._allgather_base(
                mine.view(-1), x[lo:hi], C10D.AllgatherOptions()))
            p, pieces = self._rail_pieces(self._max * w)
            rail = torch.zeros((npods, p), dtype=x.dtype, device=x.device)
            finish = None
            if self.local < self._min:
                a, b = pieces[self.local]
                piece = torch.zeros(p, dtype=x.dtype, device=x.device)
                piece[:b - a].copy_(self._pod_block(mine).view(-1)[a:b])
                finish = self._rail_start("all_gather", rail, lambda g, got: g._allgather_base(
                    got.view(-1), piece.to(got.device), C10D.AllgatherOptions()))
            return lo, hi, p, rail, finish

        def end(lo, hi, p, rail, finish):
            if finish is not None:
                finish()
            got = self._pod_pieces(rail.view(-1), "all_gather (the rails' pieces)")
            # got[j] holds piece j of every pod: pod q's block is its
            # pieces in rail order.
            w = hi - lo
            blocks = got.view(self._min, npods, p).transpose(0, 1).reshape(npods, -1)
            blocks = blocks[:, :self._max * w].reshape(npods, self._max, w)
            for q, pod in enumerate(self.pods):
                idx = torch.tensor(pod, device=x.device)
                out[:, lo:hi].index_copy_(0, idx, blocks[q, :len(pod)])

        if c > 0:
            self._pipelined(self._segments(c, x.element_size() * self._size), start, end)
        return out

    def allgather(self, outputs, inputs, opts):
        x = _one(inputs, "all_gather").contiguous().view(-1)
        inter_pod_engine(x.device)
        outs = _outs(outputs, self._size, "all_gather")
        _same_count(outs, x.numel(), self._rank, "all_gather")
        got = self._gather_all(x)
        for r, o in enumerate(outs):
            o.copy_(got[r].view_as(o))
        return _work(outputs)

    def all_gather_single(self, output, input, opts):  # noqa: A002 (torch's name)
        x = input.contiguous().view(-1)
        inter_pod_engine(x.device)
        if output.numel() != self._size * x.numel():
            raise ValueError(f"cxlrt: [Rank {self._rank}] all_gather_into_tensor: the output "
                             f"holds {output.numel()} elements, not {self._size} x "
                             f"{x.numel()}")
        got = self._gather_all(x)
        output.copy_(got.view_as(output))
        return _work([output])

    def _reduce_scatter_flat(self, out: torch.Tensor, flat: torch.Tensor, op, avg) -> None:
        """flat (group size x c) reduced, rank r keeping block r: the
        hierarchical all-reduce of the whole of it, then this rank's block
        (exact for pods of any sizes; it moves the whole tensor in the pod's
        all-gather, where a flat reduce-scatter moves a rank's share)."""
        work = flat.clone()
        self._allreduce_flat(work, op)
        c = out.numel()
        mine = work[self._rank * c:(self._rank + 1) * c]
        if avg:
            mine = mine.clone()
            _avg_(mine, self._size)
        out.copy_(mine.view_as(out))

    def reduce_scatter(self, outputs, inputs, opts):
        out = _one(outputs, "reduce_scatter")
        inter_pod_engine(out.device)
        ins = _outs(inputs, self._size, "reduce_scatter")
        _same_count(ins, out.numel(), self._rank, "reduce_scatter")
        op, avg = self._op(opts)
        flat = torch.cat([i.contiguous().view(-1) for i in ins])
        self._reduce_scatter_flat(out, flat, op, avg)
        return _work(outputs)

    def reduce_scatter_single(self, output, input, opts):  # noqa: A002
        op, avg = self._op(opts)
        inter_pod_engine(output.device)
        if input.numel() != self._size * output.numel():
            raise ValueError(f"cxlrt: [Rank {self._rank}] reduce_scatter_tensor: the input "
                             f"holds {input.numel()} elements, not {self._size} x "
                             f"{output.numel()}")
        self._reduce_scatter_flat(output, input.contiguous().view(-1), op, avg)
        return _work([output])

    def gather(self, outputs, inputs, opts):
        """Gathered in the pod at local rank 0, the pods' blocks (padded to
        the largest pod) over rail 0 to the root's pod, then to the root.
        Pipelined by segments of the tensor (_pipelined): segment k crosses
        the pods while the pods gather segment k + 1 and the root's pod
        hands segment k - 1 to the root."""
        x = _one(inputs, "gather").contiguous().view(-1)
        inter_pod_engine(x.device)
        root = opts.rootRank
        q, j = self._where[root]
        c = x.numel()
        npods = len(self.pods)
        outs = _outs(outputs, self._size, "gather") if self._rank == root else []
        _same_count(outs, c, self._rank, "gather")
        # Each output as a flat view (a buffer copied back at the end where
        # it is not contiguous).
        flats = [o.view(-1) if o.is_contiguous() else
                 torch.empty(o.numel(), dtype=o.dtype, device=o.device) for o in outs]

        def start(lo, hi):
            w = hi - lo
            mine = torch.empty((self.pod_size, w), dtype=x.dtype, device=x.device)
            if self.pod_size == 1:
                mine[0].copy_(x[lo:hi])
            go = C10D.GatherOptions()
            go.rootRank = 0
            part = x[lo:hi]
            self._on_pod("gather", lambda b: b.gather([list(mine.unbind(0))] if self.local == 0
                                                      else [], [part], go))
            blocks = torch.empty((npods, self._max, w), dtype=x.dtype, device=x.device)
            finish = None
            if self.local == 0:
                block = self._pod_block(mine)
                if npods == 1:
                    blocks[0].copy_(block)
                else:
                    ro = C10D.GatherOptions()
                    ro.rootRank = q
                    if self.pod_index == q:
                        finish = self._rail_start("gather", blocks, lambda g, out: g.gather(
                            [list(out.unbind(0))], [block.to(out.device)], ro))
                    else:
                        finish = self._rail_start("gather", block,
                                                  lambda g, y: g.gather([], [y], ro))
            return lo, hi, blocks, finish

        def end(lo, hi, blocks, finish):
            if finish is not None:
                finish()
            if self.pod_index == q:
                self._move_in_pod(blocks, 0, j, "gather (to the root)")
            if self._rank == root:
                for qq, p in enumerate(self.pods):
                    for jj, r in enumerate(p):
                        flats[r][lo:hi].copy_(blocks[qq, jj])

        if c > 0:
            self._pipelined(self._segments(c, x.element_size() * self._size), start, end)
        for o, f in zip(outs, flats):
            if f.data_ptr() != o.data_ptr():
                o.copy_(f.view_as(o))
        return _work(outputs)

    def scatter(self, outputs, inputs, opts):
        """The root's tensors to its pod's local rank 0, over rail 0 to each
        pod's local rank 0 (a block padded to the largest pod), scattered in
        the pod. Pipelined by segments of the tensor (_pipelined) as gather
        is."""
        out = _one(outputs, "scatter")
        inter_pod_engine(out.device)
        root = opts.rootRank
        q, j = self._where[root]
        c = out.numel()
        npods = len(self.pods)
        ins = _outs(inputs, self._size, "scatter") if self._rank == root else []
        _same_count(ins, c, self._rank, "scatter")
        flat = out.contiguous().view(-1)

        def start(lo, hi):
            w = hi - lo
            blocks = torch.zeros((npods, self._max, w), dtype=out.dtype, device=out.device)
            if self._rank == root:
                for qq, p in enumerate(self.pods):
                    for jj, r in enumerate(p):
                        blocks[qq, jj].copy_(ins[r].contiguous().view(-1)[lo:hi])
            if self.pod_index == q:
                self._move_in_pod(blocks, j, 0, "scatter (from the root)")
            mine = torch.empty((self._max, w), dtype=out.dtype, device=out.device)
            finish = None
            if self.local == 0:
                if npods == 1:
                    mine.copy_(blocks[0])
                else:
                    so = C10D.ScatterOptions()
                    so.rootRank = q
                    if self.pod_index == q:
                        src = list(blocks.unbind(0))
                        finish = self._rail_start("scatter", mine, lambda g, y: g.scatter(
                            [y], [[s.to(y.device) for s in src]], so))
                    else:
                        finish = self._rail_start("scatter", mine,
                                                  lambda g, y: g.scatter([y], [], so))
            return lo, hi, mine, finish

        def end(lo, hi, mine, finish):
            if finish is not None:
                finish()
            part = flat[lo:hi]
            if self.pod_size == 1:
                part.copy_(mine[0])
            po = C10D.ScatterOptions()
            po.rootRank = 0
            self._on_pod("scatter", lambda b: b.scatter(
                [part], [list(mine[:self.pod_size].unbind(0))] if self.local == 0 else [], po))

        if c > 0:
            self._pipelined(self._segments(c, out.element_size() * self._size), start, end)
        if flat.data_ptr() != out.data_ptr():
            out.copy_(flat.view_as(out))
        return _work(outputs)

    def barrier(self, opts):
        """In the pod, over rail 0 (always Gloo's, made with the group: a
        barrier has no tensor, whatever the engine knob says), in the pod
        again: no rank leaves before every rank has come."""
        self._on_pod("barrier", lambda b: b.barrier(C10D.BarrierOptions()))
        if self.local == 0 and len(self.pods) > 1:
            group, _ = self._engines[("gloo", "rail")]
            try:
                group.allreduce([torch.zeros(1)], C10D.AllreduceOptions()).wait()
            except Exception as e:
                self._abort()
                raise RuntimeError(f"cxlrt: [Rank {self._rank}] barrier between pods (gloo, "
                                   f"rail): {e}") from e
        self._on_pod("barrier", lambda b: b.barrier(C10D.BarrierOptions()))
        return _work([])

    # --- all-to-all and point to point: the pod's part and the cross part ---

    def _alltoall_flat(self, out: torch.Tensor, x: torch.Tensor, out_counts, in_counts) -> None:
        """all_to_all_v of contiguous 1-D tensors, counts in elements per
        group rank: the part between ranks of one pod over the pool (the
        pod's all_to_all_single, its peers in other pods given 0), the part
        between pods over the cross group (peers in my pod given 0), the two
        at once; every byte moves once, over its own tier."""
        n = self._size
        in_displ = [0] * n
        out_displ = [0] * n
        for r in range(1, n):
            in_displ[r] = in_displ[r - 1] + in_counts[r - 1]
            out_displ[r] = out_displ[r - 1] + out_counts[r - 1]
        pod = self.pods[self.pod_index]
        # The cross part (peers of other pods) starts first and runs in the
        # engine's threads while this thread runs the pod's part.
        mine = set(pod)
        ci = [0 if r in mine else in_counts[r] for r in range(n)]
        co = [0 if r in mine else out_counts[r] for r in range(n)]
        cin = torch.cat([x[in_displ[r]:in_displ[r] + ci[r]] for r in range(n)])
        cout = torch.empty(sum(co), dtype=x.dtype, device=x.device)
        a = cin.cpu() if self._staged(x) else cin
        finish = self._rail_start("all_to_all", cout, lambda g, b: g.alltoall_base(
            b, a, co, ci, C10D.AllToAllOptions()), kind="cross")
        # The pod's part: its ranks in local order.
        if self.pod_size > 1:
            pin = torch.cat([x[in_displ[r]:in_displ[r] + in_counts[r]] for r in pod])
            pout = torch.empty(sum(out_counts[r] for r in pod), dtype=x.dtype, device=x.device)
            pi = [in_counts[r] for r in pod]
            po = [out_counts[r] for r in pod]
            self._on_pod("all_to_all", lambda b: b.alltoall_base(pout, pin, po, pi,
                                                                 C10D.AllToAllOptions()))
            at = 0
            for r in pod:
                out[out_displ[r]:out_displ[r] + out_counts[r]].copy_(pout[at:at + out_counts[r]])
                at += out_counts[r]
        else:
            r = self._rank
            out[out_displ[r]:out_displ[r] + out_counts[r]].copy_(
                x[in_displ[r]:in_displ[r] + in_counts[r]])
        finish()
        at = 0
        for r in range(n):
            if co[r]:
                out[out_displ[r]:out_displ[r] + co[r]].copy_(cout[at:at + co[r]])
                at += co[r]

    def all_to_all_single(self, output, input, output_splits, input_splits, opts):  # noqa: A002
        n = self._size
        inter_pod_engine(input.device)
        rows_in = input.shape[0] if input.dim() else 1
        rows_out = output.shape[0] if output.dim() else 1
        row_in = input.numel() // rows_in if rows_in else 0
        row_out = output.numel() // rows_out if rows_out else 0

        def counts(splits, rows, row, which):
            if not splits:
                if rows % n:
                    raise ValueError(f"cxlrt: [Rank {self._rank}] all_to_all_single: the "
                                     f"{which} has {rows} rows, not a multiple of {n}")
                return [rows // n * row] * n
            if len(splits) != n or any(s < 0 for s in splits) or sum(splits) != rows:
                raise ValueError(f"cxlrt: [Rank {self._rank}] all_to_all_single: {which} "
                                 f"split sizes {list(splits)} must be {n} counts summing to "
                                 f"its {rows} rows")
            return [s * row for s in splits]

        ic = counts(input_splits, rows_in, row_in, "input")
        oc = counts(output_splits, rows_out, row_out, "output")
        flat_out = output.contiguous().view(-1)
        self._alltoall_flat(flat_out, input.contiguous().view(-1), oc, ic)
        if flat_out.data_ptr() != output.data_ptr():
            output.copy_(flat_out.view_as(output))
        return _work([output])

    def alltoall(self, outputs, inputs, opts):
        outs = _outs([outputs], self._size, "all_to_all")
        ins = _outs([inputs], self._size, "all_to_all")
        dtype = ins[0].dtype
        inter_pod_engine(ins[0].device)
        if any(t.dtype != dtype for t in list(ins) + list(outs)):
            raise ValueError(f"cxlrt: [Rank {self._rank}] all_to_all: tensors of more than "
                             "one element type")
        x = torch.cat([t.contiguous().view(-1) for t in ins])
        out = torch.empty(sum(t.numel() for t in outs), dtype=dtype, device=x.device)
        self._alltoall_flat(out, x, [t.numel() for t in outs], [t.numel() for t in ins])
        at = 0
        for t in outs:
            t.copy_(out[at:at + t.numel()].view_as(t))
            at += t.numel()
        return _work(outputs)

    def _p2p(self, send: bool, tensors, peer: int, tag: int):
        t = _one(tensors, "send" if send else "recv")
        if not 0 <= peer < self._size or peer == self._rank:
            raise ValueError(f"cxlrt: [Rank {self._rank}] {'send to' if send else 'recv from'} "
                             f"rank {peer}: not another rank of this group of {self._size}")
        q, j = self._where[peer]
        what = f"{'send to' if send else 'recv from'} rank {peer}"
        if q == self.pod_index:
            return self._pod.send([t], j, tag) if send else self._pod.recv([t], j, tag)
        group, ranks = self._engine_group(t.device, "cross")
        if self._staged(t):
            host = t.cpu()
            try:
                w = group.send([host], peer, tag) if send else group.recv([host], peer, tag)
                w.wait()
            except Exception as e:
                raise RuntimeError(f"cxlrt: [Rank {self._rank}] {what} between pods: {e}") from e
            if not send:
                t.copy_(host)
            return _work([t])
        try:
            return group.send([t], peer, tag) if send else group.recv([t], peer, tag)
        except Exception as e:
            raise RuntimeError(f"cxlrt: [Rank {self._rank}] {what} between pods: {e}") from e

    def recv_anysource(self, tensors, tag):
        raise ValueError(f"cxlrt: [Rank {self._rank}] recv from any source is not supported in "
                         f"a group across pods ({describe(self.pods)}): name the sender")

    def allreduce_coalesced(self, tensors, opts):
        """Tensors of one type and device reduced as one flat buffer."""
        if not tensors:
            return _work(tensors)
        if any(t.dtype != tensors[0].dtype or t.device != tensors[0].device for t in tensors):
            raise ValueError(f"cxlrt: [Rank {self._rank}] all_reduce_coalesced: tensors of "
                             "more than one type or device")
        op, avg = self._op(opts)
        inter_pod_engine(tensors[0].device)
        flat = torch.cat([t.contiguous().view(-1) for t in tensors])
        self._allreduce_flat(flat, op)
        if avg:
            _avg_(flat, self._size)
        at = 0
        for t in tensors:
            t.copy_(flat[at:at + t.numel()].view_as(t))
            at += t.numel()
        return _work(tensors)

    def send(self, tensors, dst, tag):
        return self._p2p(True, tensors, dst, tag)

    def recv(self, tensors, src, tag):
        return self._p2p(False, tensors, src, tag)


# The element types of the pod tier (the C++ backend's), checked before any
# tier runs, as the reductions are.
_ELEMENT_TYPES = (torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16,
                  torch.bfloat16, torch.float32, torch.float64)


def _typed(t, call):
    if t.dtype not in _ELEMENT_TYPES:
        raise ValueError(f"cxlrt: {call}: no element type for {t.dtype} (int8, uint8, int32, "
                         "int64, float16, bfloat16, float32, float64)")
    return t


def _one(tensors, call):
    if len(tensors) != 1:
        raise ValueError(f"cxlrt: {call}: expected one tensor, got {len(tensors)}")
    return _typed(tensors[0], call)


def _outs(lists, size, call):
    if len(lists) != 1 or len(lists[0]) != size:
        raise ValueError(f"cxlrt: {call}: expected one list of {size} tensors")
    for t in lists[0]:
        _typed(t, call)
    return lists[0]


def _avg_(t, size):
    """The sum in t divided by the group size in place; integers truncated
    toward zero, as the pod tier's avg (C++ division) does."""
    if t.is_floating_point() or t.is_complex():
        t.div_(size)
    else:
        t.copy_(torch.div(t, size, rounding_mode="trunc"))


def _same_count(tensors, count, rank, call):
    for i, t in enumerate(tensors):
        if t.numel() != count:
            raise ValueError(f"cxlrt: [Rank {rank}] {call}: tensor {i} of the list holds "
                             f"{t.numel()} elements, not {count}")


def describe(pods) -> str:
    return " + ".join(str(len(p)) for p in pods) + f" ranks in {len(pods)} pods"


__all__ = ["PodsBackend", "discover", "inter_pod_engine", "describe"]
