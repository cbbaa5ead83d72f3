"""The Python side with GPU memory: CUDA tensors through the collectives
(on torch's current stream), the KV store (put/get and paged batches of a
KV cache in GPU memory), and the torch.distributed backend's calls on CUDA
tensors (python/tests/torch/dist_check.py with CXLRT_TORCH_CHECK_DEVICE=cuda).
Skipped, saying why, where this process has no GPU; scripts/gpu-check.sh
runs it on one."""

import multiprocessing as mp
import os
import subprocess
import sys
import traceback
import uuid

import pytest

torch = pytest.importorskip("torch")
import cxlrt  # noqa: E402

if not torch.cuda.is_available() or not cxlrt.devices_available():
    pytest.skip(f"no GPU here: {cxlrt.devices_unavailable_reason() or 'torch sees none'}",
                allow_module_level=True)


@pytest.fixture
def uri():
    u = f"emu://pygpu-{os.getpid()}-{uuid.uuid4().hex[:6]}?size=1G"
    pool = cxlrt.Pool.create(u)
    yield pool.uri
    del pool
    cxlrt.Pool.destroy(u, force=True)


def _rank(rank, n, uri, q):
    try:
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        with cxlrt.Host(uri) as host, host.communicator("cuda", n, rank) as comm:
            for count in (1000, 3 << 20):
                x = torch.full((count,), float(rank + 1), device=dev)
                s = torch.cuda.Stream()
                with torch.cuda.stream(s):
                    torch.cuda._sleep(20_000_000)  # the input is written late, on the stream
                    x.add_(1)
                    comm.all_reduce(x)  # on s: after the write, before the read below
                    y = x * 2
                s.synchronize()
                want = 2 * sum(r + 2 for r in range(n))
                assert torch.all(y == want).item(), (count, y[:4])
            out = torch.empty(n * 4096, dtype=torch.bfloat16, device=dev)
            comm.all_gather(torch.full((4096,), rank, dtype=torch.bfloat16, device=dev), out)
            torch.cuda.synchronize()
            want = torch.arange(n, dtype=torch.bfloat16).repeat_interleave(4096)
            assert torch.equal(out.cpu(), want)
        q.put((rank, None))
    except BaseException:  # noqa: BLE001 - reported to the parent
        q.put((rank, traceback.format_exc()))


def test_collectives_take_cuda_tensors_on_the_current_stream(uri):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, 2, uri, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=180) for _ in procs)
    for p in procs:
        p.join(30)
    assert results == {0: None, 1: None}, results


def test_kv_blocks_and_paged_caches_in_gpu_memory(uri):
    with cxlrt.Host(uri) as host:
        store = host.store(create=True)
        a = torch.randint(0, 255, (1 << 20,), dtype=torch.uint8, device="cuda")
        store.put("g", "one", a)
        b = torch.zeros_like(a)
        assert store.get_into("g", "one", b) == a.numel()
        torch.cuda.synchronize()
        assert torch.equal(a, b)
        # A paged cache in GPU memory, vLLM's layout: per layer [K/V, blocks, page].
        cache = [torch.randint(0, 255, (2, 16, 8192), dtype=torch.uint8, device="cuda")
                 for _ in range(3)]
        other = [torch.zeros_like(c) for c in cache]
        seg = lambda cs: [(c[kv].data_ptr(), c.stride(1), c[kv, 0].numel())  # noqa: E731
                          for c in cs for kv in (0, 1)]
        torch.cuda.synchronize()
        assert store.batch_put_paged("g", ["b0", "b1"], [2, 9], seg(cache)) == [None, None]
        assert store.batch_get_paged("g", ["b0", "b1"], [0, 15], seg(other)) == [49152] * 2
        for c, o in zip(cache, other):
            assert torch.equal(o[:, 0], c[:, 2]) and torch.equal(o[:, 15], c[:, 9])
            assert not o[:, 1:15].any()
        # Segments in GPU and host memory at once are refused, naming them.
        host = torch.zeros((2, 16, 8192), dtype=torch.uint8)
        with pytest.raises(cxlrt.InvalidArgumentError, match="segments 0 and 2"):
            store.batch_get_paged("g", ["b0"], [0], seg([other[0], host]))
        store.close()


def test_the_torch_backend_with_cuda_tensors_matches_gloo():
    here = os.path.dirname(os.path.abspath(__file__))
    check = os.path.join(here, "..", "torch", "dist_check.py")
    env = dict(os.environ, CXLRT_TORCH_CHECK_DEVICE="cuda", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-port", "29455", check], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "cuda tensors" in r.stdout and "checks passed" in r.stdout, r.stdout[-2000:]
