//! Tenants (CONTRACT §14): API keys as identities. The registry ([`registry`]) maps a
//! key's SHA-256 to its tenant and tier; the tenant gate (`crate::gate`) applies the
//! tier's priority, concurrency, quota and limit. Policy (the quota book, the
//! concurrency share) is `portcullis_policy::tenant`.

pub mod registry;
pub mod watch;

pub use registry::{Live, Registry, TenantRt, TenantSlot};

/// A request's cost from the backend's cost header: a whole number of units; absent,
/// negative, fractional or otherwise invalid = 1 (CONTRACT §14). 0 is a free request.
pub fn cost_of(value: Option<&http::HeaderValue>) -> u64 {
    value
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::cost_of;
    use http::HeaderValue;

    #[test]
    fn a_cost_is_a_whole_number_else_one() {
        let v = |s: &'static str| Some(HeaderValue::from_static(s));
        assert_eq!(cost_of(v("42").as_ref()), 42);
        assert_eq!(cost_of(v(" 7 ").as_ref()), 7);
        assert_eq!(cost_of(v("0").as_ref()), 0);
        for bad in ["-3", "1.5", "", "abc", "99999999999999999999999"] {
            assert_eq!(cost_of(v(bad).as_ref()), 1, "{bad}");
        }
        assert_eq!(cost_of(None), 1);
    }
}
