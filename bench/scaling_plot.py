#!/usr/bin/env python3
"""Scaling efficiency against GPU count from ddl-sim's model, as an SVG (docs/scaling-efficiency.svg).

Runs `ddl-sim scale --json` for both built-in clusters (2017: S822LC with P100s and EDR; h100: H100s with NDR per
GPU) over 64 .. 4096 GPUs and draws one panel per cluster: ResNet-50's fp32 gradients, ring against mdring, without
overlap (solid) and with the default overlap (dashed). Plain SVG written here, so it needs neither matplotlib nor
gnuplot; --png FILE also renders it with headless Chromium where one is installed (scripts/bootstrap installs it
for the dashboard's screenshots). docs/scaling-model.md explains the figures.

Usage: bench/scaling_plot.py [--sim build/bin/ddl-sim] [--network resnet50] [--out docs/scaling-efficiency.svg]
                             [--png docs/scaling-efficiency.png]
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

CONFIGS = (("2017", "2017: 4 P100/node, NVLink 1.0, 1 EDR port/node"),
           ("h100", "H100: 8/node, NVLink 4, NDR 400G per GPU"))
ALGOS = (("ring", "#d62728"), ("mdring", "#1f77b4"))
GPUS = [64, 128, 256, 512, 1024, 2048, 4096]

W, H = 930, 400
PANEL_W, PANEL_H = 360, 280
LEFT, TOP = 70, 50
GAP = 80


def esc(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def run_sim(sim, network):
    cmd = [sim, "scale", "--config", ",".join(c for c, _ in CONFIGS), "--gpus", ",".join(map(str, GPUS)),
           "--network", network, "--algo", ",".join(a for a, _ in ALGOS), "--json", "-"]
    # With --json - stdout holds the JSON alone (ddl-sim prints its table to stderr then).
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sim", default=os.path.join(repo, "build", "bin", "ddl-sim"))
    ap.add_argument("--network", default="resnet50")
    ap.add_argument("--out", default=os.path.join(repo, "docs", "scaling-efficiency.svg"))
    ap.add_argument("--png", help="also render the SVG to this PNG with headless Chromium")
    a = ap.parse_args()
    try:
        rows = run_sim(a.sim, a.network)
    except (OSError, subprocess.CalledProcessError, ValueError) as e:
        print(f"scaling_plot: running {a.sim} failed: {e}", file=sys.stderr)
        return 1

    lo, hi = math.log2(GPUS[0]), math.log2(GPUS[-1])
    ymin = 0.5

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
           f'font-size="12"><rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">ddl-sim: scaling efficiency of '
           f'{esc(a.network)} (fp32 gradients), modelled</text>']
    for i, (config, title) in enumerate(CONFIGS):
        x0 = LEFT + i * (PANEL_W + GAP)

        def px(g):
            return x0 + (math.log2(g) - lo) / (hi - lo) * PANEL_W

        def py(e):
            return TOP + (1 - (e - ymin) / (1 - ymin)) * PANEL_H

        svg.append(f'<text x="{x0 + PANEL_W / 2}" y="{TOP - 10}" text-anchor="middle">{esc(title)}</text>')
        svg.append(f'<rect x="{x0}" y="{TOP}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="#444"/>')
        for k in range(6):
            e = ymin + k * (1 - ymin) / 5
            svg.append(f'<line x1="{x0}" x2="{x0 + PANEL_W}" y1="{py(e):.1f}" y2="{py(e):.1f}" stroke="#ddd"/>')
            svg.append(f'<text x="{x0 - 6}" y="{py(e) + 4:.1f}" text-anchor="end">{e * 100:.0f}%</text>')
        for g in GPUS:
            svg.append(f'<line x1="{px(g):.1f}" x2="{px(g):.1f}" y1="{TOP}" y2="{TOP + PANEL_H}" stroke="#eee"/>')
            svg.append(f'<text x="{px(g):.1f}" y="{TOP + PANEL_H + 16}" text-anchor="middle">{g}</text>')
        svg.append(f'<text x="{x0 + PANEL_W / 2}" y="{TOP + PANEL_H + 34}" text-anchor="middle">GPUs</text>')
        for algo, colour in ALGOS:
            for key, dash in (("efficiency", ""), ("efficiency_overlap", ' stroke-dasharray="6,4"')):
                pts = sorted((r["gpus"], r[key]) for r in rows if r["config"] == config and r["algo"] == algo)
                path = " ".join(f"{px(g):.1f},{py(max(e, ymin)):.1f}" for g, e in pts)
                svg.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
                for g, e in pts:
                    svg.append(f'<circle cx="{px(g):.1f}" cy="{py(max(e, ymin)):.1f}" r="2.5" fill="{colour}"/>')
        if config == "2017":  # DDL's published figure: 95% at 256 GPUs
            svg.append(f'<path d="M{px(256) - 6:.1f},{py(0.95):.1f} l6,-6 l6,6 l-6,6 z" fill="black"/>')
            svg.append(f'<text x="{px(256):.1f}" y="{py(0.985):.1f}" text-anchor="middle">'
                       f'&#9670; DDL paper, 256 GPUs: 95%</text>')
    ly = TOP + PANEL_H + 52
    x = LEFT
    overlap = rows[0]["overlap"] if rows else 0
    for algo, colour in ALGOS:
        for label, dash in (("", ""), (f" + overlap {overlap:g}", ' stroke-dasharray="6,4"')):
            svg.append(f'<line x1="{x}" x2="{x + 28}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="2"{dash}/>')
            svg.append(f'<text x="{x + 34}" y="{ly + 4}">{algo}{esc(label)}</text>')
            x += 190
    svg.append("</svg>")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(svg) + "\n")
    print(f"scaling_plot: wrote {a.out}")
    if a.png:
        browser = shutil.which("chromium") or shutil.which("chromium-browser")
        if not browser:
            print("scaling_plot: no chromium for --png; the SVG is written", file=sys.stderr)
            return 1
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={W},{H}",
               f"--screenshot={os.path.abspath(a.png)}", "file://" + os.path.abspath(a.out)]
        try:
            subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            print(f"scaling_plot: chromium failed: {e}", file=sys.stderr)
            return 1
        print(f"scaling_plot: wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
