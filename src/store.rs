//! The shared-state layer is the crate `portcullis-store` (crates/store): the Redis client,
//! its scripts and the in-process stores. Re-exported whole so that `crate::store::Store`,
//! `crate::store::clock::unix_ms` and the rest keep their paths in the app.

pub use portcullis_store::*;
