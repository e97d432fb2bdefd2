//! Instructions of one decision on a shared key of a fleet member (n = 100), for
//! callgrind: `share_cost N [LIMIT]` makes N decisions (`peek`: the decision path without
//! counting) on one key. With the default limit (1,000,000) the fleet share has room; with
//! 50 (R / n = 0.5) every decision is the share remainder's draw (about half the runs admit,
//! the draw being random per run). Per decision: the difference of two runs, over the
//! difference of their N:
//!
//! ```text
//! cargo build --release -p portcullis-policy --example share_cost
//! for n in 100000 200000; do valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$n \
//!   target/release/examples/share_cost $n; done
//! ```
use portcullis_policy::ratelimit::{
    Batch, CounterStore, Limiter, LocalStore, RateLimitParams, SyncResult, SIM_T0,
};
use std::hint::black_box;

struct Fleet(LocalStore);

#[async_trait::async_trait]
impl CounterStore for Fleet {
    async fn sync(&self, batch: Batch<'_>) -> SyncResult {
        self.0.sync(batch).await
    }
    fn kind(&self) -> &'static str {
        "cost"
    }
    fn instances(&self) -> Option<u64> {
        Some(100)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    // A second argument: the limit (default 1,000,000: the share has room; 50: R / n = 0.5,
    // every decision is the draw's).
    let limit: u64 = std::env::args()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let store = Fleet(LocalStore::new());
    let l = Limiter::new(RateLimitParams {
        limit,
        ..Default::default()
    });
    let t = SIM_T0 + 1_000;
    l.flush_once(&store, t).await.ok();
    if limit >= 1_000 {
        for _ in 0..10 {
            l.check("hot", t + 1);
        }
        l.flush_once(&store, t + 50).await.ok();
    }
    assert_eq!(l.instances(), 100);
    let mut ok = 0u64;
    for i in 0..n {
        ok += u64::from(
            black_box(&l)
                .peek(black_box("hot"), t + 60 + i % 1_000)
                .is_allowed(),
        );
    }
    println!("{ok} of {n} within the share");
}
