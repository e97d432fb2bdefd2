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
use std::sync::Arc;

use prometheus::IntGauge;

/// The tunnel cap's state, owned by the runtime state (`state::Shared`): the
/// slots taken and the `portcullis_tunnels_open` gauge (registered by
/// `metrics::Metrics`, moved here).
#[derive(Debug)]
pub struct Tunnels {
    /// Tunnels reserved (upgrade requests admitted, waiting for the `101`) or open.
    slots: AtomicU64,
    open: IntGauge,
}

impl Tunnels {
    /// No slot taken; `open` is the gauge the open tunnels are reported by.
    pub fn new(open: IntGauge) -> Arc<Self> {
        Arc::new(Self {
            slots: AtomicU64::new(0),
            open,
        })
    }

    /// Reserve a slot if fewer than `max` are taken (`max` 0 = no cap).
    pub fn try_reserve(self: &Arc<Self>, max: u64) -> Option<TunnelSlot> {
        let taken = self
            .slots
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (max == 0 || n < max).then_some(n + 1)
            });
        taken.ok().map(|_| TunnelSlot {
            tunnels: Arc::clone(self),
            open: false,
        })
    }

    /// Slots taken now (reserved or open).
    pub fn slots_taken(&self) -> u64 {
        self.slots.load(Ordering::Acquire)
    }
}

/// One reserved tunnel slot; freed on drop.
#[derive(Debug)]
pub struct TunnelSlot {
    tunnels: Arc<Tunnels>,
    open: bool,
}

impl TunnelSlot {
    /// The `101` arrived: the tunnel is open.
    pub fn mark_open(&mut self) {
        if !self.open {
            self.open = true;
            self.tunnels.open.inc();
        }
    }

    pub fn is_open(&self) -> bool {
        self.open
    }
}

impl Drop for TunnelSlot {
    fn drop(&mut self) {
        if self.open {
            self.tunnels.open.dec();
        }
        self.tunnels.slots.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tunnels() -> Arc<Tunnels> {
        Tunnels::new(IntGauge::new("t", "t").unwrap_or_else(|e| panic!("{e}")))
    }

    #[test]
    fn cap_is_exact_and_slots_come_back() {
        let t = tunnels();
        let a = t.try_reserve(2);
        let mut b = t.try_reserve(2);
        assert!(a.is_some() && b.is_some());
        assert!(t.try_reserve(2).is_none());
        if let Some(b) = b.as_mut() {
            b.mark_open();
            b.mark_open();
        }
        assert_eq!(t.open.get(), 1);
        drop(b);
        assert_eq!(t.open.get(), 0);
        assert!(t.try_reserve(2).is_some());
        drop(a);
        assert_eq!(t.slots_taken(), 0);
        assert!(t.try_reserve(0).is_some());
    }

    /// Two runtime states (two `Tunnels`) do not share slots: the cap is the
    /// state's, not the process's.
    #[test]
    fn each_state_owns_its_slots() {
        let (x, y) = (tunnels(), tunnels());
        let held = x.try_reserve(1);
        assert!(held.is_some());
        assert!(x.try_reserve(1).is_none());
        assert!(y.try_reserve(1).is_some());
        assert_eq!((x.slots_taken(), y.slots_taken()), (1, 0));
    }
}
