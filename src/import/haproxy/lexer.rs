//! HAProxy's line syntax: one statement per line (HAProxy has no line continuation: a
//! `\` at the end of a line is a literal backslash), words split on blanks, `#` starts a
//! comment, `"..."` quotes weakly (escapes and `$` variables are interpreted inside),
//! `'...'` quotes strongly (nothing is), and outside single quotes a backslash escapes
//! ` `, `#`, `\`, `'`, `"`, `$` and writes `\r`, `\n`, `\t` and `\xNN`; any other
//! `\c` is kept as written. Environment variables (`$NAME`, `${NAME}`,
//! `${NAME-default}`) are only expanded inside double quotes, as HAProxy does.

/// Longest line accepted (HAProxy's own limit is 2048 bytes by default; this is larger so
/// that a generated config with long ACL lists still reads).
pub const MAX_LINE: usize = 64 * 1024;
/// Most words on one line (HAProxy: 64 by default).
pub const MAX_WORDS: usize = 512;

/// Why a line cannot be split into words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LexError(pub String);

/// The words of one line, with quotes, escapes and variables resolved. `env` looks up an
/// environment variable (`None`: unset, which HAProxy replaces with nothing).
pub fn split_line(
    line: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, LexError> {
    if line.len() > MAX_LINE {
        return Err(LexError(format!(
            "line longer than {MAX_LINE} bytes ({} bytes)",
            line.len()
        )));
    }
    let chars: Vec<char> = line.chars().collect();
    let mut words: Vec<String> = Vec::new();
    let mut cur = String::new();
    // A word is open once any character (or an empty quoted string) started it.
    let mut open = false;
    let mut i = 0;
    let mut dquote = false;
    while i < chars.len() {
        let c = chars[i];
        if !dquote && (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
            if open {
                push(&mut words, &mut cur)?;
                open = false;
            }
            i += 1;
            continue;
        }
        if !dquote && c == '#' {
            break;
        }
        open = true;
        match c {
            '"' => {
                dquote = !dquote;
                i += 1;
            }
            '\'' if !dquote => {
                let start = i;
                i += 1;
                loop {
                    match chars.get(i) {
                        None => {
                            return Err(LexError(format!(
                                "unmatched quote at position {}",
                                start + 1
                            )))
                        }
                        Some('\'') => {
                            i += 1;
                            break;
                        }
                        Some(&ch) => {
                            cur.push(ch);
                            i += 1;
                        }
                    }
                }
            }
            '\\' => {
                i += escape(&chars[i + 1..], &mut cur);
            }
            '$' if dquote => {
                i += variable(&chars[i + 1..], &mut cur, env)?;
            }
            _ => {
                cur.push(c);
                i += 1;
            }
        }
    }
    if dquote {
        return Err(LexError("unmatched quote: a \" is not closed".into()));
    }
    if open {
        push(&mut words, &mut cur)?;
    }
    Ok(words)
}

fn push(words: &mut Vec<String>, cur: &mut String) -> Result<(), LexError> {
    if words.len() >= MAX_WORDS {
        return Err(LexError(format!("more than {MAX_WORDS} words on one line")));
    }
    words.push(std::mem::take(cur));
    Ok(())
}

/// The escape after a backslash (`rest` starts after it); returns the characters
/// consumed, the backslash included.
fn escape(rest: &[char], cur: &mut String) -> usize {
    match rest.first() {
        Some(&c @ (' ' | '#' | '\\' | '\'' | '"' | '$')) => {
            cur.push(c);
            2
        }
        Some('r') => {
            cur.push('\r');
            2
        }
        Some('n') => {
            cur.push('\n');
            2
        }
        Some('t') => {
            cur.push('\t');
            2
        }
        Some('x') => {
            let hex: Option<u32> = match (rest.get(1), rest.get(2)) {
                (Some(a), Some(b)) => a
                    .to_digit(16)
                    .and_then(|h| b.to_digit(16).map(|l| h * 16 + l)),
                _ => None,
            };
            match hex.and_then(char::from_u32) {
                Some(ch) => {
                    cur.push(ch);
                    4
                }
                None => {
                    cur.push_str("\\x");
                    2
                }
            }
        }
        Some(&c) => {
            cur.push('\\');
            cur.push(c);
            2
        }
        None => {
            cur.push('\\');
            1
        }
    }
}

/// A `$` variable inside double quotes (`rest` starts after the `$`); returns the
/// characters consumed, the `$` included.
fn variable(
    rest: &[char],
    cur: &mut String,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<usize, LexError> {
    let is_name_start = |c: char| c.is_ascii_alphabetic() || c == '_';
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    if rest.first() == Some(&'{') {
        let Some(close) = rest.iter().position(|&c| c == '}') else {
            return Err(LexError("a ${ is not closed by }".into()));
        };
        let inner: String = rest[1..close].iter().collect();
        let (name, default) = match inner.find('-') {
            Some(p) => (&inner[..p], Some(&inner[p + 1..])),
            None => (inner.as_str(), None),
        };
        if name.is_empty() || !name.starts_with(is_name_start) || !name.chars().all(is_name) {
            return Err(LexError(format!("invalid variable name in ${{{inner}}}")));
        }
        match env(name) {
            Some(v) => cur.push_str(&v),
            None => cur.push_str(default.unwrap_or("")),
        }
        return Ok(close + 2);
    }
    let name: String = match rest.first() {
        Some(&c) if is_name_start(c) => rest.iter().take_while(|&&c| is_name(c)).collect(),
        _ => {
            cur.push('$');
            return Ok(1);
        }
    };
    if let Some(v) = env(&name) {
        cur.push_str(&v);
    }
    Ok(name.len() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(n: &str) -> Option<String> {
        match n {
            "PORT" => Some("8080".into()),
            "HOST" => Some("10.0.0.1".into()),
            _ => None,
        }
    }

    fn words(line: &str) -> Vec<String> {
        match split_line(line, &env) {
            Ok(w) => w,
            Err(e) => panic!("{line:?}: {e:?}"),
        }
    }

    #[test]
    fn blanks_split_and_comments_end_the_line() {
        assert_eq!(words("  bind\t:80   # http"), ["bind", ":80"]);
        assert!(words("# only a comment").is_empty());
        assert!(words("   ").is_empty());
        assert_eq!(words("a#b"), ["a"]);
    }

    #[test]
    fn quotes_weak_and_strong() {
        assert_eq!(words(r#"x "a b" 'c d'"#), ["x", "a b", "c d"]);
        assert_eq!(words(r#"x "a"'b'c"#), ["x", "abc"]);
        assert_eq!(words(r#"x """#), ["x", ""]);
        assert_eq!(words(r##"x "# not a comment""##), ["x", "# not a comment"]);
        assert_eq!(words(r#"x '\n $PORT'"#), ["x", r"\n $PORT"]);
    }

    #[test]
    fn escapes_as_haproxy_reads_them() {
        assert_eq!(
            words(r"x a\ b \#c \\ \x41 \q"),
            ["x", "a b", "#c", "\\", "A", "\\q"]
        );
        assert_eq!(words(r#"x "a\"b""#), ["x", "a\"b"]);
        assert_eq!(words("x a\\tb"), ["x", "a\tb"]);
        // No line continuation: a trailing backslash is a word of its own.
        assert_eq!(words("maxconn 100 \\"), ["maxconn", "100", "\\"]);
    }

    #[test]
    fn variables_only_inside_double_quotes() {
        assert_eq!(
            words(r#"bind "${HOST}:${PORT}""#),
            ["bind", "10.0.0.1:8080"]
        );
        assert_eq!(words(r#"bind "$HOST:$PORT""#), ["bind", "10.0.0.1:8080"]);
        assert_eq!(words("bind ${HOST}"), ["bind", "${HOST}"]);
        assert_eq!(words(r#"x "${NOPE}""#), ["x", ""]);
        assert_eq!(words(r#"x "${NOPE-dflt}""#), ["x", "dflt"]);
        assert_eq!(words(r#"x "\$PORT" "5$""#), ["x", "$PORT", "5$"]);
    }

    #[test]
    fn unclosed_quotes_and_variables_are_errors() {
        assert!(split_line(r#"x "abc"#, &env).is_err());
        assert!(split_line("x 'abc", &env).is_err());
        assert!(split_line(r#"x "${PORT""#, &env).is_err());
        assert!(split_line(r#"x "${1A}""#, &env).is_err());
    }
}
