//! Typed runtime settings, one value per concern, built from the file schema by
//! [`super::validate`]. Nothing outside `src/config/` sees the schema: the rest
//! of the proxy reads these, and a reload diffs them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::cull::CullParams;
use crate::ratelimit::{KeySource, MissingKey, RateLimitParams};
pub use crate::shed::Priority;

/// A validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub server: ServerSettings,
    /// `None`: no `[redis]`, the in-process store.
    pub store: Option<StoreSettings>,
    pub upstreams: Vec<Upstream>,
    /// Routes ordered for first-match: longest prefix first, host-specific before any-host.
    pub routes: Vec<Route>,
    pub shedding: SheddingSettings,
    pub rate_limit: RateLimitSettings,
    pub culling: CullingSettings,
    pub watchdog: WatchdogSettings,
    pub access_log: AccessLogSettings,
}

/// `[server]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    pub listen: Vec<SocketAddr>,
    pub admin_listen: SocketAddr,
    pub threads: usize,
    pub drain: Duration,
    pub shutdown_timeout: Duration,
    pub upgrade_sock: PathBuf,
    pub max_request_header_bytes: usize,
    pub keepalive_seconds: u64,
    /// Bearer token for POST admin endpoints; empty = none.
    pub admin_token: Secret,
    pub trusted_proxies: crate::edge::TrustedProxies,
    pub proxy_protocol: bool,
    pub max_request_body_bytes: u64,
    pub client_header_timeout: Duration,
    pub client_body_timeout: Duration,
    pub max_connections: usize,
}

/// `[redis]`: where the fleet's shared state lives.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreSettings {
    pub url: RedisUrl,
    pub key_prefix: String,
    pub flush_interval: Duration,
    pub timeout: Duration,
}

/// One `[[upstreams]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    pub name: String,
    pub backends: Vec<SocketAddr>,
    /// `""`: no active health check.
    pub health_check_path: String,
    pub health_check_interval: Duration,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// The `backends` entries as written (`host:port`) with their weight, for
    /// DNS re-resolution; `backends` is what they resolve to.
    pub entries: Vec<(String, u32)>,
    /// Balancing, retries, bulkhead, sharding (`balance.weights` is aligned
    /// with `backends`).
    pub balance: crate::balance::BalanceSettings,
}

/// One `[[routes]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Lower-case host without port; `None` matches any host.
    pub host: Option<String>,
    pub path_prefix: String,
    /// Index into [`Config::upstreams`].
    pub upstream: usize,
    pub priority: Priority,
    /// `request_headers_*` / `response_headers_*`.
    pub headers: crate::edge::HeaderRules,
}

/// `[shedding]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SheddingSettings {
    /// 0 = no cap.
    pub max_concurrency: u64,
    pub retry_after_secs: u64,
    /// Gradient limit learned from upstream latency.
    pub adaptive: bool,
    pub min_concurrency: u64,
}

/// `[rate_limit]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimitSettings {
    pub enabled: bool,
    pub source: KeySource,
    pub missing_key: MissingKey,
    /// RateLimit fields on admitted responses too.
    pub headers: bool,
    pub policy_name: std::sync::Arc<str>,
    /// What the limiter itself needs (window, limits, overrides, memory cap).
    pub params: RateLimitParams,
    /// `rate_limit.keys` as written, for the reload diff and `/status`.
    pub keys: BTreeMap<String, u64>,
}

/// `[culling]`.
#[derive(Debug, Clone, PartialEq)]
pub struct CullingSettings {
    pub enabled: bool,
    pub params: CullParams,
    /// `""`: no webhook.
    pub webhook_url: String,
}

/// `[watchdog]`.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchdogSettings {
    pub enabled: bool,
    /// 0 = not watched.
    pub max_rss_mb: u64,
    pub max_error_rate: f64,
    pub max_stall_ms: u64,
    pub min_requests: u64,
    pub check_interval_seconds: u64,
    pub tokens: u32,
    pub token_period_seconds: u64,
}

/// `[access_log]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AccessLogSettings {
    pub enabled: bool,
    /// `None`: stdout.
    pub path: Option<PathBuf>,
    /// Share of 1xx-3xx responses logged, 0.0..=1.0.
    pub sample: f64,
    /// Bound of the writer's queue, in lines.
    pub queue_lines: usize,
}

/// A secret value (the admin token): compared, never printed.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"***\"" })
    }
}

/// A Redis URL. It may carry a password (`redis://user:password@host`), so
/// `Debug` shows it redacted; [`RedisUrl::expose`] is for connecting only.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct RedisUrl(String);

impl RedisUrl {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", super::redact::redact_url(&self.0))
    }
}
