//! The one place in the Rust code that starts `redis-server`: a real server on a free port
//! (never 6379), owned by the test, that it can kill and restart.
//!
//! The library's own unit tests (`src/*/redis_tests.rs`) use it too.
//! Starting blocks (a few ms); async tests call it once at setup.

use std::fs;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The program; the only place the Rust code names it.
const REDIS_SERVER: &str = "redis-server";

/// How long a fresh `redis-server` may take to answer PING on a loaded 2-core machine.
const START_DEADLINE: Duration = Duration::from_secs(20);

/// Test ports come from here: below the kernel's ephemeral range (32768–60999 on Linux), so
/// no outgoing connection and no `bind(port 0)` is ever handed one.
const PORT_RANGE: std::ops::Range<u16> = 12_000..20_000;

/// Where the per-port claim files live (shared by every test process on the machine).
const PORT_CLAIMS: &str = "portcullis-test-ports";

/// A port on 127.0.0.1 that no other test process holds.
///
/// Binding port 0 and closing the socket is racy when tests run in parallel processes
/// (nextest runs each test in its own): the kernel hands the same port to two processes,
/// or an outgoing connection takes it before the child we give it to binds it (CI once
/// saw a proxy's listener receive another test's admin `/readyz`). Here each port is
/// claimed by creating `$TMPDIR/portcullis-test-ports/<port>` (atomically, holding this
/// process's pid), and checked free by binding it. A claim whose process is gone is
/// taken over.
pub fn free_port() -> u16 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let dir = std::env::temp_dir().join(PORT_CLAIMS);
    fs::create_dir_all(&dir).expect("create the port-claim directory");
    let me = std::process::id();
    // The claim's content, written before it is linked into place: never seen half-written.
    let mine = dir.join(format!(".pid-{me}"));
    if !mine.exists() {
        fs::write(&mine, me.to_string()).expect("write the port-claim file");
    }
    let span = u64::from(PORT_RANGE.end - PORT_RANGE.start);
    let mut h = RandomState::new().build_hasher();
    h.write_u32(me);
    let start = h.finish() % span;
    for i in 0..span {
        let port = PORT_RANGE.start + ((start + i) % span) as u16;
        let claim = dir.join(port.to_string());
        if fs::hard_link(&mine, &claim).is_err() {
            // Claimed: by a live process (skip), or by one that is gone (take over).
            let owner = fs::read_to_string(&claim).ok();
            let alive = owner
                .as_deref()
                .is_some_and(|pid| std::path::Path::new("/proc").join(pid.trim()).exists());
            if alive || fs::remove_file(&claim).is_err() || fs::hard_link(&mine, &claim).is_err() {
                continue;
            }
        }
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue; // in use outside the tests' claims (kept claimed: skipped by others too)
        }
        return port;
    }
    panic!("no free test port in {PORT_RANGE:?}");
}

/// A real `redis-server` on a free port, owned by the test.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// Extra `redis-server` arguments, kept for [`RedisServer::restart`].
    extra: Vec<String>,
    /// A config file passed first (sentinels need one they can rewrite).
    conf: Option<std::path::PathBuf>,
}

impl RedisServer {
    /// Whether `redis-server` is on PATH (the unit tests skip with a note when it is not).
    pub fn available() -> bool {
        let ok = Command::new(REDIS_SERVER)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("SKIPPED: redis-server not on PATH");
        }
        ok
    }

    /// [`RedisServer::start`], or `None` (after a note) when `redis-server` is not installed.
    pub fn try_start() -> Option<RedisServer> {
        Self::available().then(Self::start)
    }

    pub fn start() -> RedisServer {
        Self::start_with_args(&[])
    }

    /// Like [`RedisServer::start`] with extra `redis-server` arguments, e.g.
    /// `["--enable-debug-command", "local"]` so a test can `DEBUG SLEEP`.
    /// [`RedisServer::restart`] passes them again.
    pub fn start_with_args(extra: &[&str]) -> RedisServer {
        Self::start_on(free_port(), extra)
    }

    /// Starts on `port` (e.g. the port of a server the test killed).
    pub fn start_on(port: u16, extra: &[&str]) -> RedisServer {
        let mut r = RedisServer {
            port,
            child: None,
            dir: tempfile::tempdir().expect("tempdir"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            conf: None,
        };
        r.spawn();
        r
    }

    /// A server with `--requirepass password` (the kit's own PING and `redis-cli` calls
    /// authenticate).
    pub fn start_with_password(password: &str) -> RedisServer {
        Self::start_with_args(&["--requirepass", password])
    }

    /// A server that also listens with TLS on [`RedisServer::tls_port`] (`--tls-port`),
    /// serving `cert`/`key` (PEM); clients are not asked for a certificate. The plain port
    /// stays open for the kit's own PING and `redis-cli`.
    pub fn start_tls(
        cert: &std::path::Path,
        key: &std::path::Path,
        ca: &std::path::Path,
    ) -> RedisServer {
        let tls_port = free_port().to_string();
        let (cert, key, ca) = (
            cert.display().to_string(),
            key.display().to_string(),
            ca.display().to_string(),
        );
        Self::start_with_args(&[
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
        ])
    }

    /// A Sentinel (`redis-server CONF --sentinel`) on a free port with this config text
    /// (`sentinel monitor …` lines); it rewrites the file as it learns the topology.
    pub fn start_sentinel(conf: &str) -> RedisServer {
        let mut r = RedisServer {
            port: free_port(),
            child: None,
            dir: tempfile::tempdir().expect("tempdir"),
            extra: vec!["--sentinel".into()],
            conf: None,
        };
        let path = r.dir.path().join("sentinel.conf");
        fs::write(&path, conf).expect("write sentinel.conf");
        r.conf = Some(path);
        r.spawn();
        r
    }

    /// The `--tls-port` of a server from [`RedisServer::start_tls`].
    pub fn tls_port(&self) -> Option<u16> {
        self.arg("--tls-port").and_then(|p| p.parse().ok())
    }

    /// The value following `flag` in the extra arguments.
    fn arg(&self, flag: &str) -> Option<&str> {
        let i = self.extra.iter().position(|a| a == flag)?;
        self.extra.get(i + 1).map(String::as_str)
    }

    /// The `--requirepass` of this server, if any.
    pub fn password(&self) -> Option<&str> {
        self.arg("--requirepass")
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "redis already running");
        assert_ne!(self.port, 6379, "never touch the machine's redis");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("redis.log"))
            .expect("redis log");
        let mut cmd = Command::new(REDIS_SERVER);
        if let Some(conf) = &self.conf {
            cmd.arg(conf);
        }
        let child = cmd
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", &self.dir.path().display().to_string()])
            .args(&self.extra)
            .stdout(Stdio::from(log.try_clone().expect("clone log")))
            .stderr(Stdio::from(log))
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn redis-server (is it installed?)");
        self.child = Some(child);
        let deadline = Instant::now() + START_DEADLINE;
        while !self.ping() {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                panic!("redis-server on {} exited early: {st}", self.port);
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} never answered PING",
                self.port
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// One PING over a plain socket: true on `+PONG`.
    fn ping(&self) -> bool {
        let answer = || -> io::Result<bool> {
            let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
            s.set_read_timeout(Some(Duration::from_secs(1)))?;
            if let Some(pw) = self.password() {
                s.write_all(format!("AUTH {pw}\r\n").as_bytes())?;
                let mut ok = [0u8; 5];
                s.read_exact(&mut ok)?;
                if &ok != b"+OK\r\n" {
                    return Ok(false);
                }
            }
            s.write_all(b"PING\r\n")?;
            let mut buf = [0u8; 7];
            s.read_exact(&mut buf)?;
            Ok(&buf == b"+PONG\r\n")
        };
        answer().unwrap_or(false)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// One `INFO` field (`role`, `master_link_status`, …), if present.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        let out = self.try_cmd(&["INFO", section]).ok()?;
        out.lines().find_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            (k == field).then(|| v.trim().to_string())
        })
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the server (SIGKILL to the child PID) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and arguments (empty dataset).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Runs `redis-cli -p PORT args...` (with `-a` for a password server); returns trimmed
    /// stdout.
    pub fn try_cmd(&self, args: &[&str]) -> io::Result<String> {
        let mut cmd = Command::new("redis-cli");
        cmd.arg("-p").arg(self.port.to_string());
        if let Some(pw) = self.password() {
            cmd.args(["-a", pw, "--no-auth-warning"]);
        }
        let out = cmd.args(args).stdin(Stdio::null()).output()?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    pub fn cmd(&self, args: &[&str]) -> String {
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("redis-cli {args:?}: {e}"))
    }

    /// All keys matching `pattern` (via SCAN-free `KEYS`, fine for tests).
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        self.cmd(&["--raw", "KEYS", pattern])
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    }

    /// `INFO commandstats` as command name -> calls (commands a script runs included).
    pub fn commandstats(&self) -> std::collections::HashMap<String, u64> {
        let mut m = std::collections::HashMap::new();
        for line in self.cmd(&["INFO", "commandstats"]).lines() {
            let Some(rest) = line.trim().strip_prefix("cmdstat_") else {
                continue;
            };
            let Some((name, fields)) = rest.split_once(':') else {
                continue;
            };
            let calls = fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            m.insert(name.to_string(), calls);
        }
        m
    }
}

/// (round trips, all commands including those a script runs) between two
/// [`RedisServer::commandstats`] snapshots. Round trips exclude the commands Redis runs inside
/// the limiter's script (SET/INCRBY/EXPIRE/GET) and a test's own INFO/KEYS/TTL calls.
pub fn command_delta(
    before: &std::collections::HashMap<String, u64>,
    after: &std::collections::HashMap<String, u64>,
) -> (u64, u64) {
    let mut round_trips = 0;
    let mut all = 0;
    for (name, &calls) in after {
        let d = calls.saturating_sub(before.get(name).copied().unwrap_or(0));
        if matches!(name.as_str(), "info" | "keys" | "ttl" | "pttl") {
            continue;
        }
        all += d;
        if !matches!(name.as_str(), "set" | "incrby" | "expire" | "get") {
            round_trips += d;
        }
    }
    (round_trips, all)
}

/// 128-bit FNV-1a in hex: how the proxy names a rate-limit key in Redis (never in clear).
pub fn key_hash(key: &[u8]) -> String {
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for b in key {
        h ^= u128::from(*b);
        h = h.wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013b);
    }
    format!("{h:032x}")
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `f` every 50 ms until it is true; panics with `what` after `timeout`.
fn poll(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "{what} not reached within {timeout:?}"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// How long a cluster or a sentinel set may take to form (or fail over) on a loaded machine.
const FORM_DEADLINE: Duration = Duration::from_secs(60);

/// `cluster-node-timeout` of [`RedisCluster`] nodes: a killed master is detected and its
/// replica promoted within a few seconds.
pub const CLUSTER_NODE_TIMEOUT_MS: u64 = 1_000;

/// A real Redis Cluster: `masters` masters with `replicas_per_master` replicas each, every
/// node a [`RedisServer`] with `--cluster-enabled yes` on a free port, joined by
/// `redis-cli --cluster create … --cluster-replicas N --cluster-yes`. Ready (every slot
/// covered, every replica in sync) when [`RedisCluster::start`] returns.
///
/// ```ignore
/// let cluster = RedisCluster::start(3, 1);
/// let seeds = cluster.nodes();          // "127.0.0.1:PORT" of every node
/// let port = cluster.kill_master(0);    // SIGKILL the master of the lowest slots
/// cluster.wait_ok();                    // its replica promoted, every slot served again
/// ```
pub struct RedisCluster {
    /// Every node ever started, in creation order (killed ones stay, not running).
    servers: Vec<RedisServer>,
}

impl RedisCluster {
    /// At least 3 masters (`redis-cli --cluster create` refuses fewer).
    pub fn start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        Self::start_with_args(masters, replicas_per_master, &[])
    }

    /// Like [`RedisCluster::start`] with extra `redis-server` arguments for every node
    /// (e.g. `["--requirepass", pw, "--masterauth", pw]`).
    pub fn start_with_args(
        masters: usize,
        replicas_per_master: usize,
        extra: &[&str],
    ) -> RedisCluster {
        Self::start_inner(masters, replicas_per_master, extra, None)
    }

    /// Every node also listens with TLS (`--tls-port`, `--tls-cluster yes`,
    /// `--tls-replication yes`) serving `cert`/`key`; [`RedisCluster::tls_nodes`] are the
    /// seeds for a TLS client (which the nodes answer with their TLS ports).
    pub fn start_tls(
        masters: usize,
        replicas_per_master: usize,
        cert: &std::path::Path,
        key: &std::path::Path,
        ca: &std::path::Path,
    ) -> RedisCluster {
        Self::start_inner(masters, replicas_per_master, &[], Some((cert, key, ca)))
    }

    /// `127.0.0.1:TLS_PORT` of every node of [`RedisCluster::start_tls`].
    pub fn tls_nodes(&self) -> Vec<String> {
        self.servers
            .iter()
            .filter_map(|s| s.tls_port().map(|p| format!("127.0.0.1:{p}")))
            .collect()
    }

    fn start_inner(
        masters: usize,
        replicas_per_master: usize,
        extra: &[&str],
        tls: Option<(&std::path::Path, &std::path::Path, &std::path::Path)>,
    ) -> RedisCluster {
        assert!(masters >= 3, "a Redis Cluster needs at least 3 masters");
        let timeout = CLUSTER_NODE_TIMEOUT_MS.to_string();
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &timeout,
        ];
        args.extend_from_slice(extra);
        let n = masters * (1 + replicas_per_master);
        // The bus port defaults to port + 10000, which is past 65535 for much of the
        // ephemeral range: every node gets a free one of its own.
        let servers: Vec<RedisServer> = (0..n)
            .map(|_| {
                let bus = free_port().to_string();
                let tls_port = free_port().to_string();
                let files = tls.map(|(c, k, a)| {
                    (
                        c.display().to_string(),
                        k.display().to_string(),
                        a.display().to_string(),
                    )
                });
                let mut a = args.clone();
                a.extend_from_slice(&["--cluster-port", &bus]);
                if let Some((c, k, ca)) = &files {
                    a.extend_from_slice(&[
                        "--tls-port",
                        &tls_port,
                        "--tls-cluster",
                        "yes",
                        "--tls-replication",
                        "yes",
                        "--tls-cert-file",
                        c,
                        "--tls-key-file",
                        k,
                        "--tls-ca-cert-file",
                        ca,
                        "--tls-auth-clients",
                        "no",
                    ]);
                }
                RedisServer::start_with_args(&a)
            })
            .collect();
        let cluster = RedisCluster { servers };
        // Bounded: `--cluster create` waits for the join forever if the nodes cannot meet.
        let mut cmd = Command::new("timeout");
        cmd.args(["60", "redis-cli"]);
        if let Some(pw) = cluster.servers[0].password() {
            cmd.args(["-a", pw, "--no-auth-warning"]);
        }
        let out = cmd
            .args(["--cluster", "create"])
            .args(cluster.nodes())
            .args([
                "--cluster-replicas",
                &replicas_per_master.to_string(),
                "--cluster-yes",
            ])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        poll(
            FORM_DEADLINE,
            "cluster formed with replicas in sync",
            || {
                cluster.servers.iter().all(|s| {
                    let info = s.try_cmd(&["CLUSTER", "INFO"]).unwrap_or_default();
                    info.contains("cluster_state:ok")
                        && info.contains(&format!("cluster_known_nodes:{n}"))
                        && (s.info_field("replication", "role").as_deref() == Some("master")
                            || s.info_field("replication", "master_link_status").as_deref()
                                == Some("up"))
                })
            },
        );
        cluster
    }

    /// `127.0.0.1:PORT` of every node (seeds for a cluster client; killed ones included).
    pub fn nodes(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::addr).collect()
    }

    /// The node on `port`.
    pub fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    /// Any running node (for `redis-cli`).
    fn live(&self) -> &RedisServer {
        self.servers
            .iter()
            .find(|s| s.is_running())
            .expect("no running cluster node")
    }

    /// `redis-cli -c` against a running node (follows MOVED).
    pub fn cmd(&self, args: &[&str]) -> String {
        let mut all = vec!["-c"];
        all.extend_from_slice(args);
        self.live().cmd(&all)
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`).
    pub fn keyslot(&self, key: &str) -> u16 {
        let out = self.live().cmd(&["CLUSTER", "KEYSLOT", key]);
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("CLUSTER KEYSLOT {key}: {out:?}"))
    }

    /// Masters that own slots as a running node sees them (a killed master keeps its
    /// slots until its replica is promoted): (port, first slot), ordered by first slot.
    pub fn masters(&self) -> Vec<(u16, u16)> {
        let text = self.live().cmd(&["CLUSTER", "NODES"]);
        let mut out: Vec<(u16, u16)> = text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let flags = f.get(2)?;
                if !flags.contains("master") {
                    return None;
                }
                let port = f
                    .get(1)?
                    .split('@')
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()?;
                let first = f.get(8)?.split('-').next()?.parse().ok()?;
                Some((port, first))
            })
            .collect();
        out.sort_by_key(|&(_, slot)| slot);
        out
    }

    /// Kills (SIGKILL) the `i`-th master by slot order; returns its port.
    pub fn kill_master(&mut self, i: usize) -> u16 {
        let masters = self.masters();
        let (port, _) = *masters
            .get(i)
            .unwrap_or_else(|| panic!("no master {i} in {masters:?}"));
        self.kill(port);
        port
    }

    /// Kills the node on `port`.
    pub fn kill(&mut self, port: u16) {
        if let Some(s) = self.servers.iter_mut().find(|s| s.port() == port) {
            s.kill();
        }
    }

    /// Restarts a killed node on its port with its `nodes.conf`: it rejoins (as a replica
    /// when its slots were failed over).
    pub fn restart(&mut self, port: u16) {
        if let Some(s) = self.servers.iter_mut().find(|s| s.port() == port) {
            s.restart();
        }
    }

    /// Waits until every running node says `cluster_state:ok` and every master with slots
    /// is running (after a kill: the replica was promoted). Panics after a minute.
    pub fn wait_ok(&self) {
        poll(
            FORM_DEADLINE,
            "cluster state ok with every master running",
            || {
                let running: Vec<u16> = self
                    .servers
                    .iter()
                    .filter(|s| s.is_running())
                    .map(RedisServer::port)
                    .collect();
                self.servers.iter().filter(|s| s.is_running()).all(|s| {
                    s.try_cmd(&["CLUSTER", "INFO"])
                        .unwrap_or_default()
                        .contains("cluster_state:ok")
                }) && {
                    let m = self.masters();
                    !m.is_empty() && m.iter().all(|(p, _)| running.contains(p))
                }
            },
        );
    }
}

/// A Sentinel-managed master: one master, one replica (`--replicaof`) and three sentinels
/// (quorum 2, `down-after-milliseconds 1000`), all on free ports. Ready (sentinels see the
/// replica and each other) when [`RedisSentinels::start`] returns.
pub struct RedisSentinels {
    name: String,
    /// Master and replica (roles swap on failover).
    data: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
}

impl RedisSentinels {
    /// Monitored as `master_name`; `password`: `--requirepass` on master and replica.
    pub fn start(master_name: &str, password: Option<&str>) -> RedisSentinels {
        let mut auth: Vec<&str> = Vec::new();
        if let Some(pw) = password {
            auth = vec!["--requirepass", pw, "--masterauth", pw];
        }
        let master = RedisServer::start_with_args(&auth);
        let mport = master.port().to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &mport];
        replica_args.extend_from_slice(&auth);
        let replica = RedisServer::start_with_args(&replica_args);
        let mut conf = format!(
            "sentinel monitor {master_name} 127.0.0.1 {mport} 2\n\
             sentinel down-after-milliseconds {master_name} 1000\n\
             sentinel failover-timeout {master_name} 10000\n\
             sentinel parallel-syncs {master_name} 1\n"
        );
        if let Some(pw) = password {
            conf.push_str(&format!("sentinel auth-pass {master_name} {pw}\n"));
        }
        let sentinels = (0..3).map(|_| RedisServer::start_sentinel(&conf)).collect();
        let set = RedisSentinels {
            name: master_name.to_string(),
            data: vec![master, replica],
            sentinels,
        };
        poll(
            FORM_DEADLINE,
            "sentinels see the replica and each other",
            || {
                set.data[1]
                    .info_field("replication", "master_link_status")
                    .as_deref()
                    == Some("up")
                    && set.sentinels.iter().all(|s| {
                        let r = s
                            .try_cmd(&["SENTINEL", "REPLICAS", master_name])
                            .unwrap_or_default();
                        let o = s
                            .try_cmd(&["SENTINEL", "SENTINELS", master_name])
                            .unwrap_or_default();
                        r.contains(&set.data[1].port().to_string())
                            && set
                                .sentinels
                                .iter()
                                .filter(|x| o.contains(&x.port().to_string()))
                                .count()
                                == 2
                    })
            },
        );
        set
    }

    /// `127.0.0.1:PORT` of the three sentinels.
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::addr).collect()
    }

    /// The master's port as the first running sentinel reports it.
    pub fn master_port(&self) -> u16 {
        let s = self
            .sentinels
            .iter()
            .find(|s| s.is_running())
            .expect("a running sentinel");
        let out = s.cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.name]);
        out.lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("GET-MASTER-ADDR-BY-NAME: {out:?}"))
    }

    /// The data node (master or replica) on `port`.
    pub fn server(&self, port: u16) -> &RedisServer {
        self.data
            .iter()
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no data node on port {port}"))
    }

    /// The current master.
    pub fn master(&self) -> &RedisServer {
        self.server(self.master_port())
    }

    /// `SENTINEL FAILOVER` (graceful: the old master becomes a replica); returns once
    /// every sentinel names the new master and it says `role:master`.
    pub fn failover(&self) -> u16 {
        let old = self.master_port();
        let out = self.sentinels[0].cmd(&["SENTINEL", "FAILOVER", &self.name]);
        assert!(out.contains("OK"), "SENTINEL FAILOVER: {out}");
        self.wait_new_master(old)
    }

    /// Kills the master (SIGKILL); returns its port. [`RedisSentinels::wait_new_master`]
    /// then waits for the promotion.
    pub fn kill_master(&mut self) -> u16 {
        let old = self.master_port();
        if let Some(s) = self.data.iter_mut().find(|s| s.port() == old) {
            s.kill();
        }
        old
    }

    /// Waits until every running sentinel names a master other than `old` and that node
    /// says `role:master`; returns its port.
    pub fn wait_new_master(&self, old: u16) -> u16 {
        let mut new = 0;
        poll(FORM_DEADLINE, "sentinel failover", || {
            let ports: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .filter(|s| s.is_running())
                .map(|s| {
                    s.try_cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.name])
                        .ok()?
                        .lines()
                        .nth(1)?
                        .trim()
                        .parse()
                        .ok()
                })
                .collect();
            match ports.first() {
                Some(&Some(p)) if p != old && ports.iter().all(|&q| q == Some(p)) => {
                    new = p;
                    self.server(p).info_field("replication", "role").as_deref() == Some("master")
                }
                _ => false,
            }
        });
        new
    }
}
