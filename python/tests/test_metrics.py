"""Metrics from Python (docs/metrics.md): Pool.metrics(), every host's as
published into the pool with the pool's gauges, and process_metrics(),
this process's own; as dicts and as Prometheus text. Run by ctest
(python_metrics_test) with PYTHONPATH at the build tree's python/."""

import os
import socket
import time
import urllib.error
import urllib.request
import uuid

import pytest

import cxlrt


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Read once, when the first pool is opened: time every KV call, and serve
# this process's metrics on a port of its own.
PORT = free_port()
os.environ["CXLRT_METRICS_SAMPLE"] = "1"
os.environ["CXLRT_METRICS_PORT"] = str(PORT)


@pytest.fixture
def uri():
    name = f"pytest-m{os.getpid()}-{uuid.uuid4().hex[:8]}"
    u = f"emu://{name}?size=128M"
    pool = cxlrt.Pool.create(u)
    yield pool.uri
    del pool
    cxlrt.Pool.destroy(u, force=True)


def samples(d, name, **labels):
    return [s for s in d["samples"]
            if s["name"] == name and all(s["labels"].get(k) == v for k, v in labels.items())]


def test_pool_metrics_see_a_hosts_kv_work(uri):
    with cxlrt.Host(uri) as host:
        store = host.store(create=True)
        store.put("py", b"a", b"x" * 100)
        store.put("py", b"b", b"y" * 28)
        assert store.get("py", b"a") == b"x" * 100
        with pytest.raises(cxlrt.NotFoundError):
            store.get_into("py", b"missing", bytearray(8))
        with pytest.raises(cxlrt.NotFoundError):
            store.get("py", b"missing too")  # a miss too
        slot = str(host.slot)

        # Served by this process (CXLRT_METRICS_PORT), as Prometheus reads it.
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=5) as r:
            served = r.read().decode()
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert f'cxlrt_kv_hits_total{{slot="{slot}",namespace="py"}} 1\n' in served, served
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=5) as r:
            assert r.read() == b"ok\n"
        # Any method but GET and HEAD is refused, saying so.
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{PORT}/metrics", data=b"x", method="POST"), timeout=5)
        assert e.value.code == 405 and e.value.headers["Allow"] == "GET, HEAD"

        mine = cxlrt.process_metrics()
        hits = samples(mine, "cxlrt_kv_hits_total", namespace="py", slot=slot)
        assert [s["value"] for s in hits] == [1]
        assert samples(mine, "cxlrt_kv_put_bytes_total", namespace="py")[0]["value"] == 128

        pool = cxlrt.Pool.open(uri)
        # The host publishes every second (CXLRT_METRICS_PUBLISH_MS).
        deadline = time.time() + 10
        while time.time() < deadline:
            d = pool.metrics()
            got = samples(d, "cxlrt_kv_get_bytes_total", namespace="py", host=slot)
            missed = samples(d, "cxlrt_kv_misses_total", namespace="py", host=slot)
            # The last publish may have been between the hit and the miss.
            if got and got[0]["value"] == 100 and missed and missed[0]["value"] == 2:
                break
            time.sleep(0.05)
        assert got and got[0]["value"] == 100, got
        assert samples(d, "cxlrt_kv_misses_total", namespace="py", host=slot)[0]["value"] == 2
        [h] = [h for h in d["hosts"] if str(h["slot"]) == slot]
        assert h["alive"] and h["published"] and h["lease_margin_s"] > 0, h
        lat = samples(d, "cxlrt_kv_get_latency_seconds", namespace="py", host=slot)[0]
        assert lat["type"] == "histogram" and lat["count"] == 3, lat  # a hit, two misses

        text = pool.metrics(format="text")
        assert f'cxlrt_kv_hits_total{{host="{slot}",namespace="py"}} 1\n' in text, text
        assert "# TYPE cxlrt_pool_hosts_alive gauge" in text
        with pytest.raises(ValueError):
            pool.metrics(format="json")
        store.close()
