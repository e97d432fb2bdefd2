//! Configuration from the environment and from files (CONTRACT §13), with the real binary:
//! `${NAME}`, `${NAME:-default}` and `$$` in string values (a running proxy, and `--check`
//! naming the key path and the variable of an unset one), `[server] admin_token_file` and
//! `[redis] password_file` (a real `redis-server` with `--requirepass`).

use portcullis_test_kit as support;

use std::path::Path;
use std::process::{Command, Stdio};
use support::*;

/// `portcullis -c <text in a temp file> --check` with `env` set (and `unset` removed).
/// Returns (exit code, stderr, file path).
fn check_with_env(text: &str, env: &[(&str, &str)], unset: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("env.toml");
    std::fs::write(&path, text).expect("write config");
    let mut cmd = Command::new(&*BIN);
    cmd.arg("-c").arg(&path).arg("--check").stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    for k in unset {
        cmd.env_remove(k);
    }
    let out = cmd.output().expect("run portcullis --check");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        path.display().to_string(),
    )
}

const BASE: &str = "[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\"]\n";

#[test]
fn env_set_default_and_literal_dollar_reach_the_running_proxy() {
    let b = Backend::start("app");
    let cfg = r#"
[[upstreams]]
name = "app"
backends = ["${PCX_TEST_BACKEND}"]

[[routes]]
path_prefix = "${PCX_TEST_PREFIX:-/api}"
upstream = "app"
response_headers_set = { "x-env" = "${PCX_TEST_VALUE}", "x-default" = "${PCX_TEST_UNSET:-fallback}", "x-price" = "5$$ or $${PCX_TEST_VALUE}" }

[rate_limit]
enabled = false
"#;
    let p = Proxy::start_with_env(
        cfg,
        &[
            ("PCX_TEST_BACKEND", &b.addr()),
            // A value is never expanded again: `$$` and `${…}` in it stay as they are.
            ("PCX_TEST_VALUE", "v-$${PCX_TEST_BACKEND}"),
        ],
    );
    let r = p.get("/api/x", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(b.requests(), 1, "the backend named by the environment");
    assert_eq!(r.header("x-env"), Some("v-$${PCX_TEST_BACKEND}"));
    assert_eq!(r.header("x-default"), Some("fallback"));
    assert_eq!(r.header("x-price"), Some("5$ or ${PCX_TEST_VALUE}"));
    // The default prefix took effect: the route's headers are set only under /api.
    assert_eq!(p.get("/other", &[]).header("x-default"), None);
}

#[test]
fn check_expands_the_environment_and_names_an_unset_variable() {
    // Set: the value is what validation sees (a bad key source is refused as such).
    let cfg = format!("{BASE}[rate_limit]\nkey = \"${{PCX_TEST_RL_KEY}}\"\n");
    let (code, err, _) = check_with_env(&cfg, &[("PCX_TEST_RL_KEY", "header:x-key")], &[]);
    assert_eq!(code, 0, "{err}");
    // The value is not shown: the variable that gave it is.
    let (code, err, _) = check_with_env(&cfg, &[("PCX_TEST_RL_KEY", "nonsense")], &[]);
    assert_eq!(code, 2);
    assert!(
        err.contains("rate_limit.key") && err.contains("\"${PCX_TEST_RL_KEY}\""),
        "{err}"
    );
    assert!(!err.contains("nonsense"), "{err}");
    // Default.
    let cfg = format!("{BASE}[rate_limit]\nkey = \"${{PCX_TEST_UNSET:-bearer}}\"\n");
    let (code, err, _) = check_with_env(&cfg, &[], &["PCX_TEST_UNSET"]);
    assert_eq!(code, 0, "{err}");

    // Unset, no default: exit 2, the file, line:column, key path and variable.
    let cfg =
        "[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\", \"${PCX_TEST_UNSET}\"]\n";
    let (code, err, path) = check_with_env(cfg, &[], &["PCX_TEST_UNSET"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("error: {path}:3:31: upstreams[0].backends[1]: ")),
        "{err}"
    );
    assert!(
        err.contains("environment variable PCX_TEST_UNSET is not set"),
        "{err}"
    );

    // Keys and comments are never expanded; `$$` is a literal `$`.
    let cfg = format!(
        "{BASE}# ${{PCX_TEST_UNSET}} in a comment\n[rate_limit.keys]\n\"${{PCX_TEST_UNSET}}$$\" = 5\n"
    );
    let (code, err, _) = check_with_env(&cfg, &[], &["PCX_TEST_UNSET"]);
    assert_eq!(code, 0, "{err}");

    // Malformed.
    let cfg = format!("{BASE}[server]\nupgrade_sock = \"/tmp/${{1X}}.sock\"\n");
    let (code, err, _) = check_with_env(&cfg, &[], &[]);
    assert_eq!(code, 2);
    assert!(
        err.contains("server.upgrade_sock") && err.contains("${1X}"),
        "{err}"
    );

    // A Redis password from the environment never appears in an error.
    let cfg = format!("{BASE}[redis]\nurl = \"redis://:${{PCX_TEST_PW}}@127.0.0.1:notaport\"\n");
    let (code, err, _) = check_with_env(&cfg, &[("PCX_TEST_PW", "env-secret-8")], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("redis.url"), "{err}");
    assert!(!err.contains("env-secret-8"), "the password leaked: {err}");
}

fn write(dir: &Path, name: &str, content: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).expect("write");
    path.display().to_string()
}

#[test]
fn admin_token_file_wins_over_admin_token() {
    let b = Backend::start("app");
    let dir = tempfile::tempdir().expect("tempdir");
    let token = write(dir.path(), "token", "file-token-5\n");
    let p = Proxy::start_with_server(
        &format!("admin_token = \"inline-token\"\nadmin_token_file = \"{token}\""),
        &one_upstream(&b),
    );
    let reload = |t: &str| {
        post(
            &p.admin_addr(),
            "/reload",
            &[("authorization", &format!("Bearer {t}"))],
            b"",
        )
        .status
    };
    assert_eq!(
        reload("file-token-5"),
        200,
        "the file's token, newline trimmed"
    );
    assert_eq!(reload("inline-token"), 401, "the file wins");

    // Missing, empty or a directory: a config error naming the key.
    for (what, path) in [
        ("missing", dir.path().join("nope").display().to_string()),
        ("empty", write(dir.path(), "empty", "\n")),
        ("a directory", dir.path().display().to_string()),
    ] {
        let cfg = format!("[server]\nadmin_token_file = \"{path}\"\n{BASE}");
        let (code, _, err, _) = check_config(&cfg);
        assert_eq!(code, 2, "{what}: {err}");
        assert!(
            err.contains(":2:1: server.admin_token_file: cannot read"),
            "{what}: {err}"
        );
    }
}

/// Sum of the rate-limit counters (`{prefix}:rl:{<hash>}:<window>`) on `server`.
fn counter_total(server: &RedisServer, prefix: &str) -> u64 {
    server
        .keys(&format!("{prefix}:rl:{{*"))
        .iter()
        .filter(|k| !k.contains("instances"))
        .map(|k| server.cmd(&["GET", k]).parse::<u64>().unwrap_or(0))
        .sum()
}

#[test]
fn redis_password_file_authenticates() {
    let r = RedisServer::start_with_password("file-pw-9");
    let b = Backend::start("app");
    let dir = tempfile::tempdir().expect("tempdir");
    let right = write(dir.path(), "right", "file-pw-9\r\n");
    let wrong = write(dir.path(), "wrong", "wrong-pw-4\n");
    // The file wins over a (wrong) password in the URL.
    let config = |file: &str| {
        fleet_config(
            &b,
            &format!(
                "url = \"redis://:url-pw-1@{}\"\npassword_file = \"{file}\"",
                r.addr()
            ),
            "pcx-pwf",
            "[rate_limit]\nlimit = 5\n[culling]\nenabled = false\n",
        )
    };
    let (pg, pb) = (Proxy::start(&config(&right)), Proxy::start(&config(&wrong)));
    for _ in 0..3 {
        assert_eq!(pg.get("/", &[("x-api-key", "a")]).status, 200);
    }
    eventually(
        DEADLINE,
        || {
            format!(
                "right password: healthy, counts in Redis: {:?}",
                r.keys("*")
            )
        },
        || {
            pg.metric("portcullis_ratelimit_store_healthy") == Some(1.0)
                && counter_total(&r, "pcx-pwf") >= 1
        },
    );
    eventually(
        DEADLINE,
        || format!("wrong password: unhealthy; logs:\n{}", pb.logs()),
        || {
            pb.metric("portcullis_ratelimit_store_healthy") == Some(0.0)
                && pb.logs().contains("authentication failed")
        },
    );
    assert_eq!(pb.get("/", &[("x-api-key", "b")]).status, 200);
    for p in [&pg, &pb] {
        let logs = p.logs();
        for secret in ["file-pw-9", "wrong-pw-4", "url-pw-1"] {
            assert!(!logs.contains(secret), "{secret} reached the logs");
        }
    }
    let cfg = format!("{BASE}[redis]\npassword_file = \"/nonexistent/pw\"\n");
    let (code, _, err, _) = check_config(&cfg);
    assert_eq!(code, 2);
    assert!(err.contains("redis.password_file: cannot read"), "{err}");
}
