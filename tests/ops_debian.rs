//! Operating it the Debian way, end to end with the real binary: `portcullis ctl reload`
//! (what the systemd unit's `ExecReload` runs) applies a good file and refuses a bad one
//! with exit 1 and the error, the running config staying; `<N>` priority prefixes under
//! journald; `portcullis_build_info` and the `process_*` metrics; every metric family
//! present from start.

use portcullis_test_kit as support;

use std::fs;
use std::process::{Child, Command, Stdio};
use support::*;

/// What one `portcullis ctl` run gave.
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// `portcullis ctl ARGS`, none of the caller's `PORTCULLIS_*` variables.
fn ctl(args: &[&str]) -> Out {
    let mut cmd = Command::new(&*BIN);
    cmd.arg("ctl").args(args);
    for var in [
        "PORTCULLIS_ADMIN",
        "PORTCULLIS_TOKEN_FILE",
        "PORTCULLIS_CONF",
        "HTTP_PROXY",
        "http_proxy",
    ] {
        cmd.env_remove(var);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run {} ctl: {e}", *BIN));
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Upstream "app" over `b`, gates off.
fn app(b: &Backend) -> String {
    format!(
        "{}[rate_limit]\nenabled = false\n[culling]\nenabled = false\n",
        one_upstream(b)
    )
}

fn served_by(p: &Proxy) -> String {
    let r = p.get("/", &[]);
    assert_eq!(r.status, 200, "{}", r.body_str());
    r.header("x-backend").unwrap_or_default().to_string()
}

#[test]
fn ctl_reload_applies_a_good_file_and_refuses_a_bad_one_keeping_the_running_config() {
    let (b1, b2) = (Backend::start("b1"), Backend::start("b2"));
    let p = Proxy::start_with_server("admin_token = \"s3cret-reload\"\n", &app(&b1));
    let admin = format!("http://{}", p.admin_addr());
    let conf = p.config_path().display().to_string();
    assert_eq!(served_by(&p), "b1");

    // a good file: applied once ctl returns, exit 0
    p.rewrite_config(&app(&b2));
    let out = ctl(&["--conf", &conf, "reload"]);
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.contains("reloaded"), "{out}");
    assert_eq!(
        served_by(&p),
        "b2",
        "ctl reload returned before the file applied"
    );

    // a bad value: exit 1, the file, line, key and why on stderr; b2 still serves
    p.rewrite_config(&format!(
        "{}[rate_limit]\nenabled = true\nlimit = 0\n[culling]\nenabled = false\n",
        one_upstream(&b1)
    ));
    let out = ctl(&["--conf", &conf, "reload"]);
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.stderr
            .starts_with("reload refused, the running configuration stays: "),
        "{out}"
    );
    for part in [conf.as_str(), "rate_limit.limit"] {
        assert!(out.stderr.contains(part), "{part} not in {out}");
    }
    assert!(!out.stderr.contains("s3cret-reload"), "{out}");
    assert_eq!(served_by(&p), "b2");

    // not even TOML: ctl cannot read the admin address from it, says why itself
    p.rewrite_config("[server\nlisten = ");
    let out = ctl(&["--conf", &conf, "reload"]);
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.stderr
            .starts_with("reload refused, the running configuration stays: ")
            && out.stderr.contains(&conf),
        "{out}"
    );
    assert_eq!(served_by(&p), "b2");
    // ... and the proxy itself, asked at its address, refuses it too
    let token = p.dir().join("token");
    fs::write(&token, "s3cret-reload\n").expect("token file");
    let out = ctl(&[
        "--admin",
        &admin,
        "--token-file",
        &token.display().to_string(),
        "reload",
    ]);
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("reload refused"), "{out}");
    assert_eq!(served_by(&p), "b2");

    // the admin needs its token: without one the reload fails (exit 1, 401 named)
    p.rewrite_config(&app(&b1));
    let out = ctl(&["--admin", &admin, "reload"]);
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("401"), "{out}");
    assert_eq!(served_by(&p), "b2");
    // with it (read from the file by --conf) the good file applies
    let out = ctl(&["--conf", &conf, "reload"]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(served_by(&p), "b1");

    // both outcomes counted
    assert_eq!(
        p.metric("portcullis_config_reloads_total{result=\"ok\"}"),
        Some(2.0)
    );
    assert_eq!(
        p.metric("portcullis_config_reloads_total{result=\"error\"}"),
        Some(2.0)
    );
    // nothing listens: exit 1 naming the address
    let out = ctl(&[
        "--admin",
        &format!("http://127.0.0.1:{}", free_port()),
        "reload",
    ]);
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("cannot reach the admin API"), "{out}");
}

/// The proxy on `cfg` with stderr to a file whose device and inode `JOURNAL_STREAM`
/// names when `journal`, as systemd sets it for a unit logging to the journal.
fn start_logging_to(dir: &std::path::Path, cfg: &str, journal: bool) -> (Child, String) {
    use std::os::unix::fs::MetadataExt;
    let admin = format!("127.0.0.1:{}", free_port());
    let conf = dir.join(format!("p-{journal}.toml"));
    fs::write(
        &conf,
        format!(
            "[server]\nlisten = [\"127.0.0.1:{}\"]\nadmin_listen = \"{admin}\"\n\
             drain_seconds = 0\nshutdown_timeout_seconds = 1\n\
             upgrade_sock = \"{}\"\n\n[log]\nformat = \"json\"\n\n{cfg}",
            free_port(),
            dir.join(format!("u-{journal}.sock")).display()
        ),
    )
    .expect("config");
    let log = dir.join(format!("stderr-{journal}.log"));
    let f = fs::File::create(&log).expect("log");
    let m = f.metadata().expect("stat");
    let mut cmd = Command::new(&*BIN);
    cmd.arg("-c")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(f))
        .env_remove("JOURNAL_STREAM");
    if journal {
        cmd.env("JOURNAL_STREAM", format!("{}:{}", m.dev(), m.ino()));
    }
    let child = cmd.spawn().expect("spawn");
    let ready = wait_until(
        DEADLINE,
        || matches!(try_get(&admin, "/readyz", &[]), Ok(r) if r.status == 200),
    );
    assert!(
        ready,
        "not ready: {}",
        fs::read_to_string(&log).unwrap_or_default()
    );
    (child, log.display().to_string())
}

#[test]
fn under_journald_each_process_log_line_starts_with_its_priority() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = Backend::start("b");
    // start-up lines are info; a SIGHUP with a bad file below logs an error
    let cfg = app(&b);
    let (mut journal, jlog) = start_logging_to(dir.path(), &cfg, true);
    let (mut plain, plog) = start_logging_to(dir.path(), &cfg, false);
    for (child, log) in [(&journal, &jlog), (&plain, &plog)] {
        let path = log.replace("stderr-", "p-").replace(".log", ".toml");
        let conf = fs::read_to_string(&path).expect("config");
        fs::write(
            &path,
            conf.replace("enabled = false\n[culling]", "limit = 0\n[culling]"),
        )
        .expect("bad config");
        let _ = Command::new("kill")
            .args(["-HUP", &child.id().to_string()])
            .status();
    }
    let has_error = |log: &str| {
        fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains("\"ERROR\""))
    };
    eventually(
        DEADLINE,
        || "the reload error logged".into(),
        || has_error(&jlog) && has_error(&plog),
    );
    let jtext = fs::read_to_string(&jlog).unwrap_or_default();
    let mut seen = (false, false);
    for line in jtext.lines() {
        let (prefix, json) = line.split_at(line.find('{').unwrap_or(0));
        let v: serde_json::Value =
            serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {line}"));
        let want = match v["level"].as_str() {
            Some("ERROR") => "<3>",
            Some("WARN") => "<4>",
            Some("INFO") => "<6>",
            Some("DEBUG") | Some("TRACE") => "<7>",
            other => panic!("level {other:?} in {line}"),
        };
        assert_eq!(prefix, want, "{line}");
        seen.0 |= want == "<3>";
        seen.1 |= want == "<6>";
    }
    assert_eq!(seen, (true, true), "{jtext}");
    // not under journald: no prefix, each line JSON as it was
    let ptext = fs::read_to_string(&plog).unwrap_or_default();
    assert!(
        ptext.lines().all(|l| l.starts_with('{')),
        "a prefix without JOURNAL_STREAM:\n{ptext}"
    );
    for c in [&mut journal, &mut plain] {
        let _ = c.kill();
        let _ = c.wait();
    }
}

#[test]
fn build_info_and_process_metrics_are_exposed() {
    let b = Backend::start("b");
    let p = Proxy::start(&app(&b));
    let text = p.metrics();
    let info = text
        .lines()
        .find(|l| l.starts_with("portcullis_build_info{"))
        .unwrap_or_else(|| panic!("no portcullis_build_info in\n{text}"));
    assert!(info.ends_with("} 1"), "{info}");
    assert!(
        info.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))),
        "{info}"
    );
    let commit = info
        .split("commit=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap_or_default();
    assert!(!commit.is_empty(), "{info}");
    let value = |name: &str| {
        p.metric(name)
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    let start = value("process_start_time_seconds");
    assert!(
        start <= now + 2.0 && start > now - 300.0,
        "{start} vs {now}"
    );
    assert!(value("process_resident_memory_bytes") > 1e6);
    assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
    let fds = value("process_open_fds");
    assert!(fds >= 5.0 && value("process_max_fds") >= fds);
    // CPU time grows with work
    let cpu0 = value("process_cpu_seconds_total");
    let deadline = std::time::Instant::now() + DEADLINE;
    while value("process_cpu_seconds_total") <= cpu0 && std::time::Instant::now() < deadline {
        for _ in 0..200 {
            p.get("/", &[]);
        }
    }
    assert!(value("process_cpu_seconds_total") > cpu0);
}

/// The metric family names a text names: `portcullis_...` words, less the suffixes of a
/// histogram's series.
fn families_named_in(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("portcullis_") {
        let start = i + at;
        let before_ok =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start;
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'_')
        {
            end += 1;
        }
        let name = text[start..end].trim_end_matches('_');
        if before_ok && name.len() > "portcullis_".len() {
            let name = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            out.insert(name.to_string());
        }
        i = end.max(start + 1);
    }
    out
}

#[test]
fn every_documented_metric_family_is_present_on_a_fresh_proxy() {
    let b = Backend::start("b");
    // an upstream with retries and an active health check, the in-process store: a
    // proxy that has served nothing yet
    let p = Proxy::start(&format!(
        "{}[culling]\nenabled = true\n",
        upstream_table(
            "app",
            &[&b],
            "retries = 1\nhealth_check_path = \"/health\"\nhealth_check_interval_seconds = 60\n"
        )
    ));
    let text = p.metrics();
    let present: std::collections::BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    // every family with at least one series
    let with_series: std::collections::BTreeSet<String> = present
        .iter()
        .filter(|f| {
            text.lines().any(|l| {
                !l.starts_with('#')
                    && (l.starts_with(&format!("{f} "))
                        || l.starts_with(&format!("{f}{{"))
                        || l.starts_with(&format!("{f}_bucket{{"))
                        || l.starts_with(&format!("{f}_count")))
            })
        })
        .cloned()
        .collect();
    let docs =
        fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md");
    let named = families_named_in(&docs);
    // names in the README that are not metric families (crates), and the families of
    // features this config leaves off, present from start once configured: tenants
    // (and their blame), bearer JWT keys, shadow mode
    let not_metrics = [
        "portcullis_test_kit",
        "portcullis_policy",
        "portcullis_store",
        "portcullis_tenant_requests_total",
        "portcullis_tenant_quota_used",
        "portcullis_blamed_total",
        "portcullis_ratelimit_jwt_refusals_total",
        "portcullis_shadow_refusals_total",
    ];
    let missing: Vec<&String> = named
        .iter()
        .filter(|n| !not_metrics.contains(&n.as_str()))
        .filter(|n| !with_series.contains(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "families named in README.md without a series on a fresh proxy: {missing:?}\n{text}"
    );
    for f in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
    ] {
        assert!(with_series.contains(f), "{f}");
    }
}
