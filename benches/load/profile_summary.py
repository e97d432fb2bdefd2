#!/usr/bin/env python3
"""Condense the per-target dumps of profile.sh into one short Markdown file.

usage: [PROFILE_NOTE=text] profile_summary.py DUMP_DIR TARGET... > profile.md

DUMP_DIR holds, per target, what profile.sh writes: <t>.wrk.txt, <t>.dso.txt,
<t>.symbols.txt (flat, self time), <t>.attr.txt (perf_attr.py: phases,
portcullis frames, allocator callers; only with CALLGRAPH=1). Missing files are
skipped. Every figure below is copied or summed from those dumps.
"""
import os
import re
import sys

NAMES = {"pc_off": "portcullis, gates off", "pc_on": "portcullis, gates on", "bare": "bare Pingora"}
# glibc allocator entry points and internals, as perf names them (self time)
MALLOC = {
    "_int_malloc", "_int_free", "malloc", "cfree@GLIBC_2.2.5", "malloc_consolidate",
    "unlink_chunk.constprop.0", "realloc", "_int_realloc", "free", "__libc_malloc",
}
# jemalloc as linked by tikv-jemallocator: _rjem_* plus a few static internals
JEMALLOC = re.compile(r"^(_rjem_|tikv_jemalloc|do_rallocx$|ifree$|isfree$)")


def is_alloc(sym):
    return sym in MALLOC or bool(JEMALLOC.match(sym))
TOP_SYMBOLS = 20
TOP_FRAMES = 12


def read(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read()


def pct_lines(text):
    """[(percent, rest)] for lines that start with a percentage."""
    out = []
    for line in (text or "").splitlines():
        m = re.match(r"\s*([0-9.]+)%\s+(.*)$", line)
        if m:
            out.append((float(m.group(1)), m.group(2).strip()))
    return out


def short(name, width=110):
    return name if len(name) <= width else name[: width - 1] + "…"


def attr_sections(text):
    """perf_attr.py output: header values and {section title: [(pct, name)]}."""
    head, sections, cur = {}, {}, None
    for line in (text or "").splitlines():
        if line.startswith("## "):
            cur = line[3:].strip()
            sections[cur] = []
        elif cur is None:
            k, _, v = line.partition(":")
            if v:
                head[k.strip()] = v.strip()
        else:
            sections[cur].extend(pct_lines(line))
    return head, sections


def section(sections, prefix):
    for title, rows in sections.items():
        if title.startswith(prefix):
            return rows
    return []


def main():
    d, targets = sys.argv[1], sys.argv[2:]
    data = {}
    for t in targets:
        dso = {name.split()[-1]: p for p, name in pct_lines(read(os.path.join(d, f"{t}.dso.txt")))}
        syms = []
        for p, rest in pct_lines(read(os.path.join(d, f"{t}.symbols.txt"))):
            m = re.match(r"\[(.)\]\s+(.*)$", rest)
            syms.append((p, m.group(1) if m else "?", m.group(2) if m else rest))
        head, secs = attr_sections(read(os.path.join(d, f"{t}.attr.txt")))
        wrk = read(os.path.join(d, f"{t}.wrk.txt")) or ""
        m = re.search(r"^RESULT (.*)$", wrk, re.M)
        kv = dict(x.split("=") for x in m.group(1).split()) if m else {}
        data[t] = dict(dso=dso, syms=syms, head=head, secs=secs, wrk=kv)

    out = []
    w = out.append
    w("# CPU profile summary")
    w("")
    w("Condensed by `benches/load/profile_summary.py` from the dumps of `bash benches/load/profile.sh` "
      "(`perf record -e cpu-clock`: 999 Hz flat profile for 10 s, then 6 s of DWARF call graphs at "
      "399 Hz attributed by `perf_attr.py`, under `wrk -t2 -c64` with `keys.lua`). Percentages are "
      "shares of the proxy process's samples. The full dumps are not committed; re-run "
      "`profile.sh` to get them in `benches/load/out/profile/`.")
    w("")
    if os.environ.get("PROFILE_NOTE"):
        w(os.environ["PROFILE_NOTE"])
        w("")
    w("| share of the proxy's CPU | " + " | ".join(NAMES.get(t, t) for t in targets) + " |")
    w("|---|" + "---:|" * len(targets))

    def row(label, fn):
        w(f"| {label} | " + " | ".join(fn(data[t]) for t in targets) + " |")

    def fmt(x):
        return "–" if x is None else f"{x:.1f}%"

    def dso_share(x, pred):
        vals = [p for name, p in x["dso"].items() if pred(name)]
        return sum(vals) if vals else None

    row("kernel (`[kernel.kallsyms]`)", lambda x: fmt(dso_share(x, lambda n: n == "[kernel.kallsyms]")))
    row("glibc (`libc.so.6`)", lambda x: fmt(dso_share(x, lambda n: n.startswith("libc."))))
    row("the binary itself", lambda x: fmt(dso_share(x, lambda n: n in ("portcullis", "bare_pingora"))))
    row("allocator (glibc malloc family or jemalloc), self time (flat profile)",
        lambda x: fmt(sum(p for p, _, s in x["syms"] if is_alloc(s)) if x["syms"] else None))
    row("allocator + memcpy leaf samples (call-graph run)",
        lambda x: fmt(float(x["head"]["allocator/memcpy leaf samples"].rstrip("%")))
        if "allocator/memcpy leaf samples" in x["head"] else "–")

    def hooks(x):
        if not section(x["secs"], "portcullis functions"):
            return "–"  # bare Pingora: no portcullis hooks
        return fmt(sum(p for p, n in section(x["secs"], "Pingora / proxy phases")
                       if n.startswith("ProxyHttp>::")))

    row("portcullis `ProxyHttp` hooks (inclusive, sum)", hooks)
    row("`TimerManager::register_timer` (inclusive)",
        lambda x: fmt(next((p for p, n in section(x["secs"], "Pingora / proxy phases")
                            if n.endswith("register_timer")), None)))
    row("wrk requests/s during the flat profile",
        lambda x: f"{int(x['wrk']['requests']) / (int(x['wrk']['duration_us']) / 1e6):,.0f}"
        if x["wrk"] else "–")
    w("")

    def listing(title, lines):
        """A titled ```text block, left out when there is nothing to list."""
        if not lines:
            return
        w(title)
        w("")
        w("```text")
        for line in lines:
            w(line)
        w("```")
        w("")

    for t in targets:
        x = data[t]
        w(f"## {NAMES.get(t, t)} (`{t}`)")
        w("")
        listing(f"Top {TOP_SYMBOLS} symbols by self time (`[k]` kernel, `[.]` user space):",
                [f"{p:6.2f}%  [{kind}] {short(s)}" for p, kind, s in x["syms"][:TOP_SYMBOLS]])
        listing(f"Call-graph run ({x['head'].get('samples', '?')} samples): phases, inclusive:",
                [f"{p:6.2f}%  {short(n)}" for p, n in section(x["secs"], "Pingora / proxy phases")])
        frames = [(p, n) for p, n in section(x["secs"], "portcullis functions")
                  if "drop_in_place" not in n][:TOP_FRAMES]
        listing(f"portcullis frames on the stack, inclusive (top {TOP_FRAMES}, drops left out):",
                [f"{p:6.2f}%  {short(n)}" for p, n in frames])
        callers = section(x["secs"], "allocator/memcpy samples")[:TOP_FRAMES]
        listing(f"Allocator/memcpy samples by nearest non-glue caller (top {TOP_FRAMES}):",
                [f"{p:6.2f}%  {short(n)}" for p, n in callers])
    sys.stdout.write("\n".join(out).rstrip() + "\n")


if __name__ == "__main__":
    main()
