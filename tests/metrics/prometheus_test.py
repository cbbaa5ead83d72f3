#!/usr/bin/python3
"""A real Prometheus server scrapes `cxlrt serve-metrics` (docs/metrics.md).

    prometheus_test.py CXLRT METRICS_WORKLOAD

Starts metrics_workload (two hosts, a known amount of KV and collective
work, publishing into the pool every 100 ms), `cxlrt serve-metrics` on a
free loopback port, and Debian's `prometheus` on another with a scrape
config for it (every 500 ms); then asks Prometheus's HTTP API for the
workload's figures until they are there (20 s at most) and checks each.
Without prometheus: skipped (77) saying so, or a failure under CI=true.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

# What metrics_workload did, as PromQL over the whole pool.
EXPECTED = {
    'sum(cxlrt_kv_hits_total{namespace="prom"})': 10,
    'sum(cxlrt_kv_misses_total{namespace="prom"})': 3,
    'sum(cxlrt_kv_get_bytes_total{namespace="prom"})': 40960,
    'sum(cxlrt_kv_put_bytes_total{namespace="prom"})': 40960,
    'sum(cxlrt_kv_puts_total{namespace="prom"})': 10,
    'sum(cxlrt_kv_entries{namespace="prom"})': 10,
    'count(cxlrt_kv_get_latency_seconds_count{namespace="prom"} > 0)': 1,
    'sum(cxlrt_collective_calls_total{communicator="prom",collective="allreduce"})': 14,
    'sum(cxlrt_collective_bytes_total{communicator="prom",collective="allreduce",'
    'size_bucket="64B"})': 448,
    'count(count by (host) (cxlrt_collective_calls_total{communicator="prom"}))': 2,
    'cxlrt_pool_hosts{state="attached"}': 2,
    'cxlrt_pool_hosts_alive': 2,
    'sum(cxlrt_pool_host_metrics_published)': 2,
    'up{job="cxlrt"}': 1,
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(port, q):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    result = body["data"]["result"]
    if len(result) != 1:
        return None
    return float(result[0]["value"][1])


def main():
    cxlrt, workload = sys.argv[1], sys.argv[2]
    prom = shutil.which("prometheus")
    if prom is None:
        print("prometheus_test cannot run: no `prometheus` on PATH (Debian's prometheus "
              "package; scripts/install-deps.sh installs it).")
        if os.environ.get("CI", "").lower() in ("true", "1"):
            print("(A failure, not a skip, because CI=true.)")
            return 1
        return 77
    tmp = tempfile.mkdtemp(prefix="cxlrt-prom-", dir="/dev/shm")
    procs = []
    try:
        uri = f"emu://prom{os.getpid()}?size=128M&dir={tmp}"
        ready, done = os.path.join(tmp, "ready"), os.path.join(tmp, "done")
        env = dict(os.environ, CXLRT_METRICS_PUBLISH_MS="100")
        procs.append(subprocess.Popen([workload, uri, ready, done], env=env))
        deadline = time.time() + 30
        while not os.path.exists(ready):
            if procs[0].poll() is not None or time.time() > deadline:
                print("the workload failed or did not get ready")
                return 1
            time.sleep(0.05)
        eport, pport = free_port(), free_port()
        procs.append(subprocess.Popen([cxlrt, "serve-metrics", f"emu://prom{os.getpid()}?dir={tmp}",
                                       "--port", str(eport), "--seconds", "60"]))
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 500ms\n  scrape_timeout: 400ms\n"
                    "scrape_configs:\n  - job_name: cxlrt\n    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{eport}']\n")
        procs.append(subprocess.Popen(
            [prom, f"--config.file={config}", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{pport}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        got = {}
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                got = {q: query(pport, q) for q in EXPECTED}
            except OSError:
                got = {}
            if got and all(got[q] == v for q, v in EXPECTED.items()):
                break
            time.sleep(0.5)
        bad = [q for q, v in EXPECTED.items() if got.get(q) != v]
        for q, v in EXPECTED.items():
            print(f"{'ok ' if q not in bad else 'BAD'} {q} = {got.get(q)} (expected {v})")
        # /health: ok while the pool is there; 503 once it was destroyed
        # (the exporter's mapping outlives the pool's name).
        health = f"http://127.0.0.1:{eport}/health"
        with urllib.request.urlopen(health, timeout=5) as r:
            print(f"/health with the pool there: {r.status} {r.read().decode().strip()}")
        open(done, "w").close()
        procs[0].wait(timeout=20)
        subprocess.run([cxlrt, "pool", "destroy", f"emu://prom{os.getpid()}?dir={tmp}", "--force"],
                       check=True)
        try:
            urllib.request.urlopen(health, timeout=5)
            print("BAD /health answered ok after the pool was destroyed")
            bad.append("/health")
        except urllib.error.HTTPError as e:
            print(f"/health after the pool was destroyed: {e.code} {e.read().decode().strip()}")
            if e.code != 503:
                bad.append("/health")
        # Nor are the destroyed pool's metrics served as current: the scrape
        # fails (Prometheus's up goes to 0).
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{eport}/metrics", timeout=5)
            print("BAD /metrics answered ok after the pool was destroyed")
            bad.append("/metrics")
        except urllib.error.HTTPError as e:
            print(f"/metrics after the pool was destroyed: {e.code} {e.read().decode().strip()}")
        return 1 if bad else 0
    finally:
        open(os.path.join(tmp, "done"), "w").close()
        for p in reversed(procs):
            if p.poll() is None and p is not procs[0]:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
