//! `portcullis ctl` end to end: the real binary as the client of a real proxy's admin API
//! (CONTRACT §12), real backends. Exit 0 when done, 1 on a refusal (the reason printed) or
//! a failure (the message names the URL and the status), 2 on a usage error; the token
//! comes from a file and is never printed.

use portcullis_test_kit as support;

use serde_json::Value;
use std::process::Command;
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

/// `portcullis ctl ARGS` with `env` and none of the caller's `PORTCULLIS_*` or proxy
/// variables. The client's own 10 s timeout bounds it.
fn ctl(args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut cmd = Command::new(&*BIN);
    cmd.arg("ctl").args(args);
    for var in [
        "PORTCULLIS_ADMIN",
        "PORTCULLIS_TOKEN_FILE",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run {} ctl: {e}", *BIN));
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `ctl --admin http://<p's admin> ARGS`.
fn ctl_at(p: &Proxy, args: &[&str]) -> Out {
    let admin = format!("http://{}", p.admin_addr());
    let mut all = vec!["--admin", admin.as_str()];
    all.extend_from_slice(args);
    ctl(&all, &[])
}

/// Upstream "app" over `backends`, culling on at `max_culled_fraction = fraction`, the
/// in-process store.
fn config(backends: &[&Backend], fraction: f64) -> String {
    format!(
        "{}[rate_limit]\nenabled = false\n\n[shedding]\nmax_concurrency = 0\n\n\
         [culling]\nenabled = true\nwindow_seconds = 10\nerror_threshold = 5\n\
         check_interval_seconds = 1\ntokens = 10\ntoken_period_seconds = 600\n\
         max_culled_fraction = {fraction:?}\ncooldown_seconds = 60\n",
        upstream_table("app", backends, "retries = 0\nconnect_timeout_ms = 500\n")
    )
}

/// The line of `ctl backends` about `addr`.
fn row<'a>(table: &'a str, addr: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(addr))
        .unwrap_or_else(|| panic!("no row for {addr} in\n{table}"))
}

/// `ctl backends --json`, the entry of `addr`.
fn entry(p: &Proxy, addr: &str) -> Value {
    let out = ctl_at(p, &["backends", "--json"]);
    assert_eq!(out.code, 0, "{out}");
    let all: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    all.as_array()
        .and_then(|a| a.iter().find(|b| b["address"] == addr).cloned())
        .unwrap_or_else(|| panic!("no {addr} in {out}"))
}

#[test]
fn ctl_drains_refuses_readies_and_weights_a_backend() {
    let (b1, b2) = (Backend::start("b1"), Backend::start("b2"));
    let (a1, a2) = (b1.addr(), b2.addr());
    let p = Proxy::start(&config(&[&b1, &b2], 0.5));

    // backends: a table with a header and a row per backend, all up
    let out = ctl_at(&p, &["backends"]);
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stdout.starts_with("UPSTREAM  ADDRESS"),
        "{}",
        out.stdout
    );
    for a in [&a1, &a2] {
        assert!(row(&out.stdout, a).starts_with("app "), "{out}");
        assert_eq!(row(&out.stdout, a).split_whitespace().nth(2), Some("up"));
    }

    // drain with a reason and a lease
    let out = ctl_at(
        &p,
        &[
            "drain",
            "app",
            &a1,
            "--reason",
            "deploy v2",
            "--seconds",
            "600",
        ],
    );
    assert_eq!(out.code, 0, "{out}");
    assert!(row(&out.stdout, &a1).contains("draining"), "{out}");
    let out = ctl_at(&p, &["backends"]);
    assert_eq!(out.code, 0, "{out}");
    let line = row(&out.stdout, &a1);
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        (cols[2], cols[4], cols[5]),
        ("draining", "manual", "admin"),
        "{line}"
    );
    assert!(line.contains("deploy v2"), "{line}");
    assert!(
        line.ends_with("in 10m00s") || line.ends_with("in 9m59s") || line.ends_with("in 9m58s"),
        "{line}"
    );
    // --json: the API's own answer
    let e = entry(&p, &a1);
    assert_eq!(
        (&e["state"], &e["reason"]),
        (&"draining".into(), &"deploy v2".into())
    );
    assert!(e["until"].as_u64().is_some(), "{e}");
    // traffic goes to b2 alone
    for _ in 0..4 {
        assert_eq!(p.get("/x", &[]).header("x-backend"), Some("b2"));
    }

    // the other one too: refused by the budget, exit 1 with the answer's reason
    let out = ctl_at(
        &p,
        &["--json", "drain", "app", &a2, "--reason", "disk swap"],
    );
    assert_eq!(out.code, 1, "{out}");
    let refusal: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(refusal["granted"], false, "{refusal}");
    let reason = refusal["reason"].as_str().unwrap_or_default().to_string();
    let policy = refusal["policy"].as_str().unwrap_or_default().to_string();
    assert!(!reason.is_empty() && !policy.is_empty(), "{refusal}");
    let out = ctl_at(&p, &["drain", "app", &a2, "--reason", "disk swap"]);
    assert_eq!(out.code, 1, "{out}");
    assert_eq!(out.stdout, "", "{out}");
    assert!(out.stderr.starts_with("refused"), "{out}");
    assert!(
        out.stderr.trim_end().ends_with(&format!(": {reason}")),
        "{out}"
    );
    assert!(out.stderr.contains(&policy), "{out}");
    assert_eq!(entry(&p, &a2)["state"], "up");

    // ready: back in rotation, the record gone
    let out = ctl_at(&p, &["ready", "app", &a1, "--reason", "deployed"]);
    assert_eq!(out.code, 0, "{out}");
    let e = entry(&p, &a1);
    assert_eq!(
        (&e["state"], &e["reason"]),
        (&"up".into(), &Value::Null),
        "{e}"
    );

    // weight: set on the backend, shown in the table
    let out = ctl_at(&p, &["weight", "app", &a2, "5", "--reason", "canary"]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(entry(&p, &a2)["weight"], 5);
    let out = ctl_at(&p, &["backends"]);
    let cols: Vec<String> = row(&out.stdout, &a2)
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!((cols[2].as_str(), cols[3].as_str()), ("up", "5"), "{out}");

    // an unknown backend: exit 1, the URL (address percent-encoded) and the 404 named
    let out = ctl_at(&p, &["drain", "app", "10.9.9.9:1", "--reason", "x"]);
    assert_eq!(out.code, 1, "{out}");
    let url = format!(
        "POST http://{}/backends/app/10.9.9.9%3A1/drain: 404 Not Found",
        p.admin_addr()
    );
    assert!(out.stderr.starts_with(&format!("error: {url}")), "{out}");
    assert!(out.stderr.contains("10.9.9.9:1"), "{out}");
    // the API's answer to a bad body reaches the operator (no --reason is a usage error,
    // a whitespace one the server's 400)
    let out = ctl_at(&p, &["maint", "app", &a2, "--reason", " "]);
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("400 Bad Request: reason:"), "{out}");

    // the IPv6 form of an address reaches the API encoded: not a backend here, so a 404
    // that names the decoded address
    let out = ctl_at(&p, &["ready", "app", "[::1]:80"]);
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.stderr.contains("%5B%3A%3A1%5D%3A80") && out.stderr.contains("[::1]:80"),
        "{out}"
    );
}

#[test]
fn ctl_sends_the_token_from_a_file_and_never_prints_it() {
    let (b1, b2) = (Backend::start("b1"), Backend::start("b2"));
    let a1 = b1.addr();
    let p = Proxy::start_with_server(
        "admin_token = \"root-tok-1\"\nadmin_tokens = { deployer = \"deploy-tok-2\" }",
        &config(&[&b1, &b2], 0.5),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("deployer.token");
    std::fs::write(&good, "deploy-tok-2\n").expect("write token");
    let bad = dir.path().join("bad.token");
    std::fs::write(&bad, "wrong-tok-3\n").expect("write token");
    let (good_s, bad_s) = (good.display().to_string(), bad.display().to_string());
    let mut outs = Vec::new();

    // GETs need no token
    let out = ctl_at(&p, &["backends"]);
    assert_eq!(out.code, 0, "{out}");
    outs.push(out);
    // no token: 401, and what to do about it
    let out = ctl_at(&p, &["drain", "app", &a1, "--reason", "x"]);
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("401 Unauthorized"), "{out}");
    assert!(out.stderr.contains("--token-file"), "{out}");
    outs.push(out);
    // a wrong one: 401, the file named
    let out = ctl_at(
        &p,
        &["--token-file", &bad_s, "drain", "app", &a1, "--reason", "x"],
    );
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("401 Unauthorized"), "{out}");
    assert!(
        out.stderr
            .contains(&format!("the token in {bad_s} was refused")),
        "{out}"
    );
    outs.push(out);
    assert_eq!(entry(&p, &a1)["state"], "up");

    // the named token, from --token-file: applied, `by` is its name
    let out = ctl_at(
        &p,
        &[
            "--token-file",
            &good_s,
            "drain",
            "app",
            &a1,
            "--reason",
            "deploy",
        ],
    );
    assert_eq!(out.code, 0, "{out}");
    outs.push(out);
    let out = ctl_at(&p, &["backends"]);
    let cols: Vec<String> = row(&out.stdout, &a1)
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(
        (cols[2].as_str(), cols[5].as_str(), cols[6].as_str()),
        ("draining", "deployer", "deploy"),
        "{out}"
    );
    outs.push(out);
    // from PORTCULLIS_TOKEN_FILE, and the admin URL from PORTCULLIS_ADMIN
    let admin = format!("http://{}/", p.admin_addr());
    let out = ctl(
        &["ready", "app", &a1],
        &[
            ("PORTCULLIS_ADMIN", &admin),
            ("PORTCULLIS_TOKEN_FILE", &good_s),
        ],
    );
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(entry(&p, &a1)["state"], "up");
    outs.push(out);
    // a missing token file is a usage error that names it
    let missing = dir.path().join("missing.token").display().to_string();
    let out = ctl_at(&p, &["--token-file", &missing, "backends"]);
    assert_eq!(out.code, 2, "{out}");
    assert!(out.stderr.contains(&missing), "{out}");
    outs.push(out);

    for out in &outs {
        for secret in ["deploy-tok-2", "wrong-tok-3", "root-tok-1"] {
            assert!(
                !out.stdout.contains(secret) && !out.stderr.contains(secret),
                "{secret} printed: {out}"
            );
        }
    }
    // the proxy journaled who did it
    assert!(p
        .logs()
        .lines()
        .any(|l| l.contains("\"admin_action\"") && l.contains("deployer") && l.contains("deploy")));
}

#[test]
fn ctl_names_an_unreachable_admin_api_and_usage_errors_exit_2() {
    // nothing listens there
    let port = free_port();
    let admin = format!("http://127.0.0.1:{port}");
    let out = ctl(&["--admin", &admin, "backends"], &[]);
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.stderr.starts_with(&format!(
            "error: cannot reach the admin API at {admin}/backends: "
        )),
        "{out}"
    );
    assert!(
        out.stderr.to_lowercase().contains("connection refused"),
        "{out}"
    );
    // PORTCULLIS_ADMIN, without a scheme
    let out = ctl(
        &["claims"],
        &[("PORTCULLIS_ADMIN", &format!("127.0.0.1:{port}"))],
    );
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains(&format!("{admin}/claims")), "{out}");

    for (args, says) in [
        (&["drain", "app", "h:1"][..], "--reason"),
        (&["frobnicate"][..], "frobnicate"),
        (&["weight", "app", "h:1", "heavy"][..], "heavy"),
        (&["claim", "app", "h:1", "--reason", "r"][..], "--seconds"),
        (&["--admin", "ftp://h", "backends"][..], "ftp://h"),
        (&[][..], "Usage"),
    ] {
        let out = ctl(args, &[]);
        assert_eq!(out.code, 2, "{args:?}: {out}");
        assert!(out.stderr.contains(says), "{args:?}: {out}");
    }
    // help is not an error
    let out = ctl(&["--help"], &[]);
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stdout.contains("drain") && out.stdout.contains("Exit status"),
        "{out}"
    );
    // and the proxy's own flags are unchanged
    let out = Command::new(&*BIN)
        .args(["--check", "ctl", "backends"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn ctl_claims_audits_and_releases() {
    let bs: Vec<Backend> = (1..=4).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = bs.iter().collect();
    let p = Proxy::start(&config(&refs, 0.25));
    let (a1, a2) = (bs[0].addr(), bs[1].addr());
    // a dry run: exit 0, nothing claimed
    let out = ctl_at(
        &p,
        &[
            "claim",
            "app",
            &a1,
            "--seconds",
            "600",
            "--reason",
            "deploy",
            "--dry-run",
        ],
    );
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(entry(&p, &a1)["state"], "up");
    // granted: exit 0 and the id printed
    let out = ctl_at(
        &p,
        &[
            "--json",
            "claim",
            "app",
            &a1,
            "--seconds",
            "600",
            "--reason",
            "deploy",
        ],
    );
    assert_eq!(out.code, 0, "{out}");
    let granted: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    let id = granted["id"].as_str().unwrap_or_default().to_string();
    assert_eq!(id.len(), 16, "{out}");
    assert_eq!(entry(&p, &a1)["state"], "claimed");
    // the audit: the fraction is full, so every other backend is refused by it
    let out = ctl_at(&p, &["feasible", "app"]);
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stdout.contains(&a2) && out.stdout.contains("fraction"),
        "{out}"
    );
    // a refusal: exit 1 with the reason
    let out = ctl_at(
        &p,
        &[
            "claim",
            "app",
            &a2,
            "--seconds",
            "600",
            "--reason",
            "deploy",
        ],
    );
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("fraction"), "{out}");
    let out = ctl_at(&p, &["claims"]);
    assert!(out.code == 0 && out.stdout.contains(&id), "{out}");
    // released
    let out = ctl_at(&p, &["release", &id]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(entry(&p, &a1)["state"], "up");
    assert_eq!(
        ctl_at(&p, &["release", &id]).code,
        1,
        "a second release finds nothing"
    );
}
