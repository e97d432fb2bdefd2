//! Blame the tenant (CONTRACT §15, `[culling] blame_tenants`): a poison key whose
//! requests fail on two backends while every other key succeeds there is limited (429,
//! `RateLimit-Policy: "blame";q=0`) for `cooldown_seconds`, counted in
//! `portcullis_blamed_total{tenant}`, and no backend is culled for its errors. Without
//! `blame_tenants` the same traffic culls the two backends. Real proxy, real backends that
//! fail only for one key.

use portcullis_test_kit as support;

use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;
use support::*;

/// The answers so far (a poisoned lock still holds them).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

const POISON: &str = "poison";
const GOOD: [&str; 3] = ["good-1", "good-2", "good-3"];

fn config(bs: &[Backend], blame: bool) -> String {
    let list: Vec<String> = bs.iter().map(|b| format!("\"{}\"", b.addr())).collect();
    format!(
        r#"[[upstreams]]
name = "app"
backends = [{}]
retries = 0

[rate_limit]
enabled = false

[culling]
enabled = true
window_seconds = 10
error_threshold = 5
check_interval_seconds = 1
cooldown_seconds = 30
max_culled_fraction = 0.5
blame_tenants = {blame}
"#,
        list.join(", ")
    )
}

/// (key, status, `RateLimit-Policy`) of every answer.
type Answers = Arc<Mutex<Vec<(&'static str, u16, Option<String>)>>>;

struct Clients {
    stop: Arc<AtomicBool>,
    answers: Answers,
    handles: Vec<JoinHandle<()>>,
}

impl Clients {
    /// One keep-alive client per key, paced.
    fn start(addr: &str, keys: &[&'static str]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let answers: Answers = Arc::default();
        let handles = keys
            .iter()
            .map(|key| {
                let (stop, answers, addr, key) =
                    (stop.clone(), answers.clone(), addr.to_string(), *key);
                thread::spawn(move || {
                    let mut conn: Option<Conn> = None;
                    while !stop.load(Ordering::SeqCst) {
                        let res = match conn.as_mut() {
                            Some(c) => Ok(c),
                            None => Conn::open(&addr).map(|c| conn.insert(c)),
                        }
                        .and_then(|c| c.request("GET", "/x", &[("x-api-key", key)], b""));
                        match res {
                            Ok(r) => {
                                if r.header("connection").is_some_and(|v| v == "close") {
                                    conn = None;
                                }
                                let policy = r.header("ratelimit-policy").map(String::from);
                                lock(&answers).push((key, r.status, policy));
                            }
                            Err(_) => {
                                conn = None;
                                lock(&answers).push((key, 0, None));
                            }
                        }
                        thread::sleep(Duration::from_millis(5));
                    }
                })
            })
            .collect();
        Clients {
            stop,
            answers,
            handles,
        }
    }

    fn count(&self, key: &str, status: u16) -> usize {
        lock(&self.answers)
            .iter()
            .filter(|(k, s, _)| *k == key && *s == status)
            .count()
    }

    fn finish(mut self) -> Vec<(&'static str, u16, Option<String>)> {
        self.stop.store(true, Ordering::SeqCst);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
        lock(&self.answers).clone()
    }
}

/// Four backends; the first two fail every request of the poison key (a 500), the others
/// serve it.
fn backends() -> Vec<Backend> {
    let bs: Vec<Backend> = (0..4).map(|i| Backend::start(&format!("b{i}"))).collect();
    for b in &bs[..2] {
        b.set_mode(Mode::FailFor("x-api-key", POISON, 500));
    }
    bs
}

fn culled(p: &Proxy) -> Vec<String> {
    let st = p.status_json();
    st["upstreams"][0]["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["state"] != "up")
        .map(|b| b["address"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn a_poison_key_is_limited_while_other_keys_and_every_backend_stay_in() {
    let bs = backends();
    let p = Proxy::start(&config(&bs, true));
    let mut keys = GOOD.to_vec();
    keys.push(POISON);
    let clients = Clients::start(&p.addr(), &keys);
    eventually(
        DEADLINE,
        || format!("the poison key limited: {}", p.status_json()),
        || clients.count(POISON, 429) >= 20,
    );
    // Limited with the blame policy, counted once, under a bounded tenant label.
    let answers = clients.finish();
    let limited: Vec<_> = answers
        .iter()
        .filter(|(k, s, _)| *k == POISON && *s == 429)
        .collect();
    assert!(limited
        .iter()
        .all(|(_, _, policy)| policy.as_deref() == Some("\"blame\";q=0")));
    assert_eq!(
        p.metric("portcullis_blamed_total{tenant=\"unknown\"}"),
        Some(1.0)
    );
    // After the first 429 the poison key never reached a backend again (cooldown 30 s).
    let poison: Vec<u16> = answers
        .iter()
        .filter(|(k, _, _)| *k == POISON)
        .map(|(_, s, _)| *s)
        .collect();
    let first = poison.iter().position(|s| *s == 429).unwrap_or(0);
    assert!(poison[first..].iter().all(|s| *s == 429), "{poison:?}");
    // Every other key was served throughout.
    for key in GOOD {
        let theirs: Vec<u16> = answers
            .iter()
            .filter(|(k, _, _)| *k == key)
            .map(|(_, s, _)| *s)
            .collect();
        assert!(
            !theirs.is_empty() && theirs.iter().all(|s| *s == 200),
            "{key}: {theirs:?}"
        );
    }
    // No backend culled, none culled since, and the journal says why.
    let still = wait_until(Duration::from_secs(3), || !culled(&p).is_empty());
    assert!(!still, "no backend culled: {}", p.status_json());
    assert_eq!(
        p.metric("portcullis_cull_decisions_total{result=\"culled\"}"),
        Some(0.0)
    );
    let st = p.status_json();
    let blamed: Vec<&Value> = st["culling"]["recent_decisions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["result"] == "blamed")
        .collect();
    assert_eq!(blamed.len(), 1, "{st}");
    assert_eq!(blamed[0]["rule"], "blame_tenants");
    let figures = blamed[0]["figures"].as_str().unwrap_or("");
    assert!(figures.contains("on 2 backends"), "{figures}");
    assert!(!figures.contains(POISON), "never the raw key: {figures}");
    assert!(
        !p.metrics().contains(POISON),
        "never the raw key in a label"
    );
}

/// The control: the same traffic without `blame_tenants` culls the two backends the
/// poison key fails on (so the test above shows what blame prevents).
#[test]
fn without_blame_the_same_poison_key_culls_backends() {
    let bs = backends();
    let p = Proxy::start(&config(&bs, false));
    let mut keys = GOOD.to_vec();
    keys.push(POISON);
    let clients = Clients::start(&p.addr(), &keys);
    eventually(
        DEADLINE,
        || format!("backends culled: {}", p.status_json()),
        || culled(&p).len() == 2,
    );
    let mut c = culled(&p);
    c.sort();
    let mut want = vec![bs[0].addr(), bs[1].addr()];
    want.sort();
    assert_eq!(c, want);
    assert_eq!(clients.count(POISON, 429), 0);
    clients.finish();
}

/// Fleet-wide through the store, like a cull: two proxies on one Redis; the poison key's
/// requests (and so its errors) go through the first only, and the second limits it too.
#[test]
fn a_blame_is_shared_through_redis_with_the_rest_of_the_fleet() {
    let redis = RedisServer::start();
    let bs = backends();
    let conf = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"gblame\"\n\n{}",
        redis.url(),
        config(&bs, true)
    );
    let (a, b) = (Proxy::start(&conf), Proxy::start(&conf));
    let mut keys = GOOD.to_vec();
    keys.push(POISON);
    let clients = Clients::start(&a.addr(), &keys);
    eventually(
        DEADLINE,
        || {
            format!(
                "the poison key limited on the first proxy: {}",
                a.status_json()
            )
        },
        || clients.count(POISON, 429) >= 5,
    );
    clients.finish();
    // The second proxy saw none of its errors, and limits it all the same.
    eventually(
        DEADLINE,
        || "the poison key limited on the second proxy".into(),
        || {
            let r = b.get("/x", &[("x-api-key", POISON)]);
            r.status == 429 && r.header("ratelimit-policy") == Some("\"blame\";q=0")
        },
    );
    assert_eq!(b.get("/x", &[("x-api-key", GOOD[0])]).status, 200);
    // Counted where it was decided; the store holds a hash of the key, never the key.
    assert_eq!(
        a.metric("portcullis_blamed_total{tenant=\"unknown\"}"),
        Some(1.0)
    );
    let keys = redis.cmd(&["KEYS", "gblame:*blame*"]);
    assert!(keys.contains("blame:app"), "{keys}");
    let fields = redis.cmd(&["HKEYS", "gblame:cull:{gblame}:blame:app"]);
    assert!(!fields.contains(POISON), "{fields}");
    assert!(
        culled(&a).is_empty() && culled(&b).is_empty(),
        "no backend culled: {}\n{}\n{}",
        a.status_json()["culling"],
        b.status_json()["culling"],
        a.logs()
    );
}

/// With tenants (CONTRACT §14) the identity is the tenant: the blame is counted under the
/// tenant's name, and every key of the tenant is limited, also one that never failed.
#[test]
fn a_tenant_is_blamed_by_name_and_all_its_keys_are_limited() {
    use sha2::{Digest, Sha256};
    let bs = backends();
    let dir = std::env::temp_dir().join(format!("gray-blame-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let hash = |k: &str| format!("sha256:{}", hex::encode(Sha256::digest(k.as_bytes())));
    let file = dir.join("tenants.toml");
    std::fs::write(
        &file,
        format!(
            "[[tenant]]\nname = \"acme\"\ntier = \"pro\"\nkeys = [\"{}\", \"{}\"]\n",
            hash(POISON),
            hash("acme-other")
        ),
    )
    .expect("write tenants file");
    let conf = config(&bs, true).replace(
        "[rate_limit]\nenabled = false\n",
        &format!(
            "[rate_limit]\nlimit = 1000000\n\n[tenants]\nfile = \"{}\"\n\n[tiers.pro]\nlimit = 1000000\n",
            file.display()
        ),
    );
    let p = Proxy::start(&conf);
    let mut keys = GOOD.to_vec();
    keys.push(POISON);
    let clients = Clients::start(&p.addr(), &keys);
    eventually(
        DEADLINE,
        || format!("the tenant limited: {}", p.status_json()),
        || clients.count(POISON, 429) >= 5,
    );
    clients.finish();
    assert_eq!(
        p.metric("portcullis_blamed_total{tenant=\"acme\"}"),
        Some(1.0)
    );
    let other = p.get("/x", &[("x-api-key", "acme-other")]);
    assert_eq!(other.status, 429, "the tenant's other key is limited too");
    assert_eq!(other.header("ratelimit-policy"), Some("\"blame\";q=0"));
    assert_eq!(p.get("/x", &[("x-api-key", GOOD[0])]).status, 200);
    assert!(culled(&p).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
