//! A backend's manual operations (CONTRACT §12) as the request path and the pool's build
//! read them: drained, in maintenance, claimed, or at a runtime weight.

use std::sync::atomic::Ordering;

pub(super) const MANUAL_IN: u8 = 0;
const MANUAL_DRAIN: u8 = 1;
const MANUAL_MAINT: u8 = 2;
const MANUAL_WEIGHT_ZERO: u8 = 3;
const MANUAL_CLAIMED: u8 = 4;
const NO_WEIGHT: u32 = u32::MAX;

/// A backend's manual operations (CONTRACT §12): the records (for `GET /backends` and
/// the status page), the mark the request path reads (one atomic load), and the weight
/// the pool is built with. Written by the fleet sync and the admin API, never per request.
#[derive(Debug)]
pub struct Manual {
    pub(super) mark: std::sync::atomic::AtomicU8,
    weight: std::sync::atomic::AtomicU32,
    records: std::sync::Mutex<Vec<portcullis_policy::cull::ops::OpRecord>>,
}

impl Default for Manual {
    fn default() -> Self {
        Self {
            mark: std::sync::atomic::AtomicU8::new(MANUAL_IN),
            weight: std::sync::atomic::AtomicU32::new(NO_WEIGHT),
            records: std::sync::Mutex::new(Vec::new()),
        }
    }
}

/// What takes a backend out by hand, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManualState {
    In,
    Draining,
    Maint,
    /// Claimed on the disruption budget (`POST /claims`).
    Claimed,
    /// Weight 0: no new requests.
    WeightZero,
}

impl Manual {
    /// Replace the records with `records` (those in force on this backend). Returns
    /// whether the weight changed (the pool is then rebuilt with it).
    pub fn set(&self, records: Vec<portcullis_policy::cull::ops::OpRecord>) -> bool {
        use portcullis_policy::cull::ops::OpKind;
        // maint, then a claim, then a drain, then weight 0 says what the backend is.
        let state = records.iter().fold(None, |acc, r| match (acc, r.kind) {
            (_, OpKind::Maint) => Some(MANUAL_MAINT),
            (Some(MANUAL_MAINT), _) => acc,
            (_, OpKind::Claim { .. }) => Some(MANUAL_CLAIMED),
            (Some(MANUAL_CLAIMED), _) => acc,
            (_, OpKind::Drain) => Some(MANUAL_DRAIN),
            (Some(MANUAL_DRAIN), _) => acc,
            (_, OpKind::Weight(0)) => Some(MANUAL_WEIGHT_ZERO),
            _ => acc,
        });
        let weight = records
            .iter()
            .find_map(|r| match r.kind {
                OpKind::Weight(w) => Some(w),
                _ => None,
            })
            .unwrap_or(NO_WEIGHT);
        self.mark
            .store(state.unwrap_or(MANUAL_IN), Ordering::Release);
        let before = self.weight.swap(weight, Ordering::AcqRel);
        *self.records.lock().unwrap_or_else(|p| p.into_inner()) = records;
        before != weight
    }

    pub fn state(&self) -> ManualState {
        match self.mark.load(Ordering::Acquire) {
            MANUAL_DRAIN => ManualState::Draining,
            MANUAL_MAINT => ManualState::Maint,
            MANUAL_WEIGHT_ZERO => ManualState::WeightZero,
            MANUAL_CLAIMED => ManualState::Claimed,
            _ => ManualState::In,
        }
    }

    /// The weight set at runtime, if any.
    pub fn weight(&self) -> Option<u32> {
        let w = self.weight.load(Ordering::Acquire);
        (w != NO_WEIGHT).then_some(w)
    }

    /// Put `record` in place of the one of its field (an action of this instance, before
    /// the next sync reads it back).
    pub fn put(&self, record: portcullis_policy::cull::ops::OpRecord) -> bool {
        let mut records = self.records();
        records.retain(|x| x.field() != record.field());
        records.push(record);
        self.set(records)
    }

    /// Drop the record stored under `field`.
    pub fn remove(&self, field: &str) -> bool {
        let mut records = self.records();
        records.retain(|x| x.field() != field);
        self.set(records)
    }

    pub fn records(&self) -> Vec<portcullis_policy::cull::ops::OpRecord> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
