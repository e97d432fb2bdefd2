//! The HTTP side of `portcullis ctl`: the admin API's base URL, the token, one blocking
//! request with a timeout, and messages that name the URL and the status (never the
//! token).

use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{StatusCode, Url};
use serde_json::Value;

use super::Request;

/// A request that takes longer than this fails.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The longest part of an error answer quoted in a message.
const MAX_QUOTED: usize = 400;

/// Percent-encoding of one path segment or query value: every byte but RFC 3986's
/// unreserved characters (`A-Z a-z 0-9 - . _ ~`) becomes `%XX`, so `10.0.0.5:8080` is
/// `10.0.0.5%3A8080` and `[::1]:80` is `%5B%3A%3A1%5D%3A80`.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Control, line-separator and bidi characters (an answer could carry terminal escapes, or
/// reorder a table row) become spaces.
pub fn clean(s: &str) -> String {
    portcullis_policy::text::one_line(s)
}

/// The admin API of one proxy.
pub struct Admin {
    /// The base URL, without a trailing `/`.
    base: String,
    /// The base URL as messages show it: without a user or password.
    shown: String,
    /// `Bearer <token>`, marked sensitive.
    auth: Option<HeaderValue>,
    /// Where the token came from, for messages (`None`: no token).
    token_source: Option<String>,
    http: reqwest::blocking::Client,
}

/// One answer.
pub struct Answer {
    pub status: StatusCode,
    pub body: String,
    /// It carried the admin API's marker header (`X-Portcullis-Admin`): it came from a
    /// portcullis admin listener, not a proxy port or another server.
    pub marker: bool,
}

/// The header every portcullis admin answer carries.
pub const MARKER: &str = "x-portcullis-admin";

impl Answer {
    /// The body as JSON (`Null` when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// `admin` as a base URL: `http://` when no scheme is given, no trailing `/`.
fn base_url(admin: &str) -> Result<(String, String), String> {
    let admin = admin.trim();
    let with_scheme = if admin.contains("://") {
        admin.to_string()
    } else {
        format!("http://{admin}")
    };
    let url =
        Url::parse(&with_scheme).map_err(|e| format!("--admin {admin:?} is not a URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "--admin {admin:?}: the scheme must be http or https"
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!(
            "--admin {admin:?}: a base URL has no query or fragment"
        ));
    }
    let mut shown = url.clone();
    // Neither fails on an http(s) URL.
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    let trim = |u: &Url| u.as_str().trim_end_matches('/').to_string();
    Ok((trim(&url), trim(&shown)))
}

/// The token `ctl` sends.
#[derive(Debug, Clone, PartialEq)]
pub enum Token {
    /// None.
    None,
    /// The content of this file (`--token-file`, or the config's `admin_token_file`).
    File(PathBuf),
    /// This token, read from `source` (the config's `admin_token`), named in messages.
    Value { token: String, source: String },
}

/// The token in `path`, less a trailing newline. Errors name the file, never its content.
fn read_token(path: &Path) -> Result<String, String> {
    let shown = path.display();
    // A regular file only (opening a FIFO would wait for a writer), at most 64 KiB read.
    let bytes = crate::config::read_regular_file(path, crate::config::FileKind::Secret)
        .map_err(|e| format!("cannot read the token file {shown}: {e}"))?;
    let text =
        String::from_utf8(bytes).map_err(|_| format!("the token file {shown} is not UTF-8"))?;
    let token = text.trim_end_matches(['\n', '\r']);
    if token.is_empty() {
        return Err(format!("the token file {shown} is empty"));
    }
    Ok(token.to_string())
}

/// `Bearer <token>`, marked sensitive. Errors name `source`, never the token.
fn bearer(token: &str, source: &str) -> Result<HeaderValue, String> {
    let mut v = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| format!("{source} holds characters a header cannot carry"))?;
    v.set_sensitive(true);
    Ok(v)
}

/// The longest answer read (bytes): `GET /backends` of a large fleet is well under it.
const MAX_ANSWER: u64 = 16 * 1024 * 1024;

/// The body of `resp`, at most [`MAX_ANSWER`] bytes (a longer one is cut there).
fn read_capped(resp: reqwest::blocking::Response) -> Result<String, reqwest::Error> {
    use std::io::Read;
    let mut bytes = Vec::new();
    let mut limited = resp.take(MAX_ANSWER);
    if let Err(e) = limited.read_to_end(&mut bytes) {
        // reqwest's body reader wraps its own error
        let inner = e
            .into_inner()
            .and_then(|e| e.downcast::<reqwest::Error>().ok());
        if let Some(e) = inner {
            return Err(*e);
        }
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `e`'s innermost cause: "Connection refused (os error 111)" rather than reqwest's
/// "error sending request".
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

impl Admin {
    /// The admin API at `admin`, with `token` (a file with an empty path is none).
    /// `Err`: a usage error.
    pub fn new(admin: &str, token: Token) -> Result<Admin, String> {
        let (base, shown) = base_url(admin)?;
        let (auth, token_source) = match token {
            Token::File(p) if !p.as_os_str().is_empty() => {
                let token = read_token(&p)?;
                let shown = p.display().to_string();
                let auth = bearer(&token, &format!("the token file {shown}"))?;
                (Some(auth), Some(shown))
            }
            Token::File(_) | Token::None => (None, None),
            Token::Value { token, source } => (Some(bearer(&token, &source)?), Some(source)),
        };
        let http = reqwest::blocking::Client::builder()
            .timeout(TIMEOUT)
            // The admin listener is reached directly: an HTTP_PROXY meant for the
            // internet must not see the token, and a redirect is not followed.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("portcullis-ctl/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot set up the HTTP client: {}", root_cause(&e)))?;
        Ok(Admin {
            base,
            shown,
            auth,
            token_source,
            http,
        })
    }

    /// The URL of `path` as messages show it.
    pub fn shown_url(&self, path: &str) -> String {
        format!("{}{path}", self.shown)
    }

    /// Sends `req`. `Err`: no answer (unreachable, timed out), the message to print.
    pub fn send(&self, req: &Request) -> Result<Answer, String> {
        let shown = self.shown_url(&req.path);
        let url = Url::parse(&format!("{}{}", self.base, req.path))
            .map_err(|e| format!("{shown} is not a URL ({e})"))?;
        let mut rb = self
            .http
            .request(req.method.clone(), url)
            .header(ACCEPT, "application/json");
        if let Some(auth) = &self.auth {
            rb = rb.header(AUTHORIZATION, auth.clone());
        }
        if let Some(body) = &req.body {
            rb = rb
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        let unreachable = |e: reqwest::Error| {
            let why = if e.is_timeout() {
                format!("no answer within {} s", TIMEOUT.as_secs())
            } else {
                root_cause(&e)
            };
            format!(
                "cannot reach the admin API at {shown}: {why} (is portcullis running, and \
                 is --admin or PORTCULLIS_ADMIN its admin_listen?)"
            )
        };
        let resp = rb.send().map_err(unreachable)?;
        let status = resp.status();
        let marker = resp.headers().contains_key(MARKER);
        let body = read_capped(resp).map_err(unreachable)?;
        Ok(Answer {
            status,
            body,
            marker,
        })
    }

    /// The message of an HTTP error answer `a` to `req`: method, URL, status, the answer's
    /// `error` (or its text), and what to do about a missing or refused token.
    pub fn http_error(&self, req: &Request, a: &Answer) -> String {
        let detail = match a.json()["error"].as_str() {
            Some(e) => e.to_string(),
            None => a.body.trim().to_string(),
        };
        let mut detail = clean(&detail);
        if detail.len() > MAX_QUOTED {
            let mut end = MAX_QUOTED;
            while !detail.is_char_boundary(end) {
                end -= 1;
            }
            detail.truncate(end);
            detail.push('…');
        }
        let mut msg = format!("{} {}: {}", req.method, self.shown_url(&req.path), a.status);
        if !detail.is_empty() {
            msg.push_str(": ");
            msg.push_str(&detail);
        }
        if a.status == StatusCode::UNAUTHORIZED {
            match &self.token_source {
                None => msg.push_str(
                    "\nthe admin API needs a token: pass --token-file FILE or set \
                     PORTCULLIS_TOKEN_FILE",
                ),
                Some(f) => msg.push_str(&format!("\nthe token in {f} was refused")),
            }
        }
        msg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode("10.0.0.5:8080"), "10.0.0.5%3A8080");
        assert_eq!(encode("[::1]:80"), "%5B%3A%3A1%5D%3A80");
        assert_eq!(encode("[fe80::1%eth0]:80"), "%5Bfe80%3A%3A1%25eth0%5D%3A80");
        assert_eq!(encode("app-1_x.y~z"), "app-1_x.y~z");
        assert_eq!(encode("a/b?c#d e&f=g"), "a%2Fb%3Fc%23d%20e%26f%3Dg");
        assert_eq!(encode("é"), "%C3%A9");
        assert_eq!(encode(""), "");
    }

    #[test]
    fn base_urls() {
        let b = |s: &str| base_url(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(b("http://127.0.0.1:9090").0, "http://127.0.0.1:9090");
        assert_eq!(b("http://127.0.0.1:9090/").0, "http://127.0.0.1:9090");
        assert_eq!(b("127.0.0.1:9090").0, "http://127.0.0.1:9090");
        assert_eq!(b("[::1]:9090").0, "http://[::1]:9090");
        assert_eq!(b("https://h/admin/").0, "https://h/admin");
        let (base, shown) = b("http://u:secret@h:1");
        assert_eq!(base, "http://u:secret@h:1");
        assert_eq!(shown, "http://h:1");
        assert!(base_url("ftp://h").is_err());
        assert!(base_url("http://h/?x=1").is_err());
        assert!(base_url("http://").is_err());
    }

    #[test]
    fn tokens_lose_the_trailing_newline_and_are_never_in_a_message() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tok");
        std::fs::write(&f, "s3cret-tok\r\n").unwrap();
        let v = bearer(&read_token(&f).unwrap(), "the token file").unwrap();
        assert_eq!(v.as_bytes(), b"Bearer s3cret-tok");
        assert!(v.is_sensitive());
        assert!(!format!("{v:?}").contains("s3cret"));
        std::fs::write(&f, "\n").unwrap();
        assert!(read_token(&f).unwrap_err().contains("empty"));
        std::fs::write(&f, "bad\u{7}tok\n").unwrap();
        let e = Admin::new("http://h:1", Token::File(f.clone()))
            .err()
            .unwrap_or_default();
        assert!(!e.contains("tok\u{7}") && !e.contains("bad"), "{e}");
        assert!(read_token(&dir.path().join("none"))
            .unwrap_err()
            .contains("none"));
    }

    #[test]
    fn http_errors_name_the_url_and_status() {
        let admin = Admin::new("http://u:pw@127.0.0.1:1", Token::None).unwrap();
        let req = Request {
            method: reqwest::Method::POST,
            path: "/backends/app/x%3A1/drain".into(),
            body: None,
        };
        let a = Answer {
            status: StatusCode::NOT_FOUND,
            body: r#"{"error": "upstream \"app\" has no backend \"x:1\"\u001b[31m"}"#.into(),
            marker: true,
        };
        let m = admin.http_error(&req, &a);
        assert_eq!(
            m,
            "POST http://127.0.0.1:1/backends/app/x%3A1/drain: 404 Not Found: \
             upstream \"app\" has no backend \"x:1\" [31m"
        );
        let a = Answer {
            status: StatusCode::UNAUTHORIZED,
            body: "admin: this endpoint needs a token\n".into(),
            marker: true,
        };
        let m = admin.http_error(&req, &a);
        assert!(
            m.contains("401 Unauthorized: admin: this endpoint needs a token\n"),
            "{m}"
        );
        assert!(m.contains("--token-file"), "{m}");
        let a = Answer {
            status: StatusCode::BAD_GATEWAY,
            body: "x".repeat(5000),
            marker: true,
        };
        assert!(admin.http_error(&req, &a).len() < MAX_QUOTED + 100);
    }
}
