#!/usr/bin/env python3
"""The chaos harness (issue 63), run by benches/chaos/run.sh, which documents it.

Starts N portcullis instances, one private redis-server (or a Redis Cluster of three masters and
three replicas), four backends, a TCP relay (a process of its own) in front of Redis for each
instance (Cluster: one in front of each node) and one in front of each backend (the partitions;
a relay cuts every instance off or one only), a load
client, an operations client (drains, claims and deploys from several instances at once),
an admin snapshotter per instance, and a fault schedule drawn from the seed. Everything
listens on 127.0.0.1 on free ports; every process it starts is ended by its PID.
Writes every record to OUT (JSONL files) for benches/chaos/check.py.

    harness.py SEED SECONDS OUT
Python stdlib only. Environment: PC_BIN (the binary), CHAOS_INSTANCES (3-5; default 3 + SEED % 3),
CHAOS_STORE (redis or cluster; default cluster for even seeds, redis for odd ones).
"""
import email.utils
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from relay import RelayProcess as Relay  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SEED, SECONDS, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
BIN = os.environ["PC_BIN"]
# 3, 4 or 5 instances by the seed unless CHAOS_INSTANCES says
N_INST = int(os.environ.get("CHAOS_INSTANCES") or 3 + SEED % 3)
if not 3 <= N_INST <= 5:
    sys.exit("chaos: CHAOS_INSTANCES must be 3, 4 or 5")
STORE = os.environ.get("CHAOS_STORE") or ("cluster" if SEED % 2 == 0 else "redis")
if STORE not in ("redis", "cluster"):
    sys.exit("chaos: CHAOS_STORE must be redis or cluster")
CLUSTER_MASTERS, CLUSTER_REPLICAS = 3, 1
CLUSTER_NODE_TIMEOUT_MS = 1500  # a master paused longer (and an election) is failed over by its replica
N_BACKENDS = 4
WINDOW = 10  # rate limit window, seconds
LIMIT = 50  # per key per window
# hot-a at 5x its limit: above every bound the checker holds it to with one instance cut off
# (2.1x) or skewed (3.15x), so an overshoot shows; hot-b at 1.5x, near the limit
HOT_KEYS = {"hot-a": 5.0, "hot-b": 1.5}
COLD_KEYS = [f"cold-{i}" for i in range(20)]
MAX_CULLED_FRACTION = 0.5
MAX_CONCURRENT = 2
READ_TIMEOUT_MS = 2000
CLIENT_TIMEOUT = 45  # longer than the longest SIGSTOP (20 s) plus a read timeout
PROPAGATION = 2.5  # a deploy tool waits this long after a grant before stopping the backend
WARMUP = 15
QUIET = 20
FAKETIME_LIB = os.environ.get("CHAOS_FAKETIME_LIB", "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")

STOP = threading.Event()
PROCS = []
LOCK = threading.Lock()
RNG = random.Random(SEED)
os.makedirs(OUT, exist_ok=True)


def log(msg):
    sys.stderr.write(f"[chaos {time.time() - T0:6.1f}s] {msg}\n")
    sys.stderr.flush()


class Jsonl:
    def __init__(self, name):
        self.f = open(os.path.join(OUT, name), "a", buffering=1)
        self.lock = threading.Lock()

    def write(self, rec):
        line = json.dumps(rec, separators=(",", ":"))
        with self.lock:
            self.f.write(line + "\n")


USED = set()


def free_port():
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p not in USED and p != 6379:
            USED.add(p)
            return p


def spawn(args, logname, env=None):
    f = open(os.path.join(OUT, logname), "ab")
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=f, stderr=f, env=env)
    f.close()
    with LOCK:
        PROCS.append(p)
    return p


def wait_until(seconds, pred, step=0.1):
    end = time.time() + seconds
    while time.time() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def http_req(port, method, path, body=None, timeout=2.0, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = dict(headers or {})
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h["content-type"] = "application/json"
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        return r.status, r.read(), r
    finally:
        c.close()


T0 = time.time()
FAULTS = Jsonl("faults.jsonl")
REQS = Jsonl("requests.jsonl")
OPS = Jsonl("ops.jsonl")
DEPLOYS = Jsonl("deploys.jsonl")


# --------------------------------------------------------------------------------- parts
class Redis:
    def __init__(self):
        self.port = free_port()
        self.proc = spawn(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no"], "redis.log")
        if not wait_until(10, self.ping):
            raise SystemExit("chaos: redis-server did not start")

    def ping(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False


class Cluster:
    """A Redis Cluster of real redis-server nodes, each behind a relay: every node announces
    its relay's port, so the instances (and the replicas, and redis-cli) reach every node
    through it, and a relay cuts one instance off one node while the others reach it."""

    def __init__(self):
        self.nodes = []  # [port, relay, proc, dir]
        n = CLUSTER_MASTERS * (1 + CLUSTER_REPLICAS)
        for k in range(n):
            port, bus = free_port(), free_port()
            relay = Relay(free_port(), port, f"node{k}")
            with LOCK:
                PROCS.append(relay.proc)
            d = os.path.join(OUT, f"node{k}")
            os.makedirs(d, exist_ok=True)
            proc = spawn(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--daemonize", "no", "--dir", d,
                          "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                          "--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS),
                          "--cluster-port", str(bus), "--cluster-announce-ip", "127.0.0.1",
                          "--cluster-announce-port", str(relay.port), "--cluster-announce-bus-port", str(bus)],
                         f"node{k}.log")
            self.nodes.append([port, relay, proc, d])
        for port, _, _, _ in self.nodes:
            if not wait_until(10, lambda p=port: redis_cmd(p, "PING") == "+PONG"):
                raise SystemExit("chaos: a cluster node did not start")
        out = subprocess.run(["timeout", "60", "redis-cli", "--cluster", "create"] + self.addrs()
                             + ["--cluster-replicas", str(CLUSTER_REPLICAS), "--cluster-yes"],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True)
        with open(os.path.join(OUT, "cluster-create.log"), "w") as f:
            f.write(out.stdout + out.stderr)
        if out.returncode != 0:
            raise SystemExit(f"chaos: redis-cli --cluster create failed; see {OUT}/cluster-create.log")
        if not wait_until(60, self.ok, step=0.5):
            raise SystemExit("chaos: the cluster never reached cluster_state:ok")

    def addrs(self):
        """What every client knows the nodes by: their relays."""
        return [f"127.0.0.1:{n[1].port}" for n in self.nodes]

    def ok(self):
        """Every node says cluster_state:ok and knows every replica as one."""
        want = CLUSTER_MASTERS * CLUSTER_REPLICAS
        return all("cluster_state:ok" in (redis_cmd(n[0], "CLUSTER INFO") or "")
                   and sum("slave" in ln.split()[2].split(",") for ln in (redis_cmd(n[0], "CLUSTER NODES") or "").splitlines()
                           if len(ln.split()) > 2) >= want for n in self.nodes)


def redis_cmd(port, cmd):
    """One inline command to a redis-server; its reply's text, None when it does not answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(cmd.encode() + b"\r\n")
            data = s.recv(65536)
            if data.startswith(b"$"):  # a bulk reply: read it whole
                head, _, rest = data.partition(b"\r\n")
                n = int(head[1:])
                while len(rest) < n:
                    more = s.recv(65536)
                    if not more:
                        break
                    rest += more
                data = rest
            return data.decode(errors="replace").strip()
    except OSError:
        return None


class Backend:
    def __init__(self, i):
        self.i = i
        self.name = f"b{i}"
        self.port = free_port()
        self.ctl = os.path.join(OUT, f"{self.name}.ctl")
        self.log = os.path.join(OUT, f"{self.name}.requests.jsonl")
        with open(self.ctl, "w") as f:
            f.write("ok")
        self.relay = Relay(free_port(), self.port, self.name)
        with LOCK:
            PROCS.append(self.relay.proc)
        self.addr = f"127.0.0.1:{self.relay.port}"  # what every instance knows it by
        self.proc = None
        self.deploy_lock = threading.Lock()
        self.start()

    def start(self):
        self.proc = spawn([sys.executable, os.path.join(HERE, "backend.py"), str(self.port), self.name,
                           self.ctl, self.log], f"{self.name}.log")
        wait_until(10, lambda: self.up())

    def up(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def set_mode(self, m):
        with open(self.ctl + ".tmp", "w") as f:
            f.write(m)
        os.replace(self.ctl + ".tmp", self.ctl)


class Instance:
    def __init__(self, slot, redis, backends):
        self.slot = slot
        self.port, self.admin = free_port(), free_port()
        if isinstance(redis, Cluster):
            self.redis_relay = None
            nodes = ", ".join(f'"{a}"' for a in redis.addrs())
            store = f'mode = "cluster"\nnodes = [{nodes}]'
        else:
            self.redis_relay = Relay(free_port(), redis.port, f"redis-i{slot}")
            with LOCK:
                PROCS.append(self.redis_relay.proc)
            store = f'url = "redis://127.0.0.1:{self.redis_relay.port}"'

        self.conf = os.path.join(OUT, f"i{slot}.toml")
        self.faketime = os.path.join(OUT, f"i{slot}.faketime")
        self.stopped = False
        with open(self.faketime, "w") as f:
            f.write("+0\n")
        bs = ", ".join(f'{{ name = "{b.name}", address = "{b.addr}" }}' for b in backends)
        with open(self.conf, "w") as f:
            f.write(f"""# rendered by benches/chaos/harness.py
[server]
listen = ["127.0.0.1:{self.port}"]
admin_listen = "127.0.0.1:{self.admin}"
threads = 2
drain_seconds = 1
shutdown_timeout_seconds = 3
upgrade_sock = "{OUT}/i{slot}-upgrade.sock"

[redis]
{store}
key_prefix = "chaos"
timeout_ms = 200

[[upstreams]]
name = "app"
backends = [{bs}]
connect_timeout_ms = 500
read_timeout_ms = {READ_TIMEOUT_MS}

[upstreams.health_check]
path = "/healthz"
interval_ms = 1000
fast_interval_ms = 500
timeout_ms = 1000
rise = 2
fall = 2

[rate_limit]
key = "header:x-api-key"
window_seconds = {WINDOW}
limit = {LIMIT}
missing_key = "allow"

[culling]
window_seconds = 10
error_threshold = 5
check_interval_seconds = 2
cooldown_seconds = 8
max_culled_fraction = {MAX_CULLED_FRACTION}
tokens = 1000
token_period_seconds = 60

[budget]
max_concurrent = {MAX_CONCURRENT}

[access_log]
enabled = false

[log]
format = "json"
""")
        env = dict(os.environ)
        if os.path.exists(FAKETIME_LIB):
            env.update({
                "LD_PRELOAD": FAKETIME_LIB,
                "FAKETIME_TIMESTAMP_FILE": self.faketime,
                "FAKETIME_CACHE_DURATION": "1",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            })
        self.proc = spawn([BIN, "-c", self.conf], f"i{slot}.log", env=env)
        # the relays that cut this instance alone off a backend or a cluster node tell its
        # connections by its pid
        for r in [b.relay for b in backends] + ([n[1] for n in redis.nodes] if isinstance(redis, Cluster) else []):
            r.set_pid(slot, self.proc.pid)
        if not wait_until(60, lambda: self.ready()):
            raise SystemExit(f"chaos: instance {slot} never got ready; see {OUT}")

    def ready(self):
        try:
            return http_req(self.admin, "GET", "/readyz", timeout=1)[0] == 200
        except OSError:
            return False

    def skew(self, seconds):
        with open(self.faketime + ".tmp", "w") as f:
            f.write(f"{seconds:+d}\n")
        os.replace(self.faketime + ".tmp", self.faketime)


# --------------------------------------------------------------------------------- actors
def snapshotter(inst):
    """Every 100 ms: GET /backends, /claims and /status of one instance (one file each)."""
    out = Jsonl(f"snap-i{inst.slot}.jsonl")
    n = 0
    while not STOP.is_set():
        t0 = time.time()
        rec = {"t0": t0}
        for what in ("backends", "claims", "status"):
            try:
                st, body, r = http_req(inst.admin, "GET", f"/{what}", timeout=1.0)
                d = json.loads(body) if st == 200 else None
                if what == "status" and r.getheader("date"):
                    # the instance's clock (1 s resolution): shows a skew fault took effect
                    rec["date"] = email.utils.parsedate_to_datetime(r.getheader("date")).timestamp()
            except (OSError, ValueError, TypeError):
                d = None
            if what == "backends" and d is not None:
                d = [{"u": b.get("upstream"), "a": b.get("address"), "n": b.get("name"), "s": b.get("state"),
                      "src": b.get("source"), "until": b.get("until")} for b in (d.get("backends", d) if isinstance(d, dict) else d)]
            elif what == "status" and d is not None:
                rl = d.get("rate_limit", {})
                d = {"state": d.get("state"), "store_healthy": rl.get("store_healthy")}
            elif what == "claims" and d is not None:
                cl = d.get("claims", d) if isinstance(d, dict) else d
                d = [{"id": c.get("id"), "b": c.get("backend"), "x": c.get("expires_at"),
                      "e": c.get("emergency")} for c in cl]
            rec[what] = d
        rec["t1"] = time.time()
        out.write(rec)
        n += 1
        STOP.wait(max(0.0, 0.1 - (time.time() - t0)))


def load_client(idx, insts, keys, rate):
    """Sends GETs with `x-api-key` from `keys` at `rate` per second, to random instances."""
    rng = random.Random(SEED * 1000 + idx)
    seq = 0
    while not STOP.is_set():
        inst = rng.choice(insts)
        key = rng.choice(keys)
        seq += 1
        rid = f"c{idx}-{seq}"
        ts = time.time()
        rec = {"id": rid, "i": inst.slot, "k": key, "ts": ts}
        try:
            st, _, r = http_req(inst.port, "GET", f"/api/{rid}", timeout=CLIENT_TIMEOUT,
                                headers={"x-api-key": key, "x-chaos-id": rid})
            rec.update(st=st, b=r.getheader("x-backend"))
        except (OSError, http.client.HTTPException) as e:
            rec["err"] = f"{type(e).__name__}: {e}"
        rec["tr"] = time.time()
        REQS.write(rec)
        STOP.wait(rng.expovariate(rate))


def deploy(b, claim_id, inst, hold, release):
    """What a deploy tool does with a granted claim: waits for the fleet to apply it, stops
    the backend, starts it again, waits for it, and releases the claim (or lets it expire)."""
    if not b.deploy_lock.acquire(blocking=False):
        return
    try:
        time.sleep(PROPAGATION)
        DEPLOYS.write({"t": time.time(), "b": b.addr, "ev": "down", "claim": claim_id})
        b.kill()
        time.sleep(max(0.5, hold))
        b.start()
        DEPLOYS.write({"t": time.time(), "b": b.addr, "ev": "up", "claim": claim_id})
    finally:
        b.deploy_lock.release()
    if release:
        op(inst, "release", b, "DELETE", f"/claims/{claim_id}", None, claim=claim_id)


def op(inst, action, b, method, path, body, **extra):
    ts = time.time()
    rec = {"i": inst.slot, "act": action, "b": b.addr, "ts": ts, **extra}
    try:
        st, data, _ = http_req(inst.admin, method, path, body=body, timeout=CLIENT_TIMEOUT)
        rec["st"] = st
        try:
            rec["body"] = json.loads(data)
        except ValueError:
            rec["body"] = data.decode(errors="replace")[:200]
    except (OSError, http.client.HTTPException) as e:
        rec["err"] = f"{type(e).__name__}: {e}"
    rec["tr"] = time.time()
    OPS.write(rec)
    return rec


def ops_client(idx, inst, backends):
    """Drains, claims (some followed by a deploy; one in eight an emergency claim), readies and
    dry runs through one instance."""
    rng = random.Random(SEED * 7919 + idx)
    STOP.wait(WARMUP / 2 + idx)
    mine = []
    while not STOP.is_set() and time.time() < T_FAULTS_END:
        b = rng.choice(backends)
        enc = b.addr.replace(":", "%3A")
        x = rng.random()
        if x < 0.4:
            secs = rng.randint(4, 12)
            emergency = x < 0.05
            body = {"upstream": "app", "backend": b.addr, "seconds": secs, "reason": f"chaos {idx}"}
            if emergency:
                body["emergency"] = True
            r = op(inst, "claim", b, "POST", "/claims", body, seconds=secs, emergency=emergency)
            if r.get("st") == 201 and isinstance(r.get("body"), dict):
                cid = r["body"].get("id")
                if secs >= 7:
                    threading.Thread(target=deploy, args=(b, cid, inst, secs - PROPAGATION - 3.5,
                                                          rng.random() < 0.5), daemon=True).start()
                elif rng.random() < 0.5:
                    threading.Timer(rng.uniform(1, secs), op,
                                    args=(inst, "release", b, "DELETE", f"/claims/{cid}", None),
                                    kwargs={"claim": cid}).start()
        elif x < 0.7:
            secs = rng.randint(3, 10)
            r = op(inst, "drain", b, "POST", f"/backends/app/{enc}/drain",
                   {"reason": f"chaos {idx}", "seconds": secs}, seconds=secs)
            if r.get("st") == 200:
                mine.append(b)
        elif x < 0.8 and mine:
            b = mine.pop(rng.randrange(len(mine)))
            op(inst, "ready", b, "POST", f"/backends/app/{b.addr.replace(':', '%3A')}/ready", {})
        else:
            op(inst, "dry_run", b, "POST", "/claims",
               {"upstream": "app", "backend": b.addr, "seconds": 5, "reason": "audit", "dry_run": True})
        STOP.wait(rng.uniform(1.0, 4.0))


# --------------------------------------------------------------------------------- faults
def fault(kind, target, start_fn, end_fn, dur, **detail):
    rec = {"kind": kind, "target": target, "start": time.time(), "dur": dur, **detail}
    log(f"fault {kind} {target} {detail} for {dur:.1f}s")
    start_fn()
    STOP.wait(dur)
    end_fn()
    rec["end"] = time.time()
    FAULTS.write(rec)


def fault_schedule(redis, insts, backends):
    """Redis variant: rp, bp, bp1, skew, stop, rz, bf. Cluster variant: rp (the instance cut off
    from every node), np (from one node), bp, bp1, skew, stop, nz (one node paused), bf."""
    rng = random.Random(SEED * 31 + 1)
    busy = set()  # targets under a fault
    busy_lock = threading.Lock()

    def run(kind, target, s, e, dur, **d):
        try:
            fault(kind, target, s, e, dur, **d)
        finally:
            with busy_lock:
                busy.discard(target)

    STOP.wait(WARMUP)
    while not STOP.is_set() and time.time() < T_FAULTS_END - 5:
        left = T_FAULTS_END - time.time()
        if STORE == "cluster":
            kinds = ["redis_partition", "node_partition", "backend_partition", "backend_partition_one",
                     "skew", "skew", "stop", "node_pause", "backend_fail"]
        else:
            kinds = ["redis_partition", "backend_partition", "backend_partition_one", "skew", "skew", "stop",
                     "redis_pause", "backend_fail"]
        kind = rng.choice(kinds)
        if kind in ("redis_partition", "node_partition", "skew", "stop"):
            inst = rng.choice(insts)
            target = f"i{inst.slot}"
        elif kind == "redis_pause":
            target = "redis"
        elif kind == "node_pause":
            node = rng.randrange(len(redis.nodes))
            target = f"node{node}"
        else:
            b = rng.choice(backends)
            target = b.addr
        with busy_lock:
            if target in busy or len(busy) >= 2:
                target = None
            else:
                busy.add(target)
        if target is None:
            STOP.wait(1)
            continue
        if kind == "redis_partition" and STORE == "cluster":
            # the instance cut off from every node of the cluster
            mode = rng.choice(["blackhole", "refuse"])
            dur = min(left, rng.uniform(3, 15))
            rs = [n[1] for n in redis.nodes]
            args = (lambda rs=rs, m=mode, i=inst.slot: [r.set_mode(m, i) for r in rs],
                    lambda rs=rs, i=inst.slot: [r.set_mode("pass", i) for r in rs], dur)
            d = {"mode": mode}
        elif kind == "redis_partition":
            mode = rng.choice(["blackhole", "refuse"])
            dur = min(left, rng.uniform(3, 15))
            args = (lambda r=inst.redis_relay, m=mode: r.set_mode(m), lambda r=inst.redis_relay: r.set_mode("pass"),
                    dur)
            d = {"mode": mode}
        elif kind == "node_partition":
            # the instance cut off from one node (a master or a replica) while the others reach it
            node = rng.randrange(len(redis.nodes))
            r = redis.nodes[node][1]
            mode = rng.choice(["blackhole", "refuse"])
            dur = min(left, rng.uniform(3, 15))
            args = (lambda r=r, m=mode, i=inst.slot: r.set_mode(m, i), lambda r=r, i=inst.slot: r.set_mode("pass", i),
                    dur)
            d = {"mode": mode, "node": f"node{node}"}
        elif kind == "node_pause":
            p = redis.nodes[node][2]
            dur = min(left, rng.uniform(1, 8))
            args = (lambda p=p: p.send_signal(signal.SIGSTOP), lambda p=p: p.send_signal(signal.SIGCONT), dur)
            d = {}
        elif kind == "backend_partition_one":
            # one instance cut off from a backend while the others reach it: the fleet disagrees
            # on the backend's health
            inst = rng.choice(insts)
            mode = rng.choice(["blackhole", "refuse"])
            dur = min(left, rng.uniform(4, 15))
            args = (lambda r=b.relay, m=mode, i=inst.slot: r.set_mode(m, i),
                    lambda r=b.relay, i=inst.slot: r.set_mode("pass", i), dur)
            d = {"mode": mode, "inst": f"i{inst.slot}"}
        elif kind == "backend_partition":
            mode = rng.choice(["blackhole", "refuse"])
            dur = min(left, rng.uniform(4, 15))
            args = (lambda r=b.relay, m=mode: r.set_mode(m), lambda r=b.relay: r.set_mode("pass"), dur)
            d = {"mode": mode}
        elif kind == "skew":
            secs = rng.choice([-30, -2, 2, 30])
            dur = min(left, rng.uniform(10, 30))
            args = (lambda i=inst, s=secs: i.skew(s), lambda i=inst: i.skew(0), dur)
            d = {"seconds": secs}
        elif kind == "stop":
            dur = min(left, rng.uniform(1, 20))

            def s(i=inst):
                i.stopped = True
                i.proc.send_signal(signal.SIGSTOP)

            def e(i=inst):
                i.proc.send_signal(signal.SIGCONT)
                i.stopped = False

            args = (s, e, dur)
            d = {}
        elif kind == "redis_pause":
            dur = min(left, rng.uniform(1, 8))
            args = (lambda: redis.proc.send_signal(signal.SIGSTOP), lambda: redis.proc.send_signal(signal.SIGCONT),
                    dur)
            d = {}
        else:
            dur = min(left, rng.uniform(5, 20))
            args = (lambda bb=b: bb.set_mode("fail"), lambda bb=b: bb.set_mode("ok"), dur)
            d = {}
        threading.Thread(target=run, args=(kind, target) + args, kwargs=d, daemon=True).start()
        STOP.wait(rng.uniform(4, 12))


# --------------------------------------------------------------------------------- main
def cleanup(*_):
    STOP.set()
    with LOCK:
        procs = list(PROCS)
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGCONT)
                p.kill()
            except OSError:
                pass
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def main():
    global T_FAULTS_END
    signal.signal(signal.SIGTERM, lambda *_: (cleanup(), sys.exit(1)))
    T_FAULTS_END = T0 + SECONDS - QUIET
    try:
        redis = Cluster() if STORE == "cluster" else Redis()
        backends = [Backend(i) for i in range(N_BACKENDS)]
        insts = [Instance(s, redis, backends) for s in range(N_INST)]
        meta = {
            "seed": SEED, "seconds": SECONDS, "instances": N_INST, "window": WINDOW, "limit": LIMIT,
            "max_culled_fraction": MAX_CULLED_FRACTION, "max_concurrent": MAX_CONCURRENT,
            "backends": [b.addr for b in backends], "read_timeout_ms": READ_TIMEOUT_MS,
            "propagation": PROPAGATION, "t0": T0, "faketime": os.path.exists(FAKETIME_LIB),
            "hot_keys": HOT_KEYS, "store": STORE,
            "nodes": redis.addrs() if STORE == "cluster" else None,
            "cluster_node_timeout_ms": CLUSTER_NODE_TIMEOUT_MS if STORE == "cluster" else None,
        }
        with open(os.path.join(OUT, "meta.json"), "w") as f:
            json.dump(meta, f)
        log(f"seed {SEED}: {N_INST} instances, {STORE} "
            f"{redis.addrs() if STORE == 'cluster' else redis.port}, backends {[b.addr for b in backends]}")
        threads = [threading.Thread(target=snapshotter, args=(i,), daemon=True) for i in insts]
        n = 0
        for k, x in HOT_KEYS.items():  # x times the limit, over 4 senders
            for _ in range(4):
                threads.append(threading.Thread(target=load_client, args=(n, insts, [k], x * LIMIT / WINDOW / 4),
                                                daemon=True))
                n += 1
        for _ in range(2):
            threads.append(threading.Thread(target=load_client, args=(n, insts, COLD_KEYS, 2.0), daemon=True))
            n += 1
        for idx in range(min(3, N_INST)):
            threads.append(threading.Thread(target=ops_client, args=(idx, insts[idx], backends), daemon=True))
        threads.append(threading.Thread(target=fault_schedule, args=(redis, insts, backends), daemon=True))
        for t in threads:
            t.start()
        STOP.wait(max(0.0, T0 + SECONDS - time.time()))
        STOP.set()
        # requests still in flight get their answer or their timeout
        time.sleep(0.5)
        meta["end"] = time.time()
        with open(os.path.join(OUT, "meta.json"), "w") as f:
            json.dump(meta, f)
        for t in threads:
            t.join(timeout=CLIENT_TIMEOUT + 5)
        exits = {}
        for i in insts:
            exits[i.slot] = i.proc.poll()
        meta["exited_early"] = {k: v for k, v in exits.items() if v is not None}
        with open(os.path.join(OUT, "meta.json"), "w") as f:
            json.dump(meta, f)
    finally:
        cleanup()


if __name__ == "__main__":
    main()
