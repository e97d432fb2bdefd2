//! Per-request observation: the trace context sent upstream, the upstream's
//! timing, and at the end one call that records the request's metrics and
//! writes its access-log line. The proxy's phases call in here; nothing here
//! decides how a request is answered.

use crate::observe::access_log::{should_log, AccessRecord, Exchange};
use crate::observe::trace::{random_u128, TraceContext};

use crate::state::{unix_ms, Runtime, Shared};
use crate::upstream::{BackendState, Pool};
use pingora::http::RequestHeader;
use pingora::proxy::Session;
use portcullis_policy::verdict::Outcome;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// What the proxy learns about a request for logs, traces and metrics.
#[derive(Debug, Default)]
pub struct RequestObs {
    trace: Option<TraceContext>,
    upstream_start: Option<Instant>,
    /// When the current attempt's request body ended (handed on to the backend).
    body_sent: Option<Instant>,
    upstream_ms: Option<f64>,
    /// The backend's own time of the current attempt (µs), once it answered.
    backend_us: Option<u64>,
    upstream_status: Option<u16>,
}

fn millis(d: Duration) -> f64 {
    // microsecond resolution is plenty for a log line
    (d.as_micros() as f64) / 1000.0
}

impl RequestObs {
    /// A backend was chosen at `now`: the upstream time starts (again on a retry).
    pub fn backend_chosen(&mut self, now: Instant) {
        self.upstream_start = Some(now);
        self.body_sent = None;
        self.upstream_status = None;
        self.upstream_ms = None;
        self.backend_us = None;
    }

    /// The current attempt's request body ended at `now`: its last bytes go to the
    /// backend (the first call of an attempt counts).
    #[inline]
    pub fn request_sent(&mut self, now: Instant) {
        if self.upstream_start.is_some() {
            self.body_sent.get_or_insert(now);
        }
    }

    /// The current attempt's upstream time in microseconds, once its backend answered.
    pub fn upstream_us(&self) -> Option<u64> {
        self.upstream_ms.map(|ms| (ms * 1000.0) as u64)
    }

    /// The backend's own time of the current attempt in microseconds, once it answered:
    /// from the end of the request body to the response header, so a client that
    /// uploads slowly does not make the backend look slow (the latency outlier rule's
    /// sample). A backend that answered before the body ended is timed from the choice
    /// of the backend.
    pub fn backend_us(&self) -> Option<u64> {
        self.backend_us
    }

    /// The backend's response header arrived.
    pub fn upstream_answered(&mut self, status: u16) {
        self.upstream_status = Some(status);
        let now = Instant::now();
        self.upstream_ms = self
            .upstream_start
            .map(|t| millis(now.saturating_duration_since(t)));
        self.backend_us = self.upstream_start.map(|t| {
            let from = self.body_sent.filter(|b| *b >= t).unwrap_or(t);
            u64::try_from(now.saturating_duration_since(from).as_micros()).unwrap_or(u64::MAX)
        });
    }

    /// The request's trace context, decided once. `new_trace_sample`: see
    /// [`crate::observe::Observe::new_trace_sample`].
    fn trace_for(&mut self, req: &RequestHeader, new_trace_sample: f64) -> TraceContext {
        *self.trace.get_or_insert_with(|| {
            let values = req
                .headers
                .get_all(crate::edge::headers::names::TRACEPARENT.name())
                .iter()
                .map(|v| v.as_bytes());
            let draw = if new_trace_sample > 0.0 {
                fastrand::f64()
            } else {
                1.0
            };
            TraceContext::from_request(values, &mut random_u128, new_trace_sample, draw)
        })
    }

    /// Set `traceparent` on the upstream request: the client's trace with a
    /// new parent id, or a new trace (then any `tracestate` is dropped, as it
    /// belongs to the discarded trace). A new trace is sampled with
    /// probability `new_trace_sample`; the flag sent says so.
    pub fn propagate(
        &mut self,
        upstream_req: &mut RequestHeader,
        new_trace_sample: f64,
    ) -> pingora::Result<()> {
        let tc = self.trace_for(upstream_req, new_trace_sample);
        if !tc.continued {
            upstream_req.remove_header(&crate::edge::headers::names::lookup::TRACESTATE);
        }
        let value = crate::edge::headers::unique(tc.header_value());
        upstream_req.insert_header(&crate::edge::headers::names::TRACEPARENT, value)?;
        Ok(())
    }
}

/// How the proxy finished a request, from the proxy's context.
pub struct Finished<'a> {
    pub outcome: Outcome,
    /// Status sent to the client; 0 when none was.
    pub status: u16,
    pub runtime: &'a Runtime,
    /// The request's route's metric series and label ("none" when it was
    /// refused before routing).
    pub route: &'a crate::metrics::RouteSeries,
    pub pool: Option<&'a Pool>,
    /// The backend the request went to last, if any.
    pub backend: Option<&'a BackendState>,
    pub request_id: Option<&'a str>,
    /// The client address (CONTRACT §7), when a gate resolved it; `None` for a
    /// request answered before routing.
    pub client: Option<IpAddr>,
    pub elapsed: Duration,
    /// Seconds on the traffic windows' clock at the end (`observe::traffic::secs`).
    pub now_secs: u64,
    /// The gates in shadow mode that would have refused the request.
    pub shadow: crate::gate::Shadowed,
    /// The request's class (a shed shadow refusal is named by it).
    pub priority: portcullis_policy::shed::Priority,
    /// The request's tenant's name, when its key is a tenant's.
    pub tenant: Option<&'a str>,
}

/// A request's shadow refusals with what names them (its class, its runtime's policies).
struct ShadowOf<'a> {
    shadow: crate::gate::Shadowed,
    priority: portcullis_policy::shed::Priority,
    rt: &'a Runtime,
}

impl crate::observe::access_log::ShadowNames for ShadowOf<'_> {
    fn each(&self, f: &mut dyn FnMut(&str, &str)) {
        self.shadow.each(self.priority, self.rt, f);
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
    let route = f.route.label.as_str();
    let m = &shared.metrics.proxy;
    m.record_route(f.route, f.outcome, f.status, f.elapsed.as_secs_f64());
    record_traffic(obs, &f);
    if let (Some(pool), Some(b)) = (f.pool, f.backend) {
        m.record_backend(
            &b.series,
            &pool.name,
            &b.addr_str,
            obs.upstream_status,
            obs.upstream_ms.map(|ms| ms / 1000.0),
        );
    }

    let new_trace_sample = shared.observe.new_trace_sample(&f.runtime.config.tracing);
    let trace = obs.trace_for(session.req_header(), new_trace_sample);
    if let Some(spans) = &shared.observe.spans {
        if trace.sampled() {
            record_span(spans, session, &f, route, trace);
        }
    }
    write_line(shared, session, obs, &f, route, f.runtime);
}

/// The status page's figures: the route's (every request routed to it, by the
/// status sent, timed start to end) and the backend's (the last attempt, by the
/// backend's status, timed from the choice of the backend to its response
/// header; no status and no time when it did not answer; attempts given up for
/// a retry are counted where they end, in `proxy`). Two CAS loops each.
#[inline]
fn record_traffic(obs: &RequestObs, f: &Finished<'_>) {
    use portcullis_policy::traffic::class_of;
    let sent = (f.status > 0).then_some(f.status);
    let us = u64::try_from(f.elapsed.as_micros()).unwrap_or(u64::MAX);
    f.route
        .traffic
        .window
        .record(f.now_secs, class_of(sent), Some(us));
    if let Some(b) = f.backend {
        b.traffic
            .record(f.now_secs, class_of(obs.upstream_status), obs.upstream_us());
    }
}

fn record_span(
    spans: &crate::observe::otlp::SpanSink,
    session: &Session,
    f: &Finished<'_>,
    route: &str,
    trace: TraceContext,
) {
    let req = session.req_header();
    let end = std::time::SystemTime::now();
    spans.record(&crate::observe::otlp::ServerSpan {
        trace,
        exchange: exchange(req, f, route),
        start: end.checked_sub(f.elapsed).unwrap_or(end),
        end,
    });
}

/// What the access log and the span share of the finished request `f`.
fn exchange<'a>(req: &'a RequestHeader, f: &Finished<'a>, route: &'a str) -> Exchange<'a> {
    Exchange {
        request_id: f.request_id.unwrap_or(""),
        method: req.method.as_str(),
        protocol: protocol_name(req.version),
        status: f.status,
        outcome: f.outcome.as_str(),
        route,
        upstream: f.pool.map(|p| p.name.as_str()).unwrap_or(""),
        backend: f.backend.map(|b| b.name.as_str()).unwrap_or(""),
    }
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
    let trace = obs.trace_for(req, 0.0).trace_id;
    let generated;
    let request_id = match f.request_id {
        Some(id) => id,
        None => {
            generated = shared.next_request_id();
            generated.as_str()
        }
    };
    // The client address as the gates saw it (trusted proxies, PROXY header),
    // not the TCP peer: the one CONTRACT §7 says is logged.
    let client_ip = f.client.or_else(|| {
        let server = &rt.config.server;
        crate::edge::client_ip(
            session,
            &server.trusted_proxies,
            server.proxy_protocol,
            &shared.proxied,
        )
    });
    let host = host_of(req);
    // A Host value is the client's: keep the line bounded.
    let host = &host[..floor_char_boundary(host, 256)];
    let shadow = ShadowOf {
        shadow: f.shadow,
        priority: f.priority,
        rt,
    };
    shared.observe.access_log.write(&AccessRecord {
        unix_ms: unix_ms(),
        trace_id: trace,
        client_ip,
        host,
        path: req.uri.path(),
        exchange: Exchange {
            request_id,
            ..exchange(req, f, route)
        },
        bytes_sent: session.body_bytes_sent() as u64,
        duration_us: f.elapsed.as_micros() as u64,
        upstream_us: obs.upstream_ms.map(|ms| (ms * 1000.0).round() as u64),
        shadow: (!f.shadow.is_empty()).then_some(&shadow as _),
        tenant: f.tenant,
    });
}

/// `HTTP/1.1`, `HTTP/2.0`, ... (as `Version`'s `Debug`, without formatting).
fn protocol_name(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_11 => "HTTP/1.1",
        http::Version::HTTP_2 => "HTTP/2.0",
        http::Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/?",
    }
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
    use crate::config::Route;
    use crate::observe::route_label;

    #[test]
    fn route_labels_come_from_the_config() {
        let r = |host: Option<&str>, p: &str| Route {
            host: host.map(str::to_string),
            path_prefix: p.to_string(),
            upstream: 0,
            priority: portcullis_policy::shed::Priority::Normal,
            methods: Vec::new(),
            client_cidrs: None,
            action: crate::config::RouteAction::Proxy,
            policy_mask: u64::MAX,
            headers: Default::default(),
        };
        assert_eq!(route_label(&r(None, "")), "default");
        assert_eq!(route_label(&r(None, "/api")), "/api");
        assert_eq!(route_label(&r(Some("a.example"), "/")), "a.example/");
    }

    #[test]
    fn protocol_names_match_the_debug_form() {
        for v in [
            http::Version::HTTP_09,
            http::Version::HTTP_10,
            http::Version::HTTP_11,
            http::Version::HTTP_2,
            http::Version::HTTP_3,
        ] {
            assert_eq!(protocol_name(v), format!("{v:?}"));
        }
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
        o.backend_chosen(Instant::now());
        o.upstream_answered(502);
        assert!(o.upstream_ms.is_some_and(|ms| ms >= 0.0));
        assert_eq!(o.upstream_status, Some(502));
    }

    #[test]
    fn the_backend_is_timed_from_the_end_of_the_body() {
        let mut o = RequestObs::default();
        o.request_sent(Instant::now());
        assert_eq!(o.body_sent, None, "no attempt yet");
        let chosen = Instant::now() - Duration::from_secs(2);
        o.backend_chosen(chosen);
        // The body ended 1.5 s after the choice (a slow upload), the answer came at once.
        o.request_sent(chosen + Duration::from_millis(1500));
        o.request_sent(chosen + Duration::from_millis(1900));
        o.upstream_answered(200);
        let upstream = o.upstream_us().unwrap();
        let backend = o.backend_us().unwrap();
        assert!(upstream >= 2_000_000, "{upstream}");
        assert!((500_000..1_500_000).contains(&backend), "{backend}");
        // A retry starts over; an answer before the body ended is timed from the choice.
        o.backend_chosen(chosen);
        assert_eq!(o.backend_us(), None);
        o.upstream_answered(200);
        assert!(o.backend_us().unwrap() >= 2_000_000);
    }
}
