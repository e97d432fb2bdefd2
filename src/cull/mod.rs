//! Upstream culling: per-backend error accounting, candidate selection with a
//! systemic-failure guard, and a fleet-wide disruption budget (token bucket +
//! per-upstream claims held as leases) backed by Redis or by an in-process store.
//!
//! Everything here is plain policy that takes `now` explicitly (or reads it from
//! the store's clock); the proxy wires it into the request path (`ErrorWindow::record`)
//! and into the periodic check loop (`evaluate`, `BudgetStore`, `CullState`).
//!
//! Design notes (see also `CONTRACT.md` §2 `[culling]`, §4, §5.4):
//! * An error is counted per response; the check loop compares each backend's
//!   windowed error count to `error_threshold`, then `evaluate` refuses to cull
//!   anything when the failure is not specific to a few backends (systemic).
//! * A cull is a *claim* on the upstream's disruption budget with a lease TTL.
//!   Claiming costs one fleet-wide token; renewing an already-held claim is free.
//!   All checks and the commit happen in one atomic Lua script (one round trip).
//! * Redis unreachable or slow → `Err(StoreError)`; the caller must not cull.

pub mod blame;
pub mod driver;
mod http;
mod webhook;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod driver_tests;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod outlier_tests;
