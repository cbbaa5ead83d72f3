"""A data-parallel gradient all-reduce through the pool, one process per
rank:  cxlrt run -n 2 python3 examples/allreduce.py"""
import numpy as np

import cxlrt

with cxlrt.Host() as host:  # the pool cxlrt run made (CXLRT_POOL)
    with host.communicator("train") as comm:  # rank and size from the launcher
        grad = np.full(1 << 20, comm.rank + 1, np.float32)
        comm.all_reduce(grad, op="avg")  # in place
        want = (comm.size + 1) / 2
        assert (grad == want).all(), grad[:4]
        print(f"rank {comm.rank}/{comm.size}: averaged {grad.size} gradients to {want}")
