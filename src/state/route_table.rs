//! Route lookup whose cost does not grow with the number of routes (CONTRACT §17).
//!
//! The routes are sorted (longest prefix first, host-specific before any-host, then those
//! with more of `methods` / `client_cidrs` set, then in file order) and the first one that
//! matches wins: its prefix starts the path, its host, if it has one, is the request's
//! (ASCII case-insensitive), and the request's method and client address are among its
//! `methods` and `client_cidrs` (when it sets them). That winner is found among the routes
//! with the longest matching prefix; at equal length the host-specific ones first; when
//! none of those admits the method or client, the next shorter matching prefix's routes
//! are tried, down to none (the request is unmatched). So the table keeps one compressed
//! prefix tree (radix tree) for the any-host routes and one per host, and a lookup walks
//! the request path down at most two of them: O(path length), whatever the number of
//! routes. A route with conditions adds a walk over the routes sharing its host and
//! prefix (and, when none admits the request, another walk for the shorter prefix).
//! Building is O(total prefix bytes); a tree has at most two nodes per distinct prefix.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::config::Route;

/// No next route in [`RouteTable::next`].
const END: u32 = u32::MAX;

/// The routes of a config, indexed for lookup; indexes are those of `config.routes`.
#[derive(Debug, Default)]
pub struct RouteTable {
    /// Host-specific routes, by lower-case host.
    hosts: HashMap<Box<str>, Radix>,
    /// Routes for any host.
    any: Radix,
    /// When some route has `methods` or `client_cidrs`: for each route, the next one (in
    /// order) of the same host and prefix, or [`END`]. Empty otherwise: the lookup then
    /// never looks at a method or client.
    next: Box<[u32]>,
}

impl RouteTable {
    /// Index `routes`, which must be in the order the config validation sorts them.
    pub fn build(routes: &[Route]) -> Self {
        let mut t = Self::default();
        for (i, r) in routes.iter().enumerate() {
            let tree = match &r.host {
                Some(h) => t.hosts.entry(h.to_ascii_lowercase().into()).or_default(),
                None => &mut t.any,
            };
            tree.insert(r.path_prefix.as_bytes(), i);
        }
        if routes.iter().any(|r| r.conditions() > 0) {
            let mut next = vec![END; routes.len()];
            let mut last: HashMap<(Option<String>, &str), usize> = HashMap::new();
            for (i, r) in routes.iter().enumerate() {
                let key = (
                    r.host.as_ref().map(|h| h.to_ascii_lowercase()),
                    r.path_prefix.as_str(),
                );
                if let Some(prev) = last.insert(key, i) {
                    next[prev] = u32::try_from(i).unwrap_or(END);
                }
            }
            t.next = next.into();
        }
        t
    }

    /// Index of the first route (in `routes` order) matching `host` and `path`, whatever
    /// its `methods` and `client_cidrs`.
    #[inline]
    pub fn lookup(&self, host: &str, path: &str) -> Option<usize> {
        let path = path.as_bytes();
        let specific = if self.hosts.is_empty() {
            None
        } else if host.bytes().any(|b| b.is_ascii_uppercase()) {
            self.hosts
                .get(host.to_ascii_lowercase().as_str())
                .and_then(|t| t.longest(path))
        } else {
            self.hosts.get(host).and_then(|t| t.longest(path))
        };
        match (specific, self.any.longest(path)) {
            (Some((sl, si)), Some((al, _))) if sl >= al => Some(si),
            (Some(_), Some((_, ai))) | (None, Some((_, ai))) => Some(ai),
            (Some((_, si)), None) => Some(si),
            (None, None) => None,
        }
    }

    /// Index of the first route of `routes` (those this table was built from) matching
    /// `host`, `path`, `method` and `client`. Without any route with conditions, one
    /// branch more than [`RouteTable::lookup`].
    #[inline]
    pub fn lookup_request(
        &self,
        routes: &[Route],
        host: &str,
        path: &str,
        method: &http::Method,
        client: Option<IpAddr>,
    ) -> Option<usize> {
        if self.next.is_empty() {
            return self.lookup(host, path);
        }
        self.lookup_conditional(routes, host, path, method, client)
    }

    #[inline(never)]
    fn lookup_conditional(
        &self,
        routes: &[Route],
        host: &str,
        path: &str,
        method: &http::Method,
        client: Option<IpAddr>,
    ) -> Option<usize> {
        let path = path.as_bytes();
        let specific = if self.hosts.is_empty() {
            None
        } else if host.bytes().any(|b| b.is_ascii_uppercase()) {
            self.hosts.get(host.to_ascii_lowercase().as_str())
        } else {
            self.hosts.get(host)
        };
        // The longest prefix each tree may still answer with (`None`: done with it).
        let mut s_lim = specific.map(|_| path.len());
        let mut a_lim = Some(path.len());
        loop {
            let s = specific.zip(s_lim).and_then(|(t, l)| t.longest(&path[..l]));
            let a = a_lim.and_then(|l| self.any.longest(&path[..l]));
            let (len, head, is_specific) = match (s, a) {
                (Some((sl, si)), Some((al, _))) if sl >= al => (sl, si, true),
                (_, Some((al, ai))) => (al, ai, false),
                (Some((sl, si)), None) => (sl, si, true),
                (None, None) => return None,
            };
            let mut i = head;
            loop {
                let r = routes.get(i)?;
                if r.admits(method, client) {
                    return Some(i);
                }
                match self.next.get(i) {
                    Some(&n) if n != END => i = n as usize,
                    _ => break,
                }
            }
            let shorter = len.checked_sub(1);
            if is_specific {
                s_lim = shorter;
            } else {
                a_lim = shorter;
            }
        }
    }
}

/// A compressed prefix tree of byte strings, each with the least route index given for it.
#[derive(Debug, Default)]
struct Radix {
    root: Node,
}

#[derive(Debug, Default)]
struct Node {
    /// The bytes on the edge into this node (empty only at the root).
    label: Box<[u8]>,
    /// The route whose prefix ends here.
    route: Option<usize>,
    /// The first byte of each child's label, sorted (distinct): searched without
    /// touching the children themselves.
    firsts: Vec<u8>,
    /// In the order of `firsts`.
    children: Vec<Node>,
}

fn common_len(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Radix {
    fn insert(&mut self, key: &[u8], index: usize) {
        let mut node = &mut self.root;
        let mut key = key;
        loop {
            let Some(&first) = key.first() else {
                node.route = Some(node.route.map_or(index, |r| r.min(index)));
                return;
            };
            let pos = match node.firsts.binary_search(&first) {
                Ok(pos) => pos,
                Err(pos) => {
                    node.firsts.insert(pos, first);
                    node.children.insert(
                        pos,
                        Node {
                            label: key.into(),
                            route: Some(index),
                            firsts: Vec::new(),
                            children: Vec::new(),
                        },
                    );
                    return;
                }
            };
            let child = &mut node.children[pos];
            let common = common_len(&child.label, key);
            if common < child.label.len() {
                // Split the edge: the shared part becomes a node of its own.
                let head = Node {
                    label: child.label[..common].into(),
                    route: None,
                    firsts: Vec::new(),
                    children: Vec::new(),
                };
                let mut tail = std::mem::replace(child, head);
                tail.label = tail.label[common..].into();
                child.firsts.push(tail.label[0]);
                child.children.push(tail);
            }
            key = &key[common..];
            node = child;
        }
    }

    /// The longest key that starts `path`: (its length, its route).
    #[inline]
    fn longest(&self, path: &[u8]) -> Option<(usize, usize)> {
        let mut node = &self.root;
        let mut depth = 0;
        let mut best = None;
        loop {
            if let Some(r) = node.route {
                best = Some((depth, r));
            }
            let rest = &path[depth..];
            let Some(&b) = rest.first() else {
                return best;
            };
            let Ok(pos) = node.firsts.binary_search(&b) else {
                return best;
            };
            let child = &node.children[pos];
            if !rest.starts_with(&child.label) {
                return best;
            }
            depth += child.label.len();
            node = child;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edge::TrustedProxies;
    use portcullis_policy::shed::Priority;

    fn route(host: Option<&str>, prefix: &str, upstream: usize) -> Route {
        Route {
            host: host.map(str::to_ascii_lowercase),
            path_prefix: prefix.to_string(),
            upstream,
            priority: Priority::Normal,
            headers: crate::edge::HeaderRules::new(),
            methods: Vec::new(),
            client_cidrs: None,
            action: crate::config::RouteAction::Proxy,
            policy_mask: u64::MAX,
        }
    }

    /// The order `config::validate_routes` sorts routes in (a stable sort).
    fn sorted(mut routes: Vec<Route>) -> Vec<Route> {
        routes.sort_by(|a, b| {
            b.path_prefix
                .len()
                .cmp(&a.path_prefix.len())
                .then(b.host.is_some().cmp(&a.host.is_some()))
                .then(b.conditions().cmp(&a.conditions()))
        });
        routes
    }

    /// The lookup this table replaces: the first matching route in order.
    fn linear(routes: &[Route], host: &str, path: &str) -> Option<usize> {
        routes.iter().position(|r| {
            path.starts_with(r.path_prefix.as_str())
                && r.host
                    .as_deref()
                    .is_none_or(|h| h.eq_ignore_ascii_case(host))
        })
    }

    #[test]
    fn examples() {
        let routes = sorted(vec![
            route(None, "/", 0),
            route(None, "/api", 1),
            route(Some("a.test"), "/api", 2),
            route(Some("a.test"), "/api/v2", 3),
            route(None, "/api/v2/x", 4),
            route(None, "/api", 5),
        ]);
        let t = RouteTable::build(&routes);
        let up = |host: &str, path: &str| t.lookup(host, path).map(|i| routes[i].upstream);
        assert_eq!(up("b.test", "/"), Some(0));
        assert_eq!(up("b.test", "/apix"), Some(1), "a prefix, not a segment");
        assert_eq!(up("A.Test", "/api"), Some(2), "host-specific first");
        assert_eq!(up("a.test", "/api/v2/y"), Some(3));
        assert_eq!(up("a.test", "/api/v2/x/1"), Some(4), "longest prefix first");
        assert_eq!(up("b.test", "*"), None);
        assert_eq!(RouteTable::build(&[]).lookup("x", "/"), None);
    }

    /// Property: on many random route sets (shared and nested prefixes, hosts in mixed
    /// case, duplicates) and paths, the table answers exactly what the linear scan does.
    #[test]
    fn same_answer_as_the_linear_scan() {
        let mut rng = fastrand::Rng::with_seed(0x5eed_4013);
        let alphabet = [b'a', b'b', b'/', b'.', b'%', b'\xc3', b'\xa9'];
        let hosts = ["a.test", "B.test", "c.TEST", "xn--caf-dma.test"];
        let word = |rng: &mut fastrand::Rng, max: usize| -> String {
            let n = rng.usize(0..=max);
            let bytes: Vec<u8> = (0..n)
                .map(|_| alphabet[rng.usize(0..alphabet.len())])
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        for round in 0..400 {
            let n = rng.usize(0..40);
            let routes: Vec<Route> = (0..n)
                .map(|i| {
                    let host = rng.bool().then(|| hosts[rng.usize(0..hosts.len())]);
                    let prefix = format!("/{}", word(&mut rng, 6));
                    route(host, &prefix, i)
                })
                .collect();
            let routes = sorted(routes);
            let t = RouteTable::build(&routes);
            for _ in 0..200 {
                let path = format!("/{}", word(&mut rng, 9));
                let host = match rng.usize(0..6) {
                    0..=3 => hosts[rng.usize(0..hosts.len())].to_string(),
                    4 => hosts[rng.usize(0..hosts.len())].to_ascii_uppercase(),
                    _ => "other.test".to_string(),
                };
                assert_eq!(
                    t.lookup(&host, &path),
                    linear(&routes, &host, &path),
                    "round {round}: host {host:?} path {path:?} routes {:?}",
                    routes
                        .iter()
                        .map(|r| (&r.host, &r.path_prefix))
                        .collect::<Vec<_>>()
                );
            }
        }
    }

    /// Property: with `methods` and `client_cidrs` on some routes, the table answers what
    /// the first matching route in order is, falling back to shorter prefixes.
    #[test]
    fn conditions_same_answer_as_the_linear_scan() {
        let mut rng = fastrand::Rng::with_seed(0x5eed_0058);
        let methods = [http::Method::GET, http::Method::POST, http::Method::DELETE];
        let nets = ["10.0.0.0/8", "192.168.1.0/24", "::1"];
        let clients: [Option<IpAddr>; 4] = [
            "10.1.2.3".parse().ok(),
            "192.168.1.9".parse().ok(),
            "::1".parse().ok(),
            None,
        ];
        let prefixes = ["/", "/a", "/a/b", "/ab", "/a/b/c"];
        let hosts = ["a.test", "b.test"];
        for round in 0..300 {
            let n = rng.usize(0..25);
            let routes: Vec<Route> = (0..n)
                .map(|i| {
                    let host = rng.bool().then(|| hosts[rng.usize(0..hosts.len())]);
                    let mut r = route(host, prefixes[rng.usize(0..prefixes.len())], i);
                    if rng.usize(0..3) == 0 {
                        r.methods = vec![methods[rng.usize(0..methods.len())].clone()];
                    }
                    if rng.usize(0..3) == 0 {
                        r.client_cidrs =
                            TrustedProxies::parse(&[nets[rng.usize(0..nets.len())]]).ok();
                    }
                    r
                })
                .collect();
            let routes = sorted(routes);
            let t = RouteTable::build(&routes);
            for _ in 0..100 {
                let host = hosts[rng.usize(0..hosts.len())];
                let path = ["/", "/a", "/a/b/c/d", "/abc", "/x", "/a/"][rng.usize(0..6)];
                let m = &methods[rng.usize(0..methods.len())];
                let c = clients[rng.usize(0..clients.len())];
                let want = routes.iter().position(|r| {
                    path.starts_with(r.path_prefix.as_str())
                        && r.host.as_deref().is_none_or(|h| h == host)
                        && r.admits(m, c)
                });
                assert_eq!(
                    t.lookup_request(&routes, host, path, m, c),
                    want,
                    "round {round}: {host} {path} {m} {c:?}"
                );
            }
        }
    }

    #[test]
    fn many_routes_build_and_answer() {
        let routes = sorted(
            (0..200_000)
                .map(|i| route(None, &format!("/svc/{i}/api"), i))
                .collect(),
        );
        let t = RouteTable::build(&routes);
        let i = t.lookup("x", "/svc/123456/api/v1").expect("a route");
        assert_eq!(routes[i].path_prefix, "/svc/123456/api");
        assert_eq!(t.lookup("x", "/svc/123456/ap"), None);
    }
}
