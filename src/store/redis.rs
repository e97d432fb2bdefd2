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

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisResult};
use tokio::sync::Mutex;
use tokio::time::{timeout, Instant};

use super::error::StoreError;

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

struct Conn {
    conn: Option<MultiplexedConnection>,
    backoff: Duration,
    next_attempt: Option<Instant>,
}

/// A lazily connected, self-healing Redis client. Cheap to share behind an `Arc`.
pub struct RedisClient {
    client: Client,
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
        let client = Client::open(url)
            .map_err(|e| StoreError::Connect(format!("invalid redis url: {e}")))?;
        Ok(Self {
            client,
            prefix: key_prefix.to_owned(),
            timeout: timeout.max(Duration::from_millis(1)),
            conn: Mutex::new(Conn {
                conn: None,
                backoff: BACKOFF_MIN,
                next_attempt: None,
            }),
            generation: AtomicU64::new(0),
        })
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

    async fn connection(&self) -> Result<MultiplexedConnection, StoreError> {
        let mut st = self.conn.lock().await;
        if let Some(c) = &st.conn {
            return Ok(c.clone());
        }
        if st.next_attempt.is_some_and(|t| Instant::now() < t) {
            return Err(StoreError::Backoff);
        }
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(self.timeout)
            .set_response_timeout(self.timeout);
        let made = timeout(
            self.timeout,
            self.client
                .get_multiplexed_async_connection_with_config(&cfg),
        )
        .await;
        match made {
            Ok(Ok(c)) => {
                st.conn = Some(c.clone());
                self.generation.fetch_add(1, Ordering::AcqRel);
                Ok(c)
            }
            Ok(Err(e)) => {
                back_off(&mut st);
                Err(match StoreError::from(e) {
                    StoreError::Timeout => StoreError::Timeout,
                    other => StoreError::Connect(other.to_string()),
                })
            }
            Err(_) => {
                back_off(&mut st);
                Err(StoreError::Timeout)
            }
        }
    }

    /// Drop the connection and back off: the next call reconnects after the backoff.
    pub async fn fail(&self) {
        back_off(&mut *self.conn.lock().await);
    }

    async fn succeeded(&self) {
        let mut st = self.conn.lock().await;
        st.backoff = BACKOFF_MIN;
        st.next_attempt = None;
    }

    /// Run `op` on the connection; connect and call are each bounded by the timeout.
    pub async fn run<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let conn = self.connection().await?;
        match timeout(self.timeout, op(conn)).await {
            Ok(Ok(v)) => {
                self.succeeded().await;
                Ok(v)
            }
            Ok(Err(e)) => {
                // Server-side errors leave the connection usable; anything else
                // (I/O, a timed-out reply that may arrive late) rebuilds it.
                if !matches!(
                    e.kind(),
                    redis::ErrorKind::ResponseError | redis::ErrorKind::ExtensionError
                ) {
                    self.fail().await;
                }
                Err(e.into())
            }
            Err(_) => {
                // A hung (black-holed) connection must not be reused forever.
                self.fail().await;
                Err(StoreError::Timeout)
            }
        }
    }
}

fn back_off(st: &mut Conn) {
    st.conn = None;
    st.next_attempt = Some(Instant::now() + st.backoff);
    st.backoff = (st.backoff * 2).min(BACKOFF_MAX);
}
