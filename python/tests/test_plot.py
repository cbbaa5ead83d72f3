"""The plotter of the benchmark sweeps (python/cxlrt/plot.py): the figure
drawn from sample JSON holds every series with the right points (read back
from matplotlib's Axes, not only a file that exists), bad input is an error
naming what was wrong, and `cxlrt bench ... --plot` draws a real run. Needs
matplotlib (Debian's python3-matplotlib, seen by the project's venv); the
module is loaded from its file, so the extension need not be built.
Env: CXLRT_CLI, the `cxlrt` program (the last test)."""

import importlib.util
import json
import os
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "cxlrt_plot", os.path.join(HERE, "..", "cxlrt", "plot.py"))
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)


def coll(peer, size, busbw, **kw):
    row = {"peer": peer, "collective": "allreduce", "ranks": 2, "bytes": size,
           "time_us": 1.0, "busbw_gbps": busbw}
    row.update(kw)
    return row


def write(tmp_path, name, rows):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


def lines_of(ax):
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
            for line in ax.get_lines()}


def test_collective_sweep_has_every_peer_the_bound_and_memcpy(tmp_path):
    rows = []
    for size, bw in ((65536, 2.0), (1 << 20, 6.0)):
        rows.append(coll("cxlrt", size, bw, bound_busbw_gbps=bw * 2, memcpy_gbps=10.0))
        rows.append(coll("cxlrt-pool", size, bw + 1, in_pool=True, memcpy_gbps=12.0))
        # Open MPI, two transports: the better is kept per size.
        rows.append(coll("mpi", size, 1.0, config="--mca pml ob1"))
        rows.append(coll("mpi", size, 1.5, config="--mca pml ucx"))
        rows.append(coll("gloo", size, 0.5))
    # A second run of cxlrt at 64 KiB: the median of 2.0, 4.0 and 5.0.
    rows.append(coll("cxlrt", 65536, 4.0, bound_busbw_gbps=4.0, memcpy_gbps=10.0))
    rows.append(coll("cxlrt", 65536, 5.0, bound_busbw_gbps=4.0, memcpy_gbps=10.0))
    rows.append(coll("cxlrt", 8, 0.001, latency=True))  # latency rows: not a busbw point
    rows.append({"collective": "reducescatter", "ranks": 4, "bytes": 4096, "busbw_gbps": 3.0,
                 "in_pool": False})  # plain `cxlrt bench --json`: no peer
    fig = plot.figure(plot.load([write(tmp_path, "c.jsonl", rows)]))
    assert [ax.get_title() for ax in fig.axes] == ["allreduce, 2 ranks", "reducescatter, 4 ranks"]
    got = lines_of(fig.axes[0])
    assert got["cxlrt"] == ([65536, 1 << 20], [4.0, 6.0])
    assert got["cxlrt (pool buffers)"] == ([65536, 1 << 20], [3.0, 7.0])
    assert got["Open MPI"] == ([65536, 1 << 20], [1.5, 1.5])
    assert got["Gloo"] == ([65536, 1 << 20], [0.5, 0.5])
    assert got["cxlrt: bound"] == ([65536, 1 << 20], [4.0, 12.0])
    memcpy = [k for k in got if k.startswith("memcpy")]
    assert memcpy == ["memcpy, this machine (10.0 GB/s)"]  # median of the run's
    assert got[memcpy[0]][1] == [10.0, 10.0]
    assert lines_of(fig.axes[1])["cxlrt"] == ([4096], [3.0])


def test_kv_sweep_has_cxlrt_and_redis_per_op(tmp_path):
    kv = {"hosts": 2, "batch": 32, "memcpy_gbps": 8.0, "lookup_1_ns": 100, "lookup_64_ns": 900,
          "wrong": 0, "working_set_bytes": 1 << 24, "rows": [
              {"block": 16384, "op": "put", "gbps": 1.0, "batch_gbps": 2.0},
              {"block": 16384, "op": "get", "gbps": 3.0, "batch_gbps": 4.0},
              {"block": 262144, "op": "put", "gbps": 5.0, "batch_gbps": 6.0},
              {"block": 262144, "op": "get", "gbps": 7.0, "batch_gbps": 8.0}]}
    cx = tmp_path / "kv.json"
    cx.write_text(json.dumps(kv, indent=2))  # `cxlrt bench kv --json`: one object, indented
    redis = write(tmp_path, "redis.jsonl", [
        {"block": b, "put_gbps": 0.5, "get_gbps": 0.6, "batch_put_gbps": 0.7,
         "batch_get_gbps": 0.8, "wrong": 0} for b in (16384, 262144)])
    fig = plot.figure(plot.load([str(cx), redis]))
    assert [ax.get_title() for ax in fig.axes] == ["KV put, 2 hosts", "KV get, 2 hosts"]
    get = lines_of(fig.axes[1])
    assert get["cxlrt"] == ([16384, 262144], [3.0, 7.0])
    assert get["cxlrt, batch 32"] == ([16384, 262144], [4.0, 8.0])
    assert get["Redis"] == ([16384, 262144], [0.6, 0.6])
    assert get["Redis, batch 32"] == ([16384, 262144], [0.8, 0.8])


def test_pods_sweep_is_busbw_of_each_peer(tmp_path):
    rows = [{"peer": "hier-mpi", "collective": "allreduce", "ranks": 4, "pods": 2,
             "bytes": 1 << 20, "hier_us": 1000.0, "flat_mpi_us": 2000.0,
             "pod_limit_us": 100.0, "memcpy_gbps": 9.0},
            coll("one-pool", 1 << 20, 9.9, ranks=4, time_us=500.0),
            coll("mpi-shm", 1 << 20, 9.9, ranks=4, time_us=250.0)]
    fig = plot.figure(plot.load([write(tmp_path, "p.jsonl", rows)]))
    assert [ax.get_title() for ax in fig.axes] == ["allreduce across 2 pods, 4 ranks"]
    got = lines_of(fig.axes[0])
    bw = lambda us: (1 << 20) / (us * 1e3) * 1.5  # 2(n-1)/n at 4 ranks
    assert got["cxlrt across pods"] == ([1 << 20], [pytest.approx(bw(1000.0))])
    assert got["flat Open MPI (TCP)"][1] == [pytest.approx(bw(2000.0))]
    assert got["one pool"][1] == [pytest.approx(bw(500.0))]
    assert got["Open MPI (shared memory)"][1] == [pytest.approx(bw(250.0))]
    assert got["bound of the pod steps (one memcpy of the buffer)"][1] == [pytest.approx(bw(100.0))]


def test_alltoallv_is_one_bar_per_peer_and_phase(tmp_path):
    rows = []
    for peer, gbps in (("cxlrt", 4.0), ("mpi", 2.0)):
        for phase in ("dispatch", "combine"):
            rows.append({"peer": peer, "bench": "alltoallv", "phase": phase, "ranks": 2,
                         "skew": "uniform", "median_us": 10.0, "gbps": gbps})
    fig = plot.figure(plot.load([write(tmp_path, "a.jsonl", rows)]))
    ax = fig.axes[0]
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}
    assert bars == {"cxlrt": [4.0, 4.0], "Open MPI": [2.0, 2.0]}


def test_alloc_and_gpu_sweeps_plot_each_measured_column(tmp_path):
    alloc = {"benchmark": "alloc", "memcpy_gbps": 9.0, "results": [
        {"size": 64, "glibc_pairs_per_s": 5e7, "cxlrt_local_pairs_per_s": 3e7,
         "cxlrt_two_hosts_pairs_per_s": 2e7, "cxlrt_cross_host_frees_per_s": 1e6},
        {"size": 4096, "glibc_pairs_per_s": 2e7, "cxlrt_local_pairs_per_s": 3e7,
         "cxlrt_two_hosts_pairs_per_s": 2.5e7, "cxlrt_cross_host_frees_per_s": 1e6}]}
    (tmp_path / "alloc.json").write_text(json.dumps(alloc, indent=2))
    dma = write(tmp_path, "dma.jsonl", [
        {"bytes": b, "pinned_h2d_gbps": 20.0, "pool_h2d_gbps": 15.0, "d2d_gbps": 900.0}
        for b in (65536, 1 << 20)])
    bell = write(tmp_path, "bell.jsonl", [
        {"bytes": b, "copies_us": 10.0, "host_us": 3.0, "kernel_us": 2.0,
         "stream_error": "not supported", "wrong_bytes": 0} for b in (8, 64)])
    fig = plot.figure(plot.load([str(tmp_path / "alloc.json"), dma, bell]))
    assert [ax.get_title() for ax in fig.axes] == [
        "allocator: pairs per second", "pool <-> GPU copies", "doorbells"]
    a = lines_of(fig.axes[0])
    assert sorted(a) == ["cxlrt local", "cxlrt two hosts", "glibc"]  # pairs/s columns only
    assert a["glibc"] == ([64, 4096], [5e7, 2e7])
    assert lines_of(fig.axes[1])["pool h2d"] == ([65536, 1 << 20], [15.0, 15.0])
    assert sorted(lines_of(fig.axes[2])) == ["copies", "host", "kernel"]


def test_main_writes_a_png(tmp_path):
    src = write(tmp_path, "c.jsonl", [coll("cxlrt", 4096, 1.0), coll("cxlrt", 8192, 2.0)])
    out = tmp_path / "c.png"
    assert plot.main(["-o", str(out), src]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("text,message", [
    ('{"collective": "allreduce"}\n{"bytes": 8,\n', "line 2: not JSON"),
    ("", "no benchmark rows"),
    ('[1, 2]', "item 1 is int, not a JSON object"),
    ('{"peer": "cxlrt", "collective": "allreduce", "ranks": 2, "bytes": 8, '
     '"busbw_gbps": "fast"}', "'busbw_gbps' is 'fast' (expected a number)"),
    ('{"metric": "pointer chase", "unit": "ns"}', "no sweep the plotter knows"),
])
def test_bad_input_is_an_error_naming_what_was_wrong(tmp_path, text, message, capsys):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(plot.PlotError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plot.figure(plot.load([str(p)]))
    assert plot.main(["-o", str(tmp_path / "bad.png"), str(p)]) == 2
    assert "bad.json" in capsys.readouterr().err
    assert not (tmp_path / "bad.png").exists()


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(plot.PlotError, match="cannot read"):
        plot.load([str(tmp_path / "none.json")])


def test_cxlrt_bench_plot_draws_a_real_run(tmp_path):
    cli = os.environ.get("CXLRT_CLI")
    if not cli:
        pytest.fail("CXLRT_CLI (the cxlrt program) is not set: tests/CMakeLists.txt sets it")
    out = tmp_path / "ar.png"
    r = subprocess.run([cli, "bench", "allreduce", "--ranks", "2", "-b", "1K", "-e", "4K",
                        "-n", "5", "-w", "1", "--plot", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert "# allreduce, 2 ranks" in r.stdout and "cxlrt: 1K:" in r.stdout
    rows = plot.load([str(tmp_path / "ar.json")])  # the JSON kept beside the plot
    assert [r["bytes"] for r in rows] == [1024, 2048, 4096]
    got = lines_of(plot.figure(rows).axes[0])
    assert got["cxlrt"][0] == [1024, 2048, 4096]
    assert all(v > 0 for v in got["cxlrt"][1])
    # A benchmark that fails plots nothing and says so.
    r = subprocess.run([cli, "bench", "allreduce", "--ranks", "2", "-b", "1K", "-e", "4K",
                        "-n", "1", "--plot", str(tmp_path / "no" / "x.png")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "cannot write" in r.stderr


def test_the_compare_scripts_plot_option(tmp_path):
    # bench/compare/plot_option.sh, which every compare script sources: --plot
    # comes out of the arguments wherever it is, and the run's JSON lines are
    # drawn and kept beside the plot.
    root = os.path.join(HERE, "..", "..")
    results = write(tmp_path, "results.jsonl", [coll("cxlrt", 4096, 1.0),
                                                coll("mpi", 4096, 2.0, config="ob1")])
    script = f"""
set -euo pipefail
. bench/compare/plot_option.sh
plot_option_parse 2 --plot {tmp_path}/c.png 4
set -- "${{PLOT_ARGS[@]+"${{PLOT_ARGS[@]}}"}}"
echo "args: $*"
plot_option_draw "a title" {results}
"""
    r = subprocess.run(["bash", "-c", script], cwd=root, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "args: 2 4" in r.stdout
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert plot.load([str(tmp_path / "c.json")])[1]["peer"] == "mpi"
    # A missing directory is refused before any sweep runs.
    r = subprocess.run(["bash", "-c", ". bench/compare/plot_option.sh; "
                        f"plot_option_parse --plot {tmp_path}/none/c.png"], cwd=root,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no such directory" in r.stderr
