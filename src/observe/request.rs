//! Per-request observation: the trace context sent upstream, the upstream's
//! timing, and at the end one call that records the request's metrics and
//! writes its access-log line. The proxy's phases call in here; nothing here
//! decides how a request is answered.

use super::access_log::{should_log, AccessRecord};
use super::trace::{random_u128, TraceContext};
use crate::config::Route;
use crate::metrics::Outcome;
use crate::state::{unix_ms, Runtime, Shared};
use crate::upstream::{BackendState, Pool};
use pingora::http::RequestHeader;
use pingora::proxy::Session;
use std::time::{Duration, Instant};

/// What the proxy learns about a request for logs, traces and metrics.
#[derive(Debug, Default)]
pub struct RequestObs {
    trace: Option<TraceContext>,
    upstream_start: Option<Instant>,
    upstream_ms: Option<f64>,
    upstream_status: Option<u16>,
}

fn millis(d: Duration) -> f64 {
    // microsecond resolution is plenty for a log line
    (d.as_micros() as f64) / 1000.0
}

impl RequestObs {
    /// A backend was chosen: the upstream time starts now (again on a retry).
    pub fn backend_chosen(&mut self) {
        self.upstream_start = Some(Instant::now());
        self.upstream_status = None;
        self.upstream_ms = None;
    }

    /// The backend's response header arrived.
    pub fn upstream_answered(&mut self, status: u16) {
        self.upstream_status = Some(status);
        self.upstream_ms = self.upstream_start.map(|t| millis(t.elapsed()));
    }

    fn trace_for(&mut self, req: &RequestHeader) -> TraceContext {
        *self.trace.get_or_insert_with(|| {
            let values = req
                .headers
                .get_all("traceparent")
                .iter()
                .map(|v| v.as_bytes());
            TraceContext::from_request(values, &mut random_u128)
        })
    }

    /// Set `traceparent` on the upstream request: the client's trace with a
    /// new parent id, or a new trace (then any `tracestate` is dropped, as it
    /// belongs to the discarded trace).
    pub fn propagate(&mut self, upstream_req: &mut RequestHeader) -> pingora::Result<()> {
        let tc = self.trace_for(upstream_req);
        if !tc.continued {
            upstream_req.remove_header("tracestate");
        }
        upstream_req.insert_header("traceparent", tc.header())?;
        Ok(())
    }
}

/// How the proxy finished a request, from the proxy's context.
pub struct Finished<'a> {
    pub outcome: Outcome,
    /// Status sent to the client; 0 when none was.
    pub status: u16,
    pub runtime: &'a Runtime,
    /// The request's route; `None` when it was refused before routing.
    pub route: Option<&'a Route>,
    pub pool: Option<&'a Pool>,
    /// The backend the request went to last, if any.
    pub backend: Option<&'a BackendState>,
    pub request_id: Option<&'a str>,
    pub elapsed: Duration,
}

/// The `route` label and log field: the route's host and path prefix as
/// configured (bounded by the config, never a request value).
pub fn route_label(route: &Route) -> std::borrow::Cow<'_, str> {
    match (&route.host, route.path_prefix.as_str()) {
        (None, "") => "default".into(),
        (None, p) => p.into(),
        (Some(h), p) => format!("{h}{p}").into(),
    }
}

fn host_of(req: &RequestHeader) -> &str {
    req.headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri.host())
        .unwrap_or("")
}

/// Record the request's metrics and write its access-log line.
pub fn finish(shared: &Shared, session: &Session, obs: &mut RequestObs, f: Finished<'_>) {
    let route = f.route.map(route_label);
    let route = route.as_deref().unwrap_or("none");
    let m = &shared.metrics;
    m.record(f.outcome, route, f.status, f.elapsed.as_secs_f64());
    if let (Some(pool), Some(b)) = (f.pool, f.backend) {
        m.record_upstream(
            &pool.name,
            &b.addr_str,
            obs.upstream_status,
            obs.upstream_ms.map(|ms| ms / 1000.0),
        );
    }

    write_line(shared, session, obs, &f, route, f.runtime);
}

fn write_line(
    shared: &Shared,
    session: &Session,
    obs: &mut RequestObs,
    f: &Finished<'_>,
    route: &str,
    rt: &Runtime,
) {
    let settings = &rt.config.access_log;
    if !settings.enabled || !should_log(f.status, settings.sample, fastrand::f64()) {
        return;
    }
    let req = session.req_header();
    let trace = obs.trace_for(req).trace_id_hex();
    let generated;
    let request_id = match f.request_id {
        Some(id) => id,
        None => {
            generated = shared.next_request_id();
            generated.as_str()
        }
    };
    let client_ip = session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    let host = host_of(req);
    // A Host value is the client's: keep the line bounded.
    let host = &host[..floor_char_boundary(host, 256)];
    let protocol = format!("{:?}", req.version);
    let backend = f.backend.map(|b| b.addr_str.as_str()).unwrap_or("");
    shared.observe.access_log.write(&AccessRecord {
        ts: super::time::rfc3339_ms(unix_ms()),
        request_id,
        trace_id: &trace,
        client_ip: &client_ip,
        method: req.method.as_str(),
        host,
        path: req.uri.path(),
        protocol: &protocol,
        status: f.status,
        outcome: f.outcome.as_str(),
        route,
        upstream: f.pool.map(|p| p.name.as_str()).unwrap_or(""),
        backend,
        bytes_sent: session.body_bytes_sent() as u64,
        duration_ms: millis(f.elapsed),
        upstream_ms: obs.upstream_ms,
    });
}

fn floor_char_boundary(s: &str, max: usize) -> usize {
    if s.len() <= max {
        return s.len();
    }
    (0..=max)
        .rev()
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_labels_come_from_the_config() {
        let r = |host: Option<&str>, p: &str| Route {
            host: host.map(str::to_string),
            path_prefix: p.to_string(),
            upstream: 0,
            priority: crate::config::Priority::Normal,
            headers: Default::default(),
        };
        assert_eq!(route_label(&r(None, "")), "default");
        assert_eq!(route_label(&r(None, "/api")), "/api");
        assert_eq!(route_label(&r(Some("a.example"), "/")), "a.example/");
    }

    #[test]
    fn long_hosts_are_cut_on_a_char_boundary() {
        let s = "é".repeat(200);
        let n = floor_char_boundary(&s, 255);
        assert!(n <= 255 && s.is_char_boundary(n));
    }

    #[test]
    fn upstream_time_runs_from_choice_to_answer() {
        let mut o = RequestObs::default();
        o.upstream_answered(200);
        assert_eq!(o.upstream_ms, None, "no backend chosen");
        o.backend_chosen();
        o.upstream_answered(502);
        assert!(o.upstream_ms.is_some_and(|ms| ms >= 0.0));
        assert_eq!(o.upstream_status, Some(502));
    }
}
