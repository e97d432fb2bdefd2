//! Culling's disruption budget ([`BudgetStore`], defined by the policy crate with its
//! semantics): [`RedisBudget`], fleet-wide, and [`LocalBudget`], a single instance's, with
//! the same semantics (the conformance table in `conformance_tests.rs` runs both).

mod claim_loop;
mod local;
mod local_ops;
mod lua;
mod redis;
mod redis_claims;
mod redis_exchange;
mod redis_ops;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod redis_tests;

pub use self::claim_loop::claim;
pub use self::local::LocalBudget;
pub use self::redis::RedisBudget;
pub use portcullis_policy::cull::BudgetStore;
