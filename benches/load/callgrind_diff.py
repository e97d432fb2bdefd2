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


def file_total(dump):
    """The dump's `totals:` line (the sum of its cost lines, which callgrind.sh's total is
    too; `summary:` can differ in the first dump after a zero)."""
    total = None
    with open(dump, errors="replace") as f:
        for line in f:
            if line.startswith("totals:") or (total is None and line.startswith("summary:")):
                total = int(line.split()[1])
    if total is None:
        sys.exit(f"callgrind_diff: no totals in {dump}")
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
    rows.sort(reverse=True)
    # Shares: of the thread roots' inclusive cost (the largest row), or of the sum of the
    # self costs. callgrind.sh's figure, from the dumps' `totals:` lines, is printed
    # beside it: after a zero the first dump's cost lines and totals can disagree by a
    # few per cent (frames active at the zero), so the two totals differ by that much.
    if a.self_cost:
        per_req_total = sum(v for v, _ in rows if v > 0)
    else:
        per_req_total = rows[0][0] if rows else 0
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["per_request", "share", "function"])
            for v, name in rows:
                w.writerow([f"{v:.1f}", f"{v / per_req_total:.4f}" if per_req_total else "", name])
    pat = re.compile(a.match) if a.match else None
    kind = "self" if a.self_cost else "inclusive"
    print(
        f"{per_req_total:,.0f} instructions per request by the cost lines ({kind} costs below); "
        f"{(t2 - t1) / n:,.0f} by the dumps' totals (callgrind.sh's figure)"
    )
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
