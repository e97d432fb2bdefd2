//! portcullis: an HTTP edge proxy on Pingora that keeps a fleet healthy with
//! three gates.
//!
//! A request's path through the proxy, in order (see [`proxy`]):
//!
//! 1. **Framing and header limits** ([`framing`]) — an ambiguous request is
//!    answered 400 and its connection closed; an oversized header block 431.
//! 2. **Routing** — host and longest path prefix pick an upstream and a
//!    priority class ([`state::Runtime::route`]).
//! 3. **Load shedding** ([`portcullis_policy::shed`], through [`gate`]) — a global in-flight cap; critical requests
//!    may use 100% of it, normal 90%, low 75%. Over the class limit: 503 with
//!    `Retry-After`, before any upstream work.
//! 4. **Rate limiting** ([`gate`], [`ratelimit`]) — a per-API-key sliding window
//!    decided from local memory only; a background flusher shares counts through Redis
//!    in batches. Over the limit: 429 with `Retry-After` and `RateLimit` fields.
//! 5. **Backend selection** ([`upstream`]) — round robin over healthy backends
//!    that are not culled; a failed connect is retried on another backend.
//! 6. **Accounting** — every response feeds the backend's error window, which
//!    the culling driver ([`cull::driver`]) reads to eject a failing backend
//!    when the fleet-wide disruption budget allows it.
//!
//! Every gate returns a verdict; [`respond`] alone turns a refusal into a
//! response. Settings are typed values from [`config`]; everything the fleet
//! shares goes through the store crate ([`portcullis_store`]).
//!
//! Around the request path: [`admin`] endpoints, [`metrics`], [`lifecycle`]
//! (readiness-first shutdown) and [`reload`]; [`ctl`] is `portcullis ctl`, the client of
//! the admin API's runtime endpoints.

pub mod admin;
pub mod balance;
pub mod config;
pub mod ctl;
pub mod cull;
pub mod edge;
pub mod fleet;
pub mod fleet_caps;
pub mod framing;
pub mod gate;
pub mod import;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod observe;
pub mod proxy;
pub mod ratelimit;
pub mod reload;
pub mod respond;
pub mod server;
pub mod state;
pub mod tenants;
pub mod upstream;
pub mod watchdog;
