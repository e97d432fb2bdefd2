//! The backends one request already tried (retries go elsewhere).

use std::net::SocketAddr;

/// Backends a request already tried, without a heap allocation for the
/// first four.
#[derive(Debug, Default)]
pub struct Tried {
    inline: [Option<SocketAddr>; 4],
    more: Vec<SocketAddr>,
}

impl Tried {
    pub fn push(&mut self, addr: SocketAddr) {
        match self.inline.iter_mut().find(|s| s.is_none()) {
            Some(slot) => *slot = Some(addr),
            None => self.more.push(addr),
        }
    }

    /// Allow `addr` again (a stale pooled connection is not the backend's fault).
    pub fn forget(&mut self, addr: &SocketAddr) {
        for slot in &mut self.inline {
            if slot.as_ref() == Some(addr) {
                *slot = None;
            }
        }
        self.more.retain(|a| a != addr);
    }

    #[inline]
    pub fn contains(&self, addr: &SocketAddr) -> bool {
        self.inline.iter().any(|s| s.as_ref() == Some(addr)) || self.more.contains(addr)
    }
}
