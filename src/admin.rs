//! Admin endpoints on `admin_listen`: `/healthz` (liveness), `/readyz`
//! (readiness, 503 once draining), `/metrics` (Prometheus text), `/status`
//! (JSON) and `POST /reload` (same as SIGHUP).

use crate::state::{unix_secs, Shared};
use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub struct Admin {
    pub shared: Arc<Shared>,
    /// Store errors already added to the Prometheus counter.
    store_errors_seen: AtomicU64,
    /// Backend errors already added, per (upstream, backend).
    backend_errors_seen: std::sync::Mutex<std::collections::HashMap<(String, String), u64>>,
}

impl Admin {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            store_errors_seen: AtomicU64::new(0),
            backend_errors_seen: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Copy gauges that live as atomics elsewhere into the registry.
    fn refresh_metrics(&self) {
        let s = &self.shared;
        let m = &s.metrics;
        m.inflight.set(s.shedder.inflight() as i64);
        m.ready.set(i64::from(s.lifecycle.is_ready()));
        m.ratelimit_store_healthy
            .set(i64::from(s.limiter.store_healthy()));
        m.ratelimit_tracked_keys
            .set(s.limiter.tracked_keys() as i64);
        let total = s.limiter.store_errors_total();
        let prev = self.store_errors_seen.swap(total, Ordering::AcqRel);
        m.ratelimit_store_errors.inc_by(total.saturating_sub(prev));
        let rt = s.runtime.load();
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
                m.backend_errors
                    .with_label_values(&[pool.name.as_str(), b.addr_str.as_str()])
                    // a re-added backend starts from zero again
                    .inc_by(errors.checked_sub(*prev).unwrap_or(errors));
                *prev = errors;
            }
            m.upstream_panic_mode
                .with_label_values(&[pool.name.as_str()])
                .set(i64::from(pool.panic_mode.load(Ordering::Relaxed)));
            for b in &pool.backends {
                m.backend_culled
                    .with_label_values(&[pool.name.as_str(), b.addr_str.as_str()])
                    .set(i64::from(b.is_culled()));
            }
        }
    }

    pub fn status_json(&self) -> serde_json::Value {
        let s = &self.shared;
        let rt = s.runtime.load();
        let now = unix_secs();
        let upstreams: Vec<_> = rt
            .pools
            .iter()
            .map(|pool| {
                let backends: Vec<_> = pool
                    .backends
                    .iter()
                    .map(|b| {
                        let state = if b.is_culled() {
                            "culled"
                        } else if !pool.is_healthy(b) {
                            "unhealthy"
                        } else {
                            "up"
                        };
                        let (requests, errors) = b.window.totals(now);
                        json!({
                            "address": b.addr_str,
                            "state": state,
                            "errors_in_window": errors,
                            "requests_in_window": requests,
                            "dry_run_culled": b.is_dry_run_culled(),
                        })
                    })
                    .collect();
                json!({
                    "name": pool.name,
                    "panic_mode": pool.panic_mode.load(Ordering::Relaxed),
                    "backends": backends,
                })
            })
            .collect();
        let culling = &rt.config.raw.culling;
        json!({
            "state": s.lifecycle.state_name(),
            "inflight": s.shedder.inflight(),
            "max_concurrency": s.shedder.cap(),
            "rate_limit": {
                "enabled": rt.rate_limit.is_some(),
                "store": s.store_kind,
                "store_healthy": s.limiter.store_healthy(),
                "tracked_keys": s.limiter.tracked_keys(),
            },
            "culling": {
                "enabled": culling.enabled,
                "dry_run": culling.dry_run,
                "tokens_available": s.metrics.cull_tokens_available.get(),
            },
            "upstreams": upstreams,
        })
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

fn text(status: StatusCode, body: &str) -> Response<Vec<u8>> {
    respond(
        status,
        "text/plain; charset=utf-8",
        body.as_bytes().to_vec(),
    )
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let method = session.req_header().method.clone();
        let path = session.req_header().uri.path().to_string();
        match (method.as_str(), path.as_str()) {
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
                let body = serde_json::to_vec_pretty(&self.status_json()).unwrap_or_default();
                respond(StatusCode::OK, "application/json", body)
            }
            ("POST", "/reload") => match crate::reload::reload(&self.shared) {
                Ok(()) => text(StatusCode::OK, "reloaded\n"),
                Err(e) => text(StatusCode::BAD_REQUEST, &format!("{e}\n")),
            },
            (_, "/healthz" | "/readyz" | "/metrics" | "/status" | "/reload") => {
                text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n")
            }
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }
}
