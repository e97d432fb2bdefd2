#!/usr/bin/env python3
"""One Markdown page of issue 47's figures from side_by_side.sh's output directory.

usage: side_by_side.py OUT_DIR > summary.md

Reads OUT_DIR/h1-<n>t/main.csv and shed.csv (run.sh), OUT_DIR/h2-<n>t.log (tls_h2.sh's
per-round lines on stderr), OUT_DIR/callgrind.csv (build,target,mode,threads,instr,allocs,
frees,n1,n2) and env.txt. Each CPU ratio is the median of the per-round ratios of two
proxies measured next to each other in time, with the range in brackets; a missing part
prints as "not run".
"""
import csv
import os
import re
import statistics
import sys

OUT = sys.argv[1]
THREADS = ("1", "2")
# the proxies beside HAProxy in both comparisons: (target, name)
OTHERS = (("bare", "bare Pingora"), ("nginx", "nginx"), ("envoy", "Envoy"))


def rounds(path):
    """{round: {name: proxy_cpu_us_per_req}} of a run.sh CSV."""
    by = {}
    if not os.path.exists(path):
        return by
    for r in csv.DictReader(open(path)):
        m = re.match(r"r(\d+)_(.*)", r["label"])
        if m and r["proxy_cpu_us_per_req"] not in ("", "0", "0.0"):
            by.setdefault(m.group(1), {})[m.group(2)] = float(r["proxy_cpu_us_per_req"])
    return by


def ratio(by, a, b):
    """median (range) of a ÷ b over the rounds holding both, or None."""
    vals = [v[a] / v[b] for v in by.values() if a in v and b in v and v[b] > 0]
    if not vals:
        return None
    return statistics.median(vals), min(vals), max(vals), len(vals)


def fmt(r, digits=2):
    if r is None:
        return "not run"
    med, lo, hi, n = r
    return f"**{med:.{digits}f}** ({lo:.{digits}f}–{hi:.{digits}f}, {n} rounds)"


def h2_ratios(path):
    """{proxy: (median, lo, hi, n)} of proxy ÷ HAProxy per stream, from tls_h2.sh's stderr."""
    res = {}
    if not os.path.exists(path):
        return res
    for line in open(path):
        m = re.match(r"# h2: HAProxy ÷ (\S+) per round: ([0-9. ]*);", line)
        if not m:
            continue
        hp = [float(x) for x in m.group(2).split() if float(x) > 0]
        if hp:
            inv = [1 / x for x in hp]
            res[m.group(1)] = (statistics.median(inv), min(inv), max(inv), len(inv))
    return res


def callgrind(path):
    rows = {}
    if not os.path.exists(path):
        return rows
    for r in csv.reader(open(path)):
        if len(r) < 9:
            continue
        build, target, mode = r[0], r[1], r[2]
        rows[(build, target, mode)] = (int(r[4]), float(r[5]))
    return rows


env = {}
if os.path.exists(os.path.join(OUT, "env.txt")):
    for line in open(os.path.join(OUT, "env.txt")):
        k, _, v = line.strip().partition("=")
        env[k] = v

main = {n: rounds(os.path.join(OUT, f"h1-{n}t", "main.csv")) for n in THREADS}
shed = {n: rounds(os.path.join(OUT, f"h1-{n}t", "shed.csv")) for n in THREADS}
h2 = {n: h2_ratios(os.path.join(OUT, f"h2-{n}t.log")) for n in THREADS}
cg = callgrind(os.path.join(OUT, "callgrind.csv"))

print(f"Run of {env.get('date', '?')} at `{env.get('commit', '?')}`, {env.get('cpu', '?')}, "
      f"{env.get('nproc', '?')} vCPUs, load at start {env.get('load_at_start', '?')}; "
      f"portcullis: `{env.get('pc_bin', '?')}`.\n")
print("| figure | 1 thread | 2 threads | goal |")
print("|---|---|---|---|")


def row(name, cells, goal):
    print(f"| {name} | {cells[0]} | {cells[1]} | {goal} |")


row("CPU per request, HTTP/1.1 keep-alive, gates on ÷ HAProxy",
    [fmt(ratio(main[n], "pc_on", "haproxy")) for n in THREADS], "≤ 1.00")
row("  gates off ÷ HAProxy", [fmt(ratio(main[n], "pc_off", "haproxy")) for n in THREADS], "")
for other, name in OTHERS:
    row(f"  {name} ÷ HAProxy", [fmt(ratio(main[n], other, "haproxy")) for n in THREADS], "")
row("CPU per stream, h2 over TLS, portcullis ÷ HAProxy",
    [fmt(h2[n].get("portcullis")) for n in THREADS], "≤ 1.20")
for other, name in OTHERS:
    row(f"  {name} ÷ HAProxy", [fmt(h2[n].get(other)) for n in THREADS], "")


def allocs(target, mode):
    """allocations per request of the PC_BIN build (or HAProxy) under callgrind"""
    v = cg.get(("pc", target, mode))
    return "not run" if v is None else f"{v[1]:.1f}"


pc_i, ha_i = cg.get(("pc", "pc_on", "h1")), cg.get(("pc", "haproxy", "h1"))
instr = (f"{pc_i[0]:,} vs {ha_i[0]:,} (**{pc_i[0] / ha_i[0]:.2f}**)" if pc_i and ha_i else "not run")
row("user-space instructions per request, HTTP/1.1 gates on (callgrind)", [instr, ""], "≤ 1.20")
row("allocations per request, HTTP/1.1 gates on",
    [f"**{allocs('pc_on', 'h1')}** (HAProxy {allocs('haproxy', 'h1')})", ""], "≤ 20")
row("allocations per stream, h2 over TLS",
    [f"**{allocs('pc_on', 'h2tls')}** (HAProxy {allocs('haproxy', 'h2tls')})", ""], "≤ 16")
row("shed 503 ÷ proxied 200 (gates on), portcullis; HAProxy's own",
    [f"{fmt(ratio(shed[n], 'shed503', 'proxied200_gates_on'))}; {fmt(ratio(shed[n], 'haproxy_503', 'haproxy_200'))}"
     for n in THREADS], "≤ HAProxy's own")
row("gates on ÷ gates off", [fmt(ratio(main[n], "pc_on", "pc_off")) for n in THREADS], "≤ 1.03")

builds = [b for b in ("pc", "plain") if any(k[0] == b for k in cg)]
if builds:
    print("\nInstructions / allocations per request under callgrind (1 thread, N1 = 500, N2 = 2,500;"
          " `pc` is PC_BIN, `plain` PLAIN_BIN):\n")
    print("| case | " + " | ".join(builds) + " |")
    print("|---|" + "---:|" * len(builds))
    for target, mode, name in (
        ("pc_on", "h1", "HTTP/1.1, gates on"),
        ("pc_off", "h1", "HTTP/1.1, gates off"),
        ("pc_shed", "h1", "a shed 503"),
        ("pc_on", "h2tls", "h2 over TLS, gates on, per stream"),
        ("haproxy", "h1", "HAProxy, HTTP/1.1"),
        ("haproxy", "h2tls", "HAProxy, h2 over TLS"),
        ("bare", "h1", "bare Pingora, HTTP/1.1"),
    ):
        cells = []
        for b in builds:
            v = cg.get((b, target, mode))
            cells.append(f"{v[0]:,} / {v[1]:.1f}" if v else "")
        print(f"| {name} | " + " | ".join(cells) + " |")
