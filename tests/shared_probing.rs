//! Shared probing (`[upstreams.health_check] shared = true`, `probers`), end to end: three
//! real instances on one real `redis-server`, six real backends. Each instance sends its
//! own `x-probe-from` header, so a backend knows who probed it.
//!
//! Before shared probing, `shared = true` was refused by `--check` and every instance
//! probed every backend: each backend took 3 probes per interval here, a backend failing
//! toward one instance only was out on that instance, and nothing was followed.

use portcullis_test_kit as support;

use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};
use support::*;

/// Every instance probes at this pace (a settled backend every `INTERVAL`).
const INTERVAL: Duration = Duration::from_millis(1000);
const HEADER: &str = "x-probe-from";
/// The instances' header values (static: `Mode::FailFor` takes them).
const LABELS: [&str; 8] = ["i0", "i1", "i2", "i3", "i4", "i5", "i6", "i7"];

fn config(
    redis: Option<&str>,
    prefix: &str,
    backends: &[String],
    label: &str,
    shared: bool,
    probers: u32,
) -> String {
    let list: Vec<String> = backends.iter().map(|b| format!("\"{b}\"")).collect();
    let store = redis.map_or(String::new(), |url| {
        format!("[redis]\nurl = \"{url}\"\nkey_prefix = \"{prefix}\"\ntimeout_ms = 300\n\n")
    });
    format!(
        "{store}[[upstreams]]\nname = \"app\"\nbackends = [{}]\n\
         [upstreams.health_check]\npath = \"/hc\"\ninterval_ms = {}\nfast_interval_ms = 500\n\
         rise = 1\nfall = 1\nshared = {shared}\nprobers = {probers}\n\
         headers = {{ \"{HEADER}\" = \"{label}\" }}\n\n\
         [rate_limit]\nenabled = false\n[culling]\nenabled = false\n",
        list.join(", "),
        INTERVAL.as_millis(),
    )
}

fn records(p: &Proxy) -> Vec<Value> {
    serde_json::from_str::<Value>(&p.admin_get("/backends").body_str())
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

fn record(p: &Proxy, addr: &str) -> Value {
    records(p)
        .into_iter()
        .find(|b| b["upstream"] == "app" && b["address"] == addr)
        .unwrap_or(Value::Null)
}

/// The probers `p` names for `addr`, as labels.
fn probers_of(
    p: &Proxy,
    addr: &str,
    label_of: &HashMap<String, &'static str>,
) -> BTreeSet<&'static str> {
    record(p, addr)["check"]["probers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| {
                    // `host:pid-tag`
                    let id = i.as_str()?.rsplit_once('-')?.0;
                    label_of.get(id).copied()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The health probes `b` received, by sender.
fn probes_by(b: &Backend) -> HashMap<String, usize> {
    let mut by = HashMap::new();
    for r in b.received().iter().filter(|r| r.path == "/hc") {
        *by.entry(r.header(HEADER).unwrap_or("?").to_string())
            .or_insert(0) += 1;
    }
    by
}

fn total_probes(b: &Backend) -> usize {
    probes_by(b).values().sum()
}

/// Instance `host:pid` (the store's id without its random tag) → label.
fn labels(fleet: &[Proxy]) -> HashMap<String, &'static str> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    fleet
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("{host}:{}", p.pid()), LABELS[i]))
        .collect()
}

struct Fleet {
    redis: Option<RedisServer>,
    backends: Vec<Backend>,
    proxies: Vec<Proxy>,
}

fn fleet(n: usize, shared: bool, probers: u32, with_redis: bool) -> Fleet {
    let redis = with_redis.then(RedisServer::start);
    let backends: Vec<Backend> = (0..6).map(|i| Backend::start(&format!("b{i}"))).collect();
    let addrs: Vec<String> = backends.iter().map(Backend::addr).collect();
    let prefix = format!("sp{}", std::process::id());
    let url = redis.as_ref().map(RedisServer::url);
    let proxies = (0..n)
        .map(|i| {
            Proxy::start(&config(
                url.as_deref(),
                &prefix,
                &addrs,
                LABELS[i],
                shared,
                probers,
            ))
        })
        .collect();
    Fleet {
        redis,
        backends,
        proxies,
    }
}

/// Probes per backend per interval, from the backends' own counts: waits until they
/// received `total` probes in all, then divides each one's count by the intervals that
/// took.
fn probes_per_interval(f: &Fleet, total: usize) -> Vec<f64> {
    for b in &f.backends {
        b.reset_counters();
    }
    let started = Instant::now();
    eventually(
        DEADLINE,
        || "probes".into(),
        || f.backends.iter().map(total_probes).sum::<usize>() >= total,
    );
    let took = started.elapsed().as_secs_f64() / INTERVAL.as_secs_f64();
    f.backends
        .iter()
        .map(|b| total_probes(b) as f64 / took)
        .collect()
}

/// Three instances, `probers = 2`: each backend is probed by its two probers only (the
/// ones `/backends` names on every instance), about 2 probes per interval instead of 3;
/// a backend failing toward one prober stays up everywhere, one failing toward both is
/// down everywhere (the non-prober follows without probing); a killed prober's
/// backends are taken over within three intervals; with Redis killed every instance
/// probes every backend itself again and still takes a failing one out.
#[test]
fn probers_share_the_probing_and_the_fleet_follows_their_majority() {
    let mut f = fleet(3, true, 2, true);
    let label_of = labels(&f.proxies);
    let addrs: Vec<String> = f.backends.iter().map(Backend::addr).collect();

    // Every instance follows the fleet for every backend, and they agree on the probers.
    eventually(
        DEADLINE,
        || format!("{:?}", records(&f.proxies[0])),
        || {
            addrs.iter().all(|a| {
                let seen: Vec<BTreeSet<&str>> = f
                    .proxies
                    .iter()
                    .map(|p| probers_of(p, a, &label_of))
                    .collect();
                seen[0].len() == 2
                    && seen.iter().all(|s| *s == seen[0])
                    && f.proxies
                        .iter()
                        .all(|p| record(p, a)["check"]["source"] == "fleet")
            })
        },
    );
    let probers: Vec<BTreeSet<&str>> = addrs
        .iter()
        .map(|a| probers_of(&f.proxies[0], a, &label_of))
        .collect();
    // The page, in a real browser, says the state is the fleet's verdict.
    let bin =
        chromium().unwrap_or_else(|| panic!("chromium is not installed: run scripts/setup.sh"));
    let dom = dump_dom(bin, &format!("http://{}/", f.proxies[0].admin_addr()));
    assert!(
        dom.contains(">fleet"),
        "the page shows no fleet verdict:\n{dom}"
    );

    // Probe traffic: ~2 per backend per interval, each from its probers.
    // 6 backends x 2 probers x 4 intervals
    let rates = probes_per_interval(&f, 48);
    eprintln!("3 instances, probers = 2: probes per backend per interval {rates:.2?}");
    for (i, b) in f.backends.iter().enumerate() {
        let from: BTreeSet<String> = probes_by(b).into_keys().collect();
        let expected: BTreeSet<String> = probers[i].iter().map(|s| s.to_string()).collect();
        assert!(
            from.is_subset(&expected),
            "{}: probed by {from:?}, probers {expected:?}",
            addrs[i]
        );
        // two probers probe a settled backend at most once an interval each (all three
        // instances made 2.4 here: the loop's 250 ms tick stretches an interval)
        assert!(
            rates[i] <= 2.2 && rates[i] >= 1.0,
            "{}: {} probes per interval",
            addrs[i],
            rates[i]
        );
    }

    // A partition: b0 fails toward one of its probers only; b1 fails toward both.
    let lone = *probers[0].iter().next().unwrap_or(&"i0");
    f.backends[0].set_mode(Mode::FailFor(HEADER, lone, 503));
    f.backends[1].set_mode(Mode::Fail(503));
    let non_prober = (0..3)
        .find(|i| !probers[1].contains(LABELS[*i]))
        .unwrap_or(0);
    eventually(
        DEADLINE,
        || {
            format!(
                "b1 on the non-prober: {}",
                record(&f.proxies[non_prober], &addrs[1])
            )
        },
        || {
            f.proxies
                .iter()
                .all(|p| record(p, &addrs[1])["state"] == "unhealthy")
        },
    );
    let followed = record(&f.proxies[non_prober], &addrs[1]);
    assert_eq!(followed["check"]["source"], "fleet", "{followed}");
    assert_eq!(followed["check"]["probing"], false, "{followed}");
    assert_eq!(
        followed["check"]["result"], "status 503",
        "the probers' check: {followed}"
    );
    assert!(
        !probes_by(&f.backends[1]).contains_key(LABELS[non_prober]),
        "the non-prober did not probe b1"
    );
    // b0: its lone failing prober has failed it three times over; up on every instance
    f.backends[0].reset_counters();
    eventually(
        DEADLINE,
        || format!("{:?}", probes_by(&f.backends[0])),
        || probes_by(&f.backends[0]).get(lone).copied().unwrap_or(0) >= 3,
    );
    for p in &f.proxies {
        let r = record(p, &addrs[0]);
        assert_eq!(r["state"], "up", "a minority does not take it out: {r}");
    }
    f.backends[0].set_mode(Mode::Ok);
    f.backends[1].set_mode(Mode::Ok);
    eventually(
        DEADLINE,
        || "b1 back".into(),
        || {
            f.proxies
                .iter()
                .all(|p| record(p, &addrs[1])["state"] == "up")
        },
    );

    // Kill the instance probing the most backends: a survivor not among a victim
    // backend's probers takes it over within three intervals.
    let victim = (0..3)
        .max_by_key(|i| probers.iter().filter(|p| p.contains(LABELS[*i])).count())
        .unwrap_or(0);
    let taken: Vec<usize> = (0..6)
        .filter(|b| probers[*b].contains(LABELS[victim]))
        .collect();
    for b in &f.backends {
        b.reset_counters();
    }
    let killed = Instant::now();
    f.proxies[victim].kill();
    let survivors: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    eventually(
        INTERVAL * 3 + Duration::from_secs(2),
        || {
            format!(
                "after the kill: {:?}",
                taken
                    .iter()
                    .map(|b| probes_by(&f.backends[*b]))
                    .collect::<Vec<_>>()
            )
        },
        || {
            taken.iter().all(|b| {
                let by = probes_by(&f.backends[*b]);
                survivors.iter().all(|s| by.contains_key(LABELS[*s]))
            })
        },
    );
    let takeover = killed.elapsed();
    eprintln!("a killed prober's backends were taken over in {takeover:?}");
    for s in &survivors {
        for b in &taken {
            let named = probers_of(&f.proxies[*s], &addrs[*b], &label_of);
            assert!(!named.contains(LABELS[victim]), "{named:?}");
        }
    }
}

/// `probers = 1`: each backend is probed by one instance only. Redis killed: once no
/// prober has published for three intervals, every instance probes every backend itself
/// (`source` = `local`) and still takes a failing one out, while requests are served;
/// Redis back: the fleet follows its probers again.
#[test]
fn with_the_store_down_every_instance_probes_for_itself() {
    let mut f = fleet(3, true, 1, true);
    let label_of = labels(&f.proxies);
    let addrs: Vec<String> = f.backends.iter().map(Backend::addr).collect();
    let all_from = |p: &Proxy, source: &str| {
        addrs
            .iter()
            .all(|a| record(p, a)["check"]["source"] == source)
    };
    eventually(
        DEADLINE,
        || format!("{:?}", records(&f.proxies[0])),
        || f.proxies.iter().all(|p| all_from(p, "fleet")),
    );
    let probers: Vec<BTreeSet<&str>> = addrs
        .iter()
        .map(|a| probers_of(&f.proxies[0], a, &label_of))
        .collect();
    assert!(probers.iter().all(|p| p.len() == 1), "{probers:?}");
    probes_per_interval(&f, 18);
    for (i, b) in f.backends.iter().enumerate() {
        let from: BTreeSet<String> = probes_by(b).into_keys().collect();
        assert!(from.len() <= 1, "{}: probed by {from:?}", addrs[i]);
    }

    let mut redis = f.redis.take().unwrap_or_else(RedisServer::start);
    redis.kill();
    let down = Instant::now();
    eventually(
        DEADLINE,
        || format!("{:?}", records(&f.proxies[0])),
        || f.proxies.iter().all(|p| all_from(p, "local")),
    );
    let fallback = down.elapsed();
    eprintln!("with Redis down, every instance probed for itself after {fallback:?}");
    for b in &f.backends {
        b.reset_counters();
    }
    eventually(
        DEADLINE,
        || format!("{:?}", f.backends.iter().map(probes_by).collect::<Vec<_>>()),
        || f.backends.iter().all(|b| probes_by(b).len() == 3),
    );
    f.backends[2].set_mode(Mode::Fail(503));
    eventually(
        DEADLINE,
        || format!("{}", record(&f.proxies[0], &addrs[2])),
        || {
            f.proxies
                .iter()
                .all(|p| record(p, &addrs[2])["state"] == "unhealthy")
        },
    );
    let r = f.proxies[0].get("/", &[]);
    assert_eq!(r.status, 200, "requests are served with the store down");

    // The store back: the fleet follows its probers again (b2 still down everywhere).
    redis.restart();
    eventually(
        DEADLINE,
        || format!("{:?}", records(&f.proxies[0])),
        || f.proxies.iter().all(|p| all_from(p, "fleet")),
    );
    for p in &f.proxies {
        assert_eq!(record(p, &addrs[2])["state"], "unhealthy");
    }
}

/// Probe counts per backend per interval at 1, 3 and 8 instances, shared (`probers =
/// 2`) and not: `cargo nextest run --test shared_probing --run-ignored only --no-capture`.
#[test]
#[ignore = "a measurement: starts up to 8 instances"]
fn probe_counts_at_1_3_and_8_instances() {
    let mut table = Vec::new();
    for n in [1usize, 3, 8] {
        for shared in [false, true] {
            let f = fleet(n, shared, 2, true);
            // let every instance settle into its role
            let settled = Instant::now();
            eventually(
                DEADLINE,
                || "settle".into(),
                || settled.elapsed() >= INTERVAL * 3,
            );
            // about 5 intervals' worth at the count expected
            let expected = if shared { n.min(2) } else { n };
            let rates = probes_per_interval(&f, 6 * expected * 5);
            let mean = rates.iter().sum::<f64>() / rates.len() as f64;
            let max = rates.iter().copied().fold(0.0, f64::max);
            table.push(format!(
                "instances {n}  shared {shared:<5}  probes/backend/interval mean {mean:.2} max {max:.2}"
            ));
        }
    }
    eprintln!("{}", table.join("\n"));
}
