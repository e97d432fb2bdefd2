//! The request gates, each behind one signature ([`Gate::check`]): load shedding by
//! priority class and the adaptive cap ([`Shed`]), the cap on open tunnels ([`Tunnel`]),
//! an upstream's bulkhead ([`Bulkhead`]) and the rate-limit policies ([`RateLimit`]).
//!
//! A gate reads the [`RequestFacts`] and the time, and either admits the request (handing
//! back what the admission holds: a concurrency slot, a tunnel slot, the `RateLimit`
//! fields) or refuses it with a [`Refusal`], which `respond` alone turns into a response.
//! [`admit`] runs them in CONTRACT §3's order and keeps what each admitted in an
//! [`Admitted`], which lives as long as the request. A new gate (the tenant checks)
//! implements [`Gate`] and takes its place in [`admit`]. Who the request is (its key, its
//! tenant, its class, its blame identity) is resolved once there ([`caller`]) and kept in
//! [`Admitted::caller`].

pub mod caller;
mod ratelimit;
mod tenant;

use std::net::IpAddr;
use std::sync::Arc;

use prometheus::IntCounter;

use crate::edge::tunnel::{TunnelSlot, Tunnels};
use crate::metrics::Metrics;
use crate::respond::{RateFields, Refusal};
use crate::state::{Runtime, Shared};
use crate::upstream::{BulkheadGuard, Pool};
use portcullis_policy::shed::queue::Rank;
use portcullis_policy::shed::{InflightGuard, Priority, Shedder};

pub use caller::Caller;
pub use ratelimit::{RateAdmit, RateLimit};
pub use tenant::Who;

/// What the gates know of a request: read once from its header, before any gate runs.
#[derive(Clone, Copy)]
pub struct RequestFacts<'a> {
    /// The priority class of the request's route.
    pub priority: Priority,
    pub headers: &'a http::HeaderMap,
    pub uri: &'a http::Uri,
    /// The client's address (PROXY protocol and `trusted_proxies` applied).
    pub client_ip: Option<IpAddr>,
    /// An HTTP/1 request (an upgrade is HTTP/1.1 only; HTTP/2 has none).
    pub h1: bool,
    pub version: http::Version,
    /// The route's `rate_limit_policies`: bit `i` for the runtime's policy `i`.
    pub policies: u64,
}

impl RequestFacts<'_> {
    /// An upgrade (WebSocket) request, which will hold a tunnel: HTTP/1.1 with an `Upgrade`
    /// field (Pingora's rule). Looked up only by the gate that needs it, after the shed.
    #[inline]
    pub fn is_upgrade(&self) -> bool {
        self.h1
            && self.version == http::Version::HTTP_11
            && self.headers.contains_key(http::header::UPGRADE)
    }
}

/// One gate: admit the request, with what the admission holds, or refuse it.
pub trait Gate {
    /// What an admission holds until the request ends (a slot released on drop).
    type Admit;
    fn check(&self, facts: &RequestFacts<'_>, now_ms: u64) -> Result<Self::Admit, Refusal>;
}

/// What the gates admitted a request with; each slot is released when this is dropped.
#[derive(Default)]
pub struct Admitted {
    /// Held while the request is in flight (load shedding's count).
    pub inflight: Option<InflightGuard>,
    /// An upgrade request's tunnel slot (reserved, then open after the `101`).
    pub tunnel: Option<TunnelSlot>,
    /// Held while the request is in flight: the upstream's bulkhead slot.
    pub bulkhead: Option<BulkheadGuard>,
    /// The `RateLimit` fields of an admitted response (when the settings ask for them).
    pub rate: Option<RateFields>,
    /// The gates in shadow mode that would have refused the request (CONTRACT §13).
    pub shadow: Shadowed,
    /// Who the request is: its tenant, its class, its blame identity.
    pub caller: Caller,
    /// Held while the request is in flight: its tenant's concurrency slot.
    pub tenant_slot: Option<crate::tenants::TenantSlot>,
    /// The gates passed so far (1 shed, 2 tunnel, 3 bulkhead): after a wait in a queue,
    /// [`admit`] goes on from the gate that sent the request there.
    pub passed: u8,
}

impl Admitted {
    /// The request's body is still arriving from its client: its slots of an adaptive cap
    /// (`shedding.adaptive`'s when `adaptive`, an adaptive upstream's) are not counted by
    /// that cap until [`Admitted::end_upload`]. A slow upload is the client's time, not
    /// load on the backend: counted, 24 clients trickling bodies held a cap learned low and
    /// half the other requests were shed. A fixed cap counts every request in flight.
    #[inline]
    pub fn start_upload(&mut self, adaptive: bool) {
        if adaptive {
            if let Some(g) = self.inflight.as_mut() {
                g.start_upload();
            }
        }
        if let Some(b) = self.bulkhead.as_mut() {
            b.start_upload();
        }
    }

    /// The body is complete (or was never coming): counted again.
    #[inline]
    pub fn end_upload(&mut self) {
        if let Some(g) = self.inflight.as_mut() {
            g.end_upload();
        }
        if let Some(b) = self.bulkhead.as_mut() {
            b.end_upload();
        }
    }
}

/// The shadow refusals of one admitted request: which gates in shadow mode would have
/// refused it. Plain bits (no allocation); the names are read from the request's
/// [`Runtime`] when its access-log line is written.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Shadowed {
    /// The shed gate would have shed it (named by the class it was shed by,
    /// [`Caller::class`]: its route's or its tenant tier's).
    pub shed: bool,
    /// Bit `i`: rate-limit policy `Runtime::rate.list[i]` would have refused it.
    pub rate: u64,
}

impl Shadowed {
    #[inline]
    pub fn is_empty(&self) -> bool {
        !self.shed && self.rate == 0
    }

    /// `(gate, policy)` of each shadow refusal, in gate order: `("shed", CLASS)`, then
    /// `("rate_limit", NAME)` per policy in config order.
    pub fn each<'a>(
        &self,
        priority: Priority,
        rt: &'a Runtime,
        mut f: impl FnMut(&'static str, &'a str),
    ) {
        if self.shed {
            f("shed", priority.as_str());
        }
        let mut bits = self.rate;
        while bits != 0 {
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if let Some(p) = rt.rate.list.get(i) {
                f("rate_limit", &p.name);
            }
        }
    }
}

/// Why [`admit`] stopped: a refusal, or a queue to wait in before going on.
#[derive(Debug)]
pub enum Stop {
    Refused(Refusal),
    /// Over its class's share of the cap, with `[shedding] queue_timeout_ms`: wait for a
    /// slot in the shedder's queue.
    Queue(Rank),
    /// The upstream is full (`max_inflight`) with its `queue_timeout_ms`: wait for room.
    Upstream,
}

impl From<Refusal> for Stop {
    fn from(r: Refusal) -> Self {
        Stop::Refused(r)
    }
}

/// What the shed gate admits: a slot (and whether it was taken over the cap, a shadow
/// refusal), or a place in line.
#[derive(Debug)]
pub enum Slotted {
    Slot(InflightGuard, bool),
    Queue(Rank),
}

/// The concurrency cap by priority class (the adaptive cap moves it): 503 when full, or
/// a wait in the queue with `queue_timeout_ms`.
pub struct Shed<'a> {
    pub shedder: &'a Arc<Shedder>,
    pub retry_after: u64,
    /// `shedding.shadow`: a request the cap would shed is admitted over it (holding a slot
    /// like any other) and counted here, by class (`Priority::ALL` order).
    pub shadow: Option<&'a [IntCounter; 3]>,
    /// `[shedding] queue_timeout_ms > 0`: over the class's share, wait (`max_queue`).
    pub queue: Option<u64>,
    /// The route's own class (`facts.priority` may be a tenant tier's).
    pub route: Priority,
    /// `portcullis_shed_total`.
    pub counts: &'a crate::metrics::ShedMetrics,
}

impl Gate for Shed<'_> {
    type Admit = Slotted;
    #[inline]
    fn check(&self, facts: &RequestFacts<'_>, now_ms: u64) -> Result<Self::Admit, Refusal> {
        let now_secs = now_ms / 1000;
        let rank = Rank {
            class: facts.priority,
            route: self.route,
        };
        // While some wait, a newcomer gets in line (the queue orders them): no barging.
        if self.queue.is_some() && self.shadow.is_none() && self.shedder.waiting() != 0 {
            return Ok(Slotted::Queue(rank));
        }
        if let Some(guard) = self.shedder.try_acquire(facts.priority) {
            self.shedder.share.on_admit(now_secs);
            return Ok(Slotted::Slot(guard, false));
        }
        match (self.shadow, self.queue) {
            (None, Some(_)) => Ok(Slotted::Queue(rank)),
            (None, None) => {
                self.counts
                    .shed(facts.priority, crate::metrics::ShedReason::Cap);
                // Spread the retries by the share of load being shed (docs/src/guide/gray-failure.md).
                Err(Refusal::Shed {
                    retry_after: self.shedder.share.refuse(
                        self.retry_after,
                        now_secs,
                        fastrand::u64(..),
                    ),
                })
            }
            (Some(counters), queue) => {
                // With a queue, a request over the cap would have waited: what shadow
                // mode counts is what the queue would have refused (it was full).
                let refused = match queue {
                    None => true,
                    Some(max_queue) => {
                        let limit = portcullis_policy::shed::class_limit(
                            self.shedder.cap(),
                            facts.priority,
                        );
                        self.shedder.counted().saturating_sub(limit) >= max_queue
                    }
                };
                if refused {
                    counters[facts.priority.index()].inc();
                }
                Ok(Slotted::Slot(self.shedder.acquire_over_cap(), refused))
            }
        }
    }
}

/// `shedding.max_tunnels`: an upgrade request needs a tunnel slot; other requests pass.
pub struct Tunnel<'a> {
    pub tunnels: &'a Arc<Tunnels>,
    pub max: u64,
    pub retry_after: u64,
}

impl Gate for Tunnel<'_> {
    type Admit = Option<TunnelSlot>;
    #[inline]
    fn check(&self, facts: &RequestFacts<'_>, _now_ms: u64) -> Result<Self::Admit, Refusal> {
        if !facts.is_upgrade() {
            return Ok(None);
        }
        match self.tunnels.try_reserve(self.max) {
            Some(slot) => Ok(Some(slot)),
            None => Err(Refusal::TunnelCap {
                retry_after: self.retry_after,
            }),
        }
    }
}

/// An upstream's `max_inflight`: shed (503) when the upstream is full, counted per
/// upstream; with its `queue_timeout_ms`, a wait for room first.
pub struct Bulkhead<'a> {
    pub pool: Option<&'a Pool>,
    pub metrics: &'a Metrics,
    pub retry_after: u64,
}

/// What the bulkhead admits: a slot (none without a cap), or a wait for room.
pub enum Entry {
    Open(Option<BulkheadGuard>),
    Queue,
}

impl Gate for Bulkhead<'_> {
    type Admit = Entry;
    #[inline]
    fn check(&self, _facts: &RequestFacts<'_>, now_ms: u64) -> Result<Self::Admit, Refusal> {
        let Some(pool) = self.pool else {
            return Ok(Entry::Open(None));
        };
        match pool.enter() {
            crate::upstream::Bulkhead::Unlimited => Ok(Entry::Open(None)),
            crate::upstream::Bulkhead::Entered(g) => {
                if pool.balance.adaptive {
                    pool.shared.limit.share.on_admit(now_ms / 1000);
                }
                Ok(Entry::Open(Some(g)))
            }
            crate::upstream::Bulkhead::Full if !pool.balance.queue_timeout.is_zero() => {
                Ok(Entry::Queue)
            }
            crate::upstream::Bulkhead::Full => {
                self.metrics
                    .shed
                    .bulkhead_shed
                    .with_label_values(&[pool.name.as_str()])
                    .inc();
                tracing::debug!(event = "bulkhead_shed", upstream = %pool.name);
                Err(Refusal::Shed {
                    retry_after: pool.shed_retry_after(self.retry_after, now_ms / 1000),
                })
            }
        }
    }
}

/// Run every gate in order (shed, tunnels, bulkhead, the tenant's, rate limit, blame), keeping
/// in `admitted` what each one admitted, until one refuses. A refusal leaves the earlier
/// admissions in `admitted`: the request holds its slots until its refusal is written.
pub fn admit(
    shared: &Shared,
    rt: &Runtime,
    pool: Option<&Pool>,
    facts: &RequestFacts<'_>,
    now_ms: u64,
    admitted: &mut Admitted,
) -> Result<(), Stop> {
    // Who is asking: a tenant's tier may change the request's shedding class. The key is
    // read from the request here at most once, for every gate that needs it.
    let rl = &rt.config.rate_limit;
    let key = caller::RequestKey::of(facts);
    let who = match rt.tenants.as_deref() {
        None => Who::Unresolved,
        Some(registry) => tenant::identify(registry, rl, &key, now_ms)?,
    };
    if let Who::Tenant(t) = who {
        admitted.caller.tenant = Some(Arc::clone(t));
    }
    let route_class = facts.priority;
    let with_class;
    let facts = match who.priority() {
        Some(priority) if priority != facts.priority => {
            with_class = RequestFacts { priority, ..*facts };
            &with_class
        }
        _ => facts,
    };
    admitted.caller.class = Some(facts.priority);
    hold_slots(shared, rt, pool, facts, route_class, now_ms, admitted)?;
    if let Who::Tenant(t) = who {
        admitted.tenant_slot = tenant::TenantGate {
            tenant: t,
            quota: &shared.tenant_quota,
        }
        .check(facts, now_ms)?;
    }
    let rate = RateLimit {
        settings: rl,
        policies: &rt.rate,
        who,
        key: &key,
    }
    .check(facts, now_ms)?;
    admitted.rate = rate.fields;
    admitted.shadow.rate = rate.shadow;
    if let Who::Tenant(t) = who {
        t.note_admitted(now_ms, rl.params.window_secs * 1000);
    }
    let culling = &rt.config.culling;
    if culling.blame_tenants {
        // The blame identity, from the key read above (no second read of the request).
        let blame = crate::cull::blame::identity(
            admitted.caller.tenant.as_deref(),
            rt.tenants.is_some(),
            key.get(rl, now_ms),
            facts.client_ip,
        );
        admitted.caller.blame = blame;
        caller::Blame {
            pool,
            who: blame,
            window_secs: culling.params.window_secs,
        }
        .check(facts, now_ms)?;
    }
    Ok(())
}

/// The gates that hold a slot while the request is in flight and may send it to wait:
/// the shed gate (by `facts.priority`, the caller's class; `route_class` is its route's),
/// the tunnel cap and the upstream's bulkhead, from the one a queue's wait left it at.
fn hold_slots(
    shared: &Shared,
    rt: &Runtime,
    pool: Option<&Pool>,
    facts: &RequestFacts<'_>,
    route_class: Priority,
    now_ms: u64,
    admitted: &mut Admitted,
) -> Result<(), Stop> {
    let shedding = &rt.config.shedding;
    let retry_after = shedding.retry_after_secs;
    if admitted.passed < 1 {
        match (Shed {
            shedder: &shared.shedder,
            retry_after,
            shadow: rt.shed_shadow.as_ref(),
            queue: (!shedding.queue_timeout.is_zero()).then_some(shedding.max_queue),
            route: route_class,
            counts: &shared.metrics.shed,
        })
        .check(facts, now_ms)?
        {
            Slotted::Slot(slot, shed_shadow) => {
                admitted.inflight = Some(slot);
                admitted.shadow.shed = shed_shadow;
            }
            Slotted::Queue(rank) => return Err(Stop::Queue(rank)),
        }
        admitted.passed = 1;
    }
    if admitted.passed < 2 {
        admitted.tunnel = Tunnel {
            tunnels: &shared.tunnels,
            max: shedding.max_tunnels,
            retry_after,
        }
        .check(facts, now_ms)?;
        admitted.passed = 2;
    }
    if admitted.passed < 3 {
        match (Bulkhead {
            pool,
            metrics: &shared.metrics,
            retry_after,
        })
        .check(facts, now_ms)?
        {
            Entry::Open(slot) => admitted.bulkhead = slot,
            Entry::Queue => return Err(Stop::Upstream),
        }
        admitted.passed = 3;
    }
    Ok(())
}
