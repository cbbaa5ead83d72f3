"""vLLM with NIXL's CXLRT backend, as far as it runs on a CPU
(docs/nixl.md): vLLM's NixlWrapper with backends=["CXLRT"] moving blocks
between two agents, and vLLM's NixlConnector selected by
kv_connector_extra_config={"backends": ["CXLRT"]}: its scheduler side, and
its worker registering paged KV caches of a CPU device config with the
CXLRT backend, whose blocks another agent then reads through the pool.
"""

from __future__ import annotations

import os
import uuid

import pytest

# Before vLLM is imported: its platform is chosen once, at import.
os.environ["VLLM_TARGET_DEVICE"] = "cpu"
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ["UCX_MODULES"] = "^ib,rdmacm"

import numpy as np  # noqa: E402
import torch  # noqa: E402

import cxlrt  # noqa: E402
from cxlrt import nixl as cxlrt_nixl  # noqa: E402


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    uri = f"emu://nixl-vllm-{os.getpid()}-{uuid.uuid4().hex[:6]}?size=256M"
    p = cxlrt.Pool.create(uri)
    os.environ["CXLRT_POOL"] = p.uri
    os.environ["NIXL_PLUGIN_DIR"] = cxlrt_nixl.plugin_dir(str(tmp_path_factory.mktemp("plugins")))
    yield p.uri
    del p
    cxlrt.Pool.destroy(uri, force=True)


def _wait(agent, handle):
    state = agent.transfer(handle)
    while state == "PROC":
        state = agent.check_xfer_state(handle)
    return state


def _notifs(agent, count):
    got = []
    for _ in range(20000):
        for who, msgs in agent.get_new_notifs().items():
            got += [(who, m) for m in msgs]
        if len(got) >= count:
            break
    return got


def test_nixl_wrapper_moves_blocks(pool):
    from vllm.distributed.nixl_utils import NixlWrapper, nixl_agent_config

    a = NixlWrapper(f"a-{uuid.uuid4().hex[:6]}", nixl_agent_config(backends=["CXLRT"]))
    b = NixlWrapper(f"b-{uuid.uuid4().hex[:6]}", nixl_agent_config(backends=["CXLRT"]))
    assert list(a.backends) == ["CXLRT"]
    n, size = 64, 16 << 10
    src = np.random.default_rng(1).integers(0, 256, n * size, dtype=np.uint8)
    dst = np.zeros(n * size, dtype=np.uint8)
    a.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    b.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
    peer = a.add_remote_agent(b.get_agent_metadata())
    b.add_remote_agent(a.get_agent_metadata())
    blocks = list(range(n))[::-1]  # scattered: block i of b into block n-1-i of a
    local = a.get_xfer_descs([(dst.ctypes.data + i * size, size, 0) for i in range(n)], "DRAM")
    remote = a.get_xfer_descs([(src.ctypes.data + j * size, size, 0) for j in blocks], "DRAM")
    h = a.initialize_xfer("READ", local, remote, peer, b"kv-ready")
    assert _wait(a, h) == "DONE"
    a.release_xfer_handle(h)
    assert np.array_equal(dst.reshape(n, size), src.reshape(n, size)[blocks])
    assert _notifs(b, 1) == [(a.name, b"kv-ready")]
    # As NixlConnector's worker reads: descriptor lists prepared once on each
    # side, transfers made from block indices.
    dst[:] = 0
    local_side = a.prep_xfer_dlist("", [(dst.ctypes.data + i * size, size, 0)
                                        for i in range(n)], "DRAM")
    remote_side = a.prep_xfer_dlist(peer, [(src.ctypes.data + i * size, size, 0)
                                           for i in range(n)], "DRAM")
    picks = [5, 9, 1, 60]
    h = a.make_prepped_xfer("READ", local_side, [0, 1, 2, 3], remote_side, picks, b"prepped")
    assert _wait(a, h) == "DONE"
    a.release_xfer_handle(h)
    assert np.array_equal(dst.reshape(n, size)[:4], src.reshape(n, size)[picks])
    assert not dst.reshape(n, size)[4:].any()
    assert _notifs(b, 1) == [(a.name, b"prepped")]


def test_nixl_connector_on_cpu(pool, tmp_path):
    from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                             SchedulerConfig, VllmConfig, set_current_vllm_config)
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
    from vllm.distributed.nixl_utils import NixlWrapper, nixl_agent_config
    from vllm.distributed.parallel_state import (ensure_model_parallel_initialized,
                                                 init_distributed_environment)
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    block, blocks, heads, head = 32, 64, 2, 64  # CPU attention takes multiples of 32
    layers = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
    (tmp_path / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, '
        '"intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 2, '
        '"head_dim": 64, "num_hidden_layers": 2, "vocab_size": 1000, '
        '"max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "float16"}')
    config = VllmConfig(
        model_config=ModelConfig(model=str(tmp_path), skip_tokenizer_init=True, dtype="float16",
                                 max_model_len=2048, seed=0),
        cache_config=CacheConfig(block_size=block, enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256,
                                         max_model_len=2048, is_encoder_decoder=False),
        device_config=DeviceConfig("cpu"),
        # The line that selects the backend (docs/nixl.md).
        kv_transfer_config=KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_producer",
                                            kv_buffer_device="cpu",
                                            kv_connector_extra_config={"backends": ["CXLRT"]}))
    spec = FullAttentionSpec(block_size=block, num_kv_heads=heads, head_size=head,
                             dtype=torch.float16)
    kv_config = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[],
                              kv_cache_groups=[KVCacheGroupSpec(list(layers), spec)])
    config.cache_config.num_gpu_blocks = blocks
    config.cache_config.kv_cache_layout = "NHD"
    scheduler = Scheduler(vllm_config=config, kv_cache_config=kv_config,
                          structured_output_manager=StructuredOutputManager(config),
                          block_size=block, log_stats=False)
    assert "Nixl" in type(scheduler.connector).__name__

    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{tmp_path}/dist")
        ensure_model_parallel_initialized(1, 1)
        worker = KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER, kv_config)
    # Blocks first, as vLLM's CPU attention lays its cache out.
    kv = {name: torch.randn((blocks, 2, block, heads, head)).to(torch.float16)
          for name in layers}
    worker.register_kv_caches(kv)
    prefill = worker.connector_worker.nixl_wrapper
    assert list(prefill.backends) == ["CXLRT"]

    # A decode-side agent reads blocks 3 and 7 of layer 1 as NixlConnector
    # would: straight from the registered cache, through the pool.
    decode = NixlWrapper(f"decode-{uuid.uuid4().hex[:6]}", nixl_agent_config(backends=["CXLRT"]))
    out = torch.zeros((2, 2, block, heads, head), dtype=torch.float16)
    decode.register_memory([(out.data_ptr(), out.nbytes, 0, "")], "DRAM")
    peer = decode.add_remote_agent(prefill.get_agent_metadata())
    src = kv[layers[1]]
    nbytes = src[0].nbytes
    remote = decode.get_xfer_descs([(src[i].data_ptr(), nbytes, 0) for i in (3, 7)], "DRAM")
    local = decode.get_xfer_descs([(out[i].data_ptr(), nbytes, 0) for i in (0, 1)], "DRAM")
    h = decode.initialize_xfer("READ", local, remote, peer, b"")
    assert _wait(decode, h) == "DONE"
    decode.release_xfer_handle(h)
    assert torch.equal(out[0], src[3]) and torch.equal(out[1], src[7])
