//! RFC 3339 timestamps with millisecond precision, in UTC, without a clock
//! read of their own (the caller passes Unix milliseconds).

use portcullis_policy::calendar::civil_from_days;

/// `2026-11-22T17:16:23.123Z` for `unix_ms`.
pub fn rfc3339_ms(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let ms = unix_ms % 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        // 2000-02-29 (leap day) 12:34:56.789
        assert_eq!(rfc3339_ms(951_827_696_789), "2000-02-29T12:34:56.789Z");
        // 2026-11-22T17:16:23.005Z
        assert_eq!(rfc3339_ms(1_795_367_783_005), "2026-11-22T17:16:23.005Z");
        assert_eq!(rfc3339_ms(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }
}
