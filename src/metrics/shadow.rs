//! Shadow mode's metric (CONTRACT §13): the refusals a gate in shadow mode would have
//! made, by gate (`rate_limit`, `shed`) and policy (a rate-limit policy's name; the
//! shed request's priority class). Series exist only for gates configured in shadow mode:
//! their handles are resolved when a config turns shadow mode on (`state::Runtime`).

use prometheus::{IntCounter, IntCounterVec, Registry};

pub struct ShadowMetrics {
    /// `portcullis_shadow_refusals_total{gate,policy}`.
    pub refusals: IntCounterVec,
}

impl ShadowMetrics {
    /// Define shadow mode's series and register them in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let refusals = super::counter_vec(
            registry,
            "portcullis_shadow_refusals_total",
            "Requests a gate in shadow mode would have refused and admitted instead: gate = rate_limit (policy = the rate-limit policy) or shed (policy = the request's priority class)",
            &["gate", "policy"],
        );
        Self { refusals }
    }

    /// The counter of a shadow rate-limit policy.
    pub fn rate_limit(&self, policy: &str) -> IntCounter {
        self.refusals.with_label_values(&["rate_limit", policy])
    }

    /// The counters of the shed gate in shadow mode, one per priority class (in
    /// `Priority::ALL` order).
    pub fn shed(&self) -> [IntCounter; 3] {
        portcullis_policy::shed::Priority::ALL
            .map(|p| self.refusals.with_label_values(&["shed", p.as_str()]))
    }
}
