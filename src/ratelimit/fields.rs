//! The IETF `RateLimit-Policy` and `RateLimit` fields of a policy (draft-ietf-httpapi-
//! ratelimit-headers), on every admitted response (when `rate_limit.headers` asks for
//! them) and on a 429.
//!
//! What does not change between responses is made once per config, in [`FieldParts`]:
//! the policy name as an sf-string, and the whole `RateLimit-Policy` value for the
//! policy's own limit and window. Per response only the `RateLimit` value is written (its
//! remaining count changes), and a `RateLimit-Policy` value for a key with a limit of its
//! own (`overrides`).

/// A policy's field values, made once per config ([`crate::ratelimit::Policy::fields`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldParts {
    /// The policy name as a structured-field sf-string, quotes included.
    quoted: Box<[u8]>,
    limit: u64,
    window_secs: u64,
    /// `RateLimit-Policy` for `limit` and `window_secs`: cloning it shares its bytes.
    policy: http::HeaderValue,
}

impl FieldParts {
    /// The parts of policy `name` with its own `limit` per `window_secs`.
    pub fn new(name: &str, limit: u64, window_secs: u64) -> Self {
        let mut quoted = Vec::with_capacity(sf_string_len(name));
        sf_string(name, &mut quoted);
        let quoted = quoted.into_boxed_slice();
        let policy = field(&quoted, b";q=", limit, b";w=", window_secs);
        Self {
            quoted,
            limit,
            window_secs,
            policy,
        }
    }

    /// `RateLimit-Policy` value: `"<name>";q=<limit>;w=<window>`.
    pub fn policy_value(&self, limit: u64, window_secs: u64) -> http::HeaderValue {
        if limit == self.limit && window_secs == self.window_secs {
            self.policy.clone()
        } else {
            field(&self.quoted, b";q=", limit, b";w=", window_secs)
        }
    }

    /// `RateLimit` field value: `"<name>";r=<remaining>;t=<seconds>`. Its remaining count
    /// changes with every response, so HTTP/2 sends it unindexed
    /// ([`crate::edge::headers::unique`]).
    pub fn ratelimit_value(&self, remaining: u64, t: u64) -> http::HeaderValue {
        crate::edge::headers::unique(field(&self.quoted, b";r=", remaining, b";t=", t))
    }
}

/// `<quoted><k1><v1><k2><v2>`, written in one buffer of exactly its length, which becomes
/// the value without a copy (no `format!`, one allocation). A buffer with spare capacity
/// would cost `Bytes` a second.
fn field(quoted: &[u8], k1: &[u8], v1: u64, k2: &[u8], v2: u64) -> http::HeaderValue {
    let (mut b1, mut b2) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (d1, d2) = (b1.format(v1).as_bytes(), b2.format(v2).as_bytes());
    let len = quoted.len() + k1.len() + d1.len() + k2.len() + d2.len();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(quoted);
    out.extend_from_slice(k1);
    out.extend_from_slice(d1);
    out.extend_from_slice(k2);
    out.extend_from_slice(d2);
    debug_assert_eq!(out.len(), out.capacity());
    // Printable ASCII only (sf_string replaces anything else), so always valid.
    http::HeaderValue::from_maybe_shared(bytes::Bytes::from(out))
        .unwrap_or_else(|_| http::HeaderValue::from_static("\"invalid\""))
}

/// The length [`sf_string`] writes for `s`.
fn sf_string_len(s: &str) -> usize {
    2 + s
        .chars()
        .map(|c| if matches!(c, '"' | '\\') { 2 } else { 1 })
        .sum::<usize>()
}

/// Structured-field sf-string: printable ASCII only, `"` and `\` escaped; anything else is
/// replaced by `_` so the header is always valid.
fn sf_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push(b'\\');
                out.push(c as u8);
            }
            ' '..='~' => out.push(c as u8),
            _ => out.push(b'_'),
        }
    }
    out.push(b'"');
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn header_formatting() {
        let d = FieldParts::new("default", 600, 60);
        assert_eq!(d.policy_value(600, 60), "\"default\";q=600;w=60");
        assert_eq!(d.ratelimit_value(0, 7), "\"default\";r=0;t=7");
        assert_eq!(
            FieldParts::new("a\"b\\c\u{e9}", 1, 1).ratelimit_value(3, 1),
            "\"a\\\"b\\\\c_\";r=3;t=1"
        );
        // Valid HTTP header values.
        assert_eq!(
            FieldParts::new("x y", 1, 2).policy_value(1, 2),
            "\"x y\";q=1;w=2"
        );
        assert_eq!(
            FieldParts::new("", 1, 1).ratelimit_value(u64::MAX, 0),
            "\"\";r=18446744073709551615;t=0"
        );
        // HTTP/2 indexes the policy (it repeats), not the remaining count (it changes)
        assert!(d.ratelimit_value(0, 7).is_sensitive());
        assert!(!d.policy_value(600, 60).is_sensitive());
    }

    #[test]
    fn a_key_with_its_own_limit_gets_its_own_policy_value() {
        let d = FieldParts::new("default", 600, 60);
        // The policy's own limit: the value made with the parts (shared, not rewritten).
        assert_eq!(
            d.policy_value(600, 60).as_bytes().as_ptr(),
            d.policy.as_bytes().as_ptr()
        );
        // An override (or a window changed under it) is written for the response.
        assert_eq!(d.policy_value(5000, 60), "\"default\";q=5000;w=60");
        assert_eq!(d.policy_value(600, 1), "\"default\";q=600;w=1");
    }
}
