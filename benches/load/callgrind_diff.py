#!/usr/bin/env python3
"""Instructions per request by function, from callgrind.sh's two dumps of one target.

usage: callgrind_diff.py DUMP1 DUMP2 N1 N2 [--self] [--top N] [--match REGEX] [--csv FILE]

callgrind.sh zeroes the counters, sends N1 requests and dumps (DUMP1, `<t>.<mode>.<pid>.1`),
then sends N2 and dumps again (DUMP2, `.2`; a dump resets the counters). For each function,
its inclusive cost (or self cost with --self) per request is

    (cost in DUMP2 - cost in DUMP1) / (N2 - N1)

so start-up, the warm-up and the fixed costs of each dump cancel out, as they do for the
total that callgrind.sh prints. Prints the top functions (default 40) as
`per request  share  function`; --match keeps only the functions whose name matches
(e.g. 'portcullis::|pingora' to see the proxy's own frames). --csv writes every function.
Inclusive costs overlap (a caller includes its callees), so they do not add up.
"""
import argparse
import csv
import re
import subprocess
import sys

LINE = re.compile(r"^\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?(\S.*)$")
# "file:function [object]": keep file:function (the object is the same binary throughout)
OBJ = re.compile(r"\s+\[[^\]]*\]$")
ENTRY = re.compile(r"(:clone|:start_thread|::thread_start|call_once\{\{vtable\.shim\}\}|below main|\?\?\?:main)$")


def file_total(dump):
    """The dump's `summary:` line: what was counted since the zero (callgrind.sh's total).
    The first dump's cost lines can also hold costs from before the zero (13M instructions
    in an h2-over-TLS run), so the inclusive rows below can differ from it a little."""
    total = None
    with open(dump, errors="replace") as f:
        for line in f:
            if line.startswith("summary:") or (total is None and line.startswith("totals:")):
                total = int(line.split()[1])
    if total is None:
        sys.exit(f"callgrind_diff: no summary in {dump}")
    return total


def short(name):
    """`<path>/src/x.rs:func` -> `src/x.rs:func` (a registry crate keeps its name)."""
    path, sep, func = name.partition(":")
    if not sep or "/" not in path:
        return name
    m = re.search(r"([A-Za-z0-9_.-]+-\d+\.\d+\.\d+[^/]*/.*)$", path) or re.search(
        r"((?:vendor/|src/|library/)[^:]*)$", path
    )
    return f"{m.group(1) if m else path.rsplit('/', 1)[-1]}:{func}"


def costs(dump, inclusive):
    args = ["callgrind_annotate", "--threshold=100", "--auto=no", f"--inclusive={'yes' if inclusive else 'no'}", dump]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    table, state = {}, "before"
    for line in out.splitlines():
        if state == "before":
            # the per-function table follows the "Ir  file:function" header and a rule
            if re.match(r"^\s*Ir\s+file:function", line):
                state = "rule"
            continue
        if state == "rule":
            state = "table"
            continue
        if line.startswith("----"):
            break
        m = LINE.match(line)
        if not m:
            continue
        name = short(OBJ.sub("", m.group(2)).strip())
        table[name] = table.get(name, 0) + int(m.group(1).replace(",", ""))
    return file_total(dump), table


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump1")
    ap.add_argument("dump2")
    ap.add_argument("n1", type=int)
    ap.add_argument("n2", type=int)
    ap.add_argument("--self", dest="self_cost", action="store_true", help="self cost instead of inclusive")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--match", default=None)
    ap.add_argument("--csv", default=None)
    a = ap.parse_args()
    if a.n2 <= a.n1:
        sys.exit("callgrind_diff: N2 must be larger than N1")
    n = a.n2 - a.n1
    t1, c1 = costs(a.dump1, not a.self_cost)
    t2, c2 = costs(a.dump2, not a.self_cost)
    rows = []
    for name in set(c1) | set(c2):
        v = (c2.get(name, 0) - c1.get(name, 0)) / n
        rows.append((v, name))
    if a.self_cost:
        # callgrind_annotate lists the threads' entry frames with the whole cost as "self"
        # (an artefact of how the dumps name their callers); they are not a cost of their own
        rows = [r for r in rows if not ENTRY.search(r[1])]
    rows.sort(reverse=True)
    # Shares are of callgrind.sh's figure (the dumps' `summary:` lines). An async fn's
    # closure that appears at several levels of one stack (Pingora's request future) counts
    # once per level in its inclusive row, which can then exceed the total.
    per_req_total = (t2 - t1) / n
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["per_request", "share", "function"])
            for v, name in rows:
                w.writerow([f"{v:.1f}", f"{v / per_req_total:.4f}" if per_req_total else "", name])
    pat = re.compile(a.match) if a.match else None
    kind = "self" if a.self_cost else "inclusive"
    print(f"{per_req_total:,.0f} instructions per request (callgrind.sh's figure); {kind} costs below")
    shown = 0
    for v, name in rows:
        if pat and not pat.search(name):
            continue
        print(f"{v:>10,.0f}  {v / per_req_total * 100:5.1f}%  {name}")
        shown += 1
        if shown >= a.top:
            break


if __name__ == "__main__":
    main()
