//! The files the proxy reads and the values it is given, as an attacker or a careless
//! writer offers them (the real binary, real `redis-server`):
//!
//! - a backend's cost header past 2^63 spends the tenant's quota, in the process and
//!   through Redis (which refused the flush before).

use portcullis_test_kit as support;

use sha2::{Digest, Sha256};
use std::path::Path;
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
