//! Balancing policies (CONTRACT §10 `balance`, `weights`, `hash_key`) through the real binary.

use portcullis_test_kit as support;

use std::collections::HashMap;
use std::time::Duration;
use support::*;

fn backend_of(r: &Resp) -> String {
    assert_eq!(r.status, 200, "{}", r.body_str());
    r.header("x-backend").unwrap_or("").to_string()
}

#[test]
fn least_requests_favours_the_fast_backend() {
    let fast = Backend::start("fast");
    let slow = Backend::start("slow");
    slow.set_mode(Mode::Slow(Duration::from_millis(150)));
    let p = Proxy::start(&balanced_app(
        &[&fast, &slow],
        "balance = \"least_requests\"",
    ));
    let addr = p.addr();
    // 6 clients in a closed loop for 1.5 s each.
    let per_client = concurrently(6, move |_| {
        let t0 = std::time::Instant::now();
        let mut n = 0u32;
        while t0.elapsed() < Duration::from_millis(1500) {
            let r = get(&addr, "/x", &[]);
            assert_eq!(r.status, 200);
            n += 1;
        }
        n
    });
    let (f, s) = (fast.requests(), slow.requests());
    assert_eq!(u64::from(per_client.iter().sum::<u32>()), f + s);
    // Round robin would split 1:1 (and run at the slow backend's pace); the
    // power of two choices sends the slow one only what its queue allows.
    assert!(f > 8 * s, "fast {f}, slow {s}");
}

#[test]
fn weights_three_to_one_split_three_to_one() {
    let a = Backend::start("a");
    let b = Backend::start("b");
    let p = Proxy::start(&balanced_app(&[&a, &b], "weights = [3, 1]"));
    let mut order = Vec::new();
    for _ in 0..400 {
        order.push(backend_of(&p.get("/w", &[])));
    }
    assert_eq!((a.requests(), b.requests()), (300, 100));
    // Smooth: never more than three in a row on the heavy backend.
    let runs = order
        .windows(4)
        .filter(|w| w.iter().all(|x| x == "a"))
        .count();
    assert_eq!(runs, 0, "bursty order: {:?}", &order[..16]);
}

#[test]
fn random_spreads_over_all_backends() {
    let a = Backend::start("a");
    let b = Backend::start("b");
    let c = Backend::start("c");
    let p = Proxy::start(&balanced_app(&[&a, &b, &c], "balance = \"random\""));
    for _ in 0..300 {
        backend_of(&p.get("/r", &[]));
    }
    for x in [&a, &b, &c] {
        assert!(
            (50..150).contains(&x.requests()),
            "{} got {}",
            x.name(),
            x.requests()
        );
    }
}

#[test]
fn consistent_hash_is_stable_and_removal_moves_only_the_removed_backends_keys() {
    let a = Backend::start("a");
    let b = Backend::start("b");
    let c = Backend::start("c");
    let keyed = "balance = \"consistent_hash\"\nhash_key = \"header:x-user\"";
    let p = Proxy::start(&balanced_app(&[&a, &b, &c], keyed));
    let keys: Vec<String> = (0..300).map(|i| format!("user-{i}")).collect();
    let place = |p: &Proxy| -> HashMap<String, String> {
        keys.iter()
            .map(|k| (k.clone(), backend_of(&p.get("/h", &[("x-user", k)]))))
            .collect()
    };
    let before = place(&p);
    assert_eq!(before, place(&p), "a key moved without any change");
    for x in ["a", "b", "c"] {
        let n = before.values().filter(|v| *v == x).count();
        assert!((50..150).contains(&n), "{x} holds {n} of 300 keys");
    }

    // Remove c by reload.
    p.rewrite_config(&balanced_app(&[&a, &b], keyed));
    let r = post(&p.admin_addr(), "/reload", &[], b"");
    assert_eq!(r.status, 200, "reload: {}", r.body_str());
    let after = place(&p);
    let moved: Vec<&String> = keys.iter().filter(|k| before[*k] != after[*k]).collect();
    for k in &moved {
        assert_eq!(before[*k], "c", "{k} moved from a backend that stayed");
    }
    let on_c = before.values().filter(|v| *v == "c").count();
    assert_eq!(moved.len(), on_c, "every key of c moved, nothing else");
    let share = moved.len() as f64 / keys.len() as f64;
    assert!(
        (0.18..0.5).contains(&share),
        "moved share {share} (about 1/3 expected)"
    );
}
