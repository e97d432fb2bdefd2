//! `max_request_body_bytes`: a request whose `Content-Length` is over the
//! limit is refused before a byte of its body is read; a chunked body is
//! counted as it passes and refused at the chunk that crosses the limit, which
//! is never forwarded. Pure counting; the proxy answers 413.

use http::header::{HeaderMap, CONTENT_LENGTH};

/// Whether the declared `Content-Length` is over `max`. (Pingora refuses a
/// malformed or conflicting one before this runs.)
pub fn declared_too_large(headers: &HeaderMap, max: u64) -> bool {
    let Some(v) = headers.get(CONTENT_LENGTH) else {
        return false;
    };
    let digits = v.as_bytes().trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return false;
    }
    // all digits but too long for a u64: larger than any limit
    std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse::<u64>().ok())
        .is_none_or(|n| n > max)
}

/// Body bytes seen so far; `add` says whether the body is still within `max`.
#[derive(Debug, Default, Clone, Copy)]
pub struct BodyCount {
    seen: u64,
}

impl BodyCount {
    pub fn add(&mut self, n: usize, max: u64) -> bool {
        self.seen = self.seen.saturating_add(n as u64);
        self.seen <= max
    }

    /// Bytes counted so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn content_length_over_the_limit() {
        let mut h = HeaderMap::new();
        assert!(!declared_too_large(&h, 10));
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("10"));
        assert!(!declared_too_large(&h, 10));
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("11"));
        assert!(declared_too_large(&h, 10));
        h.insert(
            CONTENT_LENGTH,
            HeaderValue::from_static("99999999999999999999999"),
        );
        assert!(declared_too_large(&h, 10), "beyond u64 is beyond the limit");
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("1x"));
        assert!(
            !declared_too_large(&h, 10),
            "malformed: Pingora's to refuse"
        );
    }

    #[test]
    fn chunks_are_counted_until_the_limit_is_crossed() {
        let mut c = BodyCount::default();
        assert!(c.add(6, 10));
        assert!(c.add(4, 10));
        assert!(!c.add(1, 10));
    }
}
