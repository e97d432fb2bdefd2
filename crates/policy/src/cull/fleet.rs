//! Fleet-wide error counts: each instance adds its per-backend request and
//! error deltas to time buckets in Redis and reads back the fleet's totals
//! over the window, in one pipelined round trip per check. A backend's fate
//! then rests on the errors the whole fleet saw, not only this instance's
//! share of the traffic.

/// One backend's counts since the last exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetDelta {
    pub backend: String,
    pub requests: u64,
    pub errors: u64,
    /// Ignore buckets that started before this (Unix seconds): the backend
    /// was readmitted then and its earlier errors are forgiven.
    pub since_secs: u64,
}

/// Bucket layout of the fleet counters for a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buckets {
    pub bucket_secs: u64,
    /// Buckets in the window (the current one included).
    pub count: u64,
}

impl Buckets {
    /// Buckets as wide as the check interval (at least 1 s), enough to cover the window.
    pub fn new(window_secs: u64, check_interval_secs: u64) -> Self {
        let bucket_secs = check_interval_secs.clamp(1, window_secs.max(1));
        Self {
            bucket_secs,
            count: window_secs.max(1).div_ceil(bucket_secs),
        }
    }

    /// Bucket indexes to read at `now_secs` for a backend readmitted at `since_secs`.
    pub fn to_read(&self, now_secs: u64, since_secs: u64) -> std::ops::RangeInclusive<u64> {
        let cur = now_secs / self.bucket_secs;
        let oldest = cur.saturating_sub(self.count - 1);
        // The bucket holding `since` mixes errors from before the readmission: skip it.
        let first_clean = if since_secs == 0 {
            0
        } else {
            since_secs / self.bucket_secs + 1
        };
        oldest.max(first_clean)..=cur
    }

    /// TTL of a bucket key: it must outlive the window.
    pub fn ttl_secs(&self) -> u64 {
        self.bucket_secs * (self.count + 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_the_window() {
        let b = Buckets::new(60, 10);
        assert_eq!(b.count, 6);
        assert_eq!(b.to_read(1000, 0), 95..=100);
        assert_eq!(b.ttl_secs(), 80);
        let b = Buckets::new(5, 10);
        assert_eq!((b.bucket_secs, b.count), (5, 1));
    }

    #[test]
    fn readmission_forgets_older_buckets() {
        let b = Buckets::new(60, 10);
        assert_eq!(b.to_read(1000, 985), 99..=100);
        // since in the future of the window: nothing before the current bucket
        assert!(b.to_read(1000, 1000).is_empty());
    }
}
