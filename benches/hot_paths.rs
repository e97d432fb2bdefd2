//! Hot-path benches: the shedding gate, the rate-limit decision at 1, 10k and
//! 1M tracked keys, the per-response cull accounting, and backend selection
//! per balancing mode (vs plain round robin), and route lookup with 1 and 100,000 routes
//! (CONTRACT §17: the second costs at most twice the first), and the body of a 429 as
//! text, problem details and a page (`[errors]`).
//!
//! Run: `cargo bench --bench hot_paths`

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use portcullis_policy::cull::ErrorWindow;
use portcullis_policy::ratelimit::{approx_bytes_per_key, Limiter, RateLimitParams};
use portcullis_policy::shed::Priority;
use portcullis_policy::shed::Shedder;
use std::sync::atomic::{AtomicU64, Ordering};

fn shedding(c: &mut Criterion) {
    let mut g = c.benchmark_group("shed");
    let s = Shedder::new(1024);
    g.bench_function("acquire_release", |b| {
        b.iter(|| drop(black_box(s.try_acquire(Priority::Normal))))
    });
    let full = Shedder::new(1);
    let _held = full.try_acquire(Priority::Critical);
    g.bench_function("reject", |b| {
        b.iter(|| black_box(full.try_acquire(Priority::Normal)).is_none())
    });
    // Baseline: a bare atomic counter, what the gate costs at minimum.
    let bare = AtomicU64::new(0);
    g.bench_function("baseline_fetch_add_sub", |b| {
        b.iter(|| {
            bare.fetch_add(1, Ordering::AcqRel);
            bare.fetch_sub(1, Ordering::AcqRel)
        })
    });
    g.finish();
}

fn ratelimit(c: &mut Criterion) {
    eprintln!(
        "rate limit: approx bytes per tracked key = {}",
        approx_bytes_per_key()
    );
    let mut g = c.benchmark_group("ratelimit_decision");
    g.throughput(Throughput::Elements(1));
    let now_ms = 1_700_000_000_000u64;
    for &keys in &[1usize, 10_000, 1_000_000] {
        let limiter = Limiter::new(RateLimitParams {
            window_secs: 60,
            limit: u64::MAX / 4,
            max_tracked_keys: keys.max(16) * 2,
            ..RateLimitParams::default()
        });
        let names: Vec<String> = (0..keys).map(|i| format!("key-{i:08}")).collect();
        for n in &names {
            limiter.check(n, now_ms);
        }
        assert!(
            limiter.tracked_keys() >= keys * 9 / 10,
            "keys evicted during setup"
        );
        let mut i = 0usize;
        g.bench_with_input(BenchmarkId::new("tracked_keys", keys), &keys, |b, _| {
            b.iter(|| {
                i = (i + 7919) % names.len();
                black_box(limiter.check(&names[i], now_ms))
            })
        });
        // The same keys written into a stack buffer per decision: in the proxy the
        // key is a header value just parsed (in cache), not a String somewhere in
        // a 1M-entry heap, so this isolates the limiter's own memory traffic.
        let mut j = 0usize;
        g.bench_with_input(
            BenchmarkId::new("tracked_keys_key_in_cache", keys),
            &keys,
            |b, _| {
                b.iter(|| {
                    j = (j + 7919) % keys;
                    let mut buf = *b"key-00000000";
                    let mut n = j;
                    for d in buf[4..].iter_mut().rev() {
                        *d = b'0' + (n % 10) as u8;
                        n /= 10;
                    }
                    black_box(limiter.check(&buf[..], now_ms))
                })
            },
        );
        // A key over its limit: the cheap path abusive clients hit.
        let over = Limiter::new(RateLimitParams {
            limit: 1,
            max_tracked_keys: keys.max(16) * 2,
            ..RateLimitParams::default()
        });
        over.check("hot", now_ms);
        if keys == 1 {
            g.bench_function("over_limit_key", |b| {
                b.iter(|| black_box(over.check("hot", now_ms)))
            });
        }
    }
    g.finish();
}

fn cull_accounting(c: &mut Criterion) {
    let w = ErrorWindow::new(60);
    let mut n = 0u64;
    c.bench_function("cull_record_response", |b| {
        b.iter(|| {
            n += 1;
            w.record(black_box(1_700_000_000 + n / 100_000), n.is_multiple_of(97))
        })
    });
}

/// The retry budget per request: count the first attempt, then ask for a
/// retry (the shared windowed counter under both).
fn retry_budget(c: &mut Criterion) {
    use portcullis::balance::retry_budget::RetryBudget;
    let budget = RetryBudget::new(0.2);
    let mut n = 0u64;
    c.bench_function("retry_budget_request_and_retry", |b| {
        b.iter(|| {
            n += 1;
            let now = black_box(1_700_000_000 + n / 100_000);
            budget.record_request(now);
            black_box(budget.try_retry(now))
        })
    });
}

/// `Pool::select` for each balancing mode over 8 backends (no health checks,
/// nothing culled): what a mode costs per request over round robin.
fn balance_select(c: &mut Criterion) {
    use portcullis::upstream::{Pool, Tried};
    let mut g = c.benchmark_group("balance_select");
    let backends: Vec<String> = (0..8)
        .map(|i| format!("\"127.0.0.1:{}\"", 9001 + i))
        .collect();
    let modes = [
        ("round_robin", ""),
        ("weighted_round_robin", "weights = [3, 1, 1, 1, 1, 1, 1, 1]"),
        ("least_requests", "balance = \"least_requests\""),
        ("random", "balance = \"random\""),
        ("consistent_hash", "balance = \"consistent_hash\""),
        ("shard_2_of_8", "shard_size = 2"),
    ];
    let keys: Vec<String> = (0..1024).map(|i| format!("key-{i:06}")).collect();
    for (name, extra) in modes {
        let text = format!(
            "[[upstreams]]\nname = \"app\"\nbackends = [{}]\n{extra}\n",
            backends.join(", ")
        );
        let cfg = match portcullis::config::parse("bench.toml", &text) {
            Ok(c) => c,
            Err(e) => panic!("{e:?}"),
        };
        let pool = Pool::build(&cfg.upstreams[0], 60, &Default::default(), None);
        let tried = Tried::default();
        let mut i = 0usize;
        g.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 7) % keys.len();
                black_box(pool.select(&tried, keys[i].as_bytes()))
            })
        });
    }
    g.finish();
}

/// `RouteTable::lookup` with 1 and 100,000 routes (host-specific and any-host, prefixes
/// of several lengths), and the linear scan it replaced for comparison.
fn route_lookup(c: &mut Criterion) {
    use portcullis::config::Route;
    use portcullis::state::RouteTable;
    let mut g = c.benchmark_group("route_lookup");
    let route = |host: Option<String>, prefix: String| Route {
        host,
        path_prefix: prefix,
        upstream: 0,
        priority: Priority::Normal,
        headers: portcullis::edge::HeaderRules::new(),
        methods: Vec::new(),
        client_cidrs: None,
        action: portcullis::config::RouteAction::Proxy,
        policy_mask: u64::MAX,
    };
    // The same request in both cases, matching the same route.
    let wanted = 50_004usize;
    let host = format!("h{}.test", wanted % 100);
    let path = format!("/svc/{wanted}/{}/items/42", "v".repeat(wanted % 7));
    let one = |i: usize| {
        let host = (i % 3 != 2).then(|| format!("h{}.test", i % 100));
        route(host, format!("/svc/{i}/{}", "v".repeat(i % 7)))
    };
    for n in [1usize, 100_000] {
        let mut routes: Vec<Route> = if n == 1 {
            vec![one(wanted)]
        } else {
            (0..n).map(one).collect()
        };
        routes.push(route(None, "/".into()));
        // The order config validation gives them.
        routes.sort_by(|a, b| {
            b.path_prefix
                .len()
                .cmp(&a.path_prefix.len())
                .then(b.host.is_some().cmp(&a.host.is_some()))
        });
        let table = RouteTable::build(&routes);
        let hit = table
            .lookup(&host, &path)
            .map(|i| routes[i].path_prefix.as_str());
        let expected = format!("/svc/{wanted}/{}", "v".repeat(wanted % 7));
        assert_eq!(hit, Some(expected.as_str()));
        g.bench_function(BenchmarkId::new("table", n), |b| {
            b.iter(|| black_box(table.lookup(black_box(&host), black_box(&path))))
        });
        g.bench_function(BenchmarkId::new("linear_scan", n), |b| {
            b.iter(|| {
                black_box(routes.iter().position(|r| {
                    path.starts_with(r.path_prefix.as_str())
                        && r.host
                            .as_deref()
                            .is_none_or(|h| h.eq_ignore_ascii_case(&host))
                }))
            })
        });
    }
    g.finish();
}

/// The tenant gate's lookup (SHA-256 of the key, then one hash-map probe) among 10 and
/// 100,000 tenants, and a concurrency slot taken and released (CONTRACT §14).
fn tenant_lookup(c: &mut Criterion) {
    use portcullis::config::tenants::{Period, Tenant, TenantSettings, Tier};
    let mut g = c.benchmark_group("tenant");
    let metrics = portcullis::metrics::Metrics::new();
    for n in [10usize, 100_000] {
        let tenants = (0..n)
            .map(|i| {
                let mut h = [0u8; 32];
                h.copy_from_slice(&sha256_of(format!("key-{i}").as_bytes()));
                Tenant {
                    name: format!("t{i}").into(),
                    tier: 0,
                    keys: vec![h],
                    from_store: false,
                }
            })
            .collect();
        let settings = TenantSettings {
            file: Some("t.toml".into()),
            tiers: vec![Tier {
                name: "pro".into(),
                limit: 100,
                concurrency: 1_000,
                priority: None,
                quota: 0,
                period: Period::Day,
            }],
            tenants,
            ..Default::default()
        };
        let reg = portcullis::tenants::Registry::build(&settings, None, &metrics);
        let key = format!("key-{}", n - 1);
        g.bench_with_input(BenchmarkId::new("lookup", n), &key, |b, k| {
            b.iter(|| black_box(reg.lookup(black_box(k.as_bytes()))).is_some())
        });
        g.bench_with_input(BenchmarkId::new("lookup_unknown", n), &key, |b, _| {
            b.iter(|| black_box(reg.lookup(black_box(b"no-such-key"))).is_none())
        });
        if let Some(t) = reg.lookup(key.as_bytes()) {
            g.bench_with_input(BenchmarkId::new("enter_release", n), t, |b, t| {
                b.iter(|| drop(black_box(t.enter())))
            });
        }
    }
    g.finish();
}

fn sha256_of(bytes: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).to_vec()
}

/// The body of a 429 under each `[errors]` choice: the text is a static slice, the
/// others one buffer each (the baseline is a `Bytes` of a static slice).
fn error_body(c: &mut Criterion) {
    use portcullis::respond::body::{Answer, ErrorBodies, Format, Page};
    let mut g = c.benchmark_group("error_body");
    let answer = Answer {
        status: 429,
        kind: Some("rate-limited"),
        text: "portcullis: rate limited\n",
        retry_after: Some(42),
        request_id: Some(b"5f0c1e2d3c4b5a69788796a5b4c3d2e1"),
    };
    let text = ErrorBodies::default();
    let json = ErrorBodies::new(Format::ProblemJson, Vec::new());
    let html = http::HeaderValue::from_static("text/html");
    let template = "<html><body><h1>{status}</h1><p>Too many requests: try again in \
                    {retry_after} s.</p><p>{request_id}</p></body></html>\n"
        .repeat(4);
    let page = ErrorBodies::new(
        Format::Text,
        vec![(429, Page::new(429, template.as_bytes(), html))],
    );
    for (name, bodies) in [("text", &text), ("problem_json", &json), ("page", &page)] {
        g.bench_function(name, |b| {
            b.iter(|| black_box(bodies.render(black_box(&answer))))
        });
    }
    g.bench_function("baseline_static_bytes", |b| {
        b.iter(|| black_box(bytes::Bytes::from_static(black_box(answer.text).as_bytes())))
    });
    g.finish();
}

criterion_group!(
    benches,
    error_body,
    tenant_lookup,
    shedding,
    ratelimit,
    cull_accounting,
    retry_budget,
    balance_select,
    route_lookup
);
criterion_main!(benches);
