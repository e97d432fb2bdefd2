//! Per-API-key sliding-window rate limiting, shared between instances through a counter
//! store (Redis, or an in-process store when there is no `[redis]` section).
//!
//! * Decisions ([`Limiter::check`]) are purely in-memory, never await and never touch the
//!   store. Only admitted requests are counted.
//! * A background task (the app's flusher task (`run_flusher`)) periodically sends every touched key's unflushed
//!   admissions to the store in one batch and receives the global counts of the key's
//!   current and previous windows back. Each key's estimate is
//!   `last known global counts + own in-flight + own unflushed admissions`.
//! * Adaptive sync: a key near its limit (estimate >= 50% of it), with large unsent
//!   admissions (>= 10% of what the fleet had left at its last sync) or refused for its
//!   fleet share is sent at every flush; any other touched key stays queued and is sent
//!   every 8th flush (every 400 ms at 50 ms flushes; all such keys in the same flush, so the
//!   flushes in between need no store call), during the first 8 flushes, after a store
//!   failure and at shutdown. Its admissions between syncs stay bounded by the usual checks
//!   (known counts, fleet share), so this costs no accuracy near the limit, where it
//!   matters. A previous window's total, once read late enough into the current window
//!   (late deltas of other instances are in), is not read again.
//! * If the store fails, decisions continue on the last known global counts plus the local
//!   admissions; unflushed deltas are kept (bounded by the tracked-key cap) and delivered when
//!   the store is back.
//! * Keys are bytes (the app's `extract_key` never converts them lossily): two keys are one key only
//!   if they are equal byte for byte. A request with more than one value for the key (two
//!   key headers, two `Authorization` headers, a repeated query parameter) is
//!   `KeyOutcome::Duplicate`: answered 400, never forwarded, never counted.
//!
//! ## Hardening against floods and data loss
//!
//! * **Keys stay local until their counts can matter.** A key this instance admitted at most
//!   [`LOCAL_ONLY_MAX`] (1) times over its current and previous windows, and never refused,
//!   is never sent to the store: a flood of keys each seen once creates no store key (the
//!   Redis keys of such a flood were unbounded before). It becomes shared (sent like any
//!   other key from then on) at its second admission, at its first refusal, or when restored
//!   as shared from a ghost. Overshoot this adds: at most `N x LOCAL_ONLY_MAX` admissions per
//!   key per sliding window for `N` instances (each may hold one admission the fleet does not
//!   see), on top of the fleet-share bound below.
//! * **Lost store data is restored, not trusted.** Every delta carries the totals its caller
//!   last read (the floors of [`Delta`]); a store holding less (`FLUSHALL`, a restart without
//!   persistence) raises the counter back to the floor before adding, in the same script
//!   call, and the limiter never lowers a known total on a smaller answer. Floors never
//!   exceed the true total, so several instances restore one loss once. An answer that
//!   only restored a floor ([`GlobalCounts::restored`]) is what one instance knew, not news
//!   about the others: until a sync brings news, the key keeps its estimate of the other
//!   instances' unsynced admissions (also while the share is suspended by an outage) and
//!   any cached refusal, so an instance whose view was a flush old is not reopened by
//!   restoring its own older total.
//! * **Eviction spares the keys that matter.** The CLOCK eviction passes over keys at or near
//!   their limit (estimate >= 50%) and evicts them only when every slot of the shard is such
//!   a key. An evicted key leaves a ghost (its counts; one per slot of the cap, the larger
//!   estimate wins a collision) and comes back with its counts. A key created without a
//!   ghost in a shard that evicted in this or the previous window may be a forgotten key:
//!   before its first sync it admits at most [`LOCAL_ONLY_MAX`] request, then is refused with
//!   `Retry-After: 1` and synced at the next flush (this needs a healthy store; without one
//!   each instance enforces what it knows, §5.3).
//!
//! ## Several instances: the fleet share
//!
//! Between two syncs an instance cannot see what the others admit, so if each let a key use
//! everything the last known global counts leave, `n` instances together could admit up to
//! `n` times that — most visibly on a key none of them has synced yet (no global view: each
//! would admit the full limit before its first flush). So while the store is healthy:
//!
//! * Each sync also reports the number `n` of live instances sharing the store (the Redis
//!   store keeps a heartbeat per instance in the same script call; see `RedisStore` (the store crate)). It is
//!   kept on the limiter ([`Limiter::instances`]); 1 for the in-process store.
//! * A request is admitted only if, in addition to the usual check, this instance's own
//!   admissions not yet in the global view (unflushed and in flight, weighed by the window
//!   math) plus this one fit its share of what the fleet has left,
//!   `R = limit - (g_prev * (1 - elapsed) + g_cur + est)` from the last known global counts
//!   (`R = limit` for a key never synced), with no share when `R < 1`. The share is
//!   `floor(R / n)` plus one more request with probability `frac(R / n)`, so the `n` shares
//!   add up to `R` in expectation: the draw is a hash of the key's process-local id (random
//!   per instance), its window and its last synced counts, so it holds between two syncs
//!   and is independent between instances (`window::within_share`, `window::share_draw`).
//!   `est` is an estimate of the other instances' admissions not yet synced: `(n - 1) ×`
//!   what this instance just sent (the others are assumed to see the same traffic; replaced
//!   at every sync). Without it, the first instance to sync a fresh burst sees only its own
//!   admissions and grants itself half of the rest on top of what the others already hold.
//! * A request refused only because of the share (the known counts still have room) gets a
//!   429 with `Retry-After: 1` (the next syncs, every `flush_interval_ms`, grant a new share)
//!   and the refusal is not cached.
//!
//! Accuracy: while the store answers within the flush interval, one round of syncs admits
//! `R` in expectation: the rounding adds nothing on average, and what it adds in one round
//! (the instances holding the same view) is a sum of `n` independent 0/1 draws less its
//! mean (a standard deviation of at most `sqrt(n) / 2`; under 16 at `n = 1,000`), where
//! rounding every share up, as this limiter did before, added up to `n - 1` (a worst case
//! of `limit + 2n - 1` per window, 3.3x the default limit at 1,000 instances).
//!
//! First contacts: an instance that has not synced a key yet knows nothing of what the fleet
//! admitted of it, and with the plain share each such instance grants an expected
//! `limit / n` whenever its first request comes: a key new to a large fleet, or reaching
//! its instances one after another (clients moving onto a fleet, a rolling restart), got
//! up to about the limit again on top of what the synced instances admit (1.67x at 100
//! instances, 1.89x at 1,000 in the simulation below). So in a fleet of more than
//! [`FIRST_CONTACT_FLEET`] (4) instances:
//!
//! * before its first sync, a key's share divides by `n² / 4`, not `n`: all `n` first
//!   contacts together grant `4 / n` of the limit in expectation (4% at 100 instances);
//!   an instance refused for it is synced at the next flush (`Retry-After: 1`);
//! * `est`, the estimate of the other instances' unsynced admissions, is at least what
//!   they added since this instance's last view (all of the window's total on its first
//!   view of it): with many instances, each seeing a key rarely, `(n - 1) x` what this
//!   instance sent is mostly 0 or far too much, while the fleet's own news is what it
//!   will admit again before this instance looks again.
//!
//! Fleets of up to 4 keep the plain share and estimate: a key reaching their instances one
//! after another can still take up to about `(n - 1) / n` of the limit more in that window
//! (1.25x to 1.47x at 4 instances in the simulation), where the smaller first share would
//! refuse most first requests of a fresh burst on every instance.
//!
//! Simulated (`examples/fleet_sim.rs`, BENCHMARKS.md "Fleet accuracy at scale"; the default
//! 600 per 60 s, 50 ms staggered flushes, one key at 4x, 100x and 2,000x its limit spread
//! evenly, skewed, or reaching the instances one after another): every window, the one in
//! which the key is new to the fleet included, within 1.045x the limit at 100 and 1,000
//! instances; full windows within 1.005x from 2 to 1,000. The price is on a key spread
//! thinly over a large fleet (each instance sees a few of its requests per window): an
//! instance that is barely used still holds its expected share and looks again only when
//! a request comes, so the fleet admits less than the limit (at 4x: mean 0.95x the limit
//! at 100 instances, 0.64x to 0.72x at 1,000); clients refused for the share retry after a
//! second (the simulation does not retry). `fleet_of_100_stays_within_5_percent_of_the_limit`
//! holds 100 instances to 5% in the window the key is new and in a full window.
//!
//! An answer that comes back later than the flush interval is older than another
//! instance's next sync; the estimate of that instance's unsynced admissions can then miss
//! some, and the fleet can admit a few more (on paused time, 60 requests alternating between
//! 2 instances, limit 20: at most 21 with answers within the 50 ms interval, 22 or 23 in 7
//! to 9 of 2,000 runs with answers of 50 to 60 ms; see
//! `fleet_share_alternating_requests_with_slow_answers`). An answer that comes back a flush
//! interval or more after it was sent does not lower the estimate of the other instances'
//! unsynced admissions (`slot::apply`).
//!
//! Refusing rather than admitting is deliberate: the contract prefers accuracy (never far
//! above the limit) and a refused client is told to retry in a second, when the fleet view is
//! fresh. The cost: a burst on one instance while others are idle gets half (for `n = 2`) of
//! the quota at once, then converges (half of the rest per sync interval), and a key kept at
//! its limit by one instance only stays about `n + 1` sync intervals' worth of decay below it
//! (under 0.3% of the limit with the 60 s default window and 50 ms flushes). With `n = 1` (a
//! single instance, the in-process store) nothing changes. While the store is unreachable
//! the share is suspended (the last known `n` is kept for when it is back): each instance then
//! enforces the last known global counts plus its own, as §5.3 of the contract requires.
//!
//! Files: the decision in `limiter.rs`, one key's policy (slot, sync policy, applying an
//! answer, ghosts) in `slot.rs`, the sharded CLOCK cache in `shard.rs` (each shard an
//! open-addressed table of slots, `table.rs`), the flush
//! protocol in `flush.rs` and its background loop in `flusher.rs`; the store trait and the
//! in-process store in `store.rs`, the Redis store (on the process's one
//! the store crate's `RedisClient`) in `redis_store.rs`. Window math: see [`window`]. Key
//! hashing for the store: see [`hash`].

mod flush;
pub mod hash;
mod limiter;
mod pending;
mod shard;
mod sim;
mod slot;
mod store;
mod table;
pub mod window;

pub use flush::{flush, flush_with, FlushExtra, FlushOutcome};
pub use hash::stable_hash_in;
pub use limiter::Limiter;
pub use shard::{approx_bytes_per_key, SHARDS};
pub use sim::{simulate, simulate_fleet, FleetRun, FleetSim, Spread, T0 as SIM_T0};
pub use slot::{FIRST_CONTACT_FLEET, LOCAL_ONLY_MAX};
pub use store::{Batch, CounterStore, Delta, GlobalCounts, LocalStore, StoreError, SyncResult};

use std::collections::HashMap;

/// Default cap on the number of keys a [`Limiter`] tracks.
pub const DEFAULT_MAX_TRACKED_KEYS: usize = 100_000;

/// Limiter parameters; hot-reloadable through [`Limiter::set_params`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitParams {
    /// Window length in seconds (>= 1; 0 is treated as 1).
    pub window_secs: u64,
    /// Admitted requests per key per sliding window.
    pub limit: u64,
    /// Per-key limits overriding `limit`, by raw API key.
    pub overrides: HashMap<String, u64>,
    /// Longest key accepted by the app's `extract_key` (the limiter itself does not check it).
    pub max_key_bytes: usize,
    /// Approximate cap on tracked keys (rounded up to a multiple of [`SHARDS`]).
    pub max_tracked_keys: usize,
}

impl Default for RateLimitParams {
    fn default() -> Self {
        Self {
            window_secs: 60,
            limit: 600,
            overrides: HashMap::new(),
            max_key_bytes: 256,
            max_tracked_keys: DEFAULT_MAX_TRACKED_KEYS,
        }
    }
}

/// Outcome of [`Limiter::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Admitted (and counted).
    Allowed {
        /// The key's limit.
        limit: u64,
        /// Whole requests still admissible after this one (`r` of the `RateLimit` field).
        remaining: u64,
        /// Seconds until the quota is fully restored if no more requests come (`t`).
        reset_secs: u64,
    },
    /// Refused (not counted).
    Limited {
        /// The key's limit.
        limit: u64,
        /// Whole seconds (>= 1, rounded up) until this key is admitted again.
        retry_after_secs: u64,
        /// Same as `retry_after_secs`: seconds until `r` becomes >= 1 again (`t` of the
        /// `RateLimit` field on a 429).
        reset_secs: u64,
    },
}

impl Decision {
    /// Whether the request was admitted.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allowed { .. })
    }
}
