//! Client load: many requests at once, and the windows they must land in.

use std::sync::Arc;
use std::thread;


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

