"""Run under torchrun: every collective of the "cxlrt" torch.distributed
backend, compared with Gloo's result on the same inputs (and with a
reference computed here where Gloo lacks the call), sync and async.
CXLRT_TORCH_CHECK_DEVICE=cuda: cxlrt's tensors are CUDA tensors (one GPU per
rank, or shared), Gloo's stay on the CPU."""

import os
import sys

import torch
import torch.distributed as dist

import cxlrt.torch_backend  # noqa: F401  (registers "cxlrt")

DEVICE = os.environ.get("CXLRT_TORCH_CHECK_DEVICE", "cpu")
if DEVICE == "cuda":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    torch.set_default_device("cuda")  # every tensor made below, but Gloo's

dist.init_process_group("cxlrt")
rank, n = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
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
