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

mod access;
mod conn;
pub mod guard;
mod scrape;
mod status;

pub use access::{post_access, post_caller, PostAccess};
pub use conn::AdminApp;

use crate::state::Shared;
use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
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
        let by = match self.admit(session, &method, &path) {
            Ok(by) => by,
            Err(refusal) => return *refusal,
        };
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
        self.serve(session, &method, &path).await
    }

    /// The admin listener's rules before any route: the guard (origin, host, the request's
    /// shape) and, for a change, who asks (`Err`: the refusal to answer). The caller's name
    /// for the journal; empty for a read.
    fn admit(
        &self,
        session: &mut ServerSession,
        method: &http::Method,
        path: &str,
    ) -> Result<String, Box<Response<Vec<u8>>>> {
        if let Some(refusal) = self.guard(session, method, path) {
            tracing::warn!(
                event = "admin",
                status = refusal.status().as_u16(),
                method = %method,
                path = %path,
                "admin request refused"
            );
            session.set_keepalive(None);
            return Err(Box::new(refusal));
        }
        let mut by = String::new();
        if *method != http::Method::GET && *method != http::Method::HEAD {
            match self.post_caller(session) {
                Ok(name) => by = name,
                Err(refusal) => {
                    tracing::warn!(
                        event = "admin",
                        status = refusal.status().as_u16(),
                        path = %path,
                        "admin POST refused"
                    );
                    return Err(refusal);
                }
            }
        }
        Ok(by)
    }

    /// The routes with no body to read: health, readiness, metrics, status, the page, the
    /// list of backends and a reload.
    async fn serve(
        &self,
        session: &ServerSession,
        method: &http::Method,
        path: &str,
    ) -> Response<Vec<u8>> {
        match (method.as_str(), path) {
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
