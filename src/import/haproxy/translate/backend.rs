//! A `backend` (or a `listen`'s backend part): an upstream, its servers and their
//! parameters.

use std::fmt::Write as _;

use super::render::q;
use super::actions::header_rule;
use super::settings::balance;
use super::{count, dir_name, server_addr, time_ms, Cx, Settings, Upstream};
use crate::import::haproxy::parse::Directive;
use crate::import::haproxy::parse::Kind;
use crate::import::haproxy::parse::Section;
use crate::import::haproxy::report::Status;
use Status::{Approximated as Approx, Translated as Ok_, Unsupported as Unsup};

impl Cx<'_> {
    pub(super) fn backend(&mut self, s: &Section, st: &Settings) {
        if !st.http {
            self.all_unsupported(
                s,
                "a mode tcp section (tcp is HAProxy's default mode): portcullis proxies HTTP only",
            );
            return;
        }
        let servers: Vec<&Directive> = s
            .directives
            .iter()
            .filter(|d| d.kw() == "server" || d.kw() == "server-template")
            .collect();
        if s.kind == Kind::Listen && servers.is_empty() {
            return; // a stats listener, or a frontend-like listen
        }
        let mut u = Upstream {
            name: s.name.clone(),
            verify: true,
            ..Upstream::default()
        };
        u.lines.insert(s.line);
        // balance
        if let Some((args, line)) = &st.balance {
            let (mode, status) = balance(args, st.hash_consistent);
            u.balance = mode;
            u.lines.insert(*line);
            self.rep.put(*line, "balance", status);
        }
        // timeouts
        for (name, (ms, line)) in &st.timeouts {
            if matches!(name.as_str(), "connect" | "server" | "check") {
                u.lines.insert(*line);
            }
            match name.as_str() {
                "connect" => u.connect_ms = Some(*ms),
                "server" => u.read_ms = Some(*ms),
                "queue" => {
                    u.lines.insert(*line);
                }
                _ => {}
            }
        }
        u.retries = if st.redispatch {
            st.retries.unwrap_or(3).min(3)
        } else {
            0
        };
        // servers
        let mut check: Option<CheckTiming> = None;
        let mut checks_differ = false;
        let mut some_unchecked = false;
        let mut any_checked = false;
        let mut any_maxconn = false;
        let mut slow_starts: Vec<(Option<u64>, usize)> = Vec::new();
        for d in &servers {
            let expanded = if d.kw() == "server-template" {
                match template(d) {
                    Ok(v) => v,
                    Err(e) => {
                        self.rep.put(d.line, "server-template", Unsup(e));
                        continue;
                    }
                }
            } else {
                vec![(d.arg(1).to_string(), d.arg(2).to_string())]
            };
            let first_param = if d.kw() == "server-template" { 4 } else { 3 };
            let mut params: Vec<String> = st.default_server.clone();
            params.extend(d.args.iter().skip(first_param).cloned());
            let sp = match server_params(&params) {
                Ok(p) => p,
                Err(e) => {
                    self.rep.put(d.line, d.kw(), Unsup(e));
                    continue;
                }
            };
            if !st.default_server.is_empty() {
                self.rep.put(st.default_server_line, "default-server", Ok_);
                u.lines.insert(st.default_server_line);
            }
            let mut notes = sp.notes.clone();
            if d.kw() == "server-template" {
                notes.push(format!(
                    "one backend on {} (portcullis re-resolves a name and balances over it as one backend; HAProxy fills {} slots from DNS)",
                    d.arg(3),
                    d.arg(2)
                ));
            }
            if sp.check {
                any_checked = true;
                let c = (
                    sp.inter,
                    sp.fastinter,
                    sp.downinter,
                    sp.rise,
                    sp.fall,
                    sp.port,
                );
                match &check {
                    None => check = Some(c),
                    Some(prev) if *prev != c => checks_differ = true,
                    _ => {}
                }
            } else {
                some_unchecked = true;
            }
            any_maxconn |= sp.maxconn.is_some_and(|m| m > 0);
            if !sp.disabled {
                slow_starts.push((sp.slowstart, d.line));
            }
            if let Some(q) = sp.maxqueue {
                u.max_queue = Some(u.max_queue.unwrap_or(0).saturating_add(q).max(1));
                notes.push(
                    "maxqueue: portcullis has one queue per upstream, of the servers' sum".into(),
                );
            }
            if sp.ssl {
                u.tls = true;
                if !sp.verify {
                    u.verify = false;
                }
            }
            if sp.disabled {
                notes.push("a disabled server is left out (hold one out at run time with `portcullis ctl maint`)".into());
            }
            if sp.weight == Some(0) {
                notes.push("weight 0 (no new traffic) is left out".into());
            }
            let mut ok = 0;
            for (name, addr) in expanded {
                if sp.disabled || sp.weight == Some(0) {
                    continue;
                }
                match server_addr(&addr) {
                    Ok(a) => {
                        let mut t = format!("{{ name = {}, address = {}", q(&name), q(&a));
                        if let Some(w) = sp.weight {
                            let _ = write!(t, ", weight = {w}");
                        }
                        if let Some(m) = sp.maxconn {
                            let _ = write!(t, ", max_conn = {m}");
                        }
                        if sp.backup {
                            t.push_str(", backup = true");
                        }
                        t.push_str(" }");
                        u.backends.push(t);
                        ok += 1;
                    }
                    Err(e) => notes.push(e),
                }
            }
            u.lines.insert(d.line);
            let status = if ok == 0 && !(sp.disabled || sp.weight == Some(0)) {
                Unsup(notes.join("; "))
            } else if notes.is_empty() {
                Ok_
            } else {
                Approx(notes.join("; "))
            };
            self.rep.put(d.line, d.kw(), status);
        }
        // the queue: HAProxy queues a request when every server is at its maxconn, up to
        // `timeout queue` (by default `timeout connect`)
        if any_maxconn {
            u.queue_timeout = match (st.timeouts.get("queue"), st.timeouts.get("connect")) {
                (Some((ms, _)), _) => Some((*ms, "timeout queue")),
                (None, Some((ms, _))) => {
                    Some((*ms, "timeout connect (HAProxy's default for timeout queue)"))
                }
                (None, None) => None,
            };
        }
        // slow start: per server in HAProxy, per upstream in portcullis
        if let Some((first, _)) = slow_starts.iter().find(|(s, _)| s.is_some()) {
            u.slow_start_s = first.map(|ms| ms.div_ceil(1000));
            if slow_starts.iter().any(|(s, _)| s != first) {
                for (_, line) in &slow_starts {
                    self.rep.put(*line, "server", Approx(
                        "portcullis ramps every backend of an upstream alike: the first server's slowstart is used for all".into(),
                    ));
                }
            }
        }
        // health check
        if any_checked {
            if let Some((inter, fastinter, downinter, rise, fall, port)) = check {
                match &st.httpchk {
                    Some(chk) => {
                        let (status, body) = st
                            .expect
                            .clone()
                            .unwrap_or_else(|| ("200-399".into(), String::new()));
                        let timeout = st
                            .timeouts
                            .get("check")
                            .map(|t| t.0)
                            .unwrap_or(inter)
                            .max(1);
                        let fast = fastinter.or(downinter).unwrap_or(inter);
                        let mut h = format!(
                            "path = {}\nmethod = {}\nexpect_status = {}\ninterval_ms = {}\nfast_interval_ms = {}\ntimeout_ms = {}\nrise = {}\nfall = {}\n",
                            q(&chk.path), q(&chk.method), q(&status), inter.max(100), fast.max(100), timeout.min(600_000), rise, fall
                        );
                        if !chk.host.is_empty() {
                            let _ = writeln!(h, "host = {}", q(&chk.host));
                        }
                        if !body.is_empty() {
                            let _ = writeln!(h, "expect_body = {}", q(&body));
                        }
                        if !chk.headers.is_empty() {
                            let hs: Vec<String> = chk
                                .headers
                                .iter()
                                .map(|(k, v)| format!("{} = {}", q(k), q(v)))
                                .collect();
                            let _ = writeln!(h, "headers = {{ {} }}", hs.join(", "));
                        }
                        if port != 0 {
                            let _ = writeln!(h, "port = {port}");
                        }
                        u.health = Some(h);
                    }
                    None => {
                        for d in servers
                            .iter()
                            .filter(|d| d.args.iter().any(|a| a == "check"))
                        {
                            self.rep.put(d.line, d.kw(), Approx(
                                "a layer-4 connect check (no option httpchk): portcullis checks over HTTP only, none is written".into(),
                            ));
                        }
                    }
                }
            }
            if checks_differ || some_unchecked {
                for d in &servers {
                    self.rep.put(d.line, d.kw(), Approx(
                        "portcullis checks every backend of an upstream alike: the first checked server's parameters are used for all".into(),
                    ));
                }
            }
        }
        // backend-level header rules (unconditional)
        for d in &s.directives {
            if matches!(d.kw(), "http-request" | "http-response")
                && matches!(d.arg(1), "set-header" | "add-header" | "del-header")
            {
                match header_rule(d) {
                    Ok((m, None)) => {
                        u.mods.then(&m);
                        u.lines.insert(d.line);
                        self.rep.put(d.line, &dir_name(d), Ok_);
                    }
                    Ok((_, Some(_))) => self.rep.put(
                        d.line,
                        &dir_name(d),
                        Unsup(
                            "a conditional header rule in a backend: move it to the frontend"
                                .into(),
                        ),
                    ),
                    Err(e) => self.rep.put(d.line, &dir_name(d), Unsup(e)),
                }
            }
            if d.kw() == "maxconn" && s.kind == Kind::Backend {
                self.rep.put(
                    d.line,
                    "maxconn",
                    Unsup("HAProxy ignores maxconn in a backend (use the servers' maxconn)".into()),
                );
            }
        }
        if s.kind == Kind::Backend {
            let ef = st.errorfiles.clone();
            self.errorfiles(&ef);
        }
        self.rep.put(
            s.line,
            s.keyword.as_str(),
            if u.backends.is_empty() {
                Approx("no usable server: its requests are answered 503, as HAProxy does".into())
            } else {
                Ok_
            },
        );
        if !u.backends.is_empty() {
            self.out.upstreams.push(u);
        }
    }

    pub(super) fn all_unsupported(&mut self, s: &Section, why: &str) {
        self.rep.put(s.line, &s.keyword, Unsup(why.into()));
        for d in &s.directives {
            self.rep.put(d.line, &dir_name(d), Unsup(why.into()));
        }
    }

    pub(super) fn upstream_exists(&self, name: &str) -> bool {
        self.out.upstreams.iter().any(|u| u.name == name)
    }
}

/// A server's check parameters: inter, fastinter, downinter, rise, fall, port.
type CheckTiming = (u64, Option<u64>, Option<u64>, u64, u64, u16);

#[derive(Debug, Default)]
pub(super) struct ServerParams {
    pub(super) check: bool,
    pub(super) inter: u64,
    pub(super) fastinter: Option<u64>,
    pub(super) downinter: Option<u64>,
    pub(super) rise: u64,
    pub(super) fall: u64,
    pub(super) port: u16,
    pub(super) weight: Option<u64>,
    pub(super) maxconn: Option<u64>,
    pub(super) backup: bool,
    pub(super) disabled: bool,
    pub(super) slowstart: Option<u64>,
    pub(super) maxqueue: Option<u64>,
    pub(super) ssl: bool,
    pub(super) verify: bool,
    pub(super) notes: Vec<String>,
}

pub(super) fn server_params(p: &[String]) -> Result<ServerParams, String> {
    let mut s = ServerParams {
        inter: 2000,
        rise: 2,
        fall: 3,
        verify: true,
        ..ServerParams::default()
    };
    let mut i = 0;
    let num = |i: usize| -> Result<u64, String> {
        p.get(i).and_then(|v| count(v).ok()).ok_or_else(|| {
            format!(
                "'{}' needs a number",
                p.get(i.wrapping_sub(1)).map(String::as_str).unwrap_or("")
            )
        })
    };
    let time = |i: usize| -> Result<u64, String> {
        p.get(i).and_then(|v| time_ms(v)).ok_or_else(|| {
            format!(
                "'{}' needs a time",
                p.get(i.wrapping_sub(1)).map(String::as_str).unwrap_or("")
            )
        })
    };
    while i < p.len() {
        match p[i].as_str() {
            "check" => s.check = true,
            "no-check" => s.check = false,
            "inter" => {
                s.inter = time(i + 1)?;
                i += 1;
            }
            "fastinter" => {
                s.fastinter = Some(time(i + 1)?);
                i += 1;
            }
            "downinter" => {
                s.downinter = Some(time(i + 1)?);
                i += 1;
            }
            "rise" => {
                s.rise = num(i + 1)?.clamp(1, 1000);
                i += 1;
            }
            "fall" => {
                s.fall = num(i + 1)?.clamp(1, 1000);
                i += 1;
            }
            "port" => {
                s.port = u16::try_from(num(i + 1)?).map_err(|_| "port out of range".to_string())?;
                i += 1;
            }
            "weight" => {
                let w = num(i + 1)?;
                if w > 256 {
                    return Err(format!("weight {w} is above HAProxy's 256"));
                }
                s.weight = Some(w);
                i += 1;
            }
            "maxconn" => {
                s.maxconn = Some(num(i + 1)?);
                i += 1;
            }
            "backup" => s.backup = true,
            "disabled" => s.disabled = true,
            "enabled" => s.disabled = false,
            "ssl" => s.ssl = true,
            "verify" => {
                if p.get(i + 1).map(String::as_str) == Some("none") {
                    s.verify = false;
                }
                i += 1;
            }
            "slowstart" => {
                s.slowstart = Some(time(i + 1)?);
                i += 1;
            }
            "maxqueue" => {
                s.maxqueue = Some(num(i + 1)?);
                i += 1;
            }
            "check-ssl" | "resolvers" | "init-addr" | "cookie" | "id" | "agent-check"
            | "agent-port" | "agent-inter" | "on-marked-down" | "on-error" | "error-limit"
            | "observe" | "sni" | "ca-file" | "crt" | "alpn" | "proto" | "send-proxy"
            | "send-proxy-v2" | "resolve-prefer" | "pool-max-conn" | "pool-purge-delay" => {
                let takes = !matches!(
                    p[i].as_str(),
                    "check-ssl" | "agent-check" | "send-proxy" | "send-proxy-v2"
                );
                s.notes.push(format!("'{}' is not translated", p[i]));
                if takes {
                    i += 1;
                }
            }
            o => s.notes.push(format!("'{o}' is not translated")),
        }
        i += 1;
    }
    Ok(s)
}

/// `server-template PREFIX NUM|RANGE FQDN[:PORT]`: PREFIX1..PREFIXn, all on the same
/// address (HAProxy fills them from DNS; with a literal address each is that address).
pub(super) fn template(d: &Directive) -> Result<Vec<(String, String)>, String> {
    let prefix = d.arg(1);
    let range = d.arg(2);
    let addr = d.arg(3);
    let (lo, hi) = match range.split_once('-') {
        Some((a, b)) => (
            count(a).map_err(|_| format!("'{range}' is not a number or range"))?,
            count(b).map_err(|_| format!("'{range}' is not a number or range"))?,
        ),
        None => (
            1,
            count(range).map_err(|_| format!("'{range}' is not a number or range"))?,
        ),
    };
    if lo == 0 || hi < lo || hi - lo >= 1000 {
        return Err(format!("range '{range}' (1 to 1000 servers)"));
    }
    if addr.is_empty() {
        return Err("server-template needs an address".into());
    }
    Ok(vec![(prefix.to_string(), addr.to_string())])
}
