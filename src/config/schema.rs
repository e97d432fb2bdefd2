//! The file schema: what `portcullis.toml` may contain, with the defaults of
//! CONTRACT.md section 2. Unknown keys are errors (`deny_unknown_fields`), so a
//! typo can never silently disable a gate.
//!
//! The same types give the JSON Schema of the file (`--print-config-schema`, and
//! `conf/portcullis.schema.json` for editors): `JsonSchema` is derived beside
//! `Deserialize`, reads the same serde attributes (`deny_unknown_fields` becomes
//! `additionalProperties: false`, defaults come from the `Default` impls and the
//! `default = "…"` functions) and takes its descriptions from these doc comments.
//! `Serialize` on the enums is only there so that their defaults can be written.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use super::settings::{LogFormat, RedisUrl, Secret};
use std::collections::BTreeMap;

/// The JSON Schema (draft 2020-12) of [`FileConfig`]. TOML has no null (an absent key is
/// how a file says "none"), so the `null` that schemars allows for an `Option` is taken
/// out: `[tls] = null` cannot be written, and an editor's message about a bad `[tls]`
/// names the section's own rule rather than "none of anyOf".
pub(super) fn json_schema() -> serde_json::Value {
    let mut schema = schemars::generate::SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<FileConfig>()
        .to_value();
    drop_null(&mut schema);
    schema
}

/// `{"anyOf": [S, {"type": "null"}], …}` becomes `{…S, …}`; `"type": [T, "null"]`
/// becomes `"type": T`; everywhere in `v`.
fn drop_null(v: &mut serde_json::Value) {
    use serde_json::Value;
    let is_null = |s: &Value| {
        s.as_object()
            .is_some_and(|o| o.len() == 1 && o.get("type").is_some_and(|t| t == "null"))
    };
    match v {
        Value::Object(map) => {
            if let Some(Value::Array(any)) = map.get("anyOf") {
                if any.len() == 2 && any.iter().any(is_null) {
                    let other = any.iter().find(|s| !is_null(s)).cloned();
                    if let Some(Value::Object(other)) = other {
                        map.remove("anyOf");
                        for (k, val) in other {
                            map.entry(k).or_insert(val);
                        }
                    }
                }
            }
            if let Some(Value::Array(types)) = map.get_mut("type") {
                types.retain(|t| t != "null");
                if types.len() == 1 {
                    let t = types.remove(0);
                    map.insert("type".into(), t);
                }
            }
            map.values_mut().for_each(drop_null);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_null),
        _ => {}
    }
}

/// The configuration file of portcullis, an HTTP edge proxy (load shedding, rate
/// limiting shared through Redis, budgeted upstream culling). Unknown keys are errors;
/// durations are integers in the unit their name gives.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
// `upstreams` has a serde default (its absence is reported by `validate`), yet the file
// needs one: the schema says so.
#[schemars(title = "portcullis configuration", extend("required" = ["upstreams"]))]
pub struct FileConfig {
    /// `[server]`: listeners, threads, drain and shutdown, limits on clients.
    #[serde(default)]
    pub server: ServerSection,
    /// `[redis]`: the store shared by the fleet. Without it the proxy runs as a single
    /// instance with an in-process store (same semantics, no sharing).
    pub redis: Option<RedisSection>,
    /// `[[upstreams]]`: at least one; the backends the proxy forwards to.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub upstreams: Vec<UpstreamSection>,
    /// `[[routes]]`: which upstream serves a request; without routes everything goes to
    /// the first upstream.
    #[serde(default)]
    pub routes: Vec<RouteSection>,
    /// `[shedding]`: the concurrency cap (503 beyond it).
    #[serde(default)]
    pub shedding: SheddingSection,
    /// `[rate_limit]`: per-API-key sliding-window rate limiting (429).
    #[serde(default)]
    pub rate_limit: RateLimitSection,
    /// `[culling]`: ejecting failing backends within a fleet-wide budget.
    #[serde(default)]
    pub culling: CullingSection,
    /// `[budget]`: the safety policy every claim on the disruption budget is checked
    /// against.
    #[serde(default)]
    pub budget: BudgetSection,
    /// `[watchdog]`: the proxy culls itself (memory, errors, stalls) through a
    /// fleet-wide budget.
    #[serde(default)]
    pub watchdog: WatchdogSection,
    /// `[access_log]`: one JSON line per request.
    #[serde(default)]
    pub access_log: AccessLogSection,
    /// `[tracing]`: W3C trace context and OTLP span export.
    #[serde(default)]
    pub tracing: TracingSection,
    /// `[log]`: how the process's own log lines are written.
    #[serde(default)]
    pub log: LogSection,
    /// `[tls]`: TLS listeners; absent = none.
    pub tls: Option<TlsSection>,
    /// `[tenants]`: API keys as identities: a tenants file of key hashes.
    #[serde(default)]
    pub tenants: TenantsSection,
    /// `[tiers.NAME]`: what a tenant of each tier may do.
    #[serde(default)]
    pub tiers: BTreeMap<String, TierSection>,
    /// `[jwt]`: the keys and rules of `key = "jwt:CLAIM"`; absent = none.
    pub jwt: Option<JwtSection>,
    /// `[errors]`: the bodies of the responses the proxy writes itself.
    #[serde(default)]
    pub errors: ErrorsSection,
}

/// `errors.format`.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ErrorFormatSection {
    /// A short plain-text line naming the gate that answered.
    #[default]
    Text,
    /// RFC 9457 problem details (`application/problem+json`): `type`, `title`,
    /// `status`, `detail`, `retry_after` (with `Retry-After`) and `request_id`.
    ProblemJson,
}

/// `[errors]`: the bodies of the responses the proxy writes itself (shed, rate limited,
/// rejected, no backend, upstream errors). Their status and headers (`Retry-After`,
/// the RateLimit fields) stay the same whatever the body.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ErrorsSection {
    /// text | problem_json.
    pub format: ErrorFormatSection,
    /// `"STATUS" = { file = "...", content_type = "text/html" }`: the body of every
    /// answer of that status (400 to 599) the proxy writes, over `format`. Read at start
    /// and on reload, 64 KiB at most; `{status}`, `{retry_after}` (empty without
    /// `Retry-After`) and `{request_id}` are filled in.
    #[schemars(extend("propertyNames" = {"pattern": "^[45][0-9][0-9]$"}))]
    pub pages: BTreeMap<String, ErrorPageSection>,
}

/// One `[errors.pages]` entry.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ErrorPageSection {
    /// The page: a regular file of at most 64 KiB.
    pub file: String,
    /// Its `Content-Type`.
    #[serde(default = "default_page_content_type")]
    pub content_type: String,
}

fn default_page_content_type() -> String {
    "text/html".into()
}

/// What a key that no tenant holds gets.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum UnknownKeySection {
    /// Limited as its own key under `[rate_limit]` (as without tenants).
    #[default]
    Allow,
    /// Limited by the client's address, as a request without a key.
    ClientIp,
    /// Answered 401.
    Reject,
}

/// `[tenants]`.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TenantsSection {
    /// A TOML file of `[[tenant]]` entries (name, tier, keys as `sha256:HEX`); re-read on
    /// reload and when it changes. "" = no tenants.
    pub file: String,
    /// Also read tenants from the store (hash `<key_prefix>:tenants`), in the background.
    pub redis_sync: bool,
    /// allow | client_ip | reject (401): what a key no tenant holds gets.
    pub unknown_key: UnknownKeySection,
    /// Whether a tenants file with no `[[tenant]]` may be applied. false: such a file
    /// (an empty file, or one caught half written) is an error: `--check` fails, and a
    /// reload or a change of the file keeps the tenants the proxy has.
    pub allow_empty: bool,
    /// The largest tenants file read, in bytes (1 KiB to 1 GiB); a larger one is refused
    /// without being read, as any invalid file.
    pub max_file_bytes: u64,
}

impl Default for TenantsSection {
    fn default() -> Self {
        Self {
            file: String::new(),
            redis_sync: false,
            unknown_key: UnknownKeySection::default(),
            allow_empty: false,
            max_file_bytes: super::file_caps::TENANTS,
        }
    }
}

/// `[tiers.NAME]`: the limits of every tenant of the tier (all its keys share them).
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TierSection {
    /// Admitted requests per window of `[rate_limit]`.
    pub limit: u64,
    /// Requests in flight per tenant across the fleet; 0 = no cap; beyond: 429.
    pub concurrency: u64,
    /// critical | normal | low: the shedding class of the tenant's requests; absent: the
    /// route's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<PrioritySection>,
    /// Cost units per `quota_period`; 0 = none; beyond: 429 until the period ends.
    pub quota: u64,
    /// hour | day | month (UTC calendar periods).
    #[schemars(regex(pattern = r"^(hour|day|month)$"))]
    pub quota_period: String,
}

impl Default for TierSection {
    fn default() -> Self {
        Self {
            limit: 600,
            concurrency: 0,
            priority: None,
            quota: 0,
            quota_period: "day".into(),
        }
    }
}

/// `[jwt]`: bearer JWTs verified before a claim of theirs is a rate-limit key
/// (`key = "jwt:CLAIM"`). At least one of `jwks_file` and `hs256_secret_file`; both files
/// are read at load and on reload.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct JwtSection {
    /// A JWKS document (`{"keys": [...]}`) of RSA (2048-4096 bits) and EC P-256 public keys;
    /// `use` unset or `sig`, `alg` unset or the key's (RS256, ES256), `kid`s unique.
    pub jwks_file: String,
    /// The HS256 secret, at least 32 bytes (a trailing newline is removed); at least one of the
    /// two files is required.
    pub hs256_secret_file: String,
    /// The `iss` tokens must carry; empty = not checked.
    pub issuer: String,
    /// The `aud` tokens must carry (or a list holding it); empty = not checked.
    pub audience: String,
}

/// `[tls]`: TLS listeners (HTTP/1.1 and HTTP/2 by ALPN).
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
#[schemars(extend("required" = ["certificates"]))]
pub struct TlsSection {
    /// TLS listeners; ALPN offers `h2` and `http/1.1`.
    #[serde(default = "default_tls_listen")]
    pub listen: Vec<String>,
    /// Lowest TLS version accepted: "1.2" or "1.3".
    #[serde(default = "default_tls_min_version")]
    #[schemars(extend("enum" = ["1.2", "1.3"]))]
    pub min_version: String,
    /// At least one. PEM certificate (chain, leaf first) and key. The certificate for a
    /// handshake is chosen by SNI against each certificate's SAN DNS names: an exact name
    /// first, then a wildcard (`*.example.com`, one label), else the first certificate. Each
    /// must be a regular file (a symbolic link to one is fine): a FIFO, device or directory is
    /// refused at once, naming it, by `--check` and by a reload; reloads read files off the
    /// admin listener's thread.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub certificates: Vec<CertificateSection>,
}

fn default_tls_listen() -> Vec<String> {
    vec!["0.0.0.0:8443".into()]
}
fn default_tls_min_version() -> String {
    "1.2".into()
}

/// One `[[tls.certificates]]` entry: PEM certificate (chain) and key files.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CertificateSection {
    /// PEM file: the certificate, then its chain.
    pub cert: String,
    /// PEM file: the private key.
    pub key: String,
}

/// `[server]`.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// Proxy listeners (HTTP/1.1).
    pub listen: Vec<String>,
    /// Admin endpoints: /healthz /readyz /metrics /status /reload.
    pub admin_listen: String,
    /// Worker threads: each accepts on every listener and serves the connections it accepts (a
    /// connection moves only to a thread that serves notably fewer), as HAProxy's threads do.
    #[schemars(range(min = 1, max = 1024))]
    pub threads: usize,
    /// After SIGTERM readiness fails at once, traffic is still served this long.
    #[schemars(range(min = 0, max = 3600))]
    pub drain_seconds: u64,
    /// Then listeners close; in-flight requests get at most this long.
    #[schemars(range(min = 0, max = 3600))]
    pub shutdown_timeout_seconds: u64,
    /// Unix socket used to hand listeners to an upgrading process (`-u`). `""`: one per
    /// config file, `/tmp/portcullis-<hash of the file's absolute path>.sock`, so that
    /// two instances on one host never share it (the Debian package sets
    /// `/run/portcullis/upgrade.sock`).
    pub upgrade_sock: String,
    /// Largest request header block accepted (request line + headers); larger requests get 431.
    /// Pingora itself caps headers at 1 MiB (answered 400).
    #[schemars(range(min = 1024, max = 1048575))]
    pub max_request_header_bytes: usize,
    /// Idle keep-alive timeout for client connections.
    #[schemars(range(min = 0, max = 3600))]
    pub keepalive_timeout_seconds: u64,
    /// When set, `POST` admin endpoints need `Authorization: Bearer <token>` (401 otherwise).
    /// Without it they are answered only on a loopback `admin_listen` (403 elsewhere). Allowed:
    /// Visible ASCII, ≤ 1024.
    #[schemars(extend("default" = ""))]
    pub admin_token: Secret,
    /// Named tokens (`admin_tokens = { deployer = "…" }`): any of them opens the non-`GET`
    /// admin endpoints, and the runtime API journals an action `by` the token's name
    /// (`admin_token` is named `admin`). Allowed: Names: letters, digits, `_-.`, ≤ 64; tokens
    /// as `admin_token`, each once.
    #[schemars(extend("default" = {}))]
    pub admin_tokens: std::collections::BTreeMap<String, Secret>,
    /// The admin token read from this file (a trailing newline is removed; symbolic links are
    /// followed, as Kubernetes mounts secrets); when set it wins over `admin_token`. Read at
    /// start, `--check` and reload; a missing, unreadable or empty file is a config error
    /// naming `server.admin_token_file`. Allowed: A regular file.
    pub admin_token_file: String,
    /// Also accept cleartext HTTP/2 with prior knowledge on `listen` (HTTP/1.1 still works
    /// there).
    pub h2c: bool,
    /// `false` writes HTTP/1 header names in canonical case, as HAProxy and Envoy do by
    /// default: a dozen common names in title case (`Host`, `Content-Type`, `Content-Length`,
    /// `Connection`, `Date`, `Server`, `Set-Cookie`, ...), all others in lower case
    /// (`x-api-key`). `true` passes names on in the case they arrived in, both ways (Pingora's
    /// behaviour), for a client or backend that wrongly compares names by case (HAProxy's
    /// `h1-case-adjust`, Envoy's `preserve_case`). Names are case-insensitive (RFC 9110 §5.1);
    /// `true` costs a second header map per request and response (+11% instructions, +8
    /// allocations per proxied request: benches/history/2026-11-passes.md, issue 16). HTTP/2
    /// names are lower case either way. Restart to change.
    pub preserve_header_case: bool,
    /// CIDRs (or addresses) of the proxies allowed to say who the client is. Allowed: CIDRs or
    /// addresses, v4/v6.
    pub trusted_proxies: Vec<String>,
    /// Plain (`listen`) listeners expect a PROXY v1/v2 header from trusted peers; other peers
    /// are refused. It names the client for every request of the connection, HTTP/1.1 and h2c
    /// streams alike. `[tls]` listeners take no PROXY header (the TLS handshake comes first):
    /// their client is the TCP peer. With `proxy_protocol`, `X-Forwarded-For` never names the
    /// client, and a `LOCAL`/`UNKNOWN` header makes the peer the client. Needs
    /// `trusted_proxies`.
    pub proxy_protocol: bool,
    /// Larger bodies get 413; nothing more is forwarded.
    #[schemars(range(min = 1, max = 1_099_511_627_776u64))]
    pub max_request_body_bytes: u64,
    /// The whole request header block must arrive within this, else 408 (slowloris). It runs
    /// from `accept` (after the TLS handshake) on every listener, h2c and admin included; over
    /// HTTP/2 the first request's header block must arrive within it, and any later header
    /// block within it of its first frame (else the connection is closed).
    #[schemars(range(min = 1, max = 3600000))]
    pub client_header_timeout_ms: u64,
    /// Longest pause between body reads, else 408, HTTP/1.1 and HTTP/2 streams alike
    /// (`RST_STREAM` once the response has started); the client's fault: outcome `rejected`,
    /// never a backend error or a culling input.
    #[schemars(range(min = 1, max = 3600000))]
    pub client_body_timeout_ms: u64,
    /// Client connections open at once, counted from `accept` (a TLS handshake in progress
    /// counts); beyond, new ones are closed at once.
    #[schemars(range(min = 1, max = 10000000))]
    pub max_connections: usize,
    /// Response body bytes one request may hold in the proxy: past it, reading the upstream
    /// waits for the client (backpressure), so N slow readers of a large object hold about N ×
    /// this of it (HAProxy's `tune.bufsize` plays the same part). Restart to change.
    #[schemars(range(min = 4096, max = 1073741824))]
    pub max_response_buffer_bytes: usize,
    // Issue 40, connections (CONTRACT §17).
    /// A keep-alive connection with nothing in flight is closed after this: HTTP/1.1 waits the
    /// shorter of this and `keepalive_timeout_seconds` for the next request; HTTP/2 gets GOAWAY
    /// `NO_ERROR` (read at start for HTTP/2: restart to change).
    #[schemars(range(min = 1, max = 3600000))]
    pub idle_timeout_ms: u64,
    /// A TLS handshake must complete within this, else the connection is closed; failed
    /// handshakes are logged once per 10 s with their count, not once each.
    #[schemars(range(min = 1, max = 3600000))]
    pub tls_handshake_timeout_ms: u64,
    /// Connections to `admin_listen` open at once; beyond, four more are let in for `/healthz`
    /// and `/readyz` only, and past those new ones are closed at once. The admin listener
    /// applies `client_header_timeout_ms` too, and `client_body_timeout_ms` to a whole request
    /// body.
    #[schemars(range(min = 1, max = 1000000))]
    pub admin_max_connections: usize,
    /// Host names the admin listener answers to, besides any IP address and `localhost` (a
    /// request naming another host is refused with 421: a DNS-rebinding page names its own);
    /// `"*"` answers to any. `/healthz` and `/readyz` answer to any host. Allowed: Host names,
    /// or `["*"]`.
    pub admin_hosts: Vec<String>,
    /// An upgraded tunnel (WebSocket) is closed once no byte has gone either way for this long,
    /// timed from the upgrade request; a side that is quiet while the other talks keeps the
    /// tunnel open. Until the backend's `101`, its upstream's `read_timeout_ms` applies as to
    /// any request (a backend that never answers an upgrade: 504); after it, neither
    /// `read_timeout_ms` nor `client_body_timeout_ms` applies to the tunnel (HAProxy's `timeout
    /// server`, then `timeout tunnel`).
    #[schemars(range(min = 1, max = 604800))]
    pub tunnel_idle_timeout_seconds: u64,
    /// Per HTTP/2 connection per minute: streams the client resets after they were accepted
    /// (before their response is complete), and streams refused as malformed; past it the
    /// connection gets GOAWAY `ENHANCE_YOUR_CALM` and is closed (counted in
    /// `portcullis_edge_refusals_total{reason="h2_glitches"}`), as HAProxy 3.x does with
    /// `tune.h2.fe.glitches-threshold`. The `h2` crate's own count of streams it resets for the
    /// client's protocol errors gets the same limit, over the connection's life. Read at start.
    #[schemars(range(min = 1, max = 1000000))]
    pub h2_max_glitches: u32,
    /// A request no route matches: first_upstream | 404 | 421.
    pub unmatched: UnmatchedSection,
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            listen: vec!["127.0.0.1:8080".into()],
            admin_listen: "127.0.0.1:9090".into(),
            threads: 2,
            drain_seconds: 5,
            shutdown_timeout_seconds: 30,
            upgrade_sock: String::new(),
            max_request_header_bytes: 64 * 1024,
            keepalive_timeout_seconds: 60,
            admin_token: Secret::default(),
            admin_tokens: std::collections::BTreeMap::new(),
            admin_token_file: String::new(),
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
            admin_hosts: Vec::new(),
            tunnel_idle_timeout_seconds: 300,
            h2_max_glitches: 100,
            unmatched: UnmatchedSection::FirstUpstream,
        }
    }
}

/// `[redis]`.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RedisSection {
    /// Standalone (one `url`) | cluster (seed `nodes`) | sentinel (`sentinels` and
    /// `master_name`). Allowed: `standalone` | `cluster` | `sentinel`.
    #[schemars(extend("enum" = ["standalone", "cluster", "sentinel"]))]
    pub mode: String,
    /// Standalone only; absent = `redis://127.0.0.1:6379` (so a `url` written next to `mode =
    /// "cluster"` can be refused). `rediss://` for TLS; it may carry a password.
    pub url: Option<RedisUrl>,
    /// Cluster: seed nodes `"host:port"` (at least one; the topology is learned from them).
    pub nodes: Vec<String>,
    /// Sentinel: `"host:port"` of the sentinels (at least one).
    pub sentinels: Vec<String>,
    /// Sentinel: the name of the monitored master.
    pub master_name: String,
    /// AUTH password of cluster/sentinel data nodes (standalone: in the `url`); never logged.
    #[schemars(extend("default" = ""))]
    pub password: Secret,
    /// The AUTH password read from this file (a trailing newline is removed), in every mode;
    /// when set it wins over `password` and over a password in `url`. Read at start, `--check`
    /// and reload; a missing, unreadable or empty file is a config error naming
    /// `redis.password_file`; never logged. Allowed: A regular file.
    pub password_file: String,
    /// Cluster/sentinel: TLS to every node, and to the sentinels (standalone: `rediss://`).
    pub tls: bool,
    /// PEM CA bundle the server certificates must chain to (`""` = the system's roots); needs
    /// `rediss://` or `tls = true`. The Redis client's TLS (rustls) refuses a server
    /// certificate that is itself a CA (`CA:TRUE`, what `openssl req -x509` makes by default)
    /// even where redis-cli accepts it: give the server a certificate with `-addext
    /// basicConstraints=critical,CA:FALSE`, or one signed by a separate CA (the log says so
    /// when it happens).
    pub ca_file: String,
    /// Every key the proxy writes starts with this, and every key has a TTL.
    pub key_prefix: String,
    /// How often local counts are flushed to Redis in one batch.
    #[schemars(range(min = 1, max = 60000))]
    pub flush_interval_ms: u64,
    /// A Redis call slower than this counts as a failure.
    #[schemars(range(min = 1, max = 60000))]
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
            password_file: String::new(),
            tls: false,
            ca_file: String::new(),
            key_prefix: "portcullis".into(),
            flush_interval_ms: 50,
            timeout_ms: 200,
        }
    }
}

/// One `[[upstreams]]` entry.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSection {
    /// Unique; routes name it.
    pub name: String,
    /// Failure domains (zones, racks) for the `[budget]` policies: `{ zone-a =
    /// ["10.0.0.5:8080"], zone-b = [...] }`; every backend is also in its upstream's group and
    /// the global one. Allowed: Names: letters, digits, `_-.`, not `global`; members among
    /// `backends`, as written.
    #[serde(default)]
    pub groups: std::collections::BTreeMap<String, Vec<String>>,
    /// Each backend: `"host:port"` (a host name is re-resolved every
    /// `resolve_interval_seconds`), or a table `{ name, address, weight, max_conn, backup }`.
    #[schemars(length(min = 1))]
    pub backends: Vec<BackendEntrySection>,
    /// `""` = no active check; else `GET path`, 2xx = healthy, one result flips the backend
    /// (the short form of `[upstreams.health_check]`, which replaces it; both at once is an
    /// error).
    #[serde(default)]
    pub health_check_path: String,
    /// Time between two active checks of a backend (with `health_check_path`).
    #[serde(default = "default_hc_interval")]
    #[schemars(range(min = 1, max = 86400))]
    pub health_check_interval_seconds: u64,
    /// Active health checks as HAProxy's `option httpchk`, `http-check` and `inter`,
    /// `fastinter`, `rise`, `fall`, `port`.
    #[serde(default)]
    pub health_check: Option<HealthCheckSection>,
    /// Connecting to a backend must take no longer; a failed or timed-out connect is retried on
    /// another backend.
    #[serde(default = "default_connect_timeout")]
    #[schemars(range(min = 1, max = 600000))]
    pub connect_timeout_ms: u64,
    /// Longest wait for the backend's response (between reads).
    #[serde(default = "default_read_timeout")]
    #[schemars(range(min = 1, max = 86400000))]
    pub read_timeout_ms: u64,
    /// Connect to the backends over TLS.
    #[serde(default)]
    pub tls: bool,
    /// SNI and verified name; `""` = the backend's address.
    #[serde(default)]
    pub sni: String,
    /// Verify the backend certificate chain and name; a failure is a connect failure (retried
    /// elsewhere, counted for culling), and the connection is never used.
    #[serde(default = "default_true")]
    pub verify: bool,
    /// PEM bundle to trust (with OpenSSL under Pingora it replaces the system store for this
    /// upstream).
    #[serde(default)]
    pub ca_file: String,
    /// HTTP/2 to the backends: ALPN `h2` over TLS, prior knowledge (h2c) without.
    #[serde(default)]
    pub http2: bool,
    /// `round_robin` (smooth weighted with `weights`) | `least_requests` (less loaded of two
    /// random backends) | `consistent_hash` (Ketama ring on `hash_key`: a backend leaving moves
    /// only its keys) | `random`.
    #[serde(default)]
    pub balance: BalanceSection,
    /// For `consistent_hash` and `shard_size`: `header:NAME` | `query:NAME` | `bearer` |
    /// `client_ip` | `path`; a request without it hashes by client address.
    #[serde(default = "default_hash_key")]
    #[schemars(regex(pattern = r"^(header:.+|query:.+|bearer|client_ip|path)$"))]
    pub hash_key: String,
    /// One positive integer per backend; empty = all equal. Allowed: 1–1000 each.
    #[serde(default)]
    pub weights: Vec<u64>,
    /// Retries on another backend after a 502/503 or a reset, only for GET, HEAD, OPTIONS, PUT,
    /// DELETE whose body was read whole. A failed connect is always retried on an untried
    /// backend (nothing was sent), whatever the method, `retries` or the budget — unlike Envoy,
    /// where a connect failure is a retry like any other. Such a retry is still accounted: it
    /// counts in the budget's window and as `result="sent"`, as an error against the backend
    /// for culling, and the request keeps its one shedding/bulkhead slot; at most one attempt
    /// per backend.
    #[serde(default = "default_retries")]
    #[schemars(range(min = 0, max = 10))]
    pub retries: u64,
    /// A retry budget, so that retries cannot multiply an overload: 502/503/reset retries stay
    /// under this share of the upstream's requests of the last 10 s (at least 3 allowed);
    /// `portcullis_retries_total{upstream,result=sent|budget_exhausted}`.
    #[serde(default = "default_retry_budget_ratio")]
    #[schemars(range(min = 0, max = 1))]
    pub retry_budget_ratio: f64,
    /// Bulkhead: requests in flight to this upstream; beyond it 503 + `Retry-After`, counted as
    /// shed and in `portcullis_bulkhead_shed_total{upstream}`; `0` = none.
    #[serde(default)]
    #[schemars(range(min = 0, max = 10000000))]
    pub max_inflight: u64,
    /// This upstream learns its own cap from its own latency (the `[shedding] adaptive`
    /// gradient), between min(8, `max_inflight`) and `max_inflight` (which must be > 0);
    /// reported as `portcullis_concurrency_limit{upstream}`: a slow upstream sheds its own
    /// traffic, not the others'.
    #[serde(default)]
    pub adaptive: bool,
    /// Backends given as hostnames are re-resolved this often (IPv4 addresses if any, else
    /// IPv6, all of them); a change is applied like a reload.
    #[serde(default = "default_resolve_interval")]
    #[schemars(range(min = 1, max = 86400))]
    pub resolve_interval_seconds: u64,
    /// Above 0, each `hash_key` value is served only by its own stable set of this many
    /// backends (shuffle sharding); 0 = off. Allowed: 0 to the number of backends.
    #[serde(default)]
    pub shard_size: u64,
    /// A backend that comes back (health up, readmitted after a cull, drain or maint
    /// released, a new address) ramps from 10% of its weight and `max_conn` to all of it
    /// over this time (HAProxy's `slowstart`); 0 = at once. With a Redis store every
    /// instance ramps it from the one start the store records.
    #[schemars(range(min = 0, max = 3600))]
    #[serde(default)]
    pub slow_start_seconds: u64,
    /// Above 0: when no eligible backend has room (`max_conn`) or the upstream is at
    /// `max_inflight`, a request waits up to this long (HAProxy's `timeout queue`), then
    /// 503 + `Retry-After`.
    #[schemars(range(min = 0, max = 3600000))]
    #[serde(default)]
    pub queue_timeout_ms: u64,
    /// Requests waiting for this upstream at most; 0 = 10 × the sum of `max_conn` (or of
    /// `max_inflight`), at least 1024 when neither is set.
    #[schemars(range(min = 0, max = 1000000))]
    #[serde(default)]
    pub max_queue: u64,
    /// Above 0: `max_inflight` for the whole fleet, split as `[shedding]
    /// fleet_max_concurrency` is.
    #[schemars(range(min = 0, max = 100000000))]
    #[serde(default)]
    pub fleet_max_inflight: u64,
}

/// How an upstream picks a backend.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum BalanceSection {
    /// Each backend in turn (by weight).
    #[default]
    RoundRobin,
    /// The backend with the fewest requests in flight (of two picked at random).
    LeastRequests,
    /// The same `hash_key` goes to the same backend while it is up.
    ConsistentHash,
    /// A backend at random (by weight).
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

/// The load-shedding class of a route's requests: normal requests are shed at 90% of
/// the cap, low at 75%, critical only at 100%.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum PrioritySection {
    /// Shed only at 100% of the cap.
    Critical,
    /// Shed at 90% of the cap.
    #[default]
    Normal,
    /// Shed at 75% of the cap.
    Low,
}

/// One `[[routes]]` entry.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
#[schemars(extend(
    "if" = {"properties": {"action": {"enum": ["deny", "redirect"]}}, "required": ["action"]},
    "else" = {"required": ["upstream"]}
))]
pub struct RouteSection {
    /// `""` = any host; else matched case-insensitively, port ignored. HAProxy: `acl h
    /// hdr(host) -i NAME`.
    #[serde(default)]
    pub host: String,
    /// Longest matching prefix wins; on a tie a host route beats an any-host route. HAProxy:
    /// `acl p path_beg /x`.
    #[serde(default = "default_prefix")]
    pub path_prefix: String,
    /// The `name` of an upstream (needed by `action = "proxy"` only). HAProxy: `use_backend
    /// NAME`.
    #[serde(default)]
    pub upstream: String,
    /// Critical | normal | low (load-shedding classes).
    #[serde(default)]
    pub priority: PrioritySection,
    /// Match only these methods (upper case: `GET`, `DELETE`); `[]` = any. HAProxy: `acl m
    /// method DELETE`.
    #[serde(default)]
    pub methods: Vec<String>,
    /// Match only clients in these CIDRs (or addresses): the client address after
    /// `trusted_proxies` and PROXY; [] = any. HAProxy: `acl s src 10.0.0.0/8`.
    #[serde(default)]
    pub client_cidrs: Vec<String>,
    /// Proxy (to `upstream`) | deny (answer `status`) | redirect (to `location`). HAProxy:
    /// `use_backend` / `http-request deny` / `http-request redirect`.
    #[serde(default)]
    pub action: ActionSection,
    /// Deny: the status (403 if 0); redirect: 301 | 302 | 303 | 307 | 308 (302 if 0). HAProxy:
    /// `deny_status` / `code`.
    #[serde(default)]
    pub status: u16,
    /// Redirect: an absolute URL or a path, with `{scheme}`, `{host}`, `{path}`, `{query}` and
    /// `{path_and_query}` filled in from the request. HAProxy: `redirect location` / `redirect
    /// scheme https`.
    #[serde(default)]
    pub location: String,
    /// `{ set = {NAME = VALUE}, add = {NAME = VALUE}, remove = [NAME] }` on the upstream
    /// request, after the proxy's own fields. HAProxy: `http-request set-header / add-header /
    /// del-header`.
    #[serde(default)]
    pub request_headers: HeaderRulesSection,
    /// Header rules on the response to the client, after the proxy's own headers. HAProxy:
    /// `http-response set-header / add-header / del-header`.
    #[serde(default)]
    pub response_headers: HeaderRulesSection,
    /// Names of `[[rate_limit.policies]]` (or the `[rate_limit]` policy's name) that apply on
    /// this route; [] = all. HAProxy: a `track-sc0` under an ACL.
    #[serde(default)]
    pub rate_limit_policies: Vec<String>,
    /// Header → value, set on the upstream request (older form of `request_headers.set`).
    #[serde(default)]
    pub request_headers_set: BTreeMap<String, String>,
    /// Headers removed from the upstream request.
    #[serde(default)]
    pub request_headers_remove: Vec<String>,
    /// Header -> value, set on the response to the client.
    #[serde(default)]
    pub response_headers_set: BTreeMap<String, String>,
    /// Headers removed from the response to the client.
    #[serde(default)]
    pub response_headers_remove: Vec<String>,
}

/// What a route does with the requests it matches.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum ActionSection {
    /// Forward to the route's upstream.
    #[default]
    Proxy,
    /// Answer `status` (403) without reaching a backend.
    Deny,
    /// Answer a redirect to `location` without reaching a backend.
    Redirect,
}

/// `set` (replace), `add` (append) and `remove` of header fields.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HeaderRulesSection {
    /// header -> value, replacing every value the field had.
    pub set: BTreeMap<String, String>,
    /// header -> value, appended to the values the field has.
    pub add: BTreeMap<String, String>,
    /// Fields removed.
    pub remove: Vec<String>,
}

/// `[server] unmatched`: the answer to a request no route matches.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Default)]
pub enum UnmatchedSection {
    /// Forward to the first upstream.
    #[default]
    #[serde(rename = "first_upstream")]
    FirstUpstream,
    /// Answer 404.
    #[serde(rename = "404")]
    NotFound,
    /// Answer 421 (Misdirected Request).
    #[serde(rename = "421")]
    Misdirected,
}

fn default_prefix() -> String {
    "/".into()
}

/// `[shedding]`.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SheddingSection {
    /// Requests in flight through the proxy; 0 = no cap. Normal requests are shed at 90% of it,
    /// low at 75%, critical only at 100%.
    #[schemars(range(min = 0, max = 10000000))]
    pub max_concurrency: u64,
    /// `Retry-After` of a shed 503: the base of a spread by the share of load shed (see Gray
    /// failure).
    #[schemars(range(min = 1, max = 86400))]
    pub retry_after_seconds: u64,
    /// Open upgraded connections (WebSocket etc.); beyond: 503 with `Retry-After`; `0` = no
    /// cap. After the `101` a tunnel no longer counts against `max_concurrency`; open tunnels
    /// are `portcullis_tunnels_open`; at shutdown they are closed at
    /// `shutdown_timeout_seconds`.
    #[schemars(range(min = 0, max = 10000000))]
    pub max_tunnels: u64,
    /// Learn the cap from upstream latency (a gradient limit: shrinks when latency rises over
    /// its recent minimum, grows back when it recovers); never below `min_concurrency` nor
    /// above `max_concurrency` (which must be > 0).
    pub adaptive: bool,
    /// The adaptive cap's floor. Allowed: 1–`max_concurrency`.
    pub min_concurrency: u64,
    /// Shadow mode: decide and report, never shed. A request the cap (fixed or adaptive, with
    /// its class's share) would shed is admitted, counted in
    /// `portcullis_shadow_refusals_total{gate="shed",policy=CLASS}` (`critical`, `normal`,
    /// `low`) and its access-log line gets `"shadow":["shed:CLASS"]`. It then holds an
    /// in-flight slot like any admitted request, so in flight may pass the cap. `max_tunnels`
    /// and an upstream's `max_inflight` still refuse.
    pub shadow: bool,
    /// Above 0: a request over its class's share of the cap waits up to this long for a slot
    /// (HAProxy's `timeout queue`), then 503 + `Retry-After`. Slots go by class
    /// (critical, normal, low), then the tenant tier's priority, then age.
    #[schemars(range(min = 0, max = 3600000))]
    pub queue_timeout_ms: u64,
    /// Requests waiting at most (all classes); beyond, 503 at once.
    #[schemars(range(min = 1, max = 1000000))]
    pub max_queue: u64,
    /// Above 0: when the shortest wait in the queue stays above this for 100 ms, the queue
    /// serves newest first and sheds what waited longest (CoDel with adaptive LIFO), until
    /// it drains.
    #[schemars(range(min = 0, max = 60000))]
    pub queue_target_ms: u64,
    /// Above 0: the cap is for the whole fleet; each instance takes this times its share of
    /// the fleet's recent traffic (through the store), at least `min_concurrency`. Without
    /// the store, `max_concurrency` on each instance. 0 = `max_concurrency` per instance.
    #[schemars(range(min = 0, max = 100000000))]
    pub fleet_max_concurrency: u64,
}

impl Default for SheddingSection {
    fn default() -> Self {
        Self {
            max_concurrency: 1024,
            retry_after_seconds: 1,
            max_tunnels: 10_000,
            adaptive: false,
            min_concurrency: 8,
            shadow: false,
            queue_timeout_ms: 0,
            max_queue: 1024,
            queue_target_ms: 0,
            fleet_max_concurrency: 0,
        }
    }
}

/// What a request without an API key gets.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MissingKeySection {
    /// Limited by its client address.
    ClientIp,
    /// Answered 401.
    Reject,
    /// Admitted without a limit.
    Allow,
}

/// `[rate_limit]`.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitSection {
    /// False: no request is rate limited.
    pub enabled: bool,
    /// Where the API key is read: header:NAME | query:NAME | bearer (Authorization: Bearer …) |
    /// jwt:CLAIM (a claim of a bearer JWT verified with `[jwt]`'s keys).
    #[schemars(regex(pattern = r"^(header:.+|query:.+|bearer|jwt:.+)$"))]
    pub key: String,
    /// The sliding window.
    #[schemars(range(min = 1, max = 86400))]
    pub window_seconds: u64,
    /// Admitted requests per key per sliding window.
    #[schemars(range(min = 1, max = 1_000_000_000_000u64))]
    pub limit: u64,
    /// `client_ip` (limit by address) | `reject` (401) | `allow`.
    pub missing_key: MissingKeySection,
    /// Longer keys are answered 400 and never stored.
    #[schemars(range(min = 1, max = 8192))]
    pub max_key_bytes: usize,
    /// RateLimit headers on admitted responses too.
    pub headers: bool,
    /// Cap on keys tracked in memory (and so in Redis per window).
    #[schemars(range(min = 16, max = 100_000_000))]
    pub max_tracked_keys: usize,
    /// Name used in the `RateLimit-Policy` / `RateLimit` fields.
    pub policy_name: String,
    /// Per-key limits that override `limit`: key -> requests per window.
    pub keys: BTreeMap<String, u64>,
    /// `[[rate_limit.policies]]`: further limits, each on the requests under a path.
    pub policies: Vec<RatePolicySection>,
    /// Shadow mode: decide and report, never refuse. A request this policy would refuse is
    /// admitted and counted in `portcullis_shadow_refusals_total{gate="rate_limit"}`. Also the
    /// default of every `[[rate_limit.policies]]` entry's `shadow`.
    pub shadow: bool,
    /// A response header whose integer value is the request's cost against its tenant's
    /// quota (absent or invalid = 1); removed before the client sees the response.
    pub cost_header: String,
}

/// One `[[rate_limit.policies]]` entry: a further limit on the requests under a path.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RatePolicySection {
    /// Unique; the name in the `RateLimit-Policy` / `RateLimit` fields.
    pub name: String,
    /// `header:NAME` | `query:NAME` | `bearer` | `jwt:CLAIM` | `client_ip`.
    #[serde(default = "default_policy_key")]
    #[schemars(regex(pattern = r"^(header:.+|query:.+|bearer|jwt:.+|client_ip)$"))]
    pub key: String,
    /// Admitted requests per key per sliding window.
    #[serde(default = "default_policy_limit")]
    #[schemars(range(min = 1, max = 1_000_000_000_000u64))]
    pub limit: u64,
    /// The sliding window.
    #[serde(default = "default_policy_window")]
    #[schemars(range(min = 1, max = 86400))]
    pub window_seconds: u64,
    /// Requests whose path starts with this are checked against the policy. Allowed: Starts
    /// with `/`.
    #[serde(default = "default_policy_prefix")]
    pub path_prefix: String,
    /// Per-key limits that override `limit`.
    #[serde(default)]
    pub keys: BTreeMap<String, u64>,
    /// Shadow mode for this policy (decide and report, never refuse); absent: as `[rate_limit]
    /// shadow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<bool>,
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
            shadow: false,
            cost_header: String::new(),
        }
    }
}

/// `[culling]`. An error is a 5xx response from the backend, a failed connect or a
/// One entry of `backends`: an address as written, or a table.
#[derive(Debug, Clone, JsonSchema, PartialEq)]
#[serde(untagged)]
pub enum BackendEntrySection {
    /// `host:port`.
    Address(String),
    Table(BackendTableSection),
}

impl BackendEntrySection {
    /// The address as written.
    pub fn address(&self) -> &str {
        match self {
            Self::Address(a) => a,
            Self::Table(t) => &t.address,
        }
    }
}

impl<'de> Deserialize<'de> for BackendEntrySection {
    /// A string or a table, with the table's own errors (an unknown or mistyped key is
    /// named), not serde's "did not match any variant".
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entry;
        impl<'de> serde::de::Visitor<'de> for Entry {
            type Value = BackendEntrySection;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a backend: \"host:port\", or a table { name, address, weight, max_conn, backup }",
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(BackendEntrySection::Address(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                m: A,
            ) -> Result<Self::Value, A::Error> {
                BackendTableSection::deserialize(serde::de::value::MapAccessDeserializer::new(m))
                    .map(BackendEntrySection::Table)
            }
        }
        d.deserialize_any(Entry)
    }
}

/// A backend as a table (HAProxy's `server NAME ADDRESS weight N maxconn N backup`).
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BackendTableSection {
    /// What `/backends`, `/status`, the page, the access log's `backend` and `portcullis ctl`
    /// show; `ctl` and the runtime API take the name or the address (`ctl drain api api-2`),
    /// and so do `groups`. Metric labels keep the address. Allowed: 1–64 letters, digits,
    /// `_-.:`; unique in the upstream.
    #[serde(default)]
    pub name: String,
    /// `host:port`. Allowed: As a plain entry.
    pub address: String,
    /// As in `weights` (1-1000); not with `weights`.
    #[serde(default)]
    #[schemars(range(min = 1, max = 1000))]
    pub weight: Option<u64>,
    /// Requests in flight to this backend at most: at that many it is not selected (0 = no
    /// limit). Without a queue, a request no backend has room for is answered 503 with
    /// `Retry-After` (outcome `no_backend`).
    #[serde(default)]
    #[schemars(range(min = 0, max = 10000000))]
    pub max_conn: u64,
    /// Used only when no other backend of the upstream can be (out, down, or at `max_conn`),
    /// and left again as soon as one can; at least one backend is not a backup.
    #[serde(default)]
    pub backup: bool,
}

/// `[upstreams.health_check]`.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HealthCheckSection {
    /// The probe's path; "" = no active check.
    pub path: String,
    /// GET | HEAD | OPTIONS.
    #[schemars(extend("enum" = ["GET", "HEAD", "OPTIONS"]))]
    pub method: String,
    /// The probe's Host header; "" = the upstream's `sni`, else the backend as written.
    pub host: String,
    /// More request headers, e.g. { "user-agent" = "probe" }. Allowed: Not `Host` (use `host`)
    /// nor a framing header (`Content-Length`, `Transfer-Encoding`, `Connection`, ...).
    pub headers: std::collections::BTreeMap<String, String>,
    /// Status codes and ranges that pass: "200,204,300-399".
    pub expect_status: String,
    /// A substring the first 64 KiB of the body must contain; "" = any body.
    pub expect_body: String,
    /// Time between two probes of a settled backend.
    #[schemars(range(min = 100, max = 86400000))]
    pub interval_ms: u64,
    /// Time between two probes while a backend is between states, or down.
    #[schemars(range(min = 100, max = 86400000))]
    pub fast_interval_ms: u64,
    /// A probe (connect, request, answer and `expect_body`'s read) must end within this.
    #[schemars(range(min = 1, max = 600000))]
    pub timeout_ms: u64,
    /// Consecutive passes that make a backend healthy.
    #[schemars(range(min = 1, max = 1000))]
    pub rise: u32,
    /// Consecutive failures that make it unhealthy.
    #[schemars(range(min = 1, max = 1000))]
    pub fall: u32,
    /// Probe this port instead of the backend's; 0 = the backend's.
    pub port: u16,
    /// With the store (`[redis]`), each backend is probed by `probers` instances of the
    /// fleet (chosen by rendezvous hashing over the live instances) and every instance
    /// follows the majority of their verdicts; without it, every instance probes.
    pub shared: bool,
    /// How many instances probe each backend when `shared`. Allowed: 1–64 (used with `shared =
    /// true`).
    pub probers: u32,
}

impl Default for HealthCheckSection {
    fn default() -> Self {
        Self {
            path: "/health".into(),
            method: "GET".into(),
            host: String::new(),
            headers: std::collections::BTreeMap::new(),
            expect_status: "200-399".into(),
            expect_body: String::new(),
            interval_ms: 5000,
            fast_interval_ms: 1000,
            timeout_ms: 2000,
            rise: 2,
            fall: 3,
            port: 0,
            shared: false,
            probers: 3,
        }
    }
}

/// `[budget]`: the disruption-budget article's limit and health policies, checked for
/// every claim (`POST /claims`).
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetSection {
    /// Operations out at once, fleet-wide, over all upstreams (culls, drains, maint, weight 0,
    /// claims); 0 = no limit.
    #[schemars(range(min = 0, max = 1000000))]
    pub max_concurrent: u64,
    /// A new operation in a group waits this long after the group's last claim started.
    #[schemars(range(min = 0, max = 604800))]
    pub min_seconds_between_claims: u64,
    /// And this long after the group's last claim ended.
    #[schemars(range(min = 0, max = 604800))]
    pub min_seconds_after_release: u64,
    /// An operation in one named group (say a zone) refuses claims in any other.
    pub one_group_at_a_time: bool,
    /// Health policy: no voluntary operation on an upstream another of whose backends is
    /// failing while kept in rotation (`failing` in `/status`) or down by its health check.
    pub refuse_when_failing: bool,
}

impl Default for BudgetSection {
    fn default() -> Self {
        Self {
            max_concurrent: 0,
            min_seconds_between_claims: 0,
            min_seconds_after_release: 0,
            one_group_at_a_time: false,
            refuse_when_failing: true,
        }
    }
}

/// timeout.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CullingSection {
    /// False: no backend is ever ejected.
    pub enabled: bool,
    /// Errors are counted over this sliding window.
    #[schemars(range(min = 1, max = 86400))]
    pub window_seconds: u64,
    /// Errors in the window that make a backend a cull candidate.
    #[schemars(range(min = 1, max = 1_000_000_000_000u64))]
    pub error_threshold: u64,
    /// Time between two decisions.
    #[schemars(range(min = 1, max = 3600))]
    pub check_interval_seconds: u64,
    /// Fleet-wide culls allowed per token period, shared through the store (refilled smoothly).
    #[schemars(range(min = 0, max = 1000000))]
    pub tokens: u32,
    /// The period over which `tokens` culls are allowed.
    #[schemars(range(min = 1, max = 604800))]
    pub token_period_seconds: u64,
    /// Per upstream; one backend always stays in rotation.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub max_culled_fraction: f64,
    /// A culled backend is probed again after this.
    #[schemars(range(min = 1, max = 86400))]
    pub cooldown_seconds: u64,
    /// Decide and report (`/status` `dry_run_culled`), eject nothing.
    pub dry_run: bool,
    /// `http://` URL that receives a POST of `{upstream, backend, reason, errors}` on a cull (2
    /// s timeout, fire and forget); `reason` is the rule: `error_threshold`, `success_rate` or
    /// `latency`.
    pub webhook_url: String,
    /// Outliers judged against the upstream's peers: none | success_rate | latency. Allowed:
    /// None, success_rate, latency.
    pub outlier: String,
    /// Requests (latency: answered requests) a backend needs in the window to be judged.
    #[schemars(range(min = 1, max = 1_000_000_000_000u64))]
    pub outlier_min_requests: u64,
    /// Success_rate: an outlier is below the peers' mean − factor × their stdev. Allowed:
    /// >0–100.
    pub outlier_stdev_factor: f64,
    /// Latency: an outlier's p90 is over factor × the median of its peers' p90. Allowed:
    /// >1–1000.
    pub latency_factor: f64,
    /// When one tenant's (or key's) requests cause most of the errors, limit that tenant
    /// instead of culling backends; with outlier = "latency", a key's slow answers on a backend
    /// where other keys are fast are not counted against the backend. Keys no tenant holds are
    /// one identity; without tenants, so is an address using many keys.
    pub blame_tenants: bool,
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
            outlier: "none".into(),
            outlier_min_requests: 50,
            outlier_stdev_factor: 1.9,
            latency_factor: 3.0,
            blame_tenants: false,
        }
    }
}

/// `[watchdog]` is read straight into its settings type: the file keys and the
/// typed settings are the same fields, checked by `validate_watchdog`.
pub use super::settings::WatchdogSettings as WatchdogSection;

/// `[access_log]`: one JSON line per request.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AccessLogSection {
    /// One JSON line per request (the access log); false: none.
    pub enabled: bool,
    /// `""` = stdout; else a file, opened for append, reopened on `SIGUSR1`.
    pub path: String,
    /// Share of 1xx-3xx requests logged; every 4xx/5xx is logged.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub sample: f64,
    /// Lines queued for the writer thread; beyond, lines are dropped and counted.
    #[schemars(range(min = 1, max = 16777216))]
    pub queue_lines: usize,
    /// `""` = off; `unix:///dev/log`, `udp://HOST:PORT` or `tcp://HOST:PORT`: each line
    /// is sent as an RFC 5424 syslog message (facility local0, octet counting on TCP)
    /// instead of to `path`. Read at start only.
    pub syslog: String,
}

impl Default for AccessLogSection {
    fn default() -> Self {
        Self {
            enabled: true,
            path: String::new(),
            sample: 1.0,
            queue_lines: 65_536,
            syslog: String::new(),
        }
    }
}

/// `[tracing]`: W3C trace context is always propagated; span export is
/// configured here.
#[derive(Debug, Clone, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TracingSection {
    /// `""` = no span export; else the collector's OTLP/HTTP URL (`http://` or `https://`, e.g.
    /// `http://127.0.0.1:4318`); `/v1/traces` is appended unless the path ends with it. Takes
    /// effect at start.
    pub otlp_endpoint: String,
    /// Share of new traces (no valid incoming `traceparent`) whose spans are exported; a
    /// continued trace follows the client's sampled flag. Reloadable.
    #[schemars(range(min = 0.0, max = 1.0))]
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
#[derive(Debug, Clone, Default, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// The process's own log lines on stderr (not the access log): `auto` is text on a
    /// terminal, JSON otherwise. Takes effect at start: a reload that changes it logs a warning
    /// and keeps the format. Allowed: `auto` | `json` | `text`.
    pub format: LogFormat,
}
