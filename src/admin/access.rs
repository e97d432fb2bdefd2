//! Who may change the running proxy through the admin API: the access rule for every
//! method but `GET` (a named bearer token, compared in constant time; without a token, a
//! loopback listener only), and the refusal a caller gets.

use http::{Response, StatusCode};
use pingora::protocols::http::ServerSession;

use super::{text, Admin};

/// Whether a `POST` may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostAccess {
    Allowed,
    /// A token is set and the request does not carry it.
    Unauthorized,
    /// No token, and the listener is reachable from other hosts.
    Forbidden,
}

/// The access rule for admin `POST`s: `token` is `server.admin_token`,
/// `authorization` the request's `Authorization` value.
pub fn post_access(token: &str, loopback: bool, authorization: Option<&[u8]>) -> PostAccess {
    let tokens: &[(&str, &str)] = if token.is_empty() {
        &[]
    } else {
        &[("admin", token)]
    };
    match post_caller(tokens, loopback, authorization) {
        Ok(_) => PostAccess::Allowed,
        Err(refused) => refused,
    }
}

/// The access rule with named tokens (`admin_token` is named `admin`): `Ok(name)` of the
/// token presented, or `admin` when no token is set and the listener is loopback. Every
/// token is compared, each in constant time, whichever matches.
pub fn post_caller<'a>(
    tokens: &[(&'a str, &str)],
    loopback: bool,
    authorization: Option<&[u8]>,
) -> Result<&'a str, PostAccess> {
    if tokens.is_empty() {
        return if loopback {
            Ok("admin")
        } else {
            Err(PostAccess::Forbidden)
        };
    }
    let presented = authorization.and_then(bearer_token).unwrap_or(b"");
    let mut who = None;
    for (name, token) in tokens {
        if constant_time_eq(presented, token.as_bytes()) && who.is_none() {
            who = Some(*name);
        }
    }
    who.ok_or(PostAccess::Unauthorized)
}

/// The credentials of `Bearer <token>` (scheme case-insensitive).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    let (scheme, rest) = value.split_at(value.iter().position(|b| *b == b' ')?);
    scheme
        .eq_ignore_ascii_case(b"bearer")
        .then(|| rest.trim_ascii())
}

/// Compares in time that depends only on the expected token's length, not on
/// where the first difference is.
fn constant_time_eq(presented: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(presented.len() != expected.len());
    for (i, e) in expected.iter().enumerate() {
        diff |= presented.get(i).copied().unwrap_or(0) ^ e;
    }
    std::hint::black_box(diff) == 0
}

impl Admin {
    /// The caller's name (`by`) when the `POST` may run, else the refusal to send.
    pub(super) fn post_caller(
        &self,
        session: &ServerSession,
    ) -> Result<String, Box<Response<Vec<u8>>>> {
        let rt = self.shared.runtime.load();
        let server = &rt.config.server;
        let mut tokens: Vec<(&str, &str)> = Vec::with_capacity(server.admin_tokens.len() + 1);
        if !server.admin_token.is_empty() {
            tokens.push(("admin", server.admin_token.expose()));
        }
        tokens.extend(
            server
                .admin_tokens
                .iter()
                .map(|(n, t)| (n.as_str(), t.expose())),
        );
        let auth = session
            .req_header()
            .headers
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        match post_caller(&tokens, self.loopback, auth) {
            Ok(name) => Ok(name.to_string()),
            Err(PostAccess::Forbidden) => Err(Box::new(text(
                StatusCode::FORBIDDEN,
                "admin: POST endpoints are off because admin_listen is not a loopback address \
                 and server.admin_token is not set; set admin_token to enable them\n",
            ))),
            Err(_) => {
                let mut r = text(
                    StatusCode::UNAUTHORIZED,
                    "admin: this endpoint needs Authorization: Bearer <server.admin_token>\n",
                );
                r.headers_mut().insert(
                    http::header::WWW_AUTHENTICATE,
                    http::HeaderValue::from_static("Bearer realm=\"portcullis-admin\""),
                );
                Err(Box::new(r))
            }
        }
    }
}
