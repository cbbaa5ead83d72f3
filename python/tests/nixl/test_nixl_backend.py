"""NIXL's CXLRT backend (libplugin_CXLRT.so) through NIXL's own Python
agents, each in a process on its own emulated host of one pool: READ and
WRITE both ways, pool-resident (zero-copy) and private (staged) memory,
1 to 4096 descriptors, 4 KiB to 64 MiB, notifications after the data,
three agents at once, two tenants on one pool, cancellation, a peer killed
mid-transfer, and a plugin of another API version refused (vLLM: test_nixl_vllm.py;
docs/nixl.md).
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
import uuid

import pytest

import cxlrt
from cxlrt import nixl as cxlrt_nixl

sys.path.insert(0, os.path.dirname(__file__))
from nixl_peers import Agent, connect, digest, pattern  # noqa: E402

LEASE_MS = 400  # a killed peer is declared dead after about 1.25 leases

@pytest.fixture(scope="module")
def env(tmp_path_factory):
    uri = f"emu://nixl-{os.getpid()}-{uuid.uuid4().hex[:6]}?size=640M"
    pool = cxlrt.Pool.create(uri)
    plugins = cxlrt_nixl.plugin_dir(str(tmp_path_factory.mktemp("plugins")))
    e = {"CXLRT_POOL": pool.uri, "NIXL_PLUGIN_DIR": plugins, "UCX_MODULES": "^ib,rdmacm",
         "CXLRT_LEASE_MS": str(LEASE_MS), "CXLRT_HEARTBEAT_MS": "50"}
    yield e
    del pool
    cxlrt.Pool.destroy(uri, force=True)

@pytest.fixture
def agents(env):
    made = []

    def make(name, host_id, wrapper=False):
        a = Agent(f"{name}-{uuid.uuid4().hex[:6]}", host_id, env, wrapper)
        made.append(a)
        return a

    yield make
    for a in made:
        a.close()

def _exchange(src, dst, op, n, size, src_pool, dst_pool, seed):
    """`src` initiates `op` of n blocks of `size` against `dst`; checks the bytes
    and that the notification came after them."""
    nbytes = n * size
    src.alloc("buf", nbytes, src_pool, seed if op == "WRITE" else None)
    dst.alloc("buf", nbytes, dst_pool, seed if op == "READ" else None)
    connect(src, dst)  # metadata carries the registrations: exchanged after them
    remote = dst.descs("buf", n, size)
    msg = f"{op}-{seed}".encode()
    state, _ = src.xfer(op, "buf", n, size, dst.name, remote, msg)
    assert state == "DONE"
    expected = digest(pattern(seed, nbytes))
    assert (src if op == "READ" else dst).digest("buf") == expected
    assert dst.notifs(1) == [(src.name, msg)]

@pytest.mark.parametrize("src_pool,dst_pool", [(False, False), (True, True), (False, True),
                                               (True, False)],
                         ids=["staged", "pool", "remote_in_pool", "local_in_pool"])
def test_read_and_write_both_ways(agents, src_pool, dst_pool):
    a, b = agents("a", 0), agents("b", 1)
    for seed, (x, y, op) in enumerate([(a, b, "READ"), (a, b, "WRITE"), (b, a, "READ"),
                                       (b, a, "WRITE")]):
        _exchange(x, y, op, 64, 64 << 10, src_pool, dst_pool, seed)

@pytest.mark.parametrize("src_pool", [False, True], ids=["staged", "local_in_pool"])
def test_protocol_under_simulated_coherence(env, src_pool):
    # Every host keeps private copies of the lines it touches until it
    # flushes (docs/emulation.md): a missing flush or invalidate in the
    # channel protocol reads stale bytes here.
    uri = f"emu://nixl-sim-{os.getpid()}-{uuid.uuid4().hex[:6]}?size=128M&coherence=simulated"
    pool = cxlrt.Pool.create(uri)
    made = []
    try:
        sim = {**env, "CXLRT_POOL": pool.uri}
        a = Agent(f"sa-{uuid.uuid4().hex[:6]}", 0, sim)
        made.append(a)
        b = Agent(f"sb-{uuid.uuid4().hex[:6]}", 1, sim)
        made.append(b)
        for seed, op in enumerate(["READ", "WRITE"]):
            _exchange(a, b, op, 8, 100000, src_pool, False, 40 + seed)  # partial lines
    finally:
        for x in made:
            x.close()
        del pool
        cxlrt.Pool.destroy(uri, force=True)


@pytest.mark.parametrize("n,size", [(1, 4 << 10), (4096, 4 << 10), (1, 64 << 20), (300, 3000)],
                         ids=["1x4KiB", "4096x4KiB", "1x64MiB", "300x3000B"])
@pytest.mark.parametrize("in_pool", [False, True], ids=["staged", "pool"])
def test_descriptor_counts_and_sizes(agents, n, size, in_pool):
    a, b = agents("a", 0), agents("b", 1)
    _exchange(a, b, "READ", n, size, in_pool, in_pool, 11)
    _exchange(a, b, "WRITE", n, size, in_pool, in_pool, 12)

def test_scattered_descriptors_and_standalone_notifications(agents):
    a, b = agents("a", 0), agents("b", 1)
    n, size = 512, 8 << 10
    a.alloc("buf", n * size, False, None)
    b.alloc("buf", 2 * n * size, False, 5)
    connect(a, b)
    # Every other block of b (not contiguous: a request each) into a, packed.
    remote = b.descs("buf", n, size, 0, 2 * size)
    state, _ = a.xfer("READ", "buf", n, size, b.name, remote, b"")
    assert state == "DONE"
    assert a.digest("buf") == digest(pattern(5, 2 * n * size).reshape(n, 2 * size)[:, :size])
    for i in range(20):
        a.send_notif(b.name, f"n{i}".encode() * (i * 20 + 1))  # inline and bounced
    got = b.notifs(20)
    assert got == [(a.name, f"n{i}".encode() * (i * 20 + 1)) for i in range(20)]

def test_three_agents(agents):
    a, b, c = agents("a", 0), agents("b", 1), agents("c", 2)
    size = 4 << 20
    for i, x in enumerate((a, b)):
        x.alloc("buf", size, i == 0, 100 + i)
    c.alloc("buf", 2 * size, False, None)
    connect(a, b, c)
    ha = c.start("READ", "buf", 16, size // 16, a.name, a.descs("buf", 16, size // 16), b"from-a")
    hb = c.start("READ", "buf", 16, size // 16, b.name, b.descs("buf", 16, size // 16), b"from-b",
                 16)
    assert c.wait(ha)[0] == "DONE" and c.wait(hb)[0] == "DONE"
    assert c.digest("buf", 0, size) == digest(pattern(100, size))
    assert c.digest("buf", size, 2 * size) == digest(pattern(101, size))
    assert a.notifs(1) == [(c.name, b"from-a")]
    assert b.notifs(1) == [(c.name, b"from-b")]
    # And back: c writes its halves the other way round.
    assert c.xfer("WRITE", "buf", 1, size, a.name, a.descs("buf", 1, size), b"", 1)[0] == "DONE"
    assert a.digest("buf") == digest(pattern(101, size))

def test_tenants_on_one_pool_see_only_their_own(agents):
    a1, b1 = agents("tenant1-a", 0), agents("tenant1-b", 1)
    a2, b2 = agents("tenant2-a", 2), agents("tenant2-b", 3)
    for i, (x, y) in enumerate([(a1, b1), (a2, b2)]):
        x.alloc("buf", 1 << 20, False, 200 + i)
        y.alloc("buf", 1 << 20, False, None)
    connect(a1, b1)
    connect(a2, b2)
    for i, (x, y) in enumerate([(a1, b1), (a2, b2)]):
        assert x.xfer("WRITE", "buf", 4, 256 << 10, y.name, y.descs("buf", 4, 256 << 10),
                      f"t{i}".encode())[0] == "DONE"
        x.send_notif(y.name, f"hello{i}".encode())
    assert b1.notifs(2) == [(a1.name, b"t0"), (a1.name, b"hello0")]
    assert b2.notifs(2) == [(a2.name, b"t1"), (a2.name, b"hello1")]
    assert a1.notifs(0, 0.3) == [] and a2.notifs(0, 0.3) == []
    assert b1.digest("buf") == digest(pattern(200, 1 << 20))
    assert b2.digest("buf") == digest(pattern(201, 1 << 20))
    # An agent without the other tenant's metadata cannot name its agent.
    with pytest.raises(RuntimeError, match="nixl|NIXL|not"):
        a1.xfer("READ", "buf", 4, 256 << 10, b2.name, b2.descs("buf", 4, 256 << 10))

def test_metadata_naming_the_pools_header_is_refused(agents, env):
    """A peer's metadata (forged or corrupt) whose pool offset names the pool's
    header: the transfer is refused and the header is untouched."""
    a, b = agents("a", 0), agents("b", 1)
    size = 64 << 10
    a.alloc("buf", size, False, 5)
    b.alloc("buf", size, True, None)
    connect(a, b)
    md = b.metadata()
    magic = struct.pack("<Q", 0x3147455254584C43)  # RegWire.magic ("CLXTREG1")
    at = md.find(magic)
    assert at >= 0, "no CXLRT registration in b's metadata"
    pool_off = at + 48  # RegWire.pool_off
    assert struct.unpack_from("<Q", md, pool_off)[0] > 0, "b's buffer is not in the pool"
    forged = md[:pool_off] + struct.pack("<Q", 0) + md[pool_off + 8:]
    assert a.add_remote(forged, b.name) == b.name
    with pytest.raises(RuntimeError):
        state, _ = a.xfer("WRITE", "buf", 1, size, b.name, b.descs("buf", 1, size))
        assert state != "DONE"
        raise RuntimeError(state)
    cxlrt.Pool.open(env["CXLRT_POOL"])  # its header validates: nothing was written over it

def test_cancel_then_transfer_again(agents):
    a, b = agents("a", 0), agents("b", 1)
    size = 16 << 20  # 32 requests of 512 KiB
    a.alloc("buf", size, False, None)
    b.alloc("buf", size, False, 7)
    connect(a, b)
    remote = b.descs("buf", 1, size)
    for _ in range(3):  # released at once: most of it not moved yet
        hid = a.start("READ", "buf", 1, size, b.name, remote, b"cancelled")
        a.release(hid)
    state, _ = a.xfer("READ", "buf", 1, size, b.name, remote, b"whole")
    assert state == "DONE"
    assert a.digest("buf") == digest(pattern(7, size))
    got = b.notifs(1)
    assert got[-1] == (a.name, b"whole")

def test_peer_killed_mid_transfer_fails_within_the_lease(agents):
    a, b = agents("a", 0), agents("b", 1)
    size = 16 << 20
    a.alloc("buf", size, False, None)
    b.alloc("buf", size, False, 9)
    connect(a, b)
    remote = b.descs("buf", 16, size // 16)
    os.kill(b.proc.pid, signal.SIGSTOP)  # b serves nothing more, nor beats
    t0 = time.monotonic()
    hid = a.start("READ", "buf", 16, size // 16, b.name, remote, b"")
    assert a.check(hid) == "PROC"
    os.kill(b.proc.pid, signal.SIGKILL)
    state, _ = a.wait(hid, 20.0)
    took = time.monotonic() - t0
    assert state.startswith("ERR")
    assert "RemoteDisconnect" in state or state == "ERR"
    # Dead once its heartbeat stood still for its lease and a quarter (the
    # earliest a silent host can be called dead without racing its own
    # renewal: docs/membership.md), seen by a liveness check of every 10 ms;
    # 0.5 s more for a loaded 2-core machine's scheduling.
    assert took < 1.25 * LEASE_MS / 1000 + 0.5, f"the error came {took:.2f} s after b stopped"
    a.release(hid)
    with pytest.raises(RuntimeError):
        a.xfer("READ", "buf", 16, size // 16, b.name, remote)


def test_plugin_of_another_api_version_is_refused(env, tmp_path):
    other = os.environ.get("CXLRT_NIXL_PLUGIN_APIV2")
    assert other and os.path.isfile(other), "CXLRT_NIXL_PLUGIN_APIV2 names no plugin"
    d = tmp_path / "plugins"
    d.mkdir()
    (d / "libplugin_CXLRT.so").symlink_to(other)
    code = ("from nixl._api import nixl_agent, nixl_agent_config\n"
            "a = nixl_agent('v2', nixl_agent_config(backends=[]))\n"
            "try:\n"
            "    a.create_backend('CXLRT')\n"
            "except Exception as e:\n"
            "    print('refused', type(e).__name__)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **env, "NIXL_PLUGIN_DIR": str(d)})
    # Listed by its file name, refused when loaded, saying why; no crash.
    assert r.returncode == 0, r.stderr
    assert "refused" in r.stdout, r.stdout
    assert "expected 1, got 2" in r.stderr, r.stderr


def test_plugin_dir_keeps_the_wheels_plugins(env, tmp_path):
    # `python -m cxlrt.nixl plugin-dir`: CXLRT beside the wheel's own plugins,
    # which must still load from there (their RPATHs are relative to it).
    r = subprocess.run([sys.executable, "-m", "cxlrt.nixl", "plugin-dir", "--dir",
                        str(tmp_path / "p")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    folder = r.stdout.strip()
    assert os.path.isfile(os.path.join(folder, "libplugin_CXLRT.so"))
    code = ("from nixl._api import nixl_agent, nixl_agent_config\n"
            "a = nixl_agent('both', nixl_agent_config(backends=['CXLRT', 'UCX']))\n"
            "print(sorted(a.backends))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **env, "NIXL_PLUGIN_DIR": folder})
    assert r.returncode == 0, r.stderr
    assert "['CXLRT', 'UCX']" in r.stdout, r.stdout + r.stderr
    bad = subprocess.run([sys.executable, "-m", "cxlrt.nixl", "plugin-dir"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "CXLRT_NIXL_PLUGIN": str(tmp_path / "none.so")})
    assert bad.returncode == 1 and "CXLRT_NIXL_PLUGIN=" in bad.stderr


def test_engine_vtable_matches_the_wheels_plugins():
    # 27 virtual slots (two destructors, then NIXL's methods) plus the
    # offset-to-top and typeinfo words: the same size as the vtable of every
    # engine in the wheel's own plugins (docs/nixl.md, "The plugin interface").
    def vtable_sizes(path, prefix):
        out = subprocess.run(["nm", "-C", "-S", path], capture_output=True, text=True,
                             check=True).stdout
        return {line.split(" ", 3)[3]: int(line.split()[1], 16) for line in out.splitlines()
                if " vtable for " in line and line.split(" ", 3)[3].startswith(prefix)}

    ours = vtable_sizes(cxlrt_nixl.plugin_path(), "vtable for cxlrt::nixl::CxlrtEngine")
    assert list(ours.values()) == [29 * 8], ours
    wheel = os.path.realpath(os.path.join(cxlrt_nixl.wheel_plugin_dir(), "libplugin_POSIX.so"))
    theirs = vtable_sizes(wheel, "vtable for nixlPosixEngine")
    assert theirs == {"vtable for nixlPosixEngine": 29 * 8}, theirs
