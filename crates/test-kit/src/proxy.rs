//! [`Proxy`]: the real `portcullis` binary on free ports with a generated `[server]`
//! table, ready once its admin `/readyz` answers 200; and `--check` runs.

use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use super::*;

/// The `[server]` keys support writes unless the test overrides them.
fn server_table(listen: &str, admin: &str, sock: &Path, extra: &str) -> String {
    let defaults = [
        ("listen", format!("[\"{listen}\"]")),
        ("admin_listen", format!("\"{admin}\"")),
        ("threads", "2".to_string()),
        ("drain_seconds", "1".to_string()),
        ("shutdown_timeout_seconds", "5".to_string()),
        ("upgrade_sock", format!("\"{}\"", sock.display())),
    ];
    let overridden = |key: &str| {
        extra.lines().any(|l| {
            let l = l.trim_start();
            l.strip_prefix(key)
                .is_some_and(|r| r.trim_start().starts_with('='))
        })
    };
    let mut s = String::from("[server]\n");
    for (k, v) in defaults {
        if !overridden(k) {
            s.push_str(&format!("{k} = {v}\n"));
        }
    }
    s.push_str(extra);
    if !extra.ends_with('\n') {
        s.push('\n');
    }
    s
}

/// An `[[upstreams]]` table: upstream "app" with the one backend `b`.
pub fn one_upstream(b: &Backend) -> String {
    upstream_of(&[b])
}

/// An `[[upstreams]]` table: upstream "app" with `backends` in that order.
pub fn upstream_of(backends: &[&Backend]) -> String {
    upstreams(&[("app", backends)])
}

/// `[[upstreams]]` tables, one per `(name, backends)`, in that order.
pub fn upstreams(list: &[(&str, &[&Backend])]) -> String {
    list.iter()
        .map(|(name, backends)| upstream_table(name, backends, ""))
        .collect()
}

/// One `[[upstreams]]` table named `name` over `backends`, with `keys` (TOML lines such
/// as `retries = 1`) in it; ends with a blank line.
pub fn upstream_table(name: &str, backends: &[&Backend], keys: &str) -> String {
    let addrs: Vec<String> = backends
        .iter()
        .map(|b| format!("\"{}\"", b.addr()))
        .collect();
    let mut t = format!(
        "[[upstreams]]\nname = \"{name}\"\nbackends = [{}]\n",
        addrs.join(", ")
    );
    if !keys.is_empty() {
        t.push_str(keys);
        if !keys.ends_with('\n') {
            t.push('\n');
        }
    }
    t.push('\n');
    t
}

/// Upstream "app" over `backends` with `keys` in its table, and the rate limit and
/// culling off: only balancing (and retries) decide where a request goes.
pub fn balanced_app(backends: &[&Backend], keys: &str) -> String {
    format!(
        "{}[rate_limit]\nenabled = false\n[culling]\nenabled = false\n",
        upstream_table("app", backends, keys)
    )
}

/// A fleet member's config: upstream "app" over `b`, a `[redis]` table with `redis` (the
/// mode's keys, e.g. `url = "..."`), `key_prefix = prefix`, flushing every 50 ms with a
/// 200 ms timeout, shedding off, then `extra` (the `[rate_limit]` section, maybe
/// `[culling]`).
pub fn fleet_config(b: &Backend, redis: &str, prefix: &str, extra: &str) -> String {
    format!(
        "{}[redis]\n{redis}\nkey_prefix = \"{prefix}\"\nflush_interval_ms = 50\ntimeout_ms = 200\n\n\
         [shedding]\nmax_concurrency = 0\n\n{extra}\n",
        one_upstream(b)
    )
}

/// A running `portcullis` process on free ports.
pub struct Proxy {
    child: Option<Child>,
    dir: Arc<tempfile::TempDir>,
    config_path: PathBuf,
    log_path: PathBuf,
    listen: String,
    admin: String,
    server_section: String,
    /// Extra environment of every process this proxy spawns (upgrades too).
    env: Vec<(String, String)>,
}

impl Proxy {
    /// Starts with the default test `[server]` table prepended to `cfg`; waits for /readyz.
    pub fn start(cfg: &str) -> Proxy {
        Self::start_with_server("", cfg)
    }

    /// Like [`Proxy::start`]; `server_extra` lines (`key = value`) override or add `[server]` keys.
    pub fn start_with_server(server_extra: &str, cfg: &str) -> Proxy {
        let mut p = Self::spawn_with_server(server_extra, cfg);
        p.wait_ready();
        p
    }

    /// Like [`Proxy::start`] but the process gets the extra environment variables `env`
    /// (e.g. `RUST_LOG=debug` to check that even debug logs never carry an API key).
    pub fn start_with_env(cfg: &str, env: &[(&str, &str)]) -> Proxy {
        let mut p = Self::spawn_full("", cfg, env);
        p.wait_ready();
        p
    }

    /// Spawns without waiting for readiness.
    pub fn spawn_with_server(server_extra: &str, cfg: &str) -> Proxy {
        Self::spawn_full(server_extra, cfg, &[])
    }

    fn spawn_full(server_extra: &str, cfg: &str, env: &[(&str, &str)]) -> Proxy {
        let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
        let listen = format!("127.0.0.1:{}", free_port());
        let admin = format!("127.0.0.1:{}", free_port());
        let server_section = server_table(
            &listen,
            &admin,
            &dir.path().join("upgrade.sock"),
            server_extra,
        );
        let config_path = dir.path().join("portcullis.toml");
        fs::write(&config_path, format!("{server_section}\n{cfg}")).expect("write config");
        let log_path = dir.path().join("proxy-0.log");
        let mut p = Proxy {
            child: None,
            dir,
            config_path,
            log_path,
            listen,
            admin,
            server_section,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        p.child = Some(p.spawn_process(&[], "proxy-0.log"));
        p
    }

    fn spawn_process(&self, extra_args: &[&str], log_name: &str) -> Child {
        let log_path = self.dir.path().join(log_name);
        let log = fs::File::create(&log_path).expect("create proxy log");
        Command::new(&*BIN)
            .arg("-c")
            .arg(&self.config_path)
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("clone log")))
            .stderr(Stdio::from(log))
            .env("RUST_BACKTRACE", "1")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", *BIN))
    }

    /// Starts the new process of a zero-downtime upgrade (`-u`) on the same config file and
    /// ports. Does not wait for readiness (the old process still owns /readyz until it
    /// hands over); use [`Proxy::wait_ready`] or poll as the test needs.
    pub fn spawn_upgrade(&self) -> Proxy {
        let n = fs::read_dir(self.dir.path())
            .map(|d| d.count())
            .unwrap_or(0);
        let log_name = format!("proxy-upgrade-{n}.log");
        let child = self.spawn_process(&["-u"], &log_name);
        Proxy {
            child: Some(child),
            dir: self.dir.clone(),
            config_path: self.config_path.clone(),
            log_path: self.dir.path().join(log_name),
            listen: self.listen.clone(),
            admin: self.admin.clone(),
            server_section: self.server_section.clone(),
            env: self.env.clone(),
        }
    }

    /// [`Proxy::spawn_upgrade`], then waits until the new process listens on
    /// `upgrade_sock`; panics with its logs if it exits first or never listens.
    pub fn spawn_upgrade_listening(&self) -> Proxy {
        let mut new = self.spawn_upgrade();
        let sock = self.dir.path().join("upgrade.sock");
        let listening = wait_until(DEADLINE, || {
            assert!(
                new.is_running(),
                "new process exited; logs:\n{}",
                new.logs()
            );
            sock.exists()
        });
        assert!(
            listening,
            "new process never listened on {}; logs:\n{}",
            sock.display(),
            new.logs()
        );
        new
    }

    /// Waits (20 s) until admin `/readyz` answers 200; panics with the logs if the process
    /// exits or the deadline passes.
    pub fn wait_ready(&mut self) {
        let admin = self.admin.clone();
        let ok = wait_until(DEADLINE, || {
            if let Some(st) = self.try_wait() {
                panic!(
                    "portcullis exited before becoming ready ({st}); logs:\n{}",
                    self.logs()
                );
            }
            matches!(
                Conn::open_with_timeout(&admin, Duration::from_secs(2))
                    .and_then(|mut c| c.request("GET", "/readyz", &[], b"")),
                Ok(r) if r.status == 200
            )
        });
        if !ok {
            panic!(
                "portcullis not ready on admin {admin} within {DEADLINE:?}; logs:\n{}",
                self.logs()
            );
        }
        // Readiness should imply the proxy listener accepts (admin.rs tests that strictly);
        // here we only make sure every other test starts against a listening proxy.
        let listen: std::net::SocketAddr = self.listen.parse().expect("listen addr");
        let ok = wait_until(DEADLINE, || {
            TcpStream::connect_timeout(&listen, Duration::from_secs(2)).is_ok()
        });
        if !ok {
            panic!(
                "portcullis ready but {listen} never accepted; logs:\n{}",
                self.logs()
            );
        }
    }

    /// Proxy listener address ("127.0.0.1:port").
    pub fn addr(&self) -> String {
        self.listen.clone()
    }

    pub fn admin_addr(&self) -> String {
        self.admin.clone()
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Rewrites the config file, keeping the generated `[server]` table (for SIGHUP reload).
    pub fn rewrite_config(&self, cfg: &str) {
        let tmp = self.dir.path().join("portcullis.toml.tmp");
        fs::write(&tmp, format!("{}\n{cfg}", self.server_section)).expect("write config");
        fs::rename(&tmp, &self.config_path).expect("rename config");
    }

    /// Writes the config file verbatim (no `[server]` table added).
    pub fn rewrite_config_raw(&self, text: &str) {
        let tmp = self.dir.path().join("portcullis.toml.tmp");
        fs::write(&tmp, text).expect("write config");
        fs::rename(&tmp, &self.config_path).expect("rename config");
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).expect("proxy child")
    }

    /// Sends a signal by name (`TERM`, `QUIT`, `HUP`, `INT`, ...) via `kill -s`.
    pub fn signal(&self, name: &str) {
        let st = Command::new("kill")
            .args(["-s", name, &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -s {name} {} failed", self.pid());
    }

    /// Non-blocking exit check.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn is_running(&mut self) -> bool {
        self.child.is_some() && self.try_wait().is_none()
    }

    /// Polls until the process exits or `timeout` passes.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let mut status = None;
        wait_until(timeout, || {
            status = self.try_wait();
            status.is_some()
        });
        status
    }

    /// [`Proxy::wait_exit`] that panics (with `what` and the logs) when it does not exit.
    pub fn expect_exit(&mut self, timeout: Duration, what: &str) -> ExitStatus {
        self.wait_exit(timeout)
            .unwrap_or_else(|| panic!("{what} did not exit; logs:\n{}", self.logs()))
    }

    /// Stderr+stdout of the process so far.
    pub fn logs(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_else(|e| format!("<no log: {e}>"))
    }

    /// GET on the proxy listener.
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Resp {
        get(&self.listen, path, headers)
    }

    /// GET on the admin listener.
    pub fn admin_get(&self, path: &str) -> Resp {
        get(&self.admin, path, &[])
    }

    pub fn metrics(&self) -> String {
        let r = self.admin_get("/metrics");
        assert_eq!(r.status, 200, "/metrics status");
        r.body_str()
    }

    /// `metric_value` on a fresh scrape.
    pub fn metric(&self, selector: &str) -> Option<f64> {
        metric_value(&self.metrics(), selector)
    }

    pub fn status_json(&self) -> serde_json::Value {
        let r = self.admin_get("/status");
        assert_eq!(r.status, 200, "/status status; body {}", r.body_str());
        serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("/status is not JSON ({e}): {}", r.body_str()))
    }

    /// Waits (20 s) until every proxy in `fleet` reports `fleet.len()` instances sharing its
    /// rate-limit store (`/status` `rate_limit.instances`). Until then an instance has not
    /// heard of the others and admits a whole limit on its own (by design: a new instance
    /// joins at its next flush), so a test of the fleet-wide limit starts after this.
    pub fn wait_fleet(fleet: &[&Proxy]) {
        let n = fleet.len() as u64;
        let ok = wait_until(DEADLINE, || {
            fleet
                .iter()
                .all(|p| p.status_json()["rate_limit"]["instances"].as_u64() == Some(n))
        });
        if !ok {
            let seen: Vec<_> = fleet
                .iter()
                .map(|p| p.status_json()["rate_limit"]["instances"].clone())
                .collect();
            panic!("the {n} instances never all saw each other: {seen:?}");
        }
    }

    /// Kills the process now (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if thread::panicking() {
            let logs = self.logs();
            let tail: String = {
                let lines: Vec<&str> = logs.lines().collect();
                let from = lines.len().saturating_sub(80);
                lines[from..].join("\n")
            };
            eprintln!(
                "---- portcullis log ({}; last 80 lines) ----\n{tail}\n---- end log ----",
                self.log_path.display()
            );
        }
        self.kill();
    }
}

// --check

/// Runs `portcullis -c <tempfile> --check` on `toml_text`.
/// Returns (exit code, stdout, stderr, path of the file).
pub fn check_config(toml_text: &str) -> (i32, String, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("check.toml");
    fs::write(&path, toml_text).expect("write config");
    let (code, out, err) = check_config_file(&path);
    (code, out, err, path.display().to_string())
}

/// Runs `portcullis -c <path> --check`.
pub fn check_config_file(path: &Path) -> (i32, String, String) {
    let out = Command::new(&*BIN)
        .arg("-c")
        .arg(path)
        .arg("--check")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", *BIN));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
