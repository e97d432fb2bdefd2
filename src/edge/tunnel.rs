//! `Upgrade` tunnels (WebSocket and others): capped by `shedding.max_tunnels`
//! and reported by `portcullis_tunnels_open`.
//!
//! Pingora proxies an upgrade request like any other; after a `101` both sides
//! switch to a raw byte stream inside the same session, which stays open until
//! one side closes. The proxy reserves a slot when an upgrade request is
//! admitted (so the cap is exact even with many handshakes racing), turns it
//! into an open tunnel on the `101` (releasing the request's in-flight slot),
//! and frees it when the session ends. On shutdown the process exits at
//! `shutdown_timeout_seconds` at the latest (see `lifecycle`), which closes any
//! tunnel still open.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

use prometheus::IntGauge;

/// Tunnels reserved (upgrade requests admitted, waiting for the `101`) or open.
static SLOTS: AtomicU64 = AtomicU64::new(0);

/// `portcullis_tunnels_open`: process-global so that every [`crate::metrics::Metrics`]
/// registry exposes the same gauge.
pub fn open_gauge() -> &'static IntGauge {
    static OPEN: LazyLock<IntGauge> = LazyLock::new(|| {
        IntGauge::new(
            "portcullis_tunnels_open",
            "Upgraded connections (WebSocket etc.) currently open",
        )
        .unwrap_or_else(|e| panic!("static metric definition: {e}"))
    });
    &OPEN
}

/// One reserved tunnel slot; freed on drop.
#[derive(Debug)]
pub struct TunnelSlot {
    open: bool,
}

impl TunnelSlot {
    /// Reserve a slot if fewer than `max` are taken (`max` 0 = no cap).
    pub fn try_reserve(max: u64) -> Option<Self> {
        let taken = SLOTS.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (max == 0 || n < max).then_some(n + 1)
        });
        taken.ok().map(|_| Self { open: false })
    }

    /// The `101` arrived: the tunnel is open.
    pub fn mark_open(&mut self) {
        if !self.open {
            self.open = true;
            open_gauge().inc();
        }
    }

    pub fn is_open(&self) -> bool {
        self.open
    }
}

impl Drop for TunnelSlot {
    fn drop(&mut self) {
        if self.open {
            open_gauge().dec();
        }
        SLOTS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Slots taken now (reserved or open).
pub fn slots_taken() -> u64 {
    SLOTS.load(Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test touches the process-global counter, so tests cannot race on it.
    #[test]
    fn cap_is_exact_and_slots_come_back() {
        let base = slots_taken();
        let max = base + 2;
        let a = TunnelSlot::try_reserve(max);
        let mut b = TunnelSlot::try_reserve(max);
        assert!(a.is_some() && b.is_some());
        assert!(TunnelSlot::try_reserve(max).is_none());
        let before = open_gauge().get();
        if let Some(b) = b.as_mut() {
            b.mark_open();
            b.mark_open();
        }
        assert_eq!(open_gauge().get(), before + 1);
        drop(b);
        assert_eq!(open_gauge().get(), before);
        assert!(TunnelSlot::try_reserve(max).is_some());
        drop(a);
        assert_eq!(slots_taken(), base);
        assert!(TunnelSlot::try_reserve(0).is_some());
    }
}
