//! An upstream's line of requests waiting for room (a backend under its `max_conn`, a
//! bulkhead slot).

use std::sync::atomic::{AtomicU64, Ordering};

/// Requests waiting for room in an upstream (a backend under its `max_conn`, a bulkhead
/// slot): told whenever an attempt or a bulkhead slot is given back while some wait.
#[derive(Debug, Default)]
pub struct Room {
    waiting: AtomicU64,
    notify: tokio::sync::Notify,
}

/// One request's place in a [`Room`]'s line: counted while held.
pub struct RoomPlace<'a>(&'a Room);

impl Drop for RoomPlace<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Room {
    /// Join the line, unless `max` already wait.
    pub fn join(&self, max: u64) -> Option<RoomPlace<'_>> {
        let mut cur = self.waiting.load(Ordering::SeqCst);
        loop {
            if cur >= max {
                return None;
            }
            match self.waiting.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return Some(RoomPlace(self)),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Resolves at the next [`Room::free`] (enable it before looking for room).
    pub fn freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Room was given back: with requests waiting, each looks again.
    #[inline]
    pub fn free(&self) {
        if self.waiting.load(Ordering::SeqCst) != 0 {
            self.notify.notify_waiters();
        }
    }

    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::SeqCst)
    }
}
