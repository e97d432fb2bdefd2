//! Shuffle sharding (CONTRACT §10 `shard_size`).

use portcullis_test_kit as support;

use std::collections::{BTreeSet, HashMap};
use support::*;

#[test]
fn a_key_stays_in_its_shard_and_a_failing_shard_spares_other_keys() {
    let backends: Vec<Backend> = (0..6).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = backends.iter().collect();
    let cfg = balanced_app(
        &refs,
        "shard_size = 2\nhash_key = \"header:x-tenant\"\nretries = 0",
    );
    let p = Proxy::start(&cfg);

    // Each tenant's requests land on exactly its two backends.
    let mut shards: HashMap<String, BTreeSet<String>> = HashMap::new();
    for t in 0..30 {
        let tenant = format!("tenant-{t}");
        let set = shards.entry(tenant.clone()).or_default();
        for _ in 0..12 {
            let r = p.get("/s", &[("x-tenant", &tenant)]);
            assert_eq!(r.status, 200);
            set.insert(r.header("x-backend").unwrap_or("").to_string());
        }
        assert_eq!(set.len(), 2, "{tenant} reached {set:?}");
    }
    let distinct: BTreeSet<&BTreeSet<String>> = shards.values().collect();
    assert!(
        distinct.len() >= 8,
        "only {} distinct shards",
        distinct.len()
    );

    // The poison tenant's shard fails.
    let poison = &shards["tenant-0"];
    for b in &backends {
        if poison.contains(b.name()) {
            b.set_mode(Mode::Fail(500));
        }
    }
    let mut poison_errors = 0;
    for _ in 0..20 {
        if p.get("/s", &[("x-tenant", "tenant-0")]).status == 500 {
            poison_errors += 1;
        }
    }
    assert_eq!(
        poison_errors, 20,
        "the poison tenant's shard is all failing"
    );
    let spared: Vec<&String> = shards
        .iter()
        .filter(|(_, s)| s.is_disjoint(poison))
        .map(|(t, _)| t)
        .collect();
    assert!(spared.len() >= 5, "few disjoint tenants: {}", spared.len());
    for t in spared {
        for i in 0..10 {
            let r = p.get(&format!("/s/{i}"), &[("x-tenant", t)]);
            assert_eq!(r.status, 200, "{t} outside the failing shard saw an error");
        }
    }
}
