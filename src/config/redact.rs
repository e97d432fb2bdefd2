//! Keep secrets out of error text: a Redis URL's password (`redis://user:pw@host`
//! or `?password=`) is shown as `***`; a parser's message about a file that may hold API
//! keys shows no quoted value ([`without_quoted_values`]).

/// `url` with the password of its user-info, and any `pass`/`password` query
/// parameter, replaced by `***`. Text that is not a URL comes back unchanged.
pub fn redact_url(url: &str) -> String {
    redact_secrets(url)
}

/// A TOML or JSON parser's message with every double-quoted value in it shown as `"…"`:
/// `invalid type: string "my-key", expected a sequence` (a key written where a list of
/// key hashes belongs) must not print the key. Backquoted names (`` unknown field `key` ``)
/// stay: they are the parser's own words or field names.
pub fn without_quoted_values(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut chars = msg.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c != '"' {
            continue;
        }
        // Skip to the closing quote (a backslash escapes the next character).
        let mut closed = false;
        while let Some(d) = chars.next() {
            match d {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    closed = true;
                    break;
                }
                _ => {}
            }
        }
        out.push('…');
        if closed {
            out.push('"');
        }
    }
    out
}

/// Every URL inside `text` redacted as by [`redact_url`].
pub fn redact_secrets(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        // The URL runs to the next character that cannot be part of it.
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>'))
            .unwrap_or(tail.len());
        out.push_str(&redact_after_scheme(&tail[..end]));
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// `user:pw@host/path?query` → `user:***@host/path?query` (query secrets too).
fn redact_after_scheme(s: &str) -> String {
    let authority_end = s.find(['/', '?', '#']).unwrap_or(s.len());
    let (authority, path) = s.split_at(authority_end);
    let mut out = String::with_capacity(s.len());
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            match userinfo.split_once(':') {
                Some((user, _)) => {
                    out.push_str(user);
                    out.push_str(":***");
                }
                // A lone user-info is what Redis takes as the password of
                // `redis://secret@host` in some clients: hide it too.
                None if !userinfo.is_empty() => out.push_str("***"),
                None => {}
            }
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    match path.split_once('?') {
        Some((p, query)) => {
            out.push_str(p);
            out.push('?');
            let parts: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if is_secret_param(k) => format!("{k}=***"),
                    _ => kv.to_string(),
                })
                .collect();
            out.push_str(&parts.join("&"));
        }
        None => out.push_str(path),
    }
    out
}

fn is_secret_param(k: &str) -> bool {
    ["pass", "password", "passwd", "auth", "token"]
        .iter()
        .any(|s| k.eq_ignore_ascii_case(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_values_are_not_shown() {
        assert_eq!(
            without_quoted_values(r#"invalid type: string "my-key", expected a sequence"#),
            r#"invalid type: string "…", expected a sequence"#
        );
        assert_eq!(
            without_quoted_values(r#"a "b\"c" d "e" `f`"#),
            r#"a "…" d "…" `f`"#
        );
        assert_eq!(without_quoted_values(r#"open "abc"#), r#"open "…"#);
        assert_eq!(without_quoted_values("none"), "none");
    }

    #[test]
    fn password_in_userinfo_is_hidden() {
        assert_eq!(
            redact_url("redis://user:hunter2@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(redact_url("rediss://:pw@h:1"), "rediss://:***@h:1");
        assert_eq!(redact_url("redis://secret@h:1"), "redis://***@h:1");
        assert_eq!(redact_url("redis://h:1/2"), "redis://h:1/2");
        assert_eq!(
            redact_url("redis+unix:///tmp/r.sock?db=1&pass=pw"),
            "redis+unix:///tmp/r.sock?db=1&pass=***"
        );
    }

    #[test]
    fn urls_inside_text_are_hidden() {
        assert_eq!(
            redact_secrets(r#"invalid Redis URL "redis://u:p@w@h:x" (bad)"#),
            r#"invalid Redis URL "redis://u:***@h:x" (bad)"#
        );
        assert_eq!(redact_secrets("no url here"), "no url here");
    }
}
