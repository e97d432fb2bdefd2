//! `global` and `defaults` (and a proxy's own settings over them): the process's settings
//! and what a proxy inherits, the health check and the balancing algorithm.

use super::render::split_response;
use super::{count, dir_name, time_ms, verdict, Check, Cx, Settings};
use crate::import::haproxy::parse::Directive;
use crate::import::haproxy::parse::Section;
use crate::import::haproxy::report::Status;
use Status::{Approximated as Approx, Translated as Ok_, Unsupported as Unsup};

impl Cx<'_> {
    pub(super) fn global(&mut self, s: &Section) {
        for d in &s.directives {
            let name = dir_name(d);
            let st = match d.kw() {
                "maxconn" => match count(d.arg(1)) {
                    Ok(n) if n > 0 => {
                        self.out.max_connections = Some((n, d.line));
                        Ok_
                    }
                    _ => Unsup(format!("'{}' is not a positive number", d.arg(1))),
                },
                "nbthread" => match count(d.arg(1)) {
                    Ok(n) if n > 0 => {
                        self.out.threads = Some(n);
                        Ok_
                    }
                    _ => Unsup(format!("'{}' is not a positive number", d.arg(1))),
                },
                "log" => Approx("access-log lines go to [access_log] (JSON, stdout by default)".into()),
                "daemon" | "user" | "group" | "chroot" | "pidfile" | "master-worker" | "uid"
                | "gid" => Approx(
                    "the systemd unit runs portcullis in the foreground as the portcullis user, sandboxed"
                        .into(),
                ),
                "stats" => Approx(
                    "the runtime API is the admin listener ([server] admin_listen, `portcullis ctl`)"
                        .into(),
                ),
                "ca-base" => Approx("server certificates are verified against the system store".into()),
                "crt-base" => {
                    self.crt_base = d.arg(1).trim_end_matches('/').to_string();
                    Ok_
                }
                "ssl-default-bind-options" => {
                    let min = d.args.windows(2).find(|w| w[0] == "ssl-min-ver").map(|w| w[1].clone());
                    match min.as_deref() {
                        Some("TLSv1.2") => self.out.min_tls = Some("1.2".into()),
                        Some("TLSv1.3") => self.out.min_tls = Some("1.3".into()),
                        _ => {}
                    }
                    if d.args.len() == 3 && min.is_some() {
                        Ok_
                    } else {
                        Approx("ssl-min-ver is [tls] min_version; other options keep OpenSSL's defaults".into())
                    }
                }
                "ssl-default-bind-ciphers" | "ssl-default-bind-ciphersuites"
                | "ssl-default-server-ciphers" | "ssl-default-server-options"
                | "ssl-default-server-ciphersuites" | "tune.ssl.default-dh-param" => {
                    Approx("portcullis keeps OpenSSL's default ciphers and parameters".into())
                }
                _ => Unsup("no portcullis equivalent for this global directive".into()),
            };
            self.rep.put(d.line, &name, st);
        }
    }

    /// The settings a section's directives give, over `base`; reports the directives that
    /// are settings. `defaults`: the section is a defaults section.
    pub(super) fn settings_of(&mut self, s: &Section, base: Settings, defaults: bool) -> Settings {
        let mut st = base;
        for d in &s.directives {
            let name = dir_name(d);
            let status = match d.kw() {
                "mode" => Some(set_mode(d, &mut st)),
                "timeout" => Some(set_timeout(d, &mut st)),
                "balance" => {
                    st.balance = Some((d.args[1..].to_vec(), d.line));
                    None // reported by the backend that uses it
                }
                "hash-type" => {
                    st.hash_consistent = d.arg(1) == "consistent";
                    Some(Ok_)
                }
                "option" => self.option(d, &mut st),
                "http-check" => Some(http_check(d, &mut st)),
                "default-server" => {
                    st.default_server = d.args[1..].to_vec();
                    st.default_server_line = d.line;
                    None
                }
                "maxconn" => set_maxconn(d, &mut st),
                "retries" => Some(set_retries(d, &mut st)),
                "errorfile" => {
                    match d.arg(1).parse::<u16>() {
                        Ok(code) => st.errorfiles.push((code, d.arg(2).to_string(), d.line)),
                        Err(_) => self.rep.put(
                            d.line,
                            &name,
                            Unsup(format!("'{}' is not a status", d.arg(1))),
                        ),
                    }
                    None
                }
                "default_backend" => {
                    st.default_backend = Some((d.arg(1).to_string(), d.line));
                    None
                }
                "log" => Some(Approx(
                    "access-log lines go to [access_log] (JSON, stdout by default)".into(),
                )),
                _ if defaults => Some(in_defaults_only(d.kw())),
                _ => None,
            };
            if let Some(status) = status {
                self.rep.put(d.line, &name, status);
            }
        }
        if defaults {
            // errorfiles of a defaults section: pages for the whole proxy
            let ef = st.errorfiles.clone();
            self.errorfiles(&ef);
        }
        st
    }

    pub(super) fn option(&mut self, d: &Directive, st: &mut Settings) -> Option<Status> {
        Some(match d.arg(1) {
            "httplog" | "dontlognull" | "log-health-checks" | "httpslog" | "dontlog-normal" => {
                Approx("every request is one JSON access-log line ([access_log])".into())
            }
            "forwardfor" => Approx(
                "portcullis sets X-Forwarded-For (and -Proto, -Host) on every proxied request"
                    .into(),
            ),
            "http-server-close"
            | "httpclose"
            | "http-keep-alive"
            | "http-buffer-request"
            | "http-pretend-keepalive" => {
                Approx("portcullis keeps pooled keep-alive connections to the backends".into())
            }
            "redispatch" => {
                st.redispatch = true;
                Approx("a retry goes to another backend (upstream retries)".into())
            }
            "httpchk" => {
                let rest: Vec<&str> = d.args[2..].iter().map(String::as_str).collect();
                let (method, uri, ver) = match rest.as_slice() {
                    [] => ("OPTIONS", "/", ""),
                    [u] => ("OPTIONS", *u, ""),
                    [m, u] => (*m, *u, ""),
                    [m, u, v, ..] => (*m, *u, *v),
                };
                let mut chk = Check {
                    method: method.to_string(),
                    path: uri.to_string(),
                    ..Check::default()
                };
                // the old form: "HTTP/1.1\r\nHost:\ www" in the version
                for (i, part) in ver.split("\r\n").enumerate() {
                    if i == 0 {
                        continue;
                    }
                    if let Some((n, v)) = part.split_once(':') {
                        chk.set_header(n.trim(), v.trim());
                    }
                }
                let ok_method = matches!(method, "GET" | "HEAD" | "OPTIONS");
                st.httpchk = Some(chk);
                if ok_method {
                    Ok_
                } else {
                    Unsup(format!(
                        "health checks use GET, HEAD or OPTIONS, not {method}"
                    ))
                }
            }
            _ => {
                return (!d.arg(1).is_empty())
                    .then(|| Unsup("no portcullis equivalent for this option".into()))
            }
        })
    }

    pub(super) fn errorfiles(&mut self, list: &[(u16, String, usize)]) {
        const PAGES: [u16; 11] = [400, 401, 403, 404, 408, 413, 421, 429, 502, 503, 504];
        for (code, path, line) in list {
            if !PAGES.contains(code) {
                self.rep.put(
                    *line,
                    "errorfile",
                    Unsup(format!("portcullis writes no {code} of its own")),
                );
                continue;
            }
            let Some(dir) = &self.opts.pages_dir else {
                self.rep.put(
                    *line,
                    "errorfile",
                    Unsup("pages are written beside the output: use --out".into()),
                );
                continue;
            };
            let Some(bytes) = (self.opts.read_file)(path) else {
                self.rep
                    .put(*line, "errorfile", Unsup(format!("cannot read {path}")));
                continue;
            };
            // An HAProxy error file is a whole response: keep its body and its type.
            let (head, body) = split_response(&bytes);
            let ctype = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(n, _)| n.trim().eq_ignore_ascii_case("content-type"))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_else(|| "text/html".into());
            let file = format!("{dir}/{code}.html");
            if !self.out.pages.contains_key(code) {
                self.out.pages.insert(*code, (file.clone(), ctype, *line));
                self.out.page_files.push((file, body.to_vec()));
            }
            self.rep.put(*line, "errorfile", Approx(
                "its body is [errors.pages] (written beside the output); the status line and headers are portcullis's own".into(),
            ));
        }
    }
}

/// `mode http` (the one translated) or another mode.
fn set_mode(d: &Directive, st: &mut Settings) -> Status {
    match d.arg(1) {
        "http" => {
            st.http = true;
            Ok_
        }
        "tcp" => {
            st.http = false;
            Unsup("portcullis proxies HTTP only (mode tcp)".into())
        }
        m => Unsup(format!("mode '{m}'")),
    }
}

/// `timeout NAME TIME`.
fn set_timeout(d: &Directive, st: &mut Settings) -> Status {
    match time_ms(d.arg(2)) {
        Some(ms) => {
            st.timeouts.insert(d.arg(1).to_string(), (ms, d.line));
            timeout_status(d.arg(1))
        }
        None => Unsup(format!("'{}' is not a time", d.arg(2))),
    }
}

pub(super) fn timeout_status(name: &str) -> Status {
    match name {
        "connect" | "server" | "http-request" | "http-keep-alive" | "tunnel" => Ok_,
        "client" => Approx("server.client_body_timeout_ms: the longest pause between body reads; an idle connection closes after idle_timeout_ms".into()),
        "check" => Ok_,
        "queue" => Ok_, // reported by the backend that has it
        _ => Unsup(format!("no portcullis equivalent for 'timeout {name}'")),
    }
}

/// A proxy's `maxconn`: reported by the frontend that uses it, unless it is not a count.
fn set_maxconn(d: &Directive, st: &mut Settings) -> Option<Status> {
    match count(d.arg(1)) {
        Ok(n) if n > 0 => {
            st.maxconn = Some((n, d.line));
            None
        }
        _ => Some(Unsup(format!("'{}' is not a positive number", d.arg(1)))),
    }
}

/// `retries N` (used with `option redispatch`).
fn set_retries(d: &Directive, st: &mut Settings) -> Status {
    match count(d.arg(1)) {
        Ok(n) => {
            st.retries = Some(n);
            Approx(
                "retries = N: portcullis retries a connect failure, reset, 502 or 503 on another backend (idempotent methods, within a retry budget)".into(),
            )
        }
        _ => Unsup(format!("'{}' is not a number", d.arg(1))),
    }
}

/// A directive of a defaults section that is none of the settings a proxy inherits.
fn in_defaults_only(kw: &str) -> Status {
    match kw {
        "stats" => Unsup("stats in defaults: write it in the stats listener".into()),
        "http-request" | "http-response" => Unsup(
            "rules in a defaults section are not translated: move them to the frontend".into(),
        ),
        _ => Unsup("no portcullis equivalent for this defaults directive".into()),
    }
}

pub(super) fn http_check(d: &Directive, st: &mut Settings) -> Status {
    match d.arg(1) {
        "send" => http_check_send(d, st),
        "expect" => http_check_expect(d, st),
        "disable-on-404" => Unsup("no equivalent".into()),
        "connect" => Approx("probes connect to the backend (or health_check.port)".into()),
        _ => Unsup("no portcullis equivalent".into()),
    }
}

/// `http-check send meth M uri U ver V hdr NAME VALUE...`: the probe's request.
fn http_check_send(d: &Directive, st: &mut Settings) -> Status {
    let chk = st.httpchk.get_or_insert_with(|| Check {
        method: "OPTIONS".into(),
        path: "/".into(),
        ..Check::default()
    });
    let mut i = 2;
    let mut notes = Vec::new();
    while i < d.args.len() {
        match d.arg(i) {
            "meth" => {
                chk.method = d.arg(i + 1).to_string();
                i += 2;
            }
            "uri" => {
                chk.path = d.arg(i + 1).to_string();
                i += 2;
            }
            "ver" => i += 2,
            "hdr" => {
                chk.set_header(d.arg(i + 1), d.arg(i + 2));
                i += 3;
            }
            o => {
                notes.push(format!("'{o}' is not translated"));
                i += 1;
            }
        }
    }
    if !matches!(chk.method.as_str(), "GET" | "HEAD" | "OPTIONS") {
        return Unsup(format!(
            "health checks use GET, HEAD or OPTIONS, not {}",
            chk.method
        ));
    }
    verdict(&notes)
}

/// `http-check expect status LIST` / `expect string TEXT`: what a healthy answer is.
fn http_check_expect(d: &Directive, st: &mut Settings) -> Status {
    let (neg, i) = if d.arg(2) == "!" {
        (true, 3)
    } else {
        (false, 2)
    };
    if neg {
        return Unsup("a negated expect is not translated".into());
    }
    let e = st
        .expect
        .get_or_insert_with(|| ("200-399".into(), String::new()));
    match d.arg(i) {
        "status" => {
            let v = d.arg(i + 1);
            if v.split(',')
                .all(|p| p.split('-').all(|n| n.parse::<u16>().is_ok()))
            {
                e.0 = v.to_string();
                Ok_
            } else {
                Unsup(format!("status '{v}'"))
            }
        }
        "string" => {
            e.1 = d.arg(i + 1).to_string();
            Ok_
        }
        o => Unsup(format!(
            "'http-check expect {o}' is not translated (status or string)"
        )),
    }
}

pub(super) fn balance(
    args: &[String],
    consistent: bool,
) -> (Option<(&'static str, Option<String>)>, Status) {
    let a = args.first().map(String::as_str).unwrap_or("");
    let hashed = |key: String| {
        (
            Some(("consistent_hash", Some(key))),
            if consistent {
                Ok_
            } else {
                Approx("consistent hashing (HAProxy's default map-based hash moves more keys when a server changes)".into())
            },
        )
    };
    match a {
        "roundrobin" | "static-rr" => (Some(("round_robin", None)), Ok_),
        "leastconn" => (
            Some(("least_requests", None)),
            Approx("least requests in flight of two backends picked at random".into()),
        ),
        "random" => (
            Some(("random", None)),
            if args.len() > 1 {
                Approx("random by weight (one draw)".into())
            } else {
                Ok_
            },
        ),
        "source" => hashed("client_ip".into()),
        "uri" => hashed("path".into()),
        "url_param" if args.len() > 1 => hashed(format!("query:{}", args[1])),
        _ => {
            if let Some(h) = a.strip_prefix("hdr(").and_then(|x| x.strip_suffix(')')) {
                if !h.is_empty() {
                    return hashed(format!("header:{}", h.to_ascii_lowercase()));
                }
            }
            (
                None,
                Unsup(format!(
                    "balance '{a}' has no portcullis equivalent: round robin"
                )),
            )
        }
    }
}
