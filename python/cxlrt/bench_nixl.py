"""python -m cxlrt.bench nixl: NIXL's CXLRT backend beside its UCX backend.

Two NIXL agents, each in a process on its own emulated host of one pool:
a pair with the CXLRT backend, then pairs with the UCX backend of the
same wheel, once with the transports UCX picks on one machine and once
limited to TCP (PEERS says why both); one backend per agent, so that
neither's threads take the other's cores. The initiator READs n
descriptors of a block size from the target (as vLLM's decode side pulls
KV blocks), the same descriptors through CXLRT and through UCX, in the
same run. The remote descriptors are in reverse order, so NIXL cannot
merge them into one. Two memory modes:

- pool: both agents' buffers lie in the pool (cxlrt Host.allocate): CXLRT
  moves each block where it is, one copy (zero-copy);
- staged: plain process memory (numpy, like vLLM's CPU tensors): CXLRT
  stages it through pool bounce buffers, two copies, pipelined.

Per row: GB/s of each pair (median of --reps transfers after one
warm-up), CXLRT/UCX, and CXLRT against a memcpy of the same bytes in the
initiator's process measured in the same run (pool: cxlrt GB/s over
memcpy GB/s; staged: CXLRT's time over two memcpys' time). Then the
latency of a small WRITE with its notification: a ping-pong, each side
WRITEs 4 KiB with a notification and waits for the other's; one way is
half the round trip (median).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import time
import uuid
from typing import Dict, List, Optional

import numpy as np

MP = mp.get_context("spawn")
# The agent pairs measured, each a (label, NIXL backend, environment):
# CXLRT; UCX as it picks its transports on one machine (shared memory and
# cross-memory attach, process_vm_readv: one kernel copy, and reachable
# only between processes of one kernel); and UCX limited to TCP, what it
# uses between hosts without RDMA (here over loopback). Hosts that share a
# CXL pool share no kernel, so the first UCX row is a bound no transport
# between hosts reaches; the second is the network path the pool replaces
# where no RDMA NIC is fitted. (An RDMA NIC is not here to measure.)
PEERS = [("CXLRT", "CXLRT", {}), ("UCX", "UCX", {}),
         ("UCX-tcp", "UCX", {"UCX_TLS": "tcp,self"})]


def _agent(conn, name: str, host_id: int, env: Dict[str, str], backend: str) -> None:
    os.environ.update(env)
    os.environ["CXLRT_HOST_ID"] = str(host_id)
    from nixl._api import nixl_agent, nixl_agent_config

    import cxlrt

    agent = nixl_agent(name, nixl_agent_config(backends=[backend]))
    host = None
    buf: Optional[np.ndarray] = None
    keep = None
    reg = None
    peer = None
    remote = 0  # the peer's buffer's address: the descriptors name its memory
    conn.send("ready")
    while True:
        cmd, args = conn.recv()
        if cmd == "exit":
            conn.send(None)
            return
        if cmd == "alloc":
            nbytes, in_pool = args
            if reg is not None:
                agent.deregister_memory(reg)
            if in_pool:
                if host is None:
                    host = cxlrt.Host(cxlrt.Pool.open(os.environ["CXLRT_POOL"]))
                keep = host.allocate(nbytes, 4096)
                buf = np.frombuffer(keep, dtype=np.uint8)
            else:
                keep = None
                buf = np.empty(nbytes, dtype=np.uint8)
            buf[:] = host_id + 1  # every page touched before timing
            reg = agent.register_memory([(buf.ctypes.data, nbytes, 0, "")], "DRAM")
            conn.send(None)
        elif cmd == "metadata":
            conn.send(agent.get_agent_metadata())
        elif cmd == "load":
            if peer is not None:
                agent.remove_remote_agent(peer)
            peer = agent.add_remote_agent(args[0])
            peer = peer.decode() if isinstance(peer, bytes) else peer
            conn.send(peer)
        elif cmd == "base":
            conn.send(buf.ctypes.data)
        elif cmd == "set_remote":
            remote = args[0]
            conn.send(None)
        elif cmd == "sweep":
            conn.send(_sweep(agent, buf, remote, peer, *args))
        elif cmd == "pingpong":
            conn.send(_pingpong(agent, buf, remote, peer, *args))


def _descs(agent, base: int, block: int, n: int, reverse: bool):
    order = range(n - 1, -1, -1) if reverse else range(n)
    return agent.get_xfer_descs([(base + i * block, block, 0) for i in order], "DRAM")


def _run(agent, handle) -> float:
    t = time.perf_counter()
    state = agent.transfer(handle)
    while state == "PROC":
        state = agent.check_xfer_state(handle)
    if state != "DONE":
        raise RuntimeError(f"transfer ended {state}")
    return time.perf_counter() - t


def _sweep(agent, buf, remote: int, peer, rows, reps: int, label: str) -> List[dict]:
    out = []
    scratch = np.empty_like(buf)
    scratch[:] = 3
    for block, n in rows:
        total = block * n
        r = {"block": block, "descs": n, "bytes": total}
        h = agent.initialize_xfer("READ", _descs(agent, buf.ctypes.data, block, n, False),
                                  _descs(agent, remote, block, n, True), peer, b"")
        _run(agent, h)
        times = [_run(agent, h) for _ in range(reps)]
        agent.release_xfer_handle(h)
        r[f"{label.lower()}_s"] = statistics.median(times)
        times = []
        for _ in range(reps + 1):
            t = time.perf_counter()
            np.copyto(buf[:total], scratch[:total])
            times.append(time.perf_counter() - t)
        r["memcpy_s"] = statistics.median(times[1:])
        out.append(r)
    return out


def _pingpong(agent, buf, remote: int, peer, iters: int, initiator: bool) -> List[float]:
    size = 4096
    local = _descs(agent, buf.ctypes.data, size, 1, False)
    remote = _descs(agent, remote, size, 1, False)
    h = agent.initialize_xfer("WRITE", local, remote, peer, b"")
    rtts = []

    def wait_notif():
        # Yields between polls: the two agents' processes may share a core
        # (as on the 2-vCPU machines), and a spinning waiter would keep the
        # other from answering for a scheduler round. The same for both
        # backends.
        while True:
            got = agent.get_new_notifs()
            if got.get(peer):
                return
            os.sched_yield()

    for i in range(iters + 5):
        t = time.perf_counter()
        if initiator:
            _run_notif(agent, h, b"p")
            wait_notif()
        else:
            wait_notif()
            _run_notif(agent, h, b"p")
        if i >= 5:
            rtts.append(time.perf_counter() - t)
    agent.release_xfer_handle(h)
    return rtts


def _run_notif(agent, handle, msg: bytes) -> None:
    state = agent.transfer(handle, msg)
    while state == "PROC":
        state = agent.check_xfer_state(handle)
    if state != "DONE":
        raise RuntimeError(f"transfer ended {state}")


class _Agent:
    def __init__(self, name: str, host_id: int, env: Dict[str, str], backend: str):
        self.conn, child = MP.Pipe()
        self.proc = MP.Process(target=_agent, args=(child, name, host_id, env, backend),
                               daemon=True)
        self.proc.start()
        child.close()
        if not self.conn.poll(120):
            raise RuntimeError(f"agent {name} did not start")
        self.conn.recv()

    def call(self, cmd: str, *args, timeout: float = 600):
        self.conn.send((cmd, args))
        if not self.conn.poll(timeout):
            raise RuntimeError(f"{cmd} took more than {timeout} s")
        return self.conn.recv()

    def send(self, cmd: str, *args):
        self.conn.send((cmd, args))

    def recv(self, timeout: float = 600):
        if not self.conn.poll(timeout):
            raise RuntimeError(f"no answer in {timeout} s")
        return self.conn.recv()

    def close(self):
        try:
            self.call("exit", timeout=30)
        except (OSError, EOFError, RuntimeError):
            pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


def bench_nixl(blocks: List[int], descs: List[int], max_bytes: int, reps: int, iters: int,
               modes: List[str], as_json: bool) -> int:
    import cxlrt

    from . import nixl as cxlrt_nixl
    from .bench import _memcpy_gbps

    rows = [(b, n) for b in blocks for n in descs if b * n <= max_bytes]
    skipped = [(b, n) for b in blocks for n in descs if b * n > max_bytes]
    uri = f"emu://nixlbench-{os.getpid()}-{uuid.uuid4().hex[:6]}?size={2 * max_bytes + (256 << 20)}"
    pool = cxlrt.Pool.create(uri)
    env = {"CXLRT_POOL": pool.uri, "UCX_MODULES": "^ib,rdmacm",
           "NIXL_PLUGIN_DIR": cxlrt_nixl.plugin_dir()}
    results: Dict[str, object] = {"memcpy_gbps": _memcpy_gbps(), "modes": {}}
    modes_out: Dict[str, dict] = {m: {"rows": None, "latency_s": {}} for m in modes}
    try:
        # A pair of agents per backend, one backend each: no other backend's
        # threads (UCX's progress thread polls without pause) share the cores.
        for label, backend, peer_env in PEERS:
            agents = []
            try:
                target = _Agent(f"bench-target-{label}", 1, {**env, **peer_env}, backend)
                agents.append(target)
                init = _Agent(f"bench-initiator-{label}", 0, {**env, **peer_env}, backend)
                agents.append(init)
                for mode in modes:
                    for a in (target, init):
                        a.call("alloc", max_bytes, mode == "pool")
                    init.call("load", target.call("metadata"))
                    target.call("load", init.call("metadata"))
                    init.call("set_remote", target.call("base"))
                    target.call("set_remote", init.call("base"))
                    sweep = init.call("sweep", rows, reps, label)
                    m = modes_out[mode]
                    if m["rows"] is None:
                        m["rows"] = sweep
                    else:
                        for r, s in zip(m["rows"], sweep):
                            r.update({k: v for k, v in s.items() if k.endswith("_s")
                                      and k != "memcpy_s"})
                    target.send("pingpong", iters, False)
                    rtts = init.call("pingpong", iters, True)
                    target.recv()
                    m["latency_s"][label] = statistics.median(rtts) / 2
            finally:
                for a in agents:
                    a.close()
        results["modes"] = modes_out
    finally:
        del pool
        cxlrt.Pool.destroy(uri, force=True)
    if as_json:
        print(json.dumps(results, indent=1))
        return 0
    _print(results, reps, iters, skipped)
    return 0


def _print(results, reps, iters, skipped) -> None:
    gb = 1e9
    print(f"# NIXL READ, CXLRT beside UCX (one wheel, same descriptors, remote ones reversed; "
          f"ucx: UCX's own choice on one machine, shared memory and cross-memory attach; "
          f"ucx-tcp: UCX_TLS=tcp,self, its path between hosts without RDMA); "
          f"GB/s medians of {reps}; this machine's memcpy (numpy, 64 MiB): "
          f"{results['memcpy_gbps']:.2f} GB/s")
    for mode, m in results["modes"].items():
        extra = ("cxlrt/memcpy (GB/s)" if mode == "pool"
                 else "cxlrt/(2 memcpy) (time)")
        print(f"\n## {mode}: " + ("both buffers in the pool (zero-copy)" if mode == "pool" else
                                 "private memory on both sides (staged, two copies)"))
        print("%9s %6s %10s %10s %10s %10s %10s %10s %s" % (
            "block", "descs", "bytes", "cxlrt", "ucx", "ucx-tcp", "cxlrt/ucx", "cxlrt/tcp",
            extra))
        for r in m["rows"]:
            c = r["bytes"] / r["cxlrt_s"] / gb
            u = r["bytes"] / r["ucx_s"] / gb
            t = r["bytes"] / r["ucx-tcp_s"] / gb
            if mode == "pool":
                vs = r["memcpy_s"] / r["cxlrt_s"]
            else:
                vs = r["cxlrt_s"] / (2 * r["memcpy_s"])
            print("%9s %6d %10d %10.2f %10.2f %10.2f %10.2f %10.2f %8.2f" % (
                _fmt(r["block"]), r["descs"], r["bytes"], c, u, t, c / u, c / t, vs))
        lat = m["latency_s"]
        print(f"4 KiB WRITE + notification, one way (half a ping-pong, median of {iters}): "
              + ", ".join(f"{label} {lat[label] * 1e6:.1f} us" for label, _, _ in PEERS))
    if skipped:
        print("\n(skipped, over --max-bytes: "
              + ", ".join(f"{_fmt(b)}x{n}" for b, n in skipped) + ")")


def _fmt(n: int) -> str:
    for unit, s in ((1 << 20, "M"), (1 << 10, "K")):
        if n % unit == 0:
            return f"{n // unit}{s}"
    return str(n)

