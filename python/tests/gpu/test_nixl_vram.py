"""NIXL's CXLRT backend with GPU memory (VRAM_SEG, docs/nixl.md): CUDA
tensors registered with two agents, moved READ and WRITE between VRAM and
DRAM and between VRAM and VRAM, through the pool by the gpu/ layer's DMA
engine. Skipped, saying why, without a GPU, without NIXL in this
interpreter, or without the plugin (scripts/gpu-check.sh runs it on a GPU
machine)."""

import os
import uuid

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("nixl._api", reason="NIXL is not installed in this interpreter")
import numpy as np  # noqa: E402

import cxlrt  # noqa: E402
from cxlrt import nixl as cxlrt_nixl  # noqa: E402

if not torch.cuda.is_available() or not cxlrt.devices_available():
    pytest.skip(f"no GPU here: {cxlrt.devices_unavailable_reason() or 'torch sees none'}",
                allow_module_level=True)
try:
    cxlrt_nixl.plugin_path()
except FileNotFoundError as e:
    pytest.skip(str(e), allow_module_level=True)


@pytest.fixture
def agents(tmp_path):
    uri = f"emu://nixl-vram-{os.getpid()}-{uuid.uuid4().hex[:6]}?size=512M"
    pool = cxlrt.Pool.create(uri)
    os.environ.update({"CXLRT_POOL": pool.uri, "UCX_MODULES": "^ib,rdmacm",
                       "NIXL_PLUGIN_DIR": cxlrt_nixl.plugin_dir(str(tmp_path / "plugins"))})
    from nixl._api import nixl_agent, nixl_agent_config

    a = nixl_agent(f"a-{uuid.uuid4().hex[:6]}", nixl_agent_config(backends=["CXLRT"]))
    b = nixl_agent(f"b-{uuid.uuid4().hex[:6]}", nixl_agent_config(backends=["CXLRT"]))
    yield a, b
    del a, b
    del pool
    cxlrt.Pool.destroy(uri, force=True)


def _run(agent, op, local, remote, peer):
    h = agent.initialize_xfer(op, local, remote, peer, b"")
    state = agent.transfer(h)
    while state == "PROC":
        state = agent.check_xfer_state(h)
    agent.release_xfer_handle(h)
    return state


def test_vram_to_and_from_dram_and_vram(agents):
    a, b = agents
    n = 3 << 20  # several staged chunks
    gen = torch.Generator().manual_seed(3)
    host_src = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
    a_gpu = torch.zeros(n, dtype=torch.uint8, device="cuda")
    b_gpu = torch.zeros(n, dtype=torch.uint8, device="cuda")
    b_host = host_src.clone()
    a.register_memory([(a_gpu.data_ptr(), n, a_gpu.device.index, "")], "VRAM")
    b.register_memory([(b_gpu.data_ptr(), n, b_gpu.device.index, "")], "VRAM")
    b.register_memory([(b_host.data_ptr(), n, 0, "")], "DRAM")
    peer = a.add_remote_agent(b.get_agent_metadata())
    b.add_remote_agent(a.get_agent_metadata())
    dev = a_gpu.device.index

    # b's DRAM into a's VRAM, then a's VRAM into b's VRAM.
    local = a.get_xfer_descs([(a_gpu.data_ptr(), n, dev)], "VRAM")
    remote = a.get_xfer_descs([(b_host.data_ptr(), n, 0)], "DRAM")
    assert _run(a, "READ", local, remote, peer) == "DONE"
    torch.cuda.synchronize()
    assert torch.equal(a_gpu.cpu(), host_src)
    remote = a.get_xfer_descs([(b_gpu.data_ptr(), n, dev)], "VRAM")
    assert _run(a, "WRITE", local, remote, peer) == "DONE"
    torch.cuda.synchronize()
    assert torch.equal(b_gpu.cpu(), host_src)
    assert np.array_equal(b_host.numpy(), host_src.numpy())
