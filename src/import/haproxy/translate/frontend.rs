//! A `frontend` (or a `listen`'s front part): its listeners, its ACLs and rules as routes,
//! and its rate limits.

use super::{bind_addr, dir_name, verdict, Cx, Settings};
use crate::import::haproxy::acl::named_acls;
use crate::import::haproxy::acl::Acls;
use crate::import::haproxy::parse::Directive;
use crate::import::haproxy::parse::Section;
use crate::import::haproxy::report::Status;
use Status::{Approximated as Approx, Translated as Ok_, Unsupported as Unsup};

impl Cx<'_> {
    /// A `frontend` (or a `listen`): its listeners, client settings and routes; a stats
    /// listener is the admin listener. `first`: no frontend came before it.
    pub(super) fn frontend(&mut self, s: &Section, st: &Settings, first: &mut bool) {
        if !st.http {
            self.all_unsupported(
                s,
                "a mode tcp section (tcp is HAProxy's default mode): portcullis proxies HTTP only",
            );
            return;
        }
        let stats = s.directives.iter().any(|d| d.kw() == "stats");
        let acls: Acls = named_acls(&s.directives);
        self.report_acls(s, &acls);
        let binds = self.binds(s, stats);
        if stats {
            self.stats(s);
        }
        if binds.is_empty() && stats {
            self.rep.put(s.line, &s.keyword, Ok_);
            return;
        }
        self.client_settings(st);
        for (b, line, ssl) in binds {
            if ssl {
                self.out.tls_listen.push((b, line));
            } else {
                self.out.listen.push((b, line));
            }
        }
        if !*first {
            self.rep.put(s.line, &s.keyword, Approx(
                "portcullis's routes serve every listener: this frontend's rules are merged with the first one's".into(),
            ));
        } else {
            self.rep.put(s.line, &s.keyword, Ok_);
        }
        *first = false;
        let ef = st.errorfiles.clone();
        self.errorfiles(&ef);
        self.rules(s, st, &acls);
    }

    /// Each `acl` line's verdict.
    fn report_acls(&mut self, s: &Section, acls: &Acls) {
        for d in s.directives.iter().filter(|d| d.kw() == "acl") {
            let status = match acls
                .get(d.arg(1))
                .and_then(|v| v.iter().find(|(l, _)| *l == d.line))
            {
                Some((_, Ok(p))) => match &p.approx {
                    Some(a) => Approx(a.clone()),
                    None => Ok_,
                },
                Some((_, Err(e))) => Unsup(e.clone()),
                None => Unsup("unreadable ACL".into()),
            };
            self.rep.put(d.line, "acl", status);
        }
    }

    /// The frontend's listeners (address, line, TLS): the `listen NAME ADDR` header's and
    /// the `bind` lines'. A stats listener's first cleartext address is the admin listener.
    fn binds(&mut self, s: &Section, stats: bool) -> Vec<(String, usize, bool)> {
        let mut binds: Vec<(String, usize, bool)> = Vec::new();
        if let Some(b) = &s.header_bind {
            binds.push((b.clone(), s.line, false));
        }
        let stats_only = stats
            && !s.directives.iter().any(|x| {
                x.kw() == "default_backend" || x.kw() == "use_backend" || x.kw() == "server"
            });
        for d in s.directives.iter().filter(|d| d.kw() == "bind") {
            let ssl = d.args.iter().any(|a| a == "ssl");
            let mut notes = self.bind_options(d);
            let mut any = false;
            for a in d.arg(1).split(',') {
                match bind_addr(a) {
                    Some(addr) => {
                        if stats_only && !ssl && self.out.admin_listen.is_none() {
                            self.out.admin_listen = Some((addr, d.line));
                        } else {
                            binds.push((addr, d.line, ssl));
                        }
                        any = true;
                    }
                    None => notes.push(format!("address '{a}' is not translated")),
                }
            }
            let status = if !any {
                Unsup(notes.join("; "))
            } else {
                verdict(&notes)
            };
            self.rep.put(d.line, "bind", status);
        }
        binds
    }

    /// A `bind` line's options: certificates and the minimum TLS version; the notes of the
    /// options not translated.
    fn bind_options(&mut self, d: &Directive) -> Vec<String> {
        let mut notes = Vec::new();
        let mut i = 2;
        while i < d.args.len() {
            match d.arg(i) {
                "ssl" => {}
                "crt" => {
                    i += 1;
                    let mut path = d.arg(i).to_string();
                    if !path.starts_with('/') && !self.crt_base.is_empty() {
                        path = format!("{}/{path}", self.crt_base);
                    }
                    self.out.certs.push((path, d.line));
                }
                "alpn" => i += 1,
                "ssl-min-ver" => {
                    i += 1;
                    match d.arg(i) {
                        "TLSv1.2" => self.out.min_tls = Some("1.2".into()),
                        "TLSv1.3" => self.out.min_tls = Some("1.3".into()),
                        v => notes.push(format!("ssl-min-ver {v}")),
                    }
                }
                "v4v6" | "v6only" => {}
                o => notes.push(format!("bind option '{o}' is not translated")),
            }
            i += 1;
        }
        notes
    }

    /// A stats listener's `stats` lines: the admin listener's page is portcullis's own.
    fn stats(&mut self, s: &Section) {
        for d in s.directives.iter().filter(|d| d.kw() == "stats") {
            let st = match d.arg(1) {
                "enable" => Ok_,
                "uri" => Approx(format!(
                    "the status page is /status on [server] admin_listen (with /metrics, /backends), not {}",
                    d.arg(2)
                )),
                "refresh" => Approx("the status page refreshes itself every 2 s".into()),
                "auth" | "realm" => Unsup(
                    "the admin page's GET endpoints have no password: bind admin_listen to a private address".into(),
                ),
                "admin" => Approx("POST endpoints need admin_token (or a loopback admin_listen)".into()),
                "hide-version" | "show-legends" | "show-node" | "show-desc" => {
                    Approx("the page shows what it shows".into())
                }
                _ => Unsup("no portcullis equivalent".into()),
            };
            self.rep.put(d.line, &dir_name(d), st);
        }
    }

    /// The client-side timeouts and maxconn, from the first frontend that has them
    /// (portcullis's are for every listener).
    fn client_settings(&mut self, st: &Settings) {
        for (name, (ms, line)) in &st.timeouts {
            let slot = match name.as_str() {
                "client" => Some(&mut self.out.client_body_ms),
                "http-request" => Some(&mut self.out.client_header_ms),
                "http-keep-alive" => Some(&mut self.out.idle_ms),
                _ => None,
            };
            if let Some(slot) = slot {
                if slot.is_none() {
                    *slot = Some(*ms);
                } else if *slot != Some(*ms) {
                    self.rep.put(*line, &format!("timeout {name}"), Approx(
                        "portcullis's client timeouts are for every listener: the first frontend's is used".into(),
                    ));
                }
            }
            if name == "tunnel" && self.out.tunnel_s.is_none() {
                self.out.tunnel_s = Some(ms.div_ceil(1000).max(1));
            }
        }
        if let Some((n, line)) = st.maxconn {
            match self.out.max_connections {
                None => self.out.max_connections = Some((n, line)),
                Some((m, _)) if m == n => {}
                Some(_) => {}
            }
            self.rep.put(line, "maxconn", Ok_);
        }
    }
}
