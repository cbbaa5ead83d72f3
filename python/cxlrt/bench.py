"""Benchmarks of the Python side, each beside its peer in the same run:

python -m cxlrt.bench kv: what the Python binding costs. KV BatchPut /
BatchGet of 16 KiB - 2 MiB blocks through the Python API, beside the same
batches looped in C++ inside the extension (same store, keys and buffers),
on a fresh emulated pool; the overhead is the difference.

python -m cxlrt.bench paged: what gathering a paged KV block costs. Blocks
of a paged cache (per layer [K/V, blocks, page], as vLLM lays it out) put
and got with batch_put_paged / batch_get_paged, one value per block of
every layer's pages, beside what a connector without parts does (gather
the pages into a staging buffer, then put it; get it, then scatter) and
beside values of the same size that are in one buffer already.

python -m cxlrt.bench torch: the torch.distributed "cxlrt" backend's
all_reduce beside Gloo's, 2 ranks, 64 KiB - 64 MiB (needs torch): busbw, and
the time of one call beside torch's own dispatch floor, the built-in "fake"
backend's (a group that does no communication) in the same processes:
cxlrt/fake is the backend's overhead as a multiple of torch's (issue 25
asks for at most 2 from 8 B to 64 KiB: `-b 8 -e 64K`); no-FR/fake the same
for a cxlrt group without the flight-recorder hook torch attaches to
out-of-tree backends.

python -m cxlrt.bench torchpods: the backend across pods (docs/python.md,
"Across pods"): all_reduce of a group of P emulated pods x K ranks (a pool
per pod, Gloo between pods), beside flat Gloo over the same ranks and a
cxlrt group of the same ranks in one pool holding them all, in the same
processes: busbw and the ratios hier/gloo and hier/one-pool, and
hier/nopipe: the same group with its all-reduce's pipeline off.

python -m cxlrt.bench startup: what a group costs to start. Fresh
processes (2 and 4 ranks) time init_process_group plus a first all_reduce
(and, for cxlrt, importing cxlrt.torch_backend, which loads the backend's
extension), cxlrt beside Gloo, the slowest rank's time, median of a few
runs (needs torch).

python -m cxlrt.bench nixl: NIXL's CXLRT backend beside its UCX backend,
the same descriptors in the same run, pool-resident and staged memory,
with the latency of a small transfer and its notification
(cxlrt/bench_nixl.py says how; docs/nixl.md has figures).

All print this machine's memcpy bandwidth (numpy copy) so the figures read
as ratios."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

import cxlrt


def _memcpy_gbps(nbytes: int = 64 << 20) -> float:
    a = np.ones(nbytes, np.uint8)
    b = np.empty_like(a)
    np.copyto(b, a)
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(b, a)
        runs.append(nbytes / (time.perf_counter() - t) / 1e9)
    return statistics.median(runs)


def bench_kv(blocks, batch: int, reps: int, as_json: bool) -> int:
    uri = f"emu://pybench-{os.getpid()}?size=2G"
    pool = cxlrt.Pool.create(uri)
    rows = []
    try:
        with cxlrt.Host(pool) as host:
            store = host.store(create=True, entries_per_host=16384)
            memcpy = _memcpy_gbps()
            for block in blocks:
                bufs = [np.full(block, i % 251, np.uint8) for i in range(batch)]
                outs = [np.empty(block, np.uint8) for _ in range(batch)]
                iters = max(1, min(20, (64 << 20) // (block * batch)))
                result = {"block": block, "batch": batch}
                for path in ("cpp", "python"):
                    for op in ("put", "get"):
                        samples = []
                        for rep in range(reps):
                            ns = f"b{block}-{path}-{rep}"
                            keys = [[f"k{it}-{i}".encode() for i in range(batch)]
                                    for it in range(iters)]
                            if op == "get":  # the values first, then time the reads
                                store._s.time_batches(ns, keys, bufs, True)
                            data = bufs if op == "put" else outs
                            if path == "cpp":
                                t = store._s.time_batches(ns, keys, data, op == "put")
                            else:
                                t0 = time.perf_counter()
                                for k in keys:
                                    r = (store.batch_put(ns, k, data) if op == "put"
                                         else store.batch_get_into(ns, k, data))
                                    if any(isinstance(x, cxlrt.Error) for x in r):
                                        raise next(x for x in r if isinstance(x, cxlrt.Error))
                                t = time.perf_counter() - t0
                            samples.append(iters * batch * block / t / 1e9)
                            for k in keys:  # room for the next repetition
                                for key in k:
                                    store.delete(ns, key)
                        result[f"{path}_{op}_gbps"] = statistics.median(samples)
                for op in ("put", "get"):
                    c, p = result[f"cpp_{op}_gbps"], result[f"python_{op}_gbps"]
                    result[f"{op}_overhead"] = c / p - 1
                result["memcpy_gbps"] = memcpy
                rows.append(result)
            store.close()
    finally:
        del pool
        cxlrt.Pool.destroy(uri, force=True)
    if as_json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print(f"# python -m cxlrt.bench kv: batches of {batch}, medians of {reps}; "
          f"this machine's memcpy (numpy, 64 MiB): {rows[0]['memcpy_gbps']:.2f} GB/s")
    print("# overhead: how much longer the Python API takes than the same batches in C++")
    print("%10s %10s %10s %9s %10s %10s %9s" % ("block", "put C++", "put py", "overhead",
                                              "get C++", "get py", "overhead"))
    for r in rows:
        print("%10d %10.2f %10.2f %8.1f%% %10.2f %10.2f %8.1f%%" % (
            r["block"], r["cpp_put_gbps"], r["python_put_gbps"], 100 * r["put_overhead"],
            r["cpp_get_gbps"], r["python_get_gbps"], 100 * r["get_overhead"]))
    return 0


def bench_paged(layers: int, page: int, batch: int, reps: int, as_json: bool) -> int:
    block = layers * 2 * page
    nblocks = 2 * batch
    uri = f"emu://pypaged-{os.getpid()}?size={max(1, 6 * batch * block >> 30) + 1}G"
    pool = cxlrt.Pool.create(uri)
    try:
        with cxlrt.Host(pool) as host:
            store = host.store(create=True, entries_per_host=16384)
            memcpy = _memcpy_gbps()
            cache = [np.random.default_rng(i).integers(0, 255, (2, nblocks, page), np.uint8)
                     for i in range(layers)]
            segments = [(c[kv].ctypes.data, c.strides[1], page) for c in cache for kv in (0, 1)]
            flat = [np.full(block, i % 251, np.uint8) for i in range(batch)]
            outs = [np.empty(block, np.uint8) for _ in range(batch)]
            ids = list(range(batch))
            result = {"layers": layers, "page": page, "block": block, "batch": batch}
            # Touch the pool's pages first (a first touch faults: MACHINE-NOTES).
            for _ in range(2):
                warm = [f"warm{i}".encode() for i in range(batch)]
                store.batch_put("warm", warm, flat)
                for key in warm:
                    store.delete("warm", key)
            staging = [np.empty(block, np.uint8) for _ in range(batch)]

            def gather(dst_ids):  # each block's pages into its staging buffer
                for st, b in zip(staging, dst_ids):
                    np.concatenate([c[kv, b] for c in cache for kv in (0, 1)], out=st)

            def scatter(dst_ids):
                for st, b in zip(staging, dst_ids):
                    for j, (c, kv) in enumerate((c, kv) for c in cache for kv in (0, 1)):
                        c[kv, b] = st[j * page:(j + 1) * page]

            for path in ("paged", "staged", "contiguous"):
                for op in ("put", "get"):
                    samples = []
                    for rep in range(reps):
                        ns = f"{path}-{rep}"
                        keys = [f"k{i}".encode() for i in range(batch)]
                        if op == "get":  # the values first, then time the reads
                            store.batch_put_paged(ns, keys, ids, segments)
                        t0 = time.perf_counter()
                        if path == "paged":
                            r = (store.batch_put_paged(ns, keys, ids, segments) if op == "put"
                                 else store.batch_get_paged(ns, keys, [b + batch for b in ids],
                                                            segments))
                        elif path == "staged" and op == "put":
                            gather(ids)
                            r = store.batch_put(ns, keys, staging)
                        elif path == "staged":
                            r = store.batch_get_into(ns, keys, staging)
                            scatter([b + batch for b in ids])
                        else:
                            r = (store.batch_put(ns, keys, flat) if op == "put"
                                 else store.batch_get_into(ns, keys, outs))
                        t = time.perf_counter() - t0
                        if any(isinstance(x, cxlrt.Error) for x in r):
                            raise next(x for x in r if isinstance(x, cxlrt.Error))
                        samples.append(batch * block / t / 1e9)
                        for key in keys:
                            store.delete(ns, key)
                    result[f"{path}_{op}_gbps"] = statistics.median(samples)
            for op in ("put", "get"):
                result[f"{op}_vs_staged"] = result[f"paged_{op}_gbps"] / result[f"staged_{op}_gbps"]
                result[f"{op}_vs_contiguous"] = (result[f"paged_{op}_gbps"]
                                                 / result[f"contiguous_{op}_gbps"])
            result["memcpy_gbps"] = memcpy
            store.close()
    finally:
        del pool
        cxlrt.Pool.destroy(uri, force=True)
    if as_json:
        print(json.dumps(result))
        return 0
    r = result
    print(f"# python -m cxlrt.bench paged: {batch} blocks of {layers} layers x K,V x "
          f"{page} B pages ({block} B each), medians of {reps}; this machine's memcpy "
          f"(numpy, 64 MiB): {r['memcpy_gbps']:.2f} GB/s")
    print("# GB/s of blocks; staged: gather into (scatter from) a staging buffer + one-buffer "
          "call; one buffer: values already contiguous")
    print("%6s %8s %8s %11s %10s %12s" % ("op", "paged", "staged", "one buffer", "vs staged",
                                          "vs 1 buffer"))
    for op in ("put", "get"):
        print("%6s %8.2f %8.2f %11.2f %10.2f %12.2f" % (
            op, r[f"paged_{op}_gbps"], r[f"staged_{op}_gbps"], r[f"contiguous_{op}_gbps"],
            r[f"{op}_vs_staged"], r[f"{op}_vs_contiguous"]))
    return 0


def _torch_rank(rank, world, sizes, iters, reps, warmup, init, q):
    import torch
    import torch.distributed as dist

    # Registers torch's "fake" backend (its dispatch floor: no communication).
    import torch.testing._internal.distributed.fake_pg  # noqa: F401

    from . import torch_backend  # noqa: F401

    torch.set_num_threads(1)  # as torchrun does: one core per rank, no spinning helpers
    dist.init_process_group("cxlrt", init_method=init, rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    fake = dist.new_group(backend="fake")
    # The same backend without the flight-recorder hook torch attaches to
    # every out-of-tree backend's group (and not to fake's or Gloo's, which
    # record themselves or do nothing): it reads the variable as the group
    # is made.
    fr = os.environ.get("TORCH_FR_BUFFER_SIZE")
    os.environ["TORCH_FR_BUFFER_SIZE"] = "0"
    nofr = dist.new_group(backend="cxlrt")
    if fr is None:
        del os.environ["TORCH_FR_BUFFER_SIZE"]
    else:
        os.environ["TORCH_FR_BUFFER_SIZE"] = fr
    rows = []
    for nbytes in sizes:
        t = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        row = {"bytes": nbytes}
        for name, group in (("cxlrt", None), ("nofr", nofr), ("gloo", gloo), ("fake", fake)):
            for _ in range(warmup):
                dist.all_reduce(t, group=group)
            # Batches of back-to-back calls (nccl-tests' way): a barrier before
            # every call would time how soon the peer is scheduled again, which
            # on a shared 2-core machine is most of a small call's time.
            samples = []
            for _ in range(reps):
                dist.barrier(group=group)
                t0 = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(t, group=group)
                samples.append((time.perf_counter() - t0) / iters)
            s = torch.tensor([statistics.median(samples)], dtype=torch.float64)
            dist.all_reduce(s, op=dist.ReduceOp.MAX)  # the slowest rank
            row[name + "_us"] = s.item() * 1e6
            if name in ("cxlrt", "gloo"):
                factor = 2 * (world - 1) / world if world > 1 else 1  # 1 rank: algbw
                row[name + "_busbw_gbps"] = nbytes / s.item() / 1e9 * factor
        rows.append(row)
    if rank == 0:
        q.put(rows)
    dist.destroy_process_group()


def bench_torch(lo: int, hi: int, iters: int, reps: int, warmup: int, as_json: bool,
                world: int = 2) -> int:
    import tempfile

    import torch.multiprocessing as tmp

    sizes = []
    b = lo
    while b <= hi:
        sizes.append(b)
        b *= 2
    memcpy = _memcpy_gbps()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("CXLRT_POOL", f"emu://torch-bench-{os.getpid()}?size=2G")
    with tempfile.TemporaryDirectory() as d:
        init = f"file://{d}/rendezvous"
        ctx = tmp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=_torch_rank, args=(r, world, sizes, iters, reps, warmup, init, q))
                 for r in range(world)]
        for p in procs:
            p.start()
        rows = q.get(timeout=1800)
        for p in procs:
            p.join(60)
    for r in rows:
        r["memcpy_gbps"] = memcpy
        r["cxlrt_over_gloo"] = r["cxlrt_busbw_gbps"] / r["gloo_busbw_gbps"]
        r["cxlrt_over_fake"] = r["cxlrt_us"] / r["fake_us"]
        r["nofr_over_fake"] = r["nofr_us"] / r["fake_us"]
    if as_json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print(f"# python -m cxlrt.bench torch: all_reduce of float32, {world} ranks, medians of {reps} "
          f"batches of {iters} calls; "
          f"this machine's memcpy (numpy, 64 MiB): {memcpy:.2f} GB/s")
    print("# us: one call (the slower rank's median); fake: torch's dispatch floor (no "
          "communication); no-FR: a cxlrt group without torch's flight-recorder hook")
    print("%10s %12s %11s %11s %10s %9s %9s %10s %11s %11s" % (
        "bytes", "cxlrt busbw", "gloo busbw", "cxlrt/gloo", "cxlrt us", "no-FR us", "gloo us",
        "fake us", "cxlrt/fake", "no-FR/fake"))
    for r in rows:
        print("%10d %12.2f %11.2f %11.2f %10.2f %9.2f %9.2f %10.2f %11.2f %11.2f" % (
            r["bytes"], r["cxlrt_busbw_gbps"], r["gloo_busbw_gbps"], r["cxlrt_over_gloo"],
            r["cxlrt_us"], r["nofr_us"], r["gloo_us"], r["fake_us"], r["cxlrt_over_fake"],
            r["nofr_over_fake"]))
    return 0


# --- python -m cxlrt.bench torchpods


def _torchpods_rank(rank, world, per_pod, sizes, iters, reps, warmup, init, tag, q):
    import torch
    import torch.distributed as dist

    from . import torch_backend, torch_pods

    torch.set_num_threads(1)
    os.environ["CXLRT_POOL"] = f"emu://pods-bench-{tag}-{rank // per_pod}?size=1G&reserve=lazy"
    dist.init_process_group("cxlrt", init_method=init, rank=rank, world_size=world)
    hier_backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert isinstance(hier_backend, torch_pods.PodsBackend), type(hier_backend)
    gloo = dist.new_group(backend="gloo")
    # The same ranks in one pool (every rank names it: one pod).
    os.environ["CXLRT_POOL"] = f"emu://pods-bench-{tag}-all?size=1G&reserve=lazy"
    one = dist.new_group(backend="cxlrt")
    segments = torch_pods.PIPELINE_SEGMENTS
    rows = []
    for nbytes in sizes:
        t = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        row = {"bytes": nbytes}
        for name, group in (("hier", None), ("nopipe", None), ("gloo", gloo), ("onepool", one)):
            # nopipe: the same group with its all-reduce's pipeline off.
            torch_pods.PIPELINE_SEGMENTS = 1 if name == "nopipe" else segments
            for _ in range(warmup):
                dist.all_reduce(t, group=group)
            samples = []
            for _ in range(reps):
                dist.barrier(group=group)
                t0 = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(t, group=group)
                samples.append((time.perf_counter() - t0) / iters)
            s = torch.tensor([statistics.median(samples)], dtype=torch.float64)
            dist.all_reduce(s, op=dist.ReduceOp.MAX, group=gloo)  # the slowest rank
            row[name + "_us"] = s.item() * 1e6
            row[name + "_busbw_gbps"] = nbytes / s.item() / 1e9 * 2 * (world - 1) / world
        rows.append(row)
    if rank == 0:
        q.put(rows)
    dist.destroy_process_group()
    torch_backend._destroy_made_pools()  # the pools this rank made


def bench_torchpods(pods: int, per_pod: int, lo: int, hi: int, iters: int, reps: int,
                    warmup: int, as_json: bool) -> int:
    import tempfile

    import torch.multiprocessing as tmp

    sizes = []
    b = lo
    while b <= hi:
        sizes.append(b)
        b *= 4
    world = pods * per_pod
    memcpy = _memcpy_gbps()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as d:
        init = f"file://{d}/rendezvous"
        ctx = tmp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=_torchpods_rank,
                             args=(r, world, per_pod, sizes, iters, reps, warmup, init,
                                   os.getpid(), q))
                 for r in range(world)]
        for p in procs:
            p.start()
        rows = q.get(timeout=1800)
        for p in procs:
            p.join(60)
    for r in rows:
        r["memcpy_gbps"] = memcpy
        r["hier_over_gloo"] = r["hier_busbw_gbps"] / r["gloo_busbw_gbps"]
        r["hier_over_onepool"] = r["hier_busbw_gbps"] / r["onepool_busbw_gbps"]
        r["hier_over_nopipe"] = r["hier_busbw_gbps"] / r["nopipe_busbw_gbps"]
    if as_json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print(f"# python -m cxlrt.bench torchpods: all_reduce of float32, {pods} pods x {per_pod} "
          f"ranks (Gloo between pods) beside flat Gloo and one pool of the {world} ranks; "
          f"medians of {reps} batches of {iters} calls; this machine's memcpy (numpy, 64 MiB): "
          f"{memcpy:.2f} GB/s")
    print("# nopipe: the same hierarchical group with its all-reduce's pipeline off "
          "(torch_pods.PIPELINE_SEGMENTS = 1)")
    print("%10s %11s %11s %11s %11s %10s %12s %12s %9s %9s %10s" % (
        "bytes", "hier busbw", "nopipe bbw", "gloo busbw", "1pool busbw", "hier/gloo",
        "hier/1pool", "hier/nopipe", "hier us", "gloo us", "1pool us"))
    for r in rows:
        print("%10d %11.3f %11.3f %11.3f %11.3f %10.2f %12.2f %12.2f %9.1f %9.1f %10.1f" % (
            r["bytes"], r["hier_busbw_gbps"], r["nopipe_busbw_gbps"], r["gloo_busbw_gbps"],
            r["onepool_busbw_gbps"], r["hier_over_gloo"], r["hier_over_onepool"],
            r["hier_over_nopipe"], r["hier_us"], r["gloo_us"], r["onepool_us"]))
    return 0


# --- python -m cxlrt.bench startup


def _startup_rank() -> None:
    # One rank of a start-up run (RANK, WORLD_SIZE, MASTER_PORT, BACKEND
    # set by bench_startup). The ranks meet on the store first, so that
    # what is timed is not when each process happened to start.
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = os.environ["BENCH_BACKEND"]
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world, rank == 0)
    store.add("arrived", 1)
    while store.add("arrived", 0) < world:
        time.sleep(0.001)
    t0 = time.perf_counter()
    if backend == "cxlrt":
        from . import torch_backend  # noqa: F401
    t_import = time.perf_counter() - t0
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    t = torch.ones(1024)
    dist.all_reduce(t)
    elapsed = time.perf_counter() - t0
    assert t[0].item() == world, t[0].item()
    # The slowest rank's times, gathered on the store (not timed).
    store.set(f"t{rank}", json.dumps([elapsed, t_import]))
    if rank == 0:
        times = [json.loads(store.get(f"t{r}")) for r in range(world)]
        print(json.dumps({"total": max(x[0] for x in times),
                          "import": max(x[1] for x in times)}))
    store.add("done", 1)
    while store.add("done", 0) < world:  # rank 0's store outlives the others' reads
        time.sleep(0.001)
    dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _startup_run(backend: str, world: int) -> dict:
    import subprocess

    port = _free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), BENCH_BACKEND=backend,
                   OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
        procs.append(subprocess.Popen(
            [sys.executable, "-c", "from cxlrt.bench import _startup_rank; _startup_rank()"],
            env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for r, p in enumerate(procs):
        if p.returncode != 0:
            raise RuntimeError(f"startup {backend} rank {r} of {world} exited {p.returncode}")
    return json.loads(outs[0].strip().splitlines()[-1])


def bench_startup(worlds, runs: int, as_json: bool) -> int:
    rows = []
    for world in worlds:
        row = {"ranks": world}
        for backend in ("cxlrt", "gloo"):
            samples = [_startup_run(backend, world) for _ in range(runs)]
            row[backend + "_s"] = statistics.median(x["total"] for x in samples)
            if backend == "cxlrt":
                row["cxlrt_import_s"] = statistics.median(x["import"] for x in samples)
        row["cxlrt_over_gloo"] = row["cxlrt_s"] / row["gloo_s"]
        rows.append(row)
    if as_json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print(f"# python -m cxlrt.bench startup: init_process_group + first all_reduce in fresh "
          f"processes, slowest rank, median of {runs} runs (cxlrt: including importing "
          f"cxlrt.torch_backend, shown apart)")
    print("%6s %10s %13s %10s %11s" % ("ranks", "cxlrt s", "(import s)", "gloo s", "cxlrt/gloo"))
    for r in rows:
        print("%6d %10.3f %13.3f %10.3f %11.2f" % (r["ranks"], r["cxlrt_s"], r["cxlrt_import_s"],
                                                 r["gloo_s"], r["cxlrt_over_gloo"]))
    return 0


def _bytes(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cxlrt.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    kv = sub.add_parser("kv", help="KV batch put/get: the Python API beside C++")
    kv.add_argument("--block", default="16K,256K,2M", help="block sizes")
    kv.add_argument("--batch", type=int, default=32)
    kv.add_argument("--reps", type=int, default=5)
    kv.add_argument("--json", action="store_true")
    pg = sub.add_parser("paged", help="paged KV blocks (every layer's pages) beside one buffer")
    pg.add_argument("--layers", type=int, default=32)
    pg.add_argument("--page", default="32K", help="bytes of one layer's K (or V) page")
    pg.add_argument("--batch", type=int, default=16)
    pg.add_argument("--reps", type=int, default=5)
    pg.add_argument("--json", action="store_true")
    tb = sub.add_parser("torch", help="torch.distributed all_reduce: cxlrt beside Gloo and "
                                      "torch's dispatch floor")
    tb.add_argument("-b", "--minbytes", default="64K")
    tb.add_argument("-e", "--maxbytes", default="64M")
    tb.add_argument("-n", "--iters", type=int, default=20, help="calls per batch")
    tb.add_argument("-r", "--reps", type=int, default=5, help="batches (the median is shown)")
    tb.add_argument("--ranks", type=int, default=2,
                    help="processes; 1 times each call's software path alone (no peer to wait "
                         "for, which on a loaded machine is most of a small call)")
    tb.add_argument("-w", "--warmup", type=int, default=5)
    tb.add_argument("--json", action="store_true")
    tp = sub.add_parser("torchpods", help="torch.distributed all_reduce across emulated pods: "
                                          "beside flat Gloo and one pool")
    tp.add_argument("--pods", type=int, default=2)
    tp.add_argument("--per-pod", type=int, default=2, help="ranks of each pod")
    tp.add_argument("-b", "--minbytes", default="4K")
    tp.add_argument("-e", "--maxbytes", default="16M")
    tp.add_argument("-n", "--iters", type=int, default=10, help="calls per batch")
    tp.add_argument("-r", "--reps", type=int, default=5, help="batches (the median is shown)")
    tp.add_argument("-w", "--warmup", type=int, default=3)
    tp.add_argument("--json", action="store_true")
    st = sub.add_parser("startup", help="torch group start-up: cxlrt beside Gloo")
    st.add_argument("--ranks", default="2,4", help="world sizes")
    st.add_argument("--runs", type=int, default=3)
    st.add_argument("--json", action="store_true")
    nx = sub.add_parser("nixl", help="NIXL's CXLRT backend beside UCX (same wheel, same "
                                     "descriptors), pool-resident and staged")
    nx.add_argument("--block", default="16K,64K,256K,1M,2M", help="block sizes")
    nx.add_argument("--descs", default="1,16,128,1024", help="descriptors per transfer")
    nx.add_argument("--max-bytes", default="64M", help="largest transfer (block x descs)")
    nx.add_argument("--modes", default="pool,staged")
    nx.add_argument("-r", "--reps", type=int, default=5, help="transfers (the median is shown)")
    nx.add_argument("--iters", type=int, default=200, help="ping-pongs of the latency test")
    nx.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.what == "nixl":
        from .bench_nixl import bench_nixl
        return bench_nixl([_bytes(b) for b in a.block.split(",")],
                          [int(n) for n in a.descs.split(",")], _bytes(a.max_bytes), a.reps,
                          a.iters, a.modes.split(","), a.json)
    if a.what == "startup":
        return bench_startup([int(n) for n in a.ranks.split(",")], a.runs, a.json)
    if a.what == "torchpods":
        return bench_torchpods(a.pods, a.per_pod, _bytes(a.minbytes), _bytes(a.maxbytes),
                               a.iters, a.reps, a.warmup, a.json)
    if a.what == "torch":
        return bench_torch(_bytes(a.minbytes), _bytes(a.maxbytes), a.iters, a.reps, a.warmup,
                           a.json, a.ranks)
    if a.what == "paged":
        return bench_paged(a.layers, _bytes(a.page), a.batch, a.reps, a.json)
    blocks = [_bytes(b) for b in a.block.split(",")]
    return bench_kv(blocks, a.batch, a.reps, a.json)


if __name__ == "__main__":
    sys.exit(main())
