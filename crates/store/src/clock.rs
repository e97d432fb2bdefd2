//! The wall clock, read in one place. Policy code never calls these: it takes
//! `now` as an argument; drivers read the clock once per step and pass it on.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Seconds since the Unix epoch.
pub fn unix_secs() -> u64 {
    unix_ms() / 1000
}
