#!/usr/bin/env python3
"""The chaos checker (issue 63): reads what a run of benches/chaos/harness.py recorded and
checks the fleet's invariants (docs/src/invariants.md states each one and its bound):

  budget    every /backends snapshot of a serving instance: at most
            floor(max_culled_fraction x n) backends of the upstream out (culled, draining,
            maint, claimed together; a backend claimed by an emergency claim, told by its
            lease end, which any instance's /claims or the claim's grant showed with
            "emergency": true, is not counted: an emergency claim passes the fraction by
            design; an instance shows it until its next sync after the release), and
            never all of them out (emergency claims included; unhealthy ones in rotation
            serve: panic mode fails open to them; such snapshots are counted);
  claims    the operations client's granted claims and drains: at most max_concurrent
            backends out by them at once, emergency claims not counted (counting only the
            time each was certainly out: from its grant's answer to its expiry or the
            sending of its release/ready), no claim id granted twice, no two claims on one
            backend alive at once;
  emergency no claim granted while an emergency claim on its upstream was certainly alive
            (its whole request, send to answer, between the emergency claim's grant answer
            and the earliest of its expiry and the sending of its release);
  ratelimit per key and epoch-aligned window, the requests certainly decided in that window
            (the decision lies between the client's send and the backend's receipt)
            within bound = 1.05 x limit x (1 + cut + 2 x skewed) + instances, where `cut`
            counts the instances cut off from the store (Redis partition, Redis paused: all
            of them, SIGSTOP, or a snapshot saying store_healthy false or not answering: a
            starved machine cuts an instance off too; Cluster: an instance cut off from
            every node or from one, a node paused: all of them) and `skewed` the instances with a
            skewed clock, at any time from one window before the window to its end;
  requests  every client request answered; a 5xx only while a backend fault (failing,
            cut off from every instance, or from the request's instance alone) was in force
            (read timeout + 1 s of grace), a 504 whose request the backend got over
            1 s after it was sent (the path or the backend was slow), or while the instance
            was starved of CPU (a snapshot cycle over 1 s without a SIGSTOP: the machine's
            doing, counted apart in the answers); none caused by a
            backend stopped for a deploy under a granted claim (the claimed backend must be
            out of rotation on every instance before the deploy tool stops it); a 5xx for
            a request sent before its instance froze and answered after is counted apart
            (a timeout spanning the freeze: not promised);
  routing   no request reached a backend that the instance which sent it showed out, in
            one and the same state by one operation (the same lease end), on every snapshot
            from before the client sent it until after the backend got it, with no release
            or ready of that backend in between (it may have been in rotation unseen).

A violation prints the seed, the instant (seconds into the run and epoch) and the records
around it. Exit 0 when every check passed, 1 otherwise. Also writes summary.json in DIR.

    check.py DIR
Python stdlib only.
"""
import bisect
import collections
import glob
import json
import math
import os
import sys

OUT_STATES = {"culled", "draining", "maint", "claimed"}
MAX_PRINT = 5  # violations printed per check


def jl(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line cut by the end of the run
    return out


class Run:
    def __init__(self, d):
        self.d = d
        with open(os.path.join(d, "meta.json")) as f:
            self.meta = json.load(f)
        self.t0 = self.meta["t0"]
        self.end = self.meta.get("end", max(os.path.getmtime(p) for p in glob.glob(os.path.join(d, "*.jsonl"))))
        self.faults = jl(os.path.join(d, "faults.jsonl"))
        self.reqs = jl(os.path.join(d, "requests.jsonl"))
        self.ops = jl(os.path.join(d, "ops.jsonl"))
        self.deploys = jl(os.path.join(d, "deploys.jsonl"))
        self.snaps = {}
        for p in sorted(glob.glob(os.path.join(d, "snap-i*.jsonl"))):
            slot = int(os.path.basename(p)[6:].split(".")[0])
            self.snaps[slot] = jl(p)
        self.backend_log = {}  # request id -> first receipt time
        for p in glob.glob(os.path.join(d, "b*.requests.jsonl")):
            for r in jl(p):
                if r.get("id"):
                    t = self.backend_log.get(r["id"])
                    self.backend_log[r["id"]] = r["t"] if t is None else min(t, r["t"])
        self.violations = collections.defaultdict(list)
        self.checks = collections.Counter()
        self.downs = []  # (backend, stopped, started again, claim id) of each deploy
        pending = {}
        for x in sorted(self.deploys, key=lambda x: x["t"]):
            if x["ev"] == "down":
                pending[x["b"]] = (x["t"], x.get("claim"))
            elif x["b"] in pending:
                t, claim = pending.pop(x["b"])
                self.downs.append((x["b"], t, x["t"], claim))
        for b, (t, claim) in pending.items():
            self.downs.append((b, t, self.end, claim))

    def rel(self, t):
        return t - self.t0

    def faults_at(self, a, b, kinds=None, target=None, grace=0.0):
        out = []
        for f in self.faults:
            if kinds and f["kind"] not in kinds:
                continue
            if target is not None and f["target"] != target:
                continue
            if f["start"] <= b and f["end"] + grace >= a:
                out.append(f)
        return out

    def violate(self, check, t, what, around):
        self.violations[check].append((t, what, around))

    def fault_text(self, a, b):
        fs = self.faults_at(a, b)
        return [f"{f['kind']} {f['target']} {self.rel(f['start']):.1f}-{self.rel(f['end']):.1f}s"
                + (f" {f.get('mode') or ''}{f.get('seconds') or ''}" if (f.get("mode") or f.get("seconds")) else "")
                for f in fs]


# ------------------------------------------------------------------------------ checks
def max_out(total, fraction):
    return max(0, min(total - 1, math.floor(total * fraction + 1e-9)))


def emergency_leases(run):
    """(backend address, lease end in ms) of every emergency claim any instance's /claims
    showed or the operations client was granted: /backends shows a claimed backend's lease
    end (`until`), so it tells an emergency claim in an instance's view even after the store
    dropped it (the instance shows it until its next sync)."""
    res = set()
    for snaps in run.snaps.values():
        for s in snaps:
            for c in s.get("claims") or []:
                if c.get("e"):
                    res.add((c["b"], c["x"]))
    for o in run.ops:
        if o["act"] == "claim" and o.get("emergency") and o.get("st") == 201 and isinstance(o.get("body"), dict):
            res.add((o["b"], o["body"].get("expires_at")))
    return res


def check_budget(run):
    frac = run.meta["max_culled_fraction"]
    em_leases = emergency_leases(run)
    for slot, snaps in run.snaps.items():
        for i, s in enumerate(snaps):
            bs = s.get("backends")
            if bs is None:
                continue  # not answering: not serving
            ups = collections.defaultdict(list)
            for b in bs:
                ups[b["u"]].append(b)
            for u, lst in ups.items():
                run.checks["budget_snapshots"] += 1
                out = [b for b in lst if b["s"] in OUT_STATES]
                lim = max_out(len(lst), frac)
                em = [b for b in out if b["s"] == "claimed" and (b["a"], b.get("until")) in em_leases]
                if em:
                    # an emergency claim passes the fraction (never the last backend)
                    run.checks["budget_snapshots_with_emergency"] += 1
                    lim += len(em)
                t = s["t0"]
                around = {"instance": slot, "snapshot": lst,
                          "previous": snaps[i - 1].get("backends") if i else None,
                          "claims": s.get("claims"), "faults": run.fault_text(t - 5, t)}
                if len(out) > lim:
                    run.violate("budget", t, f"i{slot} shows {len(out)} of {len(lst)} backends of {u} out "
                                f"(max {lim}): " + ", ".join(f"{b['n']}={b['s']}" for b in out), around)
                if len(out) == len(lst):
                    run.violate("budget", t, f"i{slot} shows no backend of {u} in rotation: "
                                + ", ".join(f"{b['n']}={b['s']}" for b in lst), around)
                elif not any(b["s"] == "up" for b in lst):
                    # the ones in rotation fail their checks: they serve all the same (panic
                    # mode fails open to the backends in rotation, never to one out)
                    run.checks["in_rotation_all_unhealthy"] += 1


def op_intervals(run):
    """(kind, backend, id, certain_start, certain_end, rec) of each granted claim and drain.

    A release, ready or later drain may take effect anywhere between its sending and its
    answer (an instance frozen with the request in its backlog applies it when it wakes,
    after operations sent later to other instances): each one whose answer came after this
    operation was sent ends this one's certain time at its sending, or at this one's answer
    if it was sent before (nothing certain then). One not answered counts as applied."""
    res = []
    releases = collections.defaultdict(list)  # claim id -> (send, answer) of releases 2xx/404/unanswered
    readies = collections.defaultdict(list)  # backend -> (send, answer) of readies 200/unanswered
    drains = collections.defaultdict(list)  # backend -> (send, answer, rec) of drains 200/unanswered
    for o in run.ops:
        unanswered = "st" not in o
        if o["act"] == "release" and (o.get("st") in (200, 204, 404) or unanswered):
            releases[o.get("claim")].append((o["ts"], o.get("tr", run.end)))
        if o["act"] == "ready" and (o.get("st") == 200 or unanswered):
            readies[o["b"]].append((o["ts"], o.get("tr", run.end)))
        if o["act"] == "drain" and (o.get("st") == 200 or unanswered):
            drains[o["b"]].append((o["ts"], o.get("tr", run.end), o))

    def cut(end, o, others):
        for ts, tr in others:
            if tr >= o["ts"]:
                end = min(end, max(ts, o["tr"]))
        return end

    for o in run.ops:
        if o["act"] == "claim" and o.get("st") == 201:
            cid = o["body"].get("id") if isinstance(o.get("body"), dict) else None
            end = cut(o["ts"] + o["seconds"], o, releases.get(cid, []))
            res.append(("claim", o["b"], cid, o["tr"], end, o))
        elif o["act"] == "drain" and o.get("st") == 200:
            end = cut(o["ts"] + o["seconds"], o, readies.get(o["b"], []))
            # another drain of the backend applied after this one replaces its lease (one
            # record per backend)
            end = cut(end, o, [(ts, tr) for ts, tr, x in drains.get(o["b"], []) if x is not o])
            res.append(("drain", o["b"], None, o["tr"], end, o))
    return res


def check_claims(run):
    maxc = run.meta["max_concurrent"]
    iv = op_intervals(run)
    run.checks["ops_granted"] = len(iv)
    run.checks["ops_answered"] = sum(1 for o in run.ops if "st" in o)
    ids = collections.Counter(x[2] for x in iv if x[0] == "claim")
    for cid, n in ids.items():
        if n > 1:
            run.violate("claims", 0, f"claim id {cid} granted {n} times", [x[5] for x in iv if x[2] == cid])
    claims = [x for x in iv if x[0] == "claim" and x[4] > x[3]]
    for a in range(len(claims)):
        for b in range(a + 1, len(claims)):
            x, y = claims[a], claims[b]
            if x[1] == y[1] and x[3] < y[4] and y[3] < x[4]:
                run.violate("claims", max(x[3], y[3]), f"backend {x[1]} granted to two claims at once: {x[2]} "
                            f"(i{x[5]['i']}) and {y[2]} (i{y[5]['i']})", [x[5], y[5]])
    # sweep: distinct backends certainly out by a granted operation
    # an emergency claim passes max_concurrent by design: the others are counted
    counted = [x for x in iv if x[4] > x[3] and not x[5].get("emergency")]
    ev = sorted([(x[3], 1, x) for x in counted] + [(x[4], -1, x) for x in counted], key=lambda e: (e[0], e[1]))
    alive = []
    for t, d, x in ev:
        if d == -1:
            if x in alive:
                alive.remove(x)
            continue
        alive.append(x)
        backends = {y[1] for y in alive}
        run.checks["concurrency_points"] += 1
        if len(backends) > maxc:
            run.violate("claims", t, f"{len(backends)} backends certainly out by granted operations at once "
                        f"(max_concurrent {maxc}): " + ", ".join(f"{y[0]} {y[1]} by i{y[5]['i']}" for y in alive),
                        {"ops": [y[5] for y in alive], "faults": run.fault_text(t - 30, t)})


def check_emergency(run):
    """An emergency claim blocks the rest: no claim was granted whose request (send to answer)
    lies wholly inside an emergency claim's certain life (its grant's answer to the earliest
    of its expiry, counted from its send, and the sending of its release)."""
    iv = op_intervals(run)
    em = [x for x in iv if x[0] == "claim" and x[5].get("emergency") and x[4] > x[3]]
    run.checks["emergency_granted"] = sum(1 for x in iv if x[0] == "claim" and x[5].get("emergency"))
    run.checks["emergency_refused_others"] = sum(
        1 for o in run.ops if o["act"] == "claim" and o.get("st") == 409 and isinstance(o.get("body"), dict)
        and o["body"].get("policy") == "emergency")
    for o in run.ops:
        if o["act"] != "claim" or o.get("emergency") or "st" not in o:
            continue
        run.checks["claims_checked_against_emergency"] += 1
        if o["st"] != 201:
            continue
        for x in em:
            if x[3] <= o["ts"] and o["tr"] <= x[4]:
                run.violate("emergency", o["ts"], f"claim {o['body'].get('id')} on {o['b']} granted by i{o['i']} "
                            f"while emergency claim {x[2]} on {x[1]} (by i{x[5]['i']}) was alive "
                            f"({run.rel(x[3]):.2f}-{run.rel(x[4]):.2f}s)",
                            {"claim": o, "emergency": x[5], "faults": run.fault_text(o["ts"] - 10, o["tr"])})


def rl_bound(run, ws, we):
    W, L, n = run.meta["window"], run.meta["limit"], run.meta["instances"]
    cut, skewed = set(), set()
    for f in run.faults_at(ws - W, we):
        if f["kind"] in ("redis_partition", "node_partition", "stop"):
            cut.add(f["target"])
        elif f["kind"] in ("redis_pause", "node_pause"):
            cut.update(f"i{i}" for i in range(n))
        elif f["kind"] == "skew":
            skewed.add(f["target"])
    # an instance whose store went unhealthy without an injected fault (a starved machine:
    # calls over timeout_ms) is cut off just the same; so is one that did not answer
    for slot, bad in run.unhealthy.items():
        i = bisect.bisect_left(bad, ws - W)
        if i < len(bad) and bad[i] <= we:
            cut.add(f"i{slot}")
    skewed -= cut
    k = min(n, len(cut))
    return 1.05 * L * (1 + k + 2 * len(skewed)) + n, k, len(skewed)


def check_ratelimit(run):
    W = run.meta["window"]
    run.unhealthy = {}  # slot -> sorted times its snapshot said store_healthy false, or no answer
    for slot, snaps in run.snaps.items():
        run.unhealthy[slot] = sorted(s["t0"] for s in snaps
                                     if s.get("status") is None or s["status"].get("store_healthy") is False)
    certain = collections.defaultdict(collections.Counter)
    possible = collections.defaultdict(collections.Counter)
    for r in run.reqs:
        tb = run.backend_log.get(r["id"])
        if tb is None:
            continue  # never reached a backend: not certainly admitted (an undercount, never a false alarm)
        w0, w1 = int(r["ts"] // W), int(tb // W)
        for w in range(w0, w1 + 1):
            possible[r["k"]][w] += 1
        if w0 == w1:
            certain[r["k"]][w0] += 1
    worst = (0.0, None)
    worst_by = {}  # "k=..,s=..": the largest count / limit in windows under those faults
    for key, wins in certain.items():
        for w, n in wins.items():
            ws, we = w * W, (w + 1) * W
            if ws < run.t0 or we > run.end:
                continue  # a window the run did not cover whole
            run.checks["ratelimit_windows"] += 1
            bound, k, s = rl_bound(run, ws, we)
            ratio = n / run.meta["limit"]
            if ratio > worst[0]:
                worst = (ratio, (key, run.rel(ws), n, k, s))
            cls = f"cut={k},skewed={s}"
            worst_by[cls] = max(worst_by.get(cls, 0.0), round(ratio, 3))
            if n > bound:
                run.violate("ratelimit", ws, f"key {key}: {n} requests admitted in the window "
                            f"{run.rel(ws):.0f}-{run.rel(we):.0f}s (at most {possible[key][w]}), bound {bound:.0f} "
                            f"(cut off {k}, skewed {s})", {"faults": run.fault_text(ws - W, we)})
    run.summary["ratelimit_worst"] = worst
    run.summary["ratelimit_worst_by_faults"] = dict(sorted(worst_by.items()))


def check_requests(run):
    grace = run.meta["read_timeout_ms"] / 1000 + 1
    downs = run.downs
    codes = collections.Counter()
    for r in run.reqs:
        run.checks["requests"] += 1
        t0, t1 = r["ts"], r["tr"]
        if "err" in r:
            codes["no answer"] += 1
            run.violate("requests", t0, f"request {r['id']} to i{r['i']} got no answer: {r['err']}",
                        {"request": r, "faults": run.fault_text(t0 - grace, t1)})
            continue
        codes[r["st"]] += 1
        if r["st"] < 500:
            continue
        if r["st"] == 500 and r.get("b"):
            if run.faults_at(t0 - 1, t1, ["backend_fail"], grace=1):
                continue
        elif run.faults_at(t0 - grace, t1, ["backend_fail", "backend_partition"], grace=grace):
            continue
        elif [f for f in run.faults_at(t0 - grace, t1, ["backend_partition_one"], grace=grace)
              if f.get("inst") == f"i{r['i']}"]:
            continue  # its instance was cut off from a backend
        elif r["st"] == 504 and run.backend_log.get(r["id"], t0) - t0 > 1.0:
            # the backend got the request over a second after it was sent (a relay or
            # backend process of the harness not scheduled on a starved machine, or the
            # instance): a backend timing out, whatever made it slow; counted apart
            codes["504: the backend got the request over 1 s late"] += 1
            continue
        elif starved(run, r["i"], t0 - 1, t1):
            # the machine, not the proxy: the instance was not scheduled (a snapshot cycle of
            # three local GETs took over a second, and no SIGSTOP explains it); counted apart
            codes["5xx while the instance was starved"] += 1
            continue
        frozen = run.faults_at(t0, t1, ["stop"], target=f"i{r['i']}")
        if any(f["start"] > t0 for f in frozen):
            # sent before its instance froze, answered after: a timeout that spanned the
            # freeze fired at wake (docs/src/invariants.md, 4: not promised); counted apart
            codes["5xx in flight across a freeze of its instance"] += 1
            continue
        deploy = [x for x in downs if x[1] <= t1 and x[2] + grace >= t0]
        # the instance was frozen or cut off from the store just before: it answered on an
        # old view of the operations (docs/src/invariants.md, 4: not promised)
        stale = run.faults_at(t0 - 5, t1, ["stop", "redis_partition", "redis_pause", "node_partition", "node_pause"],
                              target=None, grace=5)
        stale = [f for f in stale if f["target"] in (f"i{r['i']}", "redis") or f["kind"] == "node_pause"]
        note = "; the instance's view was stale: " + ", ".join(
            f"{f['kind']} {f['target']} until {run.rel(f['end']):.1f}s" for f in stale) if stale else ""
        if deploy and any(unseen_claim(run, r, x) for x in deploy):
            # the backend was claimed while this instance was cut off from the store and
            # stopped before it read the store again (docs/src/invariants.md, 4: not promised)
            codes["5xx on a backend claimed while its instance was cut off from the store"] += 1
            continue
        if deploy:
            run.violate("requests", t0, f"request {r['id']} to i{r['i']} answered {r['st']} while only a "
                        f"claimed backend was stopped for a deploy ({', '.join(x[0] for x in deploy)}){note}",
                        {"request": r, "snapshots": snaps_near(run, r["i"], t0, t1),
                         "faults": run.fault_text(t0 - grace, t1)})
        else:
            what = (f"; the instance was frozen while it held the request (until "
                    f"{run.rel(frozen[0]['end']):.1f}s): a timeout that spanned the freeze fired at wake"
                    if frozen else note)
            run.violate("requests", t0, f"request {r['id']} to i{r['i']} answered {r['st']} with no backend "
                        f"fault to explain it{what}", {"request": r, "faults": run.fault_text(t0 - 10, t1)})
    run.summary["answers"] = dict((str(k), v) for k, v in codes.items())


SYNC_LAG = 2.0  # an instance reads the store within this after it can reach it again


def unseen_claim(run, r, down):
    """Whether the claim under which backend `down` was stopped was granted while request
    `r`'s instance was cut off from the store (from Redis, a Cluster node, frozen, the
    store frozen, or its snapshots saying its store unhealthy), and the instance had not
    read the store since: the cut ended less than
    SYNC_LAG before the request was sent, or none of its snapshots from the grant to the
    request showed the backend claimed."""
    claim = next((o for o in run.ops if o["act"] == "claim" and o.get("st") == 201 and o["b"] == down[0]
                  and isinstance(o.get("body"), dict) and o["body"].get("id") == down[3]), None)
    if claim is None:
        return False
    me = f"i{r['i']}"
    cut = [f for f in run.faults_at(claim["ts"], claim["tr"], ["redis_partition", "node_partition", "stop",
                                                               "redis_pause", "node_pause"])
           if f["target"] == me or f["kind"] in ("redis_pause", "node_pause")]
    # a store gone unhealthy without an injected fault (a starved machine: calls over
    # timeout_ms) cuts the instance off just the same
    unhealthy = any(claim["ts"] - 1 <= s["t0"] <= claim["tr"] + 1
                    and (s.get("status") is None or s["status"].get("store_healthy") is False)
                    for s in run.snaps.get(r["i"], []))
    if not cut and not unhealthy:
        return False
    if any(f["end"] + SYNC_LAG >= r["ts"] for f in cut):
        return True
    # later than that: only if none of the instance's snapshots since the grant showed the
    # backend claimed (it had not read the store again: a reconnect after a cut backs off)
    for s in run.snaps.get(r["i"], []):
        if claim["tr"] <= s["t0"] <= r["ts"] and any(
                b["a"] == down[0] and b["s"] == "claimed" for b in s.get("backends") or []):
            return False
    return True


def starved(run, slot, a, b):
    """Whether instance `slot` was starved of CPU in [a, b]: a snapshot cycle (three GETs on
    loopback) started then took over a second while no SIGSTOP of it was in force."""
    if run.faults_at(a - 1, b, ["stop"], target=f"i{slot}", grace=1):
        return False
    return any(a <= s["t0"] <= b and s["t1"] - s["t0"] > 1.0 for s in run.snaps.get(slot, []))


def snaps_near(run, slot, a, b):
    return [{"t": round(run.rel(s["t0"]), 2), "backends": [(x["n"], x["s"]) for x in s["backends"]]}
            for s in run.snaps.get(slot, []) if a - 1 <= s["t0"] <= b + 1 and s.get("backends")]


def check_routing(run):
    names = {}
    for slot, snaps in run.snaps.items():
        times = [s["t0"] for s in snaps]
        names[slot] = (times, snaps)
    by_id = {r["id"]: r for r in run.reqs}
    for rid, tb in run.backend_log.items():
        r = by_id.get(rid)
        if r is None or r.get("b") is None:
            continue
        times, snaps = names.get(r["i"], ([], []))
        run.checks["routed_requests"] += 1
        # snapshots from the last one completed before the send to the first one started after the receipt
        lo = bisect.bisect_left(times, r["ts"]) - 1
        while lo >= 0 and snaps[lo]["t1"] > r["ts"]:
            lo -= 1
        hi = bisect.bisect_right(times, tb)
        if lo < 0 or hi >= len(snaps):
            continue
        window = snaps[lo:hi + 1]
        if any(s.get("backends") is None for s in window):
            continue
        states = [next(((x["s"], x.get("until")) for x in s["backends"] if x["n"] == r["b"]), (None, None))
                  for s in window]
        # one state all along, by one operation (its lease's end): a change between two
        # snapshots (culled, then draining; a claim released and another granted) may have
        # passed through `up` unseen
        addr = next((x["a"] for x in window[0]["backends"] if x["n"] == r["b"]), None)
        between = [o for o in run.ops if o["b"] == addr and o["act"] in ("release", "ready")
                   and o["ts"] <= tb and o.get("tr", o["ts"]) >= window[0]["t1"]]
        if between:
            run.checks["routed_across_a_release"] += 1
            continue
        if states[0][0] in OUT_STATES and all(st == states[0] for st in states):
            run.violate("routing", tb, f"request {rid} sent to i{r['i']} reached {r['b']} which that instance "
                        f"showed {states[0][0]} from {run.rel(window[0]['t1']):.2f}s to {run.rel(window[-1]['t0']):.2f}s",
                        {"request": r, "backend_receipt": tb, "faults": run.fault_text(r["ts"] - 5, tb)})


def check_skew(run):
    """Not an invariant: the skew each skew fault's instance showed (its Date header, whole
    seconds) in the middle of the fault, so a run says whether libfaketime took effect."""
    seen = []
    for f in run.faults:
        if f["kind"] != "skew":
            continue
        slot = int(f["target"][1:])
        mid = [s["date"] - s["t0"] for s in run.snaps.get(slot, [])
               if "date" in s and f["start"] + 3 <= s["t0"] <= f["end"] - 1]
        if mid:
            seen.append((f["seconds"], round(sorted(mid)[len(mid) // 2])))
    run.summary["skew_seen"] = seen


def cluster_failovers(d):
    """Cluster runs: the failovers the nodes' logs show (a replica that won an election)."""
    n = 0
    for p in glob.glob(os.path.join(d, "node*.log")):
        with open(p, errors="replace") as f:
            n += sum(1 for line in f if "Failover election won" in line)
    return n


def main():
    d = sys.argv[1]
    run = Run(d)
    run.summary = {}
    if run.meta.get("store") == "cluster":
        run.summary["cluster_failovers"] = cluster_failovers(d)
    for c in (check_budget, check_claims, check_emergency, check_ratelimit, check_requests, check_routing,
              check_skew):
        c(run)
    seed = run.meta["seed"]
    kinds = collections.Counter(f["kind"] for f in run.faults)
    print(f"chaos check: seed {seed}, {run.meta.get('store', 'redis')}, {run.rel(run.end):.0f} s, "
          f"{run.meta['instances']} instances, "
          f"faults {dict(kinds)}")
    print(f"  checks: {dict(run.checks)}")
    print(f"  answers: {run.summary.get('answers')}; worst window {run.summary.get('ratelimit_worst')}")
    print(f"  admitted / limit, worst window by faults in force: {run.summary.get('ratelimit_worst_by_faults')}")
    print(f"  skew (asked, seen on the instance's Date header): {run.summary.get('skew_seen')}")
    if "cluster_failovers" in run.summary:
        print(f"  cluster failovers (node logs): {run.summary['cluster_failovers']}")
    failed = 0
    for check in ("budget", "claims", "emergency", "ratelimit", "requests", "routing"):
        vs = run.violations.get(check, [])
        print(f"  {check}: {'ok' if not vs else f'{len(vs)} VIOLATIONS'}")
        failed += len(vs)
        for t, what, around in sorted(vs, key=lambda v: v[0])[:MAX_PRINT]:
            print(f"    VIOLATION seed={seed} at {run.rel(t):.2f}s (epoch {t:.3f}): {what}")
            print("      around: " + json.dumps(around, default=str)[:1500])
    # budget violations as episodes: one instance's consecutive snapshots over the budget
    eps = []
    for t, what, around in sorted(run.violations.get("budget", []), key=lambda v: (str(v[2].get("instance")), v[0])):
        inst = around.get("instance")
        if eps and eps[-1][0] == inst and t - eps[-1][2] < 0.5:
            eps[-1][2] = t
        else:
            eps.append([inst, t, t])
    if eps:
        print(f"  budget episodes: {len(eps)}, " + ", ".join(
            f"i{i} {run.rel(a):.1f}-{run.rel(b):.1f}s" for i, a, b in eps))
    run.summary["budget_episodes"] = [[i, round(run.rel(a), 2), round(b - a + 0.1, 2)] for i, a, b in eps]
    summary = {"seed": seed, "store": run.meta.get("store", "redis"), "seconds": round(run.rel(run.end)), "faults": dict(kinds),
               "checks": dict(run.checks), "violations": {k: len(v) for k, v in run.violations.items()},
               **run.summary}
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(summary, f)
    print(f"chaos: {'PASS' if not failed else 'FAIL'} seed={seed} violations={failed}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
