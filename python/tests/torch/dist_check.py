"""Run under torchrun: every collective of the "cxlrt" torch.distributed
backend, compared with Gloo's result on the same inputs (and with a
reference computed here where Gloo lacks the call), sync and async.
CXLRT_TORCH_CHECK_DEVICE=cuda: cxlrt's tensors are CUDA tensors (one GPU per
rank, or shared), Gloo's stay on the CPU."""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import cxlrt.torch_backend  # noqa: F401  (registers "cxlrt")

DEVICE = os.environ.get("CXLRT_TORCH_CHECK_DEVICE", "cpu")
if DEVICE == "cuda":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    torch.set_default_device("cuda")  # every tensor made below, but Gloo's

# Two minutes, not torch's thirty: ranks that a failed check leaves at
# different calls fail the run within it instead of hanging until ctest's
# timeout.
dist.init_process_group("cxlrt", timeout=timedelta(seconds=120))
rank, n = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo", timeout=timedelta(seconds=120))
checked = []


def value(r, count, dtype):
    x = (torch.arange(count, dtype=torch.float64) * 3 + r * 7) % 11 - 5
    return x.to(dtype)


def same(name, got, want):
    assert DEVICE == "cpu" or name.endswith(" ref") or got.device.type == DEVICE, got.device
    got, want = got.cpu(), want.cpu()
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[:3].flatten().tolist()
        raise AssertionError(f"rank {rank}: {name}: differs at {bad}: {got.flatten()[:6]} vs "
                             f"{want.flatten()[:6]}")
    checked.append(name)


def run_both(name, fn):
    """fn(group) -> tensor result; compares cxlrt's with Gloo's."""
    a = fn(None)
    try:
        with torch.device("cpu"):
            b = fn(gloo)
    except RuntimeError as e:  # Gloo lacks it: the caller's reference decides
        return a, None
    same(name, a, b)
    return a, b


for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16,
              torch.float16, torch.int8, torch.uint8):
    for count in (1, 1000, 300_001):
        ops = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
        if dtype in (torch.float32, torch.float64, torch.int64):
            ops.append(dist.ReduceOp.PRODUCT)
        for op in ops:
            def all_reduce(g, op=op):
                t = value(rank, count, dtype)
                dist.all_reduce(t, op=op, group=g)
                return t
            got, gl = run_both(f"all_reduce {dtype} {count} {op}", all_reduce)
            if gl is None:
                raise AssertionError(f"Gloo could not all_reduce {dtype} {op}")

count = 4097
for root in range(n):
    def broadcast(g):
        t = value(rank, count, torch.float32)
        dist.broadcast(t, src=root, group=g)
        return t
    got, _ = run_both(f"broadcast root {root}", broadcast)
    same("broadcast ref", got, value(root, count, torch.float32))

    def reduce(g):
        t = value(rank, count, torch.int64)
        dist.reduce(t, dst=root, group=g)
        return t if rank == root else torch.zeros(0)
    got, _ = run_both(f"reduce root {root}", reduce)
    if rank == root:
        same("reduce ref", got, sum(value(r, count, torch.int64) for r in range(n)))

    def gather(g):
        t = value(rank, count, torch.float64)
        out = [torch.empty_like(t) for _ in range(n)] if rank == root else None
        dist.gather(t, out, dst=root, group=g)
        return torch.stack(out) if rank == root else torch.zeros(0)
    got, _ = run_both(f"gather root {root}", gather)
    if rank == root:
        same("gather ref", got, torch.stack([value(r, count, torch.float64) for r in range(n)]))

    def scatter(g):
        out = torch.empty(count, dtype=torch.int32)
        ins = [value(r, count, torch.int32) for r in range(n)] if rank == root else None
        dist.scatter(out, ins, src=root, group=g)
        return out
    got, _ = run_both(f"scatter root {root}", scatter)
    same("scatter ref", got, value(rank, count, torch.int32))


def all_gather(g):
    t = value(rank, count, torch.bfloat16)
    out = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(out, t, group=g)
    return torch.stack(out)
got, _ = run_both("all_gather", all_gather)
same("all_gather ref", got, torch.stack([value(r, count, torch.bfloat16) for r in range(n)]))


def all_gather_into_tensor(g):
    t = value(rank, count, torch.float32)
    out = torch.empty(n * count, dtype=torch.float32)
    dist.all_gather_into_tensor(out, t, group=g)
    return out
got, _ = run_both("all_gather_into_tensor", all_gather_into_tensor)
same("all_gather_into_tensor ref", got, torch.cat([value(r, count, torch.float32)
                                                   for r in range(n)]))

# reduce_scatter: Gloo has no reduce_scatter; the reference is computed here.
for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
    ins = [value(rank * n + j, count, torch.float32) for j in range(n)]
    out = torch.empty(count, dtype=torch.float32)
    dist.reduce_scatter(out, ins, op=op)
    parts = torch.stack([value(r * n + rank, count, torch.float32) for r in range(n)])
    want = parts.sum(0) if op == dist.ReduceOp.SUM else parts.max(0).values
    same(f"reduce_scatter {op}", out, want)
    flat = torch.cat(ins)
    out2 = torch.empty(count, dtype=torch.float32)
    dist.reduce_scatter_tensor(out2, flat, op=op)
    same(f"reduce_scatter_tensor {op}", out2, want)


def all_to_all_single(g):
    t = value(rank, n * count, torch.int64)
    out = torch.empty_like(t)
    dist.all_to_all_single(out, t, group=g)
    return out
got, _ = run_both("all_to_all_single", all_to_all_single)
want = torch.cat([value(r, n * count, torch.int64)[rank * count:(rank + 1) * count]
                  for r in range(n)])
same("all_to_all_single ref", got, want)

ins = [value(rank * n + j, 33, torch.float64) for j in range(n)]
outs = [torch.empty(33, dtype=torch.float64) for _ in range(n)]
dist.all_to_all(outs, ins)
same("all_to_all", torch.stack(outs), torch.stack([value(r * n + rank, 33, torch.float64)
                                                   for r in range(n)]))

# Async handles: several in flight, then wait; a future.
ts = [value(rank + i, 100_000, torch.float32) for i in range(4)]
works = [dist.all_reduce(t, async_op=True) for t in ts]
for i, (t, w) in enumerate(zip(ts, works)):
    w.wait()
    same(f"async all_reduce {i}", t, sum(value(r + i, 100_000, torch.float32) for r in range(n)))
t = value(rank, 10, torch.float64)
fut = dist.all_reduce(t, async_op=True).get_future()
fut.wait()
same("future", t, sum(value(r, 10, torch.float64) for r in range(n)))
# A future asked for after the work finished (made on demand) is complete,
# holds the call's result, and chains.
t = value(rank, 10, torch.float64)
w = dist.all_reduce(t, async_op=True)
w.wait()
late = w.get_future()
assert late.done(), "the future of a finished work is not done"
same("late future", late.value()[0], sum(value(r, 10, torch.float64) for r in range(n)))
same("future.then", late.then(lambda f: f.value()[0] * 2).wait(),
     2 * sum(value(r, 10, torch.float64) for r in range(n)))

# Send / recv around a ring; barrier.
msg = value(rank, 70_000, torch.float32)
got = torch.empty_like(msg)
nxt, prv = (rank + 1) % n, (rank - 1) % n
if rank % 2 == 0:
    dist.send(msg, nxt)
    dist.recv(got, prv)
else:
    dist.recv(got, prv)
    dist.send(msg, nxt)
same("send/recv", got, value(prv, 70_000, torch.float32))
dist.barrier()

# --- Parity with Gloo beyond the basic collectives (issues 25 and 31). Each
# part runs on its own and reports its failure; all must pass. ---
import re
import traceback

TIMEOUT_PATTERN = re.compile(" (Timed out|closed|timeout) ")  # torch's, case-sensitive
failed_parts = []


def part(fn):
    try:
        fn()
    except Exception:  # noqa: BLE001  (every part reports; the run fails at the end)
        failed_parts.append(fn.__name__)
        print(f"rank {rank}: {fn.__name__} FAILED:\n{traceback.format_exc()}", flush=True)
    dist.barrier(group=gloo)  # the next part starts together, whatever happened
    return fn


def splits(src):
    """Rows rank `src` sends to each rank: uneven, zeros among them."""
    return [(src * 3 + j * 2 + 1) % 4 for j in range(n)]


@part
def uneven_all_to_all_single():
    for dtype, cols, scale in ((torch.float32, 5, 1), (torch.int64, 1, 1), (torch.bfloat16, 3, 1),
                               (torch.float64, 64, 700), (torch.int8, 7, 50)):
        ins = [s * scale for s in splits(rank)]
        outs = [splits(j)[rank] * scale for j in range(n)]

        def a2a(g):
            t = value(rank, sum(ins) * cols, dtype).view(-1, cols)
            out = torch.full((sum(outs), cols), -9, dtype=dtype)
            dist.all_to_all_single(out, t, outs, ins, group=g)
            return out
        got, gl = run_both(f"all_to_all_single uneven {dtype} x{scale}", a2a)
        assert gl is not None, "Gloo could not all_to_all_single with split sizes"
        want = []
        for j in range(n):
            src = [s * scale for s in splits(j)]
            rows = value(j, sum(src) * cols, dtype).view(-1, cols)
            want.append(rows[sum(src[:rank]):sum(src[:rank]) + src[rank]])
        same(f"all_to_all_single uneven {dtype} x{scale} ref", got, torch.cat(want))
    # Only the input split sizes given: the output splits evenly.
    def a2a_in_only(g):
        t = value(rank, 3 * n, torch.float32)
        out = torch.empty(3 * n, dtype=torch.float32)
        dist.all_to_all_single(out, t, None, [3] * n, group=g)
        return out
    run_both("all_to_all_single input splits only", a2a_in_only)


@part
def uneven_all_to_all_lists():
    def count(src, dst):
        return (src * 5 + dst * 3 + 1) % 4 * 17

    def a2a(g):
        ins = [value(rank * n + j, count(rank, j), torch.float64) for j in range(n)]
        outs = [torch.full((count(j, rank),), -9.0, dtype=torch.float64) for j in range(n)]
        dist.all_to_all(outs, ins, group=g)
        return torch.cat(outs)
    got, _ = run_both("all_to_all uneven lists", a2a)  # Gloo lacks all_to_all of lists
    same("all_to_all uneven lists ref",
         got, torch.cat([value(j * n + rank, count(j, rank), torch.float64) for j in range(n)]))


@part
def coalesced_calls():
    sizes = (1, 0, 1000, 7)
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16):
        ops = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
        if dtype in (torch.float32, torch.float64, torch.int64):
            ops.append(dist.ReduceOp.PRODUCT)
        for op in ops:
            def arc(g, op=op, dtype=dtype):
                ts = [value(rank + i, c, dtype) for i, c in enumerate(sizes)]
                dist.all_reduce_coalesced(ts, op=op, group=g)
                return torch.cat(ts)
            got, gl = run_both(f"all_reduce_coalesced {dtype} {op}", arc)
            assert gl is not None, f"Gloo could not all_reduce_coalesced {dtype} {op}"

        def agc(g, dtype=dtype):
            ins = [value(rank + i, c, dtype) for i, c in enumerate(sizes)]
            outs = [[torch.empty(c, dtype=dtype) for c in sizes] for _ in range(n)]
            dist.all_gather_coalesced(outs, ins, group=g)
            return torch.cat([t for lst in outs for t in lst])
        got, gl = run_both(f"all_gather_coalesced {dtype}", agc)
        assert gl is not None, "Gloo could not all_gather_coalesced"
        same(f"all_gather_coalesced {dtype} ref", got,
             torch.cat([value(r + i, c, dtype) for r in range(n) for i, c in enumerate(sizes)]))

    def complex_sum(g):
        ts = [torch.complex(value(rank, 9, torch.float32), value(rank + 1, 9, torch.float32)),
              torch.zeros(0, dtype=torch.complex64)]
        dist.all_reduce_coalesced(ts, group=g)
        return torch.view_as_real(torch.cat(ts))
    run_both("all_reduce_coalesced complex64", complex_sum)

    # all_gather_into_tensor and reduce_scatter_tensor coalesced (the
    # coalescing manager's fast path).
    for dtype in (torch.float32, torch.int64):
        def agit(g, dtype=dtype):
            ins = [value(rank + i, c, dtype) for i, c in enumerate(sizes)]
            outs = [torch.empty(n * c, dtype=dtype) for c in sizes]
            with dist._coalescing_manager(group=g):
                for o, t in zip(outs, ins):
                    dist.all_gather_into_tensor(o, t, group=g)
            return torch.cat(outs)
        got, _ = run_both(f"all_gather_into_tensor coalesced {dtype}", agit)
        same(f"all_gather_into_tensor coalesced {dtype} ref", got,
             torch.cat([torch.cat([value(r + i, c, dtype) for r in range(n)])
                        for i, c in enumerate(sizes)]))
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
            def rst(g, dtype=dtype, op=op):
                ins = [value(rank * 10 + i, n * c, dtype) for i, c in enumerate(sizes)]
                outs = [torch.empty(c, dtype=dtype) for c in sizes]
                with dist._coalescing_manager(group=g):
                    for o, t in zip(outs, ins):
                        dist.reduce_scatter_tensor(o, t, op=op, group=g)
                return torch.cat(outs)
            got, _ = run_both(f"reduce_scatter_tensor coalesced {dtype} {op}", rst)  # not in Gloo
            want = []
            for i, c in enumerate(sizes):
                parts = torch.stack([value(r * 10 + i, n * c, dtype)[rank * c:(rank + 1) * c]
                                     for r in range(n)])
                want.append(parts.sum(0) if op == dist.ReduceOp.SUM else
                            parts.min(0).values if op == dist.ReduceOp.MIN else parts.max(0).values)
            same(f"reduce_scatter_tensor coalesced {dtype} {op} ref", got, torch.cat(want))


@part
def sparse_all_reduce():
    def sparse(r, dense_cols):
        nnz = 0 if r == 1 else r + 2  # rank 1 has none
        idx = torch.stack([torch.arange(nnz) % (n + 1), (torch.arange(nnz) * (r + 1)) % 4])
        vals = value(r, nnz * dense_cols, torch.float32)
        vals = vals.view(nnz, dense_cols) if dense_cols > 1 else vals
        shape = (n + 1, 4, dense_cols) if dense_cols > 1 else (n + 1, 4)
        return torch.sparse_coo_tensor(idx, vals, shape)
    for cols in (1, 3):
        def ar(g, cols=cols):
            t = sparse(rank, cols)
            dist.all_reduce(t, group=g)
            assert t.is_sparse
            return t.to_dense()
        got, gl = run_both(f"sparse all_reduce cols {cols}", ar)
        assert gl is not None, "Gloo could not all_reduce a sparse tensor"
        same(f"sparse all_reduce cols {cols} ref", got,
             sum(sparse(r, cols).to_dense() for r in range(n)))
    try:
        dist.all_reduce(sparse(rank, 1), op=dist.ReduceOp.MAX)
        raise AssertionError("a sparse max all_reduce did not fail")
    except ValueError as e:
        assert "sparse" in str(e) and f"[Rank {rank}] all_reduce" in str(e), e
    # (Other calls never reach a backend with a sparse tensor: torch's
    # dispatcher has no sparse kernel of them, for Gloo as for cxlrt.)


@part
def timeout_messages():
    # A barrier only rank 0 enters: a timeout worded as torch's backends
    # word theirs, naming the rank and the call, on cxlrt as on Gloo.
    # (3 s: the ranks must join within it on a loaded machine. Gloo's group
    # connects with its default timeout and is given 3 s after.)
    short = dist.new_group(backend="cxlrt", timeout=timedelta(seconds=3))
    short_gloo = dist.new_group(backend="gloo")
    dist.distributed_c10d.set_timeout(timedelta(seconds=3), short_gloo)
    if rank == 0:
        for name, g in (("gloo", short_gloo), ("cxlrt", short)):
            try:
                dist.barrier(group=g)
                raise AssertionError(f"{name}: a barrier without the other ranks completed")
            except RuntimeError as e:
                msg = str(e)
                assert TIMEOUT_PATTERN.search(msg), f"{name}: {msg!r} does not match torch's pattern"
                if name == "cxlrt":
                    assert "[Rank 0] barrier" in msg, msg
    dist.barrier(group=gloo)
    # The group's communicator is made at its first collective, which only
    # rank 0 entered: the other ranks' first call fails too (within the
    # group's timeout), naming the rank and the call.
    if rank != 0:
        try:
            dist.all_reduce(torch.ones(2), group=short)
            raise AssertionError("an all_reduce on an aborted communicator completed")
        except RuntimeError as e:
            assert f"[Rank {rank}] all_reduce" in str(e), e


@part
def monitored_barriers():
    late = n - 1
    absent = [r for r in range(1, n) if r % 2 == 1]  # wait_all_ranks: every one named
    for name, backend in (("gloo", "gloo"), ("cxlrt", "cxlrt")):
        # Fresh groups: a failed monitored barrier leaves its ranks at different calls.
        g1 = dist.new_group(backend=backend)
        g2 = dist.new_group(backend=backend)
        if backend == "gloo":  # its ranks but 0 wait for rank 0's answer this long
            for g in (g1, g2):
                dist.distributed_c10d.set_timeout(timedelta(seconds=5), g)
        dist.monitored_barrier(group=g1, timeout=timedelta(seconds=10))  # everyone: passes
        if rank != late:
            try:
                dist.monitored_barrier(group=g1, timeout=timedelta(seconds=1))
                raise AssertionError(f"{name}: a monitored barrier without rank {late} passed")
            except RuntimeError as e:
                if rank == 0:
                    assert f"Rank {late} failed to pass monitoredBarrier" in str(e), (name, e)
        if rank not in absent:
            try:
                dist.monitored_barrier(group=g2, timeout=timedelta(seconds=1), wait_all_ranks=True)
                raise AssertionError(f"{name}: a monitored barrier without ranks {absent} passed")
            except RuntimeError as e:
                want = ", ".join(map(str, absent))
                if rank == 0:
                    assert f"Ranks {want} failed to pass monitoredBarrier" in str(e), (name, e)
        dist.barrier(group=gloo)


@part
def overlapping_buffers():
    # An output that overlaps the input other than in NCCL's in-place form
    # (this rank's part) still gets the input's values: the backend reads
    # the input before writing (review of issue 25: wrong bytes, no error).
    N = 6
    buf = torch.zeros(n * N + 1)
    buf[:n * N] = value(rank, n * N, torch.float32)
    want = sum(value(r, n * N, torch.float32) for r in range(n))[rank * N:(rank + 1) * N]
    dist.reduce_scatter_tensor(buf[1:1 + N], buf[:n * N])
    same("reduce_scatter_tensor, output shifted into the input ref", buf[1:1 + N], want)
    buf = torch.zeros(n * N + 1)
    buf[1:1 + N] = value(rank, N, torch.float32)
    dist.all_gather_into_tensor(buf[:n * N], buf[1:1 + N])
    same("all_gather_into_tensor, input shifted into the output ref", buf[:n * N],
         torch.cat([value(r, N, torch.float32) for r in range(n)]))
    # NCCL's in-place forms, unchanged.
    buf = value(rank, n * N, torch.float32)
    dist.reduce_scatter_tensor(buf[rank * N:(rank + 1) * N], buf.clone())
    mine = buf[rank * N:(rank + 1) * N].clone()
    buf = value(rank, n * N, torch.float32)
    dist.reduce_scatter_tensor(buf[rank * N:(rank + 1) * N], buf)
    same("reduce_scatter_tensor in place ref", buf[rank * N:(rank + 1) * N], mine)
    buf = torch.zeros(n * N)
    buf[rank * N:(rank + 1) * N] = value(rank, N, torch.float32)
    dist.all_gather_into_tensor(buf, buf[rank * N:(rank + 1) * N])
    same("all_gather_into_tensor in place ref", buf,
         torch.cat([value(r, N, torch.float32) for r in range(n)]))


if failed_parts:
    raise SystemExit(f"rank {rank}: parts failed: {', '.join(failed_parts)}")

# Bad input is an error, not a crash.
try:
    dist.all_reduce(torch.ones(3, dtype=torch.int16))  # cxlrt has no int16
    raise AssertionError("an int16 all_reduce did not fail")
except (RuntimeError, ValueError, TypeError) as e:
    assert "cxlrt" in str(e), e

dist.destroy_process_group()
if rank == 0:
    print(f"cxlrt torch backend, {n} ranks, {DEVICE} tensors: {len(checked)} checks passed "
          f"(Gloo compared where it has the call)")
sys.exit(0)
