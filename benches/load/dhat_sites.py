#!/usr/bin/env python3
"""Allocation sites per request from two DHAT profiles (benches/load/dhat.sh).

    dhat_sites.py RUN1.json RUN2.json N TOP OUT.csv

A site is an allocation's call stack (DHAT's program point). Its allocations per request
are (blocks in run 2 - blocks in run 1) / N, where N is the difference of the runs'
request counts. Each site is attributed to its first frame, from the allocator up, that
is not Rust's standard library or the allocator: the owner is `portcullis` (src/, crates/),
`pingora` (vendor/pingora-*), or the registry crate's name (h2, tokio, http, ...).
"""
import csv
import json
import re
import sys
from collections import defaultdict

# Frames that say nothing about who asked for the memory.
PLUMBING = re.compile(
    r"/rustc/|vg_replace_malloc|/jemalloc|tikv-jemalloc|_rjem_|\(in /usr/lib|"
    r"/library/(alloc|core|std)/|alloc::|core::ptr::|<alloc::"
)
REGISTRY = re.compile(r"/registry/src/[^/]+/([A-Za-z0-9_\-]+?)-\d+\.\d+[^/]*/")
# Data-structure crates: the site is whoever called them (their operation is kept as `via`).
CONTAINERS = {"bytes", "http", "hashbrown", "smallvec", "indexmap", "arrayvec"}


def load(path):
    with open(path) as f:
        d = json.load(f)
    ftbl = d["ftbl"]
    sites = {}
    for pp in d["pps"]:
        stack = tuple(ftbl[i] for i in pp["fs"])
        blocks, bytes_ = sites.get(stack, (0, 0))
        sites[stack] = (blocks + pp["tbk"], bytes_ + pp["tb"])
    return sites


def owner(frame):
    m = REGISTRY.search(frame)
    if m:
        name = m.group(1)
        return ("pingora" if name.startswith("pingora") else name), name
    if "/vendor/pingora-" in frame:
        crate = re.search(r"/vendor/(pingora-[a-z]+)/", frame).group(1)
        return "pingora", crate
    if "/src/" in frame or "/crates/" in frame:
        return "portcullis", "portcullis"
    return "other (per-request state: Box, Vec, LRU node)", "?"


def first_owned(stack):
    """(the first frame outside the standard library and the container crates, the
    first container frame below it or "")"""
    via = ""
    for fr in stack:
        if fr == "[root]" or PLUMBING.search(fr):
            continue
        m = REGISTRY.search(fr)
        if m and m.group(1) in CONTAINERS:
            via = via or fr
            continue
        return fr, via
    return (stack[-1] if stack else "?"), via


def short(frame):
    # "0x1234: fn::path (/abs/path/file.rs:12)" -> "fn::path (file.rs:12)"
    frame = re.sub(r"^0x[0-9A-F]+: ", "", frame)
    return re.sub(r"\((?:[^()]*/)?([^/()]+:\d+)\)$", r"(\1)", frame)


# What kind of allocation a site is, from its whole stack (first match).
KINDS = [
    ("boxed async fn (async_trait)", re.compile(r"pin<[^ ]*async_(block|fn)_env")),
    ("header map clone", re.compile(r"HeaderMap<T> as core::clone::Clone")),
    ("header map (new / grow)", re.compile(r"HeaderMap<T>::(try_reserve|try_grow|try_with_capacity|with_capacity)")),
    ("timer (pingora-timeout)", re.compile(r"pingora_timeout::")),
    ("header value / name bytes", re.compile(r"HeaderValue::|HeaderName::|PathAndQuery|ByteStr as core::clone")),
    ("buffer (Bytes / BytesMut / Vec<u8>)", re.compile(r"bytes::|Vec<u8")),
    ("task / channel / sync (tokio)", re.compile(r"tokio::")),
]


# Work of a background task, driven by time, not by requests: its share per request falls
# as the request rate rises (under valgrind the rate is low, so it counts more here).
BACKGROUND = re.compile(r"run_flusher|background::Flusher|portcullis_store::|heartbeat_keys")


def kind(stack_text, whole=""):
    if BACKGROUND.search(whole):
        return "background (store flush, per interval)"
    for name, rx in KINDS:
        if rx.search(stack_text):
            return name
    return "other (per-request state: Box, Vec, LRU node)"


def main():
    f1, f2, n, top, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    s1, s2 = load(f1), load(f2)
    rows = []
    for stack in set(s1) | set(s2):
        b1, y1 = s1.get(stack, (0, 0))
        b2, y2 = s2.get(stack, (0, 0))
        if b2 == b1:
            continue
        fr, via = first_owned(stack)
        who, crate = owner(fr)
        site = short(fr) + (f" via {short(via).split(' (')[0]}" if via else "")
        # the frames from the allocator up to the site and its caller tell the kind
        upto = stack[: stack.index(fr) + 2] if fr in stack else stack
        rows.append((who, crate, (b2 - b1) / n, (y2 - y1) / n, site,
                     " <- ".join(short(x) for x in stack if x != "[root]"),
                     kind(" ".join(upto), " ".join(stack))))
    rows.sort(key=lambda r: -r[2])
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["owner", "crate", "kind", "allocs_per_req", "bytes_per_req", "site", "stack"])
        for r in rows:
            w.writerow([r[0], r[1], r[6], f"{r[2]:.2f}", f"{r[3]:.0f}", r[4], r[5]])
    total = sum(r[2] for r in rows)
    by_kind = defaultdict(lambda: defaultdict(float))
    for r in rows:
        by_kind[r[6]][r[0] if r[0] in ("portcullis", "pingora") else "other crates"] += r[2]
    by_owner = defaultdict(float)
    by_site = defaultdict(float)
    for r in rows:
        by_owner[r[0] if r[0] in ("portcullis", "pingora") else r[1]] += r[2]
        by_site[(r[1], r[4])] += r[2]
    print(f"allocations per request: {total:.1f} (sites: {out})")
    for who, v in sorted(by_owner.items(), key=lambda x: -x[1]):
        if abs(v) >= 0.05:
            print(f"  {who:<12} {v:6.1f}")
    print("by kind (portcullis / pingora / other crates):")
    for k, v in sorted(by_kind.items(), key=lambda x: -sum(x[1].values())):
        print(f"  {sum(v.values()):5.1f}  {k:<36} {v['portcullis']:5.1f} {v['pingora']:5.1f} {v['other crates']:5.1f}")
    print("top sites (first frame outside the standard library):")
    for (crate, site), v in sorted(by_site.items(), key=lambda x: -x[1])[:top]:
        if abs(v) >= 0.05:
            print(f"  {v:5.2f}  {crate:<14} {site}")


if __name__ == "__main__":
    main()
