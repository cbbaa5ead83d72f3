"""The cxlrt vLLM KV connector, driven by vLLM's own v1 Scheduler (CPU
device config, a tiny local model config, no weights) and loaded by vLLM's
own connector factory through kv_connector_module_path, as a server loads
it. The worker side runs in the same process as its scheduler, against
paged KV caches shaped as vLLM's attention backends allocate them; the
"forward pass" writes each computed token's KV as a function of its whole
prefix, so a block loaded from the store can be checked exactly. vLLM's
model runner needs a GPU (or vLLM's CPU build), so it is the one part not
run here. Needs torch and vllm (the project's .venv)."""

import functools
import json
import multiprocessing as mp
import os
import time
import uuid
import zlib

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,  # noqa: E402
                         ParallelConfig, SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, MLAAttentionSpec)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

import cxlrt  # noqa: E402
from cxlrt.connectors.vllm import CxlrtConnector  # noqa: E402

BLOCK = 16
BLOCKS = 64
HEADS, HEAD_SIZE = 2, 64
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
        "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": HEADS,
        "head_dim": HEAD_SIZE, "num_hidden_layers": len(LAYERS), "vocab_size": 1000,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "float16"}))
    return str(d)


@pytest.fixture
def uri():
    u = f"emu://vllm-{os.getpid()}-{uuid.uuid4().hex[:6]}?size=256M"
    pool = cxlrt.Pool.create(u)
    yield pool.uri
    del pool
    cxlrt.Pool.destroy(u, force=True)


class Server:
    """One vLLM server's scheduler and worker-side connector, with its own
    paged KV caches (`layout`: "kv_first" [2, blocks, ...] as FlashAttention
    allocates, or "blocks_first" [blocks, 2, ...] as FlashInfer does)."""

    def __init__(self, model_dir, uri, layout="kv_first", layers=LAYERS, on_load_failure="fail",
                 load_async=False, tp=1):
        config = VllmConfig(
            model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float16",
                                     max_model_len=2048, seed=0),
            cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
            parallel_config=ParallelConfig(tensor_parallel_size=tp),
            scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256,
                                             max_model_len=2048, is_encoder_decoder=False),
            device_config=DeviceConfig("cpu"),
            kv_transfer_config=KVTransferConfig(
                kv_connector="CxlrtConnector", kv_connector_module_path="cxlrt.connectors.vllm",
                kv_role="kv_both", kv_connector_extra_config={"pool": uri,
                                                              "load_async": load_async},
                kv_load_failure_policy=on_load_failure))
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_SIZE,
                                 dtype=torch.float16)
        kv_config = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[],
                                  kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)])
        config.cache_config.num_gpu_blocks = BLOCKS
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(BLOCK, sha256)
        self.config = config
        self.scheduler = Scheduler(vllm_config=config, kv_cache_config=kv_config,
                                   structured_output_manager=StructuredOutputManager(config),
                                   block_size=BLOCK, log_stats=True)
        assert isinstance(self.scheduler.connector, CxlrtConnector)
        shape = ((2, BLOCKS, BLOCK, HEADS, HEAD_SIZE) if layout == "kv_first"
                 else (BLOCKS, 2, BLOCK, HEADS, HEAD_SIZE))
        self.layout = layout
        self.kv = {name: torch.zeros(shape, dtype=torch.float16) for name in layers}
        # The worker side, made by vLLM's factory as a worker makes it, one
        # per tensor-parallel rank (after the worker set its rank). The ranks
        # share one cache here: each stores and loads it in its own
        # namespace, as each would its own heads.
        self.workers = []
        for rank in range(tp):
            config.parallel_config.rank = rank
            w = KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER, kv_config)
            w.register_kv_caches(self.kv)
            self.workers.append(w)
        config.parallel_config.rank = 0
        self.worker = self.workers[0]
        self.stats = []  # the scheduler's kv_connector_stats payloads, as the loggers get them
        self.requests = {}
        self.first_computed = {}  # request -> tokens it started with (local + external)
        self.load_errors = set()
        self.blocks_of = {}  # request -> its KV cache blocks
        self.waited = set()  # requests that waited for an asynchronous load

    def add(self, req_id, prompt, max_tokens=2, cache_salt=None):
        self.requests[req_id] = Request(
            req_id, list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            None, cache_salt=cache_salt, block_hasher=self.hasher)
        self.scheduler.add_request(self.requests[req_id])

    def tokens(self, req_id):
        return list(self.requests[req_id].all_token_ids)

    def page(self, layer, block, kv):  # the [BLOCK, HEADS, HEAD_SIZE] page
        t = self.kv[layer]
        return t[kv, block] if self.layout == "kv_first" else t[block, kv]

    def run(self):
        """Steps until every request finished; the "forward" writes each
        computed token's KV and samples token 7."""
        deadline = time.monotonic() + 60
        if not hasattr(self, "aggregator"):
            self.aggregator = KVOutputAggregator(len(self.workers))
        while time.monotonic() < deadline:
            if not self.scheduler.has_unfinished_requests():
                for w in self.workers:
                    w.shutdown()
                return
            out = self.scheduler.schedule()
            self.waited |= {r for r, q in self.requests.items()
                            if q.status == RequestStatus.WAITING_FOR_REMOTE_KVS}
            if not out.num_scheduled_tokens:
                time.sleep(0.001)  # only loads in flight
            for w in self.workers:
                w.bind_connector_metadata(out.kv_connector_metadata)
                w.start_load_kv(None)
            for n in out.scheduled_new_reqs:
                self.first_computed.setdefault(n.req_id, n.num_computed_tokens)
            computed = {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs}
            c = out.scheduled_cached_reqs
            for i, r in enumerate(c.req_ids):
                computed[r] = c.num_computed_tokens[i]
            for r, n in out.num_scheduled_tokens.items():
                ids = self.blocks_of[r] = self.block_ids(r)
                for p in range(computed[r], computed[r] + n):
                    self.write(r, ids, p)
            reqs = list(out.num_scheduled_tokens)
            sampled = []
            for r in reqs:
                done = computed[r] + out.num_scheduled_tokens[r] >= self.requests[r].num_tokens
                sampled.append([7] if done else [])
            # Each worker's output, combined by vLLM's KVOutputAggregator as
            # its executor combines its workers': a load is done when every
            # worker's is; the stats of every rank merged.
            outputs = []
            for w in self.workers:
                w.wait_for_save()
                _, done = w.get_finished(out.finished_req_ids)
                errors = w.get_block_ids_with_load_errors()
                stats = w.get_kv_connector_stats()
                w.clear_connector_metadata()
                outputs.append(ModelRunnerOutput(
                    req_ids=reqs, req_id_to_index={r: i for i, r in enumerate(reqs)},
                    sampled_token_ids=sampled,
                    kv_connector_output=KVConnectorOutput(finished_recving=done,
                                                          invalid_block_ids=errors,
                                                          kv_connector_stats=stats)))
            merged = self.aggregator.aggregate(outputs)
            self.load_errors |= merged.kv_connector_output.invalid_block_ids
            for eco in self.scheduler.update_from_output(out, merged).values():
                if eco.scheduler_stats and eco.scheduler_stats.kv_connector_stats:
                    self.stats.append(eco.scheduler_stats.kv_connector_stats)
        raise AssertionError("the requests did not finish in 60 s")

    def block_ids(self, req_id):
        return self.scheduler.kv_cache_manager.get_blocks(req_id).get_block_ids()[0]

    def write(self, req_id, ids, pos):
        block = ids[pos // BLOCK]
        for li, layer in enumerate(self.kv):
            for kv in (0, 1):
                self.page(layer, block, kv)[pos % BLOCK] = expected(self.tokens(req_id), pos,
                                                                     li, kv)

    def block_matches(self, req_id, index):
        """Whether the request's index-th block holds its prefix's KV."""
        block = self.blocks_of[req_id][index]  # as it ran (freed since, not reused)
        return all(torch.equal(self.page(layer, block, kv)[p % BLOCK],
                               expected(self.tokens(req_id), p, li, kv))
                   for li, layer in enumerate(self.kv) for kv in (0, 1)
                   for p in range(index * BLOCK, (index + 1) * BLOCK))


def expected(tokens, pos, layer, kv):
    """The KV of position pos: a function of the tokens up to it (exact in
    fp16: integers below 2048)."""
    seed = zlib.crc32(bytes(str(tokens[:pos + 1]), "ascii")) ^ (layer * 2 + kv)
    base = torch.arange(HEADS * HEAD_SIZE, dtype=torch.int32).reshape(HEADS, HEAD_SIZE)
    return ((base * 31 + seed) % 2048).to(torch.float16)


def prompt(n, salt=0):
    return [(i * 13 + salt) % 1000 for i in range(n)]


def test_vllm_loads_it_through_kv_connector_module_path(model_dir, uri):
    s = Server(model_dir, uri)
    assert type(s.worker).__name__ == "CxlrtConnector"
    assert s.worker.role == KVConnectorRole.WORKER


def test_the_general_plugin_entry_point_registers_the_connector_by_name(tmp_path):
    # The entry point as pip installs it (python/pyproject.toml into a
    # dist-info's entry_points.txt), found by vLLM's own plugin loading in
    # a fresh process; then vLLM's factory makes the class from the name.
    import tomllib
    pyproject = os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml")
    with open(pyproject, "rb") as f:
        meta = tomllib.load(f)["project"]
    plugins = meta["entry-points"]["vllm.general_plugins"]
    assert plugins == {"cxlrt": "cxlrt.connectors.vllm_plugin:register"}, plugins
    info = tmp_path / f"cxlrt-{meta['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: cxlrt\nVersion: {meta['version']}\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\n" + "".join(f"{k} = {v}\n" for k, v in plugins.items()))
    code = """
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.plugins import load_general_plugins
assert "CxlrtConnector" not in KVConnectorFactory._registry
load_general_plugins()
import cxlrt.connectors.vllm_plugin as plugin
plugin.register()  # again: vLLM may load plugins more than once
cls = KVConnectorFactory._registry["CxlrtConnector"]()
assert cls.__module__ == "cxlrt.connectors.vllm", cls.__module__
print("REGISTERED", cls.__name__)
"""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    env.pop("VLLM_PLUGINS", None)  # every plugin: vLLM's default
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "REGISTERED CxlrtConnector" in r.stdout, r.stdout + r.stderr


def test_a_repeated_prompt_loads_its_prefix_from_the_store(model_dir, uri):
    a = Server(model_dir, uri)
    a.add("r1", prompt(100))
    a.run()
    # Six full blocks of the prompt are stored (the seventh is partial).
    st = a.scheduler.connector.store.stats()
    assert sum(n["entries"] for n in st["namespaces"].values()) == 6, st

    b = Server(model_dir, uri)  # another server: nothing of its own cached
    b.add("r2", prompt(100) + prompt(30, salt=5))
    b.run()
    assert b.first_computed["r2"] == 96
    assert not b.load_errors
    for i in range(6):
        assert b.block_matches("r2", i), f"block {i}"


class Reported:
    """What vLLM reports of a server's connector stats: its log line's figures
    (KVConnectorLogging, which the LoggingStatLogger keeps) and its
    Prometheus metrics (KVConnectorProm, which the PrometheusStatLogger
    keeps), fed the SchedulerStats payloads as the loggers are; the metrics
    in a registry of the test's own."""

    def __init__(self, server):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (KVConnectorLogging,
                                                                          KVConnectorProm)
        self.registry = reg = CollectorRegistry()

        class Prom(KVConnectorProm):
            _gauge_cls = functools.partial(Gauge, registry=reg)
            _counter_cls = functools.partial(Counter, registry=reg)
            _histogram_cls = functools.partial(Histogram, registry=reg)

        logging_ = KVConnectorLogging(server.config.kv_transfer_config)
        prom = Prom(server.config, ["model_name", "engine"], {0: ["m", "0"]})
        assert server.stats, "the scheduler reported no connector stats"
        for payload in server.stats:
            logging_.observe(payload)
            prom.observe(payload, 0)
        lines = []
        logging_.log(lambda fmt, *args: lines.append(fmt % args))
        assert len(lines) == 1 and lines[0].startswith("KV Transfer metrics: "), lines
        self.logged = dict(kv.split("=") for kv in lines[0].split(": ", 1)[1].split(", "))

    def prom(self, name, suffix="_total"):
        return self.registry.get_sample_value(f"vllm:cxlrt_{name}{suffix}",
                                              {"model_name": "m", "engine": "0"})


def entries(server):
    return {ns: n["entries"] for ns, n in
            server.scheduler.connector.store.stats()["namespaces"].items()}


@pytest.mark.parametrize("tp", [1, 2])
def test_vllm_reports_lookups_hits_bytes_and_load_time_right_across_tp_ranks(model_dir, uri, tp):
    block_bytes = len(LAYERS) * 2 * BLOCK * HEADS * HEAD_SIZE * 2  # K and V of every layer, fp16
    a = Server(model_dir, uri, tp=tp)
    a.add("r0", prompt(40, salt=3))
    a.add("r1", prompt(100))
    a.run()
    stored = entries(a)
    assert len(stored) == tp and set(stored.values()) == {8}, stored  # 2 + 6 on each rank
    ra = Reported(a)
    assert ra.logged["Lookups"] == "2" and ra.logged["Hit requests"] == "0"
    assert ra.logged["Stored blocks"] == "8"
    assert ra.logged["Stored bytes"] == str(8 * block_bytes * tp)
    assert ra.logged["Workers"] == str(tp)
    assert ra.prom("stored_blocks") == 8 and ra.prom("lookups") == 2
    assert ra.prom("store_seconds", "_count") >= tp  # a sample per rank and step that stored

    b = Server(model_dir, uri, tp=tp)
    b.add("r2", prompt(100) + prompt(30, salt=5))  # 6 blocks hit
    b.add("r3", prompt(50, salt=9))  # a miss
    b.add("r4", prompt(40, salt=3) + prompt(8, salt=4))  # 2 blocks hit
    b.run()
    assert b.first_computed == {"r2": 96, "r3": 0, "r4": 32}
    new = sum(entries(b).values()) - sum(stored.values())
    r = Reported(b)
    assert r.logged["Lookups"] == "3"
    assert r.logged["Hit requests"] == "2"
    assert r.logged["Hit rate"] == str(round(2 / 3, 4))
    assert r.logged["Hit tokens"] == str(96 + 32)
    assert r.logged["Loaded blocks"] == "8"  # once each, however many ranks loaded it
    assert r.logged["Loaded bytes"] == str(8 * block_bytes * tp)  # every rank's shard
    assert r.logged["Failed block loads"] == "0"
    assert float(r.logged["Avg load time (ms)"]) > 0
    assert r.logged["Stored blocks"] == str(new // tp)
    assert r.logged["Stored bytes"] == str(new * block_bytes)
    # The same through Prometheus.
    assert r.prom("lookups") == 3 and r.prom("hit_requests") == 2
    assert r.prom("hit_tokens") == 128 and r.prom("loaded_blocks") == 8
    assert r.prom("loaded_bytes") == 8 * block_bytes * tp
    assert r.prom("stored_blocks") == new // tp and r.prom("stored_bytes") == new * block_bytes
    # One load per rank (both hits are loaded in one step); each a sample.
    assert r.prom("load_seconds", "_count") == tp
    assert r.prom("load_seconds", "_sum") > 0


def test_failed_loads_are_reported(model_dir, uri):
    a = Server(model_dir, uri)
    a.add("r1", prompt(50))
    a.run()
    # A cache with a third layer: the stored values are too small, the loads fail.
    b = Server(model_dir, uri, layers=LAYERS + ["model.layers.2.self_attn.attn"],
               on_load_failure="recompute")
    b.add("r2", prompt(50))
    b.run()
    assert len(b.load_errors) == 3
    r = Reported(b)
    assert r.logged["Hit requests"] == "1" and r.logged["Hit tokens"] == "48"
    assert r.logged["Failed block loads"] == "3" and r.logged["Loaded blocks"] == "0"
    assert r.prom("load_failed_blocks") == 3 and r.prom("loaded_blocks") == 0


def test_only_the_common_prefix_hits_and_a_different_salt_misses(model_dir, uri):
    a = Server(model_dir, uri)
    a.add("r1", prompt(80))
    a.run()
    b = Server(model_dir, uri)
    # Diverges inside block 2: blocks 0 and 1 hit (a block's key names its
    # whole prefix, so later blocks never do).
    p = prompt(80)
    p[40] = 999
    b.add("r2", p)
    b.run()
    assert b.first_computed["r2"] == 32
    assert b.block_matches("r2", 0) and b.block_matches("r2", 1)
    c = Server(model_dir, uri)
    c.add("r3", prompt(80), cache_salt="tenant-b")
    c.run()
    assert c.first_computed["r3"] == 0


def test_blocks_that_decoding_fills_are_stored_for_the_next_turn(model_dir, uri):
    a = Server(model_dir, uri)
    a.add("turn1", prompt(30), max_tokens=20)
    a.run()
    assert len(a.tokens("turn1")) == 50  # blocks 1 and 2 hold generated tokens
    b = Server(model_dir, uri)
    b.add("turn2", a.tokens("turn1") + prompt(10, salt=3))
    b.run()
    assert b.first_computed["turn2"] == 48
    assert all(b.block_matches("turn2", i) for i in range(3))


def test_a_prompt_that_is_all_cached_still_computes_its_last_token(model_dir, uri):
    a = Server(model_dir, uri)
    a.add("r1", prompt(64))
    a.run()
    b = Server(model_dir, uri)
    b.add("r2", prompt(64))
    b.run()
    assert b.first_computed["r2"] == 48  # three of four blocks: the last token computes
    assert all(b.block_matches("r2", i) for i in range(3))


def test_layouts_of_the_same_bytes_share_blocks(model_dir, uri):
    a = Server(model_dir, uri, layout="kv_first")
    a.add("r1", prompt(50))
    a.run()
    b = Server(model_dir, uri, layout="blocks_first")
    b.add("r2", prompt(50))
    b.run()
    assert b.first_computed["r2"] == 48
    assert all(b.block_matches("r2", i) for i in range(3))


def test_a_block_that_cannot_load_is_recomputed_or_fails_as_vllm_is_told(model_dir, uri):
    a = Server(model_dir, uri)
    a.add("r1", prompt(50))
    a.run()
    # A worker whose cache holds a third layer: the stored values are too
    # small for its blocks, so loads fail (never partial or wrong bytes),
    # and vLLM's own recovery takes over: kv_load_failure_policy
    # "recompute" computes those blocks again ...
    layers = LAYERS + ["model.layers.2.self_attn.attn"]
    b = Server(model_dir, uri, layers=layers, on_load_failure="recompute")
    b.add("r2", prompt(50))
    b.run()
    assert len(b.load_errors) == 3
    assert all(b.block_matches("r2", i) for i in range(3))
    assert b.tokens("r2") == prompt(50) + [7, 7]  # finished
    # ... and "fail" (vLLM's default) ends the request with an error.
    c = Server(model_dir, uri, layers=layers)
    c.add("r3", prompt(50))
    c.run()
    assert len(c.load_errors) == 3
    assert c.tokens("r3") == prompt(50)  # nothing sampled


def test_asynchronous_loads_hold_only_their_request_while_others_run(model_dir, uri):
    a = Server(model_dir, uri)
    a.add("r1", prompt(100))
    a.run()
    b = Server(model_dir, uri, load_async=True)
    b.add("hit", prompt(100) + prompt(30, salt=5))
    b.add("miss", prompt(60, salt=9))
    b.run()
    assert b.waited == {"hit"}  # it waited for its load; the miss did not
    assert b.first_computed["hit"] == 96 and b.first_computed["miss"] == 0
    assert not b.load_errors
    assert all(b.block_matches("hit", i) for i in range(6))
    assert b.tokens("miss") == prompt(60, salt=9) + [7, 7]
    # Counted once though vLLM admits the hit twice (for its load, then to run).
    r = Reported(b)
    assert (r.logged["Lookups"], r.logged["Hit requests"], r.logged["Loaded blocks"]) == \
        ("2", "1", "6")


def test_an_asynchronous_load_that_fails_is_recomputed(model_dir, uri):
    a = Server(model_dir, uri)
    a.add("r1", prompt(50))
    a.run()
    layers = LAYERS + ["model.layers.2.self_attn.attn"]  # values too small: loads fail
    b = Server(model_dir, uri, layers=layers, on_load_failure="recompute", load_async=True)
    b.add("r2", prompt(50))
    b.run()
    assert b.waited == {"r2"} and len(b.load_errors) == 3
    assert Reported(b).logged["Failed block loads"] == "3"
    assert all(b.block_matches("r2", i) for i in range(3))
    assert b.tokens("r2") == prompt(50) + [7, 7]


def _second_server(model_dir, uri, q):
    try:
        b = Server(model_dir, uri)
        b.add("r2", prompt(70))
        b.run()
        q.put((b.first_computed["r2"], all(b.block_matches("r2", i) for i in range(4))))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        q.put(repr(e))


def test_a_server_in_another_process_loads_what_this_one_stored(model_dir, uri):
    a = Server(model_dir, uri)
    a.add("r1", prompt(70))
    a.run()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_second_server, args=(model_dir, uri, q))
    p.start()
    got = q.get(timeout=300)
    p.join(60)
    assert got == (64, True), got


def test_bad_caches_are_refused_saying_why(model_dir, uri):
    s = Server(model_dir, uri)
    with pytest.raises(ValueError, match="no dimension of 64 blocks"):
        s.worker.register_kv_caches({"x": torch.zeros(3, 5, 16, dtype=torch.float16)})
    with pytest.raises(ValueError, match="not contiguous"):
        s.worker.register_kv_caches(
            {"x": torch.zeros(BLOCKS, 16, 4, dtype=torch.float16).transpose(1, 2)})


DCP = 2
MLA_HEAD = HEADS * HEAD_SIZE  # kv_lora_rank + qk_rope_head_dim, below


@pytest.fixture(scope="module")
def mla_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("mla")
    (d / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 64,
        "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": len(LAYERS),
        "vocab_size": 1000, "kv_lora_rank": MLA_HEAD - 16, "q_lora_rank": None,
        "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "first_k_dense_replace": len(LAYERS),
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "torch_dtype": "float16"}))
    return str(d)


class DcpServer(Server):
    """A server of an MLA model with decode context parallelism (TP 2, DCP
    2): its scheduler counts in blocks of BLOCK * DCP tokens, as vLLM's
    engine core sets it up, and each of its two workers (the connector made
    by vLLM's factory after the worker set its rank in parallel_config, as
    vLLM's workers do) has its own MLA cache [blocks, BLOCK, MLA_HEAD]
    holding its slice of each block: token p on DCP rank p % DCP, at p's
    place among that rank's tokens of the block (interleave size 1)."""

    def __init__(self, mla_dir, uri):
        config = VllmConfig(
            model_config=ModelConfig(model=mla_dir, skip_tokenizer_init=True, dtype="float16",
                                     max_model_len=2048, seed=0),
            cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
            parallel_config=ParallelConfig(tensor_parallel_size=2,
                                           decode_context_parallel_size=DCP),
            scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256,
                                             max_model_len=2048, is_encoder_decoder=False),
            device_config=DeviceConfig("cpu"),
            kv_transfer_config=KVTransferConfig(
                kv_connector="CxlrtConnector", kv_connector_module_path="cxlrt.connectors.vllm",
                kv_role="kv_both", kv_connector_extra_config={"pool": uri}))
        assert config.model_config.use_mla
        spec = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=MLA_HEAD,
                                dtype=torch.float16)
        kv_config = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[],
                                  kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)])
        config.cache_config.num_gpu_blocks = BLOCKS
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(BLOCK * DCP, sha256)
        self.scheduler = Scheduler(vllm_config=config, kv_cache_config=kv_config,
                                   structured_output_manager=StructuredOutputManager(config),
                                   block_size=BLOCK * DCP, log_stats=False)
        self.workers, self.rank_kv = [], []
        for rank in range(DCP):
            config.parallel_config.rank = rank
            w = KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER, kv_config)
            kv = {name: torch.zeros(BLOCKS, BLOCK, MLA_HEAD, dtype=torch.float16)
                  for name in LAYERS}
            w.register_kv_caches(kv)
            self.workers.append(w)
            self.rank_kv.append(kv)
        config.parallel_config.rank = 0
        self.worker = self.workers[0]
        self.requests, self.first_computed, self.load_errors = {}, {}, set()
        self.blocks_of, self.waited = {}, set()

    def write(self, req_id, ids, pos):
        span = BLOCK * DCP
        block, rank, slot = ids[pos // span], pos % DCP, (pos % span) // DCP
        for li, layer in enumerate(LAYERS):
            self.rank_kv[rank][layer][block, slot] = expected(self.tokens(req_id), pos, li,
                                                              0).reshape(-1)

    def block_matches(self, req_id, index, rank):
        """Whether DCP rank `rank`'s slice of the request's index-th block
        holds its prefix's KV."""
        span = BLOCK * DCP
        block = self.blocks_of[req_id][index]
        return all(torch.equal(self.rank_kv[rank][layer][block, (p % span) // DCP],
                               expected(self.tokens(req_id), p, li, 0).reshape(-1))
                   for li, layer in enumerate(LAYERS)
                   for p in range(index * span + rank, (index + 1) * span, DCP))


def test_each_decode_context_parallel_rank_loads_its_own_slice(mla_dir, uri):
    a = DcpServer(mla_dir, uri)
    a.add("r1", prompt(100))
    a.run()
    # Three full blocks of 32 tokens, each rank's slice of them stored apart.
    st = a.scheduler.connector.store.stats()["namespaces"]
    assert sorted(n["entries"] for n in st.values()) == [3] * DCP, st
    b = DcpServer(mla_dir, uri)  # another server: each rank loads its own slice
    b.add("r2", prompt(100) + prompt(30, salt=5))
    b.run()
    assert b.first_computed["r2"] == 96
    assert not b.load_errors
    for rank in range(DCP):
        for i in range(3):
            assert b.block_matches("r2", i, rank), f"rank {rank} block {i}"


def test_decode_with_prefill_context_parallelism_is_refused(mla_dir, uri):
    # With PCP, a DCP rank is not TP rank % DCP: refused, never keyed wrong.
    config = VllmConfig(
        model_config=ModelConfig(model=mla_dir, skip_tokenizer_init=True, dtype="float16",
                                 max_model_len=2048, seed=0),
        parallel_config=ParallelConfig(prefill_context_parallel_size=2,
                                       decode_context_parallel_size=2),
        device_config=DeviceConfig("cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="CxlrtConnector", kv_connector_module_path="cxlrt.connectors.vllm",
            kv_role="kv_both", kv_connector_extra_config={"pool": uri}))
    spec = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=MLA_HEAD,
                            dtype=torch.float16)
    kv_config = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[],
                              kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)])
    with pytest.raises(ValueError, match=r"\(DCP 2\) with prefill context parallelism"):
        KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER, kv_config)
