//! The fleet store in every mode (CONTRACT §9): Redis Cluster (a master killed under load),
//! Sentinel (the master killed, the replica promoted), AUTH (`--requirepass`, right and
//! wrong password), TLS (`--tls-port`, right and wrong CA), accuracy across 3 instances on
//! a cluster, and the `--check` errors of §9's bad input. Real `redis-server`s (cluster,
//! sentinels), real `portcullis` processes, real backends; figures go to stderr.

use portcullis_test_kit as support;

use std::collections::HashMap;
use std::time::{Duration, Instant};
use support::*;

/// Proxies' config: [`fleet_config`] with `[redis]` = `redis` (the mode's keys), culling
/// off, `[rate_limit]` with `window_seconds` and `limit`.
fn config(b: &Backend, redis: &str, prefix: &str, window_seconds: u64, limit: u64) -> String {
    fleet_config(
        b,
        redis,
        prefix,
        &format!(
            "[rate_limit]\nwindow_seconds = {window_seconds}\nlimit = {limit}\n\n[culling]\nenabled = false\n"
        ),
    )
}

fn quoted(list: &[String]) -> String {
    let q: Vec<String> = list.iter().map(|s| format!("\"{s}\"")).collect();
    format!("[{}]", q.join(", "))
}

fn healthy(p: &Proxy) -> bool {
    p.metric("portcullis_ratelimit_store_healthy") == Some(1.0)
        && p.status_json()["rate_limit"]["store_healthy"].as_bool() == Some(true)
}

fn unhealthy(p: &Proxy) -> bool {
    p.metric("portcullis_ratelimit_store_healthy") == Some(0.0)
        && p.status_json()["rate_limit"]["store_healthy"].as_bool() == Some(false)
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

/// Sum of the rate-limit counters under `prefix` over the masters of `cluster`.
fn cluster_total(cluster: &RedisCluster, prefix: &str) -> u64 {
    cluster
        .masters()
        .iter()
        .map(|(p, _)| counter_total(cluster.server(*p), prefix))
        .sum()
}

/// Three requests for each of the keys k0..k11 through `pg` and through `pb` (36 each):
/// every one is admitted, whatever the state of either proxy's store.
fn send_twelve_keys_to_both(pg: &Proxy, pb: &Proxy) {
    for i in 0..12 {
        let k = format!("k{i}");
        for _ in 0..3 {
            assert_eq!(pg.get("/", &[("x-api-key", &k)]).status, 200);
            assert_eq!(
                pb.get("/", &[("x-api-key", &k)]).status,
                200,
                "traffic served"
            );
        }
    }
}

fn failed(samples: &[KeyedSample]) -> Vec<&KeyedSample> {
    samples.iter().filter(|s| s.status != 200).collect()
}

/// No request waited on the store: the slowest answer is printed and bounded far above
/// the store's `timeout_ms` (a request that waited on a dead master would take a reconnect
/// backoff, seconds), as loosely as the rest of the suite (a loaded 2-core machine).
fn assert_none_waited(samples: &[KeyedSample], what: &str) {
    let mut l: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
    l.sort();
    let max = l.last().copied().unwrap_or_default();
    let p99 = l.get(l.len() * 99 / 100).copied().unwrap_or_default();
    eprintln!("{what}: {} requests, p99 {p99:?}, max {max:?}", l.len());
    assert!(
        max < Duration::from_secs(5),
        "{what}: a request took {max:?}"
    );
}

/// 3 masters + 3 replicas; two proxies flush 8 keys (spread over the slots of every
/// master) under paced load. Master 0 is SIGKILLed: no request fails, the store is healthy
/// again within 10 s of the promotion, and every admission made before, during and after
/// the failover ends up in the cluster's counters (outage counts delivered).
#[test]
fn cluster_master_killed_under_load_no_request_fails_and_store_recovers() {
    let mut cluster = RedisCluster::start(3, 1);
    let b = Backend::start("app");
    let redis = format!("mode = \"cluster\"\nnodes = {}", quoted(&cluster.nodes()));
    let cfg = config(&b, &redis, "pcx-cl", 60, 1_000_000);
    let (p1, p2) = (Proxy::start(&cfg), Proxy::start(&cfg));
    let keys = ["ka", "kb", "kc", "kd", "ke", "kf", "kg", "kh"];
    let load = KeyedLoad::start(&[p1.addr(), p2.addr()], 4, 50.0, &keys, u64::MAX);
    eventually(
        DEADLINE,
        || "store healthy on the cluster".into(),
        || healthy(&p1) && healthy(&p2),
    );
    // Counters land on more than one master: the flush is split per slot.
    eventually(
        DEADLINE,
        || "counters on every master".into(),
        || {
            cluster
                .masters()
                .iter()
                .filter(|(p, _)| counter_total(cluster.server(*p), "pcx-cl") > 0)
                .count()
                >= 2
        },
    );
    std::thread::sleep(Duration::from_millis(500)); // load keeps running across the kill
    let killed = cluster.kill_master(0);
    let t_kill = Instant::now();
    let saw_unhealthy = wait_until(Duration::from_secs(10), || unhealthy(&p1) || unhealthy(&p2));
    cluster.wait_ok();
    let promoted = Instant::now();
    eprintln!(
        "cluster: killed master {killed}; promotion seen after {:?}; store went unhealthy: {saw_unhealthy}",
        promoted - t_kill
    );
    eventually(
        Duration::from_secs(10),
        || "store healthy within 10 s of the promotion".into(),
        || healthy(&p1) && healthy(&p2),
    );
    eprintln!(
        "cluster: store healthy {:?} after the promotion",
        promoted.elapsed()
    );
    std::thread::sleep(Duration::from_millis(500));
    let samples = load.finish();
    let bad = failed(&samples);
    assert!(
        bad.is_empty(),
        "{} of {} requests failed: {:?}",
        bad.len(),
        samples.len(),
        &bad[..bad.len().min(5)]
    );
    assert_none_waited(&samples, "cluster failover");
    // Outage counts delivered: the cluster's counters reach the admissions.
    let admitted = samples.len() as u64;
    let total = || cluster_total(&cluster, "pcx-cl");
    let ok = wait_until(DEADLINE, || total() >= admitted);
    let got = total();
    eprintln!("cluster: {admitted} admitted, {got} counted in the cluster");
    assert!(
        ok,
        "only {got} of {admitted} admissions reached the cluster"
    );
    assert!(
        got <= admitted + admitted / 100,
        "{got} counted for {admitted} admitted: double counting"
    );
    let _ = killed;
}

/// One master, one replica, three sentinels. The master is SIGKILLed under load: no
/// request fails, the proxies find the promoted replica through the sentinels within 10 s
/// of the promotion and their counts land on it.
#[test]
fn sentinel_master_killed_proxies_switch_to_the_promoted_replica() {
    let mut set = RedisSentinels::start("pcx-master", Some("s3ntinel-pw"));
    let b = Backend::start("app");
    let redis = format!(
        "mode = \"sentinel\"\nsentinels = {}\nmaster_name = \"pcx-master\"\npassword = \"s3ntinel-pw\"",
        quoted(&set.sentinel_addrs())
    );
    let cfg = config(&b, &redis, "pcx-se", 60, 1_000_000);
    let (p1, p2) = (Proxy::start(&cfg), Proxy::start(&cfg));
    let load = KeyedLoad::start(
        &[p1.addr(), p2.addr()],
        2,
        50.0,
        &["s1", "s2", "s3"],
        u64::MAX,
    );
    eventually(
        DEADLINE,
        || "store healthy via sentinel".into(),
        || healthy(&p1) && healthy(&p2),
    );
    eventually(
        DEADLINE,
        || "counts on the first master".into(),
        || counter_total(set.master(), "pcx-se") > 0,
    );
    let old = set.kill_master();
    let new = set.wait_new_master(old);
    let promoted = Instant::now();
    eprintln!("sentinel: master {old} killed, {new} promoted");
    let before = counter_total(set.server(new), "pcx-se");
    eventually(
        Duration::from_secs(10),
        || "store healthy within 10 s of the promotion".into(),
        || healthy(&p1) && healthy(&p2) && counter_total(set.server(new), "pcx-se") > before,
    );
    eprintln!(
        "sentinel: healthy on the new master {:?} after the promotion",
        promoted.elapsed()
    );
    let samples = load.finish();
    let bad = failed(&samples);
    assert!(
        bad.is_empty(),
        "{} of {} requests failed",
        bad.len(),
        samples.len()
    );
    assert_none_waited(&samples, "sentinel failover");
    let admitted = samples.len() as u64;
    let ok = wait_until(DEADLINE, || {
        counter_total(set.server(new), "pcx-se") >= admitted
    });
    let got = counter_total(set.server(new), "pcx-se");
    eprintln!("sentinel: {admitted} admitted, {got} counted on the new master");
    assert!(
        ok,
        "only {got} of {admitted} admissions reached the new master"
    );
}

/// `--requirepass`: the right password in the URL gives a healthy shared store; a wrong
/// one an unhealthy store, a log line that says authentication failed, and traffic served
/// (limits enforced locally).
#[test]
fn requirepass_right_and_wrong_password() {
    let r = RedisServer::start_with_password("rightpw-7");
    let b = Backend::start("app");
    let good = config(
        &b,
        &format!("url = \"redis://:rightpw-7@{}\"", r.addr()),
        "pcx-pw",
        60,
        5,
    );
    let bad = config(
        &b,
        &format!("url = \"redis://:wrongpw-3@{}\"", r.addr()),
        "pcx-pw",
        60,
        5,
    );
    let (pg, pb) = (Proxy::start(&good), Proxy::start(&bad));
    // A key is shared (flushed) from its second admission on: send a few.
    for _ in 0..3 {
        assert_eq!(pg.get("/", &[("x-api-key", "a")]).status, 200);
    }
    eventually(
        DEADLINE,
        || {
            format!(
                "right password: healthy, counts in Redis: {:?} {}",
                r.keys("*"),
                pg.status_json()
            )
        },
        || healthy(&pg) && counter_total(&r, "pcx-pw") >= 1,
    );
    eventually(
        DEADLINE,
        || format!("wrong password: unhealthy; logs:\n{}", pb.logs()),
        || unhealthy(&pb) && pb.logs().contains("authentication failed"),
    );
    let statuses: Vec<u16> = (0..8)
        .map(|_| pb.get("/", &[("x-api-key", "b")]).status)
        .collect();
    assert_eq!(
        &statuses[..5],
        &[200; 5],
        "traffic served with a wrong password"
    );
    assert!(
        statuses[5..].iter().all(|&s| s == 429),
        "local limit still holds: {statuses:?}"
    );
    assert!(
        !pb.logs().contains("wrongpw-3"),
        "the password never reaches the logs"
    );
}

/// In `dir`: a CA named `ca_cn`, an unrelated CA, and a certificate for `name` (valid
/// for localhost and 127.0.0.1) that the first signed.
fn server_certs(
    dir: &std::path::Path,
    ca_cn: &str,
    name: &str,
) -> (CertFiles, CertFiles, CertFiles) {
    let ca = make_ca(dir, "ca", ca_cn);
    let other = make_ca(dir, "other", "someone else");
    let cert = make_signed_cert(dir, name, &ca, name, &["localhost"], &["127.0.0.1"]);
    (ca, other, cert)
}

/// `--tls-port`: `rediss://` with `ca_file` = the CA that signed the server's certificate
/// is healthy; with another CA the handshake fails: unhealthy, a log line naming TLS,
/// traffic served.
#[test]
fn tls_right_and_wrong_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, other, cert) = server_certs(dir.path(), "pcx test CA", "redis");
    let r = RedisServer::start_tls(&cert.cert, &cert.key, &ca.cert);
    let port = r.tls_port().expect("tls port");
    let b = Backend::start("app");
    let tls = |ca: &CertFiles| {
        format!(
            "url = \"rediss://127.0.0.1:{port}\"\nca_file = \"{}\"",
            ca.cert.display()
        )
    };
    let (pg, pb) = (
        Proxy::start(&config(&b, &tls(&ca), "pcx-tls", 60, 100)),
        Proxy::start(&config(&b, &tls(&other), "pcx-tls", 60, 100)),
    );
    // A key is shared (flushed) from its second admission on: send a few.
    for _ in 0..3 {
        assert_eq!(pg.get("/", &[("x-api-key", "a")]).status, 200);
    }
    eventually(
        DEADLINE,
        || format!("right CA: healthy; logs:\n{}", pg.logs()),
        || healthy(&pg) && counter_total(&r, "pcx-tls") >= 1,
    );
    assert_eq!(
        pb.get("/", &[("x-api-key", "b")]).status,
        200,
        "traffic served"
    );
    eventually(
        DEADLINE,
        || format!("wrong CA: unhealthy; logs:\n{}", pb.logs()),
        || unhealthy(&pb) && pb.logs().contains("TLS failed"),
    );
    assert_eq!(
        pb.get("/", &[("x-api-key", "b")]).status,
        200,
        "traffic still served"
    );
}

/// A lone self-signed certificate (its own CA): one marked `CA:TRUE` (what `openssl req
/// -x509` makes by default) is accepted by redis-cli but refused by the proxy's Redis
/// client (rustls), and the log says what to do; the same certificate with
/// `basicConstraints=critical,CA:FALSE` is accepted by both.
#[test]
fn a_lone_self_signed_certificate_and_what_the_log_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = Backend::start("app");
    for (name, ca_flag, proxy_accepts) in [
        ("selfca", None, false),
        ("selfleaf", Some("basicConstraints=critical,CA:FALSE"), true),
    ] {
        let (cert, key) = (
            dir.path().join(format!("{name}.pem")),
            dir.path().join(format!("{name}.key")),
        );
        let mut cmd = std::process::Command::new("openssl");
        cmd.args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
        ])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert);
        if let Some(flag) = ca_flag {
            cmd.args(["-addext", flag]);
        }
        let out = cmd.output().expect("openssl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r = RedisServer::start_tls(&cert, &key, &cert);
        let port = r.tls_port().expect("tls port");
        let cli = std::process::Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(&cert)
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "PING"])
            .output()
            .expect("redis-cli");
        assert_eq!(
            String::from_utf8_lossy(&cli.stdout).trim(),
            "PONG",
            "redis-cli accepts {name}"
        );
        let redis = format!(
            "url = \"rediss://127.0.0.1:{port}\"\nca_file = \"{}\"",
            cert.display()
        );
        let p = Proxy::start(&config(&b, &redis, name, 60, 100));
        for _ in 0..3 {
            assert_eq!(p.get("/", &[("x-api-key", "a")]).status, 200);
        }
        if proxy_accepts {
            eventually(
                DEADLINE,
                || format!("{name}: healthy; logs:\n{}", p.logs()),
                || healthy(&p),
            );
        } else {
            eventually(
                DEADLINE,
                || format!("{name}: the log names the cause; logs:\n{}", p.logs()),
                || {
                    unhealthy(&p)
                        && p.logs()
                            .contains("presents a CA certificate (CA:TRUE) as its own")
                },
            );
        }
    }
}

/// A cluster whose nodes `--requirepass`: `password` authenticates to every node the
/// cluster client learns; a wrong one is an unhealthy store with a clear log, traffic served.
#[test]
fn cluster_with_password_right_and_wrong() {
    let cluster = RedisCluster::start_with_args(
        3,
        0,
        &["--requirepass", "clu-pw-5", "--masterauth", "clu-pw-5"],
    );
    let b = Backend::start("app");
    let redis = |pw: &str| {
        format!(
            "mode = \"cluster\"\nnodes = {}\npassword = \"{pw}\"",
            quoted(&cluster.nodes())
        )
    };
    let pg = Proxy::start(&config(&b, &redis("clu-pw-5"), "pcx-cpw", 60, 100));
    let pb = Proxy::start(&config(&b, &redis("not-it-9"), "pcx-cpw", 60, 100));
    send_twelve_keys_to_both(&pg, &pb);
    let total = || cluster_total(&cluster, "pcx-cpw");
    eventually(
        DEADLINE,
        || format!("right password: healthy, 36 counted (got {})", total()),
        || healthy(&pg) && total() == 36,
    );
    eventually(
        DEADLINE,
        || format!("wrong password: unhealthy; logs:\n{}", pb.logs()),
        || unhealthy(&pb) && pb.logs().contains("authentication failed"),
    );
    assert!(
        !pb.logs().contains("not-it-9"),
        "the password never reaches the logs"
    );
}

/// Three instances on a 3-master cluster, one key at 4× its limit (limit 240 per 4 s
/// window): each of 3 full windows admits within [0.95, 1.05] × the limit.
#[test]
fn cluster_accuracy_across_three_instances() {
    const LIMIT: u64 = 240;
    const WIN: u64 = 4;
    let wms = WIN * 1000;
    let cluster = RedisCluster::start(3, 0);
    let b = Backend::start("app");
    let redis = format!("mode = \"cluster\"\nnodes = {}", quoted(&cluster.nodes()));
    let cfg = config(&b, &redis, "pcx-acc", WIN, LIMIT);
    let ps = [Proxy::start(&cfg), Proxy::start(&cfg), Proxy::start(&cfg)];
    let addrs: Vec<String> = ps.iter().map(Proxy::addr).collect();
    for p in &ps {
        eventually(DEADLINE, || "healthy".into(), || healthy(p));
    }
    let w0 = wait_window_phase(wms, 0, 200);
    let end = (w0 + 4) * wms;
    // 4x the limit: 3 proxies x 2 threads, each at 4 * LIMIT / WIN / 6 req/s.
    let rate = 4.0 * LIMIT as f64 / WIN as f64 / 6.0;
    let samples = KeyedLoad::start(&addrs, 2, rate, &["acc-key"], end).join();
    assert!(
        failed(&samples).iter().all(|s| s.status == 429),
        "only 200 and 429 answers"
    );
    let (lo, hi) = (LIMIT as f64 * 0.95, LIMIT as f64 * 1.05);
    let mut per: HashMap<u64, u64> = HashMap::new();
    for s in &samples {
        *per.entry(s.send_ms / wms).or_default() += 1;
    }
    for w in w0 + 1..=w0 + 3 {
        let (d, p) = admitted_in_window(&samples, wms, w);
        let sent = per.get(&w).copied().unwrap_or(0);
        eprintln!(
            "cluster accuracy W{}: sent {sent}, admitted between {d} and {p} (ratio {:.3}..{:.3})",
            w - w0,
            d as f64 / LIMIT as f64,
            p as f64 / LIMIT as f64
        );
        assert!(
            sent >= 2 * LIMIT,
            "W{}: only {sent} sent: the key was not overloaded",
            w - w0
        );
        assert!(
            d as f64 <= hi,
            "W{}: at least {d} admitted > 1.05 x {LIMIT}",
            w - w0
        );
        assert!(
            p as f64 >= lo,
            "W{}: at most {p} admitted < 0.95 x {LIMIT}",
            w - w0
        );
    }
}

/// §9 bad input: `--check` names the key.
#[test]
fn check_rejects_non_cluster_seeds_unknown_master_and_cluster_with_url() {
    let plain = RedisServer::start();
    let b = Backend::start("app");
    // `--check` of the config with `[redis]` = `redis`: (exit code, stdout, stderr).
    let check = |redis: &str| {
        let (code, out, err, _) = check_config(&config(&b, redis, "x", 60, 10));
        (code, out, err)
    };

    let (code, _, err) = check(&format!(
        "mode = \"cluster\"\nnodes = [\"{}\"]",
        plain.addr()
    ));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("redis.nodes") && err.contains("not a Redis Cluster"),
        "{err}"
    );

    let set = RedisSentinels::start("known", None);
    let sentinel = |master: &str| {
        format!(
            "mode = \"sentinel\"\nsentinels = {}\nmaster_name = \"{master}\"",
            quoted(&set.sentinel_addrs())
        )
    };
    let (code, _, err) = check(&sentinel("unknown"));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("redis.master_name") && err.contains("unknown"),
        "{err}"
    );
    let (code, out, err) = check(&sentinel("known"));
    assert_eq!((code, out.trim()), (0, "OK"), "{err}");

    let (code, _, err) =
        check("mode = \"cluster\"\nurl = \"redis://127.0.0.1:7000\"\nnodes = [\"127.0.0.1:7000\"]");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("redis.url"), "{err}");

    for (redis, key) in [
        ("mode = \"cluster\"", "redis.nodes"),
        ("mode = \"ring\"", "redis.mode"),
        ("mode = \"cluster\"\nnodes = [\"nohost\"]", "redis.nodes[0]"),
        (
            "mode = \"sentinel\"\nsentinels = [\"127.0.0.1:1\"]\nmaster_name = \"\"",
            "redis.master_name",
        ),
        ("password = \"x\"", "redis.password"),
        (
            "url = \"redis://127.0.0.1:1\"\nca_file = \"/nonexistent/ca.pem\"",
            "redis.ca_file",
        ),
    ] {
        let (code, _, err) = check(redis);
        assert_eq!(code, 2, "{redis}: {err}");
        assert!(err.contains(key), "{redis}: expected {key} in {err}");
    }
}

/// A cluster over TLS (`--tls-cluster yes`): `tls = true` with `ca_file` = the signing CA
/// reaches every node the cluster client learns; another CA is an unhealthy store.
#[test]
fn cluster_over_tls_right_and_wrong_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, other, cert) = server_certs(dir.path(), "pcx cluster CA", "node");
    let cluster = RedisCluster::start_tls(3, 0, &cert.cert, &cert.key, &ca.cert);
    let b = Backend::start("app");
    let redis = |ca: &CertFiles| {
        format!(
            "mode = \"cluster\"\nnodes = {}\ntls = true\nca_file = \"{}\"",
            quoted(&cluster.tls_nodes()),
            ca.cert.display()
        )
    };
    // The cluster client's first connect is three TLS handshakes and a topology read;
    // under the full suite on 2 cores the tests' 200 ms bound kept timing out (CI,
    // 2026-11-28: no connection within the 20 s deadline). What is tested here is the
    // CA, not the bound: give it 2 s.
    let cfg = |ca: &CertFiles| {
        let c = config(&b, &redis(ca), "pcx-ctls", 60, 100);
        assert!(c.contains("\ntimeout_ms = 200\n"), "{c}");
        c.replace("\ntimeout_ms = 200\n", "\ntimeout_ms = 2000\n")
    };
    let pg = Proxy::start(&cfg(&ca));
    let pb = Proxy::start(&cfg(&other));
    send_twelve_keys_to_both(&pg, &pb);
    let total = || cluster_total(&cluster, "pcx-ctls");
    eventually(
        DEADLINE,
        || {
            format!(
                "right CA: healthy, 36 counted (got {}); logs:\n{}",
                total(),
                pg.logs()
            )
        },
        || healthy(&pg) && total() == 36,
    );
    eventually(
        DEADLINE,
        || format!("wrong CA: unhealthy; logs:\n{}", pb.logs()),
        || unhealthy(&pb) && pb.logs().contains("TLS failed"),
    );
}
