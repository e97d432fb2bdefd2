//! portcullis's policy layer: every gate's decision as plain Rust that takes `now`.
//!
//! No I/O crate is a dependency of this crate (no pingora, redis, prometheus, tokio, hyper or
//! openssl): `cargo tree -p portcullis-policy -e normal` lists what it builds on. The app
//! crate drives these policies; the store crate keeps their shared state.

pub mod balance;
pub mod bucket;
pub mod calendar;
pub mod cull;
pub mod fleet_cap;
pub mod health;
pub mod ratelimit;
pub mod shed;
mod store_error;
pub mod tenant;
pub mod text;
pub mod traffic;
pub mod verdict;
pub mod window;

pub use store_error::StoreError;
