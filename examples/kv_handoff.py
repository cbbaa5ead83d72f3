"""Prefill (rank 0) puts a chain of KV-cache blocks into the pool; decode
(rank 1) finds the longest cached prefix, pins it and reads it into its own
buffers:  cxlrt run -n 2 python3 examples/kv_handoff.py"""
import numpy as np

import cxlrt

BLOCK = 16 * 1024  # bytes of one block of KV for a token block
chain = [f"seq-7/blk-{i}" for i in range(8)]  # chained hashes in a real server

with cxlrt.Host() as host, host.communicator("handoff") as comm:
    if comm.rank == 0:
        store = host.store(create=True)
        blocks = [np.full(BLOCK, i, np.uint8) for i in range(6)]  # 6 of 8 computed
        assert store.batch_put("llama-8b", chain[:6], blocks) == [None] * 6
        comm.barrier()  # handed off
        comm.barrier()  # decode is done
    else:
        comm.barrier()
        store = host.store()
        with store.lookup("llama-8b", chain) as pins:
            outs = [np.empty(BLOCK, np.uint8) for _ in range(pins.length)]
            sizes = store.batch_get_into("llama-8b", chain[: pins.length], outs)
            assert sizes == [BLOCK] * pins.length
            assert all((o == i).all() for i, o in enumerate(outs))
        print(f"decode: {pins.length} of {len(chain)} blocks cached, read and checked")
        comm.barrier()
    store.close()
