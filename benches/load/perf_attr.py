#!/usr/bin/env python3
"""Attribute DWARF-unwound perf samples (`perf script -F comm,tid,ip,sym`).

usage: perf script -i X.cg.data -F comm,tid,ip,sym | perf_attr.py > X.attr.txt

Prints, as % of all samples of the process:
  * inclusive time of every portcullis function on the stack (hooks of the
    ProxyHttp impl, gates, metrics...), and of a few Pingora phases;
  * allocator time (malloc/free/realloc and glibc or jemalloc internals) and, for those
    samples, the nearest caller that is not allocator/std glue (who allocates).
"""
import collections
import re
import sys

ALLOC_LEAF = re.compile(
    r"^(malloc|_int_malloc|_int_free|cfree|free|realloc|_int_realloc|malloc_consolidate|"
    r"unlink_chunk|__GI___libc_free|__GI___libc_malloc|__libc_malloc|__libc_free|"
    r"__libc_realloc|tcache_|arena_|calloc|__libc_calloc|_int_memalign|sysmalloc|"
    r"_rjem_|tikv_jemalloc|do_rallocx$|ifree$|isfree$|"  # jemalloc (tikv-jemallocator)
    r"__memmove|__memcpy|__memset)"
)
GLUE = re.compile(
    r"^(<?std::alloc|<?alloc::|__rustc::|__rdl|__rg_|core::ptr::drop_in_place|<?core::|"
    r"<?bytes::|<alloc::|<core::|__GI_|_int_|malloc|free|cfree|realloc|unlink_chunk|"
    r"<std::alloc|<T as alloc::|hashbrown::raw|<hashbrown::|<?http::header::map::|"
    r"<?smallvec::|<smallvec::|__memmove|__memcpy|__memset|<&|<\[|<\(|\[unknown\]|"
    r"_rjem_|<tikv_jemallocator::|tikv_jemalloc|do_rallocx$|ifree$|isfree$)"
)
PHASES = [
    "ProxyHttp>::early_request_filter",
    "ProxyHttp>::request_filter",
    "ProxyHttp>::upstream_peer",
    "ProxyHttp>::upstream_request_filter",
    "ProxyHttp>::response_filter",
    "ProxyHttp>::logging",
    "ProxyHttp>::fail_to_proxy",
    "TimerManager::register_timer",
    "pingora_core::connectors::http::Connector::get_http_session",
    "pingora_core::connectors::http::Connector::release_http_session",
    "pingora_core::protocols::http::v1::server::HttpSession::read_request",
    "pingora_core::protocols::http::v1::client::HttpSession::read_resp_header_parts",
    "write_response_header",
    "response_duplex_vec",
    "write_body_buf",
    "HttpSession::write_request_header",
]


def samples(stream):
    cur = None
    for line in stream:
        line = line.rstrip("\n")
        if not line.strip():
            if cur:
                yield cur
            cur = None
            continue
        if not line.startswith(("\t", " ")):
            cur = []
            continue
        if cur is None:
            continue
        parts = line.strip().split(None, 1)
        sym = parts[1] if len(parts) > 1 else "?"
        sym = sym.replace(" (inlined)", "")
        cur.append(sym)
    if cur:
        yield cur


def short(sym):
    sym = re.sub(r"::\{\{closure\}\}", "", sym)
    return sym[:150]


def main():
    total = 0
    incl = collections.Counter()
    phase = collections.Counter()
    alloc = 0
    alloc_owner = collections.Counter()
    kernel = 0
    for st in samples(sys.stdin):
        total += 1
        leaf = st[0] if st else "?"
        seen = set()
        for f in st:
            if "portcullis::" in f:
                k = short(f)
                if k not in seen:
                    seen.add(k)
                    incl[k] += 1
        pseen = set()
        for f in st:
            for p in PHASES:
                if p in f and p not in pseen:
                    pseen.add(p)
                    phase[p] += 1
        if ALLOC_LEAF.match(leaf):
            alloc += 1
            owner = next((short(f) for f in st[1:] if not GLUE.match(f)), "?")
            alloc_owner[owner] += 1
        if leaf.startswith(("[k]",)) or re.match(r"^[a-z_0-9.]+$", leaf) and leaf not in ("malloc", "cfree", "realloc"):
            kernel += 1
    if not total:
        print("no samples")
        return
    pct = lambda n: f"{100.0 * n / total:6.2f}%"
    print(f"samples: {total}")
    print(f"allocator/memcpy leaf samples: {pct(alloc)}")
    print()
    print("## Pingora / proxy phases (inclusive)")
    for p, n in phase.most_common():
        print(f"{pct(n)}  {p}")
    print()
    print("## portcullis functions on the stack (inclusive, top 40)")
    for k, n in incl.most_common(40):
        print(f"{pct(n)}  {k}")
    print()
    print("## allocator/memcpy samples by nearest non-glue caller (top 40)")
    for k, n in alloc_owner.most_common(40):
        print(f"{pct(n)}  {k}")


if __name__ == "__main__":
    main()
