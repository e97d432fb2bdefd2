//! Instructions per call of the per-request recorders issue 44 adds, counted with
//! callgrind as a two-run difference (start-up cancels out):
//!
//! ```text
//! cargo build --release -p portcullis-policy --example window_cost
//! for mode in base latency admit; do for n in 100000 1100000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$mode.$n \
//!     target/release/examples/window_cost $mode $n; done; done
//! # (Ir(n2) − Ir(n1)) / 1e6 per mode; subtract `base` (the loop and the sample generator)
//! ```
//!
//! `latency`: `LatencyWindow::record` (the latency outlier rule's window, one per answered
//! request with `outlier = "latency"`). `admit`: `ShedShare::on_admit` while nothing is shed
//! (every admitted request through the shed gate).

use portcullis_policy::cull::LatencyWindow;
use portcullis_policy::shed::spread::ShedShare;
use std::hint::black_box;

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "latency".into());
    let n: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    // Behind `black_box`, so the compiler cannot see that nothing else touches them.
    let window = black_box(LatencyWindow::new(60));
    let share = black_box(ShedShare::default());
    let (window, share) = (black_box(&window), black_box(&share));
    let t0 = 1_700_000_000u64;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in 0..n {
        // A sample latency (up to ~0.26 s) and a clock advancing one second per 1000 calls.
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let us = black_box((x >> 40) & 0x3_ffff);
        let now = black_box(t0 + i / 1000);
        match mode.as_str() {
            "latency" => window.record(now, us),
            "admit" => share.on_admit(now),
            _ => {}
        }
    }
    println!("{:?}", window.summary(t0 + n / 1000));
}
