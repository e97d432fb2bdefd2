//! Fleet accuracy at scale: one hot key on n simulated instances (the policy crate's own
//! limiter and flush protocol, a synthetic clock, an in-process store reporting n live
//! instances), printed as a markdown table of admitted ÷ limit per fixed window.
//!
//! `cargo run -p portcullis-policy --release --example fleet_sim`
//!
//! Options (all optional): `--instances 2,4,16,100,1000` `--loads 4,100` `--windows 3`
//! `--limit 600` `--window-secs 60` `--flush-ms 50` `--seed 1`
//! `--spreads even,skewed,joining`.

use portcullis_policy::ratelimit::{simulate_fleet, FleetSim, Spread};

fn list(v: &str) -> Vec<u64> {
    v.split(',').filter_map(|x| x.trim().parse().ok()).collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut instances = vec![2, 4, 16, 100, 1000];
    let mut loads = vec![4, 100];
    let mut spreads = vec![Spread::Even, Spread::Skewed, Spread::Joining];
    let (mut windows, mut limit, mut window_secs, mut flush_ms, mut seed) = (3, 600, 60, 50, 1);
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let (k, v) = (
            pair[0].as_str(),
            pair.get(1).map(String::as_str).unwrap_or(""),
        );
        let one = || {
            v.parse::<u64>()
                .unwrap_or_else(|_| panic!("{k}: not a number: {v}"))
        };
        match k {
            "--instances" => instances = list(v),
            "--loads" => loads = list(v),
            "--windows" => windows = one(),
            "--limit" => limit = one(),
            "--window-secs" => window_secs = one(),
            "--flush-ms" => flush_ms = one(),
            "--seed" => seed = one(),
            "--spreads" => {
                spreads = v
                    .split(',')
                    .map(|x| match x.trim() {
                        "even" => Spread::Even,
                        "skewed" => Spread::Skewed,
                        "joining" => Spread::Joining,
                        other => panic!("--spreads: unknown spread {other}"),
                    })
                    .collect()
            }
            _ => panic!("unknown option {k}"),
        }
    }
    println!(
        "limit {limit} per {window_secs} s window, flushes every {flush_ms} ms (staggered), \
         {windows} full windows after a warm-up window, seed {seed}\n"
    );
    println!("| instances | load (× limit) | spread | warm-up window | full windows: mean | full windows: max | run time |");
    println!("|---:|---:|---|---:|---:|---:|---:|");
    for &n in &instances {
        for &load in &loads {
            for &spread in &spreads {
                let cfg = FleetSim {
                    instances: n,
                    limit,
                    window_secs,
                    flush_ms,
                    load,
                    spread,
                    windows,
                    seed,
                };
                let t = std::time::Instant::now();
                let run = simulate_fleet(&cfg).await;
                let r = |x: u64| x as f64 / limit as f64;
                let mean = run.full.iter().sum::<u64>() as f64 / run.full.len().max(1) as f64;
                let max = run.full.iter().copied().max().unwrap_or(0);
                println!(
                    "| {n} | {load} | {} | {:.3} | {:.3} | {:.3} | {:.1} s |",
                    match spread {
                        Spread::Even => "even",
                        Spread::Skewed => "skewed",
                        Spread::Joining => "joining",
                    },
                    r(run.warmup),
                    mean / limit as f64,
                    r(max),
                    t.elapsed().as_secs_f64()
                );
            }
        }
    }
}
