//! What the background exchanges with the store share: their ticks until shutdown, their
//! outage log (once when the store stops answering, once when it answers again, however
//! many exchanges fail between) and this instance's name in the fleet's records.

use std::fmt::Display;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pingora::server::ShutdownWatch;
use tokio::time::{Interval, MissedTickBehavior};

/// A background loop's clock: a tick every period; a late tick delays the next ones
/// instead of bursting to catch up.
pub struct Ticks(Interval);

impl Ticks {
    pub fn every(period: Duration) -> Self {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self(interval)
    }

    /// Waits for the next tick: `false` once the server shuts down.
    pub async fn next(&mut self, shutdown: &mut ShutdownWatch) -> bool {
        tokio::select! {
            _ = self.0.tick() => true,
            _ = shutdown.changed() => false,
        }
    }
}

/// One background exchange's outage, logged once when it begins and once when it ends.
#[derive(Debug)]
pub struct Outage {
    event: &'static str,
    failing: AtomicBool,
}

impl Outage {
    pub const fn new(event: &'static str) -> Self {
        Self {
            event,
            failing: AtomicBool::new(false),
        }
    }

    /// The store answered: says `back` if it had not before (and returns whether it did).
    pub fn answered(&self, back: &str) -> bool {
        let ended = self.failing.swap(false, Ordering::Relaxed);
        if ended {
            tracing::info!(event = self.event, "{back}");
        }
        ended
    }

    /// The store did not answer: says `what` (with the error) once per outage (and returns
    /// whether it did).
    pub fn failed(&self, error: &dyn Display, what: &str) -> bool {
        let began = !self.failing.swap(true, Ordering::Relaxed);
        if began {
            tracing::warn!(event = self.event, error = %error, "{what}");
        }
        began
    }
}

/// This instance in the fleet's records: `host:pid` plus a random tag (containers that
/// share the host's name, with host networking, all run as pid 1).
pub fn member_id() -> String {
    format!(
        "{}-{:04x}",
        crate::watchdog::instance_id(),
        fastrand::u16(..)
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_reported_once_each_way() {
        let o = Outage::new("test");
        assert!(!o.answered("back"), "nothing to end before an outage");
        assert!(
            o.failed(&"refused", "lost"),
            "the outage's first failure is said"
        );
        assert!(!o.failed(&"refused", "lost"), "the next ones are not");
        assert!(o.answered("back"), "its end is said");
        assert!(!o.answered("back"), "once");
        assert!(
            o.failed(&"refused", "lost"),
            "a second outage is said again"
        );
    }

    #[test]
    fn member_ids_differ_between_services_of_one_process() {
        let a = member_id();
        assert!(a.starts_with(&crate::watchdog::instance_id()));
        // 16 random bits: two draws equal by chance 1 in 65536; ten draws all equal never.
        let all: std::collections::HashSet<String> = (0..10).map(|_| member_id()).collect();
        assert!(all.len() > 1);
    }
}
