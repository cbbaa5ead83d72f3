"""NIXL agents with the CXLRT backend, each in a process of its own on an
emulated host of its own (CXLRT_HOST_ID), driven from the test through a
pipe: the test says what to register, which metadata to load and which
transfers to make, and each agent answers with what it saw.

Buffers are filled from a seed (``pattern``) so that a test compares
digests, not bytes across the pipe.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

MP = mp.get_context("spawn")


def pattern(seed: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()


def _serve(conn, name: str, host_id: int, env: Dict[str, str], wrapper: bool) -> None:
    os.environ.update(env)
    os.environ["CXLRT_HOST_ID"] = str(host_id)
    try:
        if wrapper:  # vLLM's own name for the agent class
            from vllm.distributed.nixl_utils import NixlWrapper as agent_cls
            from vllm.distributed.nixl_utils import nixl_agent_config
        else:
            from nixl._api import nixl_agent as agent_cls
            from nixl._api import nixl_agent_config
        import cxlrt

        agent = agent_cls(name, nixl_agent_config(backends=["CXLRT"]))
    except Exception:  # noqa: BLE001 - reported to the test
        conn.send(("err", traceback.format_exc()))
        return
    conn.send(("ok", None))
    host: Optional[Any] = None
    bufs: Dict[str, Tuple[np.ndarray, Any]] = {}
    handles: Dict[int, Any] = {}
    notifs: List[Tuple[str, bytes]] = []

    def blocks(key: str, n: int, size: int, first: int = 0, stride: int = 0):
        a = bufs[key][0]
        stride = stride or size
        return agent.get_xfer_descs([(a.ctypes.data + first * size + i * stride, size, 0)
                                     for i in range(n)], "DRAM")

    def alloc(key: str, nbytes: int, in_pool: bool, seed: Optional[int]) -> None:
        nonlocal host
        if key in bufs:  # its range may be handed out again: NIXL refuses overlaps
            agent.deregister_memory(bufs.pop(key)[2])
        keep = None
        if in_pool:
            if host is None:
                host = cxlrt.Host(cxlrt.Pool.open(os.environ["CXLRT_POOL"]))
            keep = host.allocate(nbytes)
            a = np.frombuffer(keep, dtype=np.uint8)
        else:
            a = np.empty(nbytes, dtype=np.uint8)
        a[:] = pattern(seed, nbytes) if seed is not None else 0
        reg = agent.register_memory([(a.ctypes.data, nbytes, 0, "")], "DRAM")
        bufs[key] = (a, keep, reg)

    def start(op: str, key: str, n: int, size: int, peer: str, remote: bytes,
              notif: bytes = b"", first: int = 0) -> int:
        h = agent.initialize_xfer(op, blocks(key, n, size, first), agent.deserialize_descs(remote),
                                  peer, notif)
        state = agent.transfer(h)
        handles[id(h)] = h
        if state == "ERR":
            raise RuntimeError(f"{op} to {peer}: transfer() returned ERR")
        return id(h)

    def check(hid: int) -> str:
        try:
            return agent.check_xfer_state(handles[hid])
        except Exception as e:  # noqa: BLE001 - NIXL raises some errors: "ERR <name>"
            return f"ERR {type(e).__name__}"

    def wait(hid: int, timeout: float = 60.0) -> Tuple[str, float]:
        t0 = time.monotonic()
        state = check(hid)
        while state == "PROC" and time.monotonic() - t0 < timeout:
            state = check(hid)
        return state, time.monotonic() - t0

    def xfer(op, key, n, size, peer, remote, notif=b"", first=0):
        t0 = time.monotonic()
        hid = start(op, key, n, size, peer, remote, notif, first)
        state, _ = wait(hid)
        agent.release_xfer_handle(handles.pop(hid))
        return state, time.monotonic() - t0

    def collect(count: int, timeout: float = 20.0) -> List[Tuple[str, bytes]]:
        t0 = time.monotonic()
        while len(notifs) < count and time.monotonic() - t0 < timeout:
            for who, msgs in agent.get_new_notifs().items():
                notifs.extend((who, m) for m in msgs)
            time.sleep(0.0005)
        out = notifs[:]
        notifs.clear()
        return out

    loaded = set()

    def add_remote(md: bytes, name: str) -> str:
        # NIXL refuses metadata of a loaded agent: unload it first (new
        # registrations travel in the new metadata).
        if name in loaded:
            agent.remove_remote_agent(name)
        got = agent.add_remote_agent(md)
        got = got.decode() if isinstance(got, bytes) else got
        loaded.add(got)
        return got

    calls = {
        "alloc": alloc,
        "descs": lambda key, n, size, first=0, stride=0: agent.get_serialized_descs(
            blocks(key, n, size, first, stride)),
        "metadata": lambda: agent.get_agent_metadata(),
        "add_remote": add_remote,
        "xfer": xfer,
        "start": start,
        "check": check,
        "wait": wait,
        "release": lambda hid: agent.release_xfer_handle(handles.pop(hid)),
        "digest": lambda key, lo=0, hi=None: digest(bufs[key][0][lo:hi]),
        "fill": lambda key, seed: bufs[key][0].__setitem__(
            slice(None), pattern(seed, bufs[key][0].size)),
        "notifs": collect,
        "send_notif": lambda peer, msg: agent.send_notif(peer, msg),
    }
    while True:
        try:
            cmd, args = conn.recv()
        except EOFError:
            return
        if cmd == "exit":
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", calls[cmd](*args)))
        except Exception:  # noqa: BLE001 - reported to the test
            conn.send(("err", traceback.format_exc()))


class Agent:
    """One NIXL agent in its own process (host `host_id` of the pool)."""

    def __init__(self, name: str, host_id: int, env: Dict[str, str], wrapper: bool = False):
        self.name = name
        self.conn, child = MP.Pipe()
        self.proc = MP.Process(target=_serve, args=(child, name, host_id, env, wrapper),
                               daemon=True)
        self.proc.start()
        child.close()
        self._result(60)

    def _result(self, timeout: float):
        if not self.conn.poll(timeout):
            raise TimeoutError(f"agent {self.name} did not answer in {timeout} s")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"agent {self.name}: {value}")
        return value

    def call(self, cmd: str, *args, timeout: float = 120.0):
        self.conn.send((cmd, args))
        return self._result(timeout)

    def __getattr__(self, cmd: str):
        return lambda *args, **kw: self.call(cmd, *args, **kw)

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.call("exit", timeout=30)
            except (OSError, EOFError, TimeoutError, RuntimeError):
                pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def connect(*agents: Agent) -> None:
    """Every agent loads every other's metadata."""
    mds = {a.name: a.metadata() for a in agents}
    for a in agents:
        for b in agents:
            if a is not b:
                name = a.add_remote(mds[b.name], b.name)
                assert (name.decode() if isinstance(name, bytes) else name) == b.name
