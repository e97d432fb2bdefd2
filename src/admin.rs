//! Admin endpoints on `admin_listen`: `/healthz` (liveness), `/readyz`
//! (readiness, 503 once draining), `/metrics` (Prometheus text), `/status`
//! (JSON), `GET /` (the HTML status page over `/status`), `POST /reload`
//! (same as SIGHUP), and the runtime API of CONTRACT §12 (`/backends…` and
//! `/claims…`, in `crate::fleet`).
//!
//! `GET`s are open (probes and scrapers need them). Every other method changes the
//! running proxy: with an admin token set (`admin_token`, `admin_token_file`,
//! `[server.admin_tokens]`) it needs `Authorization: Bearer <token>` (401 otherwise), and
//! the token's name is the action's `by`; without a token it is answered only when
//! `admin_listen` is a loopback address, and refused (403) elsewhere.
//!
//! Browsers are kept out ([`guard`]): the listener answers only to a `Host` that names
//! it (421 otherwise: DNS rebinding), and a state-changing request from another site
//! (`Origin`, `Sec-Fetch-Site`: 403) or with a body that is not JSON (415: an HTML form)
//! is refused before the token is even looked at.
//!
//! Every answer carries `Content-Length` and the `X-Portcullis-Admin` marker (`ctl`
//! refuses an answer without it: a proxy port given by mistake is not the admin API).
//! A body must arrive within `client_body_timeout_ms` (408), and beyond
//! `admin_max_connections` a few more connections are let in for `/healthz` and
//! `/readyz` only, so requests whose body never comes cannot take the probes down.

pub mod guard;

use crate::state::{unix_secs, Shared};
use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::apps::{Accepted, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use serde_json::json;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

pub struct Admin {
    pub shared: Arc<Shared>,
    /// The disruption budget the culls share: the runtime API's operations go there.
    budget: Arc<dyn portcullis_policy::cull::BudgetStore>,
    /// The fleet's budget as the last sync read it (dry runs, the feasibility audit).
    view: Arc<crate::fleet::sync::FleetView>,
    /// Store errors already added to the Prometheus counter.
    store_errors_seen: AtomicU64,
    /// Late store answers already added.
    store_late_seen: AtomicU64,
    /// Backend errors already added, per (upstream, backend).
    backend_errors_seen: std::sync::Mutex<std::collections::HashMap<(String, String), u64>>,
    /// The admin listener is bound to a loopback address (fixed at start:
    /// `admin_listen` only changes with a restart).
    loopback: bool,
    /// Connections open on the admin listener (counted by [`AdminApp`]).
    open: Arc<AtomicUsize>,
}

/// Connections let in beyond `admin_max_connections` for `/healthz` and `/readyz` only.
pub const PROBE_RESERVE: usize = 4;

/// The header every admin answer carries (`portcullis ctl` checks it).
pub const MARKER: &str = "x-portcullis-admin";

/// Whether a `POST` may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostAccess {
    Allowed,
    /// A token is set and the request does not carry it.
    Unauthorized,
    /// No token, and the listener is reachable from other hosts.
    Forbidden,
}

/// The access rule for admin `POST`s: `token` is `server.admin_token`,
/// `authorization` the request's `Authorization` value.
pub fn post_access(token: &str, loopback: bool, authorization: Option<&[u8]>) -> PostAccess {
    let tokens: &[(&str, &str)] = if token.is_empty() {
        &[]
    } else {
        &[("admin", token)]
    };
    match post_caller(tokens, loopback, authorization) {
        Ok(_) => PostAccess::Allowed,
        Err(refused) => refused,
    }
}

/// The access rule with named tokens (`admin_token` is named `admin`): `Ok(name)` of the
/// token presented, or `admin` when no token is set and the listener is loopback. Every
/// token is compared, each in constant time, whichever matches.
pub fn post_caller<'a>(
    tokens: &[(&'a str, &str)],
    loopback: bool,
    authorization: Option<&[u8]>,
) -> Result<&'a str, PostAccess> {
    if tokens.is_empty() {
        return if loopback {
            Ok("admin")
        } else {
            Err(PostAccess::Forbidden)
        };
    }
    let presented = authorization.and_then(bearer_token).unwrap_or(b"");
    let mut who = None;
    for (name, token) in tokens {
        if constant_time_eq(presented, token.as_bytes()) && who.is_none() {
            who = Some(*name);
        }
    }
    who.ok_or(PostAccess::Unauthorized)
}

/// The credentials of `Bearer <token>` (scheme case-insensitive).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    let (scheme, rest) = value.split_at(value.iter().position(|b| *b == b' ')?);
    scheme
        .eq_ignore_ascii_case(b"bearer")
        .then(|| rest.trim_ascii())
}

/// Compares in time that depends only on the expected token's length, not on
/// where the first difference is.
fn constant_time_eq(presented: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(presented.len() != expected.len());
    for (i, e) in expected.iter().enumerate() {
        diff |= presented.get(i).copied().unwrap_or(0) ^ e;
    }
    std::hint::black_box(diff) == 0
}

/// Adds to `counter` what the limiter's running `total` gained since the last scrape
/// (`seen` keeps the total already added).
fn add_since(counter: &prometheus::IntCounter, seen: &AtomicU64, total: u64) {
    let prev = seen.swap(total, Ordering::AcqRel);
    counter.inc_by(total.saturating_sub(prev));
}

impl Admin {
    pub fn new(
        shared: Arc<Shared>,
        budget: Arc<dyn portcullis_policy::cull::BudgetStore>,
        view: Arc<crate::fleet::sync::FleetView>,
    ) -> Self {
        let (addr, has_token) = {
            let rt = shared.runtime.load();
            (
                rt.config.server.admin_listen,
                !rt.config.server.admin_token.is_empty(),
            )
        };
        let loopback = addr.ip().is_loopback();
        if !loopback && !has_token {
            tracing::warn!(
                event = "admin",
                admin_listen = %addr,
                "the admin listener is reachable from other hosts and server.admin_token is not set: \
                 GET endpoints are open, POST endpoints (/reload) are refused (403) until a token is set"
            );
        }
        Self {
            shared,
            budget,
            view,
            store_errors_seen: AtomicU64::new(0),
            store_late_seen: AtomicU64::new(0),
            backend_errors_seen: std::sync::Mutex::new(std::collections::HashMap::new()),
            loopback,
            open: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The caller's name (`by`) when the `POST` may run, else the refusal to send.
    fn post_caller(&self, session: &ServerSession) -> Result<String, Box<Response<Vec<u8>>>> {
        let rt = self.shared.runtime.load();
        let server = &rt.config.server;
        let mut tokens: Vec<(&str, &str)> = Vec::with_capacity(server.admin_tokens.len() + 1);
        if !server.admin_token.is_empty() {
            tokens.push(("admin", server.admin_token.expose()));
        }
        tokens.extend(
            server
                .admin_tokens
                .iter()
                .map(|(n, t)| (n.as_str(), t.expose())),
        );
        let auth = session
            .req_header()
            .headers
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        match post_caller(&tokens, self.loopback, auth) {
            Ok(name) => Ok(name.to_string()),
            Err(PostAccess::Forbidden) => Err(Box::new(text(
                StatusCode::FORBIDDEN,
                "admin: POST endpoints are off because admin_listen is not a loopback address \
                 and server.admin_token is not set; set admin_token to enable them\n",
            ))),
            Err(_) => {
                let mut r = text(
                    StatusCode::UNAUTHORIZED,
                    "admin: this endpoint needs Authorization: Bearer <server.admin_token>\n",
                );
                r.headers_mut().insert(
                    http::header::WWW_AUTHENTICATE,
                    http::HeaderValue::from_static("Bearer realm=\"portcullis-admin\""),
                );
                Err(Box::new(r))
            }
        }
    }

    /// The claims endpoints (`/claims…`), or `None` for another path.
    async fn claims(
        &self,
        session: &mut ServerSession,
        method: &http::Method,
        path: &str,
        by: &str,
    ) -> Option<Response<Vec<u8>>> {
        use crate::fleet::claims_api;
        let (sh, budget, view) = (&self.shared, self.budget.as_ref(), &*self.view);
        Some(match (method.as_str(), path) {
            ("POST", "/claims") => match self.body(session).await {
                Ok(body) => claims_api::post(sh, budget, view, &body, by).await,
                Err(r) => *r,
            },
            ("GET", "/claims") => claims_api::list(sh, budget, view).await,
            ("GET", "/claims/feasible") => {
                let query = session.req_header().uri.query().map(str::to_string);
                claims_api::feasible(sh, view, query.as_deref())
            }
            ("DELETE", _) if path.starts_with("/claims/") => {
                let id = path.trim_start_matches("/claims/");
                claims_api::delete(sh, budget, view, id, by).await
            }
            _ => return None,
        })
    }

    /// The request body, at most [`crate::fleet::api::MAX_BODY`] bytes, all of it within
    /// `client_body_timeout_ms` (`Err`: 413, 400 or 408).
    async fn body(&self, session: &mut ServerSession) -> Result<Vec<u8>, Box<Response<Vec<u8>>>> {
        let within = self.shared.runtime.load().config.server.client_body_timeout;
        match tokio::time::timeout(within, Self::read_body(session)).await {
            Ok(read) => read,
            Err(_) => {
                session.set_keepalive(None);
                Err(Box::new(text(
                    StatusCode::REQUEST_TIMEOUT,
                    &format!(
                        "admin: the body did not arrive within client_body_timeout_ms ({} ms)\n",
                        within.as_millis()
                    ),
                )))
            }
        }
    }

    async fn read_body(session: &mut ServerSession) -> Result<Vec<u8>, Box<Response<Vec<u8>>>> {
        let mut body = Vec::new();
        loop {
            match session.read_request_body().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > crate::fleet::api::MAX_BODY {
                        return Err(Box::new(text(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            "admin: body too large\n",
                        )));
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => return Ok(body),
                Err(e) => {
                    return Err(Box::new(text(
                        StatusCode::BAD_REQUEST,
                        &format!("admin: cannot read the body: {e}\n"),
                    )))
                }
            }
        }
    }

    /// Copy gauges that live as atomics elsewhere into the registry.
    fn refresh_metrics(&self) {
        let s = &self.shared;
        let m = &s.metrics;
        m.shed.inflight.set(s.shedder.inflight() as i64);
        m.shed.concurrency_limit.set(s.shedder.cap() as i64);
        let view = s.shedder.queue_view(std::time::Instant::now());
        for (c, n) in portcullis_policy::shed::Priority::ALL.iter().zip(view.waiting) {
            m.shed
                .queue_waiting
                .with_label_values(&[c.as_str()])
                .set(n as i64);
        }
        for pool in s.runtime.load().pools.iter() {
            if !pool.balance.queue_timeout.is_zero() {
                m.shed
                    .upstream_queue_waiting
                    .with_label_values(&[pool.name.as_str()])
                    .set(pool.room().waiting() as i64);
            }
        }
        for pool in s
            .runtime
            .load()
            .pools
            .iter()
            .filter(|p| p.balance.fleet_max_inflight > 0 && !p.balance.adaptive)
        {
            m.shed
                .upstream_concurrency_limit
                .with_label_values(&[pool.name.as_str()])
                .set(pool.shared.fleet_cap.cap_or(pool.balance.max_inflight) as i64);
        }
        for pool in s.runtime.load().pools.iter().filter(|p| p.balance.adaptive) {
            m.shed
                .upstream_concurrency_limit
                .with_label_values(&[pool.name.as_str()])
                .set(pool.shared.limit.cap() as i64);
        }
        m.lifecycle.ready.set(i64::from(s.lifecycle.is_ready()));
        m.ratelimit
            .store_healthy
            .set(i64::from(s.limiter.store_healthy()));
        m.ratelimit
            .tracked_keys
            .set(s.limiter.tracked_keys() as i64);
        add_since(
            &m.ratelimit.store_errors,
            &self.store_errors_seen,
            s.limiter.store_errors_total(),
        );
        add_since(
            &m.ratelimit.store_late_answers,
            &self.store_late_seen,
            s.limiter.late_answers_total(),
        );
        let rt = s.runtime.load();
        if let Some(registry) = rt.tenants.as_deref() {
            let now = portcullis_store::clock::unix_ms();
            for t in registry.tenants.iter().filter(|t| t.tier.quota > 0) {
                let used = s.tenant_quota.used(t.quota_key, t.tier.period, now);
                m.tenants
                    .quota_used
                    .with_label_values(&[&t.name])
                    .set(i64::try_from(used).unwrap_or(i64::MAX));
            }
        }
        let mut seen = match self.backend_errors_seen.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        for pool in &rt.pools {
            for b in &pool.backends {
                let (_, errors) = b.totals();
                let prev = seen
                    .entry((pool.name.clone(), b.addr_str.clone()))
                    .or_insert(0);
                m.cull
                    .backend_errors
                    .with_label_values(&[pool.name.as_str(), b.addr_str.as_str()])
                    // a re-added backend starts from zero again
                    .inc_by(errors.checked_sub(*prev).unwrap_or(errors));
                *prev = errors;
            }
            for (addr, counts) in pool.health_counts() {
                let backend = addr.to_string();
                for (result, n) in counts {
                    let c = m.cull.health_checks.with_label_values(&[
                        pool.name.as_str(),
                        backend.as_str(),
                        result,
                    ]);
                    // the counts only grow (they live as long as the pool's health registry)
                    c.inc_by(n.saturating_sub(c.get()));
                }
            }
            m.cull
                .upstream_panic_mode
                .with_label_values(&[pool.name.as_str()])
                .set(i64::from(pool.panic_mode.load(Ordering::Relaxed)));
            // present from start at 0, not only after a first retry, shed or response
            m.proxy.init_upstream(
                &pool.name,
                pool.backends.iter().map(|b| b.addr_str.as_str()),
            );
            m.shed
                .bulkhead_shed
                .with_label_values(&[pool.name.as_str()]);
            if pool.health_thresholds().is_some() {
                for b in &pool.backends {
                    m.cull.health_checks.with_label_values(&[
                        pool.name.as_str(),
                        b.addr_str.as_str(),
                        "ok",
                    ]);
                }
            }
            for b in &pool.backends {
                let view = crate::fleet::backend_view(pool, b);
                let state = view["state"].as_str().unwrap_or("up");
                m.admin.set_backend_state(&pool.name, &b.addr_str, state);
                m.cull
                    .backend_culled
                    .with_label_values(&[pool.name.as_str(), b.addr_str.as_str()])
                    .set(i64::from(b.is_culled()));
            }
        }
    }

    /// `query`: `/status`'s query string (which routes to list).
    pub fn status_json(&self, query: Option<&str>) -> serde_json::Value {
        let s = &self.shared;
        let rt = s.runtime.load();
        let now = unix_secs();
        let now_ms = crate::state::unix_ms();
        let traffic_now = crate::observe::traffic::secs(std::time::Instant::now());
        let (routes, routes_summary) = crate::observe::traffic::routes_of(&rt, traffic_now, query);
        let upstreams: Vec<_> = rt
            .pools
            .iter()
            .map(|pool| {
                let backends: Vec<_> = pool
                    .backends
                    .iter()
                    .map(|b| {
                        // state (with `draining` and `maint`), weight and the manual
                        // operation's source, by, reason and until: as `GET /backends`.
                        let manual = crate::fleet::backend_view(pool, b);
                        let (requests, errors) = b.window.totals(now);
                        let mut v = json!({
                            "name": b.name,
                            "address": b.addr_str,
                            "backup": manual["backup"],
                            "max_conn": manual["max_conn"],
                            "state": manual["state"],
                            "weight": manual["weight"],
                            "source": manual["source"],
                            "by": manual["by"],
                            "reason": manual["reason"],
                            "until": manual["until"],
                            "check": manual["check"],
                            "errors_in_window": errors,
                            "requests_in_window": requests,
                            "dry_run_culled": b.is_dry_run_culled(),
                            "cull_lease": s.observe.culls.lease(&pool.name, &b.addr_str),
                            "outlier": s.observe.culls.outlier(&pool.name, &b.addr_str),
                            "in_flight": b.inflight(),
                            "slow_start": slow_start_json(pool, b, now_ms),
                        });
                        crate::observe::traffic::add_backend_fields(&mut v, b, traffic_now);
                        v
                    })
                    .collect();
                json!({
                    "name": pool.name,
                    "panic_mode": pool.panic_mode.load(Ordering::Relaxed),
                    "queue": {
                        "timeout_ms": pool.balance.queue_timeout.as_millis() as u64,
                        "max_queue": pool.max_queue(),
                        "waiting": pool.room().waiting(),
                    },
                    "fleet_max_inflight": pool.balance.fleet_max_inflight,
                    "bulkhead": pool.shared.fleet_cap.status(
                        pool.balance.fleet_max_inflight,
                        pool.balance.max_inflight,
                        s.store_kind == "redis",
                    ),
                    "backends": backends,
                })
            })
            .collect();
        let culling = &rt.config.culling;
        let cap = s.shedder.cap();
        let queue = s.shedder.queue_view(std::time::Instant::now());
        let classes: Vec<_> = [
            ("critical", portcullis_policy::shed::Priority::Critical),
            ("normal", portcullis_policy::shed::Priority::Normal),
            ("low", portcullis_policy::shed::Priority::Low),
        ]
        .iter()
        .map(|(name, p)| {
            let limit = if cap == 0 {
                0
            } else {
                portcullis_policy::shed::class_limit(cap, *p)
            };
            let i = p.index();
            json!({
                "class": name,
                "limit": limit,
                "waiting": queue.waiting[i],
                "oldest_wait_ms": queue.oldest_wait[i].as_millis() as u64,
            })
        })
        .collect();
        let sh = &rt.config.shedding;
        json!({
            "state": s.lifecycle.state_name(),
            "now_ms": crate::state::unix_ms(),
            "inflight": s.shedder.inflight(),
            "max_concurrency": cap,
            "shedding": {
                "fleet_max_concurrency": sh.fleet_max_concurrency,
                "fleet": s.fleet_cap.status(
                    sh.fleet_max_concurrency,
                    sh.max_concurrency,
                    s.store_kind == "redis",
                ),
                "classes": classes,
                "queue": {
                    "timeout_ms": sh.queue_timeout.as_millis() as u64,
                    "max_queue": sh.max_queue,
                    "target_ms": sh.queue_target.as_millis() as u64,
                    "newest_first": queue.lifo,
                },
            },
            "rate_limit": {
                "enabled": rt.config.rate_limit.enabled,
                "store": s.store_kind,
                "store_healthy": s.limiter.store_healthy(),
                "tracked_keys": s.limiter.tracked_keys(),
                // Live instances the store reports sharing the limits (1: not shared, or
                // before the first sync): the divisor of each instance's fleet share.
                "instances": s.limiter.instances(),
            },
            "culling": {
                "enabled": culling.enabled,
                "dry_run": culling.params.dry_run,
                "tokens_available": s.metrics.cull.tokens_available.get(),
                "recent_decisions": s.observe.culls.recent(),
            },
            "upstreams": upstreams,
            "routes": routes,
            "routes_summary": routes_summary,
            "tenants": rt.tenants.as_deref().map(|r| crate::tenants::status_json(r, &s.tenant_quota)),
        })
    }
}

/// A backend's slow start: `null` without one (or once its ramp is done), else the share
/// of its weight it takes now and the time left.
fn slow_start_json(
    pool: &crate::upstream::Pool,
    b: &crate::upstream::BackendState,
    now_ms: u64,
) -> serde_json::Value {
    let window = pool.balance.slow_start;
    if window.is_zero() {
        return serde_json::Value::Null;
    }
    let ramp = b.ramp(now_ms, window);
    if ramp >= 1.0 {
        return serde_json::Value::Null;
    }
    let ends = b.back_at_ms() + window.as_millis() as u64;
    json!({
        "share": (ramp * 100.0).round() / 100.0,
        "remaining_ms": ends.saturating_sub(now_ms),
    })
}

fn respond(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    let len = resp.body().len();
    resp.headers_mut()
        .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
    resp
}

/// The answer to `POST /reload`: 200 when the file was applied, 400 with the error when
/// it was refused (the running config stays). Plain text, or JSON for a client that
/// accepts it (`portcullis ctl reload`): `{"reloaded": true}`, or `{"reloaded": false,
/// "error": "<the whole message>", "file", "key_path", "reason"}`.
fn reload_answer(result: &Result<(), crate::config::ConfigError>, json: bool) -> Response<Vec<u8>> {
    match (result, json) {
        (Ok(()), false) => text(StatusCode::OK, "reloaded\n"),
        (Err(e), false) => text(StatusCode::BAD_REQUEST, &format!("{e}\n")),
        (Ok(()), true) => respond(
            StatusCode::OK,
            "application/json",
            serde_json::json!({"reloaded": true})
                .to_string()
                .into_bytes(),
        ),
        (Err(e), true) => respond(
            StatusCode::BAD_REQUEST,
            "application/json",
            serde_json::json!({
                "reloaded": false,
                "error": e.to_string(),
                "file": e.file,
                "key_path": e.key_path,
                "reason": e.reason,
            })
            .to_string()
            .into_bytes(),
        ),
    }
}

fn text(status: StatusCode, body: &str) -> Response<Vec<u8>> {
    respond(
        status,
        "text/plain; charset=utf-8",
        body.as_bytes().to_vec(),
    )
}

/// The admin listener's connections (issue 40): at most `admin_max_connections` open at
/// once (beyond, a new one is closed at once), and `client_header_timeout_ms` from
/// accept to the end of each request's header block (408), with the proxy's idle
/// keep-alive wait between requests. A slowloris held the admin listener for minutes,
/// and enough of them took its file descriptors, `/healthz` with them.
pub struct AdminApp {
    inner: Arc<Admin>,
    shared: Arc<Shared>,
    open: Arc<AtomicUsize>,
    /// Header timeouts on the admin listener (not the proxy's refusal metric).
    header_timeouts: prometheus::IntCounter,
}

impl AdminApp {
    pub fn new(admin: Admin) -> Self {
        let shared = Arc::clone(&admin.shared);
        let open = Arc::clone(&admin.open);
        Self {
            inner: Arc::new(admin),
            shared,
            open,
            header_timeouts: prometheus::IntCounter::new(
                "portcullis_admin_header_timeouts",
                "admin header timeouts (not registered)",
            )
            .unwrap_or_else(|_| unreachable!("a valid metric name")),
        }
    }
}

/// One open admin connection, counted while it lives.
struct AdminOpen(Arc<AtomicUsize>);

impl Drop for AdminOpen {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl ServerApp for AdminApp {
    fn accept(&self) -> Option<Accepted> {
        let max = self
            .shared
            .runtime
            .load()
            .config
            .server
            .admin_max_connections;
        let now_open = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        let open = AdminOpen(Arc::clone(&self.open));
        // The reserve is for the probes: `Admin::response` sends anything else away.
        if now_open > max.saturating_add(PROBE_RESERVE) {
            tracing::debug!(event = "admin_connection_refused", open = now_open - 1, max);
            return None;
        }
        Some(Accepted {
            hold: Some(Box::new(open)),
            ..Accepted::default()
        })
    }

    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let header_timeout = self
            .shared
            .runtime
            .load()
            .config
            .server
            .client_header_timeout;
        let peer = stream
            .get_socket_digest()
            .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()));
        let edge = crate::edge::stream::EdgeStream::new(
            stream,
            crate::edge::Conn::new(peer, None, false),
            Vec::new(),
            header_timeout,
            tokio::time::Instant::now() + header_timeout,
            self.header_timeouts.clone(),
            false,
        );
        self.inner.process_new(Box::new(edge), shutdown).await
    }
}

/// A request header's value as text (`None`: absent or not visible ASCII).
fn header<'a>(session: &'a ServerSession, name: &str) -> Option<&'a str> {
    session
        .req_header()
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
}

impl Admin {
    /// The refusal of a request the guard keeps out ([`guard`]), or of one beyond
    /// `admin_max_connections` that is not a probe.
    fn guard(
        &self,
        session: &ServerSession,
        method: &http::Method,
        path: &str,
    ) -> Option<Response<Vec<u8>>> {
        let probe = matches!(path, "/healthz" | "/readyz");
        let rt = self.shared.runtime.load();
        let server = &rt.config.server;
        if !probe && self.open.load(Ordering::Relaxed) > server.admin_max_connections {
            let mut r = text(
                StatusCode::SERVICE_UNAVAILABLE,
                "admin: admin_max_connections are open; this connection is kept for /healthz and /readyz\n",
            );
            r.headers_mut()
                .insert(http::header::RETRY_AFTER, http::HeaderValue::from(1));
            return Some(r);
        }
        let host = header(session, "host");
        if !probe && !guard::host_allowed(host, &server.admin_hosts) {
            return Some(text(
                StatusCode::MISDIRECTED_REQUEST,
                "admin: the Host header does not name this listener (an IP address, localhost, \
                 or a name of server.admin_hosts)\n",
            ));
        }
        if method == http::Method::GET || method == http::Method::HEAD {
            return None;
        }
        let headers = &session.req_header().headers;
        let has_body = headers.contains_key(http::header::TRANSFER_ENCODING)
            || headers
                .get_all(http::header::CONTENT_LENGTH)
                .iter()
                .any(|v| v.as_bytes().iter().any(|b| (b'1'..=b'9').contains(b)));
        let change = guard::ChangeHeaders {
            host,
            origin: header(session, "origin"),
            sec_fetch_site: header(session, "sec-fetch-site"),
            content_type: header(session, "content-type"),
            has_body,
        };
        match guard::check_change(&change) {
            Ok(()) => None,
            Err(guard::Refusal::MediaType) => Some(text(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "admin: a request body must be Content-Type: application/json\n",
            )),
            Err(_) => Some(text(
                StatusCode::FORBIDDEN,
                "admin: refused a state-changing request from another site (Origin or \
                 Sec-Fetch-Site); use portcullis ctl or curl\n",
            )),
        }
    }
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let mut r = self.handle(session).await;
        if !r.status().is_success() && !session.is_body_done() {
            // an unread body would be taken for the next request
            session.set_keepalive(None);
        }
        let len = r.body().len();
        let h = r.headers_mut();
        h.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
        h.insert(MARKER, http::HeaderValue::from_static("1"));
        r
    }
}

impl Admin {
    async fn handle(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        if let Some(conn) = crate::edge::conn_of_server_session(session) {
            // The header is in: its deadline is done; the next request's starts with
            // its first byte, after an idle wait of the proxy's keep-alive timeout.
            let idle = self.shared.runtime.load().config.server.h1_idle();
            conn.header_received(idle);
            conn.request_done();
        }
        let method = session.req_header().method.clone();
        let path = session.req_header().uri.path().to_string();
        if let Some(refusal) = self.guard(session, &method, &path) {
            tracing::warn!(
                event = "admin",
                status = refusal.status().as_u16(),
                method = %method,
                path = %path,
                "admin request refused"
            );
            session.set_keepalive(None);
            return refusal;
        }
        let mut by = String::new();
        if method != http::Method::GET && method != http::Method::HEAD {
            match self.post_caller(session) {
                Ok(name) => by = name,
                Err(refusal) => {
                    tracing::warn!(
                        event = "admin",
                        status = refusal.status().as_u16(),
                        path = %path,
                        "admin POST refused"
                    );
                    return *refusal;
                }
            }
        }
        if let Some(rest) = path.strip_prefix("/backends/") {
            if method != http::Method::POST {
                return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
            }
            return match self.body(session).await {
                Ok(body) => {
                    let (budget, view) = (self.budget.as_ref(), &*self.view);
                    crate::fleet::api::act(&self.shared, budget, view, rest, &body, &by).await
                }
                Err(r) => *r,
            };
        }
        if let Some(r) = self.claims(session, &method, &path, &by).await {
            return r;
        }
        match (method.as_str(), path.as_str()) {
            ("GET", "/backends") => crate::fleet::api::list(&self.shared),
            ("GET", "/") => respond(
                StatusCode::OK,
                "text/html; charset=utf-8",
                crate::observe::status_page::PAGE.as_bytes().to_vec(),
            ),
            ("GET" | "HEAD", "/healthz") => text(StatusCode::OK, "ok\n"),
            ("GET" | "HEAD", "/readyz") => {
                if self.shared.lifecycle.is_ready() {
                    text(StatusCode::OK, "ready\n")
                } else {
                    text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
                }
            }
            ("GET", "/metrics") => {
                self.refresh_metrics();
                respond(
                    StatusCode::OK,
                    "text/plain; version=0.0.4",
                    self.shared.metrics.render(),
                )
            }
            ("GET", "/status") => {
                let query = session.req_header().uri.query();
                let body = serde_json::to_vec_pretty(&self.status_json(query)).unwrap_or_default();
                respond(StatusCode::OK, "application/json", body)
            }
            ("POST", "/reload") => {
                let result = crate::reload::reload_off_thread(&self.shared).await;
                let wants_json = session
                    .req_header()
                    .headers
                    .get(http::header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.contains("application/json"));
                reload_answer(&result, wants_json)
            }
            (_, "/healthz" | "/readyz" | "/metrics" | "/status" | "/reload" | "/backends")
            | (_, "/claims" | "/claims/feasible") => {
                text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n")
            }
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn post_access_rules() {
        use PostAccess::*;
        assert_eq!(post_access("", true, None), Allowed);
        assert_eq!(post_access("", false, None), Forbidden);
        assert_eq!(post_access("", false, Some(b"Bearer x")), Forbidden);
        assert_eq!(post_access("s3cret", true, None), Unauthorized);
        assert_eq!(
            post_access("s3cret", false, Some(b"Bearer s3cret")),
            Allowed
        );
        assert_eq!(
            post_access("s3cret", true, Some(b"bearer  s3cret ")),
            Allowed
        );
        assert_eq!(
            post_access("s3cret", true, Some(b"Bearer s3cre")),
            Unauthorized
        );
        assert_eq!(
            post_access("s3cret", true, Some(b"Bearer s3cretX")),
            Unauthorized
        );
        assert_eq!(
            post_access("s3cret", true, Some(b"Basic s3cret")),
            Unauthorized
        );
        assert_eq!(post_access("s3cret", true, Some(b"s3cret")), Unauthorized);
    }
}
