//! W3C Trace Context (`traceparent`, <https://www.w3.org/TR/trace-context/>).
//!
//! A valid incoming `traceparent` keeps its trace id and flags and gets a new
//! parent id (this proxy's span); an absent or invalid one starts a new trace.
//! Plain functions over bytes, no `Session`.

/// The `sampled` bit of `trace-flags`.
pub const SAMPLED: u8 = 0x01;

/// The trace context the proxy sends upstream for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: u128,
    /// This proxy's span id: the parent id the backend sees.
    pub span_id: u64,
    /// The client's span id from a continued `traceparent`; 0 for a new trace.
    pub parent_id: u64,
    pub flags: u8,
    /// The incoming header was valid and is continued.
    pub continued: bool,
}

impl TraceContext {
    /// From the request's `traceparent` values (none, one, or several: more
    /// than one is invalid). `random` supplies ids. A continued trace keeps
    /// the client's flags (its sampled flag is respected); a new trace is
    /// sampled when `draw < new_trace_sample` (a uniform draw in `[0, 1)`;
    /// the ratio is 0 when no spans are exported).
    pub fn from_request<'a>(
        mut values: impl Iterator<Item = &'a [u8]>,
        random: &mut impl FnMut() -> u128,
        new_trace_sample: f64,
        draw: f64,
    ) -> Self {
        let first = values.next();
        let parsed = match (first, values.next()) {
            (Some(v), None) => parse(v),
            _ => None,
        };
        let span_id = new_span_id(random);
        match parsed {
            Some((trace_id, parent_id, flags)) => Self {
                trace_id,
                span_id,
                parent_id,
                flags,
                continued: true,
            },
            None => Self {
                trace_id: new_trace_id(random),
                span_id,
                parent_id: 0,
                flags: u8::from(draw < new_trace_sample) * SAMPLED,
                continued: false,
            },
        }
    }

    /// The trace is recorded (the `sampled` flag): this proxy exports its span.
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// The `traceparent` value to send upstream (version 00).
    pub fn header(&self) -> String {
        String::from_utf8_lossy(&self.header_bytes()).into_owned()
    }

    /// `header()` as a header value, without formatting machinery (per request).
    pub fn header_value(&self) -> http::HeaderValue {
        let b = self.header_bytes();
        // Only `0-9a-f` and `-`: always a valid header value.
        http::HeaderValue::from_bytes(&b).unwrap_or_else(|_| http::HeaderValue::from_static(""))
    }

    /// `00-<trace id>-<span id>-<flags>`, 55 bytes of lowercase hex.
    fn header_bytes(&self) -> [u8; 55] {
        let mut b = *b"00-00000000000000000000000000000000-0000000000000000-00";
        hex_lower(self.trace_id, &mut b[3..35]);
        hex_lower(u128::from(self.span_id), &mut b[36..52]);
        hex_lower(u128::from(self.flags), &mut b[53..55]);
        b
    }

    /// The trace id as 32 lower-case hex digits (the access log's `trace_id`).
    pub fn trace_id_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }
}

fn new_trace_id(random: &mut impl FnMut() -> u128) -> u128 {
    loop {
        let id = random();
        if id != 0 {
            return id;
        }
    }
}

fn new_span_id(random: &mut impl FnMut() -> u128) -> u64 {
    loop {
        let id = random() as u64;
        if id != 0 {
            return id;
        }
    }
}

/// `(trace_id, parent_id, flags)` of a valid `traceparent`, else `None`.
/// Versions above 00 are parsed as 00 (the spec's forward compatibility):
/// their first 55 bytes, followed by the end or a `-`.
pub fn parse(v: &[u8]) -> Option<(u128, u64, u8)> {
    let v = v.trim_ascii();
    if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let version = hex(&v[0..2])? as u8;
    if version == 0xff || (version == 0 && v.len() != 55) || (v.len() > 55 && v[55] != b'-') {
        return None;
    }
    let trace_id = hex(&v[3..35])?;
    let parent_id = hex(&v[36..52])? as u64;
    let flags = hex(&v[53..55])? as u8;
    if trace_id == 0 || parent_id == 0 {
        return None;
    }
    Some((trace_id, parent_id, flags))
}

/// Lower-case hex only (the spec forbids upper case).
fn hex(s: &[u8]) -> Option<u128> {
    s.iter().try_fold(0u128, |acc, &c| {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        Some((acc << 4) | u128::from(d))
    })
}

/// Write the low `4 * out.len()` bits of `n` into `out` as lowercase hex,
/// zero-padded (the `{:0N$x}` of `format!`, without its machinery).
pub fn hex_lower(mut n: u128, out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for d in out.iter_mut().rev() {
        *d = DIGITS[(n & 0xf) as usize];
        n >>= 4;
    }
}

thread_local! {
    /// The generator of trace, span and request ids: WyRand (`fastrand`), one per thread,
    /// so drawing an id takes no lock and touches no shared cache line. Seeded from the OS:
    /// std's `RandomState` takes its first keys of each thread from the OS's random source
    /// (fastrand's own thread-local generator is seeded from the clock and thread id).
    static ID_RNG: std::cell::RefCell<fastrand::Rng> = std::cell::RefCell::new(fastrand::Rng::with_seed({
        use std::hash::BuildHasher;
        std::collections::hash_map::RandomState::new().hash_one(std::thread::current().id())
    }));
}

/// 128 random bits for an id (two draws of the thread's generator): not a cryptographic
/// secret, only an id that is unique in practice and says nothing about the ones before.
pub fn random_u128() -> u128 {
    ID_RNG.with(|r| r.borrow_mut().u128(..))
}

#[cfg(test)]
mod tests {
    #[test]
    fn header_bytes_match_the_formatted_header() {
        for (t, sp, f) in [
            (1u128, 1u64, 0u8),
            (u128::MAX, u64::MAX, 0xff),
            (0x4bf9_2f35, 0xab, 1),
        ] {
            let tc = TraceContext {
                trace_id: t,
                span_id: sp,
                parent_id: 0,
                flags: f,
                continued: false,
            };
            let want = format!("00-{t:032x}-{sp:016x}-{f:02x}");
            assert_eq!(tc.header(), want);
            assert_eq!(tc.header_value().to_str().ok(), Some(want.as_str()));
        }
        let mut b = [0u8; 12];
        hex_lower(0xabc, &mut b);
        assert_eq!(&b, b"000000000abc");
    }

    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn seq() -> impl FnMut() -> u128 {
        let mut n = 0u128;
        move || {
            n += 1;
            n
        }
    }

    #[test]
    fn valid_header_keeps_trace_and_flags_with_a_new_parent() {
        let tc = TraceContext::from_request([VALID.as_bytes()].into_iter(), &mut seq(), 0.0, 0.5);
        assert!(tc.continued);
        assert_eq!(tc.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let h = tc.header();
        assert!(h.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert!(h.ends_with("-01"));
        assert_ne!(&h[36..52], "00f067aa0ba902b7", "parent id must be new");
        assert_eq!(parse(h.as_bytes()).map(|p| p.1), Some(tc.span_id));
    }

    #[test]
    fn invalid_or_absent_headers_start_a_new_trace() {
        let bad = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ];
        for b in bad {
            assert_eq!(parse(b.as_bytes()), None, "{b:?} must be invalid");
            let tc = TraceContext::from_request([b.as_bytes()].into_iter(), &mut seq(), 0.0, 0.5);
            assert!(!tc.continued);
            assert_ne!(tc.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
            assert!(parse(tc.header().as_bytes()).is_some(), "new header valid");
        }
        let none = TraceContext::from_request(std::iter::empty(), &mut seq(), 0.0, 0.5);
        assert!(!none.continued && none.trace_id != 0 && none.span_id != 0);
        let two = TraceContext::from_request(
            [VALID.as_bytes(), VALID.as_bytes()].into_iter(),
            &mut seq(),
            0.0,
            0.5,
        );
        assert!(!two.continued, "two traceparent headers are invalid");
    }

    #[test]
    fn sampling_respects_the_parent_else_the_ratio() {
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        let from = |h: Option<&str>, ratio, draw| {
            TraceContext::from_request(h.map(str::as_bytes).into_iter(), &mut seq(), ratio, draw)
        };
        // The client's decision wins whatever the ratio.
        assert!(from(Some(VALID), 0.0, 0.9).sampled());
        assert!(!from(Some(unsampled), 1.0, 0.0).sampled());
        assert_eq!(from(Some(VALID), 0.0, 0.9).parent_id, 0x00f0_67aa_0ba9_02b7);
        // A new trace: the ratio, and the header sent upstream says so.
        assert!(from(None, 0.01, 0.005).sampled());
        assert!(!from(None, 0.01, 0.02).sampled());
        assert!(
            !from(None, 0.0, 0.0).sampled(),
            "no exporter: never sampled"
        );
        assert!(from(None, 1.0, 0.999).header().ends_with("-01"));
        assert!(from(None, 0.0, 0.0).header().ends_with("-00"));
        assert_eq!(from(None, 1.0, 0.0).parent_id, 0);
    }

    #[test]
    fn future_versions_parse_as_00() {
        let v = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever";
        assert!(parse(v.as_bytes()).is_some());
    }

    #[test]
    fn zero_ids_from_the_generator_are_skipped() {
        let mut vals = vec![5u128, 0, 7, 0].into_iter().rev();
        let mut r = move || vals.next().unwrap_or(9);
        let tc = TraceContext::from_request(std::iter::empty(), &mut r, 0.0, 0.5);
        assert_ne!(tc.span_id, 0);
        assert_ne!(tc.trace_id, 0);
    }
}
