#!/usr/bin/env python3
"""The report of bench/hierarchy.sh: measured allreduce times next to the alpha-beta model of flat ring and mdring.

Reads RAW/rep*/ (each run's --json, ucx_perftest's output, libddl's telemetry), takes the median of the
repetitions, and writes OUT/table.txt (also printed) and OUT/summary.json.

The model, for p = d0·d1 ranks (d0 per host, d1 hosts; here 2x2), message n bytes, the host link's one-way
latency a_net and bandwidth b_net, and shared memory's a_shm and b_shm (all from ucx_perftest):

  flat ring  T = 2(p-1) · (a_net + (n/p)/b_net)
             ranks 0,1,2,3 in a ring cross the host link twice (1->2, 3->0); every step waits for its slowest
             hop, an inter-host one, which carries one block of n/p on each host's link.
  mdring     T = 2(d0-1) · (a_shm + (n/d0)/b_shm) + 2(d1-1) · (a_net + (n/d1)/b_net)
             a ring inside each host on the whole message, then a ring across hosts on 1/d0 of it; in that
             phase the d0 ranks of a host send n/(d0·d1) each at once over the same link: n/d1 per step.

So with a fast shared memory, mdring does 2(d1-1) = 2 steps on the link against the ring's 2(p-1) = 6, and
puts n·2(d1-1)/d1 = n bytes on each host's link against 1.5·n: up to 3x faster where latency dominates, 1.5x
where bandwidth does. The model leaves out the reduction's own cost and every software overhead per step; the
report shows the effective per-step latency the measured times imply.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

P, D0, D1 = 4, 2, 2
DDL = ("ring", "mdring", "rhd", "auto")
MPI = ("openmpi", "openmpi-ucx")


def human(n):
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def tc_seconds(text):
    """A tc time ("0.5ms", "500us", "1s", "0") in seconds; None when not understood."""
    m = re.fullmatch(r"([0-9.]+)\s*(s|sec|ms|msec|us|usec)?", text.strip().lower())
    if not m:
        return None
    return float(m[1]) * {None: 1e-6, "s": 1, "sec": 1, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6}[m[2]]


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def perftest_final(path):
    """ucx_perftest's "Final:" line: (p50 latency us, overall latency us, overall bandwidth bytes/s)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("Final:"):
                    v = line.split()
                    return float(v[2]), float(v[4]), float(v[6]) * (1 << 20)  # MB/s means 2^20 bytes/s
    except (OSError, ValueError, IndexError):
        pass
    return None


def load(raw):
    """{system: {bytes: [time_us per rep]}}, {perftest name: [results per rep]}, {bytes: [(dim0, dim1) us]}."""
    times, perf, dims, reps = {}, {}, {}, sorted(glob.glob(os.path.join(raw, "rep*")))
    for rep in reps:
        for path in glob.glob(os.path.join(rep, "*.json")):
            system = os.path.basename(path).split(".")[0]
            try:
                with open(path) as f:
                    rows = json.load(f)["results"]
            except (OSError, ValueError, KeyError):
                continue
            for r in rows:
                if r.get("wrong") not in (0, None):
                    continue  # a wrong result is not a time
                times.setdefault(system, {}).setdefault(r["bytes"], []).append(r["time_us"])
        for name in ("net-lat", "net-lat-poll", "net-bw", "shm-lat", "shm-lat-poll", "shm-bw"):
            # One run (perftest-NAME.txt) or several (perftest-NAME-K.txt): the best of them.
            runs = [perftest_final(f) for f in sorted(glob.glob(os.path.join(rep, f"perftest-{name}.txt")) +
                                                       glob.glob(os.path.join(rep, f"perftest-{name}-[0-9]*.txt")))]
            runs = [r for r in runs if r]
            best = max(runs, key=lambda r: (r[2], -r[0])) if runs else None
            perf.setdefault(name, []).append(best)
        # Telemetry: every rank's latest collective when it reported; mdring's carry the time per dimension.
        for path in glob.glob(os.path.join(rep, "*.telemetry")):
            with open(path, errors="replace") as f:
                for line in f:
                    kv = dict(x.split("=", 1) for x in line.split() if "=" in x)
                    # A rank's first collective is always reported, and includes connecting to its peers.
                    if kv.get("last_algo") != "mdring" or not kv.get("dims_us") or kv.get("count") == "1":
                        continue
                    try:
                        d = [float(x) for x in kv["dims_us"].split(",")]
                        dims.setdefault(int(kv["last_bytes"]), []).append((d[0], d[1]))
                    except (ValueError, IndexError, KeyError):
                        pass
    return times, perf, dims, len(reps)


def fmt(v, digits=1):
    if v is None:
        return "-"
    if isinstance(v, float) and v != 0 and abs(v) < 0.1:
        return f"{v:.2g}"
    return f"{v:.{digits}f}"


def table(header, rows):
    cols = [header] + rows
    widths = [max(len(r[i]) for r in cols) for i in range(len(header))]
    out = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--delay", default="0")
    ap.add_argument("--delay-applied", type=int, default=0)
    ap.add_argument("--shaping", default="")
    ap.add_argument("--systems", default=",".join(DDL + MPI))
    ap.add_argument("--reps", type=int, default=0)
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--small-iters", type=int, default=0)
    ap.add_argument("--small-below", type=int, default=1 << 20)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--cores", type=int, default=0)
    a = ap.parse_args()

    systems = [s for s in a.systems.split(",") if s]
    times, perf, dims, nreps = load(a.raw)
    t = {s: {n: median(v) for n, v in times.get(s, {}).items()} for s in systems}
    sizes = sorted({n for s in systems for n in t[s]})
    if not sizes:
        print("hierarchy_report: no results", file=sys.stderr)
        return 1

    def pick(name, i):
        return median(r[i] if r else None for r in perf.get(name, []))

    link = {
        "net_lat_p50_us": pick("net-lat", 0), "net_lat_mean_us": pick("net-lat", 1),
        "net_lat_poll_p50_us": pick("net-lat-poll", 0), "net_lat_poll_mean_us": pick("net-lat-poll", 1),
        "net_bw_Bps": pick("net-bw", 2),
        "shm_lat_p50_us": pick("shm-lat", 0), "shm_lat_mean_us": pick("shm-lat", 1),
        "shm_lat_poll_p50_us": pick("shm-lat-poll", 0), "shm_lat_poll_mean_us": pick("shm-lat-poll", 1),
        "shm_bw_Bps": pick("shm-bw", 2),
    }
    have_model = all(link[k] for k in ("net_lat_p50_us", "net_bw_Bps", "shm_lat_p50_us", "shm_bw_Bps"))
    delay_s = tc_seconds(a.delay) or 0.0
    extra = delay_s if (delay_s > 0 and not a.delay_applied) else 0.0  # the delay asked for but not applied

    def model(n, add=0.0):
        """(ring, mdring) model times in us; add: seconds added to the link latency."""
        if not have_model:
            return None, None
        an, bn = link["net_lat_p50_us"] * 1e-6 + add, link["net_bw_Bps"]
        as_, bs = link["shm_lat_p50_us"] * 1e-6, link["shm_bw_Bps"]
        ring = 2 * (P - 1) * (an + n / P / bn)
        md = 2 * (D0 - 1) * (as_ + n / D0 / bs) + 2 * (D1 - 1) * (an + n / D1 / bn)
        return ring * 1e6, md * 1e6

    def busbw(n, us):
        return n / (us * 1e-6) * 2 * (P - 1) / P / 1e9 if us else None

    def ratio(num, den):
        return num / den if num and den else None

    rows = []
    for n in sizes:
        r = {"bytes": n, "time_us": {s: t[s].get(n) for s in systems},
             "reps_time_us": {s: times.get(s, {}).get(n, []) for s in systems}}
        r["busbw_GBs"] = {s: busbw(n, r["time_us"][s]) for s in systems}
        mr, mm = model(n)
        r["model_us"] = {"ring": mr, "mdring": mm}
        if extra:
            er, em = model(n, extra)
            r["model_with_delay_us"] = {"ring": er, "mdring": em}
        r["mdring_over_ring"] = ratio(r["time_us"].get("ring"), r["time_us"].get("mdring"))  # speedup
        r["model_mdring_over_ring"] = ratio(mr, mm)
        mpis = [(r["time_us"][s], s) for s in MPI if r["time_us"].get(s)]
        best = min(mpis) if mpis else (None, None)
        r["best_mpi"] = best[1]
        r["auto_over_mpi"] = ratio(best[0], r["time_us"].get("auto"))  # speedup of auto over the best MPI
        d = dims.get(n)
        if d:
            r["mdring_dims_us"] = [median(x[0] for x in d), median(x[1] for x in d)]
            r["mdring_dims_samples"] = len(d)
        rows.append(r)

    lines = []
    say = lines.append
    nominal = f"{a.shaping or 'unshaped'}"
    if a.delay_applied:
        delay_note = ""
    elif delay_s > 0:
        delay_note = (f"; NO added delay (no sch_netem in this kernel): the '+{a.delay}' model columns add the "
                      f"requested {a.delay} to the measured link latency")
    else:
        delay_note = "; no added delay"
    say(f"# 2 hosts x 2 ranks (network namespaces on one machine, {a.cores or '?'} cores shared by all ranks)")
    say(f"# host links: {nominal}{delay_note}")
    say("# within a host: shared memory (UCX sm); between hosts: TCP over the shaped veths. ddl: DDL_TOPOLOGY=2x2")
    say(f"# times: mean of the timed calls (slowest rank), out of place, median of {nreps} rep(s); "
        f"{a.small_iters} calls per size below {human(a.small_below)}, {a.iters} from there, after {a.warmup} warmup calls")
    if have_model:
        say("# ucx_perftest, peer error handling on; latency: one-way, median (mean) of 8 B ping-pongs, receiver "
            "waiting in the kernel (-E sleep) [busy-polling (-E poll)]; bandwidth: 4 MiB messages (shared "
            "memory: the best of 3 runs)")
        say(f"#   link (tcp):          a_net = {link['net_lat_p50_us']:.1f} us ({fmt(link['net_lat_mean_us'])}) "
            f"[{fmt(link['net_lat_poll_p50_us'])} ({fmt(link['net_lat_poll_mean_us'])})], "
            f"b_net = {link['net_bw_Bps'] / 1e9:.3f} GB/s")
        say(f"#   shared memory (sm):  a_shm = {link['shm_lat_p50_us']:.1f} us ({fmt(link['shm_lat_mean_us'])}) "
            f"[{fmt(link['shm_lat_poll_p50_us'], 2)} ({fmt(link['shm_lat_poll_mean_us'])})], "
            f"b_shm = {link['shm_bw_Bps'] / 1e9:.2f} GB/s")
        say("# model (us): ring 2(p-1)(a_net + n/p/b_net); mdring 2(d0-1)(a_shm + n/d0/b_shm) + "
            "2(d1-1)(a_net + n/d1/b_net); p=4, d0=d1=2")
    else:
        say("# no link measurement (ucx_perftest missing or failed): no model")
    say("")

    say("Time per allreduce (us)")
    hdr = ["size"] + systems + ["model ring", "model mdring"]
    if extra:
        hdr += [f"ring +{a.delay}", f"mdring +{a.delay}"]
    body = []
    for r in rows:
        row = [human(r["bytes"])] + [fmt(r["time_us"][s]) for s in systems]
        row += [fmt(r["model_us"]["ring"]), fmt(r["model_us"]["mdring"])]
        if extra:
            row += [fmt(r["model_with_delay_us"]["ring"]), fmt(r["model_with_delay_us"]["mdring"])]
        body.append(row)
    say(table(hdr, body))
    say("")

    say("Bus bandwidth (GB/s) and speedups (x: how many times faster)")
    hdr = ["size"] + systems + ["mdring/ring", "model", "auto/MPI", "best MPI"]
    if extra:
        hdr.insert(-2, f"model +{a.delay}")
    body = []
    for r in rows:
        row = [human(r["bytes"])] + [fmt(r["busbw_GBs"][s], 3) for s in systems]
        row += [fmt(r["mdring_over_ring"], 2), fmt(r["model_mdring_over_ring"], 2)]
        if extra:
            wd = r["model_with_delay_us"]
            row.append(fmt(ratio(wd["ring"], wd["mdring"]), 2))
        row += [fmt(r["auto_over_mpi"], 2), r["best_mpi"] or "-"]
        body.append(row)
    say(table(hdr, body))
    say("")

    if any("mdring_dims_us" in r for r in rows):
        # Telemetry samples a rank's latest call every 200 ms, so long calls are sampled more often than short
        # ones: the shares are more trustworthy than the absolute times, and are applied to the measured mean.
        say("mdring per dimension: share of the time in each phase (libddl's telemetry, median of the sampled "
            "calls) applied to the measured mean, against the model (us)")
        hdr = ["size", "samples", "shm share", "model", "dim0 shm", "model", "dim1 link", "model"]
        body = []
        for r in rows:
            if "mdring_dims_us" not in r or not r["time_us"].get("mdring"):
                continue
            d0, d1 = r["mdring_dims_us"]
            n, tm = r["bytes"], r["time_us"]["mdring"]
            share = d0 / (d0 + d1) if d0 + d1 > 0 else None
            m0 = m1 = None
            if have_model:
                m0 = 2 * (D0 - 1) * (link["shm_lat_p50_us"] + n / D0 / link["shm_bw_Bps"] * 1e6)
                m1 = 2 * (D1 - 1) * (link["net_lat_p50_us"] + n / D1 / link["net_bw_Bps"] * 1e6)
            r["mdring_dims_est_us"] = [share * tm, (1 - share) * tm] if share is not None else None
            body.append([human(n), str(r["mdring_dims_samples"]), fmt(share * 100 if share is not None else None),
                         fmt(m0 / (m0 + m1) * 100 if m0 else None),
                         fmt(share * tm if share is not None else None), fmt(m0),
                         fmt((1 - share) * tm if share is not None else None), fmt(m1)])
        say(table(hdr, body))
        say("")

    # The per-step latency the smallest size implies: ring = 6 link steps, mdring = 2 shm + 2 link steps.
    small = rows[0]
    tr, tm = small["time_us"].get("ring"), small["time_us"].get("mdring")
    steps = None
    if tr and tm:
        c_net = tr / (2 * (P - 1))
        c_shm = (tm - 2 * (D1 - 1) * c_net) / (2 * (D0 - 1))
        steps = {"bytes": small["bytes"], "net_step_us": c_net, "shm_step_us": c_shm}
        say(f"Per-step latency at {human(small['bytes'])} B: the ring's {tr:.1f} us over its {2 * (P - 1)} steps "
            f"is {c_net:.1f} us per link step (a_net: {fmt(link['net_lat_p50_us'])} us); mdring's {tm:.1f} us "
            f"for 2 link + 2 shared-memory steps then leaves {c_shm:.1f} us per shared-memory step (a_shm: "
            f"{fmt(link['shm_lat_p50_us'])} us)"
            + (" - negative: the two runs disagree by more than a step (noise)" if c_shm < 0 else "") + ".")
        say("")

    # The goals.
    goals = {}
    if have_model:
        an, bn = link["net_lat_p50_us"] * 1e-6, link["net_bw_Bps"]
        lat_max = P * an * bn          # ring's latency term >= its bandwidth term up to here
        bw_min = 10 * lat_max          # bandwidth term >= 10x the latency term from here
    else:
        lat_max, bw_min = 4096, 1 << 20
    lat_sizes = [r for r in rows if r["bytes"] <= lat_max] or rows[:1]
    bw_sizes = [r for r in rows if r["bytes"] >= bw_min]

    def judge(name, sel, key, threshold, what):
        vals = [(r[key], r["bytes"]) for r in sel if r.get(key)]
        if not vals:
            goals[name] = {"met": None, "what": what}
            return f"{what}: not measured"
        worst = min(vals)
        below = [human(n) for v, n in vals if v < threshold]
        met = not below
        goals[name] = {"met": met, "what": what, "worst": worst[0], "worst_bytes": worst[1], "below": below,
                       "sizes": [n for _, n in vals]}
        return (f"{what}: {'met' if met else 'NOT met'} (worst {worst[0]:.2f}x at {human(worst[1])}"
                + (f"; below at {', '.join(below)}" if below else "") + ")")

    say("Goals")
    say("- " + judge("mdring_latency", lat_sizes, "mdring_over_ring", 1.3,
                     f"mdring >= 1.3x flat ring where latency dominates (sizes <= {human(int(lat_max))} B, "
                     "where the ring model's latency term is at least its bandwidth term)"))
    say("- " + judge("mdring_large", bw_sizes, "mdring_over_ring", 1.0,
                     f"mdring never below flat ring at large sizes (>= {human(int(bw_min))} B, bandwidth term "
                     ">= 10x latency term)"))
    say("- " + judge("auto_vs_mpi", rows, "auto_over_mpi", 1.0,
                     "ddl auto ahead of Open MPI (the faster of openmpi, openmpi-ucx) at every size"))
    say("(the machine's cores are shared by all 4 ranks and by anything else running: figures are noisy)")

    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "table.txt"), "w") as f:
        f.write(text)
    summary = {
        "settings": {"rate": a.rate, "delay": a.delay, "delay_applied": bool(a.delay_applied),
                     "shaping": a.shaping, "systems": systems, "reps": nreps, "iters": a.iters,
                     "small_iters": a.small_iters, "small_below": a.small_below, "warmup": a.warmup, "cores": a.cores,
                     "topology": f"{D0}x{D1}", "ranks": P},
        "link": link, "model": "ring 2(p-1)(a_net+n/p/b_net); mdring 2(d0-1)(a_shm+n/d0/b_shm)+2(d1-1)(a_net+n/d1/b_net)",
        "per_step": steps, "results": rows, "goals": goals,
    }
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
