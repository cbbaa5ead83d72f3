"""Plots of cxlrt's benchmark sweeps, from the JSON the benchmarks write.

Reads what `cxlrt bench ... --json` prints (one JSON object per line, or
one object holding rows) and what bench/compare/*.sh collect (the same
rows tagged with "peer", "build", "who" or "round"), and draws one panel per
sweep with matplotlib:

- collectives (`cxlrt bench allreduce` .., `ceiling`, collectives.sh,
  interleaved.sh, before_after.sh): busbw against size per collective and
  rank count, one line per backend (cxlrt, cxlrt with pool buffers, Open
  MPI, Gloo, the ceiling probe, a build), the traffic bound the benchmark
  reports (dashed) and this machine's memcpy measured in the run (dotted);
- KV (`cxlrt bench kv`, kv.sh): GB/s against block size, put and get, one at
  a time and batched, beside Redis and memcpy;
- pods (`cxlrt bench pods`, pods.sh): busbw against size of the
  hierarchical collective beside one pool and flat Open MPI;
- all-to-all-v (`cxlrt bench alltoallv`, alltoallv.sh): GB/s per skew and
  phase, one bar per backend;
- the allocator (`cxlrt bench alloc`): pairs per second against block size;
- the GPU benchmarks (`cxlrt bench dma`, `doorbell`): each measured column
  against size.

Repeated runs of one series at one size (rounds, ABBA builds) plot their
median; Open MPI's transports are told apart by "config" and the better one
is kept per size, as the compare scripts' tables do. Rows of no sweep (a
compare script's load averages, the 8-byte latency rows) are left out; an
input with no row of a known sweep is an error.

Runs as a script with nothing but matplotlib (the `cxlrt bench --plot`
path) or as `cxlrt.plot` from the package:

    python3 python/cxlrt/plot.py -o allreduce.png results.jsonl
    fig = cxlrt.plot.figure(cxlrt.plot.load(["results.jsonl"]))

Bad input raises PlotError (the script prints it and exits 2) naming the
file, the line and what was wrong. Not thread-safe (matplotlib's pyplot is
not used; each call builds its own Figure).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections import defaultdict
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["PlotError", "load", "figure", "plot", "main"]


class PlotError(ValueError):
    """Input the plotter cannot draw: unreadable, not JSON, or no known sweep."""


Row = Dict[str, Any]

# Names of the peers in legends.
_PEER_NAMES = {
    "cxlrt": "cxlrt",
    "cxlrt-pool": "cxlrt (pool buffers)",
    "mpi": "Open MPI",
    "gloo": "Gloo",
    "probe": "ceiling probe",
    "one-pool": "one pool",
    "mpi-shm": "Open MPI (shared memory)",
    "redis": "Redis",
}


# One colour per backend across panels (matplotlib's default cycle).
_COLOURS = {
    "cxlrt": "C0", "cxlrt (pool buffers)": "C1", "Gloo": "C2", "Open MPI": "C3",
    "ceiling probe": "C4", "Redis": "C3", "cxlrt across pods": "C0", "one pool": "C1",
    "flat Open MPI (TCP)": "C3", "Open MPI (shared memory)": "C5", "build A": "C0",
    "build B": "C1",
}


def _colour(name: str) -> Optional[str]:
    if name in _COLOURS:
        return _COLOURS[name]
    if name.startswith("cxlrt, batch"):
        return "C9"
    if name.startswith("Redis, batch"):
        return "C6"
    return None  # the next of the cycle


def _where(row: Row) -> str:
    return row.get("_where", "?")


def _parse_text(text: str, name: str) -> List[Row]:
    """Rows of one input: a JSON value (object or array), else JSON lines."""
    stripped = text.strip()
    if not stripped:
        return []
    try:
        whole = json.loads(stripped)
    except json.JSONDecodeError:
        whole = None
    rows: List[Row] = []
    if whole is not None:
        items = whole if isinstance(whole, list) else [whole]
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise PlotError(f"{name}: item {i + 1} is {type(item).__name__}, not a JSON object")
            item["_where"] = name if len(items) == 1 else f"{name}, item {i + 1}"
            rows.append(item)
        return rows
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise PlotError(f"{name}, line {n}: not JSON ({e.msg} at column {e.colno}): "
                            f"{line[:80]!r}") from None
        if not isinstance(item, dict):
            raise PlotError(f"{name}, line {n}: {type(item).__name__}, not a JSON object")
        item["_where"] = f"{name}, line {n}"
        rows.append(item)
    return rows


def _expand(row: Row) -> List[Row]:
    """Rows of a benchmark that writes one object with its rows inside."""
    if isinstance(row.get("rows"), list) and "lookup_1_ns" in row:  # cxlrt bench kv
        top = {k: v for k, v in row.items() if k != "rows"}
        out = []
        for i, r in enumerate(row["rows"]):
            if not isinstance(r, dict):
                raise PlotError(f"{_where(row)}: rows[{i}] is not an object")
            out.append({**top, **r, "kind": "kv", "_where": f"{_where(row)}, rows[{i}]"})
        return out
    if row.get("benchmark") == "alloc" and isinstance(row.get("results"), list):
        top = {k: v for k, v in row.items() if k != "results"}
        return [{**top, **r, "kind": "alloc", "_where": f"{_where(row)}, results[{i}]"}
                for i, r in enumerate(row["results"])]
    return [row]


def load(paths: Sequence[str]) -> List[Row]:
    """The rows of every input ('-' is stdin), each with "_where" (file, line).

    Raises PlotError when a file cannot be read, holds something that is not
    JSON, or holds no rows at all.
    """
    if not paths:
        raise PlotError("no input: name one or more JSON files of `cxlrt bench ... --json`")
    rows: List[Row] = []
    for path in paths:
        try:
            text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as e:
            raise PlotError(f"{path}: cannot read: {e}") from None
        for r in _parse_text(text, "stdin" if path == "-" else path):
            rows.extend(_expand(r))
    if not rows:
        raise PlotError(f"{', '.join(paths)}: no benchmark rows (empty input)")
    return rows


def _num(row: Row, key: str, default: Optional[float] = None) -> float:
    """row[key] as a float; PlotError naming the row when it is not a number."""
    if key not in row:
        if default is not None:
            return default
        raise PlotError(f"{_where(row)}: no '{key}'")
    v = row[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        raise PlotError(f"{_where(row)}: '{key}' is {v!r} (expected a number)")
    return float(v)


def _kind(row: Row, pods_run: bool) -> Optional[str]:
    if row.get("kind") in ("kv", "alloc"):
        return row["kind"]
    if row.get("bench") == "alltoallv" or "phase" in row and "median_us" in row:
        return "alltoallv"
    if "hier_us" in row or pods_run and row.get("peer") in ("one-pool", "mpi-shm"):
        return "pods"
    if "put_gbps" in row and "block" in row:
        return "redis"
    if "bytes" in row and "collective" in row and ("busbw_gbps" in row or "gbps" in row):
        # before_after.sh tags its rows "row": busbw, latency or kv (GB/s).
        latency = row.get("latency") or row.get("row") == "latency"
        return "latency" if latency else "collective"
    if "bytes" in row and "pinned_h2d_gbps" in row:
        return "dma"
    if "bytes" in row and "copies_us" in row:
        return "doorbell"
    return None


def _size_text(b: float) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and int(b) % (1 << shift) == 0:
            return f"{int(b) >> shift}{unit}"
    return f"{int(b)}"


def _size_axis(ax: Any, sizes: Iterable[float]) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(sizes))
    if len(ticks) > 12:  # every other size, so the labels do not overlap
        ticks = ticks[::2]
    ax.set_xticks(ticks)
    ax.set_xticklabels([_size_text(t) for t in ticks], rotation=45, fontsize=7)
    ax.minorticks_off()
    ax.grid(True, which="major", alpha=0.3)


def _peer_of(row: Row) -> str:
    """The legend name of a collective row's series."""
    if "build" in row:
        return f"build {row['build']}"
    if "who" in row:
        return _PEER_NAMES.get(row["who"], row["who"])
    peer = row.get("peer")
    if peer is None:
        if "chunk_bytes" in row:
            peer = "probe"
        else:
            peer = "cxlrt-pool" if row.get("in_pool") else "cxlrt"
    return _PEER_NAMES.get(peer, peer)


def _reduce(rows: List[Row], value: Callable[[Row], float]) -> float:
    """Median over repetitions; the better of Open MPI's transports ("config")."""
    by_config: Dict[str, List[float]] = defaultdict(list)
    for r in rows:
        by_config[str(r.get("config", ""))].append(value(r))
    return max(statistics.median(v) for v in by_config.values())


def _series(rows: List[Row], key: Callable[[Row], Any], x: Callable[[Row], float],
            y: Callable[[Row], float], better: str = "max") -> Dict[Any, Tuple[List, List]]:
    groups: Dict[Any, Dict[float, List[Row]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[key(r)][x(r)].append(r)
    out = {}
    for k, by_x in groups.items():
        xs = sorted(by_x)
        if better == "min":  # times: the better config is the smaller
            ys = [-_reduce(by_x[v], lambda r: -y(r)) for v in xs]
        else:
            ys = [_reduce(by_x[v], y) for v in xs]
        out[k] = (xs, ys)
    return out


def _memcpy_line(ax: Any, rows: List[Row], key: str = "memcpy_gbps") -> None:
    v = [_num(r, key) for r in rows if key in r and _num(r, key) > 0]
    if v:
        ax.axhline(statistics.median(v), color="gray", linestyle=":", linewidth=1.2,
                   label=f"memcpy, this machine ({statistics.median(v):.1f} GB/s)")


def _panel_collective(ax: Any, rows: List[Row], title: str) -> None:
    series = _series(rows, _peer_of, lambda r: _num(r, "bytes"),
                     lambda r: _num(r, "busbw_gbps" if "busbw_gbps" in r else "gbps"))
    order = sorted(series, key=lambda k: (not k.startswith("cxlrt"), k))
    for name in order:
        xs, ys = series[name]
        ax.plot(xs, ys, marker="o", markersize=3, label=name, color=_colour(name))
    # The traffic bound each cxlrt series reports, in its colour.
    colours = {line.get_label(): line.get_color() for line in ax.get_lines()}
    bounded = [r for r in rows if _num(r, "bound_busbw_gbps", 0.0) > 0]
    for name, (xs, ys) in sorted(_series(bounded, _peer_of, lambda r: _num(r, "bytes"),
                                         lambda r: _num(r, "bound_busbw_gbps")).items()):
        ax.plot(xs, ys, linestyle="--", linewidth=1, color=colours.get(name),
                label=f"{name}: bound")
    _memcpy_line(ax, rows)
    _size_axis(ax, (_num(r, "bytes") for r in rows))
    ax.set_yscale("log")
    ax.set_ylabel("busbw (GB/s)" if any("busbw_gbps" in r for r in rows) else "GB/s")
    ax.set_xlabel("size (bytes)")
    ax.set_title(title, fontsize=9)


def _panel_kv(ax: Any, rows: List[Row], redis: List[Row], op: str) -> None:
    mine = [r for r in rows if r.get("op") == op]
    for batched in (False, True):
        key = "batch_gbps" if batched else "gbps"
        s = _series(mine, lambda r: "", lambda r: _num(r, "block"), lambda r: _num(r, key))
        if "" in s:
            label = f"cxlrt, batch {mine[0].get('batch', '?')}" if batched else "cxlrt"
            ax.plot(*s[""], marker="o", markersize=3, label=label, color=_colour(label))
        rk = ("batch_" if batched else "") + op + "_gbps"
        s = _series([r for r in redis if rk in r], lambda r: "", lambda r: _num(r, "block"),
                    lambda r: _num(r, rk))
        if "" in s:
            batch = mine[0].get("batch", "?") if mine else "?"
            label = f"Redis, batch {batch}" if batched else "Redis"
            ax.plot(*s[""], marker="s", markersize=3, label=label, color=_colour(label))
    _memcpy_line(ax, mine)
    _size_axis(ax, (_num(r, "block") for r in mine + redis))
    ax.set_yscale("log")
    ax.set_ylabel("GB/s")
    ax.set_xlabel("block (bytes)")
    hosts = mine[0].get("hosts", "?") if mine else "?"
    ax.set_title(f"KV {op}, {hosts} hosts", fontsize=9)


_BUS = {"allreduce": lambda n: 2 * (n - 1) / n, "reducescatter": lambda n: (n - 1) / n,
        "allgather": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n}


def _bus_factor(coll: str, n: float) -> float:
    return _BUS.get(coll, lambda n: 1.0)(n) if n > 0 else 1.0


def _panel_pods(ax: Any, rows: List[Row], title: str) -> None:
    def bw(r: Row, us: float) -> float:
        n = _num(r, "ranks", 1.0)
        return _num(r, "bytes") / (us * 1e3) * _bus_factor(r.get("collective", "allreduce"), n)

    columns = [("hier_us", "cxlrt across pods"), ("one_pool_us", "one pool"),
               ("flat_mpi_us", "flat Open MPI (TCP)"), ("time_us", None)]
    for col, label in columns:
        have = [r for r in rows if col in r and _num(r, col) > 0]
        s = _series(have, lambda r: label or _PEER_NAMES.get(r.get("peer"), str(r.get("peer"))),
                    lambda r: _num(r, "bytes"), lambda r: bw(r, _num(r, col)))
        for name, (xs, ys) in sorted(s.items()):
            ax.plot(xs, ys, marker="o", markersize=3, label=name, color=_colour(name))
    lim = [r for r in rows if _num(r, "pod_limit_us", 0.0) > 0]
    s = _series(lim, lambda r: "", lambda r: _num(r, "bytes"),
                lambda r: bw(r, _num(r, "pod_limit_us")))
    if "" in s:
        ax.plot(*s[""], linestyle="--", linewidth=1,
                label="bound of the pod steps (one memcpy of the buffer)")
    _memcpy_line(ax, rows)
    _size_axis(ax, (_num(r, "bytes") for r in rows))
    ax.set_yscale("log")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_xlabel("size (bytes)")
    ax.set_title(title, fontsize=9)


def _panel_alltoallv(ax: Any, rows: List[Row], title: str) -> None:
    cats = sorted({(str(r.get("skew")), str(r.get("phase"))) for r in rows},
                  key=lambda c: (c[0], c[1] != "dispatch"))
    peers = sorted({_peer_of(r) for r in rows}, key=lambda p: (not p.startswith("cxlrt"), p))
    width = 0.8 / max(1, len(peers))
    for i, peer in enumerate(peers):
        heights = []
        for skew, phase in cats:
            sel = [r for r in rows if _peer_of(r) == peer and str(r.get("skew")) == skew and
                   str(r.get("phase")) == phase]
            heights.append(_reduce(sel, lambda r: _num(r, "gbps")) if sel else 0.0)
        ax.bar([c + (i - (len(peers) - 1) / 2) * width for c in range(len(cats))], heights,
               width, label=peer, color=_colour(peer))
    _memcpy_line(ax, rows)
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels([f"{s}\n{p}" for s, p in cats], fontsize=7)
    ax.set_ylabel("GB/s (busiest rank's bytes)")
    ax.set_title(title, fontsize=9)


def _panel_columns(ax: Any, rows: List[Row], x: str, suffix: str, ylabel: str, title: str,
                   skip: Sequence[str] = (), log_y: bool = False) -> None:
    cols = sorted({k for r in rows for k in r if k.endswith(suffix) and k not in skip})
    for col in cols:
        have = [r for r in rows if col in r and _num(r, col) > 0]
        s = _series(have, lambda r: "", lambda r: _num(r, x), lambda r: _num(r, col))
        if "" in s:
            ax.plot(*s[""], marker="o", markersize=3, label=col[: -len(suffix)].replace("_", " "))
    _size_axis(ax, (_num(r, x) for r in rows))
    if log_y:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_xlabel("size (bytes)")
    ax.set_title(title, fontsize=9)


def _panels(rows: List[Row]) -> List[Tuple[str, Callable[[Any], None]]]:
    """(title, draw) per panel, in a stable order."""
    pods_run = any("hier_us" in r for r in rows)
    kinds: Dict[str, List[Row]] = defaultdict(list)
    unknown: List[Row] = []
    for r in rows:
        k = _kind(r, pods_run)
        if k is None:
            unknown.append(r)
        else:
            kinds[k].append(r)
    if not any(k in kinds for k in ("collective", "kv", "redis", "pods", "alltoallv", "alloc",
                                    "dma", "doorbell")):
        r = unknown[0] if unknown else rows[0]
        keys = ", ".join(sorted(k for k in r if not k.startswith("_"))[:12])
        raise PlotError(
            f"{_where(r)}: no sweep the plotter knows (rows of `cxlrt bench` collectives, "
            f"ceiling, kv, pods, alltoallv, alloc, dma, doorbell or bench/compare/*.sh); "
            f"this row has keys: {keys or 'none'}")
    panels: List[Tuple[str, Callable[[Any], None]]] = []
    by_panel: Dict[Tuple[str, int], List[Row]] = defaultdict(list)
    for r in kinds["collective"]:
        by_panel[(str(r["collective"]), int(_num(r, "ranks", 0)))].append(r)
    for (coll, n), sel in sorted(by_panel.items()):
        t = f"{coll}, {n} ranks" if n else coll
        panels.append((t, lambda ax, sel=sel, t=t: _panel_collective(ax, sel, t)))
    if kinds["kv"] or kinds["redis"]:
        ops = sorted({r.get("op") for r in kinds["kv"]} | (
            {"put", "get"} if kinds["redis"] else set()), key=lambda o: o != "put")
        for op in ops:
            panels.append((f"kv {op}", lambda ax, op=op: _panel_kv(ax, kinds["kv"],
                                                                  kinds["redis"], op)))
    pods: Dict[Tuple[str, int], List[Row]] = defaultdict(list)
    for r in kinds["pods"]:
        pods[(str(r.get("collective", "allreduce")), int(_num(r, "ranks", 0)))].append(r)
    for (coll, n), sel in sorted(pods.items()):
        np_ = next((r["pods"] for r in sel if "pods" in r), "?")
        t = f"{coll} across {np_} pods, {n} ranks"
        panels.append((t, lambda ax, sel=sel, t=t: _panel_pods(ax, sel, t)))
    a2a: Dict[int, List[Row]] = defaultdict(list)
    for r in kinds["alltoallv"]:
        a2a[int(_num(r, "ranks", 0))].append(r)
    for n, sel in sorted(a2a.items()):
        t = f"all-to-all-v (MoE), {n} ranks"
        panels.append((t, lambda ax, sel=sel, t=t: _panel_alltoallv(ax, sel, t)))
    if kinds["alloc"]:
        panels.append(("alloc", lambda ax: _panel_columns(
            ax, kinds["alloc"], "size", "_pairs_per_s", "allocate+free pairs / s",
            "allocator: pairs per second", log_y=True)))
    if kinds["dma"]:
        panels.append(("dma", lambda ax: _panel_columns(
            ax, kinds["dma"], "bytes", "_gbps", "GB/s", "pool <-> GPU copies")))
    if kinds["doorbell"]:
        panels.append(("doorbell", lambda ax: _panel_columns(
            ax, kinds["doorbell"], "bytes", "_us", "us per hop", "doorbells", log_y=True)))
    return panels


def figure(rows: List[Row], title: Optional[str] = None) -> Any:
    """A matplotlib Figure with one panel (Axes) per sweep of `rows`.

    Each series is a Line2D (bars for all-to-all-v) labelled as its legend
    shows it. Raises PlotError when no row is of a known sweep or a value is
    not a number.
    """
    from matplotlib.figure import Figure  # no pyplot: no GUI, no global state

    panels = _panels(rows)
    cols = 1 if len(panels) == 1 else 2
    nrows = (len(panels) + cols - 1) // cols
    fig = Figure(figsize=(6.4 * cols, 4.2 * nrows), dpi=80, layout="constrained")
    for i, (_, draw) in enumerate(panels):
        ax = fig.add_subplot(nrows, cols, i + 1)
        draw(ax)
        ax.legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot(paths: Sequence[str], output: str, title: Optional[str] = None) -> Any:
    """Loads `paths`, draws them and writes `output` (PNG, or any format by its
    suffix that matplotlib writes). Returns the Figure. Raises PlotError."""
    fig = figure(load(paths), title)
    try:
        if output.lower().endswith(".png") and _save_small_png(fig, output):
            return fig
        fig.savefig(output)
    except (OSError, ValueError) as e:
        raise PlotError(f"{output}: cannot write the plot: {e}") from None
    return fig


def _save_small_png(fig: Any, output: str) -> bool:
    """Writes a PNG of 256 colours (a third of the size, for docs/); False
    when Pillow (which Debian's matplotlib depends on) is missing."""
    try:
        from PIL import Image
    except ImportError:
        return False
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    image = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba())
    image.convert("RGB").quantize(256).save(output, optimize=True)
    return True


def summary(fig: Any) -> str:
    """The figure's series as text: per panel, each series' points."""
    out = []
    for ax in fig.axes:
        out.append(f"# {ax.get_title()}")
        for line in ax.get_lines():
            xs, ys = line.get_xdata(), line.get_ydata()
            if line.get_linestyle() == ":":  # the memcpy line: its value is in its label
                out.append(line.get_label())
                continue
            pts = " ".join(f"{_size_text(x)}:{y:.3g}" for x, y in zip(xs, ys))
            out.append(f"{line.get_label()}: {pts}")
        names = [t.get_text().replace("\n", " ") for t in ax.get_xticklabels()]
        for bars in ax.containers:  # all-to-all-v: a bar per category
            pts = " ".join(f"{n}:{p.get_height():.3g}" for n, p in zip(names, bars.patches))
            out.append(f"{bars.get_label()}: {pts}")
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="cxlrt-plot", description="Plot the JSON of `cxlrt bench ... --json` and of "
        "bench/compare/*.sh (docs/collectives.md, 'Plots')")
    p.add_argument("inputs", nargs="+", help="JSON or JSON-lines files ('-': stdin)")
    p.add_argument("-o", "--output", required=True, help="Image to write (.png)")
    p.add_argument("--title", help="Title above the panels")
    p.add_argument("--summary", action="store_true", help="Print each series' points")
    a = p.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        print(f"cxlrt plot: matplotlib is not installed for {sys.executable} ({e}); install "
              "Debian's python3-matplotlib (scripts/install-deps.sh does) or set CXLRT_PYTHON "
              "to a Python that has it", file=sys.stderr)
        return 3
    try:
        fig = plot(a.inputs, a.output, a.title)
    except PlotError as e:
        print(f"cxlrt plot: {e}", file=sys.stderr)
        return 2
    if a.summary:
        print(summary(fig))
    print(f"# plot: {os.path.abspath(a.output)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
