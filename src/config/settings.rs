//! Typed runtime settings, one value per concern, built from the file schema by
//! [`super::validate`]. Nothing outside `src/config/` sees the schema: the rest
//! of the proxy reads these, and a reload diffs them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ratelimit::{KeySource, MissingKey};
use portcullis_policy::cull::CullingSettings;
use portcullis_policy::ratelimit::RateLimitParams;
use portcullis_policy::shed::{Priority, SheddingSettings};

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
    /// `[budget]`: the claims' safety policy.
    pub budget: portcullis_policy::cull::claims::BudgetPolicy,
    pub watchdog: WatchdogSettings,
    pub access_log: AccessLogSettings,
    pub tracing: TracingSettings,
    pub log: LogSettings,
    /// `[tls]`: TLS listeners and their certificates (loaded); `None` = none.
    pub tls: Option<TlsSettings>,
    /// `[tenants]` and `[tiers.*]`, with the tenants file read.
    pub tenants: TenantSettings,
    /// `[errors]`: the bodies of the proxy's own answers, pages read and split.
    pub errors: crate::respond::body::ErrorBodies,
}

/// `[tls]`, with the certificate files already read and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsSettings {
    pub listen: Vec<SocketAddr>,
    pub min_version: crate::config::certs::MinVersion,
    /// In file order; the first is the default for unknown or missing SNI.
    pub certificates: crate::config::certs::CertSet,
}

/// How an upstream's backends are reached (CONTRACT §6).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpstreamTransport {
    pub tls: bool,
    /// SNI and verified name; empty = the backend's host.
    pub sni: String,
    pub verify: bool,
    /// Extra trust anchors (`ca_file`), read at load.
    pub ca: Option<crate::config::certs::CaBundle>,
    pub http2: bool,
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
    /// Cleartext HTTP/2 (prior knowledge) on `listen` too.
    pub h2c: bool,
    /// HTTP/1 header names keep their case (false: canonical case).
    pub preserve_header_case: bool,
    /// Bearer token for POST admin endpoints; empty = none.
    pub admin_token: Secret,
    /// `[server.admin_tokens]`: (name, token), sorted by name.
    pub admin_tokens: Vec<(String, Secret)>,
    pub trusted_proxies: crate::edge::TrustedProxies,
    pub proxy_protocol: bool,
    pub max_request_body_bytes: u64,
    pub client_header_timeout: Duration,
    pub client_body_timeout: Duration,
    pub max_connections: usize,
    /// Response body bytes one request reads ahead of the client (start-time only).
    pub max_response_buffer_bytes: usize,
    // Issue 40, connections (CONTRACT §17).
    /// HTTP/1.1 keep-alive (with `keepalive_seconds`, the shorter) and HTTP/2 idle time.
    pub idle_timeout: Duration,
    pub tls_handshake_timeout: Duration,
    pub admin_max_connections: usize,
    /// `admin_hosts`, lowercase, without ports; `["*"]` answers to any host.
    pub admin_hosts: Vec<String>,
    /// `tunnel_idle_timeout_seconds`: an upgraded tunnel idle this long is closed.
    pub tunnel_idle_timeout: Duration,
    /// Glitches one HTTP/2 connection may cause per minute (`h2_max_glitches`).
    pub h2_max_glitches: u32,
    /// `unmatched`: the answer to a request no route matches.
    pub unmatched: super::schema::UnmatchedSection,
}

impl ServerSettings {
    /// How long an HTTP/1.1 connection waits for its next request: the shorter of
    /// `keepalive_timeout_seconds` (0: no limit of its own) and `idle_timeout_ms`.
    pub fn h1_idle(&self) -> Duration {
        match self.keepalive_seconds {
            0 => self.idle_timeout,
            secs => Duration::from_secs(secs).min(self.idle_timeout),
        }
    }
}

/// `[redis]`: where the fleet's shared state lives.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreSettings {
    /// Mode, addresses, AUTH and TLS (CONTRACT §9); `Debug` hides passwords.
    pub endpoint: portcullis_store::Endpoint,
    pub key_prefix: String,
    pub flush_interval: Duration,
    pub timeout: Duration,
}

/// One `[[upstreams]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    pub name: String,
    pub backends: Vec<SocketAddr>,
    /// `""`: no active health check (the path of [`Upstream::health`]).
    pub health_check_path: String,
    pub health_check_interval: Duration,
    /// The active health check (`[upstreams.health_check]`, or the two old keys).
    pub health: Option<HealthCheck>,
    /// The `Host` each backend is known by, aligned with `backends`: the entry as
    /// written (`10.0.0.5:8080`, or `api.example:8080` for each address it resolves to).
    pub hosts: Vec<String>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub transport: UpstreamTransport,
    /// The `backends` entries as written (`host:port`) with their weight, for
    /// DNS resolution; `backends` is what they resolve to (empty after validation when
    /// any entry is a name, until the runtime resolves it: `state::resolve`).
    pub entries: Vec<(String, u32)>,
    /// Each entry's name, `max_conn` and `backup`, aligned with `entries`.
    pub meta: Vec<BackendMeta>,
    /// `weights` (or a table's `weight`) was set (then `balance.weights` has one weight
    /// per address).
    pub weighted: bool,
    /// `groups`: (name, backend addresses as written), sorted by name.
    pub groups: Vec<(String, Vec<String>)>,
    /// Balancing, retries, bulkhead, sharding (`balance.weights` is aligned
    /// with `backends`).
    pub balance: crate::balance::BalanceSettings,
}

/// A backend entry's name, `max_conn` and `backup` (`backends` as tables).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendMeta {
    /// `None`: the address is its name.
    pub name: Option<String>,
    /// 0: no limit.
    pub max_conn: u64,
    pub backup: bool,
}

/// An upstream's active health check.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthCheck {
    pub path: String,
    pub method: String,
    /// `""`: the upstream's `sni`, else the backend as written.
    pub host: String,
    /// More request headers, sorted by name.
    pub headers: Vec<(String, String)>,
    pub expect_status: portcullis_policy::health::ExpectStatus,
    pub expect_body: String,
    pub thresholds: portcullis_policy::health::Thresholds,
    pub timeout: Duration,
    /// `None`: the backend's port.
    pub port: Option<u16>,
    /// With the store, each backend is probed by `probers` instances and every instance
    /// follows their majority verdict (without one: probed here, as when false).
    pub shared: bool,
    /// How many instances probe each backend when `shared` (1..64).
    pub probers: u32,
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
    /// `request_headers_*` / `response_headers_*` and the `request_headers` /
    /// `response_headers` tables.
    pub headers: crate::edge::HeaderRules,
    /// `methods`: empty = any.
    pub methods: Vec<http::Method>,
    /// `client_cidrs`: `None` = any client.
    pub client_cidrs: Option<crate::edge::TrustedProxies>,
    /// `action`, `status` and `location`.
    pub action: RouteAction,
    /// `rate_limit_policies`: bit `i` for the runtime's policy `i` (0 is
    /// `[rate_limit]`, then `[[rate_limit.policies]]` in file order); all bits = all.
    pub policy_mask: u64,
}

impl Route {
    /// How many of `methods` and `client_cidrs` the route sets (0 to 2): among routes of
    /// one host and prefix, the more specific are tried first.
    pub fn conditions(&self) -> u8 {
        u8::from(!self.methods.is_empty()) + u8::from(self.client_cidrs.is_some())
    }

    /// Whether a request with `method` from `client` matches `methods` and `client_cidrs`.
    #[inline]
    pub fn admits(&self, method: &http::Method, client: Option<std::net::IpAddr>) -> bool {
        (self.methods.is_empty() || self.methods.contains(method))
            && self
                .client_cidrs
                .as_ref()
                .is_none_or(|c| client.is_some_and(|ip| c.contains(ip)))
    }
}

/// What a route does with its requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteAction {
    Proxy,
    /// Answer this status.
    Deny(u16),
    /// Answer this status with `Location` from the template.
    Redirect(u16, crate::edge::rules::Location),
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
    /// `[[rate_limit.policies]]`, in file order.
    pub policies: Vec<RatePolicySettings>,
    /// Shadow mode of the `[rate_limit]` policy: decide and report, never refuse.
    pub shadow: bool,
    /// `cost_header`: the response header holding a request's cost; `None` = none.
    pub cost_header: Option<http::HeaderName>,
    /// `[jwt]`: the verifier of `jwt:CLAIM` keys (its files read at load); `None` without
    /// `[jwt]`.
    pub jwt: Option<std::sync::Arc<crate::ratelimit::jwt::Verifier>>,
}

/// One `[[rate_limit.policies]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct RatePolicySettings {
    pub name: std::sync::Arc<str>,
    pub key: crate::ratelimit::PolicyKey,
    /// Requests whose path starts with this are checked against the policy.
    pub path_prefix: String,
    /// Window, limit, overrides (`keys`) and the memory cap (`[rate_limit]`'s).
    pub params: RateLimitParams,
    /// Shadow mode (its own `shadow`, else `[rate_limit] shadow`).
    pub shadow: bool,
}

/// `[watchdog]`: the proxy culls itself through a fleet-wide budget. Read straight from
/// the file (the keys are these fields); `validate` checks the ranges.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WatchdogSettings {
    /// False: nothing is watched.
    pub enabled: bool,
    /// Resident memory limit in MiB; `0` = not watched.
    #[schemars(range(min = 0, max = 1048576))]
    pub max_rss_mb: u64,
    /// Share of requests in one interval the proxy itself answered 502/504/500 (of proxied +
    /// upstream_error + no_backend); a breach is strictly above; `1.0` = not watched.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub max_error_rate: f64,
    /// Longest lag of a 100 ms timer on the proxy's runtime or the watchdog's own.
    #[schemars(range(min = 1, max = 600000))]
    pub max_stall_ms: u64,
    /// Requests an interval needs before its error rate is judged.
    #[schemars(range(min = 1, max = 1_000_000_000_000u64))]
    pub min_requests: u64,
    /// Time between two checks; only whole intervals spent ready are judged.
    #[schemars(range(min = 1, max = 3600))]
    pub check_interval_seconds: u64,
    /// Fleet-wide self-restarts allowed per token period (shared through Redis).
    #[schemars(range(min = 0, max = 1000000))]
    pub tokens: u32,
    /// The period over which `tokens` self-restarts are allowed.
    #[schemars(range(min = 1, max = 604800))]
    pub token_period_seconds: u64,
}

impl Default for WatchdogSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            max_rss_mb: 0,
            max_error_rate: 0.5,
            max_stall_ms: 1000,
            min_requests: 20,
            check_interval_seconds: 10,
            tokens: 1,
            token_period_seconds: 600,
        }
    }
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
    /// Send the lines to syslog instead (`path` is then `None`).
    pub syslog: Option<crate::observe::syslog::SyslogTarget>,
}

/// `[tracing]`: OTLP/HTTP span export.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// The collector's OTLP/HTTP URL (`http://` or `https://`); `None`: no
    /// span export. Fixed for the process's life.
    pub otlp_endpoint: Option<String>,
    /// Share of new traces (no valid `traceparent`) whose spans are exported;
    /// a continued trace follows the client's sampled flag. Reloadable.
    pub sample: f64,
}

/// `[log]`: the process's own log lines (stderr). Fixed for the process's life: the
/// subscriber is installed once, before the server starts.
#[derive(Debug, Clone, PartialEq)]
pub struct LogSettings {
    pub format: LogFormat,
}

/// `[log] format`.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Text when stderr is a terminal (a person is reading), JSON otherwise.
    #[default]
    Auto,
    /// One JSON object per line.
    Json,
    /// One human-readable line per event: time, level, target, message, then the fields
    /// as `key=value`.
    Text,
}

/// A secret value (the admin token): compared, never printed. No `Serialize`, so the
/// schema's default of a `Secret` field is written beside the field.
#[derive(Clone, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[schemars(description = "A secret: compared, never printed or logged.")]
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
#[derive(Clone, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[schemars(
    description = "A Redis URL: redis://[user:password@]host[:port][/db], or rediss:// for TLS. \
    Logged with its password redacted."
)]
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

// ---- [tenants] and [tiers.NAME] (CONTRACT §14), read by `tenants.rs`

/// What a key no tenant holds gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownKey {
    /// Limited as its own key (as without tenants).
    #[default]
    Allow,
    /// Limited by the client's address, as a request without a key.
    ClientIp,
    /// 401.
    Reject,
}

impl UnknownKey {
    pub fn as_str(self) -> &'static str {
        match self {
            UnknownKey::Allow => "allow",
            UnknownKey::ClientIp => "client_ip",
            UnknownKey::Reject => "reject",
        }
    }
}

/// One tier: what every tenant of it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    pub name: std::sync::Arc<str>,
    /// Requests per window of `[rate_limit]`.
    pub limit: u64,
    /// Requests in flight across the fleet; 0 = no cap.
    pub concurrency: u64,
    /// The shedding class of its requests; `None`: the route's.
    pub priority: Option<Priority>,
    /// Cost units per period; 0 = none.
    pub quota: u64,
    pub period: portcullis_policy::tenant::Period,
}

/// One tenant of the file: its name, its tier (an index in [`TenantSettings::tiers`]) and
/// the SHA-256 of each of its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub name: std::sync::Arc<str>,
    pub tier: usize,
    pub keys: Vec<[u8; 32]>,
    /// Read from the store (`redis_sync`), not the file.
    pub from_store: bool,
}

/// `[tenants]` and `[tiers]`, with the file's tenants once read ([`read_file`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSettings {
    pub file: Option<PathBuf>,
    pub redis_sync: bool,
    pub unknown_key: UnknownKey,
    /// A tenants file with no tenant may be applied (`tenants.allow_empty`).
    pub allow_empty: bool,
    /// The largest tenants file read (`tenants.max_file_bytes`).
    pub max_file_bytes: u64,
    /// In name order.
    pub tiers: Vec<Tier>,
    /// The tenants file's entries, in file order.
    pub tenants: Vec<Tenant>,
}

impl Default for TenantSettings {
    fn default() -> Self {
        Self {
            file: None,
            redis_sync: false,
            unknown_key: UnknownKey::default(),
            allow_empty: false,
            max_file_bytes: super::file_caps::TENANTS,
            tiers: Vec::new(),
            tenants: Vec::new(),
        }
    }
}

impl TenantSettings {
    /// Whether requests are identified by tenant at all.
    pub fn enabled(&self) -> bool {
        self.file.is_some() || self.redis_sync
    }

    pub fn tier(&self, name: &str) -> Option<usize> {
        self.tiers.iter().position(|t| &*t.name == name)
    }
}
