//! Route lookup whose cost does not grow with the number of routes (CONTRACT §17).
//!
//! The routes are sorted (longest prefix first, host-specific before any-host, then in
//! file order) and the first one that matches wins: its prefix starts the path, and its
//! host, if it has one, is the request's (ASCII case-insensitive). That winner is the
//! route with the longest matching prefix; at equal length a host-specific one, and
//! among routes with the same host and prefix the first. So the table keeps one
//! compressed prefix tree (radix tree) for the any-host routes and one per host, and a
//! lookup walks the request path down at most two of them: O(path length), whatever
//! the number of routes. Building is O(total prefix bytes); a tree has at most two nodes
//! per distinct prefix.

use std::collections::HashMap;

use crate::config::Route;

/// The routes of a config, indexed for lookup; indexes are those of `config.routes`.
#[derive(Debug, Default)]
pub struct RouteTable {
    /// Host-specific routes, by lower-case host.
    hosts: HashMap<Box<str>, Radix>,
    /// Routes for any host.
    any: Radix,
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
        t
    }

    /// Index of the first route (in `routes` order) matching `host` and `path`.
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
    use crate::shed::Priority;

    fn route(host: Option<&str>, prefix: &str, upstream: usize) -> Route {
        Route {
            host: host.map(str::to_ascii_lowercase),
            path_prefix: prefix.to_string(),
            upstream,
            priority: Priority::Normal,
            headers: crate::edge::HeaderRules::new(),
        }
    }

    /// The order `config::validate_routes` sorts routes in (a stable sort).
    fn sorted(mut routes: Vec<Route>) -> Vec<Route> {
        routes.sort_by(|a, b| {
            b.path_prefix
                .len()
                .cmp(&a.path_prefix.len())
                .then(b.host.is_some().cmp(&a.host.is_some()))
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
