//! Per-API-key rate limiting at the edge (CONTRACT §4): the request's key ([`extract_key`];
//! a verified bearer token's claim for `jwt:CLAIM`, [`jwt`]),
//! the policies of a route ([`Policies`]), the gate ([`gate`]), the `RateLimit` fields
//! ([`fields`]), the Redis counter store ([`RedisStore`], from the store crate) and the flusher task
//! ([`run_flusher`]). The limiter itself, its sliding window and its flush protocol are
//! policy: `portcullis_policy::ratelimit`, imported from there.

pub mod fields;
mod flusher;
pub mod jwt;

mod key;
pub mod policy;

pub use fields::FieldParts;
pub use flusher::{now_ms, run_flusher};
pub use key::{extract_key, extract_request_key, KeyOutcome, KeySource, MissingKey};
pub use policy::{Combined, DecisionCounters, Policies, Policy, PolicyKey, MAX_POLICIES};
