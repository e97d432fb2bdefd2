//! Caps as fleet totals (`[shedding] fleet_max_concurrency`, `[[upstreams]]
//! fleet_max_inflight`): the cap this instance takes now and why, as the background
//! exchange (`crate::server::fleet_caps`) last computed it. The request path reads one
//! atomic ([`FleetSlot::cap_or`]); the policy is `portcullis_policy::fleet_cap`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use portcullis_policy::fleet_cap::{CapSource, EffectiveCap};
use serde_json::{json, Value};

/// One cap's fleet share: the cap taken (0 = none, the per-instance value) and the last
/// computation, for `/status`.
#[derive(Debug, Default)]
pub struct FleetSlot {
    cap: AtomicU64,
    last: Mutex<Option<EffectiveCap>>,
}

impl FleetSlot {
    /// The fleet share's cap, else `instance`.
    #[inline]
    pub fn cap_or(&self, instance: u64) -> u64 {
        match self.cap.load(Ordering::Relaxed) {
            0 => instance,
            c => c,
        }
    }

    /// Records a computation; the cap taken is its cap with [`CapSource::Fleet`], none
    /// otherwise. Returns whether the cap taken changed.
    pub fn set(&self, eff: EffectiveCap) -> bool {
        let cap = if eff.source == CapSource::Fleet {
            eff.cap.max(1)
        } else {
            0
        };
        if let Ok(mut last) = self.last.lock() {
            *last = Some(eff);
        }
        self.cap.swap(cap, Ordering::Relaxed) != cap
    }

    /// The last computation.
    pub fn last(&self) -> Option<EffectiveCap> {
        self.last.lock().ok().and_then(|l| *l)
    }

    /// `/status`'s view: the fleet cap, where this instance's cap comes from and its
    /// share (`null` unless from the fleet). Before the first exchange: the per-instance
    /// value, "instance (no store)" without `[redis]`, "instance (store down)" with it.
    pub fn status(&self, fleet_cap: u64, instance_cap: u64, store: bool) -> Value {
        let eff = match self.last() {
            Some(e) if fleet_cap > 0 || e.source == CapSource::Instance => e,
            _ => EffectiveCap {
                cap: instance_cap,
                source: match (fleet_cap, store) {
                    (0, _) => CapSource::Instance,
                    (_, false) => CapSource::NoStore,
                    (_, true) => CapSource::StoreDown,
                },
                share: None,
            },
        };
        let (cap, source, share) = if fleet_cap == 0 {
            (instance_cap, CapSource::Instance.as_str(), None)
        } else {
            (eff.cap, eff.source.as_str(), eff.share)
        };
        json!({
            "cap": cap,
            "cap_source": source,
            "share": share.map(|s| (s * 1000.0).round() / 1000.0),
        })
    }
}
