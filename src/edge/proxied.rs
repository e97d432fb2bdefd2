//! Sources named by PROXY headers, filed by the connection's peer address
//! (`ip:port` of the balancer's connection, unique while it is open), for the
//! requests that cannot reach their connection's [`super::Conn`]: HTTP/2
//! streams, which Pingora serves inside its h2 session. Only connections that
//! carried a PROXY header are filed, and each is removed when it closes.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{LazyLock, Mutex, MutexGuard};

static FILED: LazyLock<Mutex<HashMap<SocketAddr, IpAddr>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn filed() -> MutexGuard<'static, HashMap<SocketAddr, IpAddr>> {
    FILED.lock().unwrap_or_else(|e| e.into_inner())
}

/// The source filed for the connection from `peer`, if any.
pub fn lookup(peer: SocketAddr) -> Option<IpAddr> {
    filed().get(&peer).copied()
}

/// A filed source; removed from the registry on drop (when the connection ends).
#[derive(Debug)]
pub struct Filed {
    peer: SocketAddr,
}

impl Filed {
    pub fn new(peer: SocketAddr, source: IpAddr) -> Self {
        filed().insert(peer, source);
        Self { peer }
    }
}

impl Drop for Filed {
    fn drop(&mut self) {
        filed().remove(&self.peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filed_while_held_and_gone_after() {
        let peer: SocketAddr = "192.0.2.1:40000".parse().expect("addr");
        let source: IpAddr = "203.0.113.7".parse().expect("ip");
        assert_eq!(lookup(peer), None);
        let f = Filed::new(peer, source);
        assert_eq!(lookup(peer), Some(source));
        let other: SocketAddr = "192.0.2.1:40001".parse().expect("addr");
        assert_eq!(lookup(other), None, "by ip and port");
        drop(f);
        assert_eq!(lookup(peer), None);
    }
}
