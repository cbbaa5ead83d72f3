"""PyTorch Gloo side of bench/compare/collectives.sh: all_reduce,
all_gather and broadcast of float32 at nccl-tests' sizes, one JSON object
per size on rank 0's stdout. Gloo is initialised from a file (torch 1.13's
TCPStore listens on every interface) and pinned to the loopback device.

Usage: python3 gloo_coll.py COLLECTIVE RANKS MIN MAX FACTOR ITERS WARMUP"""
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def bus_factor(coll, n):
    return 2.0 * (n - 1) / n if coll == "allreduce" else (1.0 if coll == "broadcast" else (n - 1) / n)


def worker(rank, n, init_file, coll, lo, hi, factor, iters, warmup):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=n)
    torch.set_num_threads(1)
    size = lo
    while size <= hi:
        total = max(size // 4, n)
        x = torch.ones(total, dtype=torch.float32)
        parts = [torch.empty(total // n, dtype=torch.float32) for _ in range(n)]
        mine = torch.ones(total // n, dtype=torch.float32)

        def call():
            if coll == "allreduce":
                dist.all_reduce(x)
            elif coll == "allgather":
                dist.all_gather(parts, mine)
            else:
                dist.broadcast(x, 0)

        for _ in range(warmup):
            call()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        us = torch.tensor([(time.perf_counter() - t0) * 1e6 / iters], dtype=torch.float64)
        dist.all_reduce(us, op=dist.ReduceOp.MAX)
        if rank == 0:
            algbw = total * 4 / (us.item() * 1e3)
            print(json.dumps({"peer": "gloo", "collective": coll, "ranks": n, "bytes": size,
                              "time_us": us.item(), "busbw_gbps": algbw * bus_factor(coll, n)}),
                  flush=True)
        size *= factor
    dist.destroy_process_group()


def main():
    coll, n, lo, hi, factor, iters, warmup = sys.argv[1], *map(int, sys.argv[2:8])
    fd, init_file = tempfile.mkstemp(prefix="gloo-init-")
    os.close(fd)
    os.unlink(init_file)
    mp.spawn(worker, args=(n, init_file, coll, lo, hi, factor, iters, warmup), nprocs=n)


if __name__ == "__main__":
    main()
