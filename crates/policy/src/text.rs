//! Text a person reads in one line: a log line, a journal entry, a table row.

/// Whether `c` may not appear in one line a person reads: a control character (C0, DEL,
/// C1: a newline forges a log line, an escape drives a terminal), a line or paragraph
/// separator (U+2028, U+2029: a line break to JavaScript and some log viewers), or a
/// bidirectional formatting character (U+061C, U+200E, U+200F, U+202A-U+202E,
/// U+2066-U+2069: they reorder what follows, so `evil` can read as `live`).
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{061C}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// `s` with every [`is_unsafe`] character replaced by a space.
pub fn one_line(s: &str) -> String {
    if !s.chars().any(is_unsafe) {
        return s.to_string();
    }
    s.chars()
        .map(|c| if is_unsafe(c) { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_separators_and_bidi_become_spaces() {
        assert_eq!(one_line("deploy v7 — zone-a"), "deploy v7 — zone-a");
        assert_eq!(one_line("a\nINFO forged"), "a INFO forged");
        assert_eq!(one_line("a\r\u{1b}[2Jb"), "a  [2Jb");
        assert_eq!(one_line("x\u{85}y\u{9b}z"), "x y z");
        assert_eq!(one_line("a\u{2028}b\u{2029}c"), "a b c");
        assert_eq!(one_line("\u{202E}evil\u{202C}"), " evil ");
        assert_eq!(one_line("\u{2066}\u{2067}\u{2068}\u{2069}"), "    ");
        assert_eq!(one_line("\u{200E}\u{200F}\u{061C}"), "   ");
        // letters of right-to-left scripts stay: only the formatting characters go
        assert_eq!(one_line("שלום مرحبا"), "שלום مرحبا");
    }
}
