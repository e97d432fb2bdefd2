//! The one place in the Rust code that starts `redis-server`: a real server on a free port
//! (never 6379), owned by the test, that it can kill and restart.
//!
//! The library's own unit tests (`src/*/redis_tests.rs`) use it too.
//! Starting blocks (a few ms); async tests call it once at setup. [`RedisCluster`]
//! (`cluster.rs`) and [`RedisSentinels`] (`sentinel.rs`) are made of such servers.

use std::fs;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

mod cluster;
mod sentinel;
pub use cluster::{RedisCluster, CLUSTER_NODE_TIMEOUT_MS};
pub use sentinel::RedisSentinels;

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
