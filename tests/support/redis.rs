//! The one place in the Rust code that starts `redis-server`: a real server on a free port
//! (never 6379), owned by the test, that it can kill and restart.
//!
//! Self-contained (std + `tempfile` only) so the crate's own unit tests include it too:
//! `#[path = "../../tests/support/redis.rs"] mod redis_server;` in `src/*/redis_tests.rs`.
//! Starting blocks (a few ms); async tests call it once at setup.
#![allow(dead_code)]

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

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// A real `redis-server` on a free port, owned by the test.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// Extra `redis-server` arguments, kept for [`RedisServer::restart`].
    extra: Vec<String>,
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
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "redis already running");
        assert_ne!(self.port, 6379, "never touch the machine's redis");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("redis.log"))
            .expect("redis log");
        let child = Command::new(REDIS_SERVER)
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

    /// Runs `redis-cli -p PORT args...`; returns trimmed stdout.
    pub fn try_cmd(&self, args: &[&str]) -> io::Result<String> {
        let out = Command::new("redis-cli")
            .arg("-p")
            .arg(self.port.to_string())
            .args(args)
            .stdin(Stdio::null())
            .output()?;
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
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
