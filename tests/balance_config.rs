//! Validation of the balancing keys (CONTRACT §10) by `--check`.

use portcullis_test_kit as support;

use support::*;

const UP: &str =
    "[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\", \"127.0.0.1:9002\"]\n";

fn rejected(extra: &str, key: &str) {
    let (code, _, err, _) = check_config(&format!("{UP}{extra}\n"));
    assert_eq!(code, 2, "{extra:?} accepted");
    assert!(
        err.contains(key),
        "{extra:?}: error does not name {key}: {err}"
    );
}

#[test]
fn balancing_keys_are_validated_with_their_key_path() {
    let all = "balance = \"consistent_hash\"\nhash_key = \"client_ip\"\nweights = [3, 1]\n\
               retries = 2\nretry_budget_ratio = 0.5\nmax_inflight = 10\n\
               resolve_interval_seconds = 5\nshard_size = 1\n\
               [shedding]\nadaptive = true\nmin_concurrency = 4\nmax_concurrency = 100";
    let (code, out, err, _) = check_config(&format!("{UP}{all}\n"));
    assert_eq!((code, out.trim()), (0, "OK"), "{err}");

    rejected("balance = \"least_conn\"", "upstreams[0].balance");
    rejected("weights = [1]", "upstreams[0].weights");
    rejected("weights = [1, 0]", "upstreams[0].weights[1]");
    rejected("hash_key = \"cookie:x\"", "upstreams[0].hash_key");
    rejected(
        "retry_budget_ratio = 1.5",
        "upstreams[0].retry_budget_ratio",
    );
    rejected("shard_size = 3", "upstreams[0].shard_size");
    rejected(
        "resolve_interval_seconds = 0",
        "upstreams[0].resolve_interval_seconds",
    );
    rejected(
        "[shedding]\nadaptive = true\nmax_concurrency = 10\nmin_concurrency = 20",
        "shedding.min_concurrency",
    );
    rejected(
        "[shedding]\nadaptive = true\nmax_concurrency = 0",
        "shedding.adaptive",
    );
}

#[test]
fn a_hostname_backend_is_served() {
    let b = Backend::start("named");
    let p = Proxy::start(&format!(
        "[[upstreams]]\nname = \"app\"\nbackends = [\"localhost:{}\"]\nresolve_interval_seconds = 1\n\
         [rate_limit]\nenabled = false\n",
        b.port()
    ));
    for _ in 0..3 {
        assert_eq!(p.get("/", &[]).status, 200);
    }
    let status = p.status_json();
    let addr = &status["upstreams"][0]["backends"][0]["address"];
    assert_eq!(
        addr.as_str(),
        Some(format!("127.0.0.1:{}", b.port()).as_str())
    );
}
