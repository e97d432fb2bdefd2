//! What a browser must not be able to do to the admin listener: a page on another
//! origin posting a form or a `no-cors` fetch to it (cross-site request forgery), and a
//! page whose own host name resolves to the admin listener (DNS rebinding). Plain
//! functions of the request's headers, tested without a socket.
//!
//! - `Host` must name the listener: any IP address (a rebinding page names its own
//!   host, never an address), `localhost` (and `*.localhost`, which resolve to loopback
//!   only), or a name in `server.admin_hosts` (`"*"`: any).
//! - A request that changes state must not come from another site: `Sec-Fetch-Site`
//!   `cross-site` or `same-site` (a page on another port of the same host is same-site)
//!   is refused, and so is an `Origin` other than the one the `Host` names (or `null`).
//! - Its body, when it has one, must be `application/json`: an HTML form can send
//!   `text/plain`, `application/x-www-form-urlencoded` and `multipart/form-data` without
//!   a CORS preflight, but not JSON.

use std::net::IpAddr;

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The `Host` names neither an address, `localhost` nor a name of `admin_hosts` (421).
    Host,
    /// `Sec-Fetch-Site` or `Origin` says another site sent it (403).
    CrossSite,
    /// A body that is not `application/json` (415).
    MediaType,
}

/// The host part of a `Host` value (`name`, `name:port`, `[v6]:port`, `v4:port`),
/// lowercase and without a trailing dot; `None` when it is malformed.
fn host_part(value: &str) -> Option<String> {
    let v = value.trim();
    let host = if let Some(rest) = v.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        inside.parse::<std::net::Ipv6Addr>().ok()?;
        return Some(format!("[{inside}]"));
    } else {
        match v.rsplit_once(':') {
            Some((h, port)) if is_port(port) && !h.contains(':') => h,
            Some(_) => return None,
            None => v,
        }
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

fn is_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

/// Whether the admin listener answers a request whose `Host` is `host` (`None`: no
/// `Host`, an HTTP/1.0 client; no browser sends one).
pub fn host_allowed(host: Option<&str>, admin_hosts: &[String]) -> bool {
    if admin_hosts.iter().any(|h| h == "*") {
        return true;
    }
    let Some(value) = host else { return true };
    let Some(h) = host_part(value) else {
        return false;
    };
    if h.starts_with('[') || h.parse::<IpAddr>().is_ok() {
        return true;
    }
    h == "localhost" || h.ends_with(".localhost") || admin_hosts.contains(&h)
}

/// The `scheme://authority` of an `Origin` as (authority without a default port).
fn origin_authority(origin: &str) -> Option<String> {
    let (scheme, rest) = origin.trim().split_once("://")?;
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" => ":80",
        "https" => ":443",
        _ => return None,
    };
    if rest.is_empty() || rest.contains('/') {
        return None;
    }
    let rest = rest.to_ascii_lowercase();
    Some(rest.strip_suffix(default).unwrap_or(&rest).to_string())
}

/// `Host` without its default port (`:80`), lowercase: what a same-origin `Origin` names.
fn host_authority(host: &str) -> String {
    let h = host.trim().to_ascii_lowercase();
    h.strip_suffix(":80").unwrap_or(&h).to_string()
}

/// The headers [`check_change`] reads.
#[derive(Debug, Default, Clone, Copy)]
pub struct ChangeHeaders<'a> {
    pub host: Option<&'a str>,
    pub origin: Option<&'a str>,
    pub sec_fetch_site: Option<&'a str>,
    pub content_type: Option<&'a str>,
    /// The request has a body: `Content-Length` above 0, or `Transfer-Encoding`.
    pub has_body: bool,
}

/// The check of a request that changes state (any method but `GET` and `HEAD`).
pub fn check_change(h: &ChangeHeaders<'_>) -> Result<(), Refusal> {
    if let Some(site) = h.sec_fetch_site {
        let site = site.trim();
        if !(site.eq_ignore_ascii_case("same-origin") || site.eq_ignore_ascii_case("none")) {
            return Err(Refusal::CrossSite);
        }
    }
    if let Some(origin) = h.origin {
        let same = match (origin_authority(origin), h.host) {
            (Some(o), Some(host)) => o == host_authority(host),
            // `null` (a sandboxed frame, a file, a redirect), or no `Host` to compare with
            _ => false,
        };
        if !same {
            return Err(Refusal::CrossSite);
        }
    }
    if h.has_body {
        let json = h.content_type.is_some_and(|ct| {
            ct.split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
        });
        if !json {
            return Err(Refusal::MediaType);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn hosts_that_name_the_listener() {
        let none = hosts(&[]);
        for ok in [
            "127.0.0.1:9090",
            "127.0.0.1",
            "10.1.2.3:9090",
            "[::1]:9090",
            "[::1]",
            "localhost:9090",
            "LOCALHOST",
            "localhost.",
            "admin.localhost:9090",
        ] {
            assert!(host_allowed(Some(ok), &none), "{ok}");
        }
        assert!(host_allowed(None, &none), "HTTP/1.0 without Host");
        for bad in [
            "attacker.example",
            "attacker.example:9090",
            "localhost.attacker.example",
            "127.0.0.1.nip.io:9090",
            "",
            "::1",
            "[::1]x",
            "[nothex]:80",
            "host:port",
            "a:1:2",
        ] {
            assert!(!host_allowed(Some(bad), &none), "{bad}");
        }
        let listed = hosts(&["portcullis-0.portcullis.svc"]);
        assert!(host_allowed(
            Some("portcullis-0.portcullis.svc:9090"),
            &listed
        ));
        assert!(host_allowed(Some("Portcullis-0.Portcullis.svc."), &listed));
        assert!(!host_allowed(Some("portcullis-1.portcullis.svc"), &listed));
        assert!(host_allowed(Some("anything.example"), &hosts(&["*"])));
    }

    #[test]
    fn changes_from_another_site_are_refused() {
        let base = ChangeHeaders {
            host: Some("127.0.0.1:9090"),
            ..Default::default()
        };
        // curl, ctl, scripts: no Origin, no Sec-Fetch-Site
        assert_eq!(check_change(&base), Ok(()));
        let with = |f: &dyn Fn(&mut ChangeHeaders<'static>)| {
            let mut h = base;
            f(&mut h);
            check_change(&h)
        };
        assert_eq!(
            with(&|h| h.sec_fetch_site = Some("cross-site")),
            Err(Refusal::CrossSite)
        );
        assert_eq!(
            with(&|h| h.sec_fetch_site = Some("same-site")),
            Err(Refusal::CrossSite)
        );
        assert_eq!(with(&|h| h.sec_fetch_site = Some("same-origin")), Ok(()));
        assert_eq!(with(&|h| h.sec_fetch_site = Some("none")), Ok(()));
        assert_eq!(
            with(&|h| h.origin = Some("http://evil.example")),
            Err(Refusal::CrossSite)
        );
        assert_eq!(with(&|h| h.origin = Some("null")), Err(Refusal::CrossSite));
        assert_eq!(
            with(&|h| h.origin = Some("http://127.0.0.1:8080")),
            Err(Refusal::CrossSite),
            "another port is another origin"
        );
        assert_eq!(with(&|h| h.origin = Some("http://127.0.0.1:9090")), Ok(()));
        assert_eq!(with(&|h| h.origin = Some("HTTP://127.0.0.1:9090")), Ok(()));
        assert_eq!(
            check_change(&ChangeHeaders {
                host: Some("localhost"),
                origin: Some("http://localhost:80"),
                ..Default::default()
            }),
            Ok(())
        );
        assert_eq!(
            check_change(&ChangeHeaders {
                host: None,
                origin: Some("http://127.0.0.1:9090"),
                ..Default::default()
            }),
            Err(Refusal::CrossSite)
        );
    }

    #[test]
    fn bodies_must_be_json() {
        let body = |ct: Option<&'static str>| {
            check_change(&ChangeHeaders {
                host: Some("127.0.0.1:9090"),
                content_type: ct,
                has_body: true,
                ..Default::default()
            })
        };
        assert_eq!(body(Some("application/json")), Ok(()));
        assert_eq!(body(Some("Application/JSON; charset=utf-8")), Ok(()));
        for form in [
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=x"),
            Some("application/jsonx"),
            None,
        ] {
            assert_eq!(body(form), Err(Refusal::MediaType), "{form:?}");
        }
        // no body: nothing to read, whatever the type says
        assert_eq!(
            check_change(&ChangeHeaders {
                host: Some("127.0.0.1:9090"),
                content_type: Some("text/plain"),
                has_body: false,
                ..Default::default()
            }),
            Ok(())
        );
    }
}
