#!/usr/bin/python3
"""Draws bench/compare.py's OUT/summary.json: one panel per (transport, rank count), bus bandwidth against
message size (log-log), one line per system, ddl-auto drawn thickest, ddl's forced algorithms dashed, the
peers (Open MPI, Gloo) solid and UCX's point-to-point bandwidth dotted for reference. Writes OUT/busbw.png
beside the summary unless -o says otherwise.

  /usr/bin/python3 bench/plot.py bench-results/summary.json [-o busbw.png] [--linear]

Needs matplotlib (Debian python3-matplotlib; scripts/bootstrap bench installs it). No display needed (Agg).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

# Fixed colours per system, so that a line keeps its colour from one figure to the next.
STYLE = {
    "ddl-auto": dict(color="#d62728", linewidth=3.0, marker="o", markersize=5, zorder=10),
    "ddl-ring": dict(color="#ff9896", linewidth=1.2, linestyle="--"),
    "ddl-mdring": dict(color="#e377c2", linewidth=1.2, linestyle="--"),
    "ddl-rhd": dict(color="#8c564b", linewidth=1.2, linestyle="--"),
    "openmpi": dict(color="#1f77b4", linewidth=1.8, marker="s", markersize=3),
    "openmpi-ucx": dict(color="#17becf", linewidth=1.8, marker="^", markersize=3),
    "gloo": dict(color="#2ca02c", linewidth=1.8, marker="D", markersize=3),
}
P2P_STYLE = dict(color="0.45", linewidth=1.2, linestyle=":")


def human(n):
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}"


def draw_panel(ax, entry, linear):
    sizes = entry["sizes"]
    for name in entry["systems"]:
        points = [(s, entry["busbw_GBs"][str(s)].get(name)) for s in sizes]
        points = [(s, v) for s, v in points if v is not None and v > 0]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, label=name, **STYLE.get(name, dict(linewidth=1.2)))
    p2p = [(s, entry["p2p_GBs"].get(str(s))) for s in sizes]
    p2p = [(s, v) for s, v in p2p if v]
    if p2p:
        xs, ys = zip(*p2p)
        ax.plot(xs, ys, label="UCX p2p", **P2P_STYLE)
    ax.set_xscale("log", base=2)
    if not linear:
        ax.set_yscale("log")
    ax.xaxis.set_major_locator(FixedLocator(sizes))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: human(int(round(x)))))
    ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    gloo = ", Gloo over TCP" if "gloo" in entry["systems"] else ""
    ax.set_title(f"{entry['ranks']} ranks, {entry['transport']} (UCX_TLS={entry['ucx_tls']}{gloo})",
                 fontsize=10)
    ax.set_xlabel("message size (bytes, float32 sum)")
    ax.grid(True, which="major", alpha=0.3)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("summary", help="bench/compare.py's OUT/summary.json")
    p.add_argument("-o", "--output", help="the PNG (default: busbw.png beside the summary)")
    p.add_argument("--linear", action="store_true", help="linear bandwidth axis (default: logarithmic)")
    a = p.parse_args()
    try:
        with open(a.summary) as f:
            summary = json.load(f)
        entries = summary["results"]
        for e in entries:
            e["sizes"], e["systems"], e["busbw_GBs"]  # written by this compare.py, not an older one
    except (OSError, ValueError) as e:
        sys.exit(f"plot.py: cannot read {a.summary}: {e}")
    except (KeyError, TypeError) as e:
        sys.exit(f"plot.py: {a.summary} is not a summary of this bench/compare.py (no {e}); run it again")
    if not entries:
        sys.exit(f"plot.py: {a.summary} holds no results")
    output = a.output or os.path.join(os.path.dirname(a.summary) or ".", "busbw.png")

    transports = list(dict.fromkeys(e["transport"] for e in entries))
    ranks = sorted({e["ranks"] for e in entries})
    fig, axes = plt.subplots(len(transports), len(ranks), squeeze=False, sharey=True,
                             figsize=(4.6 * len(ranks) + 1, 4.2 * len(transports) + 0.8))
    for e in entries:
        draw_panel(axes[transports.index(e["transport"])][ranks.index(e["ranks"])], e, a.linear)
    for row in axes:
        row[0].set_ylabel("bus bandwidth (GB/s)")
    for ax in axes.flat:
        if not ax.has_data():
            ax.set_visible(False)  # a (transport, ranks) pair that was not run
    handles = {}
    for ax in axes.flat:
        for h, l in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(l, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(8, len(handles)),
               frameon=False, fontsize=9)
    m = summary.get("machine", {})
    reps = summary.get("reps", "?")
    runs = "one run" if reps == 1 else f"median of {reps} runs"
    fig.suptitle(f"allreduce bus bandwidth, {summary.get('variant', '')}, {runs} — {m.get('host', '?')}, "
                 f"{m.get('cpus', '?')} CPUs, {m.get('date', '')[:10]}", fontsize=11)
    fig.tight_layout(rect=(0, 0.07 if len(transports) == 1 else 0.04, 1, 0.95))
    fig.savefig(output, dpi=120)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
