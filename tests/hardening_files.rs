//! The files the proxy reads and the values it is given, as an attacker or a careless
//! writer offers them (the real binary, real `redis-server`):
//!
//! - a backend's cost header past 2^63 spends the tenant's quota, in the process and
//!   through Redis (which refused the flush before);
//! - a tenants file left empty (a write in place caught mid-edit) keeps the tenants;
//! - a tenants file of 256 MiB is refused by its size, and the proxy's peak memory stays
//!   flat; every other file (secrets, JWKS, certificates) has a cap of its own;
//! - `--check` never prints a value that came from the environment, nor the tail of a
//!   Redis password holding a raw `@`.

use portcullis_test_kit as support;

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use support::*;

fn hash(key: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(key.as_bytes())))
}

/// `(name, tier, key)` entries as a tenants file, written whole then renamed into place.
fn write_tenants(path: &Path, tenants: &[(&str, &str, &str)]) {
    let mut text = String::new();
    for (name, tier, key) in tenants {
        text.push_str(&format!(
            "[[tenant]]\nname = \"{name}\"\ntier = \"{tier}\"\nkeys = [\"{}\"]\n\n",
            hash(key)
        ));
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write tenants file");
    std::fs::rename(&tmp, path).expect("rename tenants file");
}

fn get_as(p: &Proxy, key: &str) -> Resp {
    p.get("/", &[("x-api-key", key)])
}

/// Reloads so far, whatever their outcome.
fn reloads(p: &Proxy) -> f64 {
    ["ok", "error"]
        .iter()
        .filter_map(|r| {
            p.metric(&format!(
                "portcullis_config_reloads_total{{result=\"{r}\"}}"
            ))
        })
        .sum()
}

// ---------------------------------------------------------------------------------------
// A cost past 2^63
// ---------------------------------------------------------------------------------------

/// Every answer costs u64::MAX units.
const COST_MAX: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-cost: 18446744073709551615\r\n\r\nok";

fn metered(store: &str, backend: &str, file: &Path) -> String {
    format!(
        "{store}[[upstreams]]\nname = \"app\"\nbackends = [\"{backend}\"]\n\n\
         [shedding]\nmax_concurrency = 0\n\n\
         [rate_limit]\nlimit = 1000\ncost_header = \"x-cost\"\n\n[tenants]\nfile = \"{}\"\n\n\
         [tiers.metered]\nlimit = 1000\nquota = 1000\nquota_period = \"day\"\n",
        file.display()
    )
}

fn quota_used(p: &Proxy) -> Option<f64> {
    p.metric("portcullis_tenant_quota_used{tenant=\"acme\"}")
}

/// Before: the charge was u64::MAX (the in-process book showed 1.8e19 spent), and Redis
/// refused every flush carrying it ("value is not an integer or out of range"): the other
/// instance never learnt of the spending, and the batch's other counts were lost with it.
/// Now a cost over the quota spends the whole quota (1000), which Redis takes.
#[test]
fn a_cost_past_two_to_the_63_spends_the_whole_quota_in_process_and_through_redis() {
    let backend = fixed_response_backend(COST_MAX);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tenants.toml");
    write_tenants(&file, &[("acme", "metered", "acme-key")]);

    // In process.
    let local = Proxy::start(&metered("", &backend, &file));
    assert_eq!(get_as(&local, "acme-key").status, 200);
    assert_eq!(quota_used(&local), Some(1000.0), "the quota, not 2^64 - 1");
    assert_eq!(get_as(&local, "acme-key").status, 429, "the quota is spent");
    drop(local);

    // Through Redis, two instances.
    let redis = RedisServer::start();
    let store = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"hf\"\nflush_interval_ms = 50\ntimeout_ms = 500\n\n",
        redis.url()
    );
    let cfg = metered(&store, &backend, &file);
    let (a, b) = (Proxy::start(&cfg), Proxy::start(&cfg));
    Proxy::wait_fleet(&[&a, &b]);
    // One request through each (neither knew of any spending): 1000 each, 2000 in all.
    assert_eq!(get_as(&a, "acme-key").status, 200);
    assert_eq!(get_as(&b, "acme-key").status, 200);
    eventually(
        DEADLINE,
        || {
            format!(
                "the fleet never agreed on 2000 spent: A {:?}, B {:?}; A's logs:\n{}",
                quota_used(&a),
                quota_used(&b),
                a.logs()
            )
        },
        || quota_used(&a) == Some(2000.0) && quota_used(&b) == Some(2000.0),
    );
    assert_eq!(get_as(&a, "acme-key").status, 429);
    assert_eq!(get_as(&b, "acme-key").status, 429);
    // The store took every flush, and holds exactly what was spent.
    assert_eq!(a.metric("portcullis_ratelimit_store_healthy"), Some(1.0));
    assert!(
        !a.logs().contains("not an integer") && !b.logs().contains("not an integer"),
        "Redis refused a flush:\n{}",
        a.logs()
    );
    let values: Vec<u64> = redis
        .keys("hf:rl:{*")
        .iter()
        .filter(|k| !k.contains("instances"))
        .map(|k| redis.cmd(&["GET", k]).trim().parse::<u64>().unwrap_or(0))
        .collect();
    assert!(values.contains(&2000), "no counter at 2000: {values:?}");
}

// ---------------------------------------------------------------------------------------
// An empty tenants file
// ---------------------------------------------------------------------------------------

fn tenants_cfg(b: &Backend, file: &Path, extra: &str) -> String {
    format!(
        "{}[rate_limit]\nlimit = 1000\n\n[tenants]\nfile = \"{}\"\nunknown_key = \"reject\"\n{extra}\n\
         [tiers.pro]\nlimit = 1000\n",
        one_upstream(b),
        file.display()
    )
}

/// Before: the watcher applied the empty file a write in place leaves for a moment, and
/// with `unknown_key = "reject"` every tenant's key got 401 until the file was whole again.
/// Now a file with no tenant is refused (logged, the tenants kept) unless
/// `tenants.allow_empty`, `--check` says so naming the file, and a change is applied once
/// the file stayed the same for a poll.
#[test]
fn an_empty_tenants_file_keeps_the_tenants_unless_allowed() {
    let b = Backend::start("b");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tenants.toml");
    write_tenants(&file, &[("acme", "pro", "acme-key")]);
    let p = Proxy::start(&tenants_cfg(&b, &file, ""));
    assert_eq!(get_as(&p, "acme-key").status, 200);

    // Truncated in place (as `>` in a shell, or an editor writing over the file).
    let before = reloads(&p);
    std::fs::write(&file, "").expect("truncate");
    eventually(
        DEADLINE,
        || format!("the empty file was never read; logs:\n{}", p.logs()),
        || reloads(&p) > before,
    );
    assert_eq!(get_as(&p, "acme-key").status, 200, "the tenants were kept");
    assert!(p.logs().contains("holds no [[tenant]]"), "{}", p.logs());
    assert_eq!(p.status_json()["tenants"]["count"], 1);

    // `--check` of the same configuration: an error naming the tenants file.
    let (code, _, err) = check_config_file(p.config_path());
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("error: {}: ", file.display())) && err.contains("no [[tenant]]"),
        "{err}"
    );

    // A whole file again: applied (after it held for a poll).
    write_tenants(
        &file,
        &[("acme", "pro", "acme-key"), ("beta", "pro", "beta-key")],
    );
    eventually(
        DEADLINE,
        || "the new tenant never came".into(),
        || get_as(&p, "beta-key").status == 200,
    );

    // Allowed: `--check` takes the empty file (the running proxy's reload is the same
    // validation).
    std::fs::write(&file, "# no tenants for now\n").expect("empty");
    let allowed = dir.path().join("allowed.toml");
    std::fs::write(&allowed, tenants_cfg(&b, &file, "allow_empty = true")).expect("write");
    let (code, out, err) = check_config_file(&allowed);
    assert_eq!((code, out.trim()), (0, "OK"), "{err}");
}

// ---------------------------------------------------------------------------------------
// File sizes
// ---------------------------------------------------------------------------------------

/// Peak resident memory (`VmHWM`) of `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A sparse file of `len` bytes (zeros; costs no disk).
fn sparse(path: &Path, len: u64) {
    let f = std::fs::File::create(path).expect("create");
    f.set_len(len).expect("set_len");
}

/// Before: the running proxy read the whole file on its change (a 1 GB tenants file took
/// it from 25 MB to 2.1 GB); here a 256 MiB one took its peak past 256 MiB. Now a file
/// over `tenants.max_file_bytes` (32 MiB by default) is refused by its size before it is
/// read: the tenants stay, and the peak stays where it was.
#[test]
fn a_huge_tenants_file_is_refused_by_its_size_and_memory_stays_flat() {
    let b = Backend::start("b");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tenants.toml");
    write_tenants(&file, &[("acme", "pro", "acme-key")]);
    let p = Proxy::start(&tenants_cfg(&b, &file, ""));
    assert_eq!(get_as(&p, "acme-key").status, 200);
    let before = peak_rss_kib(p.pid());
    assert!(before > 0, "no VmHWM for {}", p.pid());

    let huge = dir.path().join("huge.tmp");
    sparse(&huge, 256 << 20);
    let reloaded = reloads(&p);
    std::fs::rename(&huge, &file).expect("rename");
    eventually(
        DEADLINE,
        || format!("the huge file was never read; logs:\n{}", p.logs()),
        || reloads(&p) > reloaded,
    );
    let after = peak_rss_kib(p.pid());
    assert!(
        after < before + 64 * 1024,
        "peak RSS grew from {before} KiB to {after} KiB"
    );
    assert_eq!(get_as(&p, "acme-key").status, 200, "the tenants were kept");
    let logs = p.logs();
    assert!(
        logs.contains("larger than 32 MiB") && logs.contains("tenants.max_file_bytes"),
        "{logs}"
    );
}

/// `--check` with a file of each kind over its cap, or not a regular file: an error naming
/// the key, the file and the cap, at once (a FIFO never blocks it). Before: no cap (a
/// 100 MiB JWKS file or admin token file was read whole).
#[test]
fn check_refuses_files_over_their_cap_naming_the_file_and_the_cap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = "[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\"]\n";
    let path = |name: &str| -> PathBuf { dir.path().join(name) };
    sparse(&path("token"), (64 << 10) + 1);
    sparse(&path("jwks.json"), (4 << 20) + 1);
    sparse(&path("cert.pem"), 100 << 20);
    sparse(&path("tenants.toml"), (32 << 20) + 1);
    let fifo = path("fifo");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    let cases = [
        (
            format!(
                "[server]\nadmin_token_file = \"{}\"\n{base}",
                path("token").display()
            ),
            "server.admin_token_file",
            "64 KiB",
        ),
        (
            format!(
                "{base}[redis]\nurl = \"redis://127.0.0.1:1\"\npassword_file = \"{}\"\n",
                path("token").display()
            ),
            "redis.password_file",
            "64 KiB",
        ),
        (
            format!(
                "{base}[rate_limit]\nkey = \"jwt:sub\"\n[jwt]\njwks_file = \"{}\"\n",
                path("jwks.json").display()
            ),
            "jwt.jwks_file",
            "4 MiB",
        ),
        (
            format!(
                "{base}[rate_limit]\nkey = \"jwt:sub\"\n[jwt]\nhs256_secret_file = \"{}\"\n",
                path("token").display()
            ),
            "jwt.hs256_secret_file",
            "64 KiB",
        ),
        (
            format!(
                "{base}[tenants]\nfile = \"{}\"\n[tiers.pro]\nlimit = 5\n",
                path("tenants.toml").display()
            ),
            "tenants.toml",
            "32 MiB",
        ),
    ];
    for (cfg, key, cap) in &cases {
        let (code, _, err, _) = check_config(cfg);
        assert_eq!(code, 2, "{key}: {err}");
        assert!(err.contains(key) && err.contains(cap), "{key}: {err}");
        assert!(err.contains("larger than"), "{key}: {err}");
    }
    // A certificate over its cap (4 MiB).
    let cert = format!(
        "{base}[tls]\nlisten = [\"127.0.0.1:0\"]\n[[tls.certificates]]\ncert = \"{}\"\nkey = \"{}\"\n",
        path("cert.pem").display(),
        path("cert.pem").display()
    );
    let (code, _, err, _) = check_config(&cert);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("larger than 4 MiB"), "{err}");
    if made {
        let t = std::time::Instant::now();
        let cfg = format!(
            "{base}[rate_limit]\nkey = \"jwt:sub\"\n[jwt]\njwks_file = \"{}\"\n",
            fifo.display()
        );
        let (code, _, err, _) = check_config(&cfg);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("a FIFO"), "{err}");
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
    }
}

// ---------------------------------------------------------------------------------------
// --check and the environment
// ---------------------------------------------------------------------------------------

/// `portcullis -c <text> --check` with `env`: (exit code, stderr).
fn check_with_env(text: &str, env: &[(&str, &str)]) -> (i32, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("env.toml");
    std::fs::write(&path, text).expect("write config");
    let mut cmd = Command::new(&*BIN);
    cmd.arg("-c").arg(&path).arg("--check").stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run portcullis --check");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A config, its environment, the key path its error names, and what it must not show.
type EnvCase = (
    String,
    &'static [(&'static str, &'static str)],
    &'static str,
    &'static str,
);

/// Before: `--check` quoted what the environment gave (`rate_limit.key: invalid key
/// source "nonsense-from-env"`, a backend address, a whole Redis URL), and a password
/// with a raw `@` showed its tail (`redis://user:***@ss/SuperSecret…`). Now a value from
/// the environment is shown as its variable, and a URL's user-info is hidden up to its
/// last `@`.
#[test]
fn check_never_shows_an_environment_value_nor_a_password_tail() {
    let base = "[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\"]\n";
    let cases: [EnvCase; 5] = [
        (
            format!("{base}[rate_limit]\nkey = \"${{PCX_HF_KEY}}\"\n"),
            &[("PCX_HF_KEY", "nonsense-from-env")],
            "rate_limit.key",
            "nonsense-from-env",
        ),
        (
            "[[upstreams]]\nname = \"app\"\nbackends = [\"${PCX_HF_BACKEND}\"]\n".to_string(),
            &[("PCX_HF_BACKEND", "internal-db.corp:notaport")],
            "upstreams[0].backends[0]",
            "internal-db",
        ),
        (
            format!("{base}[redis]\nurl = \"${{PCX_HF_URL}}\"\n"),
            &[("PCX_HF_URL", "redis://admin:env-pw-31@10.1.2.3:notaport")],
            "redis.url",
            "env-pw-31",
        ),
        (
            format!("{base}[redis]\nurl = \"redis://user:${{PCX_HF_PW}}@127.0.0.1:notaport\"\n"),
            &[("PCX_HF_PW", "p@ss/SuperSecret")],
            "redis.url",
            "SuperSecret",
        ),
        (
            format!("{base}[tenants]\nfile = \"${{PCX_HF_FILE}}\"\n[tiers.pro]\nlimit = 1\n"),
            &[("PCX_HF_FILE", "/nonexistent/private-path/tenants.toml")],
            "",
            "private-path",
        ),
    ];
    for (cfg, env, key, secret) in &cases {
        let (code, err) = check_with_env(cfg, env);
        assert_eq!(code, 2, "{secret}: {err}");
        assert!(err.contains(key), "{key}: {err}");
        assert!(!err.contains(secret), "{secret} was shown: {err}");
        // Named, unless the URL's redaction hid it with the password (`user:***@`).
        let var = env[0].0;
        assert!(
            err.contains(&format!("${{{var}}}")) || err.contains("user:***@127.0.0.1"),
            "{var} not named: {err}"
        );
    }
    // A raw `@` in a password written in the file: hidden up to the last `@`.
    let cfg =
        format!("{base}[redis]\nurl = \"redis://user:p@ss/SuperSecret@127.0.0.1:notaport\"\n");
    let (code, err) = check_with_env(&cfg, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        !err.contains("SuperSecret") && !err.contains("ss/"),
        "{err}"
    );
    assert!(err.contains("user:***@127.0.0.1:notaport"), "{err}");
}
