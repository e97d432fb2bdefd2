//! The per-upstream bulkhead: `max_inflight` (or `fleet_max_inflight`'s share of it), or
//! the learned cap of an `adaptive` upstream; the slot a request holds, the room it tells
//! when it gives the slot back, and the `Retry-After` of what the upstream sheds.

use super::{Pool, Room, UpstreamShared};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The bulkhead's answer for one request.
#[derive(Debug)]
pub enum Bulkhead {
    /// No `max_inflight`.
    Unlimited,
    /// Holds one of the upstream's slots until dropped.
    Entered(BulkheadGuard),
    /// The upstream is at `max_inflight`: shed.
    Full,
}

#[derive(Debug)]
pub struct BulkheadGuard {
    slot: Slot,
    /// Dropped after `slot`.
    _told: Told,
}

impl BulkheadGuard {
    /// Whether this is a slot of an `adaptive` upstream's learned cap.
    #[inline]
    pub fn is_adaptive(&self) -> bool {
        matches!(self.slot, Slot::Adaptive(_))
    }

    /// The request's body is still arriving: an adaptive upstream's cap does not count
    /// the slot until [`BulkheadGuard::end_upload`] (a fixed `max_inflight` always does).
    #[inline]
    pub fn start_upload(&mut self) {
        if let Slot::Adaptive(g) = &mut self.slot {
            g.start_upload();
        }
    }

    #[inline]
    pub fn end_upload(&mut self) {
        if let Slot::Adaptive(g) = &mut self.slot {
            g.end_upload();
        }
    }
}

/// A fixed bulkhead's slot, or one of an adaptive upstream's learned cap.
#[derive(Debug)]
enum Slot {
    /// Held for its `Drop`.
    Fixed(#[allow(dead_code)] FixedSlot),
    Adaptive(portcullis_policy::shed::InflightGuard),
}

/// One of a fixed bulkhead's slots, given back when dropped.
#[derive(Debug)]
struct FixedSlot(Arc<UpstreamShared>);

impl Drop for FixedSlot {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Tells an upstream's [`Room`] when dropped: after the slot (fields drop in order).
#[derive(Debug)]
struct Told(Arc<Room>);

impl Drop for Told {
    fn drop(&mut self) {
        self.0.free();
    }
}

impl Pool {
    /// The upstream's line of requests waiting for room.
    pub fn room(&self) -> &Arc<Room> {
        &self.shared.room
    }

    /// `Retry-After` of a request this upstream sheds at `now_secs` (its bulkhead full,
    /// its queue's time out or full): an adaptive upstream's learned cap spreads the
    /// retries by its own shed share, as the cap's sheds are; a fixed `max_inflight` or
    /// `max_conn` answers `base`.
    pub fn shed_retry_after(&self, base: u64, now_secs: u64) -> u64 {
        if self.balance.adaptive {
            self.shared
                .limit
                .share
                .refuse(base, now_secs, fastrand::u64(..))
        } else {
            base
        }
    }

    /// Requests that may wait for room at once: `max_queue`, else 10 × the sum of the
    /// backends' `max_conn` (or of `max_inflight`), else 1024.
    pub fn max_queue(&self) -> u64 {
        if self.balance.max_queue > 0 {
            return self.balance.max_queue;
        }
        let conns: u64 = self.max_conn.iter().sum();
        let base = if conns > 0 {
            conns
        } else {
            self.balance.max_inflight
        };
        if base > 0 {
            base.saturating_mul(10)
        } else {
            1024
        }
    }

    /// The bulkhead (`max_inflight`, or the learned cap when `adaptive`): take a slot or
    /// be shed.
    #[inline]
    pub fn enter(&self) -> Bulkhead {
        if self.balance.adaptive {
            return match self
                .shared
                .limit
                .try_acquire(portcullis_policy::shed::Priority::Critical)
            {
                Some(g) => Bulkhead::Entered(BulkheadGuard {
                    slot: Slot::Adaptive(g),
                    _told: Told(Arc::clone(&self.shared.room)),
                }),
                None => Bulkhead::Full,
            };
        }
        let cap = match self.balance.fleet_max_inflight {
            0 => self.balance.max_inflight,
            _ => self.shared.fleet_cap.cap_or(self.balance.max_inflight),
        };
        if cap == 0 {
            return Bulkhead::Unlimited;
        }
        let sh = &self.shared;
        let mut cur = sh.inflight.load(Ordering::Acquire);
        loop {
            if cur >= cap {
                return Bulkhead::Full;
            }
            match sh.inflight.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Bulkhead::Entered(BulkheadGuard {
                        slot: Slot::Fixed(FixedSlot(Arc::clone(sh))),
                        _told: Told(Arc::clone(&sh.room)),
                    })
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Feed one answered request's latency to an `adaptive` upstream's own cap.
    #[inline]
    pub fn on_latency(&self, now: std::time::Instant, rtt: Duration) {
        if self.balance.adaptive {
            self.shared.limit.on_latency(now, rtt);
        }
    }
}
