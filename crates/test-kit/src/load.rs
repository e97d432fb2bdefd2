//! Client load: many requests at once, and the windows they must land in.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::*;

/// Pause between two requests of one load thread (pacing, not synchronisation).
const PACE: Duration = Duration::from_millis(4);

/// Unix time in ms (rate-limit windows are aligned to the Unix epoch).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// Polls the clock until the elapsed part of the current `window_ms` window lies in
/// `[lo, hi]` ms; returns that window's index.
pub fn wait_window_phase(window_ms: u64, lo: u64, hi: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_millis(3 * window_ms);
    loop {
        let t = now_ms();
        let e = t % window_ms;
        if (lo..=hi).contains(&e) {
            return t / window_ms;
        }
        assert!(
            Instant::now() < deadline,
            "clock never reached phase [{lo}, {hi}]"
        );
        // Sleep at most until the phase opens (short naps; this is a clock poll).
        let wait = if e < lo { lo - e } else { window_ms - e + lo };
        thread::sleep(Duration::from_millis(wait.clamp(1, 20)));
    }
}

/// Polls the clock until Unix time `t_ms`.
pub fn wait_until_ms(t_ms: u64) {
    loop {
        let now = now_ms();
        if now >= t_ms {
            return;
        }
        thread::sleep(Duration::from_millis((t_ms - now).min(20)));
    }
}

/// Runs `thunk` on `n` threads at once (released together) and collects the results in order.
pub fn concurrently<T: Send + 'static>(
    n: usize,
    thunk: impl Fn(usize) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let thunk = Arc::new(thunk);
    let barrier = Arc::new(std::sync::Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let t = thunk.clone();
            let b = barrier.clone();
            thread::spawn(move || {
                b.wait();
                t(i)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("worker thread panicked"))
        .collect()
}

#[derive(Debug, Clone)]
pub struct Sample {
    pub proxy: usize,
    pub start: Instant,
    pub end: Instant,
    /// `None`: transport error (no complete response).
    pub status: Option<u16>,
    /// `x-backend` of the response.
    pub backend: Option<String>,
    pub error: Option<String>,
}

impl Sample {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }

    /// A 500 passed through from backend `name` (its own failure, not the proxy's).
    pub fn is_500_from(&self, name: &str) -> bool {
        self.status == Some(500) && self.backend.as_deref() == Some(name)
    }
}

/// One paced keep-alive client thread per proxy address, recording every response.
pub struct Load {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    handles: Vec<JoinHandle<()>>,
}

impl Load {
    pub fn start(addrs: &[String]) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let handles = addrs
            .iter()
            .enumerate()
            .map(|(proxy, addr)| {
                let (stop, samples, addr) = (stop.clone(), samples.clone(), addr.clone());
                thread::spawn(move || {
                    let mut conn: Option<Conn> = None;
                    let mut n = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        n += 1;
                        let start = Instant::now();
                        let res = match conn.as_mut() {
                            Some(c) => Ok(c),
                            None => Conn::open(&addr).map(|c| conn.insert(c)),
                        }
                        .and_then(|c| c.request("GET", &format!("/load/{n}"), &[], b""));
                        let end = Instant::now();
                        let sample = match res {
                            Ok(r) => {
                                if r.header("connection")
                                    .is_some_and(|v| v.eq_ignore_ascii_case("close"))
                                {
                                    conn = None;
                                }
                                Sample {
                                    proxy,
                                    start,
                                    end,
                                    status: Some(r.status),
                                    backend: r.header("x-backend").map(String::from),
                                    error: None,
                                }
                            }
                            Err(e) => {
                                conn = None;
                                Sample {
                                    proxy,
                                    start,
                                    end,
                                    status: None,
                                    backend: None,
                                    error: Some(e.to_string()),
                                }
                            }
                        };
                        lock(&samples).push(sample);
                        thread::sleep(PACE);
                    }
                })
            })
            .collect();
        Load {
            stop,
            samples,
            handles,
        }
    }

    pub fn count(&self, f: impl Fn(&Sample) -> bool) -> usize {
        lock(&self.samples).iter().filter(|s| f(s)).count()
    }

    /// Waits until `f` holds for at least `n` recorded samples.
    pub fn wait_for(&self, n: usize, what: &str, f: impl Fn(&Sample) -> bool) {
        let ok = wait_until(DEADLINE, || self.count(&f) >= n);
        assert!(
            ok,
            "load: fewer than {n} samples {what} within {DEADLINE:?} (have {})",
            self.count(&f)
        );
    }

    /// Waits until every proxy has `n` successful responses to requests started after
    /// its instant in `after`.
    pub fn wait_ok_after(&self, after: &[Instant], n: usize) {
        for (i, t) in after.iter().enumerate() {
            let t = *t;
            self.wait_for(n, &format!("ok through proxy {i} after {t:?}"), |s| {
                s.proxy == i && s.start > t && s.ok()
            });
        }
    }

    pub fn samples(&self) -> Vec<Sample> {
        lock(&self.samples).clone()
    }

    pub fn finish(mut self) -> Vec<Sample> {
        self.halt();
        self.samples()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.halt();
    }
}

/// One request of a [`KeyedLoad`].
#[derive(Debug, Clone)]
pub struct KeyedSample {
    /// Index of the address (proxy) it went through.
    pub proxy: usize,
    /// The `x-api-key` it carried.
    pub key: String,
    /// Unix ms when it was sent and when the answer (or error) arrived.
    pub send_ms: u64,
    pub recv_ms: u64,
    /// 0 = transport error.
    pub status: u16,
    pub latency: Duration,
    /// The transport error, if any (status 0).
    pub error: Option<String>,
}

/// Paced rate-limit load: per address, `threads` keep-alive client threads, thread `t`
/// sending `x-api-key: keys[t % keys.len()]` at `rate` req/s until `until_ms` (Unix ms)
/// or [`KeyedLoad::finish`]. Every answer is timestamped, so per-window admissions can be
/// computed from the wall clock (windows are aligned to the Unix epoch).
pub struct KeyedLoad {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<Vec<KeyedSample>>>,
}

impl KeyedLoad {
    pub fn start(
        addrs: &[String],
        threads: usize,
        rate: f64,
        keys: &[&str],
        until_ms: u64,
    ) -> KeyedLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for (proxy, addr) in addrs.iter().enumerate() {
            for t in 0..threads {
                let (addr, stop) = (addr.clone(), stop.clone());
                let key = keys[t % keys.len()].to_string();
                handles.push(thread::spawn(move || {
                    keyed_loop(proxy, &addr, &key, rate, until_ms, &stop)
                }));
            }
        }
        KeyedLoad { stop, handles }
    }

    /// Stops the threads and returns every sample, by send time.
    pub fn finish(self) -> Vec<KeyedSample> {
        self.stop.store(true, Ordering::SeqCst);
        self.join()
    }

    /// Waits for the threads to reach `until_ms`.
    pub fn join(self) -> Vec<KeyedSample> {
        let mut all = Vec::new();
        for h in self.handles {
            all.extend(h.join().expect("load thread panicked"));
        }
        all.sort_by_key(|s| s.send_ms);
        all
    }
}

fn keyed_loop(
    proxy: usize,
    addr: &str,
    key: &str,
    rate: f64,
    until_ms: u64,
    stop: &AtomicBool,
) -> Vec<KeyedSample> {
    let interval = Duration::from_secs_f64(1.0 / rate);
    let mut out = Vec::new();
    let mut conn: Option<Conn> = None;
    let mut next = Instant::now();
    loop {
        // Pacing; after a stall catch up on missed slots unless more than 2 s behind.
        let now = Instant::now();
        if next > now {
            thread::sleep(next - now);
        } else if now - next > Duration::from_secs(2).max(10 * interval) {
            next = now;
        }
        next += interval;
        if stop.load(Ordering::SeqCst) || now_ms() >= until_ms {
            break;
        }
        let send_ms = now_ms();
        let t = Instant::now();
        let res = match conn.as_mut() {
            Some(c) => c.request("GET", "/", &[("x-api-key", key)], b""),
            None => Conn::open_with_timeout(addr, Duration::from_secs(5)).and_then(|mut c| {
                let r = c.request("GET", "/", &[("x-api-key", key)], b"");
                conn = Some(c);
                r
            }),
        };
        let latency = t.elapsed();
        let (status, error) = match res {
            Ok(r) => {
                if r.header("connection")
                    .is_some_and(|v| v.eq_ignore_ascii_case("close"))
                {
                    conn = None;
                }
                (r.status, None)
            }
            Err(e) => {
                conn = None;
                (0, Some(e.to_string()))
            }
        };
        out.push(KeyedSample {
            proxy,
            key: key.to_string(),
            send_ms,
            recv_ms: now_ms(),
            status,
            latency,
            error,
        });
    }
    out
}

/// Admitted (200) requests decided in window `w` of `window_ms`, as (definitely, possibly):
/// the proxy decided between send and receive, so a request is definitely in the window
/// when both instants are, and possibly when its [send, receive] interval overlaps it.
pub fn admitted_in_window(samples: &[KeyedSample], window_ms: u64, w: u64) -> (u64, u64) {
    let (start, end) = (w * window_ms, (w + 1) * window_ms);
    let ok = samples.iter().filter(|s| s.status == 200);
    let definitely = ok
        .clone()
        .filter(|s| s.send_ms >= start && s.recv_ms < end)
        .count();
    let possibly = ok.filter(|s| s.recv_ms >= start && s.send_ms < end).count();
    (definitely as u64, possibly as u64)
}
