//! Route actions that answer without a backend (CONTRACT §21): the `Location` of a
//! `redirect` route, from a template checked at load and filled in from the request.
//!
//! Only the connection (`{scheme}`: `https` over TLS, else `http`), the `Host` (or
//! `:authority`) and the request target feed a `Location`: never `X-Forwarded-*` or
//! another field a client can forge. A host that is not a plain host name or address
//! (`@`, `/`, `\`, a control byte, ...) refuses the redirect (400); every byte of the
//! path and query outside the URI characters is percent-escaped, so neither can end the
//! URL's authority early or start a second header line, and a `Location` that would
//! begin with `//` or `/\` (a protocol-relative URL: another site) is escaped too.

/// One piece of a `location` template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(Box<str>),
    Scheme,
    Host,
    Path,
    Query,
    PathAndQuery,
}

/// A checked `location` template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    parts: Box<[Part]>,
}

/// What a `Location` is filled in from.
pub struct Request<'a> {
    pub tls: bool,
    /// The host without its port (`Host`, else the target's authority).
    pub host: &'a str,
    pub path: &'a str,
    pub query: Option<&'a str>,
}

impl Location {
    /// Parse `template`: an absolute `http(s)://` URL (the scheme may be `{scheme}`) or a
    /// path (`/...`, not `//`), with `{scheme}`, `{host}`, `{path}`, `{query}` and
    /// `{path_and_query}`. The error says why not.
    pub fn parse(template: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Text(rest[..open].into()));
            }
            let Some(close) = rest[open..].find('}') else {
                return Err("has a '{' without its '}'".into());
            };
            let part = match &rest[open + 1..open + close] {
                "scheme" => Part::Scheme,
                "host" => Part::Host,
                "path" => Part::Path,
                "query" => Part::Query,
                "path_and_query" => Part::PathAndQuery,
                other => {
                    return Err(format!(
                        "{{{other}}} is not one of {{scheme}} {{host}} {{path}} {{query}} {{path_and_query}}"
                    ))
                }
            };
            parts.push(part);
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.into()));
        }
        for p in &parts {
            if let Part::Text(t) = p {
                if t.contains('}') {
                    return Err("has a '}' without its '{'".into());
                }
                if t.bytes().any(|b| !(0x21..=0x7e).contains(&b) || b == b'\\') {
                    return Err("must be visible ASCII without spaces or '\\'".into());
                }
            }
        }
        let text = |i: usize| match parts.get(i) {
            Some(Part::Text(t)) => Some(&**t),
            _ => None,
        };
        let absolute = match (parts.first(), text(0), text(1)) {
            (Some(Part::Scheme), _, Some(t)) => match t.strip_prefix("://") {
                Some("") => matches!(parts.get(2), Some(Part::Host)),
                Some(a) => !a.starts_with('/'),
                None => false,
            },
            (_, Some(t), _) => {
                let lower = t.to_ascii_lowercase();
                let after = ["http://", "https://"]
                    .iter()
                    .find_map(|s| lower.strip_prefix(s));
                match after {
                    Some("") => matches!(parts.get(1), Some(Part::Host)),
                    Some(a) => !a.starts_with('/'),
                    None => false,
                }
            }
            _ => false,
        };
        let path = match (parts.first(), text(0)) {
            (_, Some(t)) => t.starts_with('/') && !t.starts_with("//"),
            (Some(Part::Path | Part::PathAndQuery), _) => true,
            _ => false,
        };
        if !absolute && !path {
            return Err(
                "must be an absolute http(s) URL (\"https://{host}{path_and_query}\") or a path (\"/moved\")"
                    .into(),
            );
        }
        Ok(Self {
            parts: parts.into(),
        })
    }

    /// The `Location` for `req`; `None` when the host is not a plain host name or
    /// address (answer 400).
    pub fn render(&self, req: &Request<'_>) -> Option<String> {
        let mut out = String::with_capacity(64);
        for p in &*self.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Scheme => out.push_str(if req.tls { "https" } else { "http" }),
                Part::Host => {
                    if !plain_host(req.host) {
                        return None;
                    }
                    out.push_str(req.host);
                }
                Part::Path => escape(&mut out, req.path),
                Part::Query => escape(&mut out, req.query.unwrap_or("")),
                Part::PathAndQuery => {
                    escape(&mut out, req.path);
                    if let Some(q) = req.query {
                        out.push('?');
                        escape(&mut out, q);
                    }
                }
            }
        }
        // A path template filled in with `//evil`: escape the second slash.
        if let Some(b'/' | b'\\') = out.as_bytes().get(1) {
            if out.starts_with('/') {
                out.replace_range(1..2, "%2F");
            }
        }
        Some(out)
    }
}

/// A host name, IPv4 address or bracketed IPv6 address: nothing that could end the
/// authority or name a user.
fn plain_host(host: &str) -> bool {
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return !inner.is_empty()
            && inner
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
    }
    !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
}

/// Append `s`, percent-escaping every byte that is not a URI character (RFC 3986
/// unreserved, sub-delims, `:`, `@`, `/`, `?`, `%`): controls, space, `"`, `<`, `>`, `\`,
/// `^`, backquote, `{`, `|`, `}`, `#` and every non-ASCII byte.
fn escape(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in s.as_bytes() {
        let keep = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b':'
                    | b'@'
                    | b'/'
                    | b'?'
                    | b'%'
            );
        if keep {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(host: &'a str, path: &'a str, query: Option<&'a str>) -> Request<'a> {
        Request {
            tls: false,
            host,
            path,
            query,
        }
    }

    #[test]
    fn templates_are_checked() {
        for ok in [
            "https://{host}{path_and_query}",
            "{scheme}://{host}{path}",
            "https://example.test/moved",
            "/moved?from={path}",
            "{path_and_query}",
            "HTTPS://example.test",
        ] {
            assert!(Location::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "example.test/x",
            "//evil.test/x",
            "https:///x",
            "ftp://x.test/",
            "{host}/x",
            "https://{host}{nope}",
            "https://{host",
            "/a b",
            "/a\\b",
            "https://x}/",
            "javascript:alert(1)",
        ] {
            assert!(Location::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn filled_in_and_escaped() {
        let l = Location::parse("https://{host}{path_and_query}").unwrap();
        assert_eq!(
            l.render(&req("www.example.test", "/a/b", Some("x=1&y=2")))
                .as_deref(),
            Some("https://www.example.test/a/b?x=1&y=2")
        );
        // A second URL through the host: refused.
        for host in [
            "evil.test@good",
            "good/evil",
            "a\r\nSet-Cookie: x",
            "",
            "a b",
            "a\\b",
        ] {
            assert_eq!(l.render(&req(host, "/", None)), None, "{host:?}");
        }
        assert!(l.render(&req("[::1]", "/", None)).is_some());
        // Through the path: escaped, the authority stays the request's host.
        assert_eq!(
            l.render(&req("good.test", "//evil.test/\r\n<x>\\", None))
                .as_deref(),
            Some("https://good.test//evil.test/%0D%0A%3Cx%3E%5C")
        );
        let p = Location::parse("{path}").unwrap();
        assert_eq!(
            p.render(&req("h", "//evil.test/", None)).as_deref(),
            Some("/%2Fevil.test/")
        );
        assert_eq!(
            p.render(&req("h", "/\\evil.test/", None)).as_deref(),
            Some("/%5Cevil.test/")
        );
        let s = Location::parse("{scheme}://{host}/x?{query}").unwrap();
        let mut r = req("h.test", "/", Some("a=%0d%0a b"));
        r.tls = true;
        assert_eq!(
            s.render(&r).as_deref(),
            Some("https://h.test/x?a=%0d%0a%20b")
        );
    }
}
