"""python -m cxlrt.bench kv: what the Python binding costs.

KV BatchPut / BatchGet of 16 KiB - 2 MiB blocks through the Python API,
beside the same batches looped in C++ inside the extension (same store,
keys and buffers), in one run on a fresh emulated pool; the overhead is
the difference. Also prints this machine's memcpy bandwidth (numpy copy)
so the figures read as ratios."""

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cxlrt.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    kv = sub.add_parser("kv", help="KV batch put/get: the Python API beside C++")
    kv.add_argument("--block", default="16K,256K,2M", help="block sizes")
    kv.add_argument("--batch", type=int, default=32)
    kv.add_argument("--reps", type=int, default=5)
    kv.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    blocks = [int(b[:-1]) * units[b[-1].upper()] if b[-1].upper() in units else int(b)
              for b in a.block.split(",")]
    return bench_kv(blocks, a.batch, a.reps, a.json)


if __name__ == "__main__":
    sys.exit(main())
