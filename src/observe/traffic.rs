//! The operator's view of traffic (HAProxy's stats page): per backend and per
//! route, requests per second, the 2xx/4xx/5xx mix, p50/p99 latency and what is
//! open now, as `/status` reports them. The arithmetic is
//! [`portcullis_policy::traffic`]; this module holds the per-route state and
//! renders both as JSON.

use crate::config::Route;
use crate::metrics::RouteSeries;
pub use portcullis_policy::traffic::RouteTraffic;
use portcullis_policy::traffic::{TrafficSnapshot, CLASSES};
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

/// `/status` `routes`: every route of the config, then the default route
/// (requests no route matched), each with its upstream and traffic. `routes` gives each
/// route with its series and its upstream's name (`state::Runtime::routes_with_series`).
pub fn routes_json<'a>(
    routes: impl IntoIterator<Item = (&'a Route, &'a RouteSeries, Option<&'a str>)>,
    now_secs: u64,
) -> Value {
    let routes: Vec<Value> = routes
        .into_iter()
        .map(|(route, series, upstream)| {
            json!({
                "route": series.label,
                "host": route.host,
                "path_prefix": route.path_prefix,
                "upstream": upstream,
                "inflight": series.traffic.inflight(),
                "traffic": traffic_json(&series.traffic.window.snapshot(now_secs)),
            })
        })
        .collect();
    Value::Array(routes)
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

    #[test]
    fn route_inflight_goes_up_and_down() {
        let r = RouteTraffic::default();
        r.enter();
        r.enter();
        r.exit();
        assert_eq!(r.inflight(), 1);
    }
}
