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

/// The values the environment gave the config's strings (`${NAME}`, CONTRACT §13), kept out
/// of every error: each is shown as the variable it came from (`${NAME}`), whatever the
/// value (a password, a token, a host). A value of 4 characters or more is replaced
/// wherever it appears (as written, or escaped as `{:?}` writes it); a shorter one only
/// inside a quoted string of the error (`"…"`, `` `…` ``), where values are quoted, so
/// that an error's own words and numbers stay readable.
#[derive(Debug, Default, Clone)]
pub struct EnvValues(Vec<(String, String)>);

/// Values at least this long (in characters) are replaced anywhere in an error.
const ANYWHERE_CHARS: usize = 4;

impl EnvValues {
    /// From `(variable, value)` pairs as looked up (empty values are nothing to hide).
    pub fn new(mut pairs: Vec<(String, String)>) -> Self {
        pairs.retain(|(_, v)| !v.is_empty());
        pairs.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then_with(|| a.cmp(b)));
        pairs.dedup();
        Self(pairs)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `text` with every value from the environment shown as `${NAME}`.
    pub fn redact(&self, text: &str) -> String {
        if self.0.is_empty() {
            return text.to_string();
        }
        let mut out = text.to_string();
        for (name, value) in self
            .0
            .iter()
            .filter(|(_, v)| v.chars().count() >= ANYWHERE_CHARS)
        {
            let shown = format!("${{{name}}}");
            out = out.replace(value.as_str(), &shown);
            let debug = format!("{value:?}");
            let escaped = &debug[1..debug.len() - 1];
            if escaped != value {
                out = out.replace(escaped, &shown);
            }
        }
        let short: Vec<&(String, String)> = self
            .0
            .iter()
            .filter(|(_, v)| v.chars().count() < ANYWHERE_CHARS)
            .collect();
        if short.is_empty() {
            return out;
        }
        // Quoted segments only: `"…"` (a backslash escapes the next character) and `…`.
        let mut result = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(open) = rest.find(['"', '`']) {
            let quote = rest[open..].chars().next().unwrap_or('"');
            result.push_str(&rest[..=open]);
            let body = &rest[open + 1..];
            let mut end = body.len();
            let mut escaped = false;
            for (i, c) in body.char_indices() {
                if escaped {
                    escaped = false;
                } else if c == '\\' && quote == '"' {
                    escaped = true;
                } else if c == quote {
                    end = i;
                    break;
                }
            }
            let mut segment = body[..end].to_string();
            for (name, value) in &short {
                segment = segment.replace(value.as_str(), &format!("${{{name}}}"));
            }
            result.push_str(&segment);
            rest = &body[end..];
            if let Some(close) = rest.strip_prefix(quote) {
                result.push(quote);
                rest = close;
            }
        }
        result.push_str(rest);
        result
    }
}

/// Every URL inside `text` redacted as by [`redact_url`].
pub fn redact_secrets(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        // The URL runs to the next character that cannot be part of it (a quote escaped
        // with a backslash, as `{:?}` writes one inside a password, is part of it).
        let end = tail
            .char_indices()
            .find(|&(i, c)| {
                (c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>'))
                    && !(matches!(c, '"' | '\'') && tail[..i].ends_with('\\'))
            })
            .map_or(tail.len(), |(i, _)| i);
        out.push_str(&redact_after_scheme(&tail[..end]));
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// `user:pw@host/path?query` → `user:***@host/path?query` (query secrets too). The
/// user-info runs to the URL's last `@`: a password written with a raw `@`, `/`, `?` or
/// `#` in it (`redis://user:p@ss/w?rd@host`) is hidden whole, not cut at its first `@`
/// or `/`.
fn redact_after_scheme(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let (userinfo, s) = match s.rfind('@') {
        Some(at) => (Some(&s[..at]), &s[at..]),
        None => (None, s),
    };
    let authority_end = s.find(['/', '?', '#']).unwrap_or(s.len());
    let (authority, path) = s.split_at(authority_end);
    match userinfo {
        Some(userinfo) => {
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
            out.push_str(authority);
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
    fn a_password_with_a_raw_at_is_hidden_up_to_the_last_at() {
        assert_eq!(
            redact_url("redis://user:p@ss/SuperSecret@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(redact_url("redis://:a@b#c?d/e@h:1"), "redis://:***@h:1");
        assert_eq!(
            redact_secrets(r#"invalid Redis URL "redis://u:p@ss/SuperSecret@h:x" (bad)"#),
            r#"invalid Redis URL "redis://u:***@h:x" (bad)"#
        );
        // A quote in the password, escaped as `{:?}` writes it.
        let shown = format!("{:?}", "redis://u:pa\"ss@h:x");
        let out = redact_secrets(&format!("invalid Redis URL {shown} (bad)"));
        assert!(!out.contains("pa"), "{out}");
        assert!(out.contains("u:***@h:x"), "{out}");
    }

    #[test]
    fn values_from_the_environment_are_shown_as_their_variable() {
        let env = EnvValues::new(vec![
            ("PW".into(), "s3cr3t-value".into()),
            ("Q".into(), "a\"b\\c".into()),
            ("PORT".into(), "80".into()),
            ("EMPTY".into(), String::new()),
        ]);
        assert_eq!(
            env.redact("invalid Redis URL \"redis://h:80/s3cr3t-value\" (port 80)"),
            "invalid Redis URL \"redis://h:${PORT}/${PW}\" (port 80)"
        );
        let debug = format!("bad value {:?}", "a\"b\\c");
        assert_eq!(env.redact(&debug), "bad value \"${Q}\"");
        assert_eq!(env.redact("`80` and 80"), "`${PORT}` and 80");
        assert_eq!(env.redact("plain"), "plain");
        assert!(EnvValues::new(vec![("E".into(), String::new())]).is_empty());
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
