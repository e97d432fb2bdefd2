//! The file schema: what `portcullis.toml` may contain, with the defaults of
//! CONTRACT.md section 2. Unknown keys are errors (`deny_unknown_fields`), so a
//! typo can never silently disable a gate.

use serde::Deserialize;

pub use super::settings::{LogFormat, RedisUrl, Secret};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub server: ServerSection,
    pub redis: Option<RedisSection>,
    #[serde(default)]
    pub upstreams: Vec<UpstreamSection>,
    #[serde(default)]
    pub routes: Vec<RouteSection>,
    #[serde(default)]
    pub shedding: SheddingSection,
    #[serde(default)]
    pub rate_limit: RateLimitSection,
    #[serde(default)]
    pub culling: CullingSection,
    #[serde(default)]
    pub watchdog: WatchdogSection,
    #[serde(default)]
    pub access_log: AccessLogSection,
    #[serde(default)]
    pub tracing: TracingSection,
    /// `[log]`: how the process's own log lines are written (CONTRACT §16).
    #[serde(default)]
    pub log: LogSection,
    /// `[tls]`: TLS listeners (CONTRACT §6); absent = none.
    pub tls: Option<TlsSection>,
}

/// `[tls]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    #[serde(default = "default_tls_listen")]
    pub listen: Vec<String>,
    #[serde(default = "default_tls_min_version")]
    pub min_version: String,
    #[serde(default)]
    pub certificates: Vec<CertificateSection>,
}

fn default_tls_listen() -> Vec<String> {
    vec!["0.0.0.0:8443".into()]
}
fn default_tls_min_version() -> String {
    "1.2".into()
}

/// One `[[tls.certificates]]` entry: PEM certificate (chain) and key files.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CertificateSection {
    pub cert: String,
    pub key: String,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// Proxy listeners (HTTP/1.1).
    pub listen: Vec<String>,
    /// Admin endpoints: /healthz /readyz /metrics /status /reload.
    pub admin_listen: String,
    /// Worker threads of the proxy service.
    pub threads: usize,
    /// After SIGTERM readiness fails at once, traffic is still served this long.
    pub drain_seconds: u64,
    /// Then listeners close; in-flight requests get at most this long.
    pub shutdown_timeout_seconds: u64,
    /// Unix socket used to hand listeners to an upgrading process (`-u`).
    pub upgrade_sock: String,
    /// Largest request header block accepted (request line + headers); larger
    /// requests get 431. Pingora itself caps headers at 1 MiB (answered 400).
    pub max_request_header_bytes: usize,
    /// Idle keep-alive timeout for client connections.
    pub keepalive_timeout_seconds: u64,
    /// When set, `POST` admin endpoints need `Authorization: Bearer <token>`
    /// (401 otherwise). Without it they are answered only on a loopback
    /// `admin_listen` (403 elsewhere).
    pub admin_token: Secret,
    /// Also accept cleartext HTTP/2 (prior knowledge) on `listen`.
    pub h2c: bool,
    /// false (the default): HTTP/1 header names are written in canonical case, as
    /// HAProxy and Envoy write them (less work per request); true: they keep the case
    /// they arrived in (Pingora's behaviour).
    pub preserve_header_case: bool,
    /// CIDRs (or addresses) of the proxies allowed to say who the client is.
    pub trusted_proxies: Vec<String>,
    /// Listeners expect a PROXY v1/v2 header, from `trusted_proxies` only.
    pub proxy_protocol: bool,
    /// Larger request bodies get 413.
    pub max_request_body_bytes: u64,
    /// The request header block must arrive within this (else 408).
    pub client_header_timeout_ms: u64,
    /// Longest pause between body reads (else 408).
    pub client_body_timeout_ms: u64,
    /// Client connections open at once; beyond, new ones are closed.
    pub max_connections: usize,
    /// Response bytes one request may hold in the proxy; past it, reading the
    /// upstream waits for the client (backpressure).
    pub max_response_buffer_bytes: usize,
    // Issue 40, connections (CONTRACT §17).
    /// A keep-alive HTTP/1.1 or HTTP/2 connection with nothing in flight is
    /// closed after this (HTTP/2: GOAWAY NO_ERROR).
    pub idle_timeout_ms: u64,
    /// A TLS handshake must complete within this.
    pub tls_handshake_timeout_ms: u64,
    /// Connections to the admin listener; beyond, new ones are closed.
    pub admin_max_connections: usize,
    /// An upgraded tunnel (WebSocket) idle this long is closed.
    pub tunnel_idle_timeout_seconds: u64,
    /// Per HTTP/2 connection per minute: streams the client resets after they
    /// were accepted, or malformed streams; past it, GOAWAY ENHANCE_YOUR_CALM.
    pub h2_max_glitches: u32,
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            listen: vec!["127.0.0.1:8080".into()],
            admin_listen: "127.0.0.1:9090".into(),
            threads: 2,
            drain_seconds: 5,
            shutdown_timeout_seconds: 30,
            upgrade_sock: "/tmp/portcullis-upgrade.sock".into(),
            max_request_header_bytes: 64 * 1024,
            keepalive_timeout_seconds: 60,
            admin_token: Secret::default(),
            h2c: false,
            preserve_header_case: false,
            trusted_proxies: Vec::new(),
            proxy_protocol: false,
            max_request_body_bytes: 10 * 1024 * 1024,
            client_header_timeout_ms: 10_000,
            client_body_timeout_ms: 30_000,
            max_connections: 20_000,
            max_response_buffer_bytes: 1024 * 1024,
            idle_timeout_ms: 60_000,
            tls_handshake_timeout_ms: 10_000,
            admin_max_connections: 64,
            tunnel_idle_timeout_seconds: 300,
            h2_max_glitches: 100,
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RedisSection {
    /// standalone | cluster | sentinel (CONTRACT §9).
    pub mode: String,
    /// Standalone only; `None` = the default `redis://127.0.0.1:6379` (so a `url`
    /// written next to `mode = "cluster"` can be refused).
    pub url: Option<RedisUrl>,
    /// Cluster: seed nodes `host:port`.
    pub nodes: Vec<String>,
    /// Sentinel: `host:port` of the sentinels.
    pub sentinels: Vec<String>,
    pub master_name: String,
    /// AUTH for cluster/sentinel data nodes.
    pub password: Secret,
    /// TLS to cluster/sentinel nodes.
    pub tls: bool,
    pub ca_file: String,
    pub key_prefix: String,
    pub flush_interval_ms: u64,
    pub timeout_ms: u64,
}

impl Default for RedisSection {
    fn default() -> Self {
        Self {
            mode: "standalone".into(),
            url: None,
            nodes: Vec::new(),
            sentinels: Vec::new(),
            master_name: "mymaster".into(),
            password: Secret::default(),
            tls: false,
            ca_file: String::new(),
            key_prefix: "portcullis".into(),
            flush_interval_ms: 50,
            timeout_ms: 200,
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSection {
    pub name: String,
    pub backends: Vec<String>,
    #[serde(default)]
    pub health_check_path: String,
    #[serde(default = "default_hc_interval")]
    pub health_check_interval_seconds: u64,
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_ms: u64,
    #[serde(default = "default_read_timeout")]
    pub read_timeout_ms: u64,
    /// Connect to the backends over TLS.
    #[serde(default)]
    pub tls: bool,
    /// SNI and verified name; "" = the backend's host.
    #[serde(default)]
    pub sni: String,
    /// Verify the backend certificate chain and name.
    #[serde(default = "default_true")]
    pub verify: bool,
    /// Extra PEM bundle to trust; "" = none.
    #[serde(default)]
    pub ca_file: String,
    /// HTTP/2 to the backends: ALPN over TLS, prior knowledge without.
    #[serde(default)]
    pub http2: bool,
    /// round_robin | least_requests | consistent_hash | random (CONTRACT §10).
    #[serde(default)]
    pub balance: BalanceSection,
    /// consistent_hash and shard_size: header:NAME | query:NAME | bearer | client_ip | path.
    #[serde(default = "default_hash_key")]
    pub hash_key: String,
    /// One positive integer per backend; empty = all equal.
    #[serde(default)]
    pub weights: Vec<u64>,
    /// Retries on another backend after a 502/503/reset (idempotent methods).
    #[serde(default = "default_retries")]
    pub retries: u64,
    #[serde(default = "default_retry_budget_ratio")]
    pub retry_budget_ratio: f64,
    /// Per-upstream in-flight cap (bulkhead); 0 = none.
    #[serde(default)]
    pub max_inflight: u64,
    #[serde(default = "default_resolve_interval")]
    pub resolve_interval_seconds: u64,
    /// > 0: shuffle sharding by hash_key.
    #[serde(default)]
    pub shard_size: u64,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum BalanceSection {
    #[default]
    RoundRobin,
    LeastRequests,
    ConsistentHash,
    Random,
}

fn default_hash_key() -> String {
    "header:x-api-key".into()
}
fn default_retries() -> u64 {
    1
}
fn default_retry_budget_ratio() -> f64 {
    0.2
}
fn default_resolve_interval() -> u64 {
    30
}

fn default_true() -> bool {
    true
}

fn default_hc_interval() -> u64 {
    5
}
fn default_connect_timeout() -> u64 {
    1000
}
fn default_read_timeout() -> u64 {
    30_000
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum PrioritySection {
    Critical,
    #[default]
    Normal,
    Low,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RouteSection {
    #[serde(default)]
    pub host: String,
    #[serde(default = "default_prefix")]
    pub path_prefix: String,
    pub upstream: String,
    #[serde(default)]
    pub priority: PrioritySection,
    /// header -> value, set on the upstream request.
    #[serde(default)]
    pub request_headers_set: BTreeMap<String, String>,
    #[serde(default)]
    pub request_headers_remove: Vec<String>,
    /// header -> value, set on the response to the client.
    #[serde(default)]
    pub response_headers_set: BTreeMap<String, String>,
    #[serde(default)]
    pub response_headers_remove: Vec<String>,
}

fn default_prefix() -> String {
    "/".into()
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SheddingSection {
    pub max_concurrency: u64,
    pub retry_after_seconds: u64,
    /// Open upgraded connections (WebSocket etc.); 503 beyond.
    pub max_tunnels: u64,
    /// Learn the cap from upstream latency (gradient), within
    /// [min_concurrency, max_concurrency].
    pub adaptive: bool,
    pub min_concurrency: u64,
}

impl Default for SheddingSection {
    fn default() -> Self {
        Self {
            max_concurrency: 1024,
            retry_after_seconds: 1,
            max_tunnels: 10_000,
            adaptive: false,
            min_concurrency: 8,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MissingKeySection {
    ClientIp,
    Reject,
    Allow,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitSection {
    pub enabled: bool,
    pub key: String,
    pub window_seconds: u64,
    pub limit: u64,
    pub missing_key: MissingKeySection,
    pub max_key_bytes: usize,
    pub headers: bool,
    /// Cap on keys tracked in memory (and so in Redis per window).
    pub max_tracked_keys: usize,
    /// Name used in the `RateLimit-Policy` / `RateLimit` fields.
    pub policy_name: String,
    pub keys: BTreeMap<String, u64>,
    /// `[[rate_limit.policies]]` (CONTRACT §9).
    pub policies: Vec<RatePolicySection>,
}

/// One `[[rate_limit.policies]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RatePolicySection {
    pub name: String,
    #[serde(default = "default_policy_key")]
    pub key: String,
    #[serde(default = "default_policy_limit")]
    pub limit: u64,
    #[serde(default = "default_policy_window")]
    pub window_seconds: u64,
    #[serde(default = "default_policy_prefix")]
    pub path_prefix: String,
    #[serde(default)]
    pub keys: BTreeMap<String, u64>,
}

fn default_policy_key() -> String {
    "header:x-api-key".into()
}
fn default_policy_limit() -> u64 {
    600
}
fn default_policy_window() -> u64 {
    60
}
fn default_policy_prefix() -> String {
    "/".into()
}

impl Default for RateLimitSection {
    fn default() -> Self {
        Self {
            enabled: true,
            key: "header:x-api-key".into(),
            window_seconds: 60,
            limit: 600,
            missing_key: MissingKeySection::ClientIp,
            max_key_bytes: 256,
            headers: true,
            max_tracked_keys: 100_000,
            policy_name: "default".into(),
            keys: BTreeMap::new(),
            policies: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CullingSection {
    pub enabled: bool,
    pub window_seconds: u64,
    pub error_threshold: u64,
    pub check_interval_seconds: u64,
    pub tokens: u32,
    pub token_period_seconds: u64,
    pub max_culled_fraction: f64,
    pub cooldown_seconds: u64,
    pub dry_run: bool,
    /// Optional URL that receives a POST of `{upstream, backend, reason, errors}` on a cull.
    pub webhook_url: String,
}

impl Default for CullingSection {
    fn default() -> Self {
        Self {
            enabled: true,
            window_seconds: 60,
            error_threshold: 5,
            check_interval_seconds: 10,
            tokens: 10,
            token_period_seconds: 600,
            max_culled_fraction: 0.5,
            cooldown_seconds: 60,
            dry_run: false,
            webhook_url: String::new(),
        }
    }
}

/// `[watchdog]` is read straight into its settings type: the file keys and the
/// typed settings are the same fields, checked by `validate_watchdog`.
pub use super::settings::WatchdogSettings as WatchdogSection;

/// `[access_log]`: one JSON line per request.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AccessLogSection {
    pub enabled: bool,
    /// `""` = stdout; else a file, reopened on SIGUSR1.
    pub path: String,
    /// Share of 1xx-3xx requests logged; every 4xx/5xx is logged.
    pub sample: f64,
    /// Lines queued for the writer thread; beyond, lines are dropped and counted.
    pub queue_lines: usize,
}

impl Default for AccessLogSection {
    fn default() -> Self {
        Self {
            enabled: true,
            path: String::new(),
            sample: 1.0,
            queue_lines: 65_536,
        }
    }
}

/// `[tracing]`: W3C trace context is always propagated; span export is
/// configured here.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TracingSection {
    pub otlp_endpoint: String,
    pub sample: f64,
}

impl Default for TracingSection {
    fn default() -> Self {
        Self {
            otlp_endpoint: String::new(),
            sample: 0.01,
        }
    }
}

/// `[log]`: the format of the process's own log lines on stderr (not the access log).
/// Read at start only.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// `auto` (text when stderr is a terminal, JSON otherwise), `json` or `text`.
    pub format: LogFormat,
}
