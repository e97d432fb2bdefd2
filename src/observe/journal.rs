//! What the status page shows about culling beyond the metrics: the last
//! cull decisions and each ejected backend's lease. The culling driver
//! writes here once per decision and per check, never on the request path.

use portcullis_policy::cull::CullState;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Decisions kept for the status page.
pub const KEEP: usize = 20;

/// One decision on a backend: a cull's, or a person's through the admin API (CONTRACT
/// §12: `action`, `by` and `reason` are set for those).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct CullEntry {
    pub at_ms: u64,
    pub upstream: String,
    pub backend: String,
    /// As in `portcullis_cull_decisions_total{result}`, or for an admin action as in
    /// `portcullis_admin_actions_total{result}`.
    pub result: &'static str,
    pub errors: u64,
    /// `drain`, `maint`, `ready`, `weight` (admin actions only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<&'static str>,
    /// The admin token's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The reason given, or the refusal's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The culling rule that made it a candidate (`error_threshold`, `success_rate`,
    /// `latency`; cull decisions only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<&'static str>,
    /// The rule's figures in words (outlier rules).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub figures: Option<String>,
}

/// A backend the last check judged an outlier against its peers (CONTRACT §15), with the
/// figures: `value` (success rate, or p90 in ms), `baseline` (the peers' mean success
/// rate, or the median of their p90 in ms) and the `limit` it crossed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OutlierView {
    pub rule: &'static str,
    pub value: f64,
    pub baseline: f64,
    pub limit: f64,
    pub peers: usize,
    pub figures: String,
}

impl OutlierView {
    pub fn of(o: &portcullis_policy::cull::Outlier) -> Self {
        // Latencies in ms, rounded to 0.1 ms; rates to 0.001.
        let (scale, round) = match o.rule {
            portcullis_policy::cull::OutlierRule::Latency => (1e-3, 10.0),
            _ => (1.0, 1000.0),
        };
        let r = |v: f64| (v * scale * round).round() / round;
        Self {
            rule: o.rule.as_str(),
            value: r(o.value),
            baseline: r(o.baseline),
            limit: r(o.limit),
            peers: o.peers,
            figures: o.describe(),
        }
    }
}

/// An ejected backend's lease as this instance sees it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LeaseView {
    /// `culled` (we hold the lease), `probing`, or `following` (another
    /// instance holds it).
    pub phase: &'static str,
    /// When the lease expires by itself (Unix ms); while following, from the store's time
    /// left of the claim (`None` until it was read).
    pub lease_until_ms: Option<u64>,
    /// When the backend is probed for readmission (Unix ms).
    pub probe_at_ms: Option<u64>,
    /// While following: the instance that culled it and the rule, as it published them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

impl LeaseView {
    pub fn of(state: &CullState) -> Option<Self> {
        match *state {
            CullState::Up => None,
            CullState::Culled {
                probe_at_ms,
                lease_until_ms,
                ..
            } => Some(Self {
                phase: "culled",
                lease_until_ms: Some(lease_until_ms),
                probe_at_ms: Some(probe_at_ms),
                by: None,
                rule: None,
            }),
            CullState::Probing { lease_until_ms, .. } => Some(Self {
                phase: "probing",
                lease_until_ms: Some(lease_until_ms),
                probe_at_ms: None,
                by: None,
                rule: None,
            }),
            CullState::Following { .. } => Some(Self {
                phase: "following",
                lease_until_ms: None,
                probe_at_ms: None,
                by: None,
                rule: None,
            }),
        }
    }
}

#[derive(Debug, Default)]
pub struct CullJournal {
    recent: Mutex<VecDeque<CullEntry>>,
    leases: Mutex<HashMap<(String, String), LeaseView>>,
    outliers: Mutex<HashMap<(String, String), OutlierView>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CullJournal {
    pub fn record(&self, entry: CullEntry) {
        let mut q = lock(&self.recent);
        if q.len() == KEEP {
            q.pop_front();
        }
        q.push_back(entry);
    }

    /// Newest first.
    pub fn recent(&self) -> Vec<CullEntry> {
        lock(&self.recent).iter().rev().cloned().collect()
    }

    pub fn set_lease(&self, upstream: &str, backend: &str, state: &CullState) {
        let key = (upstream.to_string(), backend.to_string());
        let mut leases = lock(&self.leases);
        match LeaseView::of(state) {
            Some(mut v) => {
                // What the store said of a followed cull stays until it is read again.
                if let Some(old) = leases.get(&key).filter(|o| o.phase == v.phase) {
                    v.by.clone_from(&old.by);
                    v.rule.clone_from(&old.rule);
                    if v.phase == "following" {
                        v.lease_until_ms = old.lease_until_ms;
                    }
                }
                leases.insert(key, v);
            }
            None => {
                leases.remove(&key);
            }
        }
    }

    /// A lease another instance holds (`following`) ends at `until_ms` (Unix ms, from the
    /// store's time left).
    pub fn set_following_until(&self, upstream: &str, backend: &str, until_ms: u64) {
        let key = (upstream.to_string(), backend.to_string());
        if let Some(v) = lock(&self.leases).get_mut(&key) {
            if v.phase == "following" {
                v.lease_until_ms = Some(until_ms);
            }
        }
    }

    /// A followed cull's instance and rule, as the store's note says.
    pub fn set_following_note(&self, upstream: &str, backend: &str, by: &str, rule: &str) {
        let key = (upstream.to_string(), backend.to_string());
        if let Some(v) = lock(&self.leases).get_mut(&key) {
            if v.phase == "following" {
                v.by = Some(portcullis_policy::text::one_line(by));
                v.rule = Some(portcullis_policy::text::one_line(rule));
            }
        }
    }

    /// What the last check judged of the backend against its peers (`None`: not an outlier).
    pub fn set_outlier(&self, upstream: &str, backend: &str, view: Option<OutlierView>) {
        let key = (upstream.to_string(), backend.to_string());
        let mut m = lock(&self.outliers);
        match view {
            Some(v) => {
                m.insert(key, v);
            }
            None => {
                m.remove(&key);
            }
        }
    }

    pub fn outlier(&self, upstream: &str, backend: &str) -> Option<OutlierView> {
        lock(&self.outliers)
            .get(&(upstream.to_string(), backend.to_string()))
            .cloned()
    }

    pub fn lease(&self, upstream: &str, backend: &str) -> Option<LeaseView> {
        lock(&self.leases)
            .get(&(upstream.to_string(), backend.to_string()))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_decisions_first() {
        let j = CullJournal::default();
        for i in 0..(KEEP as u64 + 5) {
            j.record(CullEntry {
                at_ms: i,
                upstream: "app".into(),
                backend: "b".into(),
                result: "culled",
                errors: i,
                ..Default::default()
            });
        }
        let r = j.recent();
        assert_eq!(r.len(), KEEP);
        assert_eq!(r[0].at_ms, KEEP as u64 + 4);
        assert_eq!(r[KEEP - 1].at_ms, 5);
    }

    #[test]
    fn leases_follow_the_state() {
        let j = CullJournal::default();
        let culled = CullState::Culled {
            since_ms: 1,
            probe_at_ms: 60_000,
            lease_until_ms: 90_000,
        };
        j.set_lease("app", "b", &culled);
        let v = j.lease("app", "b").expect("lease");
        assert_eq!((v.phase, v.lease_until_ms), ("culled", Some(90_000)));
        j.set_lease("app", "b", &CullState::Up);
        assert_eq!(j.lease("app", "b"), None);
    }
}
