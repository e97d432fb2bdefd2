//! The one Redis client: every Redis connection of the process is owned here.
//!
//! * Connect and every call are bounded by `timeout_ms`.
//! * After a connection failure or a timeout the connection is dropped and
//!   reconnects back off exponentially (100 ms doubling to 5 s); calls made during
//!   the backoff fail at once with [`StoreError::Backoff`] without touching the
//!   network, so a dead Redis costs the caller nothing.
//! * A server-side error (a script error) leaves the connection in use.
//! * Keys: every key the proxy writes starts with [`RedisClient::prefix`].
//! * [`RedisClient::generation`] changes whenever a new connection is made, so a
//!   caller that caches what the server holds (registration markers) can tell
//!   that the server may have restarted in between.
//!
//! One multiplexed connection serves the limiter's flusher, culling and the
//! watchdog together: calls run concurrently on it and the lock is held only to
//! look the connection up, never across a call.
//!
//! Modes ([`Endpoint`], CONTRACT §9):
//! * standalone: one connection to `url` (`rediss://` for TLS, `ca_file` for a private CA);
//! * cluster: the `redis` crate's cluster client ([`StoreConn::Cluster`]): it routes each
//!   command by the hash slot of its first key, follows MOVED and ASK, and refreshes the
//!   slot map on MOVED. A failed call (a dead master, `CLUSTERDOWN` during a failover)
//!   drops the whole cluster connection like any failure, so the next one re-reads the
//!   topology from the seed nodes after the backoff. Multi-key calls must stay in one slot
//!   ([`RedisClient::slot`]);
//! * sentinel: at every (re)connect the sentinels are asked for the master, and `ROLE`
//!   confirms it; a demoted master (`READONLY`) or a dropped connection reconnects, so the
//!   promoted replica is found after a failover.
//!
//! A connect failure is logged once per distinct cause (`redis store connect failed`),
//! with a hint for authentication and TLS errors.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, FromRedisValue, Pipeline, RedisFuture, RedisResult,
    ScriptInvocation, Value,
};
use tokio::sync::Mutex;
use tokio::time::{timeout, Instant};

use super::endpoint::{Endpoint, Target};
use super::StoreError;

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Number of Redis Cluster hash slots.
pub const CLUSTER_SLOTS: u16 = 16_384;

/// A connection of the store: one server (standalone, or the master sentinels named) or a
/// Redis Cluster. Cheap to clone (both multiplex one set of sockets); run commands,
/// pipelines and scripts on it as on any `redis::aio::ConnectionLike`.
#[derive(Clone)]
pub enum StoreConn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// `SCRIPT LOAD` (sent by `Script::invoke_async` after `NOSCRIPT`)? In a cluster it goes
/// to every master only: the crate's default (every node) fails while a dead node is still
/// listed, and replicas never run our scripts.
fn is_script_load(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter().filter_map(|a| match a {
        redis::Arg::Simple(b) => Some(b),
        redis::Arg::Cursor => None,
    });
    matches!(
        (args.next(), args.next()),
        (Some(a), Some(b)) if a.eq_ignore_ascii_case(b"SCRIPT") && b.eq_ignore_ascii_case(b"LOAD")
    )
}

impl ConnectionLike for StoreConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            StoreConn::Single(c) => c.req_packed_command(cmd),
            StoreConn::Cluster(c) => {
                if is_script_load(cmd) {
                    Box::pin(async move {
                        c.route_command(
                            cmd,
                            RoutingInfo::MultiNode((
                                MultipleNodeRoutingInfo::AllMasters,
                                Some(ResponsePolicy::AllSucceeded),
                            )),
                        )
                        .await
                    })
                } else {
                    c.req_packed_command(cmd)
                }
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            StoreConn::Single(c) => c.req_packed_commands(cmd, offset, count),
            StoreConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            StoreConn::Single(c) => c.get_db(),
            StoreConn::Cluster(c) => c.get_db(),
        }
    }
}

struct Conn {
    conn: Option<StoreConn>,
    backoff: Duration,
    next_attempt: Option<Instant>,
    /// The last connect failure logged (a new cause is logged again).
    last_error: Option<String>,
}

/// A lazily connected, self-healing Redis client. Cheap to share behind an `Arc`.
pub struct RedisClient {
    target: Target,
    mode: &'static str,
    prefix: String,
    timeout: Duration,
    conn: Mutex<Conn>,
    generation: AtomicU64,
}

impl std::fmt::Debug for RedisClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL: it may carry a password.
        f.debug_struct("RedisClient")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisClient {
    /// Parses `url` (`redis://[user:password@]host:port[/db]`); does not connect.
    pub fn new(url: &str, key_prefix: &str, timeout: Duration) -> Result<Self, StoreError> {
        Self::with_endpoint(&Endpoint::standalone(url), key_prefix, timeout)
    }

    /// A client of any mode ([`Endpoint`]); does not connect.
    pub fn with_endpoint(
        endpoint: &Endpoint,
        key_prefix: &str,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let timeout = timeout.max(Duration::from_millis(1));
        Ok(Self {
            target: endpoint.target(timeout)?,
            mode: endpoint.mode_name(),
            prefix: key_prefix.to_owned(),
            timeout,
            conn: Mutex::new(Conn {
                conn: None,
                backoff: BACKOFF_MIN,
                next_attempt: None,
                last_error: None,
            }),
            generation: AtomicU64::new(0),
        })
    }

    /// `"standalone"`, `"cluster"` or `"sentinel"`.
    pub fn mode(&self) -> &'static str {
        self.mode
    }

    /// Whether this is a Redis Cluster: every multi-key call (script, pipeline) must keep
    /// its keys in one hash slot ([`RedisClient::slot`]).
    pub fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    /// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its `{hash tag}` (the first
    /// non-empty `{…}`), else of the whole key, modulo 16384.
    pub fn slot(key: &[u8]) -> u16 {
        let tagged = key
            .iter()
            .position(|&b| b == b'{')
            .and_then(|open| {
                let rest = &key[open + 1..];
                let close = rest.iter().position(|&b| b == b'}')?;
                (close > 0).then(|| &rest[..close])
            })
            .unwrap_or(key);
        crc16::State::<crc16::XMODEM>::calculate(tagged) % CLUSTER_SLOTS
    }

    /// Every key written starts with this.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The bound on connecting and on each call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Bumped each time a new connection is established.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Connect once (bounded by the caller).
    async fn connect(&self) -> RedisResult<StoreConn> {
        // No response timeout in the connection: [`RedisClient::run`] bounds each call
        // itself, and tells a deadline passed while the process was paused from a slow
        // store (the connection's own timer would fail the call at wake-up).
        let cfg = AsyncConnectionConfig::new().set_connection_timeout(self.timeout);
        match &self.target {
            Target::Standalone(client) => Ok(StoreConn::Single(
                client
                    .get_multiplexed_async_connection_with_config(&cfg)
                    .await?,
            )),
            Target::Cluster(client) => Ok(StoreConn::Cluster(client.get_async_connection().await?)),
            Target::Sentinel(sentinel) => {
                let client = sentinel.lock().await.async_get_client().await?;
                Ok(StoreConn::Single(
                    client
                        .get_multiplexed_async_connection_with_config(&cfg)
                        .await?,
                ))
            }
        }
    }

    /// The current connection and its generation, connecting if there is none.
    async fn connection(&self) -> Result<(StoreConn, u64), StoreError> {
        let mut st = self.conn.lock().await;
        if let Some(c) = &st.conn {
            return Ok((c.clone(), self.generation()));
        }
        if st.next_attempt.is_some_and(|t| Instant::now() < t) {
            return Err(StoreError::Backoff);
        }
        // Discovery (sentinel) and topology (cluster) are a few round trips: one bound.
        let made = timeout(self.timeout, self.connect()).await;
        let err = match made {
            Ok(Ok(c)) => {
                st.conn = Some(c.clone());
                if st.last_error.take().is_some() {
                    tracing::info!(target: "portcullis::store", mode = self.mode, "redis store connected");
                }
                let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
                return Ok((c, generation));
            }
            Ok(Err(e)) => {
                let hint = connect_hint(&e);
                let text = format!("{hint}{e}");
                match super::from_redis(e) {
                    StoreError::Timeout => StoreError::Timeout,
                    _ => StoreError::Connect(text),
                }
            }
            Err(_) => StoreError::Timeout,
        };
        let text = err.to_string();
        if st.last_error.as_deref() != Some(text.as_str()) {
            tracing::error!(target: "portcullis::store", mode = self.mode, error = %text, "redis store connect failed; the store is unhealthy until it succeeds (traffic is still served)");
            st.last_error = Some(text);
        }
        back_off(&mut st);
        Err(err)
    }

    /// Drop the connection and back off: the next call reconnects after the backoff.
    pub async fn fail(&self) {
        back_off(&mut *self.conn.lock().await);
    }

    /// [`RedisClient::fail`] unless a newer connection replaced the failed one (or another
    /// call already failed it): concurrent failures of one connection back off once.
    async fn fail_generation(&self, generation: u64) {
        let mut st = self.conn.lock().await;
        if st.conn.is_some() && self.generation() == generation {
            back_off(&mut st);
        }
    }

    async fn succeeded(&self) {
        let mut st = self.conn.lock().await;
        st.backoff = BACKOFF_MIN;
        st.next_attempt = None;
    }

    /// Run `op` on the connection; connect and call are each bounded by the timeout.
    pub async fn run<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        F: FnOnce(StoreConn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let (conn, generation) = self.connection().await?;
        let started = Instant::now();
        let call = op(conn);
        tokio::pin!(call);
        let mut done = timeout(self.timeout, &mut call).await;
        if done.is_err() && paused_through(started.elapsed(), self.timeout) {
            // The deadline passed while the process did not run (SIGSTOP, a frozen VM, a
            // starved machine): the answer may sit unread in the socket. One more bound
            // before the store is called slow and the connection dropped.
            done = timeout(self.timeout, &mut call).await;
        }
        match done {
            Ok(Ok(v)) => {
                self.succeeded().await;
                Ok(v)
            }
            Ok(Err(e)) => {
                // Server-side errors leave the connection usable; anything else
                // (I/O, a timed-out reply that may arrive late, a demoted master,
                // a cluster in failover) rebuilds it.
                if !keeps_connection(&e) {
                    self.fail_generation(generation).await;
                }
                Err(super::from_redis(e))
            }
            Err(_) => {
                // A hung (black-holed) connection must not be reused forever.
                self.fail_generation(generation).await;
                Err(StoreError::Timeout)
            }
        }
    }

    /// One script call (`EVALSHA`, loading the script on a miss) with the keys and
    /// arguments `inv` was given, as [`RedisClient::run`] bounds and retries any call.
    pub async fn invoke<T: FromRedisValue>(
        &self,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        self.run(|mut c| async move { inv.invoke_async(&mut c).await })
            .await
    }
}

/// The `i`th value of a script's reply as `T`; `what` names it in the error (a reply
/// too short, or of another shape, is a protocol error: the script and this binary
/// disagree).
pub fn reply_field<T: FromRedisValue>(
    reply: &[Value],
    i: usize,
    what: &str,
) -> Result<T, StoreError> {
    let v = reply
        .get(i)
        .ok_or_else(|| StoreError::Protocol(format!("{what}: missing")))?;
    redis::from_redis_value(v).map_err(|e| StoreError::Protocol(format!("{what}: {e}")))
}

/// A call bounded by `bound` whose timer fired `elapsed` after it started: late by at
/// least the bound itself, the process was not running when the deadline passed.
fn paused_through(elapsed: Duration, bound: Duration) -> bool {
    elapsed >= bound.saturating_mul(2)
}

/// A script or command error that says nothing about the connection or the topology.
fn keeps_connection(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::ResponseError | ErrorKind::ExtensionError
    ) && !e.to_string().contains("READONLY")
}

/// A prefix telling the operator what to check for the usual misconfigurations.
fn connect_hint(e: &redis::RedisError) -> &'static str {
    let text = e.to_string();
    if e.kind() == ErrorKind::AuthenticationFailed
        || text.contains("WRONGPASS")
        || text.contains("NOAUTH")
        || text.contains("invalid password")
        || text.contains("without any password configured")
    {
        "authentication failed (check the password): "
    } else if text.contains("CaUsedAsEndEntity") {
        // rustls (the Redis client's TLS) refuses a server certificate marked CA:TRUE, such
        // as a lone self-signed one from `openssl req -x509`, which redis-cli (OpenSSL)
        // accepts.
        "TLS failed: the Redis server presents a CA certificate (CA:TRUE) as its own; \
         reissue it with -addext basicConstraints=critical,CA:FALSE, or sign it with a \
         separate CA and give that CA as ca_file: "
    } else if text.contains("certificate")
        || text.contains("Certificate")
        || text.contains("tls")
        || text.contains("TLS")
        || text.contains("handshake")
    {
        "TLS failed (check rediss://, tls and ca_file): "
    } else if e.kind() == ErrorKind::MasterNameNotFoundBySentinel {
        "no such sentinel master (check master_name): "
    } else if text.contains("cluster support disabled") {
        "not a Redis Cluster (check mode and nodes): "
    } else {
        ""
    }
}

fn back_off(st: &mut Conn) {
    st.conn = None;
    st.next_attempt = Some(Instant::now() + st.backoff);
    st.backoff = (st.backoff * 2).min(BACKOFF_MAX);
}

#[cfg(test)]
mod slot_tests {
    use super::RedisClient;

    #[test]
    fn a_timer_late_by_its_bound_is_a_pause() {
        use std::time::Duration;
        let b = Duration::from_millis(300);
        assert!(!super::paused_through(Duration::from_millis(301), b));
        assert!(!super::paused_through(Duration::from_millis(599), b));
        assert!(super::paused_through(Duration::from_millis(600), b));
        assert!(super::paused_through(Duration::from_secs(20), b));
    }

    /// Values from `CLUSTER KEYSLOT` of Redis 7.
    #[test]
    fn slots_follow_hash_tags() {
        assert_eq!(RedisClient::slot(b"foo"), 12182);
        assert_eq!(RedisClient::slot(b"{foo}:bar"), 12182);
        assert_eq!(RedisClient::slot(b"a:{foo}:b:{x}"), 12182);
        assert_eq!(RedisClient::slot(b"a{b}c"), 3300);
        assert_eq!(RedisClient::slot(b"{user1000}.following"), 3443);
        // An empty first tag does not count: the whole key is hashed.
        assert_eq!(RedisClient::slot(b"{}foo"), 9500);
        assert_eq!(RedisClient::slot(b"x{}{y}"), 14166);
    }
}
