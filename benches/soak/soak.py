#!/usr/bin/env python3
"""The soak (issue 46): run by benches/soak.sh, which documents the settings.

Three portcullis instances on one private redis-server (SOAK_STORE=cluster: a private
Redis Cluster of 3 masters with a replica each), five backends (backend.py),
mixed clients (HTTP/1.1 keep-alive and a connection per request, HTTP/2 over TLS,
WebSocket tunnels, a bulkhead burst), and faults from a schedule seeded by SOAK_SEED.
Everything listens on 127.0.0.1 on free ports; every process it starts is ended by its
PID when it exits. Python 3 stdlib + python3-h2.
"""
import base64
import collections
import csv
import datetime
import hashlib
import http.client
import io
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ["PC_BIN"]
SECONDS = int(os.environ.get("SOAK_SECONDS", "1200"))
SEED = int(os.environ.get("SOAK_SEED") or random.SystemRandom().randrange(1, 10**6))
RESULTS = os.environ.get("SOAK_RESULTS", os.path.join(HERE, "results", "soak.csv"))
KEEP = os.environ.get("SOAK_KEEP", "0") == "1"
VERBOSE = os.environ.get("SOAK_VERBOSE", "0") == "1"
STORE = os.environ.get("SOAK_STORE", "") or "standalone"  # standalone | cluster
if STORE not in ("standalone", "cluster"):
    sys.stderr.write(f"soak: SOAK_STORE must be standalone or cluster, not {STORE!r}\n")
    sys.exit(2)
CLUSTER_MASTERS = 3  # each with one replica
CLUSTER_NODE_TIMEOUT_MS = 2000  # a killed master is failed over in a few seconds

N_INST = 3
N_BACKENDS = 4  # the culled upstream "app"; a fifth backend serves the bulkhead upstream
WINDOW = 10  # rate-limit window, seconds
LIMIT = 100  # per key per window
HOT_RATE = 2.0  # hot keys are sent at 2x their limit
HOT_KEYS = ["hot-a", "hot-b"]
COLD_KEYS = [f"cold-{i:02}" for i in range(50)]  # each at ~8% of its limit: every instance tracks each
COLD_RATE = 0.08
BOUND = 1.05  # README: admitted stays within 1.05 x the limit
MAX_CULLED_FRACTION = 0.5
COOLDOWN = 8
CHECK = 2
DRAIN = 1
SHUTDOWN_TIMEOUT = 5
READ_TIMEOUT_MS = 2000
WARMUP = max(20, min(60, SECONDS // 6))
QUIET = max(40, min(90, SECONDS // 8))  # the end: faults over, load on, everything recovers
FAULTS_END = SECONDS - QUIET + 5  # every fault is over by then
REDIS_GRACE = 2 * WINDOW  # windows this close to a Redis outage get the outage bound
ERROR_GRACE = 20
# The leak baseline: a quarter into the run, so the process has been through the faults once
# (its RSS steps up by ~2-3 MB at each of its first certificate reloads, then stays flat)
LEAK_BASE = max(WARMUP, SECONDS // 4)  # an ERROR line this long after an injected fault counts as caused

T0 = time.time()
STOP = threading.Event()
PROCS = []  # every Popen this script started
PROCS_LOCK = threading.Lock()
TMP = tempfile.mkdtemp(prefix="portcullis-soak-")
LOCK = threading.Lock()


def now():
    return time.time() - T0


def log(msg):
    sys.stderr.write(f"[soak {now():7.1f}s] {msg}\n")
    sys.stderr.flush()


def vlog(msg):
    if VERBOSE:
        log(msg)


USED_PORTS = set()  # a port handed out once is not handed out again (a node's bus port too)


def free_port():
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in USED_PORTS and port != 6379:  # the machine's Redis is not ours
            USED_PORTS.add(port)
            return port


def spawn(args, logname, **kw):
    f = open(os.path.join(TMP, logname), "ab")
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=f, stderr=f, **kw)
    f.close()
    with PROCS_LOCK:
        PROCS.append(p)
    return p


def cleanup(*_):
    STOP.set()
    with PROCS_LOCK:
        procs = list(PROCS)
    for p in procs:
        if p.poll() is None:
            try:
                p.kill()
            except OSError:
                pass
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    if not KEEP:
        shutil.rmtree(TMP, ignore_errors=True)


def wait_until(deadline_s, pred, step=0.1):
    end = time.time() + deadline_s
    while time.time() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


# ---------------------------------------------------------------------------------------
# the record of what happened: faults (cause intervals), requests, checks
# ---------------------------------------------------------------------------------------

FAULTS = []  # dicts: kind, target, start, end (None while active)
FAULT_COUNT = collections.Counter()
REQ = collections.Counter()  # requests by protocol
OUTCOME = collections.Counter()  # ok, 429, 503 shed, caused:<cause>, failed:<what>
FAILURES = []  # (t, what) for the report
ADMITTED = collections.defaultdict(collections.Counter)  # key -> window -> admitted
AMBIG = collections.defaultdict(collections.Counter)  # key -> window -> admitted across a boundary
CHECK_FAILS = []  # assertion failures other than requests


def fault_begin(kind, target):
    f = {"kind": kind, "target": target, "start": now(), "end": None}
    with LOCK:
        FAULTS.append(f)
        FAULT_COUNT[kind] += 1
    log(f"fault {kind} {target}")
    return f


def fault_end(f):
    with LOCK:
        f["end"] = now()
    vlog(f"fault end {f['kind']} {f['target']} ({f['end'] - f['start']:.1f}s)")


def active(kinds, t0, t1, target=None, grace=0.0):
    """A fault of one of `kinds` (on `target`, if given) overlapping [t0 - grace, t1]."""
    with LOCK:
        fs = list(FAULTS)
    for f in fs:
        if f["kind"] not in kinds or (target is not None and f["target"] != target):
            continue
        end = f["end"] if f["end"] is not None else now()
        if f["start"] <= t1 and end + grace >= t0:
            return f
    return None


def check_fail(what):
    with LOCK:
        CHECK_FAILS.append((now(), what))
    log(f"CHECK FAILED: {what}")


def record(proto, key, t_send, t_recv, status, backend, slot, err=None, path="/"):
    """Counts one client request by its outcome and cause (see benches/soak.sh)."""
    with LOCK:
        REQ[proto] += 1
    if status is not None and status not in (429, 503):
        admit(key, t_send, t_recv)
    if status is not None and (200 <= status < 400 or (status == 101 and proto == "ws")):
        out = "ok"
    elif status == 429:
        out = "429" if key in HOT_KEYS else "failed:429_under_limit"
    elif status == 503 and path.startswith("/bulk"):
        out = "503_bulkhead"
    else:
        out = classify_failure(proto, status, backend, slot, t_send - T0, t_recv - T0, err)
    with LOCK:
        OUTCOME[out] += 1
        if out.startswith("failed:"):
            FAILURES.append((t_send, f"{proto} slot{slot} {path} key={key} status={status} backend={backend} err={err}"))
    if out.startswith("failed:"):
        log(f"request FAILED: {proto} slot{slot} {path} status={status} backend={backend} err={err}")


def classify_failure(proto, status, backend, slot, t0, t1, err):
    if status == 500 and backend and active({"backend_fail"}, t0, t1, target=backend, grace=1):
        return "caused:backend_fail"
    if status in (502, 503, 504, 500) and active({"backend_fail", "backend_hang"}, t0, t1, grace=READ_TIMEOUT_MS / 1000 + 1):
        return "caused:backend_fault"
    if status in (502, 503, 504) and backend_stalled(t0, t1):
        return "env:backend_not_scheduled"
    if status is None and active({"sigterm"}, t0, t1, target=slot, grace=1):
        return "caused:sigterm"
    if status is None and err == "tunnel_cut" and active({"upgrade"}, t0, t1, target=slot, grace=1):
        return "caused:upgrade_closes_old_tunnels"
    return f"failed:{status if status is not None else err}"


def backend_stalled(t0, t1):
    """A backend logged a stall (it was not scheduled for over 1 s: a loaded machine, not
    an injected fault and not the proxy) overlapping [t0 - read_timeout, t1]."""
    for name in os.listdir(TMP):
        if not name.startswith("backend-"):
            continue
        with open(os.path.join(TMP, name)) as f:
            for line in f:
                if line.startswith("stall "):
                    a, b = (float(x) - T0 for x in line.split()[1:3])
                    if a <= t1 and b + 0.5 >= t0 - READ_TIMEOUT_MS / 1000:
                        return True
    return False


def admit(key, t_send, t_recv):
    w0, w1 = int(t_send // WINDOW), int(t_recv // WINDOW)
    with LOCK:
        if w0 == w1:
            ADMITTED[key][w0] += 1
        else:  # decided in one of the two: counted in both for the upper bound
            AMBIG[key][w0] += 1
            AMBIG[key][w1] += 1


# ---------------------------------------------------------------------------------------
# processes: redis, backends, certificates, proxies
# ---------------------------------------------------------------------------------------


class Redis:
    def __init__(self):
        self.port = free_port()
        self.proc = None
        self.n = 0

    def start(self):
        self.n += 1
        self.proc = spawn(redis_server_args(self.port, TMP), f"redis-{self.n}.log")
        ok = wait_until(10, self.ping)
        if not ok:
            raise SystemExit("soak: redis-server did not start")

    def ping(self):
        return redis_cmd(self.port, "PING", timeout=1) == "PONG"

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def toml(self):
        return f'url = "redis://127.0.0.1:{self.port}"'

    def describe(self):
        return f"redis :{self.port}"


def redis_server_args(port, dir_):
    """A throw-away redis-server on loopback `port`: nothing persisted, files in `dir_`."""
    return ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", dir_, "--protected-mode", "yes"]


def redis_cmd(port, *args, timeout=2):
    """One command to the redis-server on `port`: its reply as text (a status, an integer
    or a bulk string), None when the server is unreachable or answers an error."""
    req = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(req.encode())
            f = s.makefile("rb")
            line = f.readline()
            kind, rest = line[:1], line[1:].rstrip(b"\r\n")
            if kind in (b"+", b":"):
                return rest.decode()
            if kind == b"$" and int(rest) >= 0:
                data = f.read(int(rest) + 2)
                return data[:int(rest)].decode(errors="replace")
            return None
    except (OSError, ValueError):
        return None


def info_field(text, name):
    m = re.search(rf"^{name}:(\S+)", text or "", re.M)
    return m.group(1) if m else None


class ClusterNode:
    """One redis-server in cluster mode: its own port, bus port, directory and
    nodes.conf, so that a restart on the same port and file rejoins as the same node."""

    def __init__(self):
        self.port, self.bus = free_port(), free_port()
        self.dir = os.path.join(TMP, f"cluster-{self.port}")
        os.makedirs(self.dir, exist_ok=True)
        self.proc = None
        self.n = 0

    def start(self):
        """Starts (or restarts) the node; False when it does not answer PING within 10 s."""
        self.n += 1
        self.proc = spawn(
            redis_server_args(self.port, self.dir) + [
                "--cluster-enabled", "yes", "--cluster-config-file", os.path.join(self.dir, "nodes.conf"),
                "--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS), "--cluster-port", str(self.bus)],
            f"redis-{self.port}-{self.n}.log")
        return wait_until(10, lambda: self.running() and redis_cmd(self.port, "PING") == "PONG")

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def cmd(self, *args):
        return redis_cmd(self.port, *args) if self.running() else None


class Cluster:
    """A private Redis Cluster: 3 masters, one replica each (redis-cli --cluster create)."""

    def __init__(self):
        self.nodes = [ClusterNode() for _ in range(CLUSTER_MASTERS * 2)]
        self.busy = threading.Lock()  # one master failover at a time
        self.failovers = []  # dicts: port, kill, promoted, restarted, ok (seconds into the run)

    def start(self):
        for n in self.nodes:
            if not n.start():
                raise SystemExit(f"soak: cluster node :{n.port} did not start; see {TMP}")
        p = spawn(["redis-cli", "--cluster", "create"] + [f"127.0.0.1:{n.port}" for n in self.nodes]
                  + ["--cluster-replicas", "1", "--cluster-yes"], "redis-cluster-create.log")
        try:  # bounded: --cluster create waits for the join forever if the nodes cannot meet
            rc = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = "timeout"
        if rc != 0:
            raise SystemExit(f"soak: redis-cli --cluster create failed ({rc}); see {TMP}/redis-cluster-create.log")
        if not wait_until(60, self.healthy, 0.5):
            raise SystemExit(f"soak: the cluster never reached cluster_state:ok on every node; see {TMP}")

    def node(self, port):
        return next(n for n in self.nodes if n.port == port)

    def view(self, node=None):
        """CLUSTER NODES as `node` (default: the first running node that answers) sees it:
        [(port, flags, slot ranges)]."""
        for n in [node] if node else self.nodes:
            text = n.cmd("CLUSTER", "NODES")
            if text:
                out = []
                for line in text.splitlines():
                    f = line.split()
                    if len(f) >= 8:
                        port = int(f[1].split("@")[0].rsplit(":", 1)[1])
                        out.append((port, set(f[2].split(",")), f[8:]))
                return out
        return []

    def masters(self, view=None):
        """Ports of the masters that serve slots (not flagged failing)."""
        view = self.view() if view is None else view
        return sorted(p for p, flags, slots in view
                      if "master" in flags and slots and not flags & {"fail", "fail?"})

    def promoted(self, killed):
        """The killed master's slots are served again: every node that runs says
        cluster_state:ok and sees 3 slot-serving masters, all running, the killed one not
        among them."""
        live = [n for n in self.nodes if n.running()]
        for n in live:
            if "cluster_state:ok" not in (n.cmd("CLUSTER", "INFO") or ""):
                return False
            m = self.masters(self.view(n))
            if len(m) != CLUSTER_MASTERS or killed in m or not all(self.node(p).running() for p in m):
                return False
        return True

    def healthy(self):
        """Every node runs and says cluster_state:ok with all 6 known, no node sees a
        failing node, 3 masters serve the slots and every replica's link is up."""
        n_all = len(self.nodes)
        for n in self.nodes:
            info = n.cmd("CLUSTER", "INFO")
            if not info or "cluster_state:ok" not in info or info_field(info, "cluster_known_nodes") != str(n_all):
                return False
            view = self.view(n)
            if len(view) != n_all or any(flags & {"fail", "fail?", "handshake", "noaddr"} for _, flags, _ in view):
                return False
            if len(self.masters(view)) != CLUSTER_MASTERS:
                return False
            repl = n.cmd("INFO", "replication")
            role = info_field(repl, "role")
            if role != "master" and info_field(repl, "master_link_status") != "up":
                return False
        return True

    def toml(self):
        nodes = ", ".join(f'"127.0.0.1:{n.port}"' for n in self.nodes)
        return f'mode = "cluster"\nnodes = [{nodes}]'

    def describe(self):
        return f"redis cluster {[n.port for n in self.nodes]} (masters {self.masters()})"


class Backend:
    def __init__(self, name, slow_ms=300):
        self.name = name
        self.port = free_port()
        self.ctl = os.path.join(TMP, f"{name}.mode")
        self.set("ok")
        self.proc = spawn(["/usr/bin/python3", os.path.join(HERE, "backend.py"), str(self.port), name, self.ctl, str(slow_ms)],
                          f"backend-{name}.log")
        self.addr = f"127.0.0.1:{self.port}"

    def set(self, mode):
        tmp = self.ctl + ".tmp"
        with open(tmp, "w") as f:
            f.write(mode)
        os.replace(tmp, self.ctl)

    def up(self):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            c.request("GET", "/healthz")
            return c.getresponse().status == 200
        except OSError:
            return False


CERT = os.path.join(TMP, "cert.pem")
KEY = os.path.join(TMP, "key.pem")


def make_cert():
    """A new self-signed certificate (new key) for localhost; returns its SHA-256."""
    c, k = CERT + ".new", KEY + ".new"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", k, "-out", c, "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost"], check=True, capture_output=True)
    der = subprocess.run(["openssl", "x509", "-in", c, "-outform", "DER"], check=True, capture_output=True).stdout
    os.replace(k, KEY)
    os.replace(c, CERT)
    return hashlib.sha256(der).hexdigest()


def tls_fingerprint(port):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            with ctx.wrap_socket(s, server_hostname="localhost") as t:
                return hashlib.sha256(t.getpeercert(binary_form=True)).hexdigest()
    except OSError:
        return None


CONFIG_VARIANT = [0]  # a reload flips it: a real change (cap, a route, a culling threshold)


class Instance:
    def __init__(self, slot, redis, backends, bulk):
        self.slot = slot
        self.port, self.tls_port, self.admin_port = free_port(), free_port(), free_port()
        self.sock = os.path.join(TMP, f"i{slot}-upgrade.sock")
        self.conf = os.path.join(TMP, f"i{slot}.toml")
        self.redis, self.backends, self.bulk = redis, backends, bulk
        self.proc = None
        self.accepting = False  # what a load balancer's readiness probe would say
        self.busy = threading.Lock()  # one lifecycle fault at a time
        self.n = 0
        self.pids = []  # (pid, started_at, logfile)
        self.write_config()

    def write_config(self):
        v = CONFIG_VARIANT[0]
        backends = ", ".join(f'"{b.addr}"' for b in self.backends)
        extra_route = '[[routes]]\npath_prefix = "/v2"\nupstream = "app"\npriority = "low"\n' if v else ""
        text = f"""# rendered by benches/soak/soak.py (variant {v})
[server]
listen = ["127.0.0.1:{self.port}"]
admin_listen = "127.0.0.1:{self.admin_port}"
threads = 2
drain_seconds = {DRAIN}
shutdown_timeout_seconds = {SHUTDOWN_TIMEOUT}
upgrade_sock = "{self.sock}"

[tls]
listen = ["127.0.0.1:{self.tls_port}"]
[[tls.certificates]]
cert = "{CERT}"
key = "{KEY}"

[redis]
{self.redis.toml()}
key_prefix = "soak"

[[upstreams]]
name = "app"
backends = [{backends}]
health_check_path = "/healthz"
health_check_interval_seconds = 1
connect_timeout_ms = 500
read_timeout_ms = {READ_TIMEOUT_MS}

[[upstreams]]
name = "bulk"
backends = ["{self.bulk.addr}"]
max_inflight = 2
read_timeout_ms = {READ_TIMEOUT_MS}

[[routes]]
path_prefix = "/bulk"
upstream = "bulk"
{extra_route}
[[routes]]
path_prefix = "/"
upstream = "app"

[shedding]
max_concurrency = {512 - 12 * v}
max_tunnels = 200

[rate_limit]
key = "header:x-api-key"
window_seconds = {WINDOW}
limit = {LIMIT}
missing_key = "allow"

[culling]
window_seconds = 10
error_threshold = {5 + v}
check_interval_seconds = {CHECK}
cooldown_seconds = {COOLDOWN}
max_culled_fraction = {MAX_CULLED_FRACTION}
tokens = 1000
token_period_seconds = 60

[access_log]
enabled = false

[log]
format = "json"
"""
        tmp = self.conf + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.conf)

    def spawn(self, upgrade=False):
        self.n += 1
        name = f"i{self.slot}-{self.n}.log"
        args = [BIN, "-c", self.conf] + (["-u"] if upgrade else [])
        p = spawn(args, name)
        with LOCK:
            self.pids.append((p.pid, now(), os.path.join(TMP, name)))
        return p

    def start(self):
        self.proc = self.spawn()
        if not wait_until(30, lambda: self.proc.poll() is None and self.readyz() == 200):
            raise SystemExit(f"soak: instance {self.slot} never got ready; see {TMP}")
        self.accepting = True

    def readyz(self):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.admin_port, timeout=2)
            c.request("GET", "/readyz")
            return c.getresponse().status
        except OSError:
            return None

    def metrics(self):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.admin_port, timeout=3)
            c.request("GET", "/metrics")
            r = c.getresponse()
            return r.read().decode() if r.status == 200 else None
        except OSError:
            return None


def metric_values(text, name):
    out = {}
    for line in text.splitlines():
        if line.startswith(name) and (len(line) == len(name) or line[len(name)] in " {"):
            k, _, v = line.rpartition(" ")
            out[k[len(name):]] = float(v)
    return out


# ---------------------------------------------------------------------------------------
# clients
# ---------------------------------------------------------------------------------------


def pick_key(rng, kind):
    if kind == "hot":
        return rng.choice(HOT_KEYS)
    if kind == "churn":
        with LOCK:
            REQ["_churn"] += 1
            return f"once-{REQ['_churn']}"
    return rng.choice(COLD_KEYS)


def key_plan(rng, rate):
    """What one client sends: a share of the hot keys' 2x limit, the cold keys' 20%, churn."""
    hot = len(HOT_KEYS) * LIMIT / WINDOW * HOT_RATE
    cold = len(COLD_KEYS) * LIMIT / WINDOW * COLD_RATE
    total = hot + cold + 1.0
    r = rng.random() * total
    return "hot" if r < hot else ("cold" if r < hot + cold else "churn")


class Pacer:
    def __init__(self, rate):
        self.dt = 1.0 / rate
        self.next = time.time()

    def wait(self):
        self.next += self.dt
        d = self.next - time.time()
        if d > 0:
            STOP.wait(d)
        elif d < -1:
            self.next = time.time()


def pick_instance(rng, insts, turn=None):
    """A ready instance: the `turn`-th in rotation if it is ready (the rotating clients
    keep each instance's share of the load, so its tracked keys, steady), else any."""
    if turn is not None and insts[turn % len(insts)].accepting:
        return insts[turn % len(insts)]
    live = [i for i in insts if i.accepting]
    return rng.choice(live) if live else None


def h1_client(name, insts, rng, rate, keepalive, share, offset=None):
    """HTTP/1.1: keep-alive connections of 20-80 requests to one instance, or a new
    connection per request. A request on a reused connection that got no answer at all is
    retried once on a new one (RFC 9112 9.3.1: the server may close an idle connection as
    the request leaves), counted as `retried_stale`."""
    pacer = Pacer(rate)
    conn, inst, left = None, None, 0
    proto = "h1_keepalive" if keepalive else "h1_new"
    turn = offset
    while not STOP.is_set():
        pacer.wait()
        if conn is None or left <= 0:
            if conn:
                conn.close()
            inst = pick_instance(rng, insts, turn)
            turn = None if turn is None else turn + 1
            if inst is None:
                continue
            conn = http.client.HTTPConnection("127.0.0.1", inst.port, timeout=10)
            left, reused = rng.randint(20, 80) if keepalive else 1, False
        key = pick_key(rng, key_plan(rng, share))
        path = "/v2/x" if rng.random() < 0.1 else f"/{name}"
        hdrs = {"x-api-key": key}
        if not keepalive:
            hdrs["connection"] = "close"
        t0 = time.time()
        status, backend, err = None, None, None
        for attempt in (0, 1):
            try:
                conn.request("GET", path, headers=hdrs)
                r = conn.getresponse()
                r.read()
                status, backend = r.status, r.getheader("x-backend")
                if r.getheader("connection", "").lower() == "close" or not keepalive:
                    conn.close()
                    left = 0
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                conn.close()
                if attempt == 0 and reused:
                    with LOCK:
                        OUTCOME["retried_stale"] += 1
                    continue
                err = type(e).__name__
            except OSError as e:
                conn.close()
                err = type(e).__name__
            except http.client.HTTPException as e:
                conn.close()
                err = type(e).__name__
            break
        reused = True
        left -= 1
        record(proto, key, t0, time.time(), status, backend, inst.slot, err, path)
        if err:
            conn, left = None, 0


def h2_client(insts, rng, rate, offset):
    """HTTP/2 over TLS (ALPN h2): one connection of 10-40 batches of 4 concurrent streams
    per instance, then another. A GOAWAY's unprocessed streams (id > last_stream_id) are
    retried on a new connection (RFC 9113 6.8), counted as `retried_goaway`."""
    pacer = Pacer(rate / 4)
    turn = offset
    while not STOP.is_set():
        inst = pick_instance(rng, insts, turn)
        turn += 1
        if inst is None:
            STOP.wait(0.2)
            continue
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        t0 = time.time()
        try:
            raw = socket.create_connection(("127.0.0.1", inst.tls_port), timeout=10)
            s = ctx.wrap_socket(raw, server_hostname="localhost")
            if s.selected_alpn_protocol() != "h2":
                raise OSError("no h2 in ALPN")
        except OSError as e:
            record("h2", "", t0, time.time(), None, None, inst.slot, f"connect:{type(e).__name__}")
            continue
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        pending = []
        try:
            s.sendall(conn.data_to_send())
            for _ in range(rng.randint(10, 40)):
                if STOP.is_set():
                    break
                pacer.wait()
                batch = pending or [(pick_key(rng, key_plan(rng, 1)), "/h2") for _ in range(4)]
                pending = []
                goaway = h2_batch(s, conn, batch, inst)
                if goaway is not None:
                    pending = goaway
                    with LOCK:
                        OUTCOME["retried_goaway"] += len(goaway)
                    break
            conn.close_connection()
            s.sendall(conn.data_to_send())
        except (OSError, h2.exceptions.ProtocolError) as e:
            vlog(f"h2 connection to slot {inst.slot} ended: {type(e).__name__}: {e}")
        finally:
            s.close()
        # unprocessed streams of a GOAWAY go on a new connection, to whatever instance
        for key, path in pending:
            inst2 = pick_instance(rng, insts)
            if inst2 is None:
                break
            try:
                raw = socket.create_connection(("127.0.0.1", inst2.tls_port), timeout=10)
                s2 = ctx.wrap_socket(raw, server_hostname="localhost")
                c2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
                c2.initiate_connection()
                s2.sendall(c2.data_to_send())
                h2_batch(s2, c2, [(key, path)], inst2)
                s2.close()
            except OSError as e:
                record("h2", key, time.time(), time.time(), None, None, inst2.slot, f"retry:{type(e).__name__}")


def h2_batch(s, conn, batch, inst):
    """Sends the streams, reads until all end. Returns the unprocessed ones on GOAWAY."""
    streams = {}
    t0 = time.time()
    for key, path in batch:
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "GET"), (":path", path), (":scheme", "https"),
                                (":authority", "localhost"), ("x-api-key", key)], end_stream=True)
        streams[sid] = {"key": key, "path": path, "status": None, "backend": None, "done": False, "err": None}
    s.sendall(conn.data_to_send())
    last_sid = None
    buf = b""
    try:
        while not all(st["done"] for st in streams.values()):
            data = s.recv(65536)
            if not data:
                raise ConnectionResetError("eof")
            buf += data
            events = []
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                n = 9 + int.from_bytes(buf[:3], "big")
                frame, buf = buf[:n], buf[n:]
                # one frame at a time: a graceful GOAWAY (NO_ERROR; first with 2^31-1,
                # then the last stream processed, a PING between) leaves the streams up to
                # last_stream_id running (RFC 9113 6.8); python-h2 4.1 would refuse every
                # later frame, so its state machine is put back to OPEN after it.
                evs = conn.receive_data(frame)
                events += evs
                if any(isinstance(e, h2.events.ConnectionTerminated) and e.error_code == 0 for e in evs):
                    conn.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
            for ev in events:
                st = streams.get(getattr(ev, "stream_id", None))
                if isinstance(ev, h2.events.ResponseReceived) and st:
                    h = dict(ev.headers)
                    st["status"], st["backend"] = int(h[":status"]), h.get("x-backend")
                elif isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded) and st:
                    st["done"] = True
                elif isinstance(ev, h2.events.StreamReset) and st:
                    st["done"], st["err"] = True, f"rst:{ev.error_code}"
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    last_sid = min(ev.last_stream_id or 0, last_sid if last_sid is not None else 1 << 31)
                    for sid, st2 in streams.items():
                        if sid > last_sid and not st2["done"]:
                            st2["done"], st2["err"] = True, "goaway_unprocessed"
            s.sendall(conn.data_to_send())
            if last_sid is not None and all(st["done"] for st in streams.values()):
                break
    except (OSError, h2.exceptions.ProtocolError) as e:
        for st in streams.values():
            if not st["done"]:
                st["done"], st["err"] = True, f"{type(e).__name__}: {str(e)[:120]}"
    t1 = time.time()
    retry = []
    for sid, st in streams.items():
        if st["err"] == "goaway_unprocessed":
            retry.append((st["key"], st["path"]))
            continue
        record("h2", st["key"], t0, t1, st["status"] if not st["err"] else None, st["backend"], inst.slot, st["err"], st["path"])
    if last_sid is not None:
        return retry
    if any(st["err"] for st in streams.values()):
        raise ConnectionResetError("stream failed")
    return None


def ws_client(insts, rng):
    """WebSocket tunnels through the plain listener: a handshake, then text frames echoed
    for 5-15 s, a close. A tunnel cut by the upgrade of its instance (the old process
    closes its tunnels at shutdown_timeout_seconds) counts as caused."""
    while not STOP.is_set():
        inst = pick_instance(rng, insts)
        if inst is None:
            STOP.wait(0.2)
            continue
        t0 = time.time()
        key = rng.choice(COLD_KEYS)
        status, backend, err = None, None, None
        try:
            s = socket.create_connection(("127.0.0.1", inst.port), timeout=10)
            wskey = base64.b64encode(rng.randbytes(16)).decode()
            s.sendall((f"GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                       f"Sec-WebSocket-Key: {wskey}\r\nSec-WebSocket-Version: 13\r\nx-api-key: {key}\r\n\r\n").encode())
            f = s.makefile("rb")
            line = f.readline().decode()
            status = int(line.split()[1]) if line.startswith("HTTP/1.1 ") else None
            while True:
                h = f.readline()
                if h in (b"\r\n", b""):
                    break
                if h.lower().startswith(b"x-backend:"):
                    backend = h.split(b":", 1)[1].strip().decode()
            if status == 101:
                end = time.time() + rng.uniform(5, 15)
                n = 0
                while time.time() < end and not STOP.is_set():
                    msg = f"m{n}".encode()
                    mask = rng.randbytes(4)
                    s.sendall(bytes([0x81, 0x80 | len(msg)]) + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(msg)))
                    hdr = f.read(2)
                    if len(hdr) < 2:
                        raise ConnectionResetError("tunnel_cut")
                    data = f.read(hdr[1] & 0x7F)
                    if data != msg:
                        err = "echo_mismatch"
                        break
                    n += 1
                    STOP.wait(0.5)
                with LOCK:
                    OUTCOME["ws_messages"] += n
                s.sendall(bytes([0x88, 0x80]) + b"\0\0\0\0")
            s.close()
        except (OSError, ValueError, IndexError) as e:
            err = "tunnel_cut" if status == 101 else type(e).__name__
            status = None
        record("ws", key, t0, time.time(), status if not err else None, backend, inst.slot, err, "/ws")
        STOP.wait(rng.uniform(0.5, 2))


def bulk_client(insts, rng):
    """Bursts of 5 concurrent requests at the bulkhead upstream (max_inflight 2, a 300 ms
    backend): the intended 503s."""
    while not STOP.is_set():
        inst = pick_instance(rng, insts)
        if inst is None:
            STOP.wait(0.2)
            continue

        def one(inst=inst):
            t0 = time.time()
            key = rng.choice(COLD_KEYS)
            try:
                c = http.client.HTTPConnection("127.0.0.1", inst.port, timeout=10)
                c.request("GET", "/bulk", headers={"x-api-key": key, "connection": "close"})
                r = c.getresponse()
                r.read()
                record("h1_bulk", key, t0, time.time(), r.status, r.getheader("x-backend"), inst.slot, None, "/bulk")
            except (OSError, http.client.HTTPException) as e:
                record("h1_bulk", key, t0, time.time(), None, None, inst.slot, type(e).__name__, "/bulk")

        ts = [threading.Thread(target=one, daemon=True) for _ in range(5)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        STOP.wait(rng.uniform(2, 4))


# ---------------------------------------------------------------------------------------
# faults
# ---------------------------------------------------------------------------------------


def f_redis(rng, redis, insts):
    f = fault_begin("redis_restart", "redis")
    redis.kill()
    STOP.wait(min(rng.uniform(3, 12), max(1, FAULTS_END - now())))
    redis.start()
    fault_end(f)


def f_cluster_master(rng, cluster):
    """SIGKILL of one current master; its replica is promoted; 3-12 s later the killed
    node is restarted on its port with its nodes.conf and rejoins as a replica. The fault
    ends when the whole cluster is healthy again (every node ok, every replica in sync)."""
    if not cluster.busy.acquire(blocking=False):
        return
    try:
        masters = [p for p in cluster.masters() if cluster.node(p).running()]
        if not masters:
            check_fail("cluster_master: no running master to kill")
            return
        port = rng.choice(masters)
        node = cluster.node(port)
        fo = {"port": port}
        f = fault_begin("cluster_master", f"redis:{port}")
        fo["kill"] = now()
        node.kill()
        if wait_until(30, lambda: cluster.promoted(port), 0.2):
            fo["promoted"] = now()
            log(f"cluster_master: :{port}'s replica promoted {fo['promoted'] - fo['kill']:.1f} s after the kill; masters now {cluster.masters()}")
        else:
            check_fail(f"cluster_master: no replica promoted within 30 s of killing master :{port}")
        STOP.wait(min(rng.uniform(3, 12), max(1, FAULTS_END - now())))
        if not node.start():
            check_fail(f"cluster_master: the killed node :{port} did not restart")
        fo["restarted"] = now()
        if wait_until(60, cluster.healthy, 0.5):
            fo["ok"] = now()
            log(f"cluster_master: :{port} rejoined; cluster ok on every node {fo['ok'] - fo['restarted']:.1f} s after its restart")
        else:
            check_fail(f"cluster_master: the cluster not ok on every node within 60 s of restarting :{port}")
        with LOCK:
            cluster.failovers.append(fo)
        fault_end(f)
    finally:
        cluster.busy.release()


def f_backend(rng, kind, b):
    f = fault_begin(f"backend_{kind}", b.name)
    b.set(kind)
    STOP.wait(min(rng.uniform(8, 30), max(1, FAULTS_END - now())))
    b.set("ok")
    fault_end(f)
    RECOVERED.append((b.name, now()))


def f_reload(rng, insts):
    f = fault_begin("reload", "all")
    with LOCK:
        CONFIG_VARIANT[0] ^= 1
        v = CONFIG_VARIANT[0]
    for i in insts:
        i.write_config()
    cap = 512 - 12 * v
    for i in insts:
        with i.busy:
            if i.proc and i.proc.poll() is None:
                i.proc.send_signal(signal.SIGHUP)
    for i in insts:
        def applied(i=i):
            m = i.metrics()
            return m is not None and metric_values(m, "portcullis_concurrency_limit").get("", -1) == cap
        if i.proc.poll() is None and not wait_until(10, applied, 0.2):
            check_fail(f"reload: instance {i.slot} does not report max_concurrency {cap}")
    fault_end(f)


def f_cert(rng, insts):
    f = fault_begin("cert_reload", "all")
    fp = make_cert()
    for i in insts:
        with i.busy:
            if i.proc and i.proc.poll() is None:
                i.proc.send_signal(signal.SIGHUP)
    for i in insts:
        if not wait_until(10, lambda i=i: tls_fingerprint(i.tls_port) == fp, 0.2):
            check_fail(f"cert reload: instance {i.slot} still presents the old certificate")
    fault_end(f)


def f_sigterm(rng, inst):
    if not inst.busy.acquire(blocking=False):
        return
    try:
        f = fault_begin("sigterm", inst.slot)
        inst.accepting = False
        p = inst.proc
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=DRAIN + SHUTDOWN_TIMEOUT + 10)
            if rc != 0:
                check_fail(f"sigterm: instance {inst.slot} exited {rc}")
        except subprocess.TimeoutExpired:
            check_fail(f"sigterm: instance {inst.slot} did not exit")
            p.kill()
            p.wait()
        STOP.wait(rng.uniform(1, 5))
        inst.start()
        fault_end(f)
    finally:
        inst.busy.release()


def f_upgrade(rng, inst):
    if not inst.busy.acquire(blocking=False):
        return
    try:
        f = fault_begin("upgrade", inst.slot)
        old = inst.proc
        try:
            os.unlink(inst.sock)
        except FileNotFoundError:
            pass
        new = inst.spawn(upgrade=True)
        if not wait_until(20, lambda: os.path.exists(inst.sock) or new.poll() is not None):
            check_fail(f"upgrade: instance {inst.slot}'s new process never listened on upgrade_sock")
        if new.poll() is not None:
            check_fail(f"upgrade: instance {inst.slot}'s new process exited {new.returncode}")
            fault_end(f)
            return
        old.send_signal(signal.SIGQUIT)
        inst.proc = new
        try:
            rc = old.wait(timeout=DRAIN + SHUTDOWN_TIMEOUT + 20)
            if rc != 0:
                check_fail(f"upgrade: old process of instance {inst.slot} exited {rc}")
        except subprocess.TimeoutExpired:
            check_fail(f"upgrade: old process of instance {inst.slot} did not exit")
            old.kill()
            old.wait()
        if not wait_until(10, lambda: inst.readyz() == 200):
            check_fail(f"upgrade: instance {inst.slot} not ready after the upgrade")
        fault_end(f)
    finally:
        inst.busy.release()


RECOVERED = []  # (backend, t): a backend fault ended


def schedule(rng, start, stop):
    """The seeded schedule: a moment every 10-30 s, 1-3 faults at it."""
    out, t = [], start
    # cluster mode: a master failover takes the place of the Redis restart (the same draws)
    redis_fault = "cluster_master" if STORE == "cluster" else "redis_restart"
    kinds = [redis_fault, "backend_fail", "backend_hang", "backend_slow", "reload",
             "upgrade", "cert_reload", "sigterm"]
    while True:
        t += rng.uniform(10, 30)
        if t > stop:
            break
        n = rng.choices([1, 2, 3], [6, 3, 1])[0]
        out.append((t, rng.sample(kinds, n), rng.randrange(1 << 30)))
    if STORE == "cluster" and out and "cluster_master" not in out[0][1]:
        # every cluster run fails a master over, at its first fault moment
        t0, k0, s0 = out[0]
        out[0] = (t0, ["cluster_master"] + k0[: 2], s0)
    return out


def run_fault(kind, frng, redis, backends, insts):
    try:
        if kind == "redis_restart":
            if redis.proc.poll() is None:
                f_redis(frng, redis, insts)
        elif kind == "cluster_master":
            f_cluster_master(frng, redis)
        elif kind.startswith("backend_"):
            free = [b for b in backends if not active({"backend_fail", "backend_hang", "backend_slow"}, now(), now(), target=b.name)]
            if free:
                f_backend(frng, kind[len("backend_"):], frng.choice(free))
        elif kind == "reload":
            f_reload(frng, insts)
        elif kind == "cert_reload":
            f_cert(frng, insts)
        elif kind == "upgrade":
            f_upgrade(frng, frng.choice(insts[1:]))  # so does its process: the leak check's witness
        elif kind == "sigterm":
            f_sigterm(frng, frng.choice(insts[1:]))  # instance 0 lives the whole run
    except Exception as e:  # a broken fault is a failed check, never a silent one
        check_fail(f"fault {kind} raised {type(e).__name__}: {e}")


# ---------------------------------------------------------------------------------------
# monitors
# ---------------------------------------------------------------------------------------

CULLED = collections.defaultdict(list)  # backend -> [(t, slot)] while seen culled
MAX_CULLED = [0]
RES = collections.defaultdict(list)  # pid -> [(t, rss_kib, fds, tracked_keys)]
STORE_HEALTH = collections.defaultdict(list)  # slot -> [(t, portcullis_ratelimit_store_healthy)]


def monitor(insts, backends):
    n_app = len(backends)
    allowed = min(int(MAX_CULLED_FRACTION * n_app), n_app - 1)
    while not STOP.is_set():
        t = now()
        for i in insts:
            p = i.proc
            if p is None or p.poll() is not None:
                continue
            m = i.metrics()
            if m is None:
                continue
            STORE_HEALTH[i.slot].append((t, metric_values(m, "portcullis_ratelimit_store_healthy").get("", -1)))
            culled = [k for k, v in metric_values(m, "portcullis_backend_culled").items() if v == 1 and 'upstream="app"' in k]
            with LOCK:
                MAX_CULLED[0] = max(MAX_CULLED[0], len(culled))
            if len(culled) > allowed:
                check_fail(f"instance {i.slot}: {len(culled)} of {n_app} backends culled (budget {allowed}): {culled}")
            for k in culled:
                b = re.search(r'backend="([^"]+)"', k).group(1)
                name = next((x.name for x in backends if x.addr == b), b)
                CULLED[name].append((t, i.slot))
            if True:  # every second: the medians below need many samples (keys move per window)
                try:
                    with open(f"/proc/{p.pid}/status") as f:
                        rss = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
                    fds = len(os.listdir(f"/proc/{p.pid}/fd"))
                except (OSError, AttributeError):
                    continue
                keys = metric_values(m, "portcullis_ratelimit_tracked_keys").get("", -1)
                RES[p.pid].append((t, rss, fds, keys))
        STOP.wait(1)


# ---------------------------------------------------------------------------------------
# the run and its checks
# ---------------------------------------------------------------------------------------


def guarded(target):
    """A client or monitor that dies is a failed check, never a silent gap in the load."""
    def run(*a):
        try:
            target(*a)
        except Exception as e:
            check_fail(f"{target.__name__} died: {type(e).__name__}: {e}")
    return run


def main():
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: (cleanup(), os._exit(130)))
    rng = random.Random(SEED)
    log(f"store {STORE}, seed {SEED}, {SECONDS} s (warm-up {WARMUP} s, quiet end {QUIET} s), binary {BIN}, scratch {TMP}")
    make_cert()
    redis = Cluster() if STORE == "cluster" else Redis()
    redis.start()
    backends = [Backend(f"b{i}") for i in range(N_BACKENDS)]
    bulk = Backend("bulk", slow_ms=300)
    bulk.set("slow")
    if not wait_until(10, lambda: all(b.up() for b in backends)):
        raise SystemExit("soak: backends did not start")
    insts = [Instance(s, redis, backends, bulk) for s in range(N_INST)]
    for i in insts:
        i.start()
    log("all up: %s, backends %s, instances %s" % (
        redis.describe(), [b.port for b in backends], [(i.port, i.tls_port, i.admin_port) for i in insts]))

    threads = [threading.Thread(target=guarded(monitor), args=(insts, backends), daemon=True)]
    # hot 40 req/s + cold 40 req/s + churn 1 req/s, split over the clients
    total = len(HOT_KEYS) * LIMIT / WINDOW * HOT_RATE + len(COLD_KEYS) * LIMIT / WINDOW * COLD_RATE
    crng = random.Random(rng.randrange(1 << 30))
    for n in range(3):
        threads.append(threading.Thread(target=guarded(h1_client), args=(f"ka{n}", insts, random.Random(crng.random()), total * 0.2, True, 1, n), daemon=True))
        threads.append(threading.Thread(target=guarded(h2_client), args=(insts, random.Random(crng.random()), total * 0.25 / 3, n), daemon=True))
    threads.append(threading.Thread(target=guarded(h1_client), args=("new", insts, random.Random(crng.random()), total * 0.15, False, 1), daemon=True))
    threads.append(threading.Thread(target=guarded(ws_client), args=(insts, random.Random(crng.random())), daemon=True))
    threads.append(threading.Thread(target=guarded(ws_client), args=(insts, random.Random(crng.random())), daemon=True))
    threads.append(threading.Thread(target=guarded(bulk_client), args=(insts, random.Random(crng.random())), daemon=True))
    for t in threads:
        t.start()

    plan = schedule(random.Random(rng.randrange(1 << 30)), WARMUP, SECONDS - QUIET)
    log(f"{len(plan)} fault moments planned")
    fault_threads = []
    for at, kinds, fseed in plan:
        while now() < at and not STOP.is_set():
            STOP.wait(min(1, at - now()))
        frng = random.Random(fseed)
        for k in kinds:
            ft = threading.Thread(target=run_fault, args=(k, random.Random(frng.random()), redis, backends, insts), daemon=True)
            ft.start()
            fault_threads.append(ft)
    for ft in fault_threads:  # the last faults end inside the quiet part
        ft.join(timeout=max(1, SECONDS - now()))
    while now() < SECONDS:
        STOP.wait(min(1, SECONDS - now()))
    STOP.set()
    for t in threads:
        t.join(timeout=15)
    return finish(insts, backends, redis)


def error_causes(j):
    """The injected faults that can explain an ERROR line."""
    target, msg = j.get("target", ""), j.get("message", "")
    if target.startswith("portcullis::store") or "redis" in msg or "store" in msg:
        return {"redis_restart", "cluster_master"}  # a master failover is an outage of its slots
    if target.startswith("pingora_core::server::transfer_fd"):  # waits for the old process's fds
        return {"upgrade"}
    if j.get("event") == "proxy_error":
        return {"backend_fail", "backend_hang", "backend_slow", "sigterm", "upgrade"}
    return {"redis_restart", "cluster_master", "backend_fail", "backend_hang", "backend_slow", "reload", "upgrade",
            "cert_reload", "sigterm"}


def finish(insts, backends, redis):
    fails = [w for _, w in CHECK_FAILS]
    # rate limit: admitted per key per fixed window
    # a master failover: the keys of its slots lose their counters until the promotion
    outages = [(f["start"] + T0, (f["end"] or now()) + T0) for f in FAULTS if f["kind"] in ("redis_restart", "cluster_master")]
    max_norm, max_out, over = 0.0, 0.0, []
    for key in HOT_KEYS + COLD_KEYS:
        for w in set(ADMITTED[key]) | set(AMBIG[key]):
            n = ADMITTED[key][w] + AMBIG[key][w]
            ws = w * WINDOW
            outage = any(a <= ws + WINDOW and b + REDIS_GRACE >= ws - WINDOW for a, b in outages)
            ratio = n / LIMIT
            bound = BOUND * (N_INST if outage else 1)
            if outage:
                max_out = max(max_out, ratio)
            else:
                max_norm = max(max_norm, ratio)
            if ratio > bound:
                over.append(f"{key} window {ws - T0:.0f}s: {n} admitted ({ratio:.2f} x limit, bound {bound:.2f})")
    fails += [f"rate limit: {o}" for o in over]
    # readmission: every backend fault that ended at least 30 s before the end
    # (readmitted within cooldown + 3 checks + 12 s of slack; a new fault on it before then excuses it)
    for name, t in RECOVERED:
        due = t + COOLDOWN + 3 * CHECK + 12
        if due + 10 > SECONDS or active({"backend_fail", "backend_hang", "backend_slow"}, t + 0.5, due + 10, target=name):
            continue
        late = [(ts, s) for ts, s in CULLED[name] if due <= ts <= due + 10]
        if late:
            fails.append(f"culling: {name} recovered at {t:.0f}s, still culled at {late[-1][0]:.0f}s on instance {late[-1][1]}")
    for name in CULLED:
        if any(ts > SECONDS - 10 for ts, _ in CULLED[name]):
            fails.append(f"culling: {name} still culled at the end")
    # resources: each process alive at the end with a baseline after its warm-up
    drift = {}
    for i in insts:
        pid = i.proc.pid
        started = next(t for p, t, _ in i.pids if p == pid)
        samples = RES.get(pid, [])
        b0 = max(started + WARMUP, LEAK_BASE)
        base = [s for s in samples if b0 <= s[0] <= b0 + 30]
        warm = [s for s in samples if started + WARMUP <= s[0] <= started + WARMUP + 30]
        end = [s for s in samples if s[0] >= SECONDS - 30]
        if len(base) < 3 or len(end) < 3 or b0 + 30 > SECONDS - QUIET:
            drift[i.slot] = None
            continue
        med = lambda xs, k: round(sum(x[k] for x in xs) / len(xs), 1)  # the mean of 1 s samples
        d = {}
        for k, label in ((1, "rss"), (2, "fd"), (3, "keys")):
            b, e = med(base, k), med(end, k)
            d[label] = (e - b) / b if b > 0 else 0.0
            w = med(warm, k) if warm else b
            d[label + "_abs"] = (w, b, e)
            d[label + "_warm"] = (e - w) / w if w > 0 else 0.0
            if abs(d[label]) > 0.10:
                fails.append(f"leak: instance {i.slot} (pid {pid}) {label} {b} at {b0:.0f}s -> {e} at the end ({d[label]:+.1%})")
        drift[i.slot] = d
    with open(os.path.join(TMP, "resources.json"), "w") as f:
        json.dump({str(k): v for k, v in RES.items()}, f)
    # ERROR lines
    errors, unexplained = 0, []
    for i in insts:
        for pid, _, path in i.pids:
            try:
                lines = open(path, errors="replace").read().splitlines()
            except OSError:
                continue
            for line in lines:
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                if j.get("level") != "ERROR":
                    continue
                errors += 1
                ts = datetime.datetime.fromisoformat(j["timestamp"].replace("Z", "+00:00")).timestamp() - T0
                if not active(error_causes(j), ts, ts, grace=ERROR_GRACE):
                    unexplained.append(f"i{i.slot} pid {pid} at {ts:.0f}s: {line[:300]}")
    fails += [f"ERROR line without an injected cause: {u}" for u in unexplained]
    failed = sum(v for k, v in OUTCOME.items() if k.startswith("failed:"))
    caused = sum(v for k, v in OUTCOME.items() if k.startswith("caused:"))
    total_req = sum(v for k, v in REQ.items() if not k.startswith("_"))
    ok = not fails and failed == 0

    fk = ["redis_restart", "backend_fail", "backend_hang", "backend_slow", "reload", "upgrade", "cert_reload", "sigterm"]
    fstr = ",".join(f"{k}:{FAULT_COUNT[k]}" for k in fk + (["cluster_master"] if STORE == "cluster" else []))
    # master failovers: the promotion after the kill, and each instance's store healthy
    # again after the promotion (its first 1 s sample at 1 from then; §9 says within 10 s)
    fo_str = ""
    if STORE == "cluster":
        promote, healthy_after, unhealthy_seen = [], [], 0
        for fo in redis.failovers:
            if "promoted" not in fo:
                continue
            promote.append(fo["promoted"] - fo["kill"])
            for slot, hs in STORE_HEALTH.items():
                unhealthy_seen += sum(1 for t, v in hs if fo["kill"] <= t <= fo["promoted"] + 30 and v == 0)
                after = [t for t, v in hs if fo["promoted"] <= t <= fo["promoted"] + 60 and v == 1]
                if after:
                    healthy_after.append(after[0] - fo["promoted"])
        fo_str = (f"failovers={len(promote)} promote_s_max={max(promote, default=0):.1f} "
                  f"store_healthy_after_promote_s_max={max(healthy_after, default=0):.1f} "
                  f"store_unhealthy_samples={unhealthy_seen} ")
    pstr = ",".join(f"{k}:{REQ[k]}" for k in ("h1_keepalive", "h1_new", "h2", "ws", "h1_bulk"))
    cstr = ",".join(f"{k[7:]}:{v}" for k, v in sorted(OUTCOME.items()) if k.startswith("caused:")) or "-"
    env = sum(v for k, v in OUTCOME.items() if k.startswith("env:"))
    dstr = " ".join(
        f"i{s}:" + ("n/a" if d is None else f"rss{d['rss']:+.1%}/fd{d['fd']:+.1%}/keys{d['keys']:+.1%}")
        for s, d in sorted(drift.items()))
    print(f"soak: {'PASS' if ok else 'FAIL'} store={STORE} seed={SEED} seconds={SECONDS} faults={sum(FAULT_COUNT.values())} ({fstr}) "
          f"requests={total_req} ({pstr}) ok={OUTCOME['ok']} 429={OUTCOME['429']} 503_bulkhead={OUTCOME['503_bulkhead']} "
          f"caused={caused} ({cstr}) retried_stale={OUTCOME['retried_stale']} retried_goaway={OUTCOME['retried_goaway']} "
          f"env_backend_not_scheduled={env} failed={failed} checks_failed={len(fails)} max_key_ratio={max_norm:.3f} (bound {BOUND}) "
          f"max_key_ratio_redis_down={max_out:.3f} (bound {BOUND * N_INST:.2f}) max_culled={MAX_CULLED[0]}/{N_BACKENDS} "
          f"ws_messages={OUTCOME['ws_messages']} {fo_str}error_lines={errors} unexplained_errors={len(unexplained)} drift {dstr}",
          flush=True)
    for t, w in FAILURES[:30]:
        print(f"soak: failed request at {t - T0:.1f}s: {w}", file=sys.stderr)
    for w in fails[:50]:
        print(f"soak: check failed: {w}", file=sys.stderr)
    for s, d in sorted(drift.items()):
        if d:
            print(f"soak: instance {s}: rss {d['rss_abs']} KiB, fds {d['fd_abs']}, tracked keys {d['keys_abs']} "
                  f"(after its warm-up, at the leak baseline, at the end; RSS from its warm-up {d['rss_warm']:+.1%})", file=sys.stderr)

    row = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "commit": subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "binary": os.path.basename(os.path.dirname(BIN)), "seed": SEED, "seconds": SECONDS,
        "result": "pass" if ok else "fail",
    }
    for k in fk:
        row[f"faults_{k}"] = FAULT_COUNT[k]
    for k in ("h1_keepalive", "h1_new", "h2", "ws", "h1_bulk"):
        row[f"req_{k}"] = REQ[k]
    row.update({"ok": OUTCOME["ok"], "limited_429": OUTCOME["429"], "shed_503": OUTCOME["503_bulkhead"],
                "caused": caused, "env_backend_not_scheduled": env, "failed": failed, "checks_failed": len(fails),
                "max_key_ratio": f"{max_norm:.3f}", "max_key_ratio_redis_down": f"{max_out:.3f}",
                "max_culled": MAX_CULLED[0], "error_lines": errors, "unexplained_errors": len(unexplained)})
    for s in range(N_INST):
        d = drift.get(s)
        for k in ("rss", "fd", "keys"):
            row[f"i{s}_{k}_drift"] = "" if d is None else f"{d[k]:+.3f}"
        row[f"i{s}_rss_drift_from_warmup"] = "" if d is None else f"{d['rss_warm']:+.3f}"
    # added later, at the end: rows written before them have neither (read: 0, standalone)
    row["faults_cluster_master"] = FAULT_COUNT["cluster_master"]
    row["store"] = STORE
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    new = not os.path.exists(RESULTS)
    if not new:
        upgrade_header(RESULTS, list(row))
    with open(RESULTS, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)
    print(f"soak: row appended to {RESULTS}", file=sys.stderr)
    return 0 if ok else 1


def upgrade_header(path, fields):
    """An existing CSV whose header is a prefix of `fields` (written before the last
    columns were added) gets the full header; its rows stay as they are (shorter: a
    csv.DictReader reads the missing columns as None)."""
    with open(path, newline="") as f:
        lines = f.read().splitlines(keepends=True)
    if not lines:
        return
    old = next(csv.reader([lines[0]]))
    if old != fields and fields[:len(old)] == old:
        buf = io.StringIO()
        csv.writer(buf).writerow(fields)
        lines[0] = buf.getvalue()
        tmp = path + ".tmp"
        with open(tmp, "w", newline="") as f:
            f.writelines(lines)
        os.replace(tmp, path)


if __name__ == "__main__":
    rc = 1
    try:
        rc = main()
    finally:
        cleanup()
    sys.exit(rc)
