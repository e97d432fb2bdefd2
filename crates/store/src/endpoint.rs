//! Where the store lives (CONTRACT §9): one Redis (`standalone`), a Redis Cluster reached
//! through seed nodes (`cluster`), or the master a set of Sentinels names (`sentinel`), with
//! AUTH and TLS. [`Endpoint`] is the validated `[redis]` target; [`Target`] the connector
//! built from it; [`probe`] the bounded-time check `--check` runs.

use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{Client, ConnectionAddr, TlsCertificates, TlsMode};

use super::StoreError;

/// `[redis] mode`.
#[derive(Clone, PartialEq, Eq)]
pub enum Mode {
    /// One server (or a proxy in front of several): `url`.
    Standalone { url: String },
    /// Redis Cluster: seed nodes `host:port`; the topology is learned from them.
    Cluster { nodes: Vec<String> },
    /// The master that the Sentinels at `sentinels` (`host:port`) name `master_name`.
    Sentinel {
        sentinels: Vec<String>,
        master_name: String,
    },
}

/// A validated `[redis]` target. `Debug` never shows a password.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub mode: Mode,
    /// AUTH password of cluster/sentinel data nodes ("" = none). In standalone mode the URL
    /// carries it, unless this is set (`password_file`), which then wins over the URL's.
    pub password: String,
    /// TLS to cluster/sentinel nodes (standalone: the `rediss://` scheme).
    pub tls: bool,
    /// PEM trust anchors (`ca_file`, read at load); `None`: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match &self.mode {
            Mode::Standalone { url } => format!("standalone {}", redact(url)),
            Mode::Cluster { nodes } => format!("cluster {nodes:?}"),
            Mode::Sentinel {
                sentinels,
                master_name,
            } => format!("sentinel {master_name:?} via {sentinels:?}"),
        };
        f.debug_struct("Endpoint")
            .field("mode", &mode)
            .field(
                "password",
                &if self.password.is_empty() { "" } else { "***" },
            )
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_pem.is_some())
            .finish()
    }
}

/// `scheme://user:***@host` for logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..s + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

impl Endpoint {
    /// One server at `url` (`redis://` or `rediss://`, `user:password@` allowed).
    pub fn standalone(url: &str) -> Self {
        Endpoint {
            mode: Mode::Standalone {
                url: url.to_string(),
            },
            password: String::new(),
            tls: false,
            ca_pem: None,
        }
    }

    /// `"standalone"`, `"cluster"` or `"sentinel"`.
    pub fn mode_name(&self) -> &'static str {
        match self.mode {
            Mode::Standalone { .. } => "standalone",
            Mode::Cluster { .. } => "cluster",
            Mode::Sentinel { .. } => "sentinel",
        }
    }

    fn certs(&self) -> Option<TlsCertificates> {
        self.ca_pem.as_ref().map(|pem| TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.clone()),
        })
    }

    /// The connector for this endpoint (parses, never connects). `timeout` bounds the
    /// cluster client's own connects and replies.
    pub fn target(&self, timeout: Duration) -> Result<Target, StoreError> {
        install_crypto_provider();
        let bad = |what: &str, e: redis::RedisError| StoreError::Connect(format!("{what}: {e}"));
        match &self.mode {
            Mode::Standalone { url } => {
                use redis::IntoConnectionInfo;
                let mut info = url
                    .as_str()
                    .into_connection_info()
                    .map_err(|e| bad("invalid redis url", e))?;
                if !self.password.is_empty() {
                    // `password_file`: wins over a password in the URL.
                    info.redis.password = Some(self.password.clone());
                }
                let client = match self.certs() {
                    Some(certs) if url.starts_with("rediss://") => {
                        Client::build_with_tls(info, certs)
                    }
                    _ => Client::open(info),
                }
                .map_err(|e| bad("invalid redis url", e))?;
                Ok(Target::Standalone(client))
            }
            Mode::Cluster { nodes } => {
                let scheme = if self.tls { "rediss" } else { "redis" };
                let urls: Vec<String> = nodes.iter().map(|n| format!("{scheme}://{n}")).collect();
                let mut b = ClusterClientBuilder::new(urls)
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    // MOVED and ASK count as retries; waits stay far below `timeout`.
                    .retries(3)
                    .min_retry_wait(5)
                    .max_retry_wait(50);
                if !self.password.is_empty() {
                    b = b.password(self.password.clone());
                }
                if self.tls {
                    b = b.tls(TlsMode::Secure);
                    if let Some(c) = self.certs() {
                        b = b.certs(c);
                    }
                }
                Ok(Target::Cluster(
                    b.build().map_err(|e| bad("invalid cluster nodes", e))?,
                ))
            }
            Mode::Sentinel {
                sentinels,
                master_name,
            } => Ok(Target::Sentinel(Box::new(tokio::sync::Mutex::new(
                self.sentinel_client(sentinels, master_name)
                    .map_err(|e| bad("invalid sentinel settings", e))?,
            )))),
        }
    }

    fn sentinel_client(
        &self,
        sentinels: &[String],
        master_name: &str,
    ) -> redis::RedisResult<SentinelClient> {
        let addrs = sentinels.iter().map(|s| {
            let (host, port) = split_host_port(s);
            if self.tls {
                ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host, port)
            }
        });
        let mut b =
            SentinelClientBuilder::new(addrs, master_name.to_string(), SentinelServerType::Master)?;
        if !self.password.is_empty() {
            b = b.set_client_to_redis_password(self.password.clone());
        }
        if self.tls {
            b = b
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
            if let Some(c) = self.certs() {
                b = b
                    .set_client_to_redis_certificates(c.clone())
                    .set_client_to_sentinel_certificates(c);
            }
        }
        b.build()
    }
}

/// `host:port` (validated at load); a missing port reads as 6379 (sentinels: 26379 is
/// conventional, but the contract asks for `host:port`).
fn split_host_port(s: &str) -> (String, u16) {
    match s.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_start_matches('[').trim_end_matches(']').to_string(),
            p.parse().unwrap_or(6379),
        ),
        None => (s.to_string(), 6379),
    }
}

/// rustls needs a process-wide crypto provider; ring is the only one compiled in.
fn install_crypto_provider() {
    // Err: already installed (by us or another part of the process): fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The connector of a [`super::RedisClient`].
pub enum Target {
    Standalone(Client),
    Cluster(ClusterClient),
    /// Asks the sentinels for the master at every (re)connect.
    Sentinel(Box<tokio::sync::Mutex<SentinelClient>>),
}

/// What a bounded probe of a reachable store found wrong, for `--check`: the key path
/// and why. `Ok(None)`: fine; `Ok(Some(note))`: could not verify (unreachable).
pub async fn probe(ep: &Endpoint, timeout: Duration) -> Result<Option<String>, (String, String)> {
    match &ep.mode {
        Mode::Standalone { .. } => Ok(None),
        Mode::Cluster { nodes } => probe_cluster(ep, nodes, timeout).await,
        Mode::Sentinel {
            sentinels,
            master_name,
        } => probe_sentinels(ep, sentinels, master_name, timeout).await,
    }
}

/// [`probe`] on a private single-thread runtime (for `--check`, before any runtime exists).
pub fn probe_blocking(
    ep: &Endpoint,
    timeout: Duration,
) -> Result<Option<String>, (String, String)> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(probe(ep, timeout)),
        Err(e) => Ok(Some(format!("cannot probe the store: {e}"))),
    }
}

async fn node_conn(
    ep: &Endpoint,
    addr: &str,
    password: bool,
    timeout: Duration,
) -> Option<redis::aio::MultiplexedConnection> {
    let (host, port) = split_host_port(addr);
    let scheme = if ep.tls { "rediss" } else { "redis" };
    let url = format!("{scheme}://{host}:{port}");
    let ep1 = Endpoint {
        ca_pem: ep.ca_pem.clone(),
        // Set on the connection, not written into the URL (which would need escaping).
        password: if password {
            ep.password.clone()
        } else {
            String::new()
        },
        ..Endpoint::standalone(&url)
    };
    let Ok(Target::Standalone(client)) = ep1.target(timeout) else {
        return None;
    };
    let cfg = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(timeout)
        .set_response_timeout(timeout);
    tokio::time::timeout(
        timeout,
        client.get_multiplexed_async_connection_with_config(&cfg),
    )
    .await
    .ok()?
    .ok()
}

async fn probe_cluster(
    ep: &Endpoint,
    nodes: &[String],
    timeout: Duration,
) -> Result<Option<String>, (String, String)> {
    for (i, n) in nodes.iter().enumerate() {
        let Some(mut c) = node_conn(ep, n, true, timeout).await else {
            continue;
        };
        let reply: Result<redis::RedisResult<String>, _> = tokio::time::timeout(
            timeout,
            redis::cmd("CLUSTER").arg("INFO").query_async(&mut c),
        )
        .await;
        match reply {
            Ok(Ok(_)) => return Ok(None),
            Ok(Err(e)) if e.to_string().contains("cluster support disabled") => {
                return Err((
                    format!("redis.nodes[{i}]"),
                    format!("{n} is not a Redis Cluster node (cluster support disabled)"),
                ))
            }
            _ => continue,
        }
    }
    Ok(Some(format!(
        "no seed node of redis.nodes answered within {timeout:?}: not verified"
    )))
}

async fn probe_sentinels(
    ep: &Endpoint,
    sentinels: &[String],
    master_name: &str,
    timeout: Duration,
) -> Result<Option<String>, (String, String)> {
    for (i, s) in sentinels.iter().enumerate() {
        let Some(mut c) = node_conn(ep, s, false, timeout).await else {
            continue;
        };
        let reply: Result<redis::RedisResult<Option<(String, String)>>, _> = tokio::time::timeout(
            timeout,
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(master_name)
                .query_async(&mut c),
        )
        .await;
        match reply {
            Ok(Ok(Some(_))) => return Ok(None),
            Ok(Ok(None)) => {
                return Err((
                    "redis.master_name".into(),
                    format!("sentinel {s} knows no master named {master_name:?}"),
                ))
            }
            Ok(Err(e))
                if e.to_string()
                    .to_ascii_lowercase()
                    .contains("unknown command") =>
            {
                return Err((
                    format!("redis.sentinels[{i}]"),
                    format!("{s} is not a Redis Sentinel"),
                ))
            }
            _ => continue,
        }
    }
    Ok(Some(format!(
        "no sentinel of redis.sentinels answered within {timeout:?}: not verified"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_a_password() {
        let mut ep = Endpoint::standalone("redis://u:hunter2@h:1");
        ep.password = "s3cret".into();
        let d = format!("{ep:?}");
        assert!(!d.contains("hunter2") && !d.contains("s3cret"), "{d}");
        assert!(d.contains("u:***@h:1"), "{d}");
    }

    #[test]
    fn host_port_split() {
        assert_eq!(
            split_host_port("127.0.0.1:7000"),
            ("127.0.0.1".into(), 7000)
        );
        assert_eq!(split_host_port("[::1]:7000"), ("::1".into(), 7000));
    }
}
