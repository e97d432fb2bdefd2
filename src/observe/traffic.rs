//! The operator's view of traffic (HAProxy's stats page): per backend and per
//! route, requests per second, the 2xx/4xx/5xx mix, p50/p99 latency and what is
//! open now, as `/status` reports them. The arithmetic is
//! [`portcullis_policy::traffic`]; this module holds the per-route state and
//! renders both as JSON.

use crate::config::Route;
use crate::metrics::{RouteSeries, RouteStats};
pub use portcullis_policy::traffic::RouteTraffic;
use portcullis_policy::traffic::{TrafficSnapshot, CLASSES, WINDOW_SECS};
use serde_json::{json, Value};

/// The traffic windows' clock: whole seconds since the process's first reading, from an
/// `Instant` the caller already has (no clock read of its own on the request path). The
/// windows are recorded and read on this clock only.
pub fn secs(now: std::time::Instant) -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    // The epoch is taken a day before the first reading, so a second is never before it.
    let start = START.get_or_init(|| {
        now.checked_sub(std::time::Duration::from_secs(86_400))
            .unwrap_or(now)
    });
    now.saturating_duration_since(*start).as_secs()
}

fn ms(us: Option<u64>) -> Value {
    us.map_or(Value::Null, |us| json!((us as f64) / 1000.0))
}

/// The `traffic` object of a backend or route in `/status`.
pub fn traffic_json(s: &TrafficSnapshot) -> Value {
    let codes: serde_json::Map<String, Value> = CLASSES
        .iter()
        .zip(s.classes)
        .map(|(name, n)| ((*name).to_string(), json!(n)))
        .collect();
    json!({
        "window_seconds": s.window_secs,
        "requests": s.requests,
        "per_second": s.per_second,
        "codes": codes,
        "p50_ms": ms(s.p50_us),
        "p99_ms": ms(s.p99_us),
    })
}

/// The fields `/status` adds to a backend: `inflight` (attempts open to it now),
/// `traffic` and `failing` (why the culling loop keeps it in rotation while it
/// fails, or null).
pub fn add_backend_fields(obj: &mut Value, b: &crate::upstream::BackendState, now_secs: u64) {
    if let Value::Object(m) = obj {
        m.insert("inflight".into(), json!(b.inflight()));
        m.insert(
            "traffic".into(),
            traffic_json(&b.traffic.snapshot(now_secs)),
        );
        m.insert(
            "failing".into(),
            b.failing().map_or(Value::Null, |f| json!(f.as_str())),
        );
    }
}

/// Routes `/status` lists without `routes_limit` (and without `routes=all`).
pub const ROUTES_LISTED: usize = 50;

/// Which routes `/status` lists, from its query string: by default the busiest
/// [`ROUTES_LISTED`]; `routes=all`: every route in config order; `routes_offset` and
/// `routes_limit` page through either order. Unknown parameters and values are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutesQuery {
    pub all: bool,
    pub offset: usize,
    pub limit: usize,
}

impl RoutesQuery {
    pub fn parse(query: Option<&str>) -> Self {
        let mut q = Self {
            all: false,
            offset: 0,
            limit: usize::MAX,
        };
        let mut limit = None;
        for pair in query.unwrap_or("").split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "routes" => q.all = v == "all",
                "routes_offset" => q.offset = v.parse().unwrap_or(0),
                "routes_limit" => limit = v.parse().ok(),
                _ => {}
            }
        }
        q.limit = match (limit, q.all) {
            (Some(l), _) => l,
            (None, true) => usize::MAX,
            (None, false) => ROUTES_LISTED,
        };
        q
    }
}

/// The figures of a route no request has reached (it has no window).
fn no_traffic() -> TrafficSnapshot {
    TrafficSnapshot {
        window_secs: WINDOW_SECS,
        requests: 0,
        classes: [0; CLASSES.len()],
        per_second: 0.0,
        p50_us: None,
        p99_us: None,
    }
}

/// One route of `/status` `routes`.
fn route_json(
    route: &Route,
    series: Option<&RouteSeries>,
    snap: &TrafficSnapshot,
    upstream: Option<&str>,
) -> Value {
    let label = series.map_or_else(
        || crate::observe::route_label(route),
        |s| s.label.as_str().into(),
    );
    json!({
        "route": label,
        "host": route.host,
        "path_prefix": route.path_prefix,
        "upstream": upstream,
        "inflight": series.map_or(0, |s| s.traffic.inflight()),
        "traffic": traffic_json(snap),
    })
}

/// `/status` `routes` and `routes_summary` of `rt` for `/status`'s `query` string
/// ([`routes_status`]).
pub fn routes_of(rt: &crate::state::Runtime, now_secs: u64, query: Option<&str>) -> (Value, Value) {
    routes_status(
        rt.routes_with_series(),
        rt.other_series(),
        |i| rt.pools.get(i).map(|p| p.name.as_str()),
        now_secs,
        &RoutesQuery::parse(query),
    )
}

/// `/status` `routes` and `routes_summary`. `routes` is each route of the config, then the
/// default route (requests no route matched), each with its upstream (`upstream_of` its
/// index) and traffic; by default only the busiest [`ROUTES_LISTED`] (routes with traffic
/// first, the busiest first; then the rest in config order), all of them in config order
/// with `routes=all` ([`RoutesQuery`]). `routes_summary` counts the routes configured,
/// listed and with traffic, and sums the traffic of all of them, with `other`'s: the
/// series shared by the routes past the bound on routes with series of their own (their
/// requests, in no listed route's figures, are its `other`). The work and the answer
/// grow with the routes that saw traffic and the routes listed, not the routes configured
/// (a route no request reached has no series to read).
pub fn routes_status<'a>(
    routes: impl Iterator<Item = (&'a Route, Option<&'a RouteSeries>)>,
    other: (&RouteStats, usize),
    upstream_of: impl Fn(usize) -> Option<&'a str>,
    now_secs: u64,
    query: &RoutesQuery,
) -> (Value, Value) {
    let mut totals = Totals::default();
    let empty = no_traffic();
    let json_of = |r: &Route, s: Option<&RouteSeries>, snap: &TrafficSnapshot| {
        route_json(r, s, snap, upstream_of(r.upstream))
    };
    // `routes=all`: the page asked for, in config order.
    let mut listed = Vec::new();
    // Otherwise: (open, index, route, series, snapshot) of each route with a series, and
    // enough of the others (in config order) to fill the page asked for.
    let mut live = Vec::new();
    let mut quiet = Vec::new();
    let wanted = query.offset.saturating_add(query.limit);
    for (i, (route, series)) in routes.enumerate() {
        totals.configured += 1;
        let snap = series.map(|s| (s.traffic.window.snapshot(now_secs), s.traffic.inflight()));
        if let Some((snap, open)) = &snap {
            totals.add(snap, *open);
        }
        if query.all {
            if i >= query.offset && listed.len() < query.limit {
                let snap = snap.as_ref().map_or(&empty, |(s, _)| s);
                listed.push(json_of(route, series, snap));
            }
        } else if let Some((snap, open)) = snap {
            live.push((open, i, route, series, snap));
        } else if quiet.len() < wanted {
            quiet.push((i, route));
        }
    }
    if !query.all {
        live.sort_by(|a, b| {
            (b.4.requests, b.0)
                .cmp(&(a.4.requests, a.0))
                .then(a.1.cmp(&b.1))
        });
        let busy = live.iter().map(|(_, _, r, s, snap)| (*r, *s, snap));
        let rest = quiet.iter().map(|(_, r)| (*r, None, &empty));
        listed = busy
            .chain(rest)
            .skip(query.offset)
            .take(query.limit)
            .map(|(r, s, snap)| json_of(r, s, snap))
            .collect();
    }
    let summary = totals.summary(listed.len(), other, query, now_secs);
    (Value::Array(listed), summary)
}

/// The routes' traffic summed for the summary.
#[derive(Default)]
struct Totals {
    configured: usize,
    inflight: u64,
    with_traffic: usize,
    classes: [u64; CLASSES.len()],
}

impl Totals {
    fn add(&mut self, snap: &TrafficSnapshot, open: u64) {
        self.inflight += open;
        for (sum, n) in self.classes.iter_mut().zip(snap.classes) {
            *sum += n;
        }
        if snap.requests > 0 || open > 0 {
            self.with_traffic += 1;
        }
    }

    /// The summary of every route's traffic, the requests no route's series holds
    /// (`other`, with the most series a route may own) included.
    fn summary(
        mut self,
        listed: usize,
        other: (&RouteStats, usize),
        query: &RoutesQuery,
        now_secs: u64,
    ) -> Value {
        let (other, own_max) = other;
        let other_snap = other.traffic.window.snapshot(now_secs);
        for (sum, n) in self.classes.iter_mut().zip(other_snap.classes) {
            *sum += n;
        }
        self.inflight += other.traffic.inflight();
        let requests: u64 = self.classes.iter().sum();
        let codes: serde_json::Map<String, Value> = CLASSES
            .iter()
            .zip(self.classes)
            .map(|(name, n)| ((*name).to_string(), json!(n)))
            .collect();
        json!({
            "configured": self.configured,
            "listed": listed,
            "with_traffic": self.with_traffic,
            "order": if query.all { "config" } else { "busiest" },
            "offset": query.offset,
            "inflight": self.inflight,
            "window_seconds": WINDOW_SECS,
            "requests": requests,
            "per_second": requests as f64 / WINDOW_SECS as f64,
            "codes": codes,
            "own_series_max": own_max,
            "other": {
                "requests": other_snap.requests,
                "inflight": other.traffic.inflight(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use portcullis_policy::traffic::TrafficWindow;

    #[test]
    fn traffic_json_names_every_class_and_quantile() {
        let w = TrafficWindow::new();
        w.record(100, 1, Some(2_000));
        w.record(100, 3, Some(2_000));
        w.record(100, 4, None);
        let v = traffic_json(&w.snapshot(101));
        assert_eq!(v["requests"], 3);
        assert_eq!(v["codes"]["2xx"], 1);
        assert_eq!(v["codes"]["4xx"], 1);
        assert_eq!(v["codes"]["5xx"], 1);
        assert_eq!(v["codes"]["error"], 0);
        assert_eq!(v["window_seconds"], 10);
        assert!((v["per_second"].as_f64().unwrap_or(0.0) - 0.3).abs() < 1e-9);
        let p50 = v["p50_ms"].as_f64().unwrap_or(0.0);
        assert!((p50 - 2.0).abs() <= 0.25, "{v}");
        let empty = traffic_json(&w.snapshot(1_000));
        assert!(empty["p50_ms"].is_null() && empty["p99_ms"].is_null());
    }

    fn route(prefix: &str) -> Route {
        Route {
            host: None,
            path_prefix: prefix.to_string(),
            upstream: 0,
            priority: portcullis_policy::shed::Priority::Normal,
            methods: Vec::new(),
            client_cidrs: None,
            action: crate::config::RouteAction::Proxy,
            policy_mask: u64::MAX,
            headers: crate::edge::HeaderRules::new(),
        }
    }

    #[test]
    fn routes_query_defaults_to_the_busiest_and_pages() {
        let q = |s: &str| RoutesQuery::parse(Some(s));
        let busiest = RoutesQuery {
            all: false,
            offset: 0,
            limit: ROUTES_LISTED,
        };
        assert_eq!(RoutesQuery::parse(None), busiest);
        assert_eq!(q("routes=bogus&x=1&routes_offset=-1"), busiest);
        let all = q("routes=all");
        assert!(
            all.all && all.offset == 0 && all.limit == usize::MAX,
            "{all:?}"
        );
        let page = q("routes=all&routes_offset=100&routes_limit=10");
        assert_eq!((page.all, page.offset, page.limit), (true, 100, 10));
        assert_eq!(q("routes_limit=3").limit, 3);
    }

    /// Ten routes, a series on three (one idle, one with 2 requests and one with 5 and one
    /// open): the busiest come first, then the others in config order; totals count all.
    #[test]
    fn routes_lists_the_busiest_first_and_sums_all() {
        let routes: Vec<Route> = (0..10).map(|i| route(&format!("/r{i}"))).collect();
        let series: Vec<Option<RouteSeries>> = (0..10)
            .map(|i| {
                [2, 5, 7]
                    .contains(&i)
                    .then(|| RouteSeries::new(format!("/r{i}")))
            })
            .collect();
        let at = |i: usize| series[i].as_ref().unwrap_or_else(|| unreachable!());
        for _ in 0..5 {
            at(7).traffic.window.record(100, 1, Some(1_000));
        }
        at(7).traffic.enter();
        at(5).traffic.window.record(100, 4, Some(1_000));
        at(5).traffic.window.record(100, 1, Some(1_000));
        let other = RouteSeries::new("other".into());
        other.traffic.window.record(100, 3, Some(1_000));
        let list = |q: &str| {
            routes_status(
                routes.iter().zip(series.iter().map(Option::as_ref)),
                (&*other, 10_000),
                |_| Some("app"),
                101,
                &RoutesQuery::parse(Some(q)),
            )
        };
        let names = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| a.iter().map(|r| r["route"].to_string()).collect())
                .unwrap_or_default()
        };
        let (top, summary) = list("routes_limit=5");
        assert_eq!(
            names(&top),
            ["\"/r7\"", "\"/r5\"", "\"/r2\"", "\"/r0\"", "\"/r1\""]
        );
        assert_eq!(top[0]["inflight"], 1);
        assert_eq!(top[0]["traffic"]["requests"], 5);
        assert_eq!(top[3]["traffic"]["requests"], 0);
        assert_eq!(top[3]["upstream"], "app");
        assert_eq!(summary["configured"], 10);
        assert_eq!(summary["listed"], 5);
        assert_eq!(summary["with_traffic"], 2);
        assert_eq!(
            summary["requests"], 8,
            "with the one past the bound: {summary}"
        );
        assert_eq!(summary["other"]["requests"], 1);
        assert_eq!(summary["codes"]["5xx"], 1);
        assert_eq!(summary["codes"]["4xx"], 1);
        assert_eq!(summary["inflight"], 1);
        let (all, summary) = list("routes=all&routes_offset=6&routes_limit=3");
        assert_eq!(names(&all), ["\"/r6\"", "\"/r7\"", "\"/r8\""]);
        assert_eq!(all[1]["traffic"]["requests"], 5);
        assert_eq!(summary["order"], "config");
        let (all, _) = list("routes=all");
        assert_eq!(all.as_array().map(Vec::len), Some(10));
    }

    #[test]
    fn route_inflight_goes_up_and_down() {
        let r = RouteTraffic::default();
        r.enter();
        r.enter();
        r.exit();
        assert_eq!(r.inflight(), 1);
    }
}
