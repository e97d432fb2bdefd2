//! The one error type of the shared-state layer. Callers map it to their own
//! outcome (`store_error` for culling, an unhealthy store for the limiter) and
//! never let it reach a request.

use std::fmt;

/// The store could not answer: unreachable, slow, or a reply of the wrong shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// Connecting or the call took longer than `timeout_ms`.
    Timeout,
    /// A recent failure put reconnects on backoff; the call was not attempted.
    Backoff,
    /// No connection could be made (refused, DNS, bad URL, auth).
    Connect(String),
    /// Redis answered with an error.
    Command(String),
    /// The reply did not have the expected shape.
    Protocol(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Timeout => f.write_str("store call timed out"),
            StoreError::Backoff => f.write_str("store reconnect backing off after a failure"),
            StoreError::Connect(e) => write!(f, "store connect failed: {e}"),
            StoreError::Command(e) => write!(f, "store command failed: {e}"),
            StoreError::Protocol(e) => write!(f, "store protocol error: {e}"),
        }
    }
}

impl std::error::Error for StoreError {}
