//! Sources named by PROXY headers, filed by the connection's peer address
//! (`ip:port` of the balancer's connection, unique while it is open), for the
//! requests that cannot reach their connection's [`super::Conn`]: HTTP/2
//! streams, which Pingora serves inside its h2 session (its `Digest` has no
//! place for them: the h2 stream sees only the socket, TLS and timing digests).
//! Only connections that carried a PROXY header are filed, and each is removed
//! when it closes. The registry is owned by the runtime state
//! (`state::Shared::proxied`), not by the process.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};

/// The PROXY sources of the open connections, by peer address.
#[derive(Debug, Default)]
pub struct ProxiedSources {
    filed: Mutex<HashMap<SocketAddr, IpAddr>>,
}

impl ProxiedSources {
    fn filed(&self) -> MutexGuard<'_, HashMap<SocketAddr, IpAddr>> {
        self.filed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The source filed for the connection from `peer`, if any.
    pub fn lookup(&self, peer: SocketAddr) -> Option<IpAddr> {
        self.filed().get(&peer).copied()
    }

    /// File `source` for the connection from `peer` until the returned
    /// [`Filed`] is dropped (when the connection ends).
    pub fn file(self: &Arc<Self>, peer: SocketAddr, source: IpAddr) -> Filed {
        self.filed().insert(peer, source);
        Filed {
            sources: Arc::clone(self),
            peer,
        }
    }
}

/// A filed source; removed from its registry on drop.
#[derive(Debug)]
pub struct Filed {
    sources: Arc<ProxiedSources>,
    peer: SocketAddr,
}

impl Drop for Filed {
    fn drop(&mut self) {
        self.sources.filed().remove(&self.peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filed_while_held_and_gone_after() {
        let sources = Arc::new(ProxiedSources::default());
        let peer: SocketAddr = "192.0.2.1:40000".parse().expect("addr");
        let source: IpAddr = "203.0.113.7".parse().expect("ip");
        assert_eq!(sources.lookup(peer), None);
        let f = sources.file(peer, source);
        assert_eq!(sources.lookup(peer), Some(source));
        let other: SocketAddr = "192.0.2.1:40001".parse().expect("addr");
        assert_eq!(sources.lookup(other), None, "by ip and port");
        drop(f);
        assert_eq!(sources.lookup(peer), None);
    }

    /// Two runtime states do not see each other's connections.
    #[test]
    fn each_state_owns_its_registry() {
        let (a, b) = (
            Arc::new(ProxiedSources::default()),
            Arc::new(ProxiedSources::default()),
        );
        let peer: SocketAddr = "192.0.2.1:40000".parse().expect("addr");
        let _f = a.file(peer, "203.0.113.7".parse().expect("ip"));
        assert!(a.lookup(peer).is_some());
        assert_eq!(b.lookup(peer), None);
    }
}
